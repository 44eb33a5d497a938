//! A page of the unresolved queue: its rows in words, the names its filters offer, and
//! the routing gaps that leave effects never looked up.

use crate::answer::age;
use crate::connect::{route_of, unrouted};
use reckon_domain::State as EffectState;
use reckon_ledger::{
    Dashboard, LedgerError, Providers, QueueQuery, QueueRow, Snapshot, Sources, TenantId,
};

/// How far back an empty queue looks for when it last held something.
pub const CLEARED_DAYS: u32 = 30;

/// One page of the queue as the dashboard shows it.
#[derive(Debug, Clone)]
pub struct QueueView {
    pub rows: Vec<QueueEntry>,
    /// The page is full and more follow: the next page starts after (since, id).
    pub next_after: Option<(f64, i64)>,
    /// The tenant's source and provider names (for the filters), when asked for.
    pub sources: Vec<String>,
    pub providers: Vec<String>,
    /// For an unfiltered empty queue: when it last held something, in words.
    pub cleared: String,
    /// Each operation with open effects that no provider is routed for, as a sentence with
    /// the command that routes it.
    pub unrouted: Vec<String>,
    pub zone: jiff::tz::TimeZone,
}

/// One effect of the queue.
#[derive(Debug, Clone)]
pub struct QueueEntry {
    pub row: QueueRow,
    /// `unknown` or `abandoned`.
    pub kind: &'static str,
    /// The last lookup's outcome in words (a verdict that is not final says so).
    pub last_outcome: Option<String>,
    /// When reckon looks next; `None` when no provider answers for it or a person must.
    pub next_attempt: Option<f64>,
    /// No route reaches its operation: it is never looked up until one does.
    pub unrouted: bool,
    /// Routed to no provider on purpose: a person decides.
    pub routed_to_none: bool,
}

/// What the queue reads: the backlog, the routes, sources and providers.
pub trait QueueReads: Dashboard + Providers + Sources + reckon_ledger::Audits {}

impl<T: Dashboard + Providers + Sources + reckon_ledger::Audits + ?Sized> QueueReads for T {}

/// A page of `tenant`'s queue for `q` (whose `limit` is the page's size), the filter lists
/// with it when `lists`; `tenant_slug` names the tenant in the routing commands.
pub async fn queue_view<L: QueueReads + ?Sized>(
    ledger: &L,
    tenant: TenantId,
    tenant_slug: &str,
    q: &QueueQuery,
    lists: bool,
) -> Result<QueueView, LedgerError> {
    let page = q.limit;
    let mut found = ledger
        .unresolved_queue(
            tenant,
            &QueueQuery {
                limit: page + 1,
                ..q.clone()
            },
        )
        .await?;
    let zone = super::zone(ledger, tenant).await?;
    let more = found.len() as i64 > page;
    found.truncate(usize::try_from(page).unwrap_or(0));
    let next_after = match (more, found.last()) {
        (true, Some(last)) => Some((last.since, last.effect.id)),
        _ => None,
    };
    let routes = ledger.list_routes(tenant).await?;
    let providers = ledger.list_providers(tenant).await?;
    let filtered = q.source.is_some()
        || q.operation.is_some()
        || q.kind.is_some()
        || q.provider.is_some()
        || q.outcome.is_some()
        || q.needs_attention
        || q.after.is_some();
    let cleared = if found.is_empty() && !filtered {
        let since = q.now - f64::from(CLEARED_DAYS) * 86400.0;
        last_unresolved(&ledger.snapshots(tenant, since).await?, q.now, CLEARED_DAYS)
    } else {
        String::new()
    };
    let first = providers.first().map(|p| p.name.as_str());
    let backlog = ledger.unresolved_by_operation(tenant, q.now).await?;
    let unrouted_words = unrouted(&backlog, &routes)
        .iter()
        .map(|g| g.sentence(tenant_slug, first))
        .collect();
    let rows = found
        .into_iter()
        .map(|r| {
            let route = route_of(&routes, &r.effect.source, r.effect.operation.as_deref());
            QueueEntry {
                kind: match r.effect.state {
                    EffectState::Unknown => "unknown",
                    _ => "abandoned",
                },
                last_outcome: r
                    .last_outcome
                    .as_deref()
                    .map(|o| outcome_words(o, r.non_final)),
                // An effect no provider answers for is never looked up: no time to show.
                next_attempt: if r.provider.is_none() || r.needs_attention {
                    None
                } else {
                    r.next_attempt_at
                },
                unrouted: route.is_none(),
                routed_to_none: route.is_some_and(|x| x.provider_id.is_none()),
                row: r,
            }
        })
        .collect();
    let sources = if lists {
        ledger
            .list_sources(tenant)
            .await?
            .into_iter()
            .map(|x| x.name)
            .collect()
    } else {
        Vec::new()
    };
    Ok(QueueView {
        rows,
        next_after,
        sources,
        providers: if lists {
            providers.into_iter().map(|p| p.name).collect()
        } else {
            Vec::new()
        },
        cleared,
        unrouted: unrouted_words,
        zone,
    })
}

/// A queue row's last outcome in words: one that is not final says so.
fn outcome_words(o: &str, non_final: bool) -> String {
    match (o, non_final) {
        ("applied", true) => "applied (provisional)".to_owned(),
        ("indeterminate", true) => "indeterminate (payment pending)".to_owned(),
        ("not_applied", true) => "not found so far (not proven)".to_owned(),
        _ => o.to_owned(),
    }
}

/// For an empty queue: when effects were last seen unresolved, from the hourly snapshots
/// ("3 h ago"), or that none were in the period the snapshots cover.
pub fn last_unresolved(snapshots: &[Snapshot], now: f64, days: u32) -> String {
    match snapshots
        .iter()
        .filter(|x| x.unresolved > 0)
        .map(|x| x.hour)
        .reduce(f64::max)
    {
        // The snapshot of an hour counts what was unresolved during it: cleared after.
        Some(hour) => format!(
            "the last unresolved effects were cleared {} ago (hourly snapshots)",
            age(now - (hour + 3600.0).min(now))
        ),
        None => format!("none was unresolved in the last {days} days"),
    }
}
