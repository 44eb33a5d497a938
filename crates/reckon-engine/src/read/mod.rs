//! The read models: what each screen or answer shows, read from the ledger and judged once,
//! beside the commands (the writes). The dashboard's pages, the JSON API and the CLI's
//! read commands render these and never read the ledger for what a model holds, so two
//! surfaces cannot word one fact two ways.
//!
//! Each model is built by one async fn that asks only for the aggregates it reads
//! (`reckon_ledger::Effects`, `Audits`, ...); a caller holding `Arc<dyn Ledger>` passes
//! `&*ledger`.
//!
//! - [`effect`]: one effect's record, timeline, reconciliation and the lookup's verdict of
//!   it, from [`crate::answer::effect_answer`], the judgement the lookup itself runs.
//! - [`queue`]: a page of the unresolved queue, with the routing gaps it explains.
//! - [`overview`]: the tenant's unresolved counts, sources, provider health, yesterday's
//!   audit and the snapshots behind the chart.
//! - [`provider_health`]: each provider's lookups of the last day, in figures and words.
//! - [`audit_day`]: one day of the audit: the run that counts, the day's runs, the history
//!   and the chain's verification.
//! - Support's lookup is [`crate::answer`].

pub mod audit_day;
pub mod effect;
pub mod overview;
pub mod provider_health;
pub mod queue;

use jiff::tz::TimeZone;
use reckon_ledger::{Audits, Effects, LedgerError, Providers, Reconciliation, TenantId};

/// What support's lookup and the effect page read: effects, their reconciliation, the
/// providers and routes, the audit's charges and runs.
pub trait LookupReads: Effects + Reconciliation + Providers + Audits {}

impl<T: Effects + Reconciliation + Providers + Audits + ?Sized> LookupReads for T {}

/// The tenant's zone (its audit settings, UTC unless set): every time a model words is
/// written in it.
pub async fn zone<L: Audits + ?Sized>(
    ledger: &L,
    tenant: TenantId,
) -> Result<TimeZone, LedgerError> {
    Ok(crate::when::zone(
        &ledger.audit_settings(tenant).await?.time_zone,
    ))
}

/// Support's answer with the tenant's zone, in which a page writes its times.
#[derive(Debug, Clone)]
pub struct LookupView {
    pub answer: crate::answer::Answer,
    pub zone: TimeZone,
}

/// Support's answer to `query` for `tenant` as of `now`, its times in the tenant's zone:
/// what the dashboard's lookup, `GET /api/v1/lookup` and `reckon lookup` render.
pub async fn lookup<L: LookupReads + ?Sized>(
    ledger: &L,
    tenant: TenantId,
    query: &str,
    now: f64,
) -> Result<LookupView, crate::answer::AnswerError> {
    let zone = zone(ledger, tenant).await?;
    let answer = crate::answer::answer(ledger, tenant, query, now, &zone).await?;
    Ok(LookupView { answer, zone })
}
