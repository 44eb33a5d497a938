//! The tenant at a glance: unresolved effects by kind, each source's scans and
//! quarantine, each provider's health, yesterday's audit, and the hourly snapshots behind
//! the 7/30-day chart.

use super::provider_health::{HEALTH_SECS, ProviderHealthView, health_of};
use reckon_ledger::{
    AuditGlance, Audits, Dashboard, Effects, KindSummary, LedgerError, Providers, ReplayClosing,
    Snapshot, Source, Sources, TenantId,
};
use std::collections::HashMap;

/// The chart's longest range (30 days) and an hour of margin: the snapshots read serve
/// both ranges.
pub const CHART_SECS: f64 = 31.0 * 86400.0;

/// The audit's finding kinds in the order pages list them (the most expensive first).
pub const FINDING_ORDER: [&str; 7] = [
    "duplicate",
    "charged_not_recorded",
    "missing",
    "orphan",
    "unresolved",
    "risky_reclaim",
    "split_intent",
];

/// Everything the overview shows of one tenant, read together.
#[derive(Debug, Clone)]
pub struct OverviewView {
    pub kinds: Vec<KindSummary>,
    /// Unresolved now, of every kind; parked for a person; replay window closing.
    pub total: i64,
    pub needs_attention: i64,
    pub replay_closing: i64,
    /// The last 31 days of hourly snapshots.
    pub snapshots: Vec<Snapshot>,
    /// Each source with the rows of it in quarantine.
    pub sources: Vec<(Source, i64)>,
    pub providers: Vec<ProviderHealthView>,
    pub time_zone: String,
    /// Yesterday in the tenant's zone, and how its audit stands.
    pub yesterday: String,
    pub audit: Option<AuditDayGlance>,
}

/// How the audit of a day stands, at a glance.
#[derive(Debug, Clone)]
pub struct AuditDayGlance {
    /// The run that counts for the day.
    pub id: i64,
    /// No provider's part of the day completed: nothing to show but why.
    pub failed: Option<String>,
    /// Some provider's part failed (in this run or a later one): its reason and when.
    pub failure: Option<(String, f64)>,
    /// Findings stand for the providers read whole, not for every provider.
    pub partial: bool,
    pub finished_at: f64,
    /// (kind in words, count) of the kinds found, in [`FINDING_ORDER`]; empty: none.
    pub findings: Vec<(String, i64)>,
}

impl AuditDayGlance {
    pub fn of(a: &AuditGlance) -> AuditDayGlance {
        AuditDayGlance {
            id: a.id,
            failed: (a.status == "failed")
                .then(|| a.reason.clone().unwrap_or_else(|| "failed".into())),
            failure: a.failure.clone().filter(|_| a.status != "failed"),
            partial: a.status == "partial",
            finished_at: a.finished_at,
            findings: FINDING_ORDER
                .iter()
                .filter_map(|k| {
                    a.findings
                        .iter()
                        .find(|(kind, n)| kind == k && *n > 0)
                        .map(|(kind, n)| (kind.replace('_', " "), *n))
                })
                .collect(),
        }
    }
}

/// What the overview reads.
pub trait OverviewReads: Dashboard + Sources + Effects + Providers + Audits {}

impl<T: Dashboard + Sources + Effects + Providers + Audits + ?Sized> OverviewReads for T {}

/// The overview of `tenant` as of `now`; `replay` says which unresolved effects' replay
/// windows are closing.
pub async fn overview<L: OverviewReads + ?Sized>(
    ledger: &L,
    tenant: TenantId,
    now: f64,
    replay: ReplayClosing,
) -> Result<OverviewView, OverviewError> {
    let time_zone = ledger.audit_settings(tenant).await?.time_zone;
    let yesterday = reckon_audit::DayWindow::yesterday(now, &time_zone)
        .map_err(|e| OverviewError::Zone(e.to_string()))?
        .date;
    // One after another, one pooled connection at a time: read at once, the seven took
    // most of the pool (10) every refresh, and the requests of everyone else, which need a
    // connection for their session, queued behind them (p99 300 ms under load). Nobody
    // waits for a background refresh, so its length matters little.
    let kinds = ledger.unresolved_summary(tenant, now, replay).await?;
    let snapshots = ledger.snapshots(tenant, now - CHART_SECS).await?;
    let sources = ledger.list_sources(tenant).await?;
    let quarantine = ledger.quarantine_counts(tenant).await?;
    let providers = ledger.list_providers(tenant).await?;
    let health = ledger.provider_health(tenant, now - HEALTH_SECS).await?;
    let audit = ledger.audit_glance(tenant, &yesterday).await?;
    let mut quarantined: HashMap<&str, i64> = HashMap::new();
    for qc in &quarantine {
        *quarantined.entry(qc.source.as_str()).or_default() += qc.count;
    }
    let sources = sources
        .into_iter()
        .map(|s| {
            let n = quarantined.get(s.name.as_str()).copied().unwrap_or(0);
            (s, n)
        })
        .collect();
    Ok(OverviewView {
        total: kinds.iter().map(|k| k.count).sum(),
        needs_attention: kinds.iter().map(|k| k.needs_attention).sum(),
        replay_closing: kinds.iter().map(|k| k.replay_closing).sum(),
        kinds,
        snapshots,
        sources,
        providers: health_of(&providers, &health),
        time_zone,
        yesterday,
        audit: audit.as_ref().map(AuditDayGlance::of),
    })
}

/// The overview could not be read.
#[derive(Debug, thiserror::Error)]
pub enum OverviewError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The tenant's stored zone names no day (the settings refuse such a zone).
    #[error("the tenant's time zone: {0}")]
    Zone(String),
}
