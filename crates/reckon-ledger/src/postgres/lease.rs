//! Leases on the PostgreSQL ledger, shared by every replica. Times come from the database's
//! clock (`clock_timestamp()`), so replicas whose clocks disagree still agree on who holds
//! what. A fence check takes `FOR SHARE` on the lease row: a replica taking the lease over
//! waits until a fenced write in flight has committed, and every write after the takeover
//! finds the old term gone.

use super::PgLedger;
use crate::rows::check_lease_ttl as check_ttl;
use crate::{Lease, LedgerError, Result};
use sqlx::{PgConnection, Row};

const NOW: &str = "EXTRACT(EPOCH FROM clock_timestamp())::float8";

impl PgLedger {
    pub(super) async fn lease_try(
        &self,
        name: &str,
        owner: &str,
        ttl_secs: f64,
    ) -> Result<Option<Lease>> {
        check_ttl(ttl_secs)?;
        let sql = format!(
            "INSERT INTO work_lease (name, owner, term, acquired_at, expires_at) \
             VALUES ($1, $2, 1, {NOW}, {NOW} + $3) \
             ON CONFLICT (name) DO UPDATE SET \
               term = CASE WHEN work_lease.owner = excluded.owner \
                            AND work_lease.expires_at > excluded.acquired_at \
                           THEN work_lease.term ELSE work_lease.term + 1 END, \
               acquired_at = CASE WHEN work_lease.owner = excluded.owner \
                            AND work_lease.expires_at > excluded.acquired_at \
                           THEN work_lease.acquired_at ELSE excluded.acquired_at END, \
               owner = excluded.owner, expires_at = excluded.expires_at \
             WHERE work_lease.expires_at <= excluded.acquired_at \
                OR work_lease.owner = excluded.owner \
             RETURNING term, expires_at"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(name)
            .bind(owner)
            .bind(ttl_secs)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| Lease {
            name: name.to_owned(),
            owner: owner.to_owned(),
            term: r.get(0),
            expires_at: r.get(1),
        }))
    }

    pub(super) async fn lease_renew(&self, lease: &Lease, ttl_secs: f64) -> Result<Option<Lease>> {
        check_ttl(ttl_secs)?;
        let sql = format!(
            "UPDATE work_lease SET expires_at = {NOW} + $1 \
             WHERE name = $2 AND owner = $3 AND term = $4 AND expires_at > {NOW} \
             RETURNING expires_at"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(ttl_secs)
            .bind(&lease.name)
            .bind(&lease.owner)
            .bind(lease.term)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| Lease {
            expires_at: r.get(0),
            ..lease.clone()
        }))
    }

    pub(super) async fn lease_release(&self, lease: &Lease) -> Result<()> {
        // Expire rather than delete: the term must keep growing across owners.
        let sql = format!(
            "UPDATE work_lease SET expires_at = {NOW} \
             WHERE name = $1 AND owner = $2 AND term = $3 AND expires_at > {NOW}"
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&lease.name)
            .bind(&lease.owner)
            .bind(lease.term)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

impl PgLedger {
    pub(super) async fn lease_count(&self, prefix: &str) -> Result<i64> {
        let sql = format!(
            "SELECT COUNT(*) FROM work_lease WHERE starts_with(name, $1) AND expires_at > {NOW}"
        );
        Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(prefix)
            .fetch_one(&self.pool)
            .await?)
    }

    pub(super) async fn lease_holder_now(&self, name: &str) -> Result<Option<Lease>> {
        let sql = format!(
            "SELECT owner, term, expires_at FROM work_lease WHERE name = $1 AND expires_at > {NOW}"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| Lease {
            name: name.to_owned(),
            owner: r.get(0),
            term: r.get(1),
            expires_at: r.get(2),
        }))
    }
}

/// Inside a write transaction: refuse to go on unless `lease` is still held, and keep it
/// from changing hands until this transaction ends.
pub(super) async fn fence(conn: &mut PgConnection, lease: Option<&Lease>) -> Result<()> {
    let Some(lease) = lease else { return Ok(()) };
    let sql = format!(
        "SELECT 1 FROM work_lease \
         WHERE name = $1 AND owner = $2 AND term = $3 AND expires_at > {NOW} FOR SHARE"
    );
    let held: Option<i32> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(&lease.name)
        .bind(&lease.owner)
        .bind(lease.term)
        .fetch_optional(conn)
        .await?;
    match held {
        Some(_) => Ok(()),
        None => Err(LedgerError::LeaseLost(lease.name.clone())),
    }
}
