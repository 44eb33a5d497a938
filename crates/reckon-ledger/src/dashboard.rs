//! What the dashboard reads beyond the plain effect queries: the scrape's snapshot, the
//! unresolved queue with each effect's reconcile state, the unresolved counts by kind, and
//! the hourly snapshots behind the 7/30-day chart. Each reads O(unresolved effects) index
//! entries (the predicate of `effect_metrics_unresolved`, see `metrics.rs`), never
//! O(effects). Effects a person or the reconciler resolved leave the queue: their source
//! row may still say `unknown` until write-back.

use crate::Result;
use crate::driver::{Driver, SqlLedger, row, sql};
use crate::metrics::{MetricsQuery, MetricsSnapshot};
use crate::model::{Effect, TenantId};
use crate::scope::Scope;
use macro_rules_attribute::apply;
use serde::Serialize;
use sqlx::AssertSqlSafe;

/// Filters and page of [`crate::Ledger::unresolved_queue`]. Pages are keyed by
/// (unresolved since, effect id): oldest first, stable while effects come and go.
#[derive(Debug, Clone, Default)]
pub struct QueueQuery {
    pub source: Option<String>,
    pub operation: Option<String>,
    /// `unknown` or `abandoned`.
    pub kind: Option<String>,
    /// A provider name (the one the reconciler last routed the effect to).
    pub provider: Option<String>,
    /// The last lookup outcome (`indeterminate`, ...).
    pub outcome: Option<String>,
    /// Only effects the reconciler parked for a person.
    pub needs_attention: bool,
    /// The page starts after this (since, id).
    pub after: Option<(f64, i64)>,
    pub limit: i64,
    /// "Now" for deciding which claims are abandoned.
    pub now: f64,
}

/// One row of the queue: the effect and where its reconciliation stands (nothing yet when
/// the reconciler never looked at it).
#[derive(Debug, Clone, Serialize)]
pub struct QueueRow {
    pub effect: Effect,
    /// When it became unresolved (see `Effect::unresolved_since`); the queue's order.
    pub since: f64,
    pub lookups: i64,
    pub next_attempt_at: Option<f64>,
    pub last_attempt_at: Option<f64>,
    pub last_outcome: Option<String>,
    /// The last outcome is not final: a provisional `applied`, or a payment still moving.
    pub non_final: bool,
    pub last_error: Option<String>,
    pub needs_attention: bool,
    pub provider: Option<String>,
}

/// Unresolved effects of one kind (`unknown` or `abandoned`).
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct KindSummary {
    pub kind: String,
    pub count: i64,
    pub oldest_since: f64,
    pub needs_attention: i64,
    /// Created at or before the replay cutoff the caller gave.
    pub replay_closing: i64,
}

/// The open effects of one operation of one source, and where their lookups stand: what
/// the connect checks, the queue and `reckon reconcile` count to say what is still open
/// and why (an operation no provider is routed for is never looked up).
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct OperationBacklog {
    pub source: String,
    /// The key's operation part; `None` for a key justonce's format does not split.
    pub operation: Option<String>,
    /// Unresolved now: unknown, or an abandoned claim.
    pub open: i64,
    /// Of those, `unknown` (the rest are abandoned claims).
    pub unknown: i64,
    /// Parked by the reconciler until a person looks.
    pub needs_attention: i64,
    /// Whose last answer is not final yet (a provisional `applied`, a payment still moving).
    pub provisional: i64,
    /// Asked a provider at least once.
    pub looked_up: i64,
}

/// One hour of the chart: how many effects were unresolved and since when the oldest.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct Snapshot {
    /// The start of the hour (epoch seconds); one row per tenant and hour.
    pub hour: f64,
    pub unresolved: i64,
    /// `None` when nothing was unresolved.
    pub oldest_since: Option<f64>,
    pub needs_attention: i64,
}

/// One provider's recent health (the overview): how often its lookups could not tell.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct ProviderHealth {
    pub provider: String,
    /// Lookups finished in the window.
    pub lookups: i64,
    /// Of those, the ones that ended `indeterminate` (errors included).
    pub indeterminate: i64,
    /// The newest lookup error, of any age.
    pub last_error: Option<String>,
    pub last_error_at: Option<f64>,
}

/// The width of a `provider_lookups` bucket (migration 0021: the trigger's expression).
pub(crate) const LOOKUP_BUCKET_SECS: f64 = 600.0;

/// `$1` tenant, `$2` window start, `$3` the first bucket that starts at or after it. Per
/// provider, the buckets of `provider_lookups` from `$3` on (the trigger of migration 0021
/// counts every attempt as it is recorded) and, for the part of the window before `$3`, a
/// range of `reconcile_attempt_recent` (under ten minutes of lookups); the newest error is
/// the last entry of `reconcile_attempt_failed` (migration 0015). The cost is the buckets
/// of the window and ten minutes of lookups, never the day's lookups or the history.
pub(crate) const PROVIDER_HEALTH_SQL: &str = "\
SELECT p.name AS provider, \
  CAST(COALESCE((SELECT SUM(l.lookups) FROM provider_lookups l WHERE l.tenant_id = p.tenant_id \
     AND l.provider_id = p.id AND l.bucket >= $3), 0) AS BIGINT) \
  + (SELECT COUNT(*) FROM reconcile_attempt a WHERE a.tenant_id = p.tenant_id \
     AND a.provider_id = p.id AND a.finished_at >= $2 AND a.finished_at < $3) AS lookups, \
  CAST(COALESCE((SELECT SUM(l.indeterminate) FROM provider_lookups l \
     WHERE l.tenant_id = p.tenant_id AND l.provider_id = p.id AND l.bucket >= $3), 0) AS BIGINT) \
  + (SELECT COUNT(*) FROM reconcile_attempt a WHERE a.tenant_id = p.tenant_id \
     AND a.provider_id = p.id AND a.finished_at >= $2 AND a.finished_at < $3 \
     AND a.outcome = 'indeterminate') AS indeterminate, \
  (SELECT a.error FROM reconcile_attempt a WHERE a.tenant_id = p.tenant_id \
     AND a.provider_id = p.id AND a.error IS NOT NULL ORDER BY a.finished_at DESC LIMIT 1) AS last_error, \
  (SELECT a.finished_at FROM reconcile_attempt a WHERE a.tenant_id = p.tenant_id \
     AND a.provider_id = p.id AND a.error IS NOT NULL ORDER BY a.finished_at DESC LIMIT 1) AS last_error_at \
FROM provider p WHERE p.tenant_id = $1 ORDER BY p.name";

/// The backlog's index terms (`$1` tenant), and which of it is unresolved (`$2` now).
const BACKLOG: &str = "e.tenant_id = $1 AND (e.state = 'unknown' OR (e.state = 'in_progress' \
     AND e.gone_at IS NULL)) AND NOT e.resolved";
const OPEN: &str = "(e.state = 'unknown' OR e.abandoned_at <= $2)";

/// An abandoned claim is unresolved from the end of its lease (`expires_at`).
const SINCE: &str = "(CASE WHEN e.state = 'unknown' THEN e.updated_at ELSE COALESCE(e.expires_at, e.updated_at) END)";

/// `$1` tenant, `$2` now, `$3` source, `$4` operation, `$5` state (from the kind),
/// `$6` provider, `$7` outcome, `$8` needs attention only, `$9`/`$10` page start, `$11` limit.
pub(crate) fn queue_sql() -> String {
    format!(
        "SELECT {cols}, {SINCE} AS since, \
           COALESCE(rs.attempts, 0) AS rc_attempts, rs.next_attempt_at, rs.last_attempt_at, \
           rs.last_outcome, rs.last_error, COALESCE(rs.needs_attention, FALSE) AS rc_attention, \
           COALESCE(rs.non_final, FALSE) AS rc_non_final, \
           p.name AS provider_name \
         FROM effect e JOIN source s ON s.id = e.source_id \
         LEFT JOIN reconcile_state rs ON rs.effect_id = e.id \
         LEFT JOIN provider p ON p.id = rs.provider_id \
         WHERE {BACKLOG} AND {OPEN} \
           AND ($3 IS NULL OR s.name = $3) \
           AND ($4 IS NULL OR e.operation = $4) \
           AND ($5 IS NULL OR e.state = $5) \
           AND ($6 IS NULL OR p.name = $6) \
           AND ($7 IS NULL OR rs.last_outcome = $7) \
           AND (NOT $8 OR COALESCE(rs.needs_attention, FALSE)) \
           AND ($9 IS NULL OR {SINCE} > $9 OR ({SINCE} = $9 AND e.id > $10)) \
         ORDER BY since, e.id LIMIT $11",
        cols = crate::rows::EFFECT_COLUMNS
    )
}

/// The unresolved effects whose provider's replay window is closing: created after
/// `open_after` (their window is still open) and at or before `closing_before` (it closes
/// within the warning). A window that closed already is not "closing".
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplayClosing {
    pub open_after: f64,
    pub closing_before: f64,
}

impl ReplayClosing {
    /// No effect counts (snapshots need no replay figure).
    pub const NONE: ReplayClosing = ReplayClosing {
        open_after: f64::INFINITY,
        closing_before: f64::NEG_INFINITY,
    };
}

/// `$1` tenant, `$2` now, `$3` replay window opened after, `$4` replay closing before.
/// One pass over the backlog's covering index, which carries whether each entry is parked
/// (0026), so nothing is joined per entry. `OPEN` is counted, not filtered: a filter's
/// selectivity is taken twice, and sorts to group.
pub(crate) fn summary_sql() -> String {
    let n = format!("SUM(CASE WHEN {OPEN} THEN 1 ELSE 0 END)");
    let replay = "e.created_at > $3 AND e.created_at <= $4";
    format!(
        "SELECT CASE WHEN e.state = 'unknown' THEN 'unknown' ELSE 'abandoned' END AS kind, \
           {n} AS count, MIN(CASE WHEN {OPEN} THEN {SINCE} END) AS oldest_since, \
           SUM(CASE WHEN {OPEN} AND e.parked THEN 1 ELSE 0 END) AS needs_attention, \
           SUM(CASE WHEN {OPEN} AND {replay} THEN 1 ELSE 0 END) AS replay_closing \
         FROM effect e WHERE {BACKLOG} GROUP BY e.state HAVING {n} > 0 ORDER BY e.state DESC"
    )
}

/// `$1` tenant, `$2` now. The queue's rows (same predicates and joins), grouped by source and
/// operation: O(unresolved effects), like the queue.
pub(crate) fn backlog_sql() -> String {
    let n = |c: &str| format!("CAST(SUM(CASE WHEN {c} THEN 1 ELSE 0 END) AS BIGINT)");
    format!(
        "SELECT s.name AS source, e.operation AS operation, CAST(COUNT(*) AS BIGINT) AS open, \
           {unknown} AS unknown, {attention} AS needs_attention, {provisional} AS provisional, \
           {looked} AS looked_up \
         FROM effect e JOIN source s ON s.id = e.source_id \
         LEFT JOIN reconcile_state rs ON rs.effect_id = e.id \
         WHERE {BACKLOG} AND {OPEN} GROUP BY s.name, e.operation ORDER BY s.name, e.operation",
        unknown = n("e.state = 'unknown'"),
        attention = n("COALESCE(rs.needs_attention, FALSE)"),
        provisional = n("COALESCE(rs.non_final, FALSE)"),
        looked = n("COALESCE(rs.attempts, 0) > 0"),
    )
}

/// `$1` tenant, `$2` first hour. At most 24 * 31 rows.
pub(crate) const SNAPSHOTS_SQL: &str = "\
SELECT hour, unresolved, oldest_since, needs_attention FROM unresolved_snapshot \
WHERE tenant_id = $1 AND hour >= $2 ORDER BY hour LIMIT 800";

/// The state a kind filter means (`None` for anything else: the caller validated it).
pub(crate) fn state_of_kind(kind: Option<&str>) -> Option<&'static str> {
    match kind {
        Some("unknown") => Some("unknown"),
        Some("abandoned") => Some("in_progress"),
        _ => None,
    }
}

/// The start of the hour `at` falls in.
pub fn hour_of(at: f64) -> f64 {
    (at / 3600.0).floor() * 3600.0
}

/// Sum the kinds into one snapshot.
pub fn snapshot_of(hour: f64, kinds: &[KindSummary]) -> Snapshot {
    Snapshot {
        hour,
        unresolved: kinds.iter().map(|k| k.count).sum(),
        oldest_since: kinds.iter().map(|k| k.oldest_since).min_by(f64::total_cmp),
        needs_attention: kinds.iter().map(|k| k.needs_attention).sum(),
    }
}

use sqlx::Row;

#[apply(row!)]
pub(crate) fn queue_row<DB: Database>(row: &DB::Row, now: f64) -> crate::Result<QueueRow> {
    Ok(QueueRow {
        effect: crate::rows::effect::<DB>(row, now)?,
        since: row.try_get("since")?,
        lookups: row.try_get("rc_attempts")?,
        next_attempt_at: row.try_get("next_attempt_at")?,
        last_attempt_at: row.try_get("last_attempt_at")?,
        last_outcome: row.try_get("last_outcome")?,
        non_final: row.try_get("rc_non_final")?,
        last_error: row.try_get("last_error")?,
        needs_attention: row.try_get("rc_attention")?,
        provider: row.try_get("provider_name")?,
    })
}

#[apply(sql!)]
/// The dashboard's reads, each in a transaction scoped to its tenant (row-level security on
/// PostgreSQL).
impl<B: Driver> Dashboard for SqlLedger<B> {
    /// What `/metrics` reads at scrape time, in one read transaction. `q.tenant: None` is the
    /// operator scope (every tenant); a tenant's request always passes its own `TenantId`.
    /// Costs O(unresolved effects + live claims + sources + quarantined rows), never
    /// O(effects): see `metrics.rs` and migration 0005.
    async fn metrics_snapshot(&self, q: MetricsQuery) -> Result<MetricsSnapshot> {
        B::metrics_snapshot(self, q).await
    }

    /// The unresolved, not yet resolved effects with their reconcile state, oldest first,
    /// one keyset page.
    async fn unresolved_queue(&self, tenant: TenantId, q: &QueueQuery) -> Result<Vec<QueueRow>> {
        let stmt = sqlx::query(AssertSqlSafe(queue_sql()))
            .bind(tenant.0)
            .bind(q.now)
            .bind(q.source.as_deref())
            .bind(q.operation.as_deref())
            .bind(state_of_kind(q.kind.as_deref()))
            .bind(q.provider.as_deref())
            .bind(q.outcome.as_deref())
            .bind(q.needs_attention)
            .bind(q.after.map(|a| a.0))
            .bind(q.after.map_or(0, |a| a.1))
            .bind(q.limit);
        let rows = self.read_all(Scope::Tenant(tenant), stmt).await?;
        rows.iter().map(|r| queue_row::<B::DB>(r, q.now)).collect()
    }

    /// Unresolved, not yet resolved effects by kind; `replay_closing` counts those whose
    /// replay window is still open and closing (see [`ReplayClosing`]).
    async fn unresolved_summary(
        &self,
        tenant: TenantId,
        now: f64,
        replay: crate::dashboard::ReplayClosing,
    ) -> Result<Vec<KindSummary>> {
        let stmt = sqlx::query(AssertSqlSafe(summary_sql()))
            .bind(tenant.0)
            .bind(now)
            .bind(replay.open_after)
            .bind(replay.closing_before);
        crate::rows::all(&self.read_all(Scope::Tenant(tenant), stmt).await?)
    }

    /// The open effects by source and operation, with where their lookups stand.
    async fn unresolved_by_operation(
        &self,
        tenant: TenantId,
        now: f64,
    ) -> Result<Vec<OperationBacklog>> {
        let stmt = sqlx::query(AssertSqlSafe(backlog_sql()))
            .bind(tenant.0)
            .bind(now);
        crate::rows::all(&self.read_all(Scope::Tenant(tenant), stmt).await?)
    }

    /// Count the unresolved effects now and store it as the snapshot of the current hour
    /// (replacing one taken earlier in the same hour).
    async fn take_snapshot(&self, tenant: TenantId, now: f64) -> Result<Snapshot> {
        // One transaction: the row written is the count this transaction read.
        let mut tx = B::begin(self, Scope::Tenant(tenant), true).await?;
        let rows = sqlx::query(AssertSqlSafe(summary_sql()))
            .bind(tenant.0)
            .bind(now)
            .bind(f64::INFINITY)
            .bind(f64::NEG_INFINITY)
            .fetch_all(&mut *tx)
            .await?;
        let snap = snapshot_of(hour_of(now), &crate::rows::all(&rows)?);
        // Taken again in the same hour, the latest count of the hour wins.
        sqlx::query(
            "INSERT INTO unresolved_snapshot (tenant_id, hour, unresolved, oldest_since, \
             needs_attention) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant_id, hour) DO UPDATE \
             SET unresolved = excluded.unresolved, oldest_since = excluded.oldest_since, \
             needs_attention = excluded.needs_attention",
        )
        .bind(tenant.0)
        .bind(snap.hour)
        .bind(snap.unresolved)
        .bind(snap.oldest_since)
        .bind(snap.needs_attention)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(snap)
    }

    /// The hourly snapshots from `since` on, oldest first.
    async fn snapshots(&self, tenant: TenantId, since: f64) -> Result<Vec<Snapshot>> {
        let stmt = sqlx::query(SNAPSHOTS_SQL).bind(tenant.0).bind(since);
        crate::rows::all(&self.read_all(Scope::Tenant(tenant), stmt).await?)
    }

    /// Each of the tenant's providers with its lookups and indeterminate outcomes finished
    /// since `since`, and its newest error (of any age), by name.
    async fn provider_health(&self, tenant: TenantId, since: f64) -> Result<Vec<ProviderHealth>> {
        let stmt = sqlx::query(PROVIDER_HEALTH_SQL)
            .bind(tenant.0)
            .bind(since)
            .bind((since / LOOKUP_BUCKET_SECS).ceil() * LOOKUP_BUCKET_SECS);
        crate::rows::all(&self.read_all(Scope::Tenant(tenant), stmt).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hours_start_on_the_hour() {
        assert_eq!(hour_of(7199.9), 3600.0);
        assert_eq!(hour_of(7200.0), 7200.0);
    }

    #[test]
    fn a_snapshot_sums_the_kinds_and_keeps_the_oldest() {
        let k = |kind: &str, count, oldest, attention| KindSummary {
            kind: kind.into(),
            count,
            oldest_since: oldest,
            needs_attention: attention,
            replay_closing: 0,
        };
        let s = snapshot_of(
            3600.0,
            &[k("unknown", 3, 50.0, 1), k("abandoned", 2, 20.0, 0)],
        );
        assert_eq!(s.unresolved, 5);
        assert_eq!(s.oldest_since, Some(20.0));
        assert_eq!(s.needs_attention, 1);
        assert_eq!(snapshot_of(0.0, &[]).oldest_since, None);
    }
}
