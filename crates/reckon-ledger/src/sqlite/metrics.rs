//! Scrape-time metrics queries on SQLite (SQL shared with PostgreSQL in `crate::metrics`).

use super::SqliteLedger;
use crate::Result;
use crate::metrics::{
    MetricsQuery, MetricsSnapshot, NEEDS_ATTENTION_SQL, QUARANTINE_SQL, SOURCES_SQL,
    UNRESOLVED_SQL, map_rows, tenant_param,
};

impl SqliteLedger {
    pub(crate) async fn metrics_snapshot_sqlite(&self, q: MetricsQuery) -> Result<MetricsSnapshot> {
        let tenant = tenant_param(&q);
        // One read transaction, so the answers describe the same moment.
        let mut tx = self.pool.begin().await?;
        let unresolved = sqlx::query(UNRESOLVED_SQL)
            .bind(q.now)
            .bind(q.replay_closing_created_before)
            .bind(tenant)
            .bind(q.replay_closed_created_before)
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
