//! What `/metrics` reads from the ledger at scrape time: unresolved effects grouped by
//! tenant, source and operation (with how many of them are parked for a person), the
//! health of every source and of every provider, and quarantine counts.
//!
//! The SQL is the same text on both backends (each backend's `metrics.rs` runs it), and it
//! costs O(unresolved effects + live claims + sources + quarantined rows), never O(effects):
//! the unresolved predicate below is, word for word, the predicate of the partial index
//! `effect_metrics_unresolved` (migration 0005), so both planners use that index.

use crate::model::TenantId;
use serde::Deserialize;

/// One scrape's question. `tenant: None` is the operator scope (every tenant), used only by
/// the operator's `/metrics`; a tenant's token always asks with its own tenant.
#[derive(Debug, Clone, Copy)]
pub struct MetricsQuery {
    pub tenant: Option<TenantId>,
    /// "Now" for deciding which claims are abandoned.
    pub now: f64,
    /// Routed effects created at or before this time (and after
    /// `replay_closed_created_before`) count as "replay window closing".
    pub replay_closing_created_before: f64,
    /// Routed effects created at or before this time count as "replay window closed": the
    /// provider may have forgotten their key already.
    pub replay_closed_created_before: f64,
}

// The groups below are read by name: as rows (SQLite) and as the JSON objects of a row's
// aggregate (PostgreSQL), so each query's column names are the fields'.

/// Unresolved effects of one (tenant, source, operation).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, Deserialize)]
pub struct UnresolvedGroup {
    pub tenant: String,
    pub source: String,
    /// `None` when the keys are not of the `operation:vN:...` shape.
    pub operation: Option<String>,
    pub unknown: i64,
    pub abandoned: i64,
    /// The earliest `unresolved_since` of the group (see `Effect::unresolved_since`):
    /// `updated_at` of an `unknown` effect, the lease end of an abandoned claim.
    pub oldest_since: f64,
    /// Whether the reconciler would ask a provider about these effects: a route on their
    /// exact operation names a provider, or (no route on the operation) the source's `*`
    /// route does. Routing depends only on (tenant, source, operation), so it is one answer
    /// for the whole group. The replay counts below are 0 for an unrouted group: no
    /// provider holds a key for them, so no window can close.
    pub routed: bool,
    /// Routed unresolved effects whose replay window is closing: created at or before
    /// `MetricsQuery::replay_closing_created_before`, after `replay_closed_created_before`.
    pub replay_window_closing: i64,
    /// Routed unresolved effects created at or before
    /// `MetricsQuery::replay_closed_created_before`: their window has closed.
    pub replay_window_closed: i64,
    /// Unresolved effects the reconciler has parked as needing a person (bounded attempts
    /// spent, or a provider that said not to retry).
    pub needs_attention: i64,
}

impl UnresolvedGroup {
    /// Unresolved effects that no provider is asked about (they wait for a route or a person).
    pub fn unrouted(&self) -> i64 {
        if self.routed {
            0
        } else {
            self.unknown + self.abandoned
        }
    }
}

/// The scan health of one source, as the scanner recorded it.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, Deserialize)]
pub struct SourceHealth {
    pub tenant: String,
    pub source: String,
    pub kind: String,
    pub last_scan_at: Option<f64>,
    pub last_success_at: Option<f64>,
    pub consecutive_failures: i64,
}

impl SourceHealth {
    /// Up: scanned successfully at least once, and the latest scan did not fail.
    pub fn up(&self) -> bool {
        self.last_success_at.is_some() && self.consecutive_failures == 0
    }
}

/// A provider's latest lookup, as the reconciler stored it: its health is read from the
/// ledger, so a restarted process (or another replica) knows a provider is down from its
/// first scrape, without having asked it itself.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, Deserialize)]
pub struct ProviderLastLookup {
    pub tenant: String,
    pub provider: String,
    pub kind: String,
    /// When the latest lookup at it finished; `None` if it was never asked.
    pub last_lookup_at: Option<f64>,
    /// That lookup's outcome (`applied`, `not_applied`, `duplicate`, `indeterminate`).
    pub last_outcome: Option<String>,
}

impl ProviderLastLookup {
    /// Up: its latest lookup got an answer. An indeterminate one (timeout, refused
    /// connection, 429, 5xx, 404, malformed or partial answer) is down; never asked is
    /// neither (`None`).
    pub fn up(&self) -> Option<bool> {
        self.last_outcome
            .as_deref()
            .map(|o| o != reckon_domain::Outcome::Indeterminate.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, sqlx::FromRow, Deserialize)]
pub struct QuarantineGroup {
    pub tenant: String,
    pub source: String,
    pub reason: String,
    pub count: i64,
}

/// Everything one scrape needs from the ledger.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricsSnapshot {
    pub unresolved: Vec<UnresolvedGroup>,
    pub sources: Vec<SourceHealth>,
    pub quarantine: Vec<QuarantineGroup>,
    pub providers: Vec<ProviderLastLookup>,
}

impl MetricsSnapshot {
    /// Add `other`'s groups after this one's.
    pub(crate) fn append(&mut self, other: MetricsSnapshot) {
        self.unresolved.extend(other.unresolved);
        self.sources.extend(other.sources);
        self.quarantine.extend(other.quarantine);
        self.providers.extend(other.providers);
    }
}

/// `$1` now, `$2` replay-closing cutoff, `$3` tenant id or 0 for every tenant, `$4`
/// replay-closed cutoff.
/// Aggregate first (over the partial index, which carries whether an effect is parked:
/// migration 0026), join names and routes after: the joins touch one row per group, not
/// one per effect. The route is the reconciler's
/// (`reckon_engine::reconcile`, `Routing::route`): the route on the group's exact operation
/// if there is one (even one that names no provider), else the source's `*` route; a group
/// is routed when that route names a provider. An unparsed key's NULL operation matches no
/// exact route, only `*`. Each join finds at most one row (`provider_route` is unique on
/// tenant, source and operation).
pub(crate) const UNRESOLVED_SQL: &str = "\
SELECT tenant, source, operation, unknown, abandoned, oldest_since, routed, \
       CASE WHEN routed THEN replay_closing ELSE 0 END AS replay_window_closing, \
       CASE WHEN routed THEN replay_closed ELSE 0 END AS replay_window_closed, \
       needs_attention \
FROM (SELECT t.slug AS tenant, s.name AS source, g.operation, g.unknown, g.abandoned, \
             g.oldest AS oldest_since, g.replay_closing, g.replay_closed, g.needs_attention, \
             (ro.provider_id IS NOT NULL OR (ro.id IS NULL AND rs.provider_id IS NOT NULL)) \
               AS routed \
      FROM (SELECT e.tenant_id, e.source_id, e.operation, \
                   SUM(CASE WHEN e.state = 'unknown' THEN 1 ELSE 0 END) AS unknown, \
                   SUM(CASE WHEN e.state = 'unknown' THEN 0 ELSE 1 END) AS abandoned, \
                   MIN(CASE WHEN e.state = 'unknown' THEN e.updated_at ELSE e.expires_at END) AS oldest, \
                   SUM(CASE WHEN e.created_at <= $2 AND e.created_at > $4 THEN 1 ELSE 0 END) AS replay_closing, \
                   SUM(CASE WHEN e.created_at <= $4 THEN 1 ELSE 0 END) AS replay_closed, \
                   SUM(CASE WHEN e.parked THEN 1 ELSE 0 END) AS needs_attention \
            FROM effect e \
            WHERE (e.state = 'unknown' OR (e.state = 'in_progress' AND e.gone_at IS NULL)) \
              AND (e.state = 'unknown' OR e.abandoned_at <= $1) \
              AND NOT e.resolved \
              AND ($3 = 0 OR e.tenant_id = $3) \
            GROUP BY e.tenant_id, e.source_id, e.operation) g \
      JOIN source s ON s.id = g.source_id \
      JOIN tenant t ON t.id = g.tenant_id \
      LEFT JOIN provider_route ro ON ro.tenant_id = g.tenant_id AND ro.source_id = g.source_id \
                                 AND ro.operation = g.operation \
      LEFT JOIN provider_route rs ON rs.tenant_id = g.tenant_id AND rs.source_id = g.source_id \
                                 AND rs.operation = '*') x";

/// `$1` tenant id or 0.
pub(crate) const SOURCES_SQL: &str = "\
SELECT t.slug AS tenant, s.name AS source, s.kind, s.last_scan_at, s.last_success_at, \
       s.consecutive_failures \
FROM source s JOIN tenant t ON t.id = s.tenant_id \
WHERE ($1 = 0 OR s.tenant_id = $1)";

/// `$1` tenant id or 0. Per provider, its newest lookup: one step back along the index
/// `reconcile_attempt_recent` (tenant, provider, finished_at, with the outcome: migration
/// 0015), so the cost is O(providers), never O(lookups). Two subqueries, not a lateral
/// join, so the text is the same on both backends.
pub(crate) const PROVIDERS_SQL: &str = "\
SELECT t.slug AS tenant, p.name AS provider, p.kind, \
  (SELECT a.finished_at FROM reconcile_attempt a WHERE a.tenant_id = p.tenant_id \
     AND a.provider_id = p.id ORDER BY a.finished_at DESC LIMIT 1) AS last_lookup_at, \
  (SELECT a.outcome FROM reconcile_attempt a WHERE a.tenant_id = p.tenant_id \
     AND a.provider_id = p.id ORDER BY a.finished_at DESC LIMIT 1) AS last_outcome \
FROM provider p JOIN tenant t ON t.id = p.tenant_id \
WHERE ($1 = 0 OR p.tenant_id = $1)";

/// `$1` tenant id or 0. Served by the `quarantine_source` index (tenant_id, source_id, reason).
pub(crate) const QUARANTINE_SQL: &str = "\
SELECT t.slug AS tenant, s.name AS source, g.reason, g.n AS count \
FROM (SELECT q.tenant_id, q.source_id, q.reason, COUNT(*) AS n FROM quarantine q \
      WHERE ($1 = 0 OR q.tenant_id = $1) GROUP BY q.tenant_id, q.source_id, q.reason) g \
JOIN source s ON s.id = g.source_id \
JOIN tenant t ON t.id = g.tenant_id";

pub(crate) fn tenant_param(q: &MetricsQuery) -> i64 {
    q.tenant.map_or(0, |t| t.0)
}
