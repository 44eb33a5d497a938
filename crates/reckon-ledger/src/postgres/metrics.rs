//! Scrape-time metrics queries on PostgreSQL (SQL shared with SQLite in `crate::metrics`).

use super::PgLedger;
use crate::Result;
use crate::metrics::{
    MetricsQuery, MetricsSnapshot, QUARANTINE_SQL, SOURCES_SQL, UNRESOLVED_SQL, map_rows,
    tenant_param,
};

impl PgLedger {
    pub(crate) async fn metrics_snapshot_pg(&self, q: MetricsQuery) -> Result<MetricsSnapshot> {
        let tenant = tenant_param(&q);
        // One read transaction, so the three answers describe the same moment.
        let mut tx = self.pool.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .execute(&mut *tx)
            .await?;
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
        tx.commit().await?;
        Ok(map_rows(&unresolved, &sources, &quarantine)?)
    }
}
