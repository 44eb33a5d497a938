//! Storage of the double-charge audit: the tenant's calendar (time zone and the
//! local time of the nightly run), the provider's charges as imported for a day, the effects
//! of a day (by creation time, through the `effect_created` index), and audit runs chained
//! by digest. [`Audits`] is a supertrait of [`crate::Ledger`].
//!
//! Both backends run the same SQL, written once for [`SqlLedger`]; PostgreSQL runs every
//! query inside the tenant's row-level-security scope.
//!
//! The chain: every run of a tenant has `seq` (1, 2, ...) and `digest` = SHA-256 over a
//! fixed prefix, the previous run's digest, and the canonical encoding (JSON with keys
//! sorted at every level, no whitespace) of the run's content. Editing any stored field of a
//! run, or removing a run, breaks [`verify_chain`] from that run on.

use crate::Result;
use crate::driver::{Driver, RowsAffected, SqlLedger, sql};
use crate::model::{Effect, Lease, TenantId};
use async_trait::async_trait;
use macro_rules_attribute::apply;
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use sqlx::Database;

/// `triggered_by` of the nightly run; the ledger stores a completed one once per day.
pub const SCHEDULE_AUTHOR: &str = "schedule";
/// `provider` of a run over all of the tenant's providers.
pub const ALL_PROVIDERS: &str = "*";

/// Where the tenant's days begin and when its nightly audit runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditSettings {
    /// IANA time zone name; days are cut at its midnights.
    pub time_zone: String,
    /// `HH:MM`, local to `time_zone`: when the audit of yesterday runs.
    pub audit_time: String,
}

impl Default for AuditSettings {
    fn default() -> Self {
        AuditSettings {
            time_zone: "UTC".into(),
            audit_time: "06:00".into(),
        }
    }
}

/// A provider charge as stored (one row per provider object, replaced on re-import).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoredCharge {
    pub provider_id: i64,
    pub charge_id: String,
    pub payment_intent: Option<String>,
    pub amount: i64,
    pub currency: String,
    pub status: String,
    pub amount_captured: i64,
    pub amount_refunded: i64,
    /// `[{"id", "amount", "reason"}]`
    pub refunds: Value,
    /// `{"field": "value"}`
    pub metadata: Value,
    pub idempotency_key: Option<String>,
    pub customer: Option<String>,
    pub created: f64,
    /// The provider's object as read: the evidence.
    pub raw: Value,
    pub imported_at: f64,
}

/// A run to store. The ledger adds `seq`, `prev_digest` and `digest`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NewAuditRun {
    pub day: String,
    pub time_zone: String,
    pub window_start: f64,
    pub window_end: f64,
    /// A provider name, or [`ALL_PROVIDERS`].
    pub provider: String,
    /// A person, `operator`, or [`SCHEDULE_AUTHOR`].
    pub triggered_by: String,
    /// `complete` or `failed`.
    pub status: String,
    /// Why a run failed.
    pub reason: Option<String>,
    pub started_at: f64,
    pub finished_at: f64,
    pub counts: Value,
    /// Empty for a failed run: a partial day is never reported.
    pub findings: Value,
    pub totals: Value,
    /// The provider pages read (method, cursor, request id, objects per page).
    pub evidence: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditRun {
    pub id: i64,
    pub seq: i64,
    #[serde(flatten)]
    pub run: NewAuditRun,
    pub prev_digest: String,
    pub digest: String,
}

/// A run of the chain that does not check out.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChainBreak {
    pub id: i64,
    pub seq: i64,
    pub reason: String,
}

/// Recursively key-sorted, whitespace-free JSON: the same value always encodes to the same
/// bytes, whatever map order the JSON library keeps.
pub fn canonical_json(v: &Value) -> String {
    fn write(v: &Value, out: &mut String) {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push(':');
                    write(&m[k], out);
                }
                out.push('}');
            }
            Value::Array(a) => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(x, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(v, &mut out);
    out
}

/// The digest of a run: SHA-256 (hex) over a version prefix, the tenant, the run's place in
/// the chain, the previous digest and the canonical encoding of its content.
pub fn run_digest(tenant: i64, seq: i64, prev_digest: &str, run: &NewAuditRun) -> String {
    let body = serde_json::to_value(run).unwrap_or(Value::Null);
    let mut h = Sha256::new();
    h.update(format!("reckon-audit-run/v1\n{tenant}\n{seq}\n{prev_digest}\n").as_bytes());
    h.update(canonical_json(&body).as_bytes());
    hex::encode(h.finalize())
}

/// Check a tenant's runs, in `seq` order from the first: every seq follows the previous,
/// every `prev_digest` is the previous run's digest, and every digest is recomputed from
/// the stored content. Returns every break (empty: the chain is intact).
/// One run's place in its tenant's chain.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChainLink {
    pub id: i64,
    pub seq: i64,
    pub prev_digest: String,
    pub digest: String,
}

/// The links of a whole chain: no run missing (seq 1, 2, ...) and each run naming the
/// digest of the one before. Together with [`verify_content`] of a run, this is what
/// [`verify_chain`] checks, without reading every run's findings and evidence.
pub fn verify_links(links: &[ChainLink]) -> Vec<ChainBreak> {
    let mut out = Vec::new();
    let mut prev = "";
    for (i, l) in links.iter().enumerate() {
        let brk = |reason: String| ChainBreak {
            id: l.id,
            seq: l.seq,
            reason,
        };
        if l.seq != i as i64 + 1 {
            out.push(brk(format!(
                "seq {} where {} was expected (a run was removed)",
                l.seq,
                i + 1
            )));
        }
        if l.prev_digest != prev {
            out.push(brk("its previous digest is not the previous run's".into()));
        }
        prev = &l.digest;
    }
    out
}

/// Whether a run's content still has the digest it was stored with.
pub fn verify_content(tenant: TenantId, r: &AuditRun) -> Option<ChainBreak> {
    (run_digest(tenant.0, r.seq, &r.prev_digest, &r.run) != r.digest).then(|| ChainBreak {
        id: r.id,
        seq: r.seq,
        reason: "its content does not match its digest (the run was edited)".into(),
    })
}

pub fn verify_chain(tenant: TenantId, runs: &[AuditRun]) -> Vec<ChainBreak> {
    let mut out = Vec::new();
    let mut prev = String::new();
    for (i, r) in runs.iter().enumerate() {
        let brk = |reason: String| ChainBreak {
            id: r.id,
            seq: r.seq,
            reason,
        };
        if r.seq != i as i64 + 1 {
            out.push(brk(format!(
                "seq {} where {} was expected (a run was removed)",
                r.seq,
                i + 1
            )));
        }
        if r.prev_digest != prev {
            out.push(brk("its previous digest is not the previous run's".into()));
        }
        if run_digest(tenant.0, r.seq, &r.prev_digest, &r.run) != r.digest {
            out.push(brk(
                "its content does not match its digest (the run was edited)".into(),
            ));
        }
        prev = r.digest.clone();
    }
    out
}

/// Per-tenant audit figures for metrics: the newest complete run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditMetric {
    pub finished_at: f64,
    /// Finding kind -> count, from the run's `counts`.
    pub findings: Vec<(String, i64)>,
}

/// The newest run of one day at a glance (the overview): no findings, no evidence.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditGlance {
    pub id: i64,
    pub day: String,
    pub provider: String,
    /// `complete`, `partial` (some providers failed; the others' findings stand) or
    /// `failed`.
    pub status: String,
    pub reason: Option<String>,
    pub finished_at: f64,
    /// Finding kind -> count, from the run's `counts`.
    pub findings: Vec<(String, i64)>,
    /// The day's newest run, when it did not complete: its reason and when it ended (shown
    /// beside the newest run with findings, which may be older).
    pub failure: Option<(String, f64)>,
}

/// Finding kind -> count from a run's `counts` (used by the backends' shared
/// implementation, the macro below).
#[doc(hidden)]
pub fn finding_counts_of(counts: &Value) -> Vec<(String, i64)> {
    counts
        .get("findings")
        .and_then(|f| f.as_object())
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_i64().unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default()
}

#[async_trait]
pub trait Audits: Send + Sync {
    async fn audit_settings(&self, tenant: TenantId) -> Result<AuditSettings>;
    /// Store the tenant's zone and nightly time (validated by the caller: reckon-audit).
    async fn set_audit_settings(&self, tenant: TenantId, s: &AuditSettings) -> Result<()>;
    /// Insert or replace charges of one provider (one transaction). Returns how many.
    async fn store_provider_charges(
        &self,
        tenant: TenantId,
        charges: &[StoredCharge],
    ) -> Result<u64>;
    /// Charges created in `[from, to)`, of one provider or all.
    async fn provider_charges(
        &self,
        tenant: TenantId,
        provider_id: Option<i64>,
        from: f64,
        to: f64,
    ) -> Result<Vec<StoredCharge>>;
    /// Charges of any of the tenant's providers whose id is one of `ids` or whose
    /// idempotency key is one of `keys` (the support lookup; indexes of migration 0013),
    /// oldest first, at most `limit`.
    async fn charges_by_ids_or_keys(
        &self,
        tenant: TenantId,
        ids: &[String],
        keys: &[String],
        limit: i64,
    ) -> Result<Vec<StoredCharge>>;
    /// Effects created in `[from, to)` (the `effect_created` index: cost grows with the day).
    async fn effects_created_between(
        &self,
        tenant: TenantId,
        from: f64,
        to: f64,
        now: f64,
    ) -> Result<Vec<Effect>>;
    /// Append a run to the tenant's chain, fenced by `lease` when given. A second completed
    /// scheduled run of one day and provider scope is refused (`Conflict`).
    async fn record_audit_run(
        &self,
        tenant: TenantId,
        run: NewAuditRun,
        lease: Option<&Lease>,
    ) -> Result<AuditRun>;
    /// Newest first; of one day when given.
    async fn list_audit_runs(
        &self,
        tenant: TenantId,
        day: Option<&str>,
        limit: i64,
    ) -> Result<Vec<AuditRun>>;
    async fn get_audit_run(&self, tenant: TenantId, id: i64) -> Result<Option<AuditRun>>;
    /// A page of the chain in seq order, after `after_seq`.
    async fn audit_chain(
        &self,
        tenant: TenantId,
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<AuditRun>>;
    /// Whether a completed scheduled run of `day` and `provider` is stored.
    async fn scheduled_audit_done(
        &self,
        tenant: TenantId,
        day: &str,
        provider: &str,
    ) -> Result<bool>;
    /// The newest run with findings (complete or partial), for metrics (`None`: no run yet).
    async fn audit_metric(&self, tenant: TenantId) -> Result<Option<AuditMetric>>;
    /// The newest run of `day` with findings (else the newest run), without its findings or
    /// evidence, and the newest run's failure beside it.
    async fn audit_glance(&self, tenant: TenantId, day: &str) -> Result<Option<AuditGlance>>;
    /// Every run's place in the chain (seq and digests only), in seq order: what
    /// [`verify_links`] needs, a few hundred bytes per run whatever the runs hold.
    async fn audit_links(&self, tenant: TenantId) -> Result<Vec<ChainLink>>;
}

pub(crate) const RUN_COLUMNS: &str = "id, seq, day, time_zone, window_start, window_end, \
    provider, triggered_by, status, reason, started_at, finished_at, counts, findings, totals, \
    evidence, prev_digest, digest";

pub(crate) const CHARGE_COLUMNS: &str = "provider_id, charge_id, payment_intent, amount, \
    currency, status, amount_captured, amount_refunded, refunds, metadata, idempotency_key, \
    customer, created, raw, imported_at";

/// Everything besides its own id that names a charge for a person searching: the whole
/// idempotency key, its subject and each part of it (the order id in `charge:v1:ORD-7`), its
/// PaymentIntent, its refunds' ids, and the short string values of its metadata.
pub fn charge_terms(c: &StoredCharge) -> Vec<String> {
    let mut terms: Vec<String> = Vec::new();
    let mut add = |t: &str| {
        let t = t.trim();
        if !t.is_empty() && t.len() <= 200 && !t.contains('\0') && !terms.iter().any(|x| x == t) {
            terms.push(t.to_owned());
        }
    };
    if let Some(k) = &c.idempotency_key {
        add(k);
        if let Some(parsed) = reckon_domain::key::OperationKey::parse(k) {
            add(&parsed.subject);
            for p in &parsed.parts {
                add(p);
            }
        }
    }
    if let Some(pi) = &c.payment_intent {
        add(pi);
    }
    for r in c.refunds.as_array().into_iter().flatten() {
        if let Some(id) = r.get("id").and_then(Value::as_str) {
            add(id);
        }
    }
    for v in c
        .metadata
        .as_object()
        .into_iter()
        .flat_map(|m| m.values())
        .take(50)
    {
        if let Some(text) = v.as_str() {
            add(text);
        }
    }
    terms
}

/// The charge columns, qualified by the alias `c` (for joins).
pub(crate) fn charge_columns_of_c() -> String {
    CHARGE_COLUMNS
        .split(',')
        .map(|col| format!("c.{}", col.trim()))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) fn parse_json(what: &str, text: &str) -> Result<Value> {
    serde_json::from_str(text)
        .map_err(|e| crate::LedgerError::Invalid(format!("stored {what} is not JSON: {e}")))
}

pub(crate) fn check_settings(s: &AuditSettings) -> Result<()> {
    let ok = s.audit_time.len() == 5
        && s.audit_time.as_bytes()[2] == b':'
        && s.audit_time[..2].parse::<u8>().is_ok_and(|h| h < 24)
        && s.audit_time[3..].parse::<u8>().is_ok_and(|m| m < 60);
    if !ok {
        return Err(crate::LedgerError::Invalid(format!(
            "audit time {:?} (use HH:MM, 24-hour, local to the tenant's zone)",
            s.audit_time
        )));
    }
    if s.time_zone.is_empty() || s.time_zone.len() > 64 {
        return Err(crate::LedgerError::Invalid("time zone".into()));
    }
    Ok(())
}

#[apply(sql!)]
impl<B: Driver> SqlLedger<B> {
    pub(crate) fn audit_run_row(
        row: &<B::DB as Database>::Row,
    ) -> crate::Result<crate::audit::AuditRun> {
        use crate::audit::parse_json;
        use sqlx::Row;
        Ok(crate::audit::AuditRun {
            id: row.try_get("id")?,
            seq: row.try_get("seq")?,
            run: crate::audit::NewAuditRun {
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
                counts: parse_json("counts", &row.try_get::<String, _>("counts")?)?,
                findings: parse_json("findings", &row.try_get::<String, _>("findings")?)?,
                totals: parse_json("totals", &row.try_get::<String, _>("totals")?)?,
                evidence: parse_json("evidence", &row.try_get::<String, _>("evidence")?)?,
            },
            prev_digest: row.try_get("prev_digest")?,
            digest: row.try_get("digest")?,
        })
    }

    /// Replace the search terms of these charges (a re-import may change their
    /// metadata or refunds).
    pub(crate) async fn write_charge_terms(
        tx: &mut sqlx::Transaction<'static, B::DB>,
        tenant: crate::model::TenantId,
        charges: &[crate::audit::StoredCharge],
    ) -> crate::Result<()> {
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
                qb.push(" AND charge_id IN (");
                let mut list = qb.separated(", ");
                for id in chunk {
                    list.push_bind(id.to_string());
                }
                qb.push(")");
                qb.build().execute(&mut **tx).await?;
            }
        }
        let rows: Vec<(i64, &str, String)> = charges
            .iter()
            .flat_map(|c| {
                crate::audit::charge_terms(c)
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

    /// Every tenant, for the one-off jobs of migrate that go tenant by tenant.
    pub(crate) async fn all_tenants(&self) -> crate::Result<Vec<crate::model::Tenant>> {
        let mut tx = B::begin(self, crate::accounts::Scope::Global, false).await?;
        let rows = sqlx::query("SELECT id, slug, created_at FROM tenant ORDER BY id")
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        rows.iter().map(crate::rows::tenant::<B::DB>).collect()
    }

    /// The terms of charges imported before terms were kept: once, at migrate,
    /// tenant by tenant (inside each tenant's scope), then the job is struck off.
    pub(crate) async fn backfill_charge_terms(&self) -> crate::Result<()> {
        use sqlx::Row;
        let pending: Option<String> =
            sqlx::query_scalar("SELECT name FROM pending_backfill WHERE name = 'charge_terms'")
                .fetch_optional(&self.pool)
                .await?;
        if pending.is_none() {
            return Ok(());
        }
        for tenant in self.all_tenants().await? {
            let mut after: (i64, String) = (i64::MIN, String::new());
            loop {
                let mut tx =
                    B::begin(self, crate::accounts::Scope::Tenant(tenant.id), true).await?;
                let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
                    "SELECT {} FROM provider_charge WHERE tenant_id = $1 \
                     AND (provider_id > $2 OR (provider_id = $2 AND charge_id > $3)) \
                     ORDER BY provider_id, charge_id LIMIT 500",
                    crate::audit::CHARGE_COLUMNS
                )))
                .bind(tenant.id.0)
                .bind(after.0)
                .bind(&after.1)
                .fetch_all(&mut *tx)
                .await?;
                let Some(last) = rows.last() else {
                    tx.commit().await?;
                    break;
                };
                after = (last.try_get("provider_id")?, last.try_get("charge_id")?);
                let charges = rows
                    .iter()
                    .map(Self::charge_row)
                    .collect::<crate::Result<Vec<_>>>()?;
                Self::write_charge_terms(&mut tx, tenant.id, &charges).await?;
                tx.commit().await?;
            }
        }
        sqlx::query("DELETE FROM pending_backfill WHERE name = 'charge_terms'")
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub(crate) fn charge_row(
        row: &<B::DB as Database>::Row,
    ) -> crate::Result<crate::audit::StoredCharge> {
        use crate::audit::parse_json;
        use sqlx::Row;
        Ok(crate::audit::StoredCharge {
            provider_id: row.try_get("provider_id")?,
            charge_id: row.try_get("charge_id")?,
            payment_intent: row.try_get("payment_intent")?,
            amount: row.try_get("amount")?,
            currency: row.try_get("currency")?,
            status: row.try_get("status")?,
            amount_captured: row.try_get("amount_captured")?,
            amount_refunded: row.try_get("amount_refunded")?,
            refunds: parse_json("refunds", &row.try_get::<String, _>("refunds")?)?,
            metadata: parse_json("metadata", &row.try_get::<String, _>("metadata")?)?,
            idempotency_key: row.try_get("idempotency_key")?,
            customer: row.try_get("customer")?,
            created: row.try_get("created")?,
            raw: parse_json("raw", &row.try_get::<String, _>("raw")?)?,
            imported_at: row.try_get("imported_at")?,
        })
    }
}

#[apply(sql!)]
#[async_trait::async_trait]
impl<B: Driver> Audits for SqlLedger<B> {
    #[tracing::instrument(level = "debug", skip_all)]
    async fn audit_settings(
        &self,
        tenant: crate::model::TenantId,
    ) -> crate::Result<crate::audit::AuditSettings> {
        use sqlx::Row;
        let mut tx = B::begin(self, crate::accounts::Scope::Tenant(tenant), false).await?;
        let row = sqlx::query("SELECT time_zone, audit_time FROM tenant WHERE id = $1")
            .bind(tenant.0)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or_else(|| crate::LedgerError::NotFound("tenant".into()))?;
        tx.commit().await?;
        Ok(crate::audit::AuditSettings {
            time_zone: row.try_get(0)?,
            audit_time: row.try_get(1)?,
        })
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn set_audit_settings(
        &self,
        tenant: crate::model::TenantId,
        s: &crate::audit::AuditSettings,
    ) -> crate::Result<()> {
        crate::audit::check_settings(s)?;
        let mut tx = B::begin(self, crate::accounts::Scope::Tenant(tenant), true).await?;
        sqlx::query("UPDATE tenant SET time_zone = $1, audit_time = $2 WHERE id = $3")
            .bind(&s.time_zone)
            .bind(&s.audit_time)
            .bind(tenant.0)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn store_provider_charges(
        &self,
        tenant: crate::model::TenantId,
        charges: &[crate::audit::StoredCharge],
    ) -> crate::Result<u64> {
        let mut tx = B::begin(self, crate::accounts::Scope::Tenant(tenant), true).await?;
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
                    .push_bind(crate::audit::canonical_json(&c.refunds))
                    .push_bind(crate::audit::canonical_json(&c.metadata))
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

    #[tracing::instrument(level = "debug", skip_all)]
    async fn provider_charges(
        &self,
        tenant: crate::model::TenantId,
        provider_id: Option<i64>,
        from: f64,
        to: f64,
    ) -> crate::Result<Vec<crate::audit::StoredCharge>> {
        let mut tx = B::begin(self, crate::accounts::Scope::Tenant(tenant), false).await?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {} FROM provider_charge WHERE tenant_id = $1 AND created >= $2 \
             AND created < $3 AND (provider_id = $4 OR $5) ORDER BY created, charge_id",
            crate::audit::CHARGE_COLUMNS
        )))
        .bind(tenant.0)
        .bind(from)
        .bind(to)
        .bind(provider_id.unwrap_or(-1))
        .bind(provider_id.is_none())
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        rows.iter().map(Self::charge_row).collect()
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn charges_by_ids_or_keys(
        &self,
        tenant: crate::model::TenantId,
        ids: &[String],
        keys: &[String],
        limit: i64,
    ) -> crate::Result<Vec<crate::audit::StoredCharge>> {
        if ids.is_empty() && keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = B::begin(self, crate::accounts::Scope::Tenant(tenant), false).await?;
        let mut qb: sqlx::QueryBuilder<B::DB> = sqlx::QueryBuilder::new(format!(
            "SELECT {} FROM provider_charge WHERE tenant_id = ",
            crate::audit::CHARGE_COLUMNS
        ));
        qb.push_bind(tenant.0);
        qb.push(" AND (charge_id IN (");
        // An empty IN list is not SQL: the empty string is no charge's id or key.
        let none = [String::new()];
        let ids = if ids.is_empty() { &none[..] } else { ids };
        let keys = if keys.is_empty() { &none[..] } else { keys };
        let mut list = qb.separated(", ");
        for id in ids.iter().take(200) {
            list.push_bind(id.clone());
        }
        qb.push(") OR idempotency_key IN (");
        let mut list = qb.separated(", ");
        for k in keys.iter().take(200) {
            list.push_bind(k.clone());
        }
        // An id may also be what names a charge without being its id: an order id,
        // a PaymentIntent, a refund (see `charge_terms`).
        qb.push(format!(
            ")) UNION SELECT {} FROM provider_charge_term t JOIN provider_charge c \
             ON c.tenant_id = t.tenant_id AND c.provider_id = t.provider_id \
             AND c.charge_id = t.charge_id WHERE t.tenant_id = ",
            crate::audit::charge_columns_of_c()
        ));
        qb.push_bind(tenant.0);
        qb.push(" AND t.term IN (");
        let mut list = qb.separated(", ");
        for id in ids.iter().take(200) {
            list.push_bind(id.clone());
        }
        qb.push(") ORDER BY created, charge_id LIMIT ");
        qb.push_bind(limit.clamp(1, 1000));
        let rows = qb.build().fetch_all(&mut *tx).await?;
        tx.commit().await?;
        rows.iter().map(Self::charge_row).collect()
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn effects_created_between(
        &self,
        tenant: crate::model::TenantId,
        from: f64,
        to: f64,
        now: f64,
    ) -> crate::Result<Vec<crate::model::Effect>> {
        let mut tx = B::begin(self, crate::accounts::Scope::Tenant(tenant), false).await?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {} FROM effect e JOIN source s ON s.id = e.source_id \
             WHERE e.tenant_id = $1 AND e.created_at >= $2 AND e.created_at < $3 \
             ORDER BY e.created_at, e.id",
            crate::rows::EFFECT_COLUMNS
        )))
        .bind(tenant.0)
        .bind(from)
        .bind(to)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        rows.iter()
            .map(|r| crate::rows::effect::<B::DB>(r, now))
            .collect()
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn record_audit_run(
        &self,
        tenant: crate::model::TenantId,
        run: crate::audit::NewAuditRun,
        lease: Option<&crate::model::Lease>,
    ) -> crate::Result<crate::audit::AuditRun> {
        use sqlx::Row;
        // Two appends racing for one seq: the loser's INSERT fails on
        // UNIQUE (tenant_id, seq) and it tries again on top of the winner.
        let mut last_err = None;
        for _ in 0..8 {
            let mut tx = B::begin(self, crate::accounts::Scope::Tenant(tenant), true).await?;
            crate::lease::fence::<B>(&mut tx, lease).await?;
            B::lock_audit_chain(&mut tx, tenant).await?;
            if run.triggered_by == crate::audit::SCHEDULE_AUTHOR && run.status == "complete" {
                let done: Option<i64> = sqlx::query_scalar(
                    "SELECT id FROM audit_run WHERE tenant_id = $1 AND day = $2 \
                     AND provider = $3 AND triggered_by = $4 AND status = 'complete'",
                )
                .bind(tenant.0)
                .bind(&run.day)
                .bind(&run.provider)
                .bind(crate::audit::SCHEDULE_AUTHOR)
                .fetch_optional(&mut *tx)
                .await?;
                if done.is_some() {
                    return Err(crate::LedgerError::Conflict(format!(
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
            let digest = crate::audit::run_digest(tenant.0, seq, &prev_digest, &run);
            let canon = crate::audit::canonical_json;
            let inserted = sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO audit_run (tenant_id, seq, day, time_zone, window_start, \
                 window_end, provider, triggered_by, status, reason, started_at, \
                 finished_at, counts, findings, totals, evidence, prev_digest, digest) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, \
                 $15, $16, $17, $18) RETURNING {}",
                crate::audit::RUN_COLUMNS
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
            match inserted {
                Ok(row) => {
                    let stored = Self::audit_run_row(&row)?;
                    tx.commit().await?;
                    return Ok(stored);
                }
                Err(e) => match crate::LedgerError::from(e) {
                    crate::LedgerError::Conflict(c) => {
                        drop(tx);
                        last_err = Some(crate::LedgerError::Conflict(c));
                    }
                    other => return Err(other),
                },
            }
        }
        Err(last_err.unwrap_or_else(|| crate::LedgerError::Conflict("audit run chain".into())))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn list_audit_runs(
        &self,
        tenant: crate::model::TenantId,
        day: Option<&str>,
        limit: i64,
    ) -> crate::Result<Vec<crate::audit::AuditRun>> {
        let mut tx = B::begin(self, crate::accounts::Scope::Tenant(tenant), false).await?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {} FROM audit_run WHERE tenant_id = $1 AND (day = $2 OR $3) \
             ORDER BY seq DESC LIMIT $4",
            crate::audit::RUN_COLUMNS
        )))
        .bind(tenant.0)
        .bind(day.unwrap_or(""))
        .bind(day.is_none())
        .bind(limit.clamp(1, 1000))
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        rows.iter().map(Self::audit_run_row).collect()
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn get_audit_run(
        &self,
        tenant: crate::model::TenantId,
        id: i64,
    ) -> crate::Result<Option<crate::audit::AuditRun>> {
        let mut tx = B::begin(self, crate::accounts::Scope::Tenant(tenant), false).await?;
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {} FROM audit_run WHERE tenant_id = $1 AND id = $2",
            crate::audit::RUN_COLUMNS
        )))
        .bind(tenant.0)
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        row.as_ref().map(Self::audit_run_row).transpose()
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn audit_chain(
        &self,
        tenant: crate::model::TenantId,
        after_seq: i64,
        limit: i64,
    ) -> crate::Result<Vec<crate::audit::AuditRun>> {
        let mut tx = B::begin(self, crate::accounts::Scope::Tenant(tenant), false).await?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {} FROM audit_run WHERE tenant_id = $1 AND seq > $2 \
             ORDER BY seq LIMIT $3",
            crate::audit::RUN_COLUMNS
        )))
        .bind(tenant.0)
        .bind(after_seq)
        .bind(limit.clamp(1, 10_000))
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        rows.iter().map(Self::audit_run_row).collect()
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn scheduled_audit_done(
        &self,
        tenant: crate::model::TenantId,
        day: &str,
        provider: &str,
    ) -> crate::Result<bool> {
        let mut tx = B::begin(self, crate::accounts::Scope::Tenant(tenant), false).await?;
        let done: Option<i64> = sqlx::query_scalar(
            "SELECT id FROM audit_run WHERE tenant_id = $1 AND day = $2 \
             AND provider = $3 AND triggered_by = $4 AND status = 'complete'",
        )
        .bind(tenant.0)
        .bind(day)
        .bind(provider)
        .bind(crate::audit::SCHEDULE_AUTHOR)
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.is_some())
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn audit_metric(
        &self,
        tenant: crate::model::TenantId,
    ) -> crate::Result<Option<crate::audit::AuditMetric>> {
        use sqlx::Row;
        let mut tx = B::begin(self, crate::accounts::Scope::Tenant(tenant), false).await?;
        let row = sqlx::query(
            "SELECT finished_at, counts FROM audit_run WHERE tenant_id = $1 \
             AND status IN ('complete', 'partial') ORDER BY seq DESC LIMIT 1",
        )
        .bind(tenant.0)
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        let Some(row) = row else { return Ok(None) };
        let counts = crate::audit::parse_json("counts", &row.try_get::<String, _>(1)?)?;
        Ok(Some(crate::audit::AuditMetric {
            finished_at: row.try_get(0)?,
            findings: crate::audit::finding_counts_of(&counts),
        }))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn audit_links(
        &self,
        tenant: crate::model::TenantId,
    ) -> crate::Result<Vec<crate::audit::ChainLink>> {
        use sqlx::Row;
        let mut tx = B::begin(self, crate::accounts::Scope::Tenant(tenant), false).await?;
        let rows = sqlx::query(
            "SELECT id, seq, prev_digest, digest FROM audit_run WHERE tenant_id = $1 \
             ORDER BY seq",
        )
        .bind(tenant.0)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        rows.iter()
            .map(|r| {
                Ok(crate::audit::ChainLink {
                    id: r.try_get("id")?,
                    seq: r.try_get("seq")?,
                    prev_digest: r.try_get("prev_digest")?,
                    digest: r.try_get("digest")?,
                })
            })
            .collect()
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn audit_glance(
        &self,
        tenant: crate::model::TenantId,
        day: &str,
    ) -> crate::Result<Option<crate::audit::AuditGlance>> {
        use sqlx::Row;
        let mut tx = B::begin(self, crate::accounts::Scope::Tenant(tenant), false).await?;
        // The `audit_run_day` index; a day holds a handful of runs. The newest run
        // with findings (complete, or partial: the working providers' part), else
        // the newest run at all.
        let best = sqlx::query(
            "SELECT id, day, provider, status, reason, finished_at, counts FROM audit_run \
             WHERE tenant_id = $1 AND day = $2 AND status IN ('complete', 'partial') \
             ORDER BY seq DESC LIMIT 1",
        )
        .bind(tenant.0)
        .bind(day)
        .fetch_optional(&mut *tx)
        .await?;
        let newest = sqlx::query(
            "SELECT id, day, provider, status, reason, finished_at, counts FROM audit_run \
             WHERE tenant_id = $1 AND day = $2 ORDER BY seq DESC LIMIT 1",
        )
        .bind(tenant.0)
        .bind(day)
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        let Some(newest) = newest else {
            return Ok(None);
        };
        let failure = if newest.try_get::<String, _>("status")? == "complete" {
            None
        } else {
            Some((
                newest
                    .try_get::<Option<String>, _>("reason")?
                    .unwrap_or_else(|| "failed".into()),
                newest.try_get::<f64, _>("finished_at")?,
            ))
        };
        let row = best.unwrap_or(newest);
        let counts = crate::audit::parse_json("counts", &row.try_get::<String, _>("counts")?)?;
        Ok(Some(crate::audit::AuditGlance {
            id: row.try_get("id")?,
            day: row.try_get("day")?,
            provider: row.try_get("provider")?,
            status: row.try_get("status")?,
            reason: row.try_get("reason")?,
            finished_at: row.try_get("finished_at")?,
            findings: crate::audit::finding_counts_of(&counts),
            failure,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(id: i64, seq: i64, prev: &str, digest: &str) -> ChainLink {
        ChainLink {
            id,
            seq,
            prev_digest: prev.into(),
            digest: digest.into(),
        }
    }

    #[test]
    fn links_break_where_a_run_was_removed_or_relinked() {
        let chain = [
            link(1, 1, "", "a"),
            link(2, 2, "a", "b"),
            link(3, 3, "b", "c"),
        ];
        assert!(verify_links(&chain).is_empty());
        // The middle run removed: the third is out of place and names a digest not before it.
        let removed = [chain[0].clone(), chain[2].clone()];
        let breaks = verify_links(&removed);
        assert_eq!(breaks.len(), 2, "{breaks:?}");
        assert!(breaks.iter().all(|b| b.id == 3));
        // A run relinked to another predecessor.
        let relinked = [chain[0].clone(), link(2, 2, "x", "b"), chain[2].clone()];
        let breaks = verify_links(&relinked);
        assert_eq!(breaks.iter().map(|b| b.id).collect::<Vec<_>>(), [2]);
    }
}
