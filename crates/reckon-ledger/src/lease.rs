//! Leases: who does a piece of shared work (a source's scan, a tenant's audit) and in which
//! term. Times come from the database's clock ([`Driver::NOW`]), so replicas whose clocks
//! disagree still agree on who holds what. A fence check inside a write transaction
//! ([`crate::driver::fence`]) keeps the lease from changing hands until that transaction
//! ends: PostgreSQL takes `FOR SHARE` on the lease row (a replica taking the lease over
//! waits until the fenced write has committed, and every write after the takeover finds
//! the old term gone); on SQLite the write transaction itself excludes every other writer.

use crate::driver::{Driver, SqlLedger, sql};
use crate::rows::check_lease_ttl as check_ttl;
use crate::scope::Scope;
use crate::{Lease, Result};
use macro_rules_attribute::apply;
use sqlx::{AssertSqlSafe, Row};

#[apply(sql!)]
/// Leases: work that exactly one replica does at a time.
impl<B: Driver> Leases for SqlLedger<B> {
    /// Take the lease `name` for `ttl_secs` if it is free, expired, or already held by
    /// `owner` (then it is renewed, same term). `None` when another owner holds it.
    async fn try_lease(&self, name: &str, owner: &str, ttl_secs: f64) -> Result<Option<Lease>> {
        self.take_lease(name, owner, ttl_secs, false).await
    }

    /// As [`Leases::try_lease`], and while this ledger holds the lease it keeps a mark of
    /// its presence that ends with its process (see [`Driver::mark`]): a holder that died
    /// leaves the lease to the next taker at once, in the next term, instead of at the end
    /// of its own. For leases held by few at a time (a mark costs the server a lock).
    async fn try_lease_present(
        &self,
        name: &str,
        owner: &str,
        ttl_secs: f64,
    ) -> Result<Option<Lease>> {
        self.take_lease(name, owner, ttl_secs, true).await
    }

    /// Extend a lease still held; `None` when it expired or changed hands (it is lost: stop
    /// the work, its writes will be refused).
    async fn renew_lease(&self, lease: &Lease, ttl_secs: f64) -> Result<Option<Lease>> {
        check_ttl(ttl_secs)?;
        let now = B::NOW;
        let stmt = sqlx::query(AssertSqlSafe(format!(
            "UPDATE work_lease SET expires_at = {now} + $1 \
             WHERE name = $2 AND owner = $3 AND term = $4 AND expires_at > {now} \
             RETURNING expires_at"
        )))
        .bind(ttl_secs)
        .bind(&lease.name)
        .bind(&lease.owner)
        .bind(lease.term);
        let row = self.write_opt(Scope::Global, stmt).await?;
        Ok(row.map(|r| Lease {
            expires_at: r.get(0),
            ..lease.clone()
        }))
    }

    /// Hand a lease back early so another replica can take the work at once.
    async fn release_lease(&self, lease: &Lease) -> Result<()> {
        // Expire rather than delete: the term must keep growing across owners.
        let now = B::NOW;
        let stmt = sqlx::query(AssertSqlSafe(format!(
            "UPDATE work_lease SET expires_at = {now} \
             WHERE name = $1 AND owner = $2 AND term = $3 AND expires_at > {now}"
        )));
        let stmt = stmt.bind(&lease.name).bind(&lease.owner).bind(lease.term);
        // The mark goes with the term it marked (a term already lost may have been followed
        // by a newer one of this ledger's, under the same name and mark).
        if self.exec(Scope::Global, stmt).await? > 0 {
            self.driver.unmark(&lease.name).await;
        }
        Ok(())
    }

    /// How many leases whose name starts with `prefix` are held now.
    async fn count_leases(&self, prefix: &str) -> Result<i64> {
        // substr, not LIKE: a name may hold `_` or `%`.
        let now = B::NOW;
        let stmt = sqlx::query(AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM work_lease \
             WHERE substr(name, 1, length($1)) = $1 AND expires_at > {now}"
        )));
        let row = self.read_opt(Scope::Global, stmt.bind(prefix)).await?;
        Ok(row.map_or(Ok(0), |r| r.try_get(0))?)
    }

    /// Who holds the lease `name` now, and until when; `None` when it is free (never
    /// taken, released, or expired).
    async fn lease_holder(&self, name: &str) -> Result<Option<Lease>> {
        let now = B::NOW;
        let stmt = sqlx::query(AssertSqlSafe(format!(
            "SELECT owner, term, expires_at FROM work_lease WHERE name = $1 AND expires_at > {now}"
        )))
        .bind(name);
        let row = self.read_opt(Scope::Global, stmt).await?;
        Ok(row.map(|r| Lease {
            name: name.to_owned(),
            owner: r.get(0),
            term: r.get(1),
            expires_at: r.get(2),
        }))
    }
}

#[apply(sql!)]
impl<B: Driver> SqlLedger<B> {
    /// [`Leases::try_lease`], with a mark of presence when `present`.
    async fn take_lease(
        &self,
        name: &str,
        owner: &str,
        ttl_secs: f64,
        present: bool,
    ) -> Result<Option<Lease>> {
        check_ttl(ttl_secs)?;
        let now = B::NOW;
        let marked = present && self.driver.mark(name).await;
        // Free or expired: take it with the next term. Held by the same owner and still
        // valid: renew in the same term. Held by someone else: leave it, unless its holder
        // marked its presence and the mark is gone (this ledger holds it now): the holder
        // died, or lost the session its fenced writes would need; take it over.
        let stmt = sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO work_lease (name, owner, term, acquired_at, expires_at, present) \
             VALUES ($1, $2, 1, {now}, {now} + $3, $4) \
             ON CONFLICT (name) DO UPDATE SET \
               term = CASE WHEN work_lease.owner = excluded.owner \
                            AND work_lease.expires_at > excluded.acquired_at \
                           THEN work_lease.term ELSE work_lease.term + 1 END, \
               acquired_at = CASE WHEN work_lease.owner = excluded.owner \
                            AND work_lease.expires_at > excluded.acquired_at \
                           THEN work_lease.acquired_at ELSE excluded.acquired_at END, \
               owner = excluded.owner, expires_at = excluded.expires_at, \
               present = excluded.present \
             WHERE work_lease.expires_at <= excluded.acquired_at \
                OR work_lease.owner = excluded.owner \
                OR (work_lease.present AND $4) \
             RETURNING term, expires_at"
        )));
        let stmt = stmt.bind(name).bind(owner).bind(ttl_secs).bind(marked);
        let row = self.write_opt(Scope::Global, stmt).await;
        if marked && !matches!(row, Ok(Some(_))) {
            self.driver.unmark(name).await;
        }
        Ok(row?.map(|r| Lease {
            name: name.to_owned(),
            owner: owner.to_owned(),
            term: r.get(0),
            expires_at: r.get(1),
        }))
    }
}
