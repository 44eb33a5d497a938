//! An audit run as stored, and the chain that makes its history tamper-evident.
//!
//! Every run of a tenant has `seq` (1, 2, ...) and `digest` = SHA-256 over a fixed prefix,
//! the tenant, the run's place, the previous run's digest, and the canonical encoding (JSON
//! with keys sorted at every level, no whitespace) of the run's content. Editing any stored
//! field of a run, or removing a run, breaks [`verify_chain`] from that run on. The content
//! is kept as the JSON that was digested, so a run verifies whatever version reads it; the
//! typed readers ([`AuditRun::findings`], [`AuditRun::totals`], [`AuditRun::counts`]) are
//! for showing it.

use crate::{CurrencyTotals, Finding, FindingKind};
use reckon_domain::Redactor;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

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
pub fn verify_content(tenant: i64, r: &AuditRun) -> Option<ChainBreak> {
    (run_digest(tenant, r.seq, &r.prev_digest, &r.run) != r.digest).then(|| ChainBreak {
        id: r.id,
        seq: r.seq,
        reason: "its content does not match its digest (the run was edited)".into(),
    })
}

/// Check a tenant's runs, in `seq` order from the first: every seq follows the previous,
/// every `prev_digest` is the previous run's digest, and every digest is recomputed from
/// the stored content. Returns every break (empty: the chain is intact).
pub fn verify_chain(tenant: i64, runs: &[AuditRun]) -> Vec<ChainBreak> {
    let links: Vec<ChainLink> = runs.iter().map(AuditRun::link).collect();
    let mut out = verify_links(&links);
    out.extend(runs.iter().filter_map(|r| verify_content(tenant, r)));
    // Run by run, in chain order (a stable sort keeps each run's own order of breaks).
    out.sort_by_key(|b| b.seq);
    out
}

/// Which of a day's runs is "the audit of that day", on every surface that shows one day
/// (the overview, the audit page and its CSV, the API's day, support's lookup, the
/// findings gauges): the day's newest `complete` run; when none completed, its newest
/// `partial` run (the findings of the providers read whole); else its newest run (failed,
/// with its reason). A newer run that did better than nothing never hides a complete one:
/// a person's re-run that lost a provider half-way does not take the day's findings away.
/// `runs` in any order; `status` and `seq` read each.
pub fn run_of_the_day<R>(
    runs: &[R],
    status: impl Fn(&R) -> &str,
    seq: impl Fn(&R) -> i64,
) -> Option<&R> {
    let rank = |r: &R| match status(r) {
        "complete" => 2,
        "partial" => 1,
        _ => 0,
    };
    runs.iter().max_by_key(|r| (rank(r), seq(r)))
}

/// A stored run as [`failing_audits`] reads it: what it was asked to read, how it ended,
/// and how each provider's part ended (`None` for a complete run: every part complete).
#[derive(Debug, Clone, PartialEq)]
pub struct AuditRunHead {
    /// A provider name, or [`ALL_PROVIDERS`].
    pub provider: String,
    pub status: String,
    /// (provider, `complete` | `failed`) per provider the run reached; empty when it reached
    /// none (it failed before listing any).
    pub parts: Option<Vec<(String, String)>>,
}

/// Whether the tenant's audit is failing now, per provider of `providers` and for
/// [`ALL_PROVIDERS`] (a run of every provider that reached none): the newest run that read
/// a provider decides for it (its part failed, or it completed), so the state is the
/// stored runs' and holds until a later run reads that provider whole, whoever ran it and
/// whenever the process started. A provider no run in `heads` read is not failing.
/// `heads` newest first.
pub fn failing_audits(heads: &[AuditRunHead], providers: &[String]) -> BTreeMap<String, bool> {
    // The first (newest) say about a name stands; names not reported are ignored.
    fn decide(out: &mut BTreeMap<String, Option<bool>>, name: &str, failed: bool) {
        if let Some(v) = out.get_mut(name)
            && v.is_none()
        {
            *v = Some(failed);
        }
    }
    let mut out: BTreeMap<String, Option<bool>> = providers
        .iter()
        .map(|p| (p.clone(), None))
        .chain([(ALL_PROVIDERS.to_owned(), None)])
        .collect();
    for h in heads {
        let every = h.provider == ALL_PROVIDERS;
        match (&h.parts, h.status.as_str()) {
            // Complete: every provider it read was read whole.
            (None, _) | (_, "complete") => {
                if every {
                    for p in providers {
                        decide(&mut out, p, false);
                    }
                    decide(&mut out, ALL_PROVIDERS, false);
                } else {
                    decide(&mut out, &h.provider, false);
                }
            }
            (Some(parts), _) if parts.is_empty() => decide(&mut out, &h.provider, true),
            (Some(parts), _) => {
                for (name, status) in parts {
                    decide(&mut out, name, status != "complete");
                }
                if every {
                    decide(&mut out, ALL_PROVIDERS, false);
                }
            }
        }
        if out.values().all(Option::is_some) {
            break;
        }
    }
    out.into_iter()
        .map(|(k, v)| (k, v.unwrap_or(false)))
        .collect()
}

/// Per-tenant audit figures for metrics: the newest day's run (see [`run_of_the_day`]).
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

/// Finding kind -> count from a run's `counts`.
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

/// A run's content scrubbed, or `None` when it held nothing to remove.
pub fn run_content(r: &Redactor, run: &NewAuditRun) -> Option<NewAuditRun> {
    let mut out = run.clone();
    out.reason = run.reason.as_deref().map(|s| r.text(s));
    for v in [
        &mut out.counts,
        &mut out.findings,
        &mut out.totals,
        &mut out.evidence,
    ] {
        r.json(v);
    }
    (out != *run).then_some(out)
}

/// Walks a chain in seq order, run by run, so that no more than a page of runs is held.
/// `verify` is the first pass (nothing written); `relink` the second.
#[derive(Debug, Default)]
pub struct ChainWalk {
    expected_seq: i64,
    prev_stored: String,
    prev_new: String,
    pub broken: Vec<i64>,
}

/// What the second pass does to one run.
#[derive(Debug, PartialEq)]
pub struct RunEdit {
    pub id: i64,
    pub run: NewAuditRun,
    pub prev_digest: String,
    pub digest: String,
}

impl ChainWalk {
    pub fn new() -> ChainWalk {
        ChainWalk {
            expected_seq: 1,
            ..ChainWalk::default()
        }
    }

    /// First pass: note every run that does not check out (as `verify_chain` would).
    pub fn verify(&mut self, tenant: i64, r: &AuditRun) {
        let ok = r.seq == self.expected_seq
            && r.prev_digest == self.prev_stored
            && run_digest(tenant, r.seq, &r.prev_digest, &r.run) == r.digest;
        if !ok {
            self.broken.push(r.seq);
        }
        self.expected_seq = r.seq + 1;
        self.prev_stored = r.digest.clone();
    }

    /// Second pass: the run as it is to be stored, or `None` when it stays as it is. A
    /// broken chain only has its content scrubbed; an intact one is re-linked from the
    /// first run whose content changed.
    pub fn relink(
        &mut self,
        tenant: i64,
        r: &AuditRun,
        redactor: &Redactor,
        intact: bool,
    ) -> Option<RunEdit> {
        let scrubbed = run_content(redactor, &r.run);
        if !intact {
            return scrubbed.map(|run| RunEdit {
                id: r.id,
                run,
                prev_digest: r.prev_digest.clone(),
                digest: r.digest.clone(),
            });
        }
        let content_changed = scrubbed.is_some();
        let run = scrubbed.unwrap_or_else(|| r.run.clone());
        let prev = std::mem::take(&mut self.prev_new);
        if !content_changed && prev == r.prev_digest {
            self.prev_new = r.digest.clone();
            return None;
        }
        let digest = run_digest(tenant, r.seq, &prev, &run);
        self.prev_new = digest.clone();
        Some(RunEdit {
            id: r.id,
            run,
            prev_digest: prev,
            digest,
        })
    }
}

impl AuditRun {
    pub fn link(&self) -> ChainLink {
        ChainLink {
            id: self.id,
            seq: self.seq,
            prev_digest: self.prev_digest.clone(),
            digest: self.digest.clone(),
        }
    }

    /// The findings, typed. A run stored by a newer version may name a kind this one does
    /// not know ([`FindingKind::Other`]).
    pub fn findings(&self) -> Result<Vec<Finding>, serde_json::Error> {
        Vec::<Finding>::deserialize(&self.run.findings)
    }

    pub fn totals(&self) -> Result<Vec<CurrencyTotals>, serde_json::Error> {
        Vec::<CurrencyTotals>::deserialize(&self.run.totals)
    }

    pub fn counts(&self) -> Result<RunCounts, serde_json::Error> {
        RunCounts::deserialize(&self.run.counts)
    }

    /// The providers whose part of the run failed, with why (from the run's evidence).
    pub fn failed_parts(&self) -> Vec<(String, String)> {
        // Fields a part may lack or hold as null read as empty, as the page shows them.
        #[derive(Deserialize)]
        struct Part {
            name: Option<String>,
            status: Option<String>,
            reason: Option<String>,
        }
        let parts = self
            .run
            .evidence
            .get("providers")
            .cloned()
            .unwrap_or(Value::Null);
        Vec::<Part>::deserialize(parts)
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p.status.as_deref() == Some("failed"))
            .map(|p| (p.name.unwrap_or_default(), p.reason.unwrap_or_default()))
            .collect()
    }
}

/// A run's counts: per finding kind, and the day's sizes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunCounts {
    pub findings: BTreeMap<FindingKind, i64>,
    pub effects_in_day: i64,
    pub charges_in_day: i64,
    pub matches: i64,
    pub charges_imported: i64,
}

/// Why audit settings are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuditSettingsError {
    #[error("audit time {0:?} (use HH:MM, 24-hour, local to the tenant's zone)")]
    Time(String),
    /// Empty, or longer than any zone name.
    #[error("time zone")]
    Zone,
}

impl AuditSettings {
    /// `audit_time` is `HH:MM` (24-hour) and the zone a plausible name (the audit crate's
    /// [`crate::DayWindow`] resolves it).
    pub fn check(&self) -> Result<(), AuditSettingsError> {
        let t = self.audit_time.as_bytes();
        let ok = t.len() == 5
            && t[2] == b':'
            && self
                .audit_time
                .get(..2)
                .and_then(|h| h.parse::<u8>().ok())
                .is_some_and(|h| h < 24)
            && self
                .audit_time
                .get(3..)
                .and_then(|m| m.parse::<u8>().ok())
                .is_some_and(|m| m < 60);
        if !ok {
            return Err(AuditSettingsError::Time(self.audit_time.clone()));
        }
        if self.time_zone.is_empty() || self.time_zone.len() > 64 {
            return Err(AuditSettingsError::Zone);
        }
        Ok(())
    }
}
