//! Reconciliation storage on SQLite. Leases are taken by a conditional upsert inside a
//! `BEGIN IMMEDIATE` transaction: SQLite has one writer at a time, so the candidate read
//! and the lease write cannot interleave with another worker's.

use super::SqliteLedger;
use crate::model::TenantId;
use crate::reconcile::*;
use crate::rows::{self, check_name};
use crate::{LedgerError, Result};
use reckon_domain::time;
use secrecy::{ExposeSecret, SecretString};
use sqlx::{AssertSqlSafe, Row, Sqlite};

type Conn = sqlx::SqliteConnection;

/// The unresolved predicate of `push_filters`, plus "no resolution yet".
const OPEN_EFFECT: &str = "(e.state = 'unknown' OR (e.state = 'in_progress' AND e.gone_at IS NULL \
     AND e.abandoned_at <= $2)) AND NOT EXISTS (SELECT 1 FROM resolution z WHERE z.effect_id = e.id)";

impl SqliteLedger {
    pub(super) async fn rc_add_provider(
        &self,
        tenant: TenantId,
        new: NewProvider,
    ) -> Result<Provider> {
        check_name("provider name", &new.name)?;
        let sealed = new.secret.as_ref().map(|s| {
            self.keyring.seal(
                &provider_secret_aad(tenant.0, &new.name),
                s.expose_secret().as_bytes(),
            )
        });
        let row = sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO provider (tenant_id, name, kind, secret_ciphertext, settings, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6) RETURNING {PROVIDER_COLUMNS}"
        )))
        .bind(tenant.0)
        .bind(&new.name)
        .bind(&new.kind)
        .bind(sealed)
        .bind(new.settings.to_string())
        .bind(time::now())
        .fetch_one(&self.pool)
        .await
        .map_err(|e| match LedgerError::from(e) {
            LedgerError::Conflict(_) => LedgerError::Conflict(format!("provider {:?}", new.name)),
            other => other,
        })?;
        provider_row::<Sqlite>(&row)
    }

    pub(super) async fn rc_update_provider(
        &self,
        tenant: TenantId,
        name: &str,
        change: ProviderChange,
    ) -> Result<Provider> {
        let sealed = change.secret.as_ref().map(|s| {
            self.keyring.seal(
                &provider_secret_aad(tenant.0, name),
                s.expose_secret().as_bytes(),
            )
        });
        let row = sqlx::query(AssertSqlSafe(format!(
            "UPDATE provider SET secret_ciphertext = COALESCE($3, secret_ciphertext), \
             settings = COALESCE($4, settings) WHERE tenant_id = $1 AND name = $2 \
             RETURNING {PROVIDER_COLUMNS}"
        )))
        .bind(tenant.0)
        .bind(name)
        .bind(sealed)
        .bind(change.settings.as_ref().map(|v| v.to_string()))
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| LedgerError::NotFound(format!("provider {name:?}")))?;
        provider_row::<Sqlite>(&row)
    }

    pub(super) async fn rc_list_providers(&self, tenant: TenantId) -> Result<Vec<Provider>> {
        sqlx::query(AssertSqlSafe(format!(
            "SELECT {PROVIDER_COLUMNS} FROM provider WHERE tenant_id = $1 ORDER BY name"
        )))
        .bind(tenant.0)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(provider_row::<Sqlite>)
        .collect()
    }

    pub(super) async fn rc_provider_by(
        &self,
        tenant: TenantId,
        name: Option<&str>,
        id: Option<i64>,
    ) -> Result<Provider> {
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT {PROVIDER_COLUMNS} FROM provider WHERE tenant_id = $1 \
             AND (name = $2 OR id = $3)"
        )))
        .bind(tenant.0)
        .bind(name)
        .bind(id)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| match name {
            Some(n) => LedgerError::NotFound(format!("provider {n:?}")),
            None => LedgerError::NotFound(format!("provider #{}", id.unwrap_or_default())),
        })?;
        provider_row::<Sqlite>(&row)
    }

    pub(super) async fn rc_provider_secret(
        &self,
        tenant: TenantId,
        provider: &Provider,
    ) -> Result<Option<SecretString>> {
        let sealed: Option<Vec<u8>> = sqlx::query_scalar(
            "SELECT secret_ciphertext FROM provider WHERE tenant_id = $1 AND id = $2",
        )
        .bind(tenant.0)
        .bind(provider.id)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| LedgerError::NotFound(format!("provider {:?}", provider.name)))?;
        let Some(sealed) = sealed else {
            return Ok(None);
        };
        let clear = self
            .keyring
            .open(&provider_secret_aad(tenant.0, &provider.name), &sealed)
            .ok_or(LedgerError::Decrypt)?;
        let text = String::from_utf8(clear).map_err(|_| LedgerError::Decrypt)?;
        Ok(Some(SecretString::from(text)))
    }

    pub(super) async fn rc_set_route(
        &self,
        tenant: TenantId,
        source: &str,
        operation: &str,
        provider: Option<&str>,
    ) -> Result<Route> {
        check_pattern(operation)?;
        let source_id: i64 =
            sqlx::query_scalar("SELECT id FROM source WHERE tenant_id = $1 AND name = $2")
                .bind(tenant.0)
                .bind(source)
                .fetch_optional(&self.pool)
                .await?
                .ok_or_else(|| LedgerError::NotFound(format!("source {source:?}")))?;
        let provider_id = match provider {
            Some(p) => Some(self.rc_provider_by(tenant, Some(p), None).await?.id),
            None => None,
        };
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO provider_route (tenant_id, source_id, operation, provider_id, created_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant_id, source_id, operation) \
             DO UPDATE SET provider_id = excluded.provider_id, created_at = excluded.created_at \
             RETURNING id",
        )
        .bind(tenant.0)
        .bind(source_id)
        .bind(operation)
        .bind(provider_id)
        .bind(time::now())
        .fetch_one(&self.pool)
        .await?;
        Ok(Route {
            id,
            source: source.to_owned(),
            operation: operation.to_owned(),
            provider: provider.map(str::to_owned),
            provider_id,
            source_id,
        })
    }

    pub(super) async fn rc_list_routes(&self, tenant: TenantId) -> Result<Vec<Route>> {
        let rows = sqlx::query(
            "SELECT r.id, s.name AS source_name, r.operation, p.name AS provider_name, \
             r.provider_id, r.source_id FROM provider_route r \
             JOIN source s ON s.id = r.source_id LEFT JOIN provider p ON p.id = r.provider_id \
             WHERE r.tenant_id = $1 ORDER BY s.name, r.operation",
        )
        .bind(tenant.0)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(Route {
                    id: r.try_get("id")?,
                    source: r.try_get("source_name")?,
                    operation: r.try_get("operation")?,
                    provider: r.try_get("provider_name")?,
                    provider_id: r.try_get("provider_id")?,
                    source_id: r.try_get("source_id")?,
                })
            })
            .collect()
    }

    /// Take the lease of `effect_id` if it is free; the claim, or `None`.
    /// Take (or create) the effect's lease. The conditions are checked again on the
    /// state row as it is when locked, not as the caller's earlier read saw it: between
    /// a claim's SELECT and this upsert another worker may have recorded a resolution and
    /// released its lease (PostgreSQL: the SELECT's `FOR UPDATE OF e` does not wait for
    /// that), and a resolved or not-yet-due effect must not be leased again.
    async fn lease(
        tx: &mut Conn,
        tenant: TenantId,
        effect_id: i64,
        owner: &str,
        now: f64,
        lease_secs: f64,
        due_only: bool,
    ) -> Result<Option<Claim>> {
        let until = now + lease_secs;
        let due = if due_only {
            "AND reconcile_state.next_attempt_at <= $5 "
        } else {
            ""
        };
        let Some(row) = sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO reconcile_state (effect_id, tenant_id, lease_owner, lease_until, \
             next_attempt_at) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (effect_id) DO UPDATE SET lease_owner = excluded.lease_owner, \
             lease_until = excluded.lease_until \
             WHERE (reconcile_state.lease_until IS NULL OR reconcile_state.lease_until <= $5) \
             {due}AND NOT EXISTS (SELECT 1 FROM resolution z \
                                  WHERE z.effect_id = reconcile_state.effect_id) \
             RETURNING {STATE_COLUMNS}"
        )))
        .bind(effect_id)
        .bind(tenant.0)
        .bind(owner)
        .bind(until)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?
        else {
            return Ok(None);
        };
        let state = state_row::<Sqlite>(&row)?;
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT {} FROM effect e JOIN source s ON s.id = e.source_id \
             WHERE e.tenant_id = $1 AND e.id = $2",
            rows::EFFECT_COLUMNS
        )))
        .bind(tenant.0)
        .bind(effect_id)
        .fetch_one(&mut *tx)
        .await?;
        Ok(Some(Claim {
            effect: rows::effect::<Sqlite>(&row, now)?,
            state,
            owner: owner.to_owned(),
            lease_until: until,
        }))
    }

    pub(super) async fn rc_claim_due(
        &self,
        tenant: TenantId,
        owner: &str,
        now: f64,
        lease_secs: f64,
        limit: i64,
    ) -> Result<Vec<Claim>> {
        let mut tx = self.write_tx().await?;
        let ids: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT e.id FROM effect e LEFT JOIN reconcile_state r ON r.effect_id = e.id \
             WHERE e.tenant_id = $1 AND {OPEN_EFFECT} \
             AND (r.effect_id IS NULL OR (r.next_attempt_at <= $2 \
                  AND (r.lease_until IS NULL OR r.lease_until <= $2))) \
             ORDER BY COALESCE(r.next_attempt_at, 0), e.id LIMIT $3"
        )))
        .bind(tenant.0)
        .bind(now)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(c) = Self::lease(&mut tx, tenant, id, owner, now, lease_secs, true).await? {
                out.push(c);
            }
        }
        tx.commit().await?;
        Ok(out)
    }

    pub(super) async fn rc_claim_effect(
        &self,
        tenant: TenantId,
        effect_id: i64,
        owner: &str,
        now: f64,
        lease_secs: f64,
    ) -> Result<Option<Claim>> {
        let mut tx = self.write_tx().await?;
        let open: Option<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT e.id FROM effect e WHERE e.tenant_id = $1 AND e.id = $3 AND {OPEN_EFFECT}"
        )))
        .bind(tenant.0)
        .bind(now)
        .bind(effect_id)
        .fetch_optional(&mut *tx)
        .await?;
        if open.is_none() {
            return Ok(None);
        }
        let c = Self::lease(&mut tx, tenant, effect_id, owner, now, lease_secs, false).await?;
        tx.commit().await?;
        Ok(c)
    }

    pub(super) async fn rc_defer(
        &self,
        tenant: TenantId,
        effect_id: i64,
        owner: &str,
        next_attempt_at: f64,
        note: &str,
    ) -> Result<()> {
        sqlx::query(
            "UPDATE reconcile_state SET next_attempt_at = $1, last_error = $2, \
             lease_owner = NULL, lease_until = NULL \
             WHERE tenant_id = $3 AND effect_id = $4 AND lease_owner = $5",
        )
        .bind(next_attempt_at)
        .bind(note)
        .bind(tenant.0)
        .bind(effect_id)
        .bind(owner)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub(super) async fn rc_record_attempt(
        &self,
        tenant: TenantId,
        effect_id: i64,
        owner: &str,
        a: NewAttempt,
    ) -> Result<AttemptRecorded> {
        check_outcome(&a.outcome)?;
        if a.resolve && a.outcome == "indeterminate" {
            return Err(LedgerError::Invalid(
                "an indeterminate outcome cannot resolve an effect".into(),
            ));
        }
        let mut tx = self.write_tx().await?;
        // Fenced: only the lease holder writes. A worker paused past its lease whose effect
        // another worker has claimed since writes nothing at all (no attempt, no schedule,
        // no resolution); the new owner looks again.
        let fenced = sqlx::query(
            "UPDATE reconcile_state SET attempts = attempts + 1, last_attempt_at = $1, \
             last_outcome = $2, last_error = $3, provider_id = $4, non_final = $5, \
             needs_attention = $6, next_attempt_at = $7, lease_owner = NULL, lease_until = NULL \
             WHERE tenant_id = $8 AND effect_id = $9 AND lease_owner = $10",
        )
        .bind(a.finished_at)
        .bind(&a.outcome)
        .bind(&a.error)
        .bind(a.provider_id)
        .bind(a.non_final)
        .bind(a.needs_attention)
        .bind(a.next_attempt_at)
        .bind(tenant.0)
        .bind(effect_id)
        .bind(owner)
        .execute(&mut *tx)
        .await?;
        if fenced.rows_affected() == 0 {
            return Err(LedgerError::LeaseLost(format!(
                "reconcile of effect {effect_id} by {owner}"
            )));
        }
        let attempt_id: i64 = sqlx::query_scalar(
            "INSERT INTO reconcile_attempt (tenant_id, effect_id, provider_id, started_at, \
             finished_at, outcome, method, error, evidence) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id",
        )
        .bind(tenant.0)
        .bind(effect_id)
        .bind(a.provider_id)
        .bind(a.started_at)
        .bind(a.finished_at)
        .bind(&a.outcome)
        .bind(&a.method)
        .bind(&a.error)
        .bind(a.evidence.to_string())
        .fetch_one(&mut *tx)
        .await?;
        let mut resolved_now = false;
        if a.resolve {
            let inserted = sqlx::query(
                "INSERT INTO resolution (tenant_id, effect_id, outcome, author, note, evidence, \
                 attempt_id, created_at) VALUES ($1, $2, $3, $4, NULL, $5, $6, $7) \
                 ON CONFLICT (effect_id) DO NOTHING",
            )
            .bind(tenant.0)
            .bind(effect_id)
            .bind(&a.outcome)
            .bind(RECONCILER_AUTHOR)
            .bind(a.evidence.to_string())
            .bind(attempt_id)
            .bind(a.finished_at)
            .execute(&mut *tx)
            .await?;
            resolved_now = inserted.rows_affected() == 1;
        }
        let resolution = Self::resolution_of(&mut tx, tenant, effect_id).await?;
        tx.commit().await?;
        Ok(AttemptRecorded {
            attempt_id,
            resolution,
            resolved_now,
        })
    }

    async fn resolution_of(
        tx: &mut Conn,
        tenant: TenantId,
        effect_id: i64,
    ) -> Result<Option<Resolution>> {
        sqlx::query(AssertSqlSafe(format!(
            "SELECT {RESOLUTION_COLUMNS} FROM resolution WHERE tenant_id = $1 AND effect_id = $2"
        )))
        .bind(tenant.0)
        .bind(effect_id)
        .fetch_optional(&mut *tx)
        .await?
        .map(|r| resolution_row::<Sqlite>(&r))
        .transpose()
    }

    pub(super) async fn rc_resolve_by_hand(
        &self,
        tenant: TenantId,
        effect_id: i64,
        new: NewResolution,
    ) -> Result<Resolution> {
        check_outcome(&new.outcome)?;
        if new.note.as_deref().is_none_or(|n| n.trim().is_empty()) {
            return Err(LedgerError::Invalid(
                "a resolution by hand needs a note".into(),
            ));
        }
        let row = sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO resolution (tenant_id, effect_id, outcome, author, note, evidence, \
             attempt_id, created_at) SELECT $1, e.id, $3, $4, $5, $6, NULL, $7 FROM effect e \
             WHERE e.tenant_id = $1 AND e.id = $2 RETURNING {RESOLUTION_COLUMNS}"
        )))
        .bind(tenant.0)
        .bind(effect_id)
        .bind(&new.outcome)
        .bind(&new.author)
        .bind(&new.note)
        .bind(new.evidence.to_string())
        .bind(time::now())
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| match LedgerError::from(e) {
            LedgerError::Conflict(_) => LedgerError::Conflict("a resolution of this effect".into()),
            other => other,
        })?
        .ok_or_else(|| LedgerError::NotFound(format!("effect #{effect_id}")))?;
        resolution_row::<Sqlite>(&row)
    }

    pub(super) async fn rc_view(&self, tenant: TenantId, effect_id: i64) -> Result<ReconcileView> {
        let state = sqlx::query(AssertSqlSafe(format!(
            "SELECT {STATE_COLUMNS} FROM reconcile_state WHERE tenant_id = $1 AND effect_id = $2"
        )))
        .bind(tenant.0)
        .bind(effect_id)
        .fetch_optional(&self.pool)
        .await?
        .map(|r| state_row::<Sqlite>(&r))
        .transpose()?;
        let attempts = sqlx::query(AssertSqlSafe(format!(
            "SELECT {ATTEMPT_COLUMNS} FROM reconcile_attempt WHERE tenant_id = $1 \
             AND effect_id = $2 ORDER BY id"
        )))
        .bind(tenant.0)
        .bind(effect_id)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(attempt_row::<Sqlite>)
        .collect::<Result<Vec<_>>>()?;
        let mut conn = self.pool.acquire().await?;
        let resolution = Self::resolution_of(&mut conn, tenant, effect_id).await?;
        Ok(ReconcileView {
            state,
            attempts,
            resolution,
        })
    }

    pub(super) async fn rc_requeue_indeterminate(
        &self,
        tenant: TenantId,
        provider_id: i64,
        from: f64,
        to: f64,
        now: f64,
    ) -> Result<u64> {
        let done = sqlx::query(
            "UPDATE reconcile_state SET next_attempt_at = $1, needs_attention = FALSE \
             WHERE tenant_id = $2 AND provider_id = $3 AND last_outcome = 'indeterminate' \
             AND NOT EXISTS (SELECT 1 FROM resolution z WHERE z.effect_id = reconcile_state.effect_id) \
             AND effect_id IN (SELECT id FROM effect WHERE tenant_id = $2 \
                               AND created_at >= $4 AND created_at <= $5)",
        )
        .bind(now)
        .bind(tenant.0)
        .bind(provider_id)
        .bind(from)
        .bind(to)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }
}
