//! One place that turns what a person typed (CLI flags or an API body) into a source,
//! with the defaults and the validation both surfaces share.

use reckon_ledger::{NewSource, SourceKind};
use reckon_sources::{Dialect, SourceDsn, validate_table_name};
use secrecy::SecretString;
use serde::Deserialize;
use std::time::Duration;

pub const DEFAULT_TABLE: &str = "justonce_keys";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceInput {
    pub name: String,
    pub kind: String,
    #[serde(default)]
    pub dsn: Option<String>,
    #[serde(default)]
    pub table: Option<String>,
    /// e.g. "60s", "5m"
    #[serde(default)]
    pub scan_interval: Option<String>,
    /// Grace after a lease ends before a claim counts as abandoned; default "5m".
    #[serde(default)]
    pub abandoned_after: Option<String>,
    /// How far back each incremental scan re-reads, to absorb late commits; default "60s".
    #[serde(default)]
    pub overlap: Option<String>,
    /// How often the key sets are compared to notice deleted rows; default "1h".
    #[serde(default)]
    pub full_scan_every: Option<String>,
}

fn duration(what: &str, v: &Option<String>, default: Duration) -> Result<Duration, String> {
    match v {
        None => Ok(default),
        Some(s) => humantime::parse_duration(s)
            .map_err(|e| format!("{what} {s:?} is not a duration like 30s, 5m or 1h ({e})")),
    }
}

/// Validate and complete a source description. Errors are sentences for the person who
/// typed the input; they never echo a DSN.
pub fn new_source(input: SourceInput) -> Result<NewSource, String> {
    let kind = SourceKind::parse(&input.kind).ok_or_else(|| {
        format!(
            "kind {:?} is not one of sqlite, postgres, mysql, push",
            input.kind
        )
    })?;
    let table = input.table.unwrap_or_else(|| DEFAULT_TABLE.to_owned());
    validate_table_name(&table).map_err(|e| e.to_string())?;
    let (dsn, dsn_display) = match (kind, input.dsn) {
        (SourceKind::Push, None) => (None, None),
        (SourceKind::Push, Some(_)) => return Err("a push source takes no DSN".into()),
        (_, None) => return Err(format!("a {} source needs a DSN", kind.as_str())),
        (k, Some(d)) => {
            let dialect = Dialect::parse(k.as_str()).expect("scanned kinds are dialects");
            let parsed = SourceDsn::parse(dialect, &d).map_err(|e| e.to_string())?;
            (Some(SecretString::from(d)), Some(parsed.redacted()))
        }
    };
    let scan_interval = duration(
        "scan_interval",
        &input.scan_interval,
        Duration::from_secs(60),
    )?;
    let abandoned_after = duration(
        "abandoned_after",
        &input.abandoned_after,
        Duration::from_secs(300),
    )?;
    let overlap = duration("overlap", &input.overlap, Duration::from_secs(60))?;
    let full_every = duration(
        "full_scan_every",
        &input.full_scan_every,
        Duration::from_secs(3600),
    )?;
    if scan_interval < Duration::from_secs(1) {
        return Err("scan_interval must be at least 1s".into());
    }
    Ok(NewSource {
        name: input.name,
        kind,
        dsn,
        dsn_display,
        table_name: table,
        scan_interval_secs: scan_interval.as_secs() as i64,
        abandoned_after_secs: abandoned_after.as_secs_f64(),
        overlap_secs: overlap.as_secs_f64(),
        full_scan_every_secs: full_every.as_secs().max(1) as i64,
    })
}
