//! Scrape-time metrics queries on PostgreSQL (SQL shared with SQLite in `crate::metrics`).

use super::PgLedger;
use crate::metrics::{
    MetricsQuery, MetricsSnapshot, NEEDS_ATTENTION_SQL, QUARANTINE_SQL, SOURCES_SQL,
    UNRESOLVED_SQL, map_rows, tenant_param,
};
use crate::{Ledger, Result};
use futures::{StreamExt, TryStreamExt};

/// Tenants read at once by the operator's scrape (the pool holds 10 connections).
const SCRAPE_CONCURRENCY: usize = 4;

impl PgLedger {
    pub(crate) async fn metrics_snapshot_pg(&self, q: MetricsQuery) -> Result<MetricsSnapshot> {
        // Row-level security shows a transaction only the tenant it names, so the operator's
        // view is one scoped read per tenant, merged. Each costs O(its unresolved effects
        // and sources), like the single-tenant scrape.
        let tenants = match q.tenant {
            Some(t) => vec![t],
            None => self
                .list_tenants()
                .await?
                .into_iter()
                .map(|t| t.id)
                .collect(),
        };
        // Several tenants at once (each its own transaction and pooled connection), in
        // tenant order so the exposition is stable. A scrape is one per cache period (the
        // web side's single flight), so this never takes more than these connections.
        let snapshots: Vec<MetricsSnapshot> = futures::stream::iter(tenants)
            .map(|t| {
                self.metrics_snapshot_tenant(MetricsQuery {
                    tenant: Some(t),
                    ..q
                })
            })
            .buffered(SCRAPE_CONCURRENCY)
            .try_collect()
            .await?;
        let mut all = MetricsSnapshot {
            unresolved: vec![],
            sources: vec![],
            quarantine: vec![],
            needs_attention: vec![],
        };
        for one in snapshots {
            all.unresolved.extend(one.unresolved);
            all.sources.extend(one.sources);
            all.quarantine.extend(one.quarantine);
            all.needs_attention.extend(one.needs_attention);
        }
        Ok(all)
    }

    async fn metrics_snapshot_tenant(&self, q: MetricsQuery) -> Result<MetricsSnapshot> {
        let tenant = tenant_param(&q);
        let scoped = q.tenant.expect("a tenant-scoped snapshot");
        // One read transaction, so the answers describe the same moment.
        // The isolation level must be set before any other statement, the tenant right after.
        // Round trips are most of a small tenant's cost: the isolation level goes with
        // BEGIN, and the tenant with the statement timeout (the web side gives up after its
        // own timeout; this stops the server's work too) in one statement.
        let mut tx = self
            .pool
            .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .await?;
        let (tenant_setting, _, _, _) = crate::accounts::Scope::Tenant(scoped).settings();
        sqlx::query(
            "SELECT set_config('reckon.tenant', $1, true), set_config('reckon.token', '', true), \
             set_config('reckon.session', '', true), set_config('reckon.user', '', true), \
             set_config('statement_timeout', '10s', true)",
        )
        .bind(tenant_setting)
        .execute(&mut *tx)
        .await?;
        let unresolved = sqlx::query(UNRESOLVED_SQL)
            .bind(q.now)
            .bind(q.replay_closing_created_before)
            .bind(tenant)
            .fetch_all(&mut *tx)
            .await?;
        let sources = sqlx::query(SOURCES_SQL)
            .bind(tenant)
            .fetch_all(&mut *tx)
            .await?;
        let quarantine = sqlx::query(QUARANTINE_SQL)
            .bind(tenant)
            .fetch_all(&mut *tx)
            .await?;
        let attention = sqlx::query(NEEDS_ATTENTION_SQL)
            .bind(tenant)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(map_rows(&unresolved, &sources, &quarantine, &attention)?)
    }
}
