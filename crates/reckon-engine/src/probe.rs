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
        Ok(Err(e)) => report(false, e.to_string(), started),
        Err(_) => report(
            false,
            format!("No answer within {} s.", PROBE_TIMEOUT.as_secs()),
            started,
        ),
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
        let adapter = build_provider(&provider.kind, &provider.settings, secret, client)
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
