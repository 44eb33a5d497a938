//! Write-back storage: the per-source setting and the write-back log.
//!
//! A write-back changes a row in the tenant's own database, which shares no transaction
//! with the ledger. So the ledger records an intent (`pending`, with the resolution id and
//! the exact statement's inputs) BEFORE the source is written, and the outcome after. A
//! crash in between leaves a `pending` row that the next run settles by reading the source
//! row: the row reckon writes carries the resolution id in its response. `UNIQUE
//! (resolution_id)` makes one write-back per resolution (and so per effect).

use crate::driver::{Driver, SqlLedger, row, sql};
use crate::model::TenantId;
use crate::reconcile::Resolution;
use crate::rows;
use crate::scope::Scope;
use crate::{LedgerError, Result};
use macro_rules_attribute::apply;
use reckon_domain::time;
use serde::Serialize;
use sqlx::{FromRow, Row};

pub use reckon_domain::writeback::{WritebackAction, WritebackPolicy, WritebackStatus};

/// A resolved effect of a source with write-back on that has no write-back yet.
#[derive(Debug, Clone, Serialize)]
pub struct WritebackCandidate {
    pub source_id: i64,
    pub source: String,
    pub effect_id: i64,
    pub key: String,
    /// The row's state and updated_at as reckon last saw them (the statement's condition).
    pub state: String,
    pub updated_at: f64,
    pub resolution: Resolution,
}

/// One write-back, from intent to outcome.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Writeback {
    pub id: i64,
    pub source_id: i64,
    pub effect_id: i64,
    pub resolution_id: i64,
    pub key: String,
    #[sqlx(try_from = "String")]
    pub action: WritebackAction,
    pub seen_state: String,
    pub seen_updated_at: f64,
    /// The exact JSON text written into `response` (`None` for a release).
    pub new_response: Option<String>,
    pub new_updated_at: f64,
    #[sqlx(try_from = "String")]
    pub status: WritebackStatus,
    pub detail: Option<String>,
    pub recovered: bool,
    pub created_at: f64,
    pub settled_at: Option<f64>,
}

/// An intent, recorded before the source is written.
#[derive(Debug, Clone)]
pub struct NewWriteback {
    pub source_id: i64,
    pub effect_id: i64,
    pub resolution_id: i64,
    pub key: String,
    pub action: WritebackAction,
    pub seen_state: String,
    pub seen_updated_at: f64,
    pub new_response: Option<String>,
    pub new_updated_at: f64,
}

pub(crate) const WRITEBACK_COLUMNS: &str = "id, source_id, effect_id, resolution_id, key, \
    action, seen_state, seen_updated_at, new_response, new_updated_at, status, detail, \
    recovered, created_at, settled_at";

pub(crate) const CANDIDATE_SQL: &str = "SELECT e.id AS effect_id, e.source_id, s.name AS source_name, \
    e.key, e.state, e.updated_at, r.id AS r_id, r.outcome AS r_outcome, r.author AS r_author, \
    r.note AS r_note, r.evidence AS r_evidence, r.attempt_id AS r_attempt_id, \
    r.created_at AS r_created_at \
    FROM resolution r JOIN effect e ON e.id = r.effect_id JOIN source s ON s.id = e.source_id \
    WHERE r.tenant_id = $1 AND e.tenant_id = $1 AND s.tenant_id = $1 \
    AND s.writeback IS NOT NULL AND r.outcome IN ('applied', 'not_applied') \
    AND e.state IN ('unknown', 'in_progress') AND e.gone_at IS NULL \
    AND NOT EXISTS (SELECT 1 FROM writeback w WHERE w.resolution_id = r.id)";

#[apply(row!)]
pub(crate) fn candidate_row<DB: Database>(row: &DB::Row) -> Result<WritebackCandidate> {
    Ok(WritebackCandidate {
        source_id: row.try_get("source_id")?,
        source: row.try_get("source_name")?,
        effect_id: row.try_get("effect_id")?,
        key: row.try_get("key")?,
        state: row.try_get("state")?,
        updated_at: row.try_get("updated_at")?,
        resolution: Resolution {
            id: row.try_get("r_id")?,
            outcome: crate::reconcile::outcome(&row.try_get::<String, _>("r_outcome")?)?,
            author: row.try_get("r_author")?,
            note: row.try_get("r_note")?,
            evidence: rows::json(row, "r_evidence")?,
            attempt_id: row.try_get("r_attempt_id")?,
            created_at: row.try_get("r_created_at")?,
        },
    })
}

#[apply(sql!)]
impl<B: Driver> Writebacks for SqlLedger<B> {
    /// Turn write-back of a scanned source on (with its not_applied policy) or off (`None`).
    async fn set_source_writeback(
        &self,
        tenant: TenantId,
        name: &str,
        policy: Option<crate::WritebackPolicy>,
    ) -> Result<crate::Source> {
        let mut tx = B::begin(self, Scope::Tenant(tenant), true).await?;
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE source SET writeback = $1 WHERE tenant_id = $2 AND name = $3 \
             RETURNING {}",
            rows::SOURCE_COLUMNS
        )))
        .bind(policy.map(WritebackPolicy::as_str))
        .bind(tenant.0)
        .bind(name)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| LedgerError::NotFound(format!("source {name:?}")))?;
        let source = rows::source::<B::DB>(&row)?;
        if !source.kind.is_scanned() && policy.is_some() {
            // A push source has no database reckon could write to.
            return Err(LedgerError::Invalid(format!(
                "source {name:?} is a push source: reckon holds no DSN to write back to"
            )));
        }
        if source.mapping.is_some() && policy.is_some() {
            // Write-back's one statement is written for justonce's table and states; a
            // mapped table's states are conditions reckon cannot write.
            return Err(LedgerError::Invalid(format!(
                "source {name:?} is read through a column mapping: reckon writes back only \
                 to justonce tables"
            )));
        }
        tx.commit().await?;
        Ok(source)
    }

    /// Resolved (`applied` / `not_applied`) effects of sources with write-back on, still
    /// unresolved in the source as last seen and present, that have no write-back yet;
    /// oldest resolution first.
    async fn writeback_candidates(
        &self,
        tenant: TenantId,
        source_id: Option<i64>,
        limit: i64,
    ) -> Result<Vec<crate::WritebackCandidate>> {
        let sql = format!("{CANDIDATE_SQL} AND (s.id = $3 OR $4) ORDER BY r.id LIMIT $2");
        let stmt = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(tenant.0)
            .bind(limit);
        let stmt = stmt.bind(source_id.unwrap_or(-1)).bind(source_id.is_none());
        let rows = self.read_all(Scope::Tenant(tenant), stmt).await?;
        rows.iter().map(candidate_row::<B::DB>).collect()
    }

    /// Write-backs of the tenant (optionally of one source, of one status), oldest first.
    async fn list_writebacks(
        &self,
        tenant: TenantId,
        source_id: Option<i64>,
        status: Option<crate::WritebackStatus>,
        limit: i64,
    ) -> Result<Vec<crate::Writeback>> {
        let stmt = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {WRITEBACK_COLUMNS} FROM writeback WHERE tenant_id = $1 \
             AND (source_id = $2 OR $2 IS NULL) AND (status = $3 OR $3 IS NULL) \
             ORDER BY id LIMIT $4"
        )));
        let stmt = stmt.bind(tenant.0).bind(source_id);
        let stmt = stmt.bind(status.map(WritebackStatus::as_str)).bind(limit);
        rows::all(&self.read_all(Scope::Tenant(tenant), stmt).await?)
    }

    /// Record the intent (`pending`) before the source is written, fenced by `lease`. The
    /// one write-back of that resolution is returned: this one, or the one already there
    /// (whatever its status). Refused when the source has write-back off.
    async fn begin_writeback(
        &self,
        tenant: TenantId,
        new: crate::NewWriteback,
        lease: Option<&crate::Lease>,
    ) -> Result<crate::Writeback> {
        let mut tx = B::begin(self, Scope::Tenant(tenant), true).await?;
        crate::driver::fence::<B>(&mut tx, lease).await?;
        // The intent is stored only for a source whose write-back is on, for a
        // resolution of this tenant's effect; one per resolution.
        sqlx::query(
            "INSERT INTO writeback (tenant_id, source_id, effect_id, resolution_id, key, \
             action, seen_state, seen_updated_at, new_response, new_updated_at, status, \
             created_at) \
             SELECT $1, s.id, r.effect_id, r.id, $5, $6, $7, $8, $9, $10, 'pending', $11 \
             FROM source s JOIN effect e ON e.source_id = s.id \
             JOIN resolution r ON r.effect_id = e.id \
             WHERE s.tenant_id = $1 AND s.id = $2 AND e.id = $3 AND r.id = $4 \
             AND e.tenant_id = $1 AND r.tenant_id = $1 AND s.writeback IS NOT NULL \
             ON CONFLICT (resolution_id) DO NOTHING",
        )
        .bind(tenant.0)
        .bind(new.source_id)
        .bind(new.effect_id)
        .bind(new.resolution_id)
        .bind(&new.key)
        .bind(new.action.as_str())
        .bind(&new.seen_state)
        .bind(new.seen_updated_at)
        .bind(&new.new_response)
        .bind(new.new_updated_at)
        .bind(time::now())
        .execute(&mut *tx)
        .await?;
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {WRITEBACK_COLUMNS} FROM writeback WHERE tenant_id = $1 AND resolution_id = $2"
        )))
        .bind(tenant.0)
        .bind(new.resolution_id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            return Err(LedgerError::Invalid(
                "no write-back intent was recorded: the source has write-back off, or \
                 the effect and resolution do not belong to it"
                    .into(),
            ));
        };
        tx.commit().await?;
        Ok(Writeback::from_row(&row)?)
    }

    /// Settle a pending write-back as `written` or `conflict`; an already settled one is
    /// left as it is and returned.
    async fn finish_writeback(
        &self,
        tenant: TenantId,
        id: i64,
        status: crate::WritebackStatus,
        detail: &str,
        recovered: bool,
        lease: Option<&crate::Lease>,
    ) -> Result<crate::Writeback> {
        if status == crate::WritebackStatus::Pending {
            return Err(LedgerError::Invalid(
                "a write-back is finished as written or conflict".into(),
            ));
        }
        let mut tx = B::begin(self, Scope::Tenant(tenant), true).await?;
        crate::driver::fence::<B>(&mut tx, lease).await?;
        // Only a pending intent is settled: the first outcome recorded stands.
        sqlx::query(
            "UPDATE writeback SET status = $1, detail = $2, recovered = $3, \
             settled_at = $4 WHERE tenant_id = $5 AND id = $6 AND status = 'pending'",
        )
        .bind(status.as_str())
        .bind(detail)
        .bind(recovered)
        .bind(time::now())
        .bind(tenant.0)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {WRITEBACK_COLUMNS} FROM writeback WHERE tenant_id = $1 AND id = $2"
        )))
        .bind(tenant.0)
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| LedgerError::NotFound(format!("write-back #{id}")))?;
        tx.commit().await?;
        Ok(Writeback::from_row(&row)?)
    }

    /// Of `effect_ids`, those whose source row reckon deleted (a `release` written back,
    /// handing the key back to the application), in id order; one read per
    /// [`crate::IDS_PER_STATEMENT`].
    async fn released_among(&self, tenant: TenantId, effect_ids: &[i64]) -> Result<Vec<i64>> {
        let mut tx = B::begin(self, Scope::Tenant(tenant), false).await?;
        let mut released = Vec::new();
        for chunk in effect_ids.chunks(crate::IDS_PER_STATEMENT) {
            let mut qb = sqlx::QueryBuilder::<B::DB>::new(
                "SELECT effect_id FROM writeback WHERE action = 'release' \
                 AND status = 'written' AND tenant_id = ",
            );
            qb.push_bind(tenant.0).push(" AND effect_id IN ");
            rows::push_in(&mut qb, chunk.iter().copied());
            for row in qb.build().fetch_all(&mut *tx).await? {
                released.push(row.try_get::<i64, _>("effect_id")?);
            }
        }
        tx.commit().await?;
        released.sort_unstable();
        released.dedup();
        Ok(released)
    }
}
