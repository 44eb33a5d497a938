//! Storage of the double-charge audit: the tenant's calendar (time zone and the local time
//! of the nightly run), the provider's charges as imported for a day, the effects of a day
//! (by creation time, through the `effect_created` index), and audit runs chained by
//! digest. The run and its chain are the audit's own ([`reckon_audit::chain`]); the ledger
//! appends to the chain under the tenant's chain lock, so two writers never give one seq
//! twice.

use crate::LedgerError;
use crate::Result;
use crate::Tenants;
use crate::driver::{Driver, RowsAffected, SqlLedger, sql};
use crate::model::TenantId;
use crate::rows;
use crate::scope::Scope;
use macro_rules_attribute::apply;
pub use reckon_audit::chain::{
    ALL_PROVIDERS, AuditGlance, AuditMetric, AuditRun, AuditRunHead, AuditSettings, ChainBreak,
    ChainLink, NewAuditRun, SCHEDULE_AUTHOR, StoredCharge, canonical_json, charge_terms,
    failing_audits, finding_counts_of, run_digest, run_of_the_day, verify_chain, verify_content,
    verify_links,
};
use sqlx::Database;

pub(crate) const RUN_COLUMNS: &str = "id, seq, day, time_zone, window_start, window_end, \
    provider, triggered_by, status, reason, started_at, finished_at, counts, findings, totals, \
    evidence, prev_digest, digest";

pub(crate) const CHARGE_COLUMNS: &str = "provider_id, charge_id, payment_intent, amount, \
    currency, status, amount_captured, amount_refunded, refunds, metadata, idempotency_key, \
    customer, created, raw, imported_at";

/// [`CHARGE_COLUMNS`] with `raw` as JSON `null`.
const CHARGE_COLUMNS_TO_MATCH: &str = "provider_id, charge_id, payment_intent, amount, \
    currency, status, amount_captured, amount_refunded, refunds, metadata, idempotency_key, \
    customer, created, 'null' AS raw, imported_at";

/// `$1` tenant, `$2` day, `$3` provider, `$4` [`SCHEDULE_AUTHOR`]: a completed scheduled
/// run of that day.
const SCHEDULED_DONE_SQL: &str = "SELECT id FROM audit_run WHERE tenant_id = $1 AND day = $2 \
    AND provider = $3 AND triggered_by = $4 AND status = 'complete'";

/// A run's `evidence.providers` (`[{"name", "status", ...}]`) as (name, status) pairs.
fn parts_of(text: &str) -> Result<Vec<(String, String)>> {
    let v: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| LedgerError::Invalid(format!("stored evidence.providers is not JSON: {e}")))?;
    Ok(v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            Some((
                p.get("name")?.as_str()?.to_owned(),
                p.get("status")?.as_str()?.to_owned(),
            ))
        })
        .collect())
}

/// The charge columns, qualified by the alias `c` (for joins).
pub(crate) fn charge_columns_of_c() -> String {
    CHARGE_COLUMNS
        .split(',')
        .map(|col| format!("c.{}", col.trim()))
        .collect::<Vec<_>>()
        .join(", ")
}

#[apply(sql!)]
impl<B: Driver> SqlLedger<B> {
    pub(crate) fn audit_run_row(row: &<B::DB as Database>::Row) -> Result<AuditRun> {
        use sqlx::Row;
        Ok(AuditRun {
            id: row.try_get("id")?,
            seq: row.try_get("seq")?,
            run: NewAuditRun {
                day: row.try_get("day")?,
                time_zone: row.try_get("time_zone")?,
                window_start: row.try_get("window_start")?,
                window_end: row.try_get("window_end")?,
                provider: row.try_get("provider")?,
                triggered_by: row.try_get("triggered_by")?,
                status: row.try_get("status")?,
                reason: row.try_get("reason")?,
                started_at: row.try_get("started_at")?,
                finished_at: row.try_get("finished_at")?,
                counts: rows::json(row, "counts")?,
                findings: rows::json(row, "findings")?,
                totals: rows::json(row, "totals")?,
                evidence: rows::json(row, "evidence")?,
            },
            prev_digest: row.try_get("prev_digest")?,
            digest: row.try_get("digest")?,
        })
    }

    /// Replace the search terms of these charges (a re-import may change their
    /// metadata or refunds).
    pub(crate) async fn write_charge_terms(
        tx: &mut sqlx::Transaction<'static, B::DB>,
        tenant: TenantId,
        charges: &[StoredCharge],
    ) -> Result<()> {
        // One statement per provider and chunk, not a round trip per charge.
        let mut by_provider: std::collections::BTreeMap<i64, Vec<&str>> =
            std::collections::BTreeMap::new();
        for c in charges {
            by_provider
                .entry(c.provider_id)
                .or_default()
                .push(c.charge_id.as_str());
        }
        for (provider, ids) in by_provider {
            for chunk in ids.chunks(1000) {
                let mut qb: sqlx::QueryBuilder<B::DB> =
                    sqlx::QueryBuilder::new("DELETE FROM provider_charge_term WHERE tenant_id = ");
                qb.push_bind(tenant.0);
                qb.push(" AND provider_id = ");
                qb.push_bind(provider);
                qb.push(" AND charge_id IN ");
                rows::push_in(&mut qb, chunk.iter().map(ToString::to_string));
                qb.build().execute(&mut **tx).await?;
            }
        }
        let rows: Vec<(i64, &str, String)> = charges
            .iter()
            .flat_map(|c| {
                charge_terms(c)
                    .into_iter()
                    .map(move |t| (c.provider_id, c.charge_id.as_str(), t))
            })
            .collect();
        // 4 binds per row.
        for chunk in rows.chunks(2000) {
            let mut qb: sqlx::QueryBuilder<B::DB> = sqlx::QueryBuilder::new(
                "INSERT INTO provider_charge_term (tenant_id, term, provider_id, \
                 charge_id) ",
            );
            qb.push_values(chunk, |mut b, (provider, charge, term)| {
                b.push_bind(tenant.0)
                    .push_bind(term.clone())
                    .push_bind(*provider)
                    .push_bind(charge.to_string());
            });
            qb.push(" ON CONFLICT DO NOTHING");
            qb.build().execute(&mut **tx).await?;
        }
        Ok(())
    }

    /// The terms of charges imported before terms were kept: once, at migrate,
    /// tenant by tenant (inside each tenant's scope), then the job is struck off.
    pub(crate) async fn backfill_charge_terms(&self) -> Result<()> {
        let pending: Option<String> =
            sqlx::query_scalar("SELECT name FROM pending_backfill WHERE name = 'charge_terms'")
                .fetch_optional(&self.pool)
                .await?;
        if pending.is_none() {
            return Ok(());
        }
        for tenant in self.list_tenants().await? {
            let mut after: (i64, String) = (i64::MIN, String::new());
            loop {
                let mut tx = B::begin(self, Scope::Tenant(tenant.id), true).await?;
                let charges = Self::charge_page(&mut tx, tenant.id, &after).await?;
                let Some(last) = charges.last() else {
                    tx.commit().await?;
                    break;
                };
                after = (last.provider_id, last.charge_id.clone());
                Self::write_charge_terms(&mut tx, tenant.id, &charges).await?;
                tx.commit().await?;
            }
        }
        sqlx::query("DELETE FROM pending_backfill WHERE name = 'charge_terms'")
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The tenant's stored charges after `after` (provider id, charge id), a page in that
    /// order: how the passes over every charge walk them.
    pub(crate) async fn charge_page(
        tx: &mut sqlx::Transaction<'static, B::DB>,
        tenant: TenantId,
        after: &(i64, String),
    ) -> Result<Vec<StoredCharge>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {CHARGE_COLUMNS} FROM provider_charge WHERE tenant_id = $1 \
             AND (provider_id > $2 OR (provider_id = $2 AND charge_id > $3)) \
             ORDER BY provider_id, charge_id LIMIT 500"
        )))
        .bind(tenant.0)
        .bind(after.0)
        .bind(&after.1)
        .fetch_all(&mut **tx)
        .await?;
        rows.iter().map(Self::charge_row).collect()
    }

    /// `columns` of each charge created in `[from, to)`, of one provider or all, handed to
    /// `each` as its row arrives, in no order (see `each_effect_created_between`).
    async fn charges_between(
        &self,
        columns: &str,
        tenant: TenantId,
        provider_id: Option<i64>,
        (from, to): (f64, f64),
        each: &mut (dyn FnMut(StoredCharge) + Send),
    ) -> Result<()> {
        let stmt = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {columns} FROM provider_charge WHERE tenant_id = $1 AND created >= $2 \
             AND created < $3 AND (provider_id = $4 OR $5)"
        )))
        .bind(tenant.0)
        .bind(from)
        .bind(to)
        .bind(provider_id.unwrap_or(-1))
        .bind(provider_id.is_none());
        self.read_each(Scope::Tenant(tenant), stmt, |r| {
            each(Self::charge_row(r)?);
            Ok(())
        })
        .await?;
        Ok(())
    }

    pub(crate) fn charge_row(row: &<B::DB as Database>::Row) -> Result<StoredCharge> {
        use sqlx::Row;
        Ok(StoredCharge {
            provider_id: row.try_get("provider_id")?,
            charge_id: row.try_get("charge_id")?,
            payment_intent: row.try_get("payment_intent")?,
            amount: row.try_get("amount")?,
            currency: row.try_get("currency")?,
            status: row.try_get("status")?,
            amount_captured: row.try_get("amount_captured")?,
            amount_refunded: row.try_get("amount_refunded")?,
            refunds: rows::json(row, "refunds")?,
            metadata: rows::json(row, "metadata")?,
            idempotency_key: row.try_get("idempotency_key")?,
            customer: row.try_get("customer")?,
            created: row.try_get("created")?,
            raw: rows::json(row, "raw")?,
            imported_at: row.try_get("imported_at")?,
        })
    }
}

#[apply(sql!)]
impl<B: Driver> Audits for SqlLedger<B> {
    async fn audit_settings(&self, tenant: TenantId) -> Result<AuditSettings> {
        use sqlx::Row;
        let stmt =
            sqlx::query("SELECT time_zone, audit_time FROM tenant WHERE id = $1").bind(tenant.0);
        let row = self
            .read_opt(Scope::Tenant(tenant), stmt)
            .await?
            .ok_or_else(|| LedgerError::NotFound("tenant".into()))?;
        Ok(AuditSettings {
            time_zone: row.try_get(0)?,
            audit_time: row.try_get(1)?,
        })
    }

    /// Store the tenant's zone and nightly time (validated by the caller: reckon-audit).
    async fn set_audit_settings(&self, tenant: TenantId, s: &AuditSettings) -> Result<()> {
        s.check().map_err(|e| LedgerError::Invalid(e.to_string()))?;
        let stmt = sqlx::query("UPDATE tenant SET time_zone = $1, audit_time = $2 WHERE id = $3");
        let stmt = stmt.bind(&s.time_zone).bind(&s.audit_time).bind(tenant.0);
        self.exec(Scope::Tenant(tenant), stmt).await?;
        Ok(())
    }

    /// Insert or replace charges of one provider (one transaction). Returns how many.
    async fn store_provider_charges(
        &self,
        tenant: TenantId,
        charges: &[StoredCharge],
    ) -> Result<u64> {
        let mut tx = B::begin(self, Scope::Tenant(tenant), true).await?;
        let mut n = 0u64;
        // 16 binds per row: 1,000 rows stay under both drivers' bind limits.
        for chunk in charges.chunks(1000) {
            let mut qb: sqlx::QueryBuilder<B::DB> = sqlx::QueryBuilder::new(
                "INSERT INTO provider_charge (tenant_id, provider_id, charge_id, \
                 payment_intent, amount, currency, status, amount_captured, \
                 amount_refunded, refunds, metadata, idempotency_key, customer, created, \
                 raw, imported_at) ",
            );
            qb.push_values(chunk, |mut b, c| {
                b.push_bind(tenant.0)
                    .push_bind(c.provider_id)
                    .push_bind(c.charge_id.clone())
                    .push_bind(c.payment_intent.clone())
                    .push_bind(c.amount)
                    .push_bind(c.currency.clone())
                    .push_bind(c.status.clone())
                    .push_bind(c.amount_captured)
                    .push_bind(c.amount_refunded)
                    .push_bind(canonical_json(&c.refunds))
                    .push_bind(canonical_json(&c.metadata))
                    .push_bind(c.idempotency_key.clone())
                    .push_bind(c.customer.clone())
                    .push_bind(c.created)
                    .push_bind(c.raw.to_string())
                    .push_bind(c.imported_at);
            });
            qb.push(
                " ON CONFLICT (tenant_id, provider_id, charge_id) DO UPDATE SET \
                 payment_intent = excluded.payment_intent, amount = excluded.amount, \
                 currency = excluded.currency, status = excluded.status, \
                 amount_captured = excluded.amount_captured, \
                 amount_refunded = excluded.amount_refunded, refunds = excluded.refunds, \
                 metadata = excluded.metadata, idempotency_key = excluded.idempotency_key, \
                 customer = excluded.customer, created = excluded.created, \
                 raw = excluded.raw, imported_at = excluded.imported_at",
            );
            n += qb.build().execute(&mut *tx).await?.rows_affected();
            Self::write_charge_terms(&mut tx, tenant, chunk).await?;
        }
        tx.commit().await?;
        Ok(n)
    }

    /// Charges created in `[from, to)`, of one provider or all, by (created, charge id).
    async fn provider_charges(
        &self,
        tenant: TenantId,
        provider_id: Option<i64>,
        from: f64,
        to: f64,
    ) -> Result<Vec<StoredCharge>> {
        let mut charges = Vec::new();
        let window = (from, to);
        self.charges_between(CHARGE_COLUMNS, tenant, provider_id, window, &mut |c| {
            charges.push(c);
        })
        .await?;
        charges.sort_unstable_by(|a, b| {
            (a.created.total_cmp(&b.created)).then_with(|| a.charge_id.cmp(&b.charge_id))
        });
        Ok(charges)
    }

    /// Each charge created in `[from, to)`, of one provider or all, as its row arrives, in
    /// no order, without the provider's object: every field the audit matches on, `raw`
    /// left `Null`. A real provider's object is most of a charge's bytes (a Stripe charge is
    /// kilobytes of JSON) and the audit never reads it; decoded for a day of a million
    /// charges it would be gigabytes of memory. The caller keeps what it needs of each.
    async fn each_charge_to_match(
        &self,
        tenant: TenantId,
        provider_id: Option<i64>,
        from: f64,
        to: f64,
        each: &mut (dyn FnMut(StoredCharge) + Send),
    ) -> Result<()> {
        let window = (from, to);
        self.charges_between(CHARGE_COLUMNS_TO_MATCH, tenant, provider_id, window, each)
            .await
    }

    /// Charges of any of the tenant's providers whose id is one of `ids` or whose
    /// idempotency key is one of `keys` (the support lookup; indexes of migration 0013),
    /// oldest first, at most `limit`.
    async fn charges_by_ids_or_keys(
        &self,
        tenant: TenantId,
        ids: &[String],
        keys: &[String],
        limit: i64,
    ) -> Result<Vec<StoredCharge>> {
        if ids.is_empty() && keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = B::begin(self, Scope::Tenant(tenant), false).await?;
        let mut qb: sqlx::QueryBuilder<B::DB> = sqlx::QueryBuilder::new(format!(
            "SELECT {CHARGE_COLUMNS} FROM provider_charge WHERE tenant_id = "
        ));
        qb.push_bind(tenant.0);
        // An empty IN list is not SQL: the empty string is no charge's id or key.
        let none = [String::new()];
        let ids = if ids.is_empty() { &none[..] } else { ids };
        let keys = if keys.is_empty() { &none[..] } else { keys };
        qb.push(" AND (charge_id IN ");
        rows::push_in(&mut qb, ids.iter().take(200).cloned());
        qb.push(" OR idempotency_key IN ");
        rows::push_in(&mut qb, keys.iter().take(200).cloned());
        // An id may also be what names a charge without being its id: an order id,
        // a PaymentIntent, a refund (see `charge_terms`).
        qb.push(format!(
            ") UNION SELECT {} FROM provider_charge_term t JOIN provider_charge c \
             ON c.tenant_id = t.tenant_id AND c.provider_id = t.provider_id \
             AND c.charge_id = t.charge_id WHERE t.tenant_id = ",
            charge_columns_of_c()
        ));
        qb.push_bind(tenant.0);
        qb.push(" AND t.term IN ");
        rows::push_in(&mut qb, ids.iter().take(200).cloned());
        qb.push(" ORDER BY created, charge_id LIMIT ");
        qb.push_bind(limit.clamp(1, 1000));
        let rows = qb.build().fetch_all(&mut *tx).await?;
        tx.commit().await?;
        rows.iter().map(Self::charge_row).collect()
    }

    /// Each effect created in `[from, to)`, handed to `each` as its row arrives, in no
    /// order (the `effect_created` index: cost grows with the day). The caller keeps what
    /// it needs of each: a day of a million effects is never held whole here.
    async fn each_effect_created_between(
        &self,
        tenant: TenantId,
        from: f64,
        to: f64,
        now: f64,
        each: &mut (dyn FnMut(crate::model::Effect) + Send),
    ) -> Result<()> {
        let stmt = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {} FROM effect e JOIN source s ON s.id = e.source_id \
             WHERE e.tenant_id = $1 AND e.created_at >= $2 AND e.created_at < $3",
            rows::EFFECT_COLUMNS
        )))
        .bind(tenant.0)
        .bind(from)
        .bind(to);
        // Unsorted: a day spread over a large ledger's pages is read best in page order (a
        // bitmap scan), and a server-side sort of it sends nothing until the last page is
        // read, where unsorted rows are decoded as they come. `Vec<()>` allocates nothing.
        self.read_each(Scope::Tenant(tenant), stmt, |r| {
            each(rows::effect::<B::DB>(r, now)?);
            Ok(())
        })
        .await?;
        Ok(())
    }

    /// Append a run to the tenant's chain, fenced by `lease` when given. A second completed
    /// scheduled run of one day and provider scope is refused (`Conflict`).
    async fn record_audit_run(
        &self,
        tenant: TenantId,
        run: NewAuditRun,
        lease: Option<&crate::model::Lease>,
    ) -> Result<AuditRun> {
        use sqlx::Row;
        // Two appends racing for one seq: the loser's INSERT fails on
        // UNIQUE (tenant_id, seq) and it tries again on top of the winner.
        for _ in 0..8 {
            let mut tx = B::begin(self, Scope::Tenant(tenant), true).await?;
            crate::driver::fence::<B>(&mut tx, lease).await?;
            B::lock_audit_chain(&mut tx, tenant).await?;
            if run.triggered_by == SCHEDULE_AUTHOR && run.status == "complete" {
                let done = sqlx::query(SCHEDULED_DONE_SQL)
                    .bind(tenant.0)
                    .bind(&run.day);
                let done = done.bind(&run.provider).bind(SCHEDULE_AUTHOR);
                if done.fetch_optional(&mut *tx).await?.is_some() {
                    return Err(LedgerError::Conflict(format!(
                        "the scheduled audit of {}",
                        run.day
                    )));
                }
            }
            let prev = sqlx::query(
                "SELECT seq, digest FROM audit_run WHERE tenant_id = $1 \
                 ORDER BY seq DESC LIMIT 1",
            )
            .bind(tenant.0)
            .fetch_optional(&mut *tx)
            .await?;
            let (seq, prev_digest) = match prev {
                Some(r) => (r.try_get::<i64, _>(0)? + 1, r.try_get::<String, _>(1)?),
                None => (1, String::new()),
            };
            let digest = run_digest(tenant.get(), seq, &prev_digest, &run);
            let canon = canonical_json;
            let inserted = sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO audit_run (tenant_id, seq, day, time_zone, window_start, \
                 window_end, provider, triggered_by, status, reason, started_at, \
                 finished_at, counts, findings, totals, evidence, prev_digest, digest) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, \
                 $15, $16, $17, $18) RETURNING {RUN_COLUMNS}"
            )))
            .bind(tenant.0)
            .bind(seq)
            .bind(&run.day)
            .bind(&run.time_zone)
            .bind(run.window_start)
            .bind(run.window_end)
            .bind(&run.provider)
            .bind(&run.triggered_by)
            .bind(&run.status)
            .bind(&run.reason)
            .bind(run.started_at)
            .bind(run.finished_at)
            .bind(canon(&run.counts))
            .bind(canon(&run.findings))
            .bind(canon(&run.totals))
            .bind(canon(&run.evidence))
            .bind(&prev_digest)
            .bind(&digest)
            .fetch_one(&mut *tx)
            .await;
            match inserted.map_err(LedgerError::from) {
                Ok(row) => {
                    let stored = Self::audit_run_row(&row)?;
                    tx.commit().await?;
                    return Ok(stored);
                }
                Err(LedgerError::Conflict(_)) => {}
                Err(other) => return Err(other),
            }
        }
        Err(LedgerError::Conflict("audit run chain".into()))
    }

    /// Newest first; of one day when given.
    async fn list_audit_runs(
        &self,
        tenant: TenantId,
        day: Option<&str>,
        limit: i64,
    ) -> Result<Vec<AuditRun>> {
        let stmt = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {RUN_COLUMNS} FROM audit_run WHERE tenant_id = $1 AND (day = $2 OR $3) \
             ORDER BY seq DESC LIMIT $4"
        )))
        .bind(tenant.0)
        .bind(day.unwrap_or(""))
        .bind(day.is_none())
        .bind(limit.clamp(1, 1000));
        let rows = self.read_all(Scope::Tenant(tenant), stmt).await?;
        rows.iter().map(Self::audit_run_row).collect()
    }

    async fn get_audit_run(&self, tenant: TenantId, id: i64) -> Result<Option<AuditRun>> {
        let stmt = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {RUN_COLUMNS} FROM audit_run WHERE tenant_id = $1 AND id = $2"
        )))
        .bind(tenant.0)
        .bind(id);
        let row = self.read_opt(Scope::Tenant(tenant), stmt).await?;
        row.as_ref().map(Self::audit_run_row).transpose()
    }

    /// A page of the chain in seq order, after `after_seq`.
    async fn audit_chain(
        &self,
        tenant: TenantId,
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<AuditRun>> {
        let stmt = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {RUN_COLUMNS} FROM audit_run WHERE tenant_id = $1 AND seq > $2 \
             ORDER BY seq LIMIT $3"
        )))
        .bind(tenant.0)
        .bind(after_seq)
        .bind(limit.clamp(1, 10_000));
        let rows = self.read_all(Scope::Tenant(tenant), stmt).await?;
        rows.iter().map(Self::audit_run_row).collect()
    }

    /// Whether a completed scheduled run of `day` and `provider` is stored.
    async fn scheduled_audit_done(
        &self,
        tenant: TenantId,
        day: &str,
        provider: &str,
    ) -> Result<bool> {
        let stmt = sqlx::query(SCHEDULED_DONE_SQL).bind(tenant.0).bind(day);
        let stmt = stmt.bind(provider).bind(SCHEDULE_AUTHOR);
        Ok(self.read_opt(Scope::Tenant(tenant), stmt).await?.is_some())
    }

    /// Whether a scheduled run of `day` failed or stopped partial after `since`: the
    /// scheduler waits before trying such a day again. Reads the runs' heads only (a partial
    /// run of a big day holds megabytes of findings, and this is asked every minute).
    async fn scheduled_run_failed_since(
        &self,
        tenant: TenantId,
        day: &str,
        since: f64,
    ) -> Result<bool> {
        let stmt = sqlx::query(
            "SELECT id FROM audit_run WHERE tenant_id = $1 AND day = $2 AND triggered_by = $3 \
             AND status IN ('failed', 'partial') AND finished_at > $4 LIMIT 1",
        )
        .bind(tenant.0)
        .bind(day)
        .bind(SCHEDULE_AUTHOR)
        .bind(since);
        Ok(self.read_opt(Scope::Tenant(tenant), stmt).await?.is_some())
    }

    /// The findings of the newest day audited with findings (complete or partial), as that
    /// day's run ([`run_of_the_day`]) has them, for metrics (`None`: no run yet). A re-run of
    /// an older day does not stand in for the newest day.
    async fn audit_metric(&self, tenant: TenantId) -> Result<Option<AuditMetric>> {
        use sqlx::Row;
        let stmt = sqlx::query(
            "SELECT day FROM audit_run WHERE tenant_id = $1 \
             AND status IN ('complete', 'partial') ORDER BY day DESC LIMIT 1",
        )
        .bind(tenant.0);
        let Some(row) = self.read_opt(Scope::Tenant(tenant), stmt).await? else {
            return Ok(None);
        };
        let day: String = row.try_get("day")?;
        Ok(self.audit_glance(tenant, &day).await?.map(|g| AuditMetric {
            finished_at: g.finished_at,
            findings: g.findings,
        }))
    }

    /// The tenant's newest `limit` runs, newest first, as [`failing_audits`] reads them.
    /// Each provider's part is cut out of the evidence by the database, and only for runs
    /// that did not complete: a run's evidence holds every page it read.
    async fn audit_run_heads(&self, tenant: TenantId, limit: i64) -> Result<Vec<AuditRunHead>> {
        use sqlx::Row;
        let stmt = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT provider, status, CASE WHEN status = 'complete' THEN NULL \
             ELSE COALESCE({}, '[]') END AS parts FROM audit_run WHERE tenant_id = $1 \
             ORDER BY seq DESC LIMIT $2",
            B::EVIDENCE_PROVIDERS
        )))
        .bind(tenant.0)
        .bind(limit.clamp(1, 1000));
        let rows = self.read_all(Scope::Tenant(tenant), stmt).await?;
        rows.iter()
            .map(|r| {
                let parts = match r.try_get::<Option<String>, _>("parts")? {
                    None => None,
                    Some(text) => Some(parts_of(&text)?),
                };
                Ok(AuditRunHead {
                    provider: r.try_get("provider")?,
                    status: r.try_get("status")?,
                    parts,
                })
            })
            .collect()
    }

    /// Every run's place in the chain (seq and digests only), in seq order: what
    /// [`verify_links`] needs, a few hundred bytes per run whatever the runs hold.
    async fn audit_links(&self, tenant: TenantId) -> Result<Vec<ChainLink>> {
        use sqlx::Row;
        let stmt = sqlx::query(
            "SELECT id, seq, prev_digest, digest FROM audit_run WHERE tenant_id = $1 \
             ORDER BY seq",
        )
        .bind(tenant.0);
        let rows = self.read_all(Scope::Tenant(tenant), stmt).await?;
        rows.iter()
            .map(|r| {
                Ok(ChainLink {
                    id: r.try_get("id")?,
                    seq: r.try_get("seq")?,
                    prev_digest: r.try_get("prev_digest")?,
                    digest: r.try_get("digest")?,
                })
            })
            .collect()
    }

    /// The run of `day` that counts for it ([`run_of_the_day`]), without its findings or
    /// evidence, and the newest run's failure beside it.
    async fn audit_glance(&self, tenant: TenantId, day: &str) -> Result<Option<AuditGlance>> {
        use sqlx::Row;
        // The `audit_run_day` index; a day holds a handful of runs, newest first.
        let stmt = sqlx::query(
            "SELECT id, seq, day, provider, status, reason, finished_at, counts FROM audit_run \
             WHERE tenant_id = $1 AND day = $2 ORDER BY seq DESC",
        );
        let runs = self.read_all(Scope::Tenant(tenant), stmt.bind(tenant.0).bind(day));
        let runs = runs.await?;
        let heads = runs
            .iter()
            .map(|r| -> Result<_> {
                Ok((
                    r.try_get::<String, _>("status")?,
                    r.try_get::<i64, _>("seq")?,
                    r,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let Some((newest_status, _, newest)) = heads.first() else {
            return Ok(None);
        };
        let failure = if newest_status == "complete" {
            None
        } else {
            Some((
                newest
                    .try_get::<Option<String>, _>("reason")?
                    .unwrap_or_else(|| "failed".into()),
                newest.try_get::<f64, _>("finished_at")?,
            ))
        };
        let Some((_, _, row)) = run_of_the_day(&heads, |h| h.0.as_str(), |h| h.1) else {
            return Ok(None);
        };
        let counts = rows::json(row, "counts")?;
        Ok(Some(AuditGlance {
            id: row.try_get("id")?,
            day: row.try_get("day")?,
            provider: row.try_get("provider")?,
            status: row.try_get("status")?,
            reason: row.try_get("reason")?,
            finished_at: row.try_get("finished_at")?,
            findings: finding_counts_of(&counts),
            failure,
        }))
    }
}
