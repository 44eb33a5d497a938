//! The process's log: which events (the filter) and how they are written (the format).
//!
//! - Filter: `RECKON_LOG`, else `RUST_LOG` (what operators of Rust services set out of habit,
//!   and what older deploy files set), else `info,sqlx=warn`.
//! - Format: `RECKON_LOG_FORMAT=json` writes one JSON object per line (time, level, target,
//!   message and fields at the top level, the current span) for a log collector;
//!   `text` (the default) is for people at a terminal.
//!
//! Logs go to stderr: stdout carries command output (a token, a table, CSV).

use tracing_subscriber::EnvFilter;

pub const DEFAULT_FILTER: &str = "info,sqlx=warn";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl LogFormat {
    /// `None` (unset) and an empty value are the default; anything unknown is refused, so a
    /// typo does not silently give a collector unparseable lines.
    pub fn parse(value: Option<&str>) -> Result<LogFormat, String> {
        match value.map(str::trim) {
            None | Some("") => Ok(LogFormat::Text),
            Some(v) if v.eq_ignore_ascii_case("text") => Ok(LogFormat::Text),
            Some(v) if v.eq_ignore_ascii_case("json") => Ok(LogFormat::Json),
            Some(v) => Err(format!("RECKON_LOG_FORMAT must be text or json, not {v:?}")),
        }
    }
}

/// The filter directives to use: the first of `RECKON_LOG`, `RUST_LOG` that is set and not
/// empty, else the default.
pub fn filter_directives(reckon_log: Option<&str>, rust_log: Option<&str>) -> String {
    [reckon_log, rust_log]
        .into_iter()
        .flatten()
        .map(str::trim)
        .find(|v| !v.is_empty())
        .unwrap_or(DEFAULT_FILTER)
        .to_owned()
}

/// Colour codes only for a person at a terminal: never into a file, a pipe or a log
/// collector (where they are noise in every line), and never when `NO_COLOR` is set to
/// anything but the empty string (no-color.org).
pub fn colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(std::ffi::OsStr::is_empty)
}

/// Install the subscriber from the environment. An invalid `RECKON_LOG_FORMAT` is an error;
/// an invalid filter falls back to the default and says so (the log still works).
pub fn init() -> anyhow::Result<()> {
    let format = LogFormat::parse(std::env::var("RECKON_LOG_FORMAT").ok().as_deref())
        .map_err(anyhow::Error::msg)?;
    let directives = filter_directives(
        std::env::var("RECKON_LOG").ok().as_deref(),
        std::env::var("RUST_LOG").ok().as_deref(),
    );
    let (filter, invalid) = match EnvFilter::try_new(&directives) {
        Ok(f) => (f, None),
        Err(e) => (EnvFilter::new(DEFAULT_FILTER), Some(e)),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour(
            std::io::IsTerminal::is_terminal(&std::io::stderr()),
            std::env::var_os("NO_COLOR").as_deref(),
        ))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .init(),
    }
    if let Some(e) = invalid {
        tracing::warn!(filter = %directives, error = %e, "invalid log filter: using {DEFAULT_FILTER}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reckon_log_wins_then_rust_log_then_the_default() {
        assert_eq!(filter_directives(Some("debug"), Some("trace")), "debug");
        assert_eq!(
            filter_directives(None, Some("warn,reckon=debug")),
            "warn,reckon=debug"
        );
        assert_eq!(filter_directives(Some("  "), Some("warn")), "warn");
        assert_eq!(filter_directives(None, None), DEFAULT_FILTER);
    }

    #[test]
    fn colour_only_on_a_terminal_and_not_when_no_color_is_set() {
        use std::ffi::OsStr;
        assert!(colour(true, None));
        assert!(colour(true, Some(OsStr::new(""))));
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(!colour(false, None));
    }

    #[test]
    fn the_format_is_text_unless_json_is_asked_and_a_typo_is_refused() {
        assert_eq!(LogFormat::parse(None), Ok(LogFormat::Text));
        assert_eq!(LogFormat::parse(Some("")), Ok(LogFormat::Text));
        assert_eq!(LogFormat::parse(Some("JSON")), Ok(LogFormat::Json));
        assert_eq!(LogFormat::parse(Some("text")), Ok(LogFormat::Text));
        assert!(
            LogFormat::parse(Some("jsonl"))
                .unwrap_err()
                .contains("jsonl")
        );
    }
}
