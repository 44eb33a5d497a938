//! Table, JSON and CSV output for the CLI, and progress on a terminal.

use crate::Format;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use jiff::tz::TimeZone;
use reckon_ledger::Source;
use std::io::IsTerminal;

/// A spinner with a row count on stderr, drawn only when stderr is a terminal.
pub fn progress(label: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if !std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg}: {pos} rows read ({per_sec})")
            .expect("static template"),
    );
    bar.set_message(label.to_owned());
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar
}

/// A ledger time (epoch seconds) as people read it in a table or a spreadsheet, as the
/// dashboard writes it: "01 Dec 2026 19:40 CET", in the tenant's zone
/// ([`reckon_engine::when`]). JSON keeps the epoch seconds.
pub fn when(t: f64, tz: &TimeZone) -> String {
    reckon_engine::when::text(t, tz)
}

/// [`when`] of a time that may not have happened yet (empty when it has not).
pub fn when_opt(t: Option<f64>, tz: &TimeZone) -> String {
    t.map(|t| when(t, tz)).unwrap_or_default()
}

/// The tenant's time zone (its audit settings, UTC unless set): tables write its times in
/// it, as its dashboard pages do.
pub async fn tenant_zone(
    ledger: &dyn reckon_ledger::Ledger,
    tenant: reckon_ledger::TenantId,
) -> anyhow::Result<TimeZone> {
    Ok(reckon_engine::when::zone(
        &ledger.audit_settings(tenant).await?.time_zone,
    ))
}

pub fn sources(list: &[Source], format: Format, tz: &TimeZone) -> anyhow::Result<()> {
    let header = [
        "name",
        "kind",
        "dsn",
        "last_success_at",
        "last_error",
        "failures",
    ];
    rows(list, format, &header, |s| {
        vec![
            s.name.clone(),
            s.kind.as_str().to_owned(),
            s.dsn_display.clone().unwrap_or_default(),
            when_opt(s.last_success_at, tz),
            s.last_error.clone().unwrap_or_default(),
            s.consecutive_failures.to_string(),
        ]
    })
}

/// The connect checks of a source, one line each on stdout: `ok` or `FAIL`, what was seen,
/// and under a failed one the command that fixes it. Whether every check passed.
pub fn checks(source: &str, checks: &[reckon_engine::connect::Check]) -> bool {
    println!("checks of source {source}:");
    for c in checks {
        println!(
            "  {:<4} {:<10} {}",
            if c.ok { "ok" } else { "FAIL" },
            c.what,
            c.said
        );
        if let Some(fix) = &c.fix {
            println!("       fix: {fix}");
        }
    }
    let ok = checks.iter().all(|c| c.ok);
    if ok {
        println!(
            "  every check passed: its unknowns are looked up by `reckon serve` or `reckon reconcile`"
        );
    }
    ok
}

/// Any list as JSON (the items' own serialisation), CSV (neutralised cells) or a table.
pub fn rows<T: serde::Serialize>(
    list: &[T],
    format: Format,
    header: &[&str],
    row: impl Fn(&T) -> Vec<String>,
) -> anyhow::Result<()> {
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(list)?),
        Format::Csv => {
            let mut w = csv::Writer::from_writer(std::io::stdout());
            w.write_record(header)?;
            for s in list {
                w.write_record(row(s).iter().map(|c| neutralise(c)))?;
            }
            w.flush()?;
        }
        Format::Table => {
            if list.is_empty() {
                // stderr, so the table's reader (a person) is told and stdout stays empty.
                eprintln!("(none)");
                return Ok(());
            }
            let mut b = tabled::builder::Builder::default();
            b.push_record(header.iter().copied());
            for s in list {
                b.push_record(row(s));
            }
            println!("{}", b.build());
        }
    }
    Ok(())
}

/// Spreadsheet formula injection: a cell starting with = + - @ tab or CR is prefixed with
/// a quote, so a hostile key cannot run as a formula when finance opens the file.
fn neutralise(cell: &str) -> String {
    match cell.chars().next() {
        Some('=' | '+' | '-' | '@' | '\t' | '\r') => format!("'{cell}"),
        _ => cell.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ledger_times_read_as_the_dashboard_writes_them_in_the_tenants_zone() {
        // 2026-12-01 18:40:05.4 UTC
        let paris = reckon_engine::when::zone("Europe/Paris");
        assert_eq!(when(1_796_150_405.4, &paris), "01 Dec 2026 19:40 CET");
        assert_eq!(
            when(1_796_150_405.4, &TimeZone::UTC),
            "01 Dec 2026 18:40 UTC"
        );
        assert_eq!(when_opt(None, &paris), "");
        assert_eq!(when_opt(Some(0.0), &TimeZone::UTC), "01 Jan 1970 00:00 UTC");
    }
}
