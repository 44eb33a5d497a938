//! The double-charge audit of one day, as a pure function.
//!
//! Input: what the applications recorded (effects) and what the provider says happened
//! (its charges), both for the day plus a margin on either side. Output: every discrepancy
//! of the day with its evidence, and totals per currency in minor units (exact to the cent:
//! no floating point touches an amount).
//!
//! Why pure: the rules are what finance signs off on, so they must be testable without a
//! database or a provider, and the same inputs must always give the same report (the audit
//! run's digest covers it). Fetching, storing and scheduling live elsewhere.
//!
//! Day membership: a finding about an effect counts when the effect was created in the day;
//! a finding about a charge when the charge was. Callers pass both sets with a margin (see
//! [`MARGIN_SECS`]) so that an effect claimed at 23:59:59 whose charge was created at
//! 00:00:01 is matched, not reported as missing on one day and orphaned on the next.

use jiff::civil::Date;
use jiff::tz::TimeZone;
use reckon_domain::{ChargeStatus, Outcome, State, UnresolvedKind};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};

mod advice;
pub mod chain;
mod split;

pub use advice::{advice, stake_words, verdict_words};
pub use split::intent_subject;

/// How far beyond the day callers fetch effects and charges, so matches across midnight
/// are seen. An application's claim and its provider call are seconds apart; an hour is
/// generous.
pub const MARGIN_SECS: f64 = 3600.0;

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("unknown time zone {0:?} (use an IANA name such as Europe/Paris)")]
    TimeZone(String),
    #[error("invalid date: {0}")]
    Date(String),
}

/// One calendar day in a tenant's time zone, as a half-open interval of epoch seconds.
/// A day is 23 or 25 hours long across a DST change.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DayWindow {
    pub date: String,
    pub time_zone: String,
    pub start: f64,
    pub end: f64,
}

impl DayWindow {
    pub fn new(date: &str, time_zone: &str) -> Result<DayWindow, AuditError> {
        let day: Date = date
            .parse()
            .map_err(|e: jiff::Error| AuditError::Date(format!("{date:?}: {e}")))?;
        let tz =
            TimeZone::get(time_zone).map_err(|_| AuditError::TimeZone(time_zone.to_owned()))?;
        let start = day
            .to_zoned(tz.clone())
            .map_err(|e| AuditError::Date(e.to_string()))?;
        let next = day
            .tomorrow()
            .map_err(|e| AuditError::Date(e.to_string()))?
            .to_zoned(tz)
            .map_err(|e| AuditError::Date(e.to_string()))?;
        Ok(DayWindow {
            date: day.to_string(),
            time_zone: time_zone.to_owned(),
            start: start.timestamp().as_millisecond() as f64 / 1000.0,
            end: next.timestamp().as_millisecond() as f64 / 1000.0,
        })
    }

    /// The day before `now` in `time_zone`: what the morning audit looks at.
    pub fn yesterday(now_epoch: f64, time_zone: &str) -> Result<DayWindow, AuditError> {
        let tz =
            TimeZone::get(time_zone).map_err(|_| AuditError::TimeZone(time_zone.to_owned()))?;
        let ts = jiff::Timestamp::from_millisecond((now_epoch * 1000.0) as i64)
            .map_err(|e| AuditError::Date(e.to_string()))?;
        let today = ts.to_zoned(tz).date();
        let y = today
            .yesterday()
            .map_err(|e| AuditError::Date(e.to_string()))?;
        DayWindow::new(&y.to_string(), time_zone)
    }

    pub fn contains(&self, t: f64) -> bool {
        t >= self.start && t < self.end
    }
}

/// An effect as the audit needs it.
#[derive(Debug, Clone, Serialize)]
pub struct AuditEffect {
    pub source: String,
    pub key: String,
    pub operation: String,
    pub subject: Option<String>,
    pub state: State,
    pub unresolved: Option<UnresolvedKind>,
    pub attempts: i64,
    pub created_at: f64,
    /// The response the application recorded (for `succeeded`), parsed.
    pub response: Option<serde_json::Value>,
    /// The idempotency keys the application sent to the provider for this effect: the key
    /// itself, or what the source's key template made of it.
    pub provider_keys: Vec<String>,
    /// Who deleted the effect's row, handing its key back for a retry, if anyone did: it is
    /// held not done.
    pub released: Option<Releaser>,
    /// reckon's verdict on the effect (the reconciler's, or a person's by hand), when it
    /// has one: shown beside the application's state, which may still say `unknown`.
    pub verdict: Option<Outcome>,
}

/// Who handed an effect's key back for a retry by deleting its row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Releaser {
    /// The application: justonce releases a claim on a transient failure so that a retry
    /// may claim the key again.
    Application,
    /// reckon's write-back of a `not_applied` verdict (the source's release policy).
    Reckon,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Refund {
    pub id: String,
    pub amount: i64,
    pub reason: Option<String>,
}

/// A charge's metadata, key -> value, in key order: a sorted vector, a few dozen bytes for
/// the one or two entries a charge carries (a `BTreeMap` allocates a ~540-byte node).
pub type Metadata = litemap::LiteMap<String, String>;

/// A money-moving object at the provider (a Stripe charge, or the `http` protocol's).
#[derive(Debug, Clone, Serialize)]
pub struct ProviderCharge {
    pub id: String,
    /// The payment the charge is an attempt of, when the provider groups attempts (Stripe:
    /// its PaymentIntent).
    pub payment: Option<String>,
    /// Minor units (cents).
    pub amount: i64,
    pub currency: String,
    pub status: ChargeStatus,
    pub amount_captured: i64,
    pub amount_refunded: i64,
    pub refunds: Vec<Refund>,
    pub metadata: Metadata,
    /// The key of the request that created it, when the provider reports one.
    pub idempotency_key: Option<String>,
    pub customer: Option<String>,
    pub created: f64,
}

impl ProviderCharge {
    fn successful(&self) -> bool {
        self.status.is_paid()
    }

    /// Fully refunded with reason `duplicate`: the provider-side correction of a double
    /// charge. Such a charge is listed, but no longer counts as money taken twice.
    pub fn refunded_as_duplicate(&self) -> bool {
        let dup: i64 = self
            .refunds
            .iter()
            .filter(|r| r.reason.as_deref() == Some("duplicate"))
            .map(|r| r.amount)
            .sum();
        self.amount > 0 && dup >= self.amount
    }
}

/// Where the provider's objects carry the application's identifiers.
#[derive(Debug, Clone, Serialize)]
pub struct MatchRules {
    /// Metadata fields holding the idempotency key.
    pub key_fields: Vec<String>,
    /// Metadata fields holding the order reference (matched to the effect's subject).
    pub order_fields: Vec<String>,
}

impl Default for MatchRules {
    fn default() -> Self {
        MatchRules {
            key_fields: vec![
                "idempotency_key".into(),
                "justonce_key".into(),
                "reckon_key".into(),
            ],
            order_fields: vec!["order_id".into(), "order".into()],
        }
    }
}

/// How a charge was tied to an effect, strongest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MatchMethod {
    /// The effect's recorded response names the object.
    ResponseId,
    /// The request that created the object carried the effect's key.
    IdempotencyKey,
    /// The object's metadata carries the effect's key.
    MetadataKey,
    /// The object's metadata names the effect's order (its subject).
    OrderReference,
}

#[derive(Debug, Clone, Serialize)]
pub struct Match {
    pub charge: String,
    pub source: String,
    pub key: String,
    pub method: MatchMethod,
}

/// What a stored run keeps of its matches: how many, how many by method, and the SHA-256
/// (hex) of the whole list, each match as the JSON array `[charge, source, key, method]`
/// and a newline, in the report's order. A day of a million charges has a million
/// matches: as a list in the run, ~100 MB of JSON that every read of the run would carry.
/// The digest lets a later audit of the day show that it tied the same charges to the same
/// effects; a match is the absence of a finding, and the findings keep their evidence.
pub fn matches_summary(matches: &[Match]) -> serde_json::Value {
    use sha2::Digest;
    use std::io::Write;
    let mut by_method: BTreeMap<MatchMethod, usize> = BTreeMap::new();
    let mut h = sha2::Sha256::new();
    for m in matches {
        *by_method.entry(m.method).or_default() += 1;
        // Writing into a hasher cannot fail; a string always serializes.
        let _ = serde_json::to_writer(&mut h, &(&m.charge, &m.source, &m.key, m.method));
        let _ = h.write_all(b"\n");
    }
    // Named as the list names them (the enum's serde name), not by a second spelling.
    let by_method: serde_json::Map<String, serde_json::Value> = by_method
        .into_iter()
        .filter_map(|(m, n)| Some((serde_json::to_value(m).ok()?.as_str()?.to_owned(), n.into())))
        .collect();
    serde_json::json!({
        "count": matches.len(),
        "by_method": by_method,
        "sha256": hex::encode(h.finalize()),
    })
}

/// A match on customer, amount, currency and time alone: shown to a person as a lead,
/// never used to decide a finding.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Suggestion {
    pub charge: String,
    pub source: String,
    pub key: String,
    pub why: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    Duplicate,
    Orphan,
    Missing,
    Unresolved,
    RiskyReclaim,
    SplitIntent,
    /// Money moved for an effect the application recorded as failed: paid at the provider,
    /// cancelled in the application. Not an orphan (the charge has its effect), not missing.
    ChargedNotRecorded,
    /// A kind a newer version stored, read by this one (never produced here).
    #[serde(other)]
    Other,
}

impl FindingKind {
    pub const ALL: [FindingKind; 7] = [
        FindingKind::Duplicate,
        FindingKind::Orphan,
        FindingKind::Missing,
        FindingKind::Unresolved,
        FindingKind::RiskyReclaim,
        FindingKind::SplitIntent,
        FindingKind::ChargedNotRecorded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FindingKind::Duplicate => "duplicate",
            FindingKind::Orphan => "orphan",
            FindingKind::Missing => "missing",
            FindingKind::Unresolved => "unresolved",
            FindingKind::RiskyReclaim => "risky_reclaim",
            FindingKind::SplitIntent => "split_intent",
            FindingKind::ChargedNotRecorded => "charged_not_recorded",
            FindingKind::Other => "other",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EffectRef {
    pub source: String,
    pub key: String,
    pub operation: String,
    pub subject: Option<String>,
    /// The application's state of the effect.
    pub state: State,
    pub attempts: i64,
    pub created_at: f64,
    /// reckon's verdict on the effect when the run was made (`None`: none yet, or a run
    /// stored before runs carried it).
    #[serde(default)]
    pub verdict: Option<Outcome>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChargeRef {
    pub id: String,
    pub amount: i64,
    pub currency: String,
    pub status: String,
    pub amount_refunded: i64,
    #[serde(default)]
    pub refunded_as_duplicate: bool,
    pub customer: Option<String>,
    pub created: f64,
    /// The idempotency key it was made with and its metadata: for an orphan, what the
    /// provider knows of the order behind it.
    pub idempotency_key: Option<String>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

impl ChargeRef {
    /// Money was taken: its stored status word is [`ChargeStatus::Paid`]'s.
    pub fn paid(&self) -> bool {
        ChargeStatus::from_stored(&self.status).is_paid()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Finding {
    pub kind: FindingKind,
    /// Plain words for the person reading the report.
    pub summary: String,
    pub effects: Vec<EffectRef>,
    pub charges: Vec<ChargeRef>,
    /// The money at stake in minor units, with its currency: for a duplicate, charged beyond
    /// the first charge net of duplicate refunds; for a missing charge, what the
    /// application's recorded response says it charged; for a risky reclaim, its successful
    /// charges. `None` when nothing names an amount.
    pub amount: Option<i64>,
    pub currency: Option<String>,
    /// For duplicates: every extra charge was refunded as `duplicate`.
    #[serde(default)]
    pub refunded: bool,
    #[serde(default)]
    pub suggestions: Vec<Suggestion>,
    /// Who the money concerns as the provider names them (`cus_…`), when it does.
    #[serde(default)]
    pub customer: Option<String>,
    /// The order the finding is about, as the application names it (its effect's subject,
    /// else the order the charge names).
    #[serde(default)]
    pub order: Option<String>,
    /// What finance does about it, in plain words, with the charge ids and amounts
    /// ([`advice`]). Empty in runs stored before runs carried it:
    /// [`Finding::action_words`] advises those when they are shown.
    #[serde(default)]
    pub action: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct CurrencyTotals {
    pub currency: String,
    /// Successful charges of the day.
    pub charged: i64,
    pub refunded: i64,
    pub net: i64,
    /// Charged amounts tied to an effect, and not.
    pub matched: i64,
    pub unmatched: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct AuditReport {
    pub window: DayWindow,
    pub findings: Vec<Finding>,
    pub totals: Vec<CurrencyTotals>,
    pub matches: Vec<Match>,
    pub effects_in_day: usize,
    pub charges_in_day: usize,
}

impl AuditReport {
    pub fn count(&self, kind: FindingKind) -> usize {
        self.findings.iter().filter(|f| f.kind == kind).count()
    }
}

/// Strong ties from one side (charges, or effects) to the other, by index: a list per
/// item, empty (and unallocated) for an item tied to nothing. A day has a million of each.
pub(crate) struct Ties(Vec<Vec<usize>>);

impl Ties {
    fn new(n: usize) -> Ties {
        Ties(vec![Vec::new(); n])
    }

    fn tie(&mut self, from: usize, to: usize) {
        self.0[from].push(to);
    }

    /// What `i` is tied to, in index order; `None` when nothing.
    pub(crate) fn get(&self, i: &usize) -> Option<&[usize]> {
        self.0.get(*i).map(Vec::as_slice).filter(|t| !t.is_empty())
    }

    pub(crate) fn contains_key(&self, i: &usize) -> bool {
        self.get(i).is_some()
    }
}

/// Match charges to effects and name every discrepancy of `window`.
pub fn audit(
    window: &DayWindow,
    effects: &[AuditEffect],
    charges: &[ProviderCharge],
    rules: &MatchRules,
) -> AuditReport {
    let matches = match_charges(effects, charges, rules);
    // charge index -> effect indexes it is tied to (strong matches only).
    let mut by_charge = Ties::new(charges.len());
    let mut by_effect = Ties::new(effects.len());
    // `matches` is in (charge, effect) order, each pair once: every list comes out sorted
    // and without repeats.
    for &(c, e, _) in &matches {
        by_charge.tie(c, e);
        by_effect.tie(e, c);
    }
    let mut findings = Vec::new();
    findings.extend(duplicates(window, effects, charges, &by_charge, rules));
    findings.extend(orphans(window, effects, charges, &by_charge, &by_effect));
    findings.extend(missing(window, effects, charges, &by_effect));
    findings.extend(charged_not_recorded(window, effects, charges, &by_effect));
    findings.extend(unresolved(window, effects));
    findings.extend(risky_reclaims(window, effects, charges, &by_effect));
    findings.extend(split::split_intents(
        window, effects, charges, &by_effect, rules,
    ));
    findings.sort_by(|a, b| {
        (a.kind, first_time(a))
            .partial_cmp(&(b.kind, first_time(b)))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    // Each finding names whom it concerns and what to do, stored with the run: the words
    // finance read that morning stay what the run says.
    for f in &mut findings {
        f.customer = f.customer_of();
        f.order = f.order_of(rules);
        f.action = advice(f);
    }

    AuditReport {
        window: window.clone(),
        totals: totals(window, charges, &by_charge),
        matches: matches
            .iter()
            .map(|&(c, e, method)| Match {
                charge: charges[c].id.clone(),
                source: effects[e].source.clone(),
                key: effects[e].key.clone(),
                method,
            })
            .collect(),
        effects_in_day: effects
            .iter()
            .filter(|e| window.contains(e.created_at))
            .count(),
        charges_in_day: charges
            .iter()
            .filter(|c| window.contains(c.created))
            .count(),
        findings,
    }
}

fn first_time(f: &Finding) -> f64 {
    f.charges
        .iter()
        .map(|c| c.created)
        .chain(f.effects.iter().map(|e| e.created_at))
        .fold(f64::INFINITY, f64::min)
}

/// Every strong (charge, effect, method) tie, the strongest method per pair.
fn match_charges(
    effects: &[AuditEffect],
    charges: &[ProviderCharge],
    rules: &MatchRules,
) -> Vec<(usize, usize, MatchMethod)> {
    let mut ids_in_responses: HashMap<&str, Vec<usize>> = HashMap::new();
    let mut by_key: HashMap<&str, Vec<usize>> = HashMap::new();
    let mut by_subject: HashMap<&str, Vec<usize>> = HashMap::new();
    let mut response_strings: Vec<Vec<String>> = Vec::with_capacity(effects.len());
    for (i, e) in effects.iter().enumerate() {
        let mut strings = Vec::new();
        if let Some(r) = &e.response {
            collect_strings(r, &mut strings);
        }
        response_strings.push(strings);
        by_key.entry(e.key.as_str()).or_default().push(i);
        for k in &e.provider_keys {
            if k != &e.key {
                by_key.entry(k.as_str()).or_default().push(i);
            }
        }
        if let Some(s) = &e.subject {
            by_subject.entry(s.as_str()).or_default().push(i);
        }
    }
    for (i, strings) in response_strings.iter().enumerate() {
        for s in strings {
            ids_in_responses.entry(s.as_str()).or_default().push(i);
        }
    }

    let mut best: BTreeMap<(usize, usize), MatchMethod> = BTreeMap::new();
    let mut tie = |c: usize, e: usize, m: MatchMethod| {
        best.entry((c, e))
            .and_modify(|old| *old = (*old).min(m))
            .or_insert(m);
    };
    for (c, ch) in charges.iter().enumerate() {
        for id in std::iter::once(ch.id.as_str()).chain(ch.payment.as_deref()) {
            for &e in ids_in_responses.get(id).into_iter().flatten() {
                tie(c, e, MatchMethod::ResponseId);
            }
        }
        if let Some(k) = &ch.idempotency_key {
            for &e in by_key.get(k.as_str()).into_iter().flatten() {
                tie(c, e, MatchMethod::IdempotencyKey);
            }
        }
        for f in &rules.key_fields {
            if let Some(k) = ch.metadata.get(f) {
                for &e in by_key.get(k.as_str()).into_iter().flatten() {
                    tie(c, e, MatchMethod::MetadataKey);
                }
            }
        }
        // An order reference ties a charge to effects of that order only when nothing
        // stronger tied it to anything: with a key or an id in hand, the order would add
        // the order's other effects (a refund, a receipt) as false partners.
        for f in &rules.order_fields {
            if let Some(o) = ch.metadata.get(f) {
                for &e in by_subject.get(o.as_str()).into_iter().flatten() {
                    tie(c, e, MatchMethod::OrderReference);
                }
            }
        }
    }
    let strong: BTreeSet<usize> = best
        .iter()
        .filter(|(_, m)| **m != MatchMethod::OrderReference)
        .map(|((c, _), _)| *c)
        .collect();
    best.into_iter()
        .filter(|((c, _), m)| *m != MatchMethod::OrderReference || !strong.contains(c))
        .map(|((c, e), m)| (c, e, m))
        .collect()
}

fn collect_strings(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::String(s) => out.push(s.clone()),
        serde_json::Value::Array(a) => a.iter().for_each(|x| collect_strings(x, out)),
        serde_json::Value::Object(o) => o.values().for_each(|x| collect_strings(x, out)),
        _ => {}
    }
}

pub(crate) fn effect_ref(e: &AuditEffect) -> EffectRef {
    EffectRef {
        source: e.source.clone(),
        key: e.key.clone(),
        operation: e.operation.clone(),
        subject: e.subject.clone(),
        state: e.state,
        attempts: e.attempts,
        created_at: e.created_at,
        verdict: e.verdict,
    }
}

pub(crate) fn charge_ref(c: &ProviderCharge) -> ChargeRef {
    ChargeRef {
        id: c.id.clone(),
        amount: c.amount,
        currency: c.currency.clone(),
        status: c.status.as_str().to_owned(),
        amount_refunded: c.amount_refunded,
        refunded_as_duplicate: c.refunded_as_duplicate(),
        customer: c.customer.clone(),
        created: c.created,
        idempotency_key: c.idempotency_key.clone(),
        metadata: c
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    }
}

fn order_ref<'a>(c: &'a ProviderCharge, rules: &MatchRules) -> Option<&'a str> {
    rules
        .order_fields
        .iter()
        .find_map(|f| c.metadata.get(f))
        .map(String::as_str)
}

/// Two or more successful charges for one effect or one order reference. Charges are
/// grouped transitively (one component per set of charges sharing an effect or an order),
/// so a double charge is reported once however many ways it is visible.
fn duplicates(
    window: &DayWindow,
    effects: &[AuditEffect],
    charges: &[ProviderCharge],
    by_charge: &Ties,
    rules: &MatchRules,
) -> Vec<Finding> {
    let ok: Vec<usize> = (0..charges.len())
        .filter(|&c| charges[c].successful())
        .collect();
    let mut parent: HashMap<usize, usize> = ok.iter().map(|&c| (c, c)).collect();
    fn find(p: &mut HashMap<usize, usize>, x: usize) -> usize {
        let mut r = x;
        while p[&r] != r {
            r = p[&r];
        }
        let mut y = x;
        while p[&y] != r {
            let n = p[&y];
            p.insert(y, r);
            y = n;
        }
        r
    }
    let join = |p: &mut HashMap<usize, usize>, a: usize, b: usize| {
        let (ra, rb) = (find(p, a), find(p, b));
        if ra != rb {
            p.insert(ra.max(rb), ra.min(rb));
        }
    };
    let mut first_by_effect: HashMap<usize, usize> = HashMap::new();
    let mut first_by_order: HashMap<&str, usize> = HashMap::new();
    for &c in &ok {
        for &e in by_charge.get(&c).into_iter().flatten() {
            match first_by_effect.get(&e) {
                Some(&o) => join(&mut parent, o, c),
                None => {
                    first_by_effect.insert(e, c);
                }
            }
        }
        if let Some(o) = order_ref(&charges[c], rules) {
            match first_by_order.get(o) {
                Some(&f) => join(&mut parent, f, c),
                None => {
                    first_by_order.insert(o, c);
                }
            }
        }
    }
    let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for &c in &ok {
        let r = find(&mut parent, c);
        groups.entry(r).or_default().push(c);
    }

    let mut out = Vec::new();
    for (_, mut group) in groups {
        if group.len() < 2 {
            continue;
        }
        group.sort_by(|&a, &b| {
            charges[a]
                .created
                .partial_cmp(&charges[b].created)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then_with(|| charges[a].id.cmp(&charges[b].id))
        });
        // A double charge belongs to the day its second charge happened.
        if !window.contains(charges[group[1]].created) {
            continue;
        }
        let active: Vec<usize> = group
            .iter()
            .copied()
            .filter(|&c| !charges[c].refunded_as_duplicate())
            .collect();
        let effect_ids: BTreeSet<usize> = group
            .iter()
            .flat_map(|c| by_charge.get(c).into_iter().flatten().copied())
            .collect();
        let currency = charges[group[0]].currency.clone();
        // Money taken beyond the first still-standing charge: charged, refunded since (for
        // any reason), and what is left.
        let gross: i64 = active.iter().skip(1).map(|&c| charges[c].amount).sum();
        let given_back: i64 = active
            .iter()
            .skip(1)
            .map(|&c| charges[c].amount_refunded.min(charges[c].amount))
            .sum();
        let extra = gross - given_back;
        let refunded = active.len() < 2;
        let what = match order_ref(&charges[group[0]], rules) {
            Some(o) => format!("order {o}"),
            None => effect_ids.iter().next().map_or_else(
                || "one payment".into(),
                |&e| format!("key {}", effects[e].key),
            ),
        };
        let summary = if refunded {
            format!(
                "{} successful charges for {what}; the extra ones were refunded as duplicate",
                group.len()
            )
        } else if given_back == 0 {
            format!(
                "{} successful charges for {what}: {} charged twice or more",
                group.len(),
                money(extra, &currency)
            )
        } else if extra == 0 {
            format!(
                "{} successful charges for {what}: the extra {} was refunded in full since \
                 (not marked duplicate); nothing is still charged twice",
                group.len(),
                money(gross, &currency)
            )
        } else {
            format!(
                "{} successful charges for {what}: {} charged beyond the first, {} of it \
                 refunded, {} still charged twice",
                group.len(),
                money(gross, &currency),
                money(given_back, &currency),
                money(extra, &currency)
            )
        };
        out.push(Finding {
            kind: FindingKind::Duplicate,
            summary,
            effects: effect_ids
                .iter()
                .map(|&e| effect_ref(&effects[e]))
                .collect(),
            charges: group.iter().map(|&c| charge_ref(&charges[c])).collect(),
            amount: Some(extra),
            currency: Some(currency),
            refunded,
            suggestions: vec![],
            customer: None,
            order: None,
            action: String::new(),
        });
    }
    out
}

/// A charge of the day tied to no effect. Failed charges moved no money and are left out.
fn orphans(
    window: &DayWindow,
    effects: &[AuditEffect],
    charges: &[ProviderCharge],
    by_charge: &Ties,
    by_effect: &Ties,
) -> Vec<Finding> {
    let leads = Leads::index(effects, by_effect);
    let mut out = Vec::new();
    for (c, ch) in charges.iter().enumerate() {
        if !window.contains(ch.created)
            || ch.status == ChargeStatus::Failed
            || by_charge.contains_key(&c)
        {
            continue;
        }
        let suggestions = leads.suggest(ch, effects);
        out.push(Finding {
            kind: FindingKind::Orphan,
            summary: format!(
                "charge {} ({}, {}) matches no recorded effect",
                ch.id,
                money(ch.amount, &ch.currency),
                ch.status
            ),
            effects: vec![],
            charges: vec![charge_ref(ch)],
            amount: Some(ch.amount),
            currency: Some(ch.currency.clone()),
            refunded: false,
            suggestions,
            customer: None,
            order: None,
            action: String::new(),
        });
    }
    out
}

/// Effects with no charge of their own, by the (amount, currency, customer) their recorded
/// response names: built once, so suggesting leads for every orphan costs O(effects +
/// orphans), not O(effects x orphans) (a day of a million effects has a thousand orphans).
struct Leads {
    by_money: HashMap<(i64, String, String), Vec<usize>>,
}

impl Leads {
    fn index(effects: &[AuditEffect], by_effect: &Ties) -> Self {
        let mut by_money: HashMap<(i64, String, String), Vec<usize>> = HashMap::new();
        for (e, ef) in effects.iter().enumerate() {
            if by_effect.contains_key(&e) {
                continue;
            }
            let Some(r) = &ef.response else { continue };
            let amount = r.get("amount").and_then(serde_json::Value::as_i64);
            let currency = r.get("currency").and_then(|v| v.as_str());
            let customer = r.get("customer").and_then(|v| v.as_str());
            if let (Some(a), Some(cur), Some(cus)) = (amount, currency, customer) {
                by_money
                    .entry((a, cur.to_ascii_lowercase(), cus.to_owned()))
                    .or_default()
                    .push(e);
            }
        }
        Leads { by_money }
    }

    /// Weak leads for an orphan: effects with no charge of their own whose recorded
    /// response names the same customer, amount and currency, within the margin of the
    /// charge.
    fn suggest(&self, ch: &ProviderCharge, effects: &[AuditEffect]) -> Vec<Suggestion> {
        let Some(customer) = ch.customer.as_deref() else {
            return Vec::new();
        };
        let key = (
            ch.amount,
            ch.currency.to_ascii_lowercase(),
            customer.to_owned(),
        );
        self.by_money
            .get(&key)
            .into_iter()
            .flatten()
            .map(|&e| &effects[e])
            .filter(|ef| (ef.created_at - ch.created).abs() <= MARGIN_SECS)
            .map(|ef| Suggestion {
                charge: ch.id.clone(),
                source: ef.source.clone(),
                key: ef.key.clone(),
                why: "same customer, amount and currency within an hour (suggested, unconfirmed)"
                    .into(),
            })
            .collect()
    }
}

/// An effect the application recorded `succeeded` whose provider object cannot be found.
fn missing(
    window: &DayWindow,
    effects: &[AuditEffect],
    charges: &[ProviderCharge],
    by_effect: &Ties,
) -> Vec<Finding> {
    let mut out = Vec::new();
    for (e, ef) in effects.iter().enumerate() {
        if !window.contains(ef.created_at) || ef.state != State::Succeeded {
            continue;
        }
        let found = by_effect.get(&e).is_some_and(|cs| {
            cs.iter()
                .any(|&c| charges[c].status != ChargeStatus::Failed)
        });
        if found {
            continue;
        }
        out.push(Finding {
            kind: FindingKind::Missing,
            summary: format!(
                "{} is recorded succeeded but the provider has no charge for it",
                ef.key
            ),
            effects: vec![effect_ref(ef)],
            charges: by_effect
                .get(&e)
                .into_iter()
                .flatten()
                .map(|&c| charge_ref(&charges[c]))
                .collect(),
            // What the application says it charged, when its recorded response says.
            amount: recorded_amount(ef).map(|(a, _)| a),
            currency: recorded_amount(ef).map(|(_, c)| c),
            refunded: false,
            suggestions: vec![],
            customer: None,
            order: None,
            action: String::new(),
        });
    }
    out
}

/// Effects the application recorded as failed, or whose key was handed back for a retry (by
/// the application, or by reckon's write-back of a verdict the charge now contradicts),
/// whose charge moved money: the customer was charged while the application believes it
/// was not (and may charge again, or refuse the order it was paid for). The net of refunds
/// is the money at stake.
fn charged_not_recorded(
    window: &DayWindow,
    effects: &[AuditEffect],
    charges: &[ProviderCharge],
    by_effect: &Ties,
) -> Vec<Finding> {
    let mut out = Vec::new();
    for (e, ef) in effects.iter().enumerate() {
        if !window.contains(ef.created_at) || !(ef.state == State::Failed || ef.released.is_some())
        {
            continue;
        }
        let paid: Vec<&ProviderCharge> = by_effect
            .get(&e)
            .into_iter()
            .flatten()
            .map(|&c| &charges[c])
            .filter(|c| c.successful() && c.amount_captured > 0)
            .collect();
        let Some(first) = paid.first() else {
            continue;
        };
        let net: i64 = paid
            .iter()
            .filter(|c| c.currency == first.currency)
            .map(|c| c.amount_captured - c.amount_refunded)
            .sum();
        out.push(Finding {
            kind: FindingKind::ChargedNotRecorded,
            summary: format!(
                "{} is {} but the provider charged it: {}",
                ef.key,
                match ef.released {
                    Some(Releaser::Application) => {
                        "released by the application (its claim deleted so a retry may charge \
                         again)"
                    }
                    // The most dangerous of the three: reckon itself said "not charged" and
                    // handed the key back, so the application may already have charged again.
                    Some(Releaser::Reckon) => {
                        "released by reckon's write-back of a not-charged verdict (its row \
                         deleted so the application may retry: check it did not charge again)"
                    }
                    None => "recorded failed",
                },
                paid.iter()
                    .map(|c| format!("{} {}", c.id, money(c.amount_captured, &c.currency)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            effects: vec![effect_ref(ef)],
            charges: paid.iter().map(|c| charge_ref(c)).collect(),
            amount: Some(net),
            currency: Some(first.currency.clone()),
            // Every charge of it was given back in full.
            refunded: net <= 0,
            suggestions: vec![],
            customer: None,
            order: None,
            action: String::new(),
        });
    }
    out
}

/// The amount and currency an effect's recorded response names (`{"amount": 2000,
/// "currency": "usd"}`, Stripe's shape), if it names both.
fn recorded_amount(e: &AuditEffect) -> Option<(i64, String)> {
    let r = e.response.as_ref()?;
    Some((
        r.get("amount")?.as_i64()?,
        r.get("currency")?.as_str()?.to_ascii_lowercase(),
    ))
}

fn unresolved(window: &DayWindow, effects: &[AuditEffect]) -> Vec<Finding> {
    effects
        .iter()
        .filter(|e| window.contains(e.created_at))
        .filter_map(|e| {
            let kind = e.unresolved?;
            Some(Finding {
                kind: FindingKind::Unresolved,
                summary: format!("{} is still {}", e.key, kind.as_str()),
                effects: vec![effect_ref(e)],
                charges: vec![],
                amount: None,
                currency: None,
                refunded: false,
                suggestions: vec![],
                customer: None,
                order: None,
                action: String::new(),
            })
        })
        .collect()
}

/// Effects that were claimed more than once: each reclaim may have run the side effect
/// again. Listed with the provider's count of charges for them.
fn risky_reclaims(
    window: &DayWindow,
    effects: &[AuditEffect],
    charges: &[ProviderCharge],
    by_effect: &Ties,
) -> Vec<Finding> {
    let mut out = Vec::new();
    for (e, ef) in effects.iter().enumerate() {
        if !window.contains(ef.created_at) || ef.attempts <= 1 {
            continue;
        }
        let cs: Vec<ChargeRef> = by_effect
            .get(&e)
            .into_iter()
            .flatten()
            .map(|&c| charge_ref(&charges[c]))
            .collect();
        let ok = cs.iter().filter(|c| c.paid()).count();
        out.push(Finding {
            kind: FindingKind::RiskyReclaim,
            summary: format!(
                "{} was attempted {} times; the provider shows {} successful charge{}",
                ef.key,
                ef.attempts,
                ok,
                if ok == 1 { "" } else { "s" }
            ),
            // The money the reclaimed effect took: its successful charges, when they are
            // in one currency.
            amount: one_currency_total(&cs).map(|(a, _)| a),
            currency: one_currency_total(&cs).map(|(_, c)| c),
            effects: vec![effect_ref(ef)],
            charges: cs,
            refunded: false,
            suggestions: vec![],
            customer: None,
            order: None,
            action: String::new(),
        });
    }
    out
}

/// The sum of the successful charges, if there is one and all are in one currency.
fn one_currency_total(cs: &[ChargeRef]) -> Option<(i64, String)> {
    let ok: Vec<&ChargeRef> = cs.iter().filter(|c| c.paid()).collect();
    let currency = ok.first()?.currency.clone();
    ok.iter()
        .all(|c| c.currency == currency)
        .then(|| (ok.iter().map(|c| c.amount).sum(), currency))
}

/// Totals of the day's successful charges per currency.
fn totals(window: &DayWindow, charges: &[ProviderCharge], by_charge: &Ties) -> Vec<CurrencyTotals> {
    let mut t: BTreeMap<String, CurrencyTotals> = BTreeMap::new();
    for (c, ch) in charges.iter().enumerate() {
        if !window.contains(ch.created) || !ch.successful() {
            continue;
        }
        let cur = ch.currency.to_ascii_lowercase();
        let e = t.entry(cur.clone()).or_insert_with(|| CurrencyTotals {
            currency: cur,
            ..Default::default()
        });
        e.charged += ch.amount;
        e.refunded += ch.amount_refunded;
        if by_charge.contains_key(&c) {
            e.matched += ch.amount;
        } else {
            e.unmatched += ch.amount;
        }
    }
    t.into_values()
        .map(|mut x| {
            x.net = x.charged - x.refunded;
            x
        })
        .collect()
}

/// `1234, "usd"` -> `"12.34 USD"`. Zero-decimal currencies (JPY, KRW, ...) have no cents.
pub fn money(minor: i64, currency: &str) -> String {
    const ZERO_DECIMAL: [&str; 16] = [
        "bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga", "pyg", "rwf", "ugx", "vnd", "vuv",
        "xaf", "xof", "xpf",
    ];
    let cur = currency.to_ascii_uppercase();
    if ZERO_DECIMAL.contains(&currency.to_ascii_lowercase().as_str()) {
        return format!("{minor} {cur}");
    }
    let sign = if minor < 0 { "-" } else { "" };
    let a = minor.unsigned_abs();
    format!("{sign}{}.{:02} {cur}", a / 100, a % 100)
}

// Scheduling and presentation helpers.

/// Check an IANA time zone name (a tenant setting) against the bundled tz database.
pub fn validate_zone(time_zone: &str) -> Result<(), AuditError> {
    TimeZone::get(time_zone)
        .map(|_| ())
        .map_err(|_| AuditError::TimeZone(time_zone.to_owned()))
}

/// Parse `HH:MM` (24-hour).
pub fn parse_local_time(hhmm: &str) -> Result<jiff::civil::Time, AuditError> {
    let bad = || {
        AuditError::Date(format!(
            "{hhmm:?} is not a time of day (use HH:MM, 24-hour)"
        ))
    };
    let (h, m) = hhmm.split_once(':').ok_or_else(bad)?;
    if h.len() != 2 || m.len() != 2 {
        return Err(bad());
    }
    let h: i8 = h.parse().map_err(|_| bad())?;
    let m: i8 = m.parse().map_err(|_| bad())?;
    jiff::civil::Time::new(h, m, 0, 0).map_err(|_| bad())
}

/// The day the nightly audit should cover at `now`: yesterday in `time_zone`, once the
/// local clock has reached `audit_time`; `None` before that.
pub fn due_day(
    now_epoch: f64,
    time_zone: &str,
    audit_time: &str,
) -> Result<Option<DayWindow>, AuditError> {
    let tz = TimeZone::get(time_zone).map_err(|_| AuditError::TimeZone(time_zone.to_owned()))?;
    let at = parse_local_time(audit_time)?;
    let ts = jiff::Timestamp::from_millisecond((now_epoch * 1000.0) as i64)
        .map_err(|e| AuditError::Date(e.to_string()))?;
    if ts.to_zoned(tz).time() < at {
        return Ok(None);
    }
    DayWindow::yesterday(now_epoch, time_zone).map(Some)
}

/// `2026-11-28T23:59:50-05:00`: an instant as a person in the tenant's zone reads it (and a
/// spreadsheet parses it).
pub fn local_timestamp(epoch: f64, time_zone: &str) -> String {
    let tz = TimeZone::get(time_zone).unwrap_or(TimeZone::UTC);
    match jiff::Timestamp::from_millisecond((epoch * 1000.0).round() as i64) {
        Ok(ts) => ts.to_zoned(tz).strftime("%Y-%m-%dT%H:%M:%S%:z").to_string(),
        Err(_) => epoch.to_string(),
    }
}
