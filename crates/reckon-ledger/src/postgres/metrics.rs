//! Scrape-time metrics queries on PostgreSQL (SQL shared with SQLite in `crate::metrics`).

use super::PgLedger;
use crate::metrics::{
    MetricsQuery, MetricsSnapshot, NEEDS_ATTENTION_SQL, QUARANTINE_SQL, SOURCES_SQL,
    UNRESOLVED_SQL, map_rows, tenant_param,
};
use crate::{Ledger, Result};

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
        let mut all = MetricsSnapshot {
            unresolved: vec![],
            sources: vec![],
            quarantine: vec![],
            needs_attention: vec![],
        };
        for t in tenants {
            let one = self
                .metrics_snapshot_tenant(MetricsQuery {
                    tenant: Some(t),
                    ..q
                })
                .await?;
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
        let mut tx = self.pool.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .execute(&mut *tx)
            .await?;
        Self::rescope(&mut tx, crate::accounts::Scope::Tenant(scoped)).await?;
        // The web side gives up after its own timeout; this stops the server's work too.
        sqlx::query("SET LOCAL statement_timeout = '10s'")
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
