//! The store itself: its schema, its identity, its liveness, and the master key it seals
//! its secrets with.
//!
//! A check value tells at start whether the configured master key is the one the secrets
//! were sealed with: a lost key file (or a replica started without `RECKON_MASTER_KEY`)
//! would otherwise get a fresh key, start, and fail on every source and provider later.
//! Rotation re-seals every secret in one transaction (never half rotated) and is resumable:
//! a secret that already opens under the new key is left as it is.

use crate::driver::{Driver, SqlLedger, sql};
use crate::scope::Scope;
use crate::{PoolStatus, Result};
use macro_rules_attribute::apply;
use serde::Serialize;
use sqlx::{AssertSqlSafe, Row};

/// The plaintext of the check value; its AAD binds it to this one use.
pub(crate) const CHECK_PLAINTEXT: &[u8] = b"reckon master key check v1";
pub(crate) const CHECK_AAD: &str = "reckon/v1|keyring-check";

/// What a rotation re-sealed.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct RotateReport {
    pub source_dsns: u64,
    pub provider_secrets: u64,
    pub totp_secrets: u64,
    /// Secrets that already opened under the new key (an earlier, interrupted run).
    pub already_rotated: u64,
}

#[apply(sql!)]
impl<B: Driver> Store for SqlLedger<B> {
    /// Apply the embedded migrations of this backend (idempotent), then the data jobs they
    /// queue (charge search terms, recorded ids, the scrub of stored credentials).
    async fn migrate(&self) -> Result<()> {
        B::migrate_schema(self).await?;
        self.backfill_charge_terms().await?;
        self.backfill_recorded_ids().await?;
        self.scrub_pending().await
    }

    /// Cheap liveness query for `/readyz`.
    async fn ping(&self) -> Result<()> {
        // One round trip on a pooled connection: no tenant data, so no scope.
        let mut conn = self.pool_now().acquire().await?;
        sqlx::query("SELECT 1").execute(&mut *conn).await?;
        Ok(())
    }

    /// The connection pool as it is now (no query): what on-call checks first when the
    /// ledger is slow (every connection in use means requests queue for one).
    fn pool_status(&self) -> PoolStatus {
        PoolStatus::of(&self.pool)
    }

    /// This ledger's identity, a random value made when it was created
    /// (`reckon_instance`). A tenant's source connection that can see it has reached
    /// reckon's own database and is refused (`EgressPolicy::with_own_identity`).
    async fn instance_identity(&self) -> Result<String> {
        let mut conn = self.pool.acquire().await?;
        Ok(
            sqlx::query_scalar("SELECT identity FROM reckon_instance WHERE id = 1")
                .fetch_one(&mut *conn)
                .await?,
        )
    }

    /// Refuse a master key that is not the one this ledger's secrets were sealed with
    /// ([`crate::LedgerError::WrongMasterKey`]); on a new ledger, record the key's check
    /// value.
    async fn check_keyring(&self) -> crate::Result<()> {
        let mut tx = B::begin(self, Scope::Global, true).await?;
        let sealed: Option<Vec<u8>> =
            sqlx::query_scalar("SELECT sealed FROM keyring_check WHERE id = 1")
                .fetch_optional(&mut *tx)
                .await?;
        match sealed {
            Some(s) => {
                if self.keyring.open(crate::store::CHECK_AAD, &s).as_deref()
                    != Some(crate::store::CHECK_PLAINTEXT)
                {
                    return Err(crate::LedgerError::WrongMasterKey);
                }
            }
            None => {
                let s = self
                    .keyring
                    .seal(crate::store::CHECK_AAD, crate::store::CHECK_PLAINTEXT);
                sqlx::query(
                    "INSERT INTO keyring_check (id, sealed, created_at) VALUES (1, $1, $2) \
                     ON CONFLICT (id) DO NOTHING",
                )
                .bind(s)
                .bind(reckon_domain::time::now())
                .execute(&mut *tx)
                .await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }

    /// Re-seal every stored secret (DSNs, provider secrets, TOTP secrets) and the check
    /// value under `new`, in one transaction; resumable. Afterwards only `new` opens the
    /// ledger: the operator must switch to it before the next start.
    async fn rotate_keyring(
        &self,
        new: &crate::Keyring,
    ) -> crate::Result<crate::store::RotateReport> {
        let old = &self.keyring;
        let mut report = crate::store::RotateReport::default();
        // Re-seal one ciphertext: open under the old key (or find it already under
        // the new one), seal under the new. A secret neither key opens stops the
        // rotation: rotating it would lose it.
        // `None`: it already opens under the new key.
        let reseal = |aad: &str, sealed: &[u8], what: &str| -> crate::Result<Option<Vec<u8>>> {
            if new.open(aad, sealed).is_some() {
                return Ok(None);
            }
            let plain = old.open(aad, sealed).ok_or_else(|| {
                crate::LedgerError::Invalid(format!(
                    "{what} opens under neither the current nor the new master key: \
                     nothing was rotated"
                ))
            })?;
            Ok(Some(new.seal(aad, &plain)))
        };
        let mut tx = B::begin(self, Scope::Global, true).await?;
        let tenants: Vec<i64> = sqlx::query_scalar("SELECT id FROM tenant ORDER BY id")
            .fetch_all(&mut *tx)
            .await?;
        for t in tenants {
            B::rescope(&mut tx, Scope::Tenant(crate::TenantId(t))).await?;
            // Each table's sealed column, and what a secret of it is called in an error.
            for (table, column, what) in [
                ("source", "dsn_ciphertext", "DSN"),
                ("provider", "secret_ciphertext", "secret"),
            ] {
                let rows = sqlx::query(AssertSqlSafe(format!(
                    "SELECT id, name, {column} FROM {table} \
                     WHERE tenant_id = $1 AND {column} IS NOT NULL"
                )))
                .bind(t)
                .fetch_all(&mut *tx)
                .await?;
                for r in rows {
                    let (id, name, sealed): (i64, String, Vec<u8>) =
                        (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?);
                    let aad = match table {
                        "source" => reckon_keyring::dsn_aad(t, &name),
                        _ => crate::providers::provider_secret_aad(t, &name),
                    };
                    let Some(s) = reseal(&aad, &sealed, &format!("{table} {name:?}'s {what}"))?
                    else {
                        report.already_rotated += 1;
                        continue;
                    };
                    sqlx::query(AssertSqlSafe(format!(
                        "UPDATE {table} SET {column} = $1 WHERE id = $2 AND tenant_id = $3"
                    )))
                    .bind(s)
                    .bind(id)
                    .bind(t)
                    .execute(&mut *tx)
                    .await?;
                    match table {
                        "source" => report.source_dsns += 1,
                        _ => report.provider_secrets += 1,
                    }
                }
            }
        }
        B::rescope(&mut tx, Scope::Global).await?;
        let rows =
            sqlx::query("SELECT id, totp_secret FROM app_user WHERE totp_secret IS NOT NULL")
                .fetch_all(&mut *tx)
                .await?;
        for r in rows {
            let (id, sealed): (i64, Vec<u8>) = (r.try_get(0)?, r.try_get(1)?);
            let aad = crate::accounts::totp_aad(id);
            if let Some(s) = reseal(&aad, &sealed, &format!("user #{id}'s TOTP secret"))? {
                sqlx::query("UPDATE app_user SET totp_secret = $1 WHERE id = $2")
                    .bind(s)
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                report.totp_secrets += 1;
            } else {
                report.already_rotated += 1;
            }
        }
        // Last, in the same transaction: the check value, so the new key is the one
        // the next start accepts.
        sqlx::query("UPDATE keyring_check SET sealed = $1 WHERE id = 1")
            .bind(new.seal(crate::store::CHECK_AAD, crate::store::CHECK_PLAINTEXT))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(report)
    }
}
