//! Scrape-time metrics queries on PostgreSQL (SQL shared with SQLite in `crate::metrics`).

use super::PgLedger;
use crate::metrics::{
    MetricsQuery, MetricsSnapshot, PROVIDERS_SQL, QUARANTINE_SQL, SOURCES_SQL, UNRESOLVED_SQL,
};
use crate::model::TenantId;
use crate::{LedgerError, Result, Tenants};
use futures::{StreamExt, TryStreamExt};
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, Connection, Row};
use std::sync::LazyLock;

/// Connections the operator's scrape uses at once, each reading its share of the tenants
/// one after another (the pool holds 10).
const SCRAPE_CONCURRENCY: usize = 4;

/// A tenant's four reads as one prepared statement returning one row: each read's rows as
/// one JSON array of objects named by its columns (`u` unresolved, `s` sources, `q`
/// quarantine, `p` providers). Built from the shared SQL, with the tenant as `$3` everywhere (`$1` now,
/// `$2` and `$4` the replay cutoffs).
static TENANT_SNAPSHOT_SQL: LazyLock<String> = LazyLock::new(|| {
    let tenant_is_3 = |sql: &str| sql.replace("$1", "$3");
    let read = |sql: &str| format!("(SELECT COALESCE(json_agg(x), '[]')::text FROM ({sql}) x)");
    format!(
        "SELECT {} AS u, {} AS s, {} AS q, {} AS p",
        read(UNRESOLVED_SQL),
        read(&tenant_is_3(SOURCES_SQL)),
        read(&tenant_is_3(QUARANTINE_SQL)),
        read(&tenant_is_3(PROVIDERS_SQL)),
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
        snapshots.into_iter().for_each(|one| all.append(one));
        Ok(all)
    }

    /// `batch`'s tenants one after another on one connection, each in a read-only
    /// transaction of its own (one snapshot for its three reads).
    async fn metrics_batch(
        &self,
        q: MetricsQuery,
        batch: Vec<TenantId>,
    ) -> Result<MetricsSnapshot> {
        let started = std::time::Instant::now();
        let mut conn = self.pool_now().acquire().await?;
        crate::pools::note_acquire(started, super::POOL_FULL);
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
            all.append(from_json(&row)?);
        }
        Ok(all)
    }
}

/// One tenant's row of [`TENANT_SNAPSHOT_SQL`].
fn from_json(row: &PgRow) -> Result<MetricsSnapshot> {
    fn read<T: serde::de::DeserializeOwned>(row: &PgRow, name: &str) -> Result<Vec<T>> {
        let text: String = row.try_get(name)?;
        serde_json::from_str(&text)
            .map_err(|e| LedgerError::Invalid(format!("metrics: the {name} read: {e}")))
    }
    Ok(MetricsSnapshot {
        unresolved: read(row, "u")?,
        sources: read(row, "s")?,
        quarantine: read(row, "q")?,
        providers: read(row, "p")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tenant_statement_binds_the_tenant_as_3_in_every_read() {
        let sql = TENANT_SNAPSHOT_SQL.as_str();
        assert!(!sql.contains("$1 = 0"), "{sql}");
        // The unresolved read's own $1 (now) stays; the others' tenant became $3.
        assert_eq!(sql.matches("$3 = 0 OR").count(), 4, "{sql}");
    }
}
