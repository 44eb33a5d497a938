//! Credentials that versions without a redactor stored from providers' answers, removed:
//! the [`Redactor`] with the tenant's own provider secrets, applied to what is already
//! stored, once, at the first migrate that finds the job pending (a tenant whose secrets do
//! not open under the master key leaves it pending).
//!
//! A scrubbed audit run gets a new digest and every later run a new link; the tenant's audit
//! log names the previous and the new head. A chain that did not verify before is not
//! re-linked (that would hide the break): its runs are scrubbed in place and the log line
//! names the runs that were broken before.

use crate::driver::{Driver, RowsAffected, SqlLedger, sql};
use crate::model::TenantId;
use crate::scope::Scope;
use crate::{Result, Tenants};
use macro_rules_attribute::apply;
use reckon_audit::chain::{ChainWalk, run_content};
use reckon_domain::Redactor;
use reckon_domain::time;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// The name of the job in `pending_backfill`.
pub(crate) const JOB: &str = "scrub_provider_answers";

/// The audit log's `action` of the line a scrub that changed anything writes.
pub const SCRUB_ACTION: &str = "ledger.scrub";

/// A table with a single integer key, and the columns of it that hold provider text.
pub(crate) type Keyed = (&'static str, &'static str, &'static [(&'static str, Kind)]);

pub(crate) const KEYED: &[Keyed] = &[
    (
        "reconcile_attempt",
        "id",
        &[("error", Kind::Text), ("evidence", Kind::Json)],
    ),
    (
        "reconcile_state",
        "effect_id",
        &[("last_error", Kind::Text)],
    ),
    ("resolution", "id", &[("evidence", Kind::Json)]),
    (
        "resolution_retracted",
        "id",
        &[("evidence", Kind::Json), ("reason", Kind::Text)],
    ),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Text,
    Json,
}

/// What the scrub changed in one tenant: the audit log line's detail.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ScrubReport {
    /// Rows rewritten, per table.
    pub rows: BTreeMap<String, u64>,
    /// Search terms that held a credential, dropped.
    pub terms_dropped: u64,
    /// The first run re-linked, when the chain was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rechained_from_seq: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_head: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new_head: Option<String>,
    /// Runs that did not verify before the scrub (the chain was then left as it was).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub broken_before: Vec<i64>,
}

impl ScrubReport {
    pub fn changed(&self) -> bool {
        !self.rows.is_empty() || self.terms_dropped > 0
    }

    pub(crate) fn count(&mut self, table: &str) {
        *self.rows.entry(table.to_owned()).or_default() += 1;
    }
}

/// The stored column scrubbed, or `None` when it held nothing to remove. JSON is scrubbed
/// value by value (a credential as an object key too) and written back compact; text that
/// does not parse as JSON is scrubbed as text.
pub(crate) fn column(r: &Redactor, kind: Kind, stored: &str) -> Option<String> {
    if kind == Kind::Json
        && let Ok(mut v) = serde_json::from_str::<Value>(stored)
    {
        let before = v.clone();
        r.json(&mut v);
        return (v != before).then(|| v.to_string());
    }
    let t = r.text(stored);
    (t != stored).then_some(t)
}

/// The scrub uses the audit's row readers and term writer, and the chain's lock.
#[apply(sql!)]
impl<B: Driver> SqlLedger<B> {
    /// Run the scrub if it is pending, tenant by tenant; strike it off when every
    /// tenant is done.
    pub(crate) async fn scrub_pending(&self) -> Result<()> {
        let pending: Option<String> =
            sqlx::query_scalar("SELECT name FROM pending_backfill WHERE name = $1")
                .bind(crate::scrub::JOB)
                .fetch_optional(&self.pool)
                .await?;
        if pending.is_none() {
            return Ok(());
        }
        for tenant in self.list_tenants().await? {
            let Some(redactor) = self.scrub_redactor(tenant.id).await? else {
                tracing::warn!(
                    tenant = %tenant.slug,
                    "stored provider answers not scrubbed yet: a provider secret \
                     does not open under this master key (the job stays pending)"
                );
                return Ok(());
            };
            let report = self.scrub_tenant(tenant.id, &redactor).await?;
            if report.changed() {
                tracing::info!(tenant = %tenant.slug, ?report, "scrubbed stored provider answers");
            }
        }
        sqlx::query("DELETE FROM pending_backfill WHERE name = $1")
            .bind(crate::scrub::JOB)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The tenant's provider secrets and the common credential shapes; `None` when a
    /// secret does not open.
    pub(crate) async fn scrub_redactor(
        &self,
        tenant: TenantId,
    ) -> Result<Option<reckon_domain::Redactor>> {
        use sqlx::Row;
        let stmt = sqlx::query(
            "SELECT name, secret_ciphertext FROM provider \
             WHERE tenant_id = $1 AND secret_ciphertext IS NOT NULL",
        )
        .bind(tenant.0);
        let rows = self.read_all(Scope::Tenant(tenant), stmt).await?;
        let mut secrets = Vec::new();
        for row in rows {
            let name: String = row.try_get(0)?;
            let sealed: Vec<u8> = row.try_get(1)?;
            let aad = crate::providers::provider_secret_aad(tenant.0, &name);
            let Some(clear) = self.keyring.open(&aad, &sealed) else {
                return Ok(None);
            };
            match String::from_utf8(clear) {
                Ok(s) => secrets.push(s),
                Err(_) => return Ok(None),
            }
        }
        Ok(Some(reckon_domain::Redactor::new(secrets)))
    }

    /// Scrub one tenant's stored provider answers with `redactor`.
    pub(crate) async fn scrub_tenant(
        &self,
        tenant: TenantId,
        redactor: &reckon_domain::Redactor,
    ) -> Result<crate::scrub::ScrubReport> {
        use sqlx::Row;
        let mut report = crate::scrub::ScrubReport::default();
        let scope = || Scope::Tenant(tenant);

        // Rows keyed by one integer: a page per transaction (each row's rewrite
        // stands on its own, and scrubbing twice changes nothing).
        for (table, key, cols) in crate::scrub::KEYED {
            let names: Vec<&str> = cols.iter().map(|(c, _)| *c).collect();
            let select = format!(
                "SELECT {key}, {} FROM {table} WHERE tenant_id = $1 AND {key} > $2 \
                 ORDER BY {key} LIMIT 500",
                names.join(", ")
            );
            let mut after = i64::MIN;
            loop {
                let mut tx = B::begin(self, scope(), true).await?;
                let rows = sqlx::query(sqlx::AssertSqlSafe(select.clone()))
                    .bind(tenant.0)
                    .bind(after)
                    .fetch_all(&mut *tx)
                    .await?;
                let Some(last) = rows.last() else {
                    tx.commit().await?;
                    break;
                };
                after = last.try_get(0)?;
                for row in &rows {
                    let id: i64 = row.try_get(0)?;
                    let mut sets = Vec::new();
                    for (i, (col, kind)) in cols.iter().enumerate() {
                        let stored: Option<String> = row.try_get(i + 1)?;
                        if let Some(new) = stored
                            .as_deref()
                            .and_then(|s| crate::scrub::column(redactor, *kind, s))
                        {
                            sets.push((*col, new));
                        }
                    }
                    if sets.is_empty() {
                        continue;
                    }
                    let mut qb: sqlx::QueryBuilder<B::DB> =
                        sqlx::QueryBuilder::new(format!("UPDATE {table} SET "));
                    let mut list = qb.separated(", ");
                    for (col, new) in sets {
                        list.push(format!("{col} = "));
                        list.push_bind_unseparated(new);
                    }
                    qb.push(" WHERE tenant_id = ");
                    qb.push_bind(tenant.0);
                    qb.push(format!(" AND {key} = "));
                    qb.push_bind(id);
                    qb.build().execute(&mut *tx).await?;
                    report.count(table);
                }
                tx.commit().await?;
            }
        }

        // Imported charges: their evidence, metadata and refunds, then their search
        // terms written again from what is now stored.
        let mut after: (i64, String) = (i64::MIN, String::new());
        loop {
            let mut tx = B::begin(self, scope(), true).await?;
            let charges = Self::charge_page(&mut tx, tenant, &after).await?;
            let Some(last) = charges.last() else {
                tx.commit().await?;
                break;
            };
            after = (last.provider_id, last.charge_id.clone());
            let mut changed = Vec::new();
            for mut c in charges {
                let before = (c.raw.clone(), c.metadata.clone(), c.refunds.clone());
                redactor.json(&mut c.raw);
                redactor.json(&mut c.metadata);
                redactor.json(&mut c.refunds);
                if (&c.raw, &c.metadata, &c.refunds) == (&before.0, &before.1, &before.2) {
                    continue;
                }
                sqlx::query(
                    "UPDATE provider_charge SET raw = $1, metadata = $2, refunds = $3 \
                     WHERE tenant_id = $4 AND provider_id = $5 AND charge_id = $6",
                )
                .bind(c.raw.to_string())
                .bind(c.metadata.to_string())
                .bind(c.refunds.to_string())
                .bind(tenant.0)
                .bind(c.provider_id)
                .bind(&c.charge_id)
                .execute(&mut *tx)
                .await?;
                report.count("provider_charge");
                changed.push(c);
            }
            if !changed.is_empty() {
                Self::write_charge_terms(&mut tx, tenant, &changed).await?;
            }
            tx.commit().await?;
        }
        // A term of a charge whose stored text was clean but whose term was not (a
        // term is at most a value, so this only catches a whole secret).
        {
            let mut tx = B::begin(self, scope(), true).await?;
            let terms: Vec<String> = sqlx::query_scalar(
                "SELECT DISTINCT term FROM provider_charge_term WHERE tenant_id = $1",
            )
            .bind(tenant.0)
            .fetch_all(&mut *tx)
            .await?;
            for term in terms {
                if redactor.text(&term) != term {
                    let n = sqlx::query(
                        "DELETE FROM provider_charge_term WHERE tenant_id = $1 AND term = $2",
                    )
                    .bind(tenant.0)
                    .bind(&term)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                    report.terms_dropped += n;
                }
            }
            tx.commit().await?;
        }

        // The audit chain, whole, in one transaction that holds the chain's lock.
        let mut tx = B::begin(self, scope(), true).await?;
        B::lock_audit_chain(&mut tx, tenant).await?;
        let page = |after_seq: i64| {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "SELECT {} FROM audit_run WHERE tenant_id = $1 AND seq > $2 \
                 ORDER BY seq LIMIT 20",
                crate::audit::RUN_COLUMNS
            )))
            .bind(tenant.0)
            .bind(after_seq)
        };
        let mut walk = ChainWalk::new();
        let mut needs_scrub = false;
        let mut head: Option<String> = None;
        let mut after_seq = i64::MIN;
        loop {
            let rows = page(after_seq).fetch_all(&mut *tx).await?;
            let Some(last) = rows.last() else { break };
            after_seq = last.try_get("seq")?;
            for row in &rows {
                let run = Self::audit_run_row(row)?;
                walk.verify(tenant.get(), &run);
                needs_scrub |= run_content(redactor, &run.run).is_some();
                head = Some(run.digest);
            }
        }
        if needs_scrub {
            let intact = walk.broken.is_empty();
            report.broken_before = std::mem::take(&mut walk.broken);
            let mut after_seq = i64::MIN;
            loop {
                let rows = page(after_seq).fetch_all(&mut *tx).await?;
                let Some(last) = rows.last() else { break };
                after_seq = last.try_get("seq")?;
                for row in &rows {
                    let run = Self::audit_run_row(row)?;
                    let Some(edit) = walk.relink(tenant.get(), &run, redactor, intact) else {
                        continue;
                    };
                    if intact && report.rechained_from_seq.is_none() {
                        report.rechained_from_seq = Some(run.seq);
                    }
                    let canon = crate::audit::canonical_json;
                    sqlx::query(
                        "UPDATE audit_run SET reason = $1, counts = $2, findings = $3, \
                         totals = $4, evidence = $5, prev_digest = $6, digest = $7 \
                         WHERE tenant_id = $8 AND id = $9",
                    )
                    .bind(&edit.run.reason)
                    .bind(canon(&edit.run.counts))
                    .bind(canon(&edit.run.findings))
                    .bind(canon(&edit.run.totals))
                    .bind(canon(&edit.run.evidence))
                    .bind(&edit.prev_digest)
                    .bind(&edit.digest)
                    .bind(tenant.0)
                    .bind(edit.id)
                    .execute(&mut *tx)
                    .await?;
                    report.count("audit_run");
                    if intact {
                        report.new_head = Some(edit.digest.clone());
                    }
                }
            }
            if report.new_head.is_some() {
                report.previous_head = head;
            }
        }
        if report.changed() {
            let detail = serde_json::to_value(&report).unwrap_or_default();
            sqlx::query(
                "INSERT INTO audit_log (tenant_id, at, actor, action, target, detail, address) \
                 VALUES ($1, $2, 'reckon', $3, NULL, $4, NULL)",
            )
            .bind(tenant.0)
            .bind(time::now())
            .bind(crate::scrub::SCRUB_ACTION)
            .bind(detail.to_string())
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "rk_live_51HxYzAbCdEf";

    #[test]
    fn a_clean_column_is_left_as_stored() {
        let r = Redactor::new([KEY]);
        assert_eq!(column(&r, Kind::Json, r#"{"b":1,"a":"x"}"#), None);
        assert_eq!(column(&r, Kind::Text, "timeout"), None);
        assert_eq!(
            column(
                &r,
                Kind::Json,
                &format!(r#"{{"{KEY}":"Bearer abcdefgh1234"}}"#)
            )
            .as_deref(),
            Some(r#"{"[redacted]":"Bearer [redacted]"}"#)
        );
        assert_eq!(
            column(&r, Kind::Json, &format!("not json {KEY}")).as_deref(),
            Some("not json [redacted]")
        );
    }
}
