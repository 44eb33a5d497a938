//! "Test connection" for a source and "test" for a provider (dashboard settings and the
//! API): reach it exactly the way a scan or an audit import would (sealed secret, egress
//! policy, pinned address, read-only), read next to nothing, and say what happened in
//! words an admin can act on. A probe never writes: not to the source, not to the ledger
//! (a failed probe is not a failed scan, so the source's health is left alone).

use crate::scan::{ScanFailure, open_source};
use futures::StreamExt;
use reckon_ledger::{Ledger, Provider as ProviderRow, Source, Tenant};
use reckon_providers::{GetClient, build_provider};
use reckon_sources::EgressPolicy;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a probe may take before it is reported as timed out (a connect alone may
/// take up to 15 s on a black-holed address).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// The window a provider probe lists: small, so the answer is one page.
pub const PROVIDER_PROBE_WINDOW_SECS: f64 = 300.0;

#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub struct ProbeReport {
    pub ok: bool,
    /// One sentence: what was reached and what it said, or why it could not be.
    pub message: String,
    pub millis: u64,
}

fn report(ok: bool, message: String, started: Instant) -> ProbeReport {
    ProbeReport {
        ok,
        message,
        millis: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    }
}

/// Connect to a scanned source, open its read-only snapshot and run the scan's own query
/// for a cursor past every row: the table and its columns are checked, no row is read.
pub async fn test_source(
    ledger: &dyn Ledger,
    tenant: &Tenant,
    source: &Source,
    egress: &EgressPolicy,
) -> ProbeReport {
    let started = Instant::now();
    let probe = async {
        let mut conn = open_source(ledger, tenant, source, egress).await?;
        let first = conn.rows(Some(f64::MAX), false).next().await;
        conn.close().await;
        match first {
            Some(Err(e)) => Err(ScanFailure::from(e)),
            _ => Ok(()),
        }
    };
    match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
        Ok(Ok(())) => report(
            true,
            format!(
                "Connected read-only and queried table {}: the scanner can read it.",
                source.table_name
            ),
            started,
        ),
        Ok(Err(e)) => report(false, source_failure(&e).to_owned(), started),
        Err(_) => report(
            false,
            format!("No answer within {} s.", PROBE_TIMEOUT.as_secs()),
            started,
        ),
    }
}

/// A failed source probe as one of a few fixed sentences. The driver's and the server's
/// own words are not passed on: they quote what the admin chose (the table name, the user,
/// the database), and a message that quoted a chosen text next to the stored password
/// would have to be cut, and the cut would say whether a guess put in that text is the
/// password. The class of failure is read from the error; nothing of it is repeated.
pub fn source_failure(e: &ScanFailure) -> &'static str {
    use reckon_sources::ScanError;
    let e = match e {
        ScanFailure::Ledger(_) => {
            return "reckon could not open the source's stored settings in its ledger.";
        }
        ScanFailure::Source(e) => e,
    };
    let has = |m: &str, words: &[&str]| {
        let m = m.to_ascii_lowercase();
        words.iter().any(|w| m.contains(w))
    };
    match e {
        ScanError::Invalid(m) if m == reckon_sources::OWN_DATABASE_REFUSED => {
            "Refused: the DSN leads to reckon's own database, which no source may read."
        }
        ScanError::Invalid(m) | ScanError::Connect(m)
            if has(
                m,
                &[
                    "sqlite source file does not exist",
                    "sqlite source directory",
                ],
            ) =>
        {
            "The SQLite file the DSN names does not exist (yet) in the tenant's SQLite source \
             directory (RECKON_SQLITE_SOURCE_DIR)."
        }
        ScanError::Invalid(m) if has(m, &["egress policy"]) => {
            "Refused by the egress policy: the source's address is not one the operator \
             allows sources to have."
        }
        ScanError::Invalid(_) => "The source's stored settings are not valid: edit its DSN.",
        ScanError::Connect(m) if has(m, &["timed out"]) => {
            "The source's server did not answer within 15 s."
        }
        ScanError::Connect(m) if has(m, &["tls", "ssl", "certificate"]) => {
            "The TLS connection to the source failed: check the DSN's TLS mode and the \
             server's certificate."
        }
        ScanError::Connect(m)
            if has(
                m,
                &[
                    "password",
                    "authentication",
                    "access denied",
                    "no pg_hba",
                    "role ",
                ],
            ) =>
        {
            "The source's server refused the DSN's user or password."
        }
        ScanError::Connect(m) if has(m, &["database"]) => {
            "The source's server has no database of the DSN's name, or refuses the user \
             access to it."
        }
        ScanError::Connect(m) if has(m, &["i/o error"]) => {
            "The source's server could not be reached (connection refused or reset)."
        }
        ScanError::Connect(_) => "Could not connect to the source.",
        ScanError::Query(m) if has(m, &["permission denied", "command denied", "denied"]) => {
            "Connected, but the DSN's user may not read the table."
        }
        ScanError::Query(m) if has(m, &["does not exist", "doesn't exist", "no such"]) => {
            "Connected, but the table, or a column the scanner needs, was not found."
        }
        ScanError::Query(m) if has(m, &["column", "type"]) => {
            "Connected, but the table's columns are not what the scanner reads: see the \
             source table's expected shape in the README."
        }
        ScanError::Query(m) if has(m, &["lock timeout", "lock wait timeout"]) => {
            "Connected, but the table is locked: the scanner's query gave up waiting for \
             another session's lock (the source's lock timeout is 5 s)."
        }
        ScanError::Query(_) => "Connected, but the scanner's query on the table failed.",
    }
}

/// List the provider's charges of the last five minutes with its stored key, as the
/// audit's import does (the same confined client): the base URL is checked by the egress
/// policy first, and a refusal
/// of the key, a 5xx or a malformed page is reported as what it is.
pub async fn test_provider(
    ledger: &dyn Ledger,
    tenant: &Tenant,
    provider: &ProviderRow,
    egress: &Arc<EgressPolicy>,
    client: &GetClient,
    now: f64,
) -> ProbeReport {
    let started = Instant::now();
    // Confined to the policy like the reconciler's and the import's client, so the address
    // connected to is one the policy allowed when the connection was made (T09), not only
    // the one `check_url` saw.
    let client = crate::provider_client(client, egress);
    let probe = async {
        if let Some(base) = provider.settings.get("base_url").and_then(|u| u.as_str()) {
            let u = url::Url::parse(base).map_err(|e| format!("base_url: {e}"))?;
            egress
                .check_url(&u)
                .await
                .map_err(|e| format!("refused by the egress policy: {e}"))?;
        }
        let secret = ledger
            .provider_secret(tenant.id, provider)
            .await
            .map_err(|e| e.to_string())?;
        let adapter = build_provider(provider.kind, &provider.settings, secret, client)
            .map_err(|e| e.to_string())?;
        adapter
            .list_charges(now - PROVIDER_PROBE_WINDOW_SECS, now)
            .await
            .map_err(|f| f.to_string())
    };
    match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
        Ok(Ok(listing)) => report(
            true,
            format!(
                "Answered with the key: {} charge(s) in the last {} minutes ({} page(s)).",
                listing.charges.len(),
                PROVIDER_PROBE_WINDOW_SECS / 60.0,
                listing.pages.len()
            ),
            started,
        ),
        Ok(Err(why)) => report(false, why, started),
        Err(_) => report(
            false,
            format!("No answer within {} s.", PROBE_TIMEOUT.as_secs()),
            started,
        ),
    }
}
