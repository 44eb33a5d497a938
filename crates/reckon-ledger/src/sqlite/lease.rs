//! Leases on the embedded SQLite ledger. One process owns the file (`reckon serve` takes an
//! exclusive lock on it), so the clock is that process's; every write runs under
//! `BEGIN IMMEDIATE`, which serialises a fence check with any claim.

use super::SqliteLedger;
use crate::rows::check_lease_ttl as check_ttl;
use crate::{Lease, LedgerError, Result};
use reckon_domain::time;
use sqlx::{Row, SqliteConnection};

impl SqliteLedger {
    pub(super) async fn lease_try(
        &self,
        name: &str,
        owner: &str,
        ttl_secs: f64,
    ) -> Result<Option<Lease>> {
        check_ttl(ttl_secs)?;
        let now = time::now();
        let mut tx = self.write_tx().await?;
        // Free or expired: take it with the next term. Held by the same owner and still
        // valid: renew in the same term. Held by someone else: leave it.
        let row = sqlx::query(
            "INSERT INTO work_lease (name, owner, term, acquired_at, expires_at) \
             VALUES ($1, $2, 1, $3, $4) \
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
             RETURNING term, expires_at",
        )
        .bind(name)
        .bind(owner)
        .bind(now)
        .bind(now + ttl_secs)
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(row.map(|r| Lease {
            name: name.to_owned(),
            owner: owner.to_owned(),
            term: r.get(0),
            expires_at: r.get(1),
        }))
    }

    pub(super) async fn lease_renew(&self, lease: &Lease, ttl_secs: f64) -> Result<Option<Lease>> {
        check_ttl(ttl_secs)?;
        let now = time::now();
        let mut tx = self.write_tx().await?;
        let row = sqlx::query(
            "UPDATE work_lease SET expires_at = $1 \
             WHERE name = $2 AND owner = $3 AND term = $4 AND expires_at > $5 \
             RETURNING expires_at",
        )
        .bind(now + ttl_secs)
        .bind(&lease.name)
        .bind(&lease.owner)
        .bind(lease.term)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(row.map(|r| Lease {
            expires_at: r.get(0),
            ..lease.clone()
        }))
    }

    pub(super) async fn lease_release(&self, lease: &Lease) -> Result<()> {
        // Expire rather than delete: the term must keep growing across owners.
        let mut tx = self.write_tx().await?;
        sqlx::query(
            "UPDATE work_lease SET expires_at = $1 \
             WHERE name = $2 AND owner = $3 AND term = $4 AND expires_at > $1",
        )
        .bind(time::now())
        .bind(&lease.name)
        .bind(&lease.owner)
        .bind(lease.term)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }
}

impl SqliteLedger {
    pub(super) async fn lease_count(&self, prefix: &str) -> Result<i64> {
        // substr, not LIKE: a name may hold `_` or `%`.
        Ok(sqlx::query_scalar(
            "SELECT COUNT(*) FROM work_lease \
             WHERE substr(name, 1, length($1)) = $1 AND expires_at > $2",
        )
        .bind(prefix)
        .bind(time::now())
        .fetch_one(&self.pool)
        .await?)
    }

    pub(super) async fn lease_holder_now(&self, name: &str) -> Result<Option<Lease>> {
        let row = sqlx::query(
            "SELECT owner, term, expires_at FROM work_lease WHERE name = $1 AND expires_at > $2",
        )
        .bind(name)
        .bind(time::now())
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

/// Inside a write transaction: refuse to go on unless `lease` is still held.
pub(super) async fn fence(conn: &mut SqliteConnection, lease: Option<&Lease>) -> Result<()> {
    let Some(lease) = lease else { return Ok(()) };
    let held: Option<i64> = sqlx::query_scalar(
        "SELECT 1 FROM work_lease \
         WHERE name = $1 AND owner = $2 AND term = $3 AND expires_at > $4",
    )
    .bind(&lease.name)
    .bind(&lease.owner)
    .bind(lease.term)
    .bind(time::now())
    .fetch_optional(conn)
    .await?;
    match held {
        Some(_) => Ok(()),
        None => Err(LedgerError::LeaseLost(lease.name.clone())),
    }
}
