//! "What happened to order X?", answered once for every surface.
//!
//! Support asks with whatever the customer quoted: a whole key, an order id (a part of a
//! key), or a provider object id (`ch_…`, `pi_…`, `re_…`). [`answer`] reads what reckon knows
//! about it — each effect as the application recorded it, reckon's verdict with its
//! finality and evidence, a person's resolution with who and why, the audit findings that
//! name it, and the provider charges the audit imported — and decides one plain sentence per
//! effect from all of it. The dashboard, `GET /api/v1/lookup` and `reckon lookup` only render
//! an [`Answer`]; none of them judges.
//!
//! The order of judgement, first match wins, is the order of certainty:
//! 1. a person's resolution, then reckon's own final verdict;
//! 2. the audit's findings and the imported charges (money the provider listed);
//! 3. a provisional or pending verdict (re-checked);
//! 4. nobody knows yet (with why, and when reckon looks next, or that a person must);
//! 5. what the application recorded, when nothing above doubts it.

use std::collections::{HashMap, HashSet};

use jiff::tz::TimeZone;
use reckon_domain::{Outcome, State, UnresolvedKind};
use reckon_ledger::{
    AuditRun, Effect, Ledger, LedgerError, ReconcileView, Route, StoredCharge, TenantId,
};
use serde::Serialize;
use serde_json::Value;

/// At most this many effects answer one search (an order has a handful; a subject shared by
/// thousands is a search for the queue, not for support).
pub const LOOKUP_LIMIT: usize = 50;
/// Longest search text accepted.
pub const MAX_QUERY_CHARS: usize = 512;

/// A moment as every surface shows it: epoch seconds, RFC 3339 in UTC, and words in the
/// tenant's time zone ("28 Nov 2026 14:02 CET").
#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub struct Moment {
    pub epoch: f64,
    pub rfc3339: String,
    pub text: String,
}

impl Moment {
    pub fn new(epoch: f64, tz: &TimeZone) -> Moment {
        match jiff::Timestamp::from_second(epoch.floor() as i64) {
            Ok(ts) => Moment {
                epoch,
                rfc3339: ts.to_string(),
                text: ts
                    .to_zoned(tz.clone())
                    .strftime("%d %b %Y %H:%M %Z")
                    .to_string(),
            },
            Err(_) => Moment {
                epoch,
                rfc3339: String::new(),
                text: format!("{epoch}"),
            },
        }
    }
}

/// How an answer was found.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MatchedBy {
    /// The whole key, a subject or a part of a key (an order id).
    Key,
    /// A provider object id: a charge, a PaymentIntent, a refund, or a term of a charge's
    /// metadata.
    ProviderObject,
    Nothing,
}

/// What reckon says happened to one effect.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Happened once (money moved once, or the application recorded success undoubted).
    Applied,
    /// Happened more than once: a double charge.
    Duplicate,
    /// Did not happen.
    NotApplied,
    /// A payment exists but has not settled either way.
    Pending,
    /// The application says it succeeded; the provider's complete list of the day has no
    /// charge for it.
    Missing,
    /// Nobody knows yet.
    Unknown,
    /// A worker holds it right now (its claim has not run out).
    InProgress,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Applied => "applied",
            Verdict::Duplicate => "duplicate",
            Verdict::NotApplied => "not_applied",
            Verdict::Pending => "pending",
            Verdict::Missing => "missing",
            Verdict::Unknown => "unknown",
            Verdict::InProgress => "in_progress",
        }
    }
}

/// Who the verdict is from.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum VerdictBy {
    /// A person resolved it by hand.
    Person,
    /// reckon's reconciler asked the provider.
    Reconciler,
    /// The audit: the provider's own list of the day's charges.
    Audit,
    /// The application's own record, undoubted.
    Application,
    /// No one yet.
    Nobody,
}

/// The application's own record of an effect.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Recorded {
    #[schema(value_type = reckon_domain::State)]
    pub state: &'static str,
    pub attempts: i64,
    pub created: Moment,
    pub updated: Moment,
    /// `unknown` or `abandoned` while nobody knows the outcome.
    #[schema(required = true, value_type = Option<reckon_domain::UnresolvedKind>)]
    pub unresolved: Option<&'static str>,
    #[schema(required = true)]
    pub unresolved_since: Option<Moment>,
    /// The source row is gone (swept or deleted); reckon keeps its copy.
    #[schema(required = true)]
    pub gone: Option<Moment>,
}

/// A person's or the reconciler's resolution.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ResolutionFact {
    pub outcome: Outcome,
    /// The person's email, or `reconciler`.
    pub author: String,
    pub by_person: bool,
    #[schema(required = true)]
    pub note: Option<String>,
    pub at: Moment,
    pub evidence: Value,
}

/// The reconciler's standing on an effect not resolved yet.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct LookupState {
    pub lookups: i64,
    #[schema(required = true)]
    pub last_outcome: Option<Outcome>,
    /// The last outcome is not final (a provisional `applied`, a pending payment).
    pub provisional: bool,
    #[schema(required = true)]
    pub last_error: Option<String>,
    /// reckon gave up asking: a person must check.
    pub needs_attention: bool,
    /// When reckon asks next; `None` when it will not (resolved, unrouted, given up).
    #[schema(required = true)]
    pub next_lookup: Option<Moment>,
    /// The last lookup's evidence (the provider's objects as read).
    #[schema(required = true)]
    pub evidence: Option<Value>,
}

/// A finding of a stored audit run that names this effect or charge.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct FindingFact {
    pub kind: String,
    pub day: String,
    pub run_id: i64,
    pub summary: String,
    #[schema(required = true)]
    pub amount: Option<String>,
}

/// A provider charge the audit imported.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ChargeFact {
    pub id: String,
    pub provider: String,
    #[schema(required = true)]
    pub payment_intent: Option<String>,
    pub amount: String,
    pub amount_minor: i64,
    pub currency: String,
    pub status: String,
    #[schema(required = true)]
    pub refunded: Option<String>,
    #[schema(required = true)]
    pub key: Option<String>,
    pub metadata: Value,
    pub created: Moment,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct EffectAnswer {
    pub source: String,
    pub key: String,
    #[schema(required = true)]
    pub operation: Option<String>,
    #[schema(required = true)]
    pub subject: Option<String>,
    pub verdict: Verdict,
    /// `false` while reckon still re-checks (or nobody knows).
    #[serde(rename = "final")]
    pub is_final: bool,
    pub by: VerdictBy,
    /// The plain sentence support reads out.
    pub sentence: String,
    /// A person must look: nothing reckon does will settle it.
    pub needs_person: bool,
    /// The provider that answers for it; `None`: no route, nobody to ask.
    #[schema(required = true)]
    pub provider: Option<String>,
    pub recorded: Recorded,
    #[schema(required = true)]
    pub resolution: Option<ResolutionFact>,
    #[schema(required = true)]
    pub lookup: Option<LookupState>,
    pub findings: Vec<FindingFact>,
    pub charges: Vec<ChargeFact>,
}

/// A charge at the provider that no found effect accounts for.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct OrphanAnswer {
    pub sentence: String,
    pub charge: ChargeFact,
    pub findings: Vec<FindingFact>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[schema(as = LookupAnswer)]
pub struct Answer {
    pub query: String,
    /// Anything at all: an effect or a provider charge.
    pub found: bool,
    pub matched_by: MatchedBy,
    /// Everything in one paragraph: each effect's sentence, then each orphan's.
    pub sentence: String,
    pub effects: Vec<EffectAnswer>,
    pub orphans: Vec<OrphanAnswer>,
    /// Near matches (another case, stray spaces or quotes): offered, never answered.
    pub did_you_mean: Vec<String>,
    /// More effects matched than [`LOOKUP_LIMIT`].
    pub truncated: bool,
}

/// A search refused before it reached the ledger.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// Answer `query` for `tenant` as of `now`, times in `tz`.
pub async fn answer(
    ledger: &dyn Ledger,
    tenant: TenantId,
    query: &str,
    now: f64,
    tz: &TimeZone,
) -> Result<Answer, AnswerError> {
    let q = query.trim();
    if q.is_empty() {
        return Err(AnswerError::Invalid(
            "say what to look up: an order id, a key part, a whole key or a provider object id"
                .into(),
        ));
    }
    if q.chars().count() > MAX_QUERY_CHARS {
        return Err(AnswerError::Invalid(format!(
            "the search is too long (at most {MAX_QUERY_CHARS} characters)"
        )));
    }
    if q.contains('\0') {
        return Err(AnswerError::Invalid(
            "the search holds a NUL byte, which no key or id can".into(),
        ));
    }
    let found = Found::read(ledger, tenant, q).await?;
    if found.effects.is_empty() && found.charges.is_empty() {
        let mut did_you_mean = Vec::new();
        for v in near(q) {
            let f = Found::read(ledger, tenant, &v).await?;
            if !f.effects.is_empty() || !f.charges.is_empty() {
                did_you_mean.push(v);
            }
        }
        let sentence = match did_you_mean.first() {
            Some(v) => format!("Nothing found for “{q}”. Did you mean “{v}”?"),
            None => format!(
                "Nothing found for “{q}”: no effect has this key, order id or key part, and no \
                 provider charge imported by the audit has this id."
            ),
        };
        return Ok(Answer {
            query: q.to_owned(),
            found: false,
            matched_by: MatchedBy::Nothing,
            sentence,
            effects: Vec::new(),
            orphans: Vec::new(),
            did_you_mean,
            truncated: false,
        });
    }
    let matched_by = if found.by_charge {
        MatchedBy::ProviderObject
    } else {
        MatchedBy::Key
    };
    let providers: HashMap<i64, String> = ledger
        .list_providers(tenant)
        .await?
        .into_iter()
        .map(|p| (p.id, p.name))
        .collect();
    let routes = ledger.list_routes(tenant).await?;
    let findings = Findings::read(ledger, tenant, &found, tz).await?;
    let charge_fact = |c: &StoredCharge| charge_fact(c, &providers, tz);

    let mut named: HashSet<(i64, &str)> = HashSet::new();
    let mut effects = Vec::new();
    for e in &found.effects {
        let view = ledger.reconcile_view(tenant, e.id).await?;
        let rid = response_ids(e);
        let mine: Vec<&StoredCharge> = found
            .charges
            .iter()
            .filter(|c| {
                c.idempotency_key.as_deref() == Some(e.key.as_str())
                    || rid.iter().any(|id| id == &c.charge_id)
                    || c.payment_intent
                        .as_deref()
                        .is_some_and(|pi| rid.iter().any(|id| id == pi))
            })
            .collect();
        named.extend(mine.iter().map(|c| (c.provider_id, c.charge_id.as_str())));
        let route = route_of(&routes, e);
        let facts = Facts {
            e,
            view: &view,
            charges: mine.iter().map(|c| charge_fact(c)).collect(),
            findings: findings.of_effect(&e.source, &e.key),
            provider: route.and_then(|r| r.provider.clone()),
            routed: route.is_some_and(|r| r.provider_id.is_some()),
        };
        effects.push(judge(facts, now, tz));
    }
    let orphans: Vec<OrphanAnswer> = found
        .charges
        .iter()
        .filter(|c| !named.contains(&(c.provider_id, c.charge_id.as_str())))
        .map(|c| {
            let fact = charge_fact(c);
            let findings = findings.of_charge(&c.charge_id);
            let audit = findings
                .iter()
                .find(|f| f.kind == "orphan")
                .map(|f| format!(" The audit of {} lists it as an orphan.", f.day))
                .unwrap_or_default();
            let sentence = format!(
                "The provider {} has a charge {} ({}, {}, {}{}) that no effect of the \
                 application accounts for: money taken with no record behind it.{audit}",
                fact.provider,
                fact.id,
                fact.amount,
                fact.status,
                fact.created.text,
                fact.key
                    .as_deref()
                    .map(|k| format!(", made with key {k}"))
                    .unwrap_or_default(),
            );
            OrphanAnswer {
                sentence,
                charge: fact,
                findings,
            }
        })
        .collect();
    let several_ops = {
        let ops: HashSet<Option<&str>> = effects.iter().map(|e| e.operation.as_deref()).collect();
        effects.len() > 1 || ops.len() > 1
    };
    let mut parts: Vec<String> = effects
        .iter()
        .map(|e| {
            if several_ops {
                format!("{}: {}", e.key, e.sentence)
            } else {
                e.sentence.clone()
            }
        })
        .collect();
    parts.extend(orphans.iter().map(|o| o.sentence.clone()));
    Ok(Answer {
        query: q.to_owned(),
        found: true,
        matched_by,
        sentence: parts.join(" "),
        effects,
        orphans,
        did_you_mean: Vec::new(),
        truncated: found.truncated,
    })
}

/// The effects and charges a search names.
struct Found {
    effects: Vec<Effect>,
    charges: Vec<StoredCharge>,
    /// The effects were reached through a provider object, not a key.
    by_charge: bool,
    truncated: bool,
}

impl Found {
    async fn read(ledger: &dyn Ledger, tenant: TenantId, q: &str) -> Result<Found, LedgerError> {
        let limit = LOOKUP_LIMIT as i64 + 1;
        let mut effects = ledger.lookup(tenant, q, limit).await?;
        let mut by_charge = false;
        // The provider's side: charges by the id searched for (or a term naming them: an
        // order id in their key or metadata, a PaymentIntent, a refund), by the ids the
        // effects' responses name, and by the keys the effects were made with.
        let mut ids = vec![q.to_owned()];
        ids.extend(effects.iter().flat_map(response_ids));
        let keys: Vec<String> = effects.iter().map(|e| e.key.clone()).collect();
        let mut charges = ledger
            .charges_by_ids_or_keys(tenant, &ids, &keys, 200)
            .await?;
        // A charge found by what it is called names its effect by the key it was made with.
        if effects.is_empty() && !charges.is_empty() {
            let mut seen: HashSet<String> = HashSet::new();
            for key in charges.iter().filter_map(|c| c.idempotency_key.clone()) {
                if seen.insert(key.clone()) {
                    for e in ledger.lookup(tenant, &key, limit).await? {
                        if e.key == key && !effects.iter().any(|x: &Effect| x.id == e.id) {
                            effects.push(e);
                        }
                    }
                }
            }
            by_charge = !effects.is_empty() || !charges.is_empty();
            if !effects.is_empty() {
                let keys: Vec<String> = effects.iter().map(|e| e.key.clone()).collect();
                let ids: Vec<String> = effects.iter().flat_map(response_ids).collect();
                for c in ledger
                    .charges_by_ids_or_keys(tenant, &ids, &keys, 200)
                    .await?
                {
                    if !charges
                        .iter()
                        .any(|x| x.charge_id == c.charge_id && x.provider_id == c.provider_id)
                    {
                        charges.push(c);
                    }
                }
            }
        }
        charges.sort_by(|a, b| {
            a.created
                .total_cmp(&b.created)
                .then_with(|| a.charge_id.cmp(&b.charge_id))
        });
        let truncated = effects.len() > LOOKUP_LIMIT;
        effects.truncate(LOOKUP_LIMIT);
        Ok(Found {
            effects,
            charges,
            by_charge,
            truncated,
        })
    }
}

/// Spellings of `q` a person may have meant: another case, without stray quotes, `#` or
/// spaces. Each is only offered.
fn near(q: &str) -> Vec<String> {
    let bare = q
        .trim_matches(|c: char| c == '"' || c == '\'' || c == '#' || c.is_whitespace())
        .to_owned();
    let mut out: Vec<String> = Vec::new();
    for v in [
        bare.clone(),
        bare.to_uppercase(),
        bare.to_lowercase(),
        bare.replace(' ', ""),
        bare.to_uppercase().replace(' ', ""),
    ] {
        if !v.is_empty() && v != q && !out.contains(&v) {
            out.push(v);
        }
    }
    out
}

/// The provider objects an effect's recorded response names (`{"id": "ch_…"}`,
/// `{"charge_id": …}`, `{"payment_intent": …}`).
fn response_ids(e: &Effect) -> Vec<String> {
    let Some(v) = e
        .response_json
        .as_deref()
        .and_then(|r| serde_json::from_str::<Value>(r).ok())
    else {
        return Vec::new();
    };
    ["id", "charge_id", "charge", "payment_intent", "refund_id"]
        .iter()
        .filter_map(|f| v.get(f).and_then(Value::as_str).map(str::to_owned))
        .collect()
}

/// The route of an effect: its operation's own, else the source's `*`.
pub fn route_of<'a>(routes: &'a [Route], e: &Effect) -> Option<&'a Route> {
    let op = e.operation.as_deref();
    routes
        .iter()
        .find(|r| r.source == e.source && Some(r.operation.as_str()) == op)
        .or_else(|| {
            routes
                .iter()
                .find(|r| r.source == e.source && r.operation == "*")
        })
}

/// The stored audit findings of the days a search touches: the newest run with findings of
/// each day (a complete run, or the working providers' part of a partial one).
struct Findings {
    runs: Vec<AuditRun>,
}

impl Findings {
    async fn read(
        ledger: &dyn Ledger,
        tenant: TenantId,
        found: &Found,
        tz: &TimeZone,
    ) -> Result<Findings, LedgerError> {
        let mut days: Vec<String> = found
            .effects
            .iter()
            .map(|e| e.created_at)
            .chain(found.charges.iter().map(|c| c.created))
            .filter_map(|t| day_of(t, tz))
            .collect();
        days.sort();
        days.dedup();
        let mut runs = Vec::new();
        for day in days.iter().take(14) {
            // The day's runs at a glance first, then the one read whole: a run of a big day
            // holds megabytes of findings, and a day may have been audited many times.
            let Some(glance) = ledger.audit_glance(tenant, day).await? else {
                continue;
            };
            if (glance.status == "complete" || glance.status == "partial")
                && let Some(run) = ledger.get_audit_run(tenant, glance.id).await?
            {
                runs.push(run);
            }
        }
        Ok(Findings { runs })
    }

    fn matching(&self, hit: impl Fn(&Value) -> bool) -> Vec<FindingFact> {
        let mut out = Vec::new();
        for r in &self.runs {
            for f in r.run.findings.as_array().into_iter().flatten() {
                if hit(f) {
                    out.push(FindingFact {
                        kind: f["kind"].as_str().unwrap_or_default().to_owned(),
                        day: r.run.day.clone(),
                        run_id: r.id,
                        summary: f["summary"].as_str().unwrap_or_default().to_owned(),
                        amount: match (f["amount"].as_i64(), f["currency"].as_str()) {
                            (Some(a), Some(c)) => Some(money(a, c)),
                            _ => None,
                        },
                    });
                }
            }
        }
        out
    }

    fn of_effect(&self, source: &str, key: &str) -> Vec<FindingFact> {
        self.matching(|f| {
            f["effects"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|e| e["source"].as_str() == Some(source) && e["key"].as_str() == Some(key))
        })
    }

    fn of_charge(&self, id: &str) -> Vec<FindingFact> {
        self.matching(|f| {
            f["charges"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["id"].as_str() == Some(id))
        })
    }
}

/// The local day (`YYYY-MM-DD`) of `t` in `tz`, the way audit runs are named.
fn day_of(t: f64, tz: &TimeZone) -> Option<String> {
    let ts = jiff::Timestamp::from_second(t.floor() as i64).ok()?;
    Some(ts.to_zoned(tz.clone()).strftime("%Y-%m-%d").to_string())
}

fn charge_fact(c: &StoredCharge, providers: &HashMap<i64, String>, tz: &TimeZone) -> ChargeFact {
    ChargeFact {
        id: c.charge_id.clone(),
        provider: providers
            .get(&c.provider_id)
            .cloned()
            .unwrap_or_else(|| "a provider".into()),
        payment_intent: c.payment_intent.clone(),
        amount: money(c.amount, &c.currency),
        amount_minor: c.amount,
        currency: c.currency.clone(),
        status: c.status.clone(),
        refunded: (c.amount_refunded > 0).then(|| money(c.amount_refunded, &c.currency)),
        key: c.idempotency_key.clone(),
        metadata: c.metadata.clone(),
        created: Moment::new(c.created, tz),
    }
}

/// An amount in minor units as people read it: `$1,234.00`, `€19.99`, `£5.00`, `¥500`, or
/// `1,234.56 CHF` for currencies without a sign here (zero-decimal currencies have no cents).
pub fn money(minor: i64, currency: &str) -> String {
    let plain = reckon_audit::money(minor, currency);
    let mut it = plain.splitn(2, ' ');
    let number = it.next().unwrap_or_default();
    let code = it.next().unwrap_or_default();
    let (neg, abs) = match number.strip_prefix('-') {
        Some(a) => ("-", a),
        None => ("", number),
    };
    let (int, frac) = match abs.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (abs, None),
    };
    let mut grouped = String::new();
    for (i, ch) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(ch);
    }
    if let Some(f) = frac {
        grouped.push('.');
        grouped.push_str(f);
    }
    let sign = match currency.to_ascii_lowercase().as_str() {
        "usd" => "$",
        "eur" => "€",
        "gbp" => "£",
        "jpy" => "¥",
        _ => return format!("{neg}{grouped} {code}"),
    };
    format!("{neg}{sign}{grouped}")
}

/// A duration in words: "45 s", "12 min", "3 h 5 min", "2 d 4 h".
pub fn age(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min", s / 60),
        3600..86400 => match (s % 3600) / 60 {
            0 => format!("{} h", s / 3600),
            m => format!("{} h {m} min", s / 3600),
        },
        _ => match (s % 86400) / 3600 {
            0 => format!("{} d", s / 86400),
            h => format!("{} d {h} h", s / 86400),
        },
    }
}

/// Everything reckon knows of one effect, before judgement.
struct Facts<'a> {
    e: &'a Effect,
    view: &'a ReconcileView,
    charges: Vec<ChargeFact>,
    findings: Vec<FindingFact>,
    provider: Option<String>,
    routed: bool,
}

fn list_charges(cs: &[&ChargeFact]) -> String {
    cs.iter()
        .map(|c| {
            let mut s = format!("{} {} on {}", c.id, c.amount, c.created.text);
            if let Some(r) = &c.refunded {
                s.push_str(&format!(", refunded {r}"));
            }
            s
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The payments a verdict's evidence names (`classification.payments` of a lookup), as
/// "pi_1 (succeeded, $20.00, refunded $5.00, disputed)".
fn evidence_payments(evidence: &Value) -> String {
    payments_of(evidence)
        .iter()
        .map(EvidencePayment::words)
        .collect::<Vec<_>>()
        .join(", ")
}

/// One payment of a lookup's evidence, as far as the sentences need it.
struct EvidencePayment {
    id: String,
    status: Option<String>,
    moved: bool,
    amount: Option<i64>,
    currency: String,
    refunded: i64,
    disputed: bool,
}

impl EvidencePayment {
    fn amount(&self, minor: i64) -> String {
        money(minor, &self.currency)
    }

    fn fully_refunded(&self) -> bool {
        self.amount.is_some_and(|a| a > 0 && self.refunded >= a)
    }

    fn words(&self) -> String {
        let mut parts: Vec<String> = self.status.iter().cloned().collect();
        if let Some(a) = self.amount {
            parts.push(self.amount(a));
        }
        if self.fully_refunded() {
            parts.push("refunded in full".into());
        } else if self.refunded > 0 {
            parts.push(format!("refunded {}", self.amount(self.refunded)));
        }
        if self.disputed {
            parts.push("disputed".into());
        }
        if parts.is_empty() {
            self.id.clone()
        } else {
            format!("{} ({})", self.id, parts.join(", "))
        }
    }
}

fn payments_of(evidence: &Value) -> Vec<EvidencePayment> {
    let ps = evidence
        .pointer("/classification/payments")
        .or_else(|| evidence.get("payments"))
        .and_then(Value::as_array);
    ps.into_iter()
        .flatten()
        .filter_map(|p| {
            let id = p
                .get("group")
                .or_else(|| p.get("id"))
                .and_then(Value::as_str)?;
            Some(EvidencePayment {
                id: id.to_owned(),
                status: p.get("status").and_then(Value::as_str).map(str::to_owned),
                moved: p.get("money").and_then(Value::as_str) == Some("moved"),
                amount: p.get("amount").and_then(Value::as_i64),
                currency: p
                    .get("currency")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                refunded: p
                    .get("amount_refunded")
                    .and_then(Value::as_i64)
                    .unwrap_or(0),
                disputed: p.get("disputed").and_then(Value::as_bool) == Some(true),
            })
        })
        .collect()
}

/// What holds each pending payment, and what settles it: an authorisation holds the
/// money on the card until it is captured or released (cards: about 7 days); 3-D Secure
/// waits for the customer; a bank debit takes days.
fn pending_words(evidence: &Value) -> String {
    let mut out = String::new();
    for p in payments_of(evidence) {
        let amount = p.amount.map(|a| p.amount(a)).unwrap_or_default();
        let words = match p.status.as_deref() {
            Some("requires_capture" | "authorized") => format!(
                " {} holds {amount} on the customer's card (authorised, not captured): the money \
                 moves only if it is captured; otherwise the hold is released, for cards after \
                 about 7 days. Do not charge again while it holds.",
                p.id
            ),
            Some("requires_action") => format!(
                " {} waits for the customer to finish 3-D Secure ({amount}): it settles when \
                 they do, or fails if they never do; it has not moved money.",
                p.id
            ),
            Some("processing" | "pending") => format!(
                " {} is processing ({amount}): a bank debit can take several days to succeed or \
                 fail.",
                p.id
            ),
            _ => continue,
        };
        out.push_str(&words);
    }
    out
}

/// What to do about a confirmed double charge: refund the extra payment, named, unless it
/// was already refunded in full; a partial refund and a dispute are said.
fn duplicate_advice(evidence: &Value) -> String {
    let moved: Vec<EvidencePayment> = payments_of(evidence)
        .into_iter()
        .filter(|p| p.moved)
        .collect();
    // The first payment is the one the customer meant to make; the others are extra.
    let Some((_, extra)) = moved.split_first() else {
        return "Refund the extra one.".into();
    };
    if extra.is_empty() {
        return "Refund the extra one.".into();
    }
    let open: Vec<&EvidencePayment> = extra.iter().filter(|p| !p.fully_refunded()).collect();
    let mut out = if open.is_empty() {
        format!(
            "The extra payment ({}) was already refunded in full: nothing more to refund.",
            extra
                .iter()
                .map(|p| p.id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    } else {
        format!(
            "Refund the extra one: {}.",
            open.iter()
                .map(|p| match (p.amount, p.refunded) {
                    (Some(a), r) if r > 0 => format!(
                        "{} ({} of {} still charged)",
                        p.id,
                        p.amount(a - r),
                        p.amount(a)
                    ),
                    (Some(a), _) => format!("{} ({})", p.id, p.amount(a)),
                    _ => p.id.clone(),
                })
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    if moved.iter().any(|p| p.disputed) {
        out.push_str(
            " A payment of it is disputed: the bank may return that money to the customer \
             itself, so refund only after the dispute is settled.",
        );
    }
    out
}

fn judge(f: Facts<'_>, now: f64, tz: &TimeZone) -> EffectAnswer {
    let e = f.e;
    let at = |t: f64| Moment::new(t, tz);
    let unresolved = e.unresolved_kind;
    let recorded = Recorded {
        state: e.state.as_str(),
        attempts: e.attempts,
        created: at(e.created_at),
        updated: at(e.updated_at),
        unresolved: unresolved.map(|k| match k {
            UnresolvedKind::Unknown => "unknown",
            UnresolvedKind::Abandoned => "abandoned",
        }),
        unresolved_since: e.unresolved_since.map(at),
        gone: e.gone_at.map(at),
    };
    let resolution = f.view.resolution.as_ref().map(|r| ResolutionFact {
        outcome: r.outcome,
        author: r.author.clone(),
        by_person: r.attempt_id.is_none() && r.author != "reconciler",
        note: r.note.clone(),
        at: at(r.created_at),
        evidence: r.evidence.clone(),
    });
    let last_evidence = f.view.attempts.last().map(|a| a.evidence.clone());
    let lookup = f.view.state.as_ref().map(|s| LookupState {
        lookups: s.attempts,
        last_outcome: s.last_outcome,
        provisional: s.non_final,
        last_error: s.last_error.clone(),
        needs_attention: s.needs_attention && resolution.is_none(),
        next_lookup: (resolution.is_none()
            && unresolved.is_some()
            && f.routed
            && !s.needs_attention)
            .then(|| at(s.next_attempt_at)),
        evidence: last_evidence.clone(),
    });
    let paid: Vec<&ChargeFact> = f
        .charges
        .iter()
        .filter(|c| c.status == "succeeded")
        .collect();
    let finding = |kind: &str| f.findings.iter().find(|x| x.kind == kind);
    let still_says = |rest: &str| {
        if unresolved.is_some() {
            format!(
                "{rest} The application's record still says {}.",
                e.state.as_str()
            )
        } else {
            rest.to_owned()
        }
    };

    let (verdict, is_final, by, sentence, needs_person) = if let Some(r) = &resolution {
        let outcome = match r.outcome {
            Outcome::Applied => Verdict::Applied,
            Outcome::Duplicate => Verdict::Duplicate,
            Outcome::NotApplied => Verdict::NotApplied,
            Outcome::Indeterminate => Verdict::Unknown,
        };
        if r.by_person {
            let note = r
                .note
                .as_deref()
                .map(|n| format!(": “{n}”"))
                .unwrap_or_default();
            (
                outcome,
                true,
                VerdictBy::Person,
                format!(
                    "Resolved by hand as {} by {} on {}{note}.",
                    words(outcome),
                    r.author,
                    r.at.text
                ),
                false,
            )
        } else {
            let payments = evidence_payments(&r.evidence);
            let named = if payments.is_empty() {
                String::new()
            } else {
                format!(" ({payments})")
            };
            let s = match outcome {
                Verdict::Applied => format!(
                    "Charged once: the provider confirms one payment that moved money{named}."
                ),
                Verdict::Duplicate => format!(
                    "Charged more than once: the provider confirms several payments that moved \
                     money{named}. {}",
                    duplicate_advice(&r.evidence)
                ),
                Verdict::NotApplied => format!(
                    "Not charged: the provider's complete answer shows no payment that moved \
                     money{named}. It is safe to try again."
                ),
                _ => format!("Resolved as {} by reckon.", r.outcome),
            };
            // "Not charged" never stands beside money the provider listed for the key: the
            // later finding outranks the verdict, and a person must reconcile the two.
            let against = finding("duplicate")
                .or_else(|| finding("orphan"))
                .or_else(|| finding("charged_not_recorded"))
                .map(|x| format!("the audit of {} found {}", x.day, x.summary));
            if outcome == Verdict::NotApplied && (!paid.is_empty() || against.is_some()) {
                let seen = if paid.is_empty() {
                    against.unwrap_or_default()
                } else {
                    format!("the provider lists {}", list_charges(&paid))
                };
                (
                    Verdict::Unknown,
                    false,
                    VerdictBy::Audit,
                    format!(
                        "Contradicted: reckon's verdict was not charged, but {seen} carrying this \
                         key. Do not try again: a person must check which is right."
                    ),
                    true,
                )
            } else {
                (outcome, true, VerdictBy::Reconciler, still_says(&s), false)
            }
        }
    } else if let Some(d) = finding("duplicate") {
        let mut s = format!(
            "Charged {} (the audit of {} found a duplicate: {}).",
            times(paid.len().max(2)),
            d.day,
            d.summary
        );
        if !paid.is_empty() {
            s = format!(
                "Charged {}: {}. The audit of {} lists it as a duplicate.",
                times(paid.len().max(2)),
                list_charges(&paid),
                d.day
            );
        }
        (Verdict::Duplicate, true, VerdictBy::Audit, s, true)
    } else if paid.len() > 1 {
        (
            Verdict::Duplicate,
            true,
            VerdictBy::Audit,
            format!(
                "Charged {}: {}. {}",
                times(paid.len()),
                list_charges(&paid),
                // A charge refunded in full needs no second refund.
                if paid
                    .iter()
                    .filter(|c| c.refunded.as_deref() == Some(c.amount.as_str()))
                    .count()
                    >= paid.len() - 1
                {
                    "The extra charge was already refunded in full: nothing more to refund."
                } else {
                    "A refund of the extra charge is needed."
                }
            ),
            true,
        )
    } else if let Some(c) = finding("charged_not_recorded") {
        (
            Verdict::Applied,
            false,
            VerdictBy::Audit,
            format!(
                "Charged, though the application recorded it as failed or released it: {} (the \
                 audit of {}). Do not charge again; a person must record it as done or refund \
                 it.",
                if paid.is_empty() {
                    c.summary.clone()
                } else {
                    list_charges(&paid)
                },
                c.day
            ),
            true,
        )
    } else if let Some(m) = finding("missing") {
        (
            Verdict::Missing,
            false,
            VerdictBy::Audit,
            format!(
                "The application recorded it as done, but the provider's list of {} has no \
                 charge for it (the audit's “missing”{}): a person must check before telling \
                 the customer it was paid.",
                m.day,
                m.amount
                    .as_deref()
                    .map(|a| format!(", {a}"))
                    .unwrap_or_default()
            ),
            true,
        )
    } else if let (Some(l), true) = (&lookup, unresolved.is_some()) {
        judge_open(&f, l, &paid, now, tz)
    } else if unresolved.is_some() {
        judge_unasked(&f, &paid, now, tz)
    } else {
        judge_recorded(e, &paid, tz)
    };
    EffectAnswer {
        source: e.source.clone(),
        key: e.key.clone(),
        operation: e.operation.clone(),
        subject: e.subject.clone(),
        verdict,
        is_final,
        by,
        sentence,
        needs_person,
        provider: f.provider.clone(),
        recorded,
        resolution,
        lookup,
        findings: f.findings.clone(),
        charges: f.charges.clone(),
    }
}

type Judged = (Verdict, bool, VerdictBy, String, bool);

/// Unresolved, and the reconciler has looked (or will).
fn judge_open(
    f: &Facts<'_>,
    l: &LookupState,
    paid: &[&ChargeFact],
    now: f64,
    tz: &TimeZone,
) -> Judged {
    let next = l
        .next_lookup
        .as_ref()
        .map(|m| format!(" reckon looks again at {}.", m.text))
        .unwrap_or_default();
    let payments = l
        .evidence
        .as_ref()
        .map(evidence_payments)
        .unwrap_or_default();
    match (l.last_outcome, l.provisional) {
        (Some(Outcome::Applied), true) => (
            Verdict::Applied,
            false,
            VerdictBy::Reconciler,
            format!(
                "Probably charged once: the provider has a payment that moved money{}, but the \
                 check for a second payment is not complete yet.{next}",
                if payments.is_empty() {
                    String::new()
                } else {
                    format!(" ({payments})")
                }
            ),
            l.needs_attention,
        ),
        (Some(Outcome::NotApplied), true) => (
            Verdict::Unknown,
            false,
            VerdictBy::Reconciler,
            format!(
                "Not found so far, but not proven: the provider's list shows no payment for it, \
                 and nothing vouches that it could have shown one made elsewhere or later ({}). \
                 Do not try again yet.{next}",
                l.evidence
                    .as_ref()
                    .and_then(|e| e["classification"]["reason"].as_str())
                    .or(l.last_error.as_deref())
                    .unwrap_or("no witness")
            ),
            l.needs_attention,
        ),
        (Some(Outcome::Indeterminate), true) => (
            Verdict::Pending,
            false,
            VerdictBy::Reconciler,
            format!(
                "A payment is still pending at the provider{}: it has not moved money yet, and \
                 may still.{}{next}",
                if payments.is_empty() {
                    String::new()
                } else {
                    format!(" ({payments})")
                },
                l.evidence.as_ref().map(pending_words).unwrap_or_default()
            ),
            false,
        ),
        // A person must look, and the provider's own charge list has money for the key
        // (reckon's "not charged" was taken back when the charge was imported).
        _ if l.needs_attention && !paid.is_empty() => (
            Verdict::Unknown,
            false,
            VerdictBy::Audit,
            match l.last_error.as_deref() {
                Some(e) if e.starts_with("not_applied contradicted") => format!(
                    "Contradicted: reckon's verdict was not charged, but the provider lists {} \
                     carrying this key; the verdict was taken back. Do not try again: a person \
                     must check.",
                    list_charges(paid)
                ),
                last => format!(
                    "Contradicted: the provider lists {} carrying this key, but reckon's lookup \
                     did not find it{}. Do not try again: a person must check.",
                    list_charges(paid),
                    last.map(|e| format!(" (last: {e})")).unwrap_or_default()
                ),
            },
            true,
        ),
        _ if l.needs_attention => (
            Verdict::Unknown,
            false,
            VerdictBy::Nobody,
            format!(
                "Nobody knows whether it happened: reckon asked {} {} times without an answer{}. \
                 A person must check.{}",
                f.provider.as_deref().unwrap_or("the provider"),
                l.lookups,
                l.last_error
                    .as_deref()
                    .map(|e| format!(" (last: {e})"))
                    .unwrap_or_default(),
                charge_hint(paid)
            ),
            true,
        ),
        _ => judge_unasked(f, paid, now, tz),
    }
}

/// The provider's listed charge, when the reconciler has not concluded: money the provider
/// listed is evidence, but not reckon's check for a second payment.
fn charge_hint(paid: &[&ChargeFact]) -> String {
    match paid {
        [] => String::new(),
        [c] => format!(
            " The provider's charge list has one charge for it: {}.",
            list_charges(&[c])
        ),
        cs => format!(
            " The provider's charge list has {} charges for it: {}.",
            cs.len(),
            list_charges(cs)
        ),
    }
}

/// Unresolved, no verdict from the reconciler yet.
fn judge_unasked(f: &Facts<'_>, paid: &[&ChargeFact], now: f64, tz: &TimeZone) -> Judged {
    let e = f.e;
    let since = age(now - e.unresolved_since.unwrap_or(e.updated_at));
    let why = match e.unresolved_kind {
        Some(UnresolvedKind::Abandoned) => format!(
            "its worker stopped before recording the outcome ({since} ago), so nobody knows \
             whether it happened"
        ),
        _ => format!("the application recorded the outcome as unknown {since} ago"),
    };
    if let [c] = paid {
        return (
            Verdict::Applied,
            false,
            VerdictBy::Audit,
            format!(
                "Probably charged once: {why}, but the provider's charge list has one charge \
                 for it ({}). reckon's own check for a second payment is still to come.",
                list_charges(&[c])
            ),
            !f.routed,
        );
    }
    if !f.routed {
        return (
            Verdict::Unknown,
            false,
            VerdictBy::Nobody,
            format!(
                "Nobody knows: {why}, and no provider is set up to answer for {} in {}. A \
                 person must check.",
                e.operation.as_deref().unwrap_or("this operation"),
                e.source
            ),
            true,
        );
    }
    let next = f.view.state.as_ref().map_or_else(
        || {
            format!(
                " reckon asks {} on its next run.",
                f.provider.as_deref().unwrap_or("the provider")
            )
        },
        |s| {
            format!(
                " reckon asks {} at {}.",
                f.provider.as_deref().unwrap_or("the provider"),
                Moment::new(s.next_attempt_at, tz).text
            )
        },
    );
    (
        Verdict::Unknown,
        false,
        VerdictBy::Nobody,
        format!("Not known yet: {why}.{next}"),
        false,
    )
}

/// Nothing doubts the application's own record.
fn judge_recorded(e: &Effect, paid: &[&ChargeFact], tz: &TimeZone) -> Judged {
    let when = Moment::new(e.updated_at, tz).text;
    match e.state {
        State::Succeeded => (
            Verdict::Applied,
            true,
            VerdictBy::Application,
            match paid {
                [c] => format!("Charged once: {}.", list_charges(&[c])),
                _ => format!("Done once: the application recorded success on {when}."),
            },
            false,
        ),
        State::Failed => (
            Verdict::NotApplied,
            true,
            VerdictBy::Application,
            format!("Did not happen: the application recorded a failure on {when}."),
            false,
        ),
        _ => (
            Verdict::InProgress,
            false,
            VerdictBy::Nobody,
            format!(
                "In progress: a worker has held it since {when} and its claim has not run out."
            ),
            false,
        ),
    }
}

fn words(v: Verdict) -> &'static str {
    match v {
        Verdict::Applied => "applied",
        Verdict::Duplicate => "duplicate",
        Verdict::NotApplied => "not applied",
        Verdict::Pending => "pending",
        Verdict::Missing => "missing",
        Verdict::Unknown => "unknown",
        Verdict::InProgress => "in progress",
    }
}

fn times(n: usize) -> String {
    match n {
        1 => "once".into(),
        2 => "twice".into(),
        n => format!("{n} times"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn money_has_thousands_separators_and_signs() {
        assert_eq!(money(123_456_700, "usd"), "$1,234,567.00");
        assert_eq!(money(2000, "usd"), "$20.00");
        assert_eq!(money(-150_000, "eur"), "-€1,500.00");
        assert_eq!(money(1_000_000, "jpy"), "¥1,000,000");
        assert_eq!(money(123_456, "chf"), "1,234.56 CHF");
    }

    #[test]
    fn near_spellings_are_other_cases_and_trimmed_quotes() {
        let n = near("ord-1017");
        assert!(n.contains(&"ORD-1017".to_owned()), "{n:?}");
        let n = near("\"ORD-1017\"");
        assert_eq!(n.first().map(String::as_str), Some("ORD-1017"));
        assert!(near("ORD-1017").iter().all(|v| v != "ORD-1017"));
    }

    #[test]
    fn moments_carry_epoch_rfc3339_and_words_in_the_zone() {
        let m = Moment::new(1_764_597_600.0, &TimeZone::get("Europe/Paris").unwrap());
        assert_eq!(m.rfc3339, "2025-12-01T14:00:00Z");
        assert_eq!(m.text, "01 Dec 2025 15:00 CET");
    }

    fn duplicate(second: serde_json::Value) -> serde_json::Value {
        let mut b = serde_json::json!({"group": "pi_2", "money": "moved", "status": "succeeded",
            "amount": 2000, "currency": "usd"});
        for (k, v) in second.as_object().unwrap() {
            b[k] = v.clone();
        }
        serde_json::json!({"classification": {"payments": [
            {"group": "pi_1", "money": "moved", "status": "succeeded", "amount": 2000,
             "currency": "usd"},
            b,
            {"group": "pi_3", "money": "none", "status": "canceled", "amount": 2000,
             "currency": "usd"},
        ]}})
    }

    #[test]
    fn a_duplicate_names_the_charge_to_refund_and_what_is_still_charged() {
        let a = duplicate_advice(&duplicate(serde_json::json!({})));
        assert_eq!(a, "Refund the extra one: pi_2 ($20.00).");
        let a = duplicate_advice(&duplicate(serde_json::json!({"amount_refunded": 500})));
        assert_eq!(
            a,
            "Refund the extra one: pi_2 ($15.00 of $20.00 still charged)."
        );
    }

    #[test]
    fn a_duplicate_refunded_in_full_asks_for_no_refund() {
        let a = duplicate_advice(&duplicate(serde_json::json!({"amount_refunded": 2000})));
        assert!(!a.contains("Refund the extra one"), "{a}");
        assert!(a.contains("pi_2") && a.contains("refunded in full"), "{a}");
        let named = evidence_payments(&duplicate(serde_json::json!({"amount_refunded": 2000})));
        assert!(
            named.contains("pi_2 (succeeded, $20.00, refunded in full)"),
            "{named}"
        );
    }

    #[test]
    fn a_disputed_duplicate_waits_for_the_dispute() {
        let a = duplicate_advice(&duplicate(serde_json::json!({"disputed": true})));
        assert!(a.contains("Refund the extra one: pi_2"), "{a}");
        assert!(
            a.contains("disputed") && a.contains("dispute is settled"),
            "{a}"
        );
    }

    #[test]
    fn a_pending_payment_says_what_holds_it_and_what_settles_it() {
        let held = serde_json::json!({"classification": {"payments": [
            {"group": "pi_h", "money": "pending", "status": "requires_capture",
             "amount": 5000, "currency": "usd"}]}});
        let w = pending_words(&held);
        assert!(w.contains("pi_h holds $50.00"), "{w}");
        assert!(w.contains("7 days") && w.contains("captured"), "{w}");
        let sca = serde_json::json!({"classification": {"payments": [
            {"group": "pi_a", "money": "pending", "status": "requires_action",
             "amount": 900, "currency": "eur"}]}});
        let w = pending_words(&sca);
        assert!(w.contains("3-D Secure") && w.contains("pi_a"), "{w}");
    }
}
