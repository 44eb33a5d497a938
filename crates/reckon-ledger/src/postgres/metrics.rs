//! Scrape-time metrics queries on PostgreSQL (SQL shared with SQLite in `crate::metrics`).

use super::PgLedger;
use crate::metrics::{
    MetricsQuery, MetricsSnapshot, NEEDS_ATTENTION_SQL, NeedsAttentionGroup, QUARANTINE_SQL,
    QuarantineGroup, SOURCES_SQL, SourceHealth, UNRESOLVED_SQL, UnresolvedGroup,
};
use crate::model::TenantId;
use crate::{Result, Tenants};
use futures::{StreamExt, TryStreamExt};
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, Connection, Row};
use std::sync::LazyLock;

/// Connections the operator's scrape uses at once, each reading its share of the tenants
/// one after another (the pool holds 10).
const SCRAPE_CONCURRENCY: usize = 4;

/// A tenant's four reads as one prepared statement returning one row: each read's columns
/// aggregated into arrays (`u_*` unresolved, `s_*` sources, `q_*` quarantine, `a_*` needs
/// attention; every aggregate of a read sees its rows in the same order). Built from the
/// shared SQL, with the tenant as `$3` everywhere (`$1` now, `$2` and `$4` the replay
/// cutoffs).
static TENANT_SNAPSHOT_SQL: LazyLock<String> = LazyLock::new(|| {
    let tenant_is_3 = |sql: &str| sql.replace("$1", "$3");
    format!(
        "SELECT u.*, s.*, q.*, a.* FROM \
         (SELECT array_agg(tenant) AS u_tenant, array_agg(source) AS u_source, \
                 array_agg(operation) AS u_operation, array_agg(unknown) AS u_unknown, \
                 array_agg(abandoned) AS u_abandoned, array_agg(oldest) AS u_oldest, \
                 array_agg(replay_closing) AS u_replay, array_agg(replay_closed) AS u_closed, \
                 array_agg(routed) AS u_routed FROM ({UNRESOLVED_SQL}) x) u, \
         (SELECT array_agg(tenant) AS s_tenant, array_agg(source) AS s_source, \
                 array_agg(kind) AS s_kind, array_agg(last_scan_at) AS s_last_scan, \
                 array_agg(last_success_at) AS s_last_success, \
                 array_agg(consecutive_failures) AS s_failures FROM ({}) x) s, \
         (SELECT array_agg(tenant) AS q_tenant, array_agg(source) AS q_source, \
                 array_agg(reason) AS q_reason, array_agg(n) AS q_n FROM ({}) x) q, \
         (SELECT array_agg(tenant) AS a_tenant, array_agg(source) AS a_source, \
                 array_agg(operation) AS a_operation, array_agg(n) AS a_n FROM ({}) x) a",
        tenant_is_3(SOURCES_SQL),
        tenant_is_3(QUARANTINE_SQL),
        tenant_is_3(NEEDS_ATTENTION_SQL),
    )
});

impl PgLedger {
    /// Row-level security shows a transaction only the tenant it names, so the operator's
    /// view is one scoped read per tenant. Round trips were most of its cost (each read is
    /// O(the tenant's unresolved effects and sources)): a tenant takes two, its scope and
    /// its one statement; [`SCRAPE_CONCURRENCY`] connections share the tenants.
    pub(crate) async fn metrics_snapshot_pg(&self, q: MetricsQuery) -> Result<MetricsSnapshot> {
        let tenants: Vec<TenantId> = match q.tenant {
            Some(t) => vec![t],
            None => self
                .list_tenants()
                .await?
                .into_iter()
                .map(|t| t.id)
                .collect(),
        };
        let per_connection = tenants.len().div_ceil(SCRAPE_CONCURRENCY).max(1);
        // Owned batches: a future borrowing from `tenants` would not be `Send` for every
        // lifetime, which the trait's boxed future needs. In tenant order, so the
        // exposition is stable.
        let batches: Vec<Vec<TenantId>> =
            tenants.chunks(per_connection).map(<[_]>::to_vec).collect();
        let snapshots: Vec<MetricsSnapshot> = futures::stream::iter(batches)
            .map(|batch| self.metrics_batch(q, batch))
            .buffered(SCRAPE_CONCURRENCY)
            .try_collect()
            .await?;
        let mut all = MetricsSnapshot::default();
        for one in snapshots {
            all.unresolved.extend(one.unresolved);
            all.sources.extend(one.sources);
            all.quarantine.extend(one.quarantine);
            all.needs_attention.extend(one.needs_attention);
        }
        Ok(all)
    }

    /// `batch`'s tenants one after another on one connection, each in a read-only
    /// transaction of its own (one snapshot for its four reads).
    async fn metrics_batch(
        &self,
        q: MetricsQuery,
        batch: Vec<TenantId>,
    ) -> Result<MetricsSnapshot> {
        let mut conn = self.pool.acquire().await?;
        let mut all = MetricsSnapshot::default();
        for tenant in batch {
            // One round trip (`begin_with` sends a simple query): the isolation level must
            // come first, then the scope, as every scoped transaction sets it, and a
            // statement timeout (the web side gives up after its own; this stops the
            // server's work too). The tenant id is the only value, an integer.
            // The generic plan, always: the tenant is a parameter and row-level security
            // filters by it through the indexes; planning the statement for each tenant
            // (a custom plan) took 1.4 ms, four times its execution.
            let mut tx = conn
                .begin_with(AssertSqlSafe(format!(
                    "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY; \
                     SELECT set_config('reckon.tenant', '{}', true), \
                     set_config('reckon.token', '', true), set_config('reckon.session', '', true), \
                     set_config('reckon.user', '', true), set_config('statement_timeout', '10s', true), \
                     set_config('plan_cache_mode', 'force_generic_plan', true)",
                    tenant.get()
                )))
                .await?;
            let row = sqlx::query(AssertSqlSafe(TENANT_SNAPSHOT_SQL.as_str()))
                .bind(q.now)
                .bind(q.replay_closing_created_before)
                .bind(tenant.get())
                .bind(q.replay_closed_created_before)
                .fetch_one(&mut *tx)
                .await?;
            // Read only, so rolling back ends it as well as a commit: dropping the
            // transaction queues its ROLLBACK, which goes out with the next BEGIN instead
            // of costing a round trip of its own.
            drop(tx);
            let one = from_arrays(&row)?;
            all.unresolved.extend(one.unresolved);
            all.sources.extend(one.sources);
            all.quarantine.extend(one.quarantine);
            all.needs_attention.extend(one.needs_attention);
        }
        Ok(all)
    }
}

/// One column of array aggregates; NULL (no rows) is empty.
fn col<T>(row: &PgRow, name: &str) -> Result<Vec<T>, sqlx::Error>
where
    Vec<T>: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    Ok(row.try_get::<Option<Vec<T>>, _>(name)?.unwrap_or_default())
}

/// The arrays of one read come from one aggregation, so they are the same length; checked
/// anyway, so that a surprise is an error for this scrape and not a panic.
fn same_len(read: &str, lens: &[usize]) -> Result<(), sqlx::Error> {
    if lens.windows(2).all(|w| w[0] == w[1]) {
        Ok(())
    } else {
        Err(sqlx::Error::Protocol(format!(
            "metrics: the {read} arrays differ in length: {lens:?}"
        )))
    }
}

fn from_arrays(row: &PgRow) -> Result<MetricsSnapshot, sqlx::Error> {
    let mut s = MetricsSnapshot::default();
    let (tenant, source) = (
        col::<String>(row, "u_tenant")?,
        col::<String>(row, "u_source")?,
    );
    let operation = col::<Option<String>>(row, "u_operation")?;
    let (unknown, abandoned) = (
        col::<i64>(row, "u_unknown")?,
        col::<i64>(row, "u_abandoned")?,
    );
    let (oldest, replay) = (col::<f64>(row, "u_oldest")?, col::<i64>(row, "u_replay")?);
    let (closed, routed) = (col::<i64>(row, "u_closed")?, col::<i64>(row, "u_routed")?);
    same_len(
        "unresolved",
        &[
            tenant.len(),
            source.len(),
            operation.len(),
            unknown.len(),
            abandoned.len(),
            oldest.len(),
            replay.len(),
            closed.len(),
            routed.len(),
        ],
    )?;
    for i in 0..tenant.len() {
        s.unresolved.push(UnresolvedGroup {
            tenant: tenant[i].clone(),
            source: source[i].clone(),
            operation: operation[i].clone(),
            unknown: unknown[i],
            abandoned: abandoned[i],
            oldest_since: oldest[i],
            routed: routed[i] != 0,
            replay_window_closing: replay[i],
            replay_window_closed: closed[i],
        });
    }
    let (tenant, source) = (
        col::<String>(row, "s_tenant")?,
        col::<String>(row, "s_source")?,
    );
    let kind = col::<String>(row, "s_kind")?;
    let last_scan = col::<Option<f64>>(row, "s_last_scan")?;
    let last_success = col::<Option<f64>>(row, "s_last_success")?;
    let failures = col::<i64>(row, "s_failures")?;
    same_len(
        "sources",
        &[
            tenant.len(),
            source.len(),
            kind.len(),
            last_scan.len(),
            last_success.len(),
            failures.len(),
        ],
    )?;
    for i in 0..tenant.len() {
        s.sources.push(SourceHealth {
            tenant: tenant[i].clone(),
            source: source[i].clone(),
            kind: kind[i].clone(),
            last_scan_at: last_scan[i],
            last_success_at: last_success[i],
            consecutive_failures: failures[i],
        });
    }
    let (tenant, source) = (
        col::<String>(row, "q_tenant")?,
        col::<String>(row, "q_source")?,
    );
    let (reason, n) = (col::<String>(row, "q_reason")?, col::<i64>(row, "q_n")?);
    same_len(
        "quarantine",
        &[tenant.len(), source.len(), reason.len(), n.len()],
    )?;
    for i in 0..tenant.len() {
        s.quarantine.push(QuarantineGroup {
            tenant: tenant[i].clone(),
            source: source[i].clone(),
            reason: reason[i].clone(),
            count: n[i],
        });
    }
    let (tenant, source) = (
        col::<String>(row, "a_tenant")?,
        col::<String>(row, "a_source")?,
    );
    let (operation, n) = (
        col::<Option<String>>(row, "a_operation")?,
        col::<i64>(row, "a_n")?,
    );
    same_len(
        "needs-attention",
        &[tenant.len(), source.len(), operation.len(), n.len()],
    )?;
    for i in 0..tenant.len() {
        s.needs_attention.push(NeedsAttentionGroup {
            tenant: tenant[i].clone(),
            source: source[i].clone(),
            operation: operation[i].clone(),
            count: n[i],
        });
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_of_different_lengths_are_an_error_not_a_panic() {
        assert!(same_len("x", &[2, 2, 2]).is_ok());
        let e = same_len("sources", &[2, 1]).unwrap_err().to_string();
        assert!(e.contains("sources arrays differ in length"), "{e}");
    }

    #[test]
    fn the_tenant_statement_binds_the_tenant_as_3_in_every_read() {
        let sql = TENANT_SNAPSHOT_SQL.as_str();
        assert!(!sql.contains("$1 = 0"), "{sql}");
        // The unresolved read's own $1 (now) stays; the others' tenant became $3.
        assert_eq!(sql.matches("$3 = 0 OR").count(), 4, "{sql}");
    }
}
