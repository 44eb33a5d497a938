//! Reconciliation's storage: the per-effect reconcile state (lease, schedule), attempts with
//! their evidence, and resolutions; claims lease due effects to one worker at a time.

pub use reckon_domain::Outcome;
pub use reckon_domain::reconcile::{
    Attempt, AttemptRecorded, Claim, NewAttempt, NewResolution, RECONCILER_AUTHOR, ReconcileState,
    ReconcileView, Resolution,
};

use crate::driver::{Driver, RowsAffected, SqlLedger, row, sql};
use crate::model::TenantId;
use crate::rows;
use crate::scope::Scope;
use crate::{LedgerError, Result};
use macro_rules_attribute::apply;
use reckon_domain::time;
use sqlx::{AssertSqlSafe, Database, QueryBuilder, Row};
use std::collections::HashMap;

pub(crate) fn outcome(stored: &str) -> Result<Outcome> {
    Outcome::parse(stored).ok_or_else(|| LedgerError::Invalid(format!("stored outcome {stored:?}")))
}

pub(crate) const STATE_COLUMNS: &str = "attempts, next_attempt_at, last_attempt_at, \
    last_outcome, last_error, provider_id, non_final, needs_attention, lease_owner, lease_until";
pub(crate) const ATTEMPT_COLUMNS: &str =
    "id, provider_id, started_at, finished_at, outcome, method, error, evidence";
pub(crate) const RESOLUTION_COLUMNS: &str =
    "id, outcome, author, note, evidence, attempt_id, created_at";

#[apply(row!)]
pub(crate) fn state_row<DB: Database>(row: &DB::Row) -> Result<ReconcileState> {
    Ok(ReconcileState {
        attempts: row.try_get("attempts")?,
        next_attempt_at: row.try_get("next_attempt_at")?,
        last_attempt_at: row.try_get("last_attempt_at")?,
        last_outcome: row
            .try_get::<Option<String>, _>("last_outcome")?
            .map(|o| outcome(&o))
            .transpose()?,
        last_error: row.try_get("last_error")?,
        provider_id: row.try_get("provider_id")?,
        non_final: row.try_get("non_final")?,
        needs_attention: row.try_get("needs_attention")?,
        lease_owner: row.try_get("lease_owner")?,
        lease_until: row.try_get("lease_until")?,
    })
}

#[apply(row!)]
pub(crate) fn attempt_row<DB: Database>(row: &DB::Row) -> Result<Attempt> {
    Ok(Attempt {
        id: row.try_get("id")?,
        provider_id: row.try_get("provider_id")?,
        started_at: row.try_get("started_at")?,
        finished_at: row.try_get("finished_at")?,
        outcome: outcome(&row.try_get::<String, _>("outcome")?)?,
        method: row.try_get("method")?,
        error: row.try_get("error")?,
        evidence: rows::json(row, "evidence")?,
    })
}

#[apply(row!)]
pub(crate) fn resolution_row<DB: Database>(row: &DB::Row) -> Result<Resolution> {
    Ok(Resolution {
        id: row.try_get("id")?,
        outcome: outcome(&row.try_get::<String, _>("outcome")?)?,
        author: row.try_get("author")?,
        note: row.try_get("note")?,
        evidence: rows::json(row, "evidence")?,
        attempt_id: row.try_get("attempt_id")?,
        created_at: row.try_get("created_at")?,
    })
}

/// `push_filters`' unresolved predicate, in the terms of the backlog's indexes (0023).
const OPEN_EFFECT: &str = "(e.state = 'unknown' OR (e.state = 'in_progress' AND e.gone_at IS NULL)) \
     AND NOT e.resolved AND (e.state = 'unknown' OR e.abandoned_at <= $2)";

/// Ids bound in one statement: under SQLite's limit of 32,766 parameters, and PostgreSQL's
/// of 65,535.
pub const IDS_PER_STATEMENT: usize = 10_000;

#[apply(sql!)]
impl<B: Driver> Reconciliation for SqlLedger<B> {
    /// Lease up to `limit` unresolved effects whose next attempt is due and whose lease (if
    /// any) has expired, the longest due first. PostgreSQL skips rows another replica is
    /// claiming; SQLite's one writer needs no lock.
    async fn claim_due(
        &self,
        tenant: TenantId,
        owner: &str,
        now: f64,
        lease_secs: f64,
        limit: i64,
    ) -> Result<Vec<Claim>> {
        let mut tx = B::begin(self, Scope::Tenant(tenant), true).await?;
        // The front of the reconciler's queue (`reconcile_due`, 0033: a row for each open
        // effect, due when its schedule, its lease and its abandonment allow), a range of
        // its index: what is claimed is what is read, however large the backlog. Then the
        // chosen effects are locked and checked open once more. PostgreSQL reads up to 16x
        // the batch, room for the rows other replicas are claiming (skipped, not waited
        // for); it reads them lazily, as far as the batch needs. SQLite's one writer has no
        // rows to skip.
        let candidates = if B::LOCK_CLAIM.is_empty() { 1 } else { 16 };
        let ids: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT e.id FROM (SELECT d.effect_id, d.due_at FROM reconcile_due d \
               WHERE d.tenant_id = $1 AND d.due_at <= $2 \
               ORDER BY d.due_at, d.effect_id LIMIT $3 * {candidates}) due \
             JOIN effect e ON e.tenant_id = $1 AND e.id = due.effect_id \
             WHERE {OPEN_EFFECT} ORDER BY due.due_at, due.effect_id LIMIT $3{}",
            B::LOCK_CLAIM
        )))
        .bind(tenant.0)
        .bind(now)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        let out = Self::lease(&mut tx, tenant, &ids, owner, now, lease_secs, true).await?;
        tx.commit().await?;
        Ok(out)
    }

    /// Lease one effect now, whatever its schedule (not if resolved or leased by another).
    async fn claim_effect(
        &self,
        tenant: TenantId,
        effect_id: i64,
        owner: &str,
        now: f64,
        lease_secs: f64,
    ) -> Result<Option<Claim>> {
        let mut tx = B::begin(self, Scope::Tenant(tenant), true).await?;
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
        let c = Self::lease(&mut tx, tenant, &[effect_id], owner, now, lease_secs, false).await?;
        tx.commit().await?;
        Ok(c.into_iter().next())
    }

    /// Release a lease without an attempt (e.g. "no provider"), noting why and when to
    /// look again.
    async fn defer(
        &self,
        tenant: TenantId,
        effect_id: i64,
        owner: &str,
        next_attempt_at: f64,
        note: &str,
    ) -> Result<()> {
        let stmt = sqlx::query(
            "UPDATE reconcile_state SET next_attempt_at = $1, last_error = $2, \
             lease_owner = NULL, lease_until = NULL \
             WHERE tenant_id = $3 AND effect_id = $4 AND lease_owner = $5",
        );
        let stmt = stmt.bind(next_attempt_at).bind(note).bind(tenant.0);
        self.exec(Scope::Tenant(tenant), stmt.bind(effect_id).bind(owner))
            .await?;
        Ok(())
    }

    /// Append one attempt, update the schedule, release the lease, and (if asked) record
    /// the resolution, all in one transaction. A second resolution is never stored.
    async fn record_attempt(
        &self,
        tenant: TenantId,
        effect_id: i64,
        owner: &str,
        a: NewAttempt,
    ) -> Result<AttemptRecorded> {
        if a.resolve && a.outcome == Outcome::Indeterminate {
            return Err(LedgerError::Invalid(
                "an indeterminate outcome cannot resolve an effect".into(),
            ));
        }
        let mut tx = B::begin(self, Scope::Tenant(tenant), true).await?;
        // Fenced: only the lease holder writes. A worker paused past its lease whose effect
        // another worker has claimed since writes nothing at all (no attempt, no schedule,
        // no resolution); the new owner looks again. The effect is locked before its state
        // (the subquery is run once, before the row is updated; see `Driver::LOCK_EFFECT`).
        // The subquery names the tenant, though row-level security would: PostgreSQL then
        // prunes the effect's partitions when it plans, instead of planning and locking all
        // 16 and pruning when the statement starts.
        let fenced = sqlx::query(AssertSqlSafe(format!(
            "UPDATE reconcile_state SET attempts = attempts + 1, last_attempt_at = $1, \
             last_outcome = $2, last_error = $3, provider_id = $4, non_final = $5, \
             needs_attention = $6, next_attempt_at = $7, lease_owner = NULL, lease_until = NULL \
             WHERE tenant_id = $8 AND lease_owner = $10 \
             AND effect_id = (SELECT e.id FROM effect e WHERE e.tenant_id = $8 AND e.id = $9{})",
            B::LOCK_EFFECT
        )))
        .bind(a.finished_at)
        .bind(a.outcome.as_str())
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
        .bind(a.outcome.as_str())
        .bind(&a.method)
        .bind(&a.error)
        .bind(a.evidence.to_string())
        .fetch_one(&mut *tx)
        .await?;
        // The resolution it inserts comes back from the insert; only an effect already
        // resolved (or an attempt that resolves nothing) reads the one there is.
        let mut inserted = None;
        if a.resolve {
            inserted = sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO resolution (tenant_id, effect_id, outcome, author, note, evidence, \
                 attempt_id, created_at) VALUES ($1, $2, $3, $4, NULL, $5, $6, $7) \
                 ON CONFLICT (effect_id) DO NOTHING RETURNING {RESOLUTION_COLUMNS}"
            )))
            .bind(tenant.0)
            .bind(effect_id)
            .bind(a.outcome.as_str())
            .bind(RECONCILER_AUTHOR)
            .bind(a.evidence.to_string())
            .bind(attempt_id)
            .bind(a.finished_at)
            .fetch_optional(&mut *tx)
            .await?
            .map(|r| resolution_row::<B::DB>(&r))
            .transpose()?;
        }
        let resolved_now = inserted.is_some();
        let resolution = match inserted {
            Some(r) => Some(r),
            None => Self::resolution_of(&mut tx, tenant, effect_id).await?,
        };
        tx.commit().await?;
        Ok(AttemptRecorded {
            attempt_id,
            resolution,
            resolved_now,
        })
    }

    /// A person's resolution. `Conflict` when the effect is already resolved.
    async fn resolve_by_hand(
        &self,
        tenant: TenantId,
        effect_id: i64,
        new: NewResolution,
    ) -> Result<Resolution> {
        if new.note.as_deref().is_none_or(|n| n.trim().is_empty()) {
            return Err(LedgerError::Invalid(
                "a resolution by hand needs a note".into(),
            ));
        }
        let stmt = sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO resolution (tenant_id, effect_id, outcome, author, note, evidence, \
             attempt_id, created_at) SELECT $1, e.id, $3, $4, $5, $6, NULL, $7 FROM effect e \
             WHERE e.tenant_id = $1 AND e.id = $2 RETURNING {RESOLUTION_COLUMNS}"
        )))
        .bind(tenant.0)
        .bind(effect_id)
        .bind(new.outcome.as_str())
        .bind(&new.author)
        .bind(&new.note)
        .bind(new.evidence.to_string())
        .bind(time::now());
        let row = self.write_opt(Scope::Tenant(tenant), stmt).await;
        let row = row.map_err(|e| e.named(|| "a resolution of this effect".into()))?;
        resolution_row::<B::DB>(
            &row.ok_or_else(|| LedgerError::NotFound(format!("effect #{effect_id}")))?,
        )
    }

    /// Of `effect_ids`, those resolved (by reckon or by hand), each with its verdict, in id
    /// order: a day's unresolved effects in one read per [`IDS_PER_STATEMENT`], never one
    /// per effect.
    #[instrument(level = "debug", skip_all, fields(effects = effect_ids.len()))]
    async fn resolved_among(
        &self,
        tenant: TenantId,
        effect_ids: &[i64],
    ) -> Result<Vec<(i64, Outcome)>> {
        let mut tx = B::begin(self, Scope::Tenant(tenant), false).await?;
        let mut resolved = Vec::new();
        for chunk in effect_ids.chunks(IDS_PER_STATEMENT) {
            let mut qb = sqlx::QueryBuilder::<B::DB>::new(
                "SELECT effect_id, outcome FROM resolution WHERE tenant_id = ",
            );
            qb.push_bind(tenant.0).push(" AND effect_id IN ");
            rows::push_in(&mut qb, chunk.iter().copied());
            for row in qb.build().fetch_all(&mut *tx).await? {
                resolved.push((
                    row.try_get::<i64, _>("effect_id")?,
                    outcome(&row.try_get::<String, _>("outcome")?)?,
                ));
            }
        }
        tx.commit().await?;
        resolved.sort_unstable_by_key(|r| r.0);
        Ok(resolved)
    }

    async fn reconcile_view(&self, tenant: TenantId, effect_id: i64) -> Result<ReconcileView> {
        let mut tx = B::begin(self, Scope::Tenant(tenant), false).await?;
        let state = sqlx::query(AssertSqlSafe(format!(
            "SELECT {STATE_COLUMNS} FROM reconcile_state WHERE tenant_id = $1 AND effect_id = $2"
        )))
        .bind(tenant.0)
        .bind(effect_id)
        .fetch_optional(&mut *tx)
        .await?
        .map(|r| state_row::<B::DB>(&r))
        .transpose()?;
        let attempts = sqlx::query(AssertSqlSafe(format!(
            "SELECT {ATTEMPT_COLUMNS} FROM reconcile_attempt WHERE tenant_id = $1 \
             AND effect_id = $2 ORDER BY id"
        )))
        .bind(tenant.0)
        .bind(effect_id)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(attempt_row::<B::DB>)
        .collect::<Result<Vec<_>>>()?;
        let resolution = Self::resolution_of(&mut tx, tenant, effect_id).await?;
        tx.commit().await?;
        Ok(ReconcileView {
            state,
            attempts,
            resolution,
        })
    }

    /// Retract the reconciler's `not_applied` verdicts that a charge the audit imported
    /// contradicts: one that succeeded and moved money, carrying the effect's key (as its
    /// idempotency key or a metadata value). Each verdict is kept in
    /// `resolution_retracted` naming the charge, and its effect is parked for a person
    /// (`needs_attention`, last error saying why). Verdicts already written back stay: the
    /// write-back log names them, and the lookup says they are contradicted. Returns each
    /// retracted effect with the charge that contradicted it.
    async fn retract_contradicted_absence(
        &self,
        tenant: TenantId,
        now: f64,
    ) -> Result<Vec<(i64, String)>> {
        let mut tx = B::begin(self, Scope::Tenant(tenant), true).await?;
        // Every partitioned table is named with its tenant, so each reads one partition.
        let found = sqlx::query(
            "SELECT r.id AS resolution_id, r.effect_id AS effect_id, c.charge_id AS charge_id \
             FROM resolution r \
             JOIN effect e ON e.tenant_id = $1 AND e.id = r.effect_id \
             JOIN provider_charge_term t ON t.tenant_id = $1 AND t.term = e.key \
             JOIN provider_charge c ON c.tenant_id = $1 AND c.provider_id = t.provider_id \
               AND c.charge_id = t.charge_id \
             WHERE r.tenant_id = $1 AND r.author = 'reconciler' AND r.outcome = 'not_applied' \
               AND c.status = 'succeeded' AND c.amount_captured > 0 \
               AND NOT EXISTS (SELECT 1 FROM writeback w WHERE w.tenant_id = $1 \
                               AND w.resolution_id = r.id) \
             ORDER BY r.id, c.charge_id",
        )
        .bind(tenant.0)
        .fetch_all(&mut *tx)
        .await?;
        let mut out: Vec<(i64, String)> = Vec::new();
        let mut done: Vec<i64> = Vec::new();
        for row in &found {
            let resolution: i64 = row.try_get("resolution_id")?;
            if done.contains(&resolution) {
                continue;
            }
            done.push(resolution);
            let effect: i64 = row.try_get("effect_id")?;
            let charge: String = row.try_get("charge_id")?;
            let reason = format!(
                "not_applied contradicted: the provider lists charge {charge} carrying this \
                 key, which moved money; a person must check before anyone tries again"
            );
            sqlx::query(
                "INSERT INTO resolution_retracted (tenant_id, effect_id, resolution_id, outcome, \
                 author, evidence, attempt_id, resolved_at, retracted_at, reason) \
                 SELECT tenant_id, effect_id, id, outcome, author, evidence, attempt_id, \
                 created_at, $3, $4 FROM resolution WHERE tenant_id = $1 AND id = $2",
            )
            .bind(tenant.0)
            .bind(resolution)
            .bind(now)
            .bind(&reason)
            .execute(&mut *tx)
            .await?;
            // The resolution first: its trigger updates the effect row, which is locked
            // before its reconcile state (the lock order of every such transaction).
            sqlx::query("DELETE FROM resolution WHERE tenant_id = $1 AND id = $2")
                .bind(tenant.0)
                .bind(resolution)
                .execute(&mut *tx)
                .await?;
            sqlx::query(
                "UPDATE reconcile_state SET needs_attention = TRUE, non_final = FALSE, \
                 last_outcome = 'indeterminate', last_error = $3, next_attempt_at = $4, \
                 lease_owner = NULL, lease_until = NULL \
                 WHERE tenant_id = $1 AND effect_id = $2",
            )
            .bind(tenant.0)
            .bind(effect)
            .bind(&reason)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            out.push((effect, charge));
        }
        tx.commit().await?;
        Ok(out)
    }

    /// Make the effects of `source` (of `operation`, or every operation for `*`) that were
    /// put off for want of a provider due now: a route was just set, and they would
    /// otherwise wait out the "no provider" re-check. Returns how many.
    async fn due_unrouted(
        &self,
        tenant: TenantId,
        source: &str,
        operation: &str,
        now: f64,
    ) -> Result<u64> {
        let stmt = sqlx::query(
            "UPDATE reconcile_state SET next_attempt_at = $1 \
             WHERE tenant_id = $2 AND provider_id IS NULL AND next_attempt_at > $1 \
             AND effect_id IN (SELECT e.id FROM effect e JOIN source s ON s.id = e.source_id \
                               WHERE e.tenant_id = $2 AND s.name = $3 \
                               AND ($4 = '*' OR e.operation = $4))",
        );
        let stmt = stmt.bind(now).bind(tenant.0).bind(source);
        self.exec(Scope::Tenant(tenant), stmt.bind(operation)).await
    }

    /// Make the indeterminate effects of one provider created in `[from, to]` due now
    /// (clearing "needs attention"); returns how many.
    async fn requeue_indeterminate(
        &self,
        tenant: TenantId,
        provider_id: i64,
        from: f64,
        to: f64,
        now: f64,
    ) -> Result<u64> {
        // Unparking updates each parked effect's row after its state (the trigger), the
        // other order from a claim's: a claim racing a requeue over the same effect can
        // deadlock, and PostgreSQL then fails one of them (the person asks again, or the
        // reconciler claims at its next tick). Locking the range's effects first would lock
        // every effect of the range, parked or not.
        let stmt = sqlx::query(
            "UPDATE reconcile_state SET next_attempt_at = $1, needs_attention = FALSE \
             WHERE tenant_id = $2 AND provider_id = $3 AND last_outcome = 'indeterminate' \
             AND NOT EXISTS (SELECT 1 FROM resolution z WHERE z.effect_id = reconcile_state.effect_id) \
             AND effect_id IN (SELECT id FROM effect WHERE tenant_id = $2 \
                               AND created_at >= $4 AND created_at <= $5)",
        );
        let stmt = stmt.bind(now).bind(tenant.0).bind(provider_id);
        self.exec(Scope::Tenant(tenant), stmt.bind(from).bind(to))
            .await
    }
}

#[apply(sql!)]
impl<B: Driver> SqlLedger<B> {
    /// Lease `ids` to `owner`, in the order given: each one that is free (no lease, or one
    /// that ran out), unresolved and, with `due_only`, due. The conditions are checked
    /// again on the state row as it is when locked, not as the caller's earlier read saw
    /// it: between a claim's SELECT and this upsert another worker may have recorded a
    /// resolution and released its lease (PostgreSQL: the SELECT's `FOR NO KEY UPDATE OF
    /// e` does not wait for that), and a resolved or not-yet-due effect must not be leased
    /// again. Two statements however many: one upsert of the leases, one read of the
    /// effects (a claim's cost was two round trips per effect).
    pub(crate) async fn lease(
        tx: &mut <B::DB as Database>::Connection,
        tenant: TenantId,
        ids: &[i64],
        owner: &str,
        now: f64,
        lease_secs: f64,
        due_only: bool,
    ) -> Result<Vec<Claim>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let until = now + lease_secs;
        // `VALUES` names its column `column1` on both databases; `WHERE true` keeps
        // SQLite from reading `ON CONFLICT` as a join's `ON`.
        let mut qb = QueryBuilder::<B::DB>::new(
            "INSERT INTO reconcile_state (effect_id, tenant_id, lease_owner, lease_until, \
             next_attempt_at) SELECT v.column1, ",
        );
        qb.push_bind(tenant.0)
            .push(", ")
            .push_bind(owner.to_owned())
            .push(", ")
            .push_bind(until)
            .push(", ")
            .push_bind(now)
            .push(" FROM (");
        qb.push_values(ids, |mut row, id| {
            row.push_bind(*id);
        });
        qb.push(
            ") AS v WHERE true ON CONFLICT (effect_id) DO UPDATE SET \
             lease_owner = excluded.lease_owner, lease_until = excluded.lease_until \
             WHERE (reconcile_state.lease_until IS NULL OR reconcile_state.lease_until <= ",
        )
        .push_bind(now)
        .push(")");
        if due_only {
            qb.push(" AND reconcile_state.next_attempt_at <= ")
                .push_bind(now);
        }
        qb.push(
            " AND NOT EXISTS (SELECT 1 FROM resolution z \
             WHERE z.effect_id = reconcile_state.effect_id) RETURNING effect_id, ",
        )
        .push(STATE_COLUMNS);
        let mut states = HashMap::new();
        for row in qb.build().fetch_all(&mut *tx).await? {
            states.insert(
                row.try_get::<i64, _>("effect_id")?,
                state_row::<B::DB>(&row)?,
            );
        }
        if states.is_empty() {
            return Ok(Vec::new());
        }
        let leased: Vec<i64> = ids
            .iter()
            .copied()
            .filter(|id| states.contains_key(id))
            .collect();
        let mut qb = QueryBuilder::<B::DB>::new(format!(
            "SELECT {} FROM effect e JOIN source s ON s.id = e.source_id WHERE e.tenant_id = ",
            rows::EFFECT_COLUMNS
        ));
        qb.push_bind(tenant.0).push(" AND e.id IN ");
        rows::push_in(&mut qb, leased.iter().copied());
        let mut effects = HashMap::new();
        for row in qb.build().fetch_all(&mut *tx).await? {
            let e = rows::effect::<B::DB>(&row, now)?;
            effects.insert(e.id, e);
        }
        Ok(leased
            .iter()
            .filter_map(|id| {
                Some(Claim {
                    effect: effects.remove(id)?,
                    state: states.remove(id)?,
                    owner: owner.to_owned(),
                    lease_until: until,
                })
            })
            .collect())
    }

    pub(crate) async fn resolution_of(
        tx: &mut <B::DB as Database>::Connection,
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
        .map(|r| resolution_row::<B::DB>(&r))
        .transpose()
    }
}
