//! The dashboard's queries on PostgreSQL (SQL shared with SQLite in `crate::dashboard`),
//! each in a transaction scoped to its tenant (row-level security).

use super::PgLedger;
use crate::Result;
use crate::dashboard::{
    KindSummary, PROVIDER_HEALTH_SQL, ProviderHealth, QueueQuery, QueueRow, SNAPSHOT_UPSERT,
    SNAPSHOTS_SQL, Snapshot, hour_of, kind_row, provider_health_row, queue_row, queue_sql,
    request_scan_sql, snapshot_of, snapshot_row, state_of_kind, summary_sql,
};
use crate::model::TenantId;
use sqlx::{AssertSqlSafe, Postgres};

impl PgLedger {
    pub(crate) async fn dash_queue(
        &self,
        tenant: TenantId,
        q: &QueueQuery,
    ) -> Result<Vec<QueueRow>> {
        let mut tx = self.begin_for(tenant).await?;
        let rows = sqlx::query(AssertSqlSafe(queue_sql()))
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
            .bind(q.limit)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        rows.iter()
            .map(|r| queue_row::<Postgres>(r, q.now))
            .collect()
    }

    pub(crate) async fn dash_summary(
        &self,
        tenant: TenantId,
        now: f64,
        replay: crate::dashboard::ReplayClosing,
    ) -> Result<Vec<KindSummary>> {
        let mut tx = self.begin_for(tenant).await?;
        let rows = sqlx::query(AssertSqlSafe(summary_sql()))
            .bind(tenant.0)
            .bind(now)
            .bind(replay.open_after)
            .bind(replay.closing_before)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        rows.iter().map(kind_row::<Postgres>).collect()
    }

    pub(crate) async fn dash_take_snapshot(&self, tenant: TenantId, now: f64) -> Result<Snapshot> {
        // One transaction: the row written is the count this transaction read.
        let mut tx = self.begin_for(tenant).await?;
        let rows = sqlx::query(AssertSqlSafe(summary_sql()))
            .bind(tenant.0)
            .bind(now)
            .bind(f64::INFINITY)
            .bind(f64::NEG_INFINITY)
            .fetch_all(&mut *tx)
            .await?;
        let kinds = rows
            .iter()
            .map(kind_row::<Postgres>)
            .collect::<Result<Vec<_>>>()?;
        let snap = snapshot_of(hour_of(now), &kinds);
        sqlx::query(SNAPSHOT_UPSERT)
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

    pub(crate) async fn dash_snapshots(
        &self,
        tenant: TenantId,
        since: f64,
    ) -> Result<Vec<Snapshot>> {
        let mut tx = self.begin_for(tenant).await?;
        let rows = sqlx::query(SNAPSHOTS_SQL)
            .bind(tenant.0)
            .bind(since)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        rows.iter().map(snapshot_row::<Postgres>).collect()
    }

    pub(crate) async fn dash_provider_health(
        &self,
        tenant: TenantId,
        since: f64,
    ) -> Result<Vec<ProviderHealth>> {
        let mut tx = self.begin_for(tenant).await?;
        let rows = sqlx::query(PROVIDER_HEALTH_SQL)
            .bind(tenant.0)
            .bind(since)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        rows.iter().map(provider_health_row::<Postgres>).collect()
    }

    pub(crate) async fn dash_request_scan(
        &self,
        tenant: TenantId,
        name: &str,
        at: f64,
    ) -> Result<crate::model::Source> {
        let mut tx = self.begin_for(tenant).await?;
        let row = sqlx::query(AssertSqlSafe(request_scan_sql()))
            .bind(tenant.0)
            .bind(name)
            .bind(at)
            .fetch_optional(&mut *tx)
            .await?;
        tx.commit().await?;
        let row =
            row.ok_or_else(|| crate::LedgerError::NotFound(format!("scanned source {name:?}")))?;
        crate::rows::source::<Postgres>(&row)
    }
}
