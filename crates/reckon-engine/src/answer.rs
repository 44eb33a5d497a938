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

use crate::read::LookupReads;
use jiff::tz::TimeZone;
use reckon_domain::{Outcome, State, UnresolvedKind};
use reckon_ledger::{AuditRun, Effect, LedgerError, ReconcileView, Route, StoredCharge, TenantId};
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
    /// The words are [`crate::when::text`]'s, the one way reckon writes a moment for people.
    pub fn new(epoch: f64, tz: &TimeZone) -> Moment {
        Moment {
            epoch,
            rfc3339: match jiff::Timestamp::from_second(epoch.floor() as i64) {
                Ok(ts) => ts.to_string(),
                Err(_) => String::new(),
            },
            text: crate::when::text(epoch, tz),
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
    /// An id the application recorded in its own row (its stored result: a charge, a
    /// PaymentIntent, a refund, a receipt email's message id).
    RecordedId,
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
    /// The provider's customer the charge was made for.
    #[schema(required = true)]
    pub customer: Option<String>,
    pub metadata: Value,
    pub created: Moment,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct EffectAnswer {
    pub source: String,
    pub key: String,
    /// What the effect is, in words ("Charge", "Receipt email", "Refund"): how an order's
    /// effects are told apart, each on its own line.
    pub label: String,
    #[schema(required = true)]
    pub operation: Option<String>,
    #[schema(required = true)]
    pub subject: Option<String>,
    pub verdict: Verdict,
    /// `false` while reckon still re-checks (or nobody knows).
    #[serde(rename = "final")]
    pub is_final: bool,
    pub by: VerdictBy,
    /// The plain sentence support reads out to the customer.
    pub sentence: String,
    /// The technical detail behind the sentence, for whoever checks it (what the
    /// application's row says, the provider's last error, how often reckon asked): never
    /// read to a customer.
    pub details: Vec<String>,
    /// The provider's customer the money was taken from, where the provider named one.
    #[schema(required = true)]
    pub customer: Option<String>,
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
    /// The whole answer: [`Answer::lines`] one per line.
    pub sentence: String,
    /// One line per effect, then one per orphan charge. An order of several effects names
    /// each by what it is ("Charge: …", "Receipt email: …").
    pub lines: Vec<String>,
    pub effects: Vec<EffectAnswer>,
    pub orphans: Vec<OrphanAnswer>,
    /// Near matches of the tenant's own keys, order ids and recorded ids (another case,
    /// stray spaces or quotes, a letter O for a zero, one digit too many, an order number
    /// without its prefix): offered, never answered.
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
pub async fn answer<L: LookupReads + ?Sized>(
    ledger: &L,
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
        let did_you_mean = suggestions(ledger, tenant, q).await?;
        let sentence = match did_you_mean.as_slice() {
            [] => format!(
                "Nothing found for “{q}”: no order, key or payment id the application recorded \
                 matches it, and no charge the provider listed has this id."
            ),
            [v] => format!("Nothing found for “{q}”. Did you mean “{v}”?"),
            vs => format!(
                "Nothing found for “{q}”. Did you mean {}?",
                vs.iter()
                    .map(|v| format!("“{v}”"))
                    .collect::<Vec<_>>()
                    .join(" or ")
            ),
        };
        return Ok(Answer {
            query: q.to_owned(),
            found: false,
            matched_by: MatchedBy::Nothing,
            lines: vec![sentence.clone()],
            sentence,
            effects: Vec::new(),
            orphans: Vec::new(),
            did_you_mean,
            truncated: false,
        });
    }
    let matched_by = if found.by_charge {
        MatchedBy::ProviderObject
    } else if !found.effects.iter().any(|e| key_names(e, q))
        && found
            .effects
            .iter()
            .any(|e| response_ids(e).iter().any(|id| id == q))
    {
        MatchedBy::RecordedId
    } else {
        MatchedBy::Key
    };
    let providers = provider_names(ledger, tenant).await?;
    let routes = ledger.list_routes(tenant).await?;
    let findings = Findings::read(ledger, tenant, &found, tz).await?;
    let charge_fact = |c: &StoredCharge| charge_fact(c, &providers, tz);

    let mut named: HashSet<(i64, &str)> = HashSet::new();
    let mut effects = Vec::new();
    for e in &found.effects {
        let view = ledger.reconcile_view(tenant, e.id).await?;
        let mine = charges_of(e, &found.charges);
        named.extend(mine.iter().map(|c| (c.provider_id, c.charge_id.as_str())));
        let read = Read {
            charges: &mine,
            findings: &findings,
            routes: &routes,
            providers: &providers,
        };
        effects.push(judge_effect(e, &view, &read, now, tz));
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
            // One bracket, the charge's: the customer is named in the words before it.
            let whose = fact
                .customer
                .as_deref()
                .map(|c| format!(" for customer {c} that"))
                .unwrap_or_default();
            let sentence = format!(
                "Charged with no order behind it: {} has a charge{whose} the application has \
                 no record of ({}{}). A person must check before refunding it.{audit}",
                fact.provider,
                charge_words(&fact),
                if fact.status == "succeeded" {
                    String::new()
                } else {
                    format!(", {}", fact.status)
                },
            );
            OrphanAnswer {
                sentence,
                charge: fact,
                findings,
            }
        })
        .collect();
    // Two effects of one kind (a charge in two sources) are told apart by their source.
    let mut kinds: HashMap<&str, usize> = HashMap::new();
    for e in &effects {
        *kinds.entry(e.label.as_str()).or_default() += 1;
    }
    let several = effects.len() + orphans.len() > 1;
    let mut lines: Vec<String> = effects
        .iter()
        .map(|e| match (several, kinds.get(e.label.as_str())) {
            (false, _) => e.sentence.clone(),
            (true, Some(n)) if *n > 1 => format!("{} ({}): {}", e.label, e.source, e.sentence),
            (true, _) => format!("{}: {}", e.label, e.sentence),
        })
        .collect();
    lines.extend(orphans.iter().map(|o| o.sentence.clone()));
    Ok(Answer {
        query: q.to_owned(),
        found: true,
        matched_by,
        sentence: lines.join("\n"),
        lines,
        effects,
        orphans,
        did_you_mean: Vec::new(),
        truncated: found.truncated,
    })
}

/// The lookup's judgement of one effect, as [`answer`] gives it for the effect among the
/// others its search finds: its charges (made with its key, or named by its recorded
/// result), the audit findings naming it and its route, judged by the same [`judge_effect`].
/// The effect's own page reads this, so the page and the lookup cannot disagree.
pub async fn effect_answer<L: LookupReads + ?Sized>(
    ledger: &L,
    tenant: TenantId,
    e: &Effect,
    view: &ReconcileView,
    now: f64,
    tz: &TimeZone,
) -> Result<EffectAnswer, LedgerError> {
    let ids = response_ids(e);
    let charges = ledger
        .charges_by_ids_or_keys(tenant, &ids, std::slice::from_ref(&e.key), 200)
        .await?;
    let found = Found {
        effects: vec![e.clone()],
        charges,
        by_charge: false,
        truncated: false,
    };
    let providers = provider_names(ledger, tenant).await?;
    let routes = ledger.list_routes(tenant).await?;
    let findings = Findings::read(ledger, tenant, &found, tz).await?;
    let mine = charges_of(e, &found.charges);
    let read = Read {
        charges: &mine,
        findings: &findings,
        routes: &routes,
        providers: &providers,
    };
    Ok(judge_effect(e, view, &read, now, tz))
}

/// The provider names of a tenant by id.
async fn provider_names<L: LookupReads + ?Sized>(
    ledger: &L,
    tenant: TenantId,
) -> Result<HashMap<i64, String>, LedgerError> {
    Ok(ledger
        .list_providers(tenant)
        .await?
        .into_iter()
        .map(|p| (p.id, p.name))
        .collect())
}

/// The charges of `charges` that are `e`'s: made with its key, or named by the ids its
/// recorded result holds (a charge, its PaymentIntent).
fn charges_of<'c>(e: &Effect, charges: &'c [StoredCharge]) -> Vec<&'c StoredCharge> {
    let rid = response_ids(e);
    charges
        .iter()
        .filter(|c| {
            c.idempotency_key.as_deref() == Some(e.key.as_str())
                || rid.iter().any(|id| id == &c.charge_id)
                || c.payment_intent
                    .as_deref()
                    .is_some_and(|pi| rid.iter().any(|id| id == pi))
        })
        .collect()
}

/// What was read for judging effects, beside each effect's own reconciliation.
struct Read<'a> {
    /// The effect's own charges ([`charges_of`]).
    charges: &'a [&'a StoredCharge],
    findings: &'a Findings,
    routes: &'a [Route],
    providers: &'a HashMap<i64, String>,
}

/// The one judgement of an effect, for [`answer`] and [`effect_answer`] alike.
fn judge_effect(
    e: &Effect,
    view: &ReconcileView,
    read: &Read<'_>,
    now: f64,
    tz: &TimeZone,
) -> EffectAnswer {
    let route = route_of(read.routes, e);
    let facts = Facts {
        e,
        view,
        charges: read
            .charges
            .iter()
            .map(|c| charge_fact(c, read.providers, tz))
            .collect(),
        findings: read.findings.of_effect(&e.source, &e.key),
        provider: route.and_then(|r| r.provider.clone()),
        routed: route.is_some_and(|r| r.provider_id.is_some()),
    };
    judge(facts, now, tz)
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
    async fn read<L: LookupReads + ?Sized>(
        ledger: &L,
        tenant: TenantId,
        q: &str,
    ) -> Result<Found, LedgerError> {
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

/// At most this many near matches are offered.
const MAX_SUGGESTIONS: usize = 3;
/// At most this many spellings are tried for one search that found nothing (each is a
/// probe of the tenant's indexes, like a search).
const MAX_SPELLINGS: usize = 24;

/// The near matches of `q` that name something of `tenant`'s: each spelling of [`near`]
/// is searched in the tenant's own effects and charges, so nothing of another tenant's is
/// ever offered. An order number without its prefix is tried with the prefixes of the
/// tenant's own order ids.
async fn suggestions<L: LookupReads + ?Sized>(
    ledger: &L,
    tenant: TenantId,
    q: &str,
) -> Result<Vec<String>, LedgerError> {
    let bare = q.trim_matches(|c: char| c == '#' || c == '"' || c == '\'' || c.is_whitespace());
    let prefixes = if !bare.is_empty() && bare.bytes().all(|b| b.is_ascii_digit()) {
        order_prefixes(ledger, tenant).await?
    } else {
        Vec::new()
    };
    let mut out: Vec<String> = Vec::new();
    let mut tried = 0;
    'groups: for group in near(q, &prefixes) {
        for v in group {
            if tried == MAX_SPELLINGS || out.len() == MAX_SUGGESTIONS {
                break 'groups;
            }
            if out.contains(&v) {
                continue;
            }
            tried += 1;
            let f = Found::read(ledger, tenant, &v).await?;
            if !f.effects.is_empty() || !f.charges.is_empty() {
                out.push(v);
                // One guess of a kind: the likeliest spelling of it that exists.
                continue 'groups;
            }
        }
    }
    Ok(out)
}

/// The prefixes of the tenant's order ids ("ORD-" of "ORD-1017", "INV" of "INV2041"): the
/// subjects of its first effects up to their last separator (`-`, `_`, `.`, `#`), or with
/// their trailing number taken off, each once.
async fn order_prefixes<L: LookupReads + ?Sized>(
    ledger: &L,
    tenant: TenantId,
) -> Result<Vec<String>, LedgerError> {
    let sample = ledger
        .list_effects(
            tenant,
            &reckon_ledger::EffectQuery {
                limit: 100,
                now: 0.0,
                ..Default::default()
            },
        )
        .await?;
    let mut out: Vec<String> = Vec::new();
    for e in &sample {
        let Some(subject) = e.subject.as_deref() else {
            continue;
        };
        let prefix = match subject.rfind(['-', '_', '.', '#']) {
            // `i` is the index of an ASCII separator: a char boundary.
            Some(i) => subject.get(..=i).unwrap_or(subject),
            None => subject.trim_end_matches(|c: char| c.is_ascii_digit()),
        };
        if !prefix.is_empty()
            && prefix.len() < subject.len()
            && prefix.len() <= 16
            && !out.iter().any(|p| p == prefix)
        {
            out.push(prefix.to_owned());
            if out.len() == 4 {
                break;
            }
        }
    }
    Ok(out)
}

/// Spellings of `q` a person may have meant, in groups of one kind, likeliest first:
/// another case, without stray quotes, `#` or spaces; a letter typed for a digit (O or o
/// for 0, I or l for 1, beside a digit) or a zero for an O beside letters; one digit too
/// many (a doubled digit, the last one, then each other from the right); a bare number
/// with one of `prefixes`. Each is only offered.
fn near(q: &str, prefixes: &[String]) -> Vec<Vec<String>> {
    let bare = q
        .trim_matches(|c: char| c == '"' || c == '\'' || c == '#' || c.is_whitespace())
        .to_owned();
    let keep = |vs: Vec<String>| -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for v in vs {
            if !v.is_empty() && v != q && !out.contains(&v) {
                out.push(v);
            }
        }
        out
    };
    let squeezed = bare.replace(' ', "");
    let upper = squeezed.to_uppercase();
    let cases = keep(vec![
        bare.clone(),
        bare.to_uppercase(),
        bare.to_lowercase(),
        squeezed.clone(),
        upper.clone(),
    ]);
    let looks = keep(vec![lookalikes(&squeezed), lookalikes(&upper)]);
    let mut extra = Vec::new();
    for base in [lookalikes(&squeezed), lookalikes(&upper)] {
        let chars: Vec<char> = base.chars().collect();
        let without = |i: usize| -> String {
            chars
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, c)| *c)
                .collect()
        };
        let digits: Vec<usize> = (0..chars.len())
            .filter(|i| chars[*i].is_ascii_digit())
            .collect();
        let doubled = digits
            .iter()
            .filter(|i| **i > 0 && chars[**i - 1] == chars[**i])
            .copied();
        let from_right = digits.iter().rev().copied();
        for i in doubled.chain(from_right) {
            extra.push(without(i));
        }
    }
    let extra = keep(extra);
    let prefixed = if !bare.is_empty() && bare.bytes().all(|b| b.is_ascii_digit()) {
        keep(prefixes.iter().map(|p| format!("{p}{bare}")).collect())
    } else {
        Vec::new()
    };
    let mut groups = vec![cases, looks, extra];
    // Each prefix its own guess: "ORD-1017" and "INV-1017" may both exist.
    groups.extend(prefixed.into_iter().map(|v| vec![v]));
    groups.retain(|g| !g.is_empty());
    groups
}

/// `s` with the letters people type for digits put right beside a digit (O or o for 0, I
/// or l for 1), and a 0 with a letter beside it and no digit read as an O.
fn lookalikes(s: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
    let at = |i: Option<usize>| i.and_then(|i| chars.get(i)).copied();
    chars
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (before, after) = (at(i.checked_sub(1)), at(Some(i + 1)));
            let digit = |c: Option<char>| c.is_some_and(|c| c.is_ascii_digit());
            let letter = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphabetic());
            match c {
                'O' | 'o' if digit(before) || digit(after) => '0',
                'I' | 'l' if digit(before) || digit(after) => '1',
                '0' if !digit(before) && !digit(after) && (letter(before) || letter(after)) => {
                    let lower = [before, after]
                        .into_iter()
                        .flatten()
                        .find(char::is_ascii_alphabetic)
                        .is_some_and(|c| c.is_ascii_lowercase());
                    if lower { 'o' } else { 'O' }
                }
                c => *c,
            }
        })
        .collect()
}

/// Whether `q` is `e`'s key, its subject or one of its key's parts (as the search by key
/// matched it), rather than an id of its recorded result.
fn key_names(e: &Effect, q: &str) -> bool {
    e.key == q
        || e.subject.as_deref() == Some(q)
        || reckon_domain::OperationKey::parse(&e.key)
            .is_some_and(|k| k.parts.iter().any(|p| p == q))
}

/// The ids an effect's recorded result names (`{"id": "ch_…"}`, `{"charge_id": …}`,
/// `{"payment_intent": …}`, a receipt's `message_id`), as ingest indexes them.
fn response_ids(e: &Effect) -> Vec<String> {
    e.response_json
        .as_deref()
        .map(reckon_domain::recorded::recorded_ids)
        .unwrap_or_default()
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
    async fn read<L: LookupReads + ?Sized>(
        ledger: &L,
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
        customer: c.customer.clone().filter(|s| !s.is_empty()),
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

/// What an operation is, in words: "Charge", "Refund", "Receipt email" (`send_receipt`),
/// "Invoice email" (`send_invoice`), else its own name with spaces.
pub fn label_of(operation: Option<&str>) -> String {
    let Some(op) = operation else {
        return "Record".into();
    };
    let known = match op {
        "charge" | "capture" | "payment" | "pay" => Some("Charge"),
        "refund" => Some("Refund"),
        "send_receipt" | "receipt" | "email_receipt" => Some("Receipt email"),
        "webhook" | "send_webhook" => Some("Webhook"),
        _ => None,
    };
    if let Some(k) = known {
        return k.into();
    }
    let words = match op.strip_prefix("send_") {
        Some(what) => format!("{} email", what.replace(['_', '-'], " ")),
        None => op.replace(['_', '-'], " "),
    };
    let mut it = words.chars();
    match it.next() {
        Some(f) => f.to_uppercase().chain(it).collect(),
        None => "Record".into(),
    }
}

/// The words for an operation that did or did not happen: ("Charged", "Not charged").
fn done_words(label: &str) -> (&'static str, &'static str) {
    match label {
        "Charge" => ("Charged", "Not charged"),
        "Refund" => ("Refunded", "Not refunded"),
        l if l.ends_with(" email") => ("Sent", "Not sent"),
        _ => ("Done", "Did not happen"),
    }
}

/// What a sentence calls the effects of an operation: "receipt emails", "charges".
fn plural(label: &str) -> String {
    format!("{}s", label.to_lowercase())
}

/// A charge as support reads it out: "ch_123, $20.00, 28 Nov 2026 14:02 CET", and what was
/// refunded of it.
fn charge_words(c: &ChargeFact) -> String {
    let mut s = format!("{}, {}, {}", c.id, c.amount, c.created.text);
    if let Some(r) = &c.refunded {
        s.push_str(&format!(", refunded {r}"));
    }
    s
}

fn list_charges(cs: &[&ChargeFact]) -> String {
    cs.iter()
        .map(|c| charge_words(c))
        .collect::<Vec<_>>()
        .join("; ")
}

/// " (customer cus_9)" for the first charge that names its customer.
fn customer_words(customer: Option<&str>) -> String {
    customer
        .map(|c| format!(" (customer {c})"))
        .unwrap_or_default()
}

/// What to do about charges the provider listed twice or more for one effect: refund each
/// one after the first that is not refunded in full, named with its amount.
fn refund_advice(paid: &[&ChargeFact]) -> String {
    let Some((_, extra)) = paid.split_first() else {
        return String::new();
    };
    let open: Vec<&&ChargeFact> = extra
        .iter()
        .filter(|c| c.refunded.as_deref() != Some(c.amount.as_str()))
        .collect();
    if extra.is_empty() {
        String::new()
    } else if open.is_empty() {
        "The extra charge was already refunded in full: nothing more to refund.".into()
    } else {
        format!(
            "Refund the extra one: {}.",
            open.iter()
                .map(|c| format!("{} ({})", c.id, c.amount))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

/// The amount the application recorded in its result (`{"amount": 2000, "currency":
/// "usd"}`), in words.
fn recorded_amount(e: &Effect) -> Option<String> {
    let v: Value = serde_json::from_str(e.response_json.as_deref()?).ok()?;
    Some(money(
        v.get("amount")?.as_i64()?,
        v.get("currency")?.as_str()?,
    ))
}

/// The error the application recorded for a failure (`{"error": "card_declined"}`), in
/// words ("card declined").
fn recorded_error(e: &Effect) -> Option<String> {
    let v: Value = serde_json::from_str(e.response_json.as_deref()?).ok()?;
    let err = v.get("error")?;
    let code = err
        .as_str()
        .or_else(|| err.get("code").and_then(Value::as_str))
        .or_else(|| err.get("decline_code").and_then(Value::as_str))?;
    (!code.is_empty() && code.len() <= 64).then(|| code.replace(['_', '-'], " "))
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
    /// The payment (its group: a PaymentIntent, or the charge itself).
    id: String,
    /// The charge that took the money, where the provider named one apart from the
    /// payment; else the payment's id.
    charge: String,
    status: Option<String>,
    moved: bool,
    amount: Option<i64>,
    currency: String,
    refunded: i64,
    disputed: bool,
    created: Option<f64>,
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

    /// The imported charge of this payment, if the audit imported it.
    fn imported<'c>(&self, charges: &'c [ChargeFact]) -> Option<&'c ChargeFact> {
        charges.iter().find(|c| {
            c.id == self.charge
                || c.id == self.id
                || c.payment_intent.as_deref() == Some(self.id.as_str())
        })
    }

    /// The payment as support reads it out: "ch_123, $20.00, 28 Nov 2026 14:02 CET" (the
    /// provider's charge list's copy when the audit imported it).
    fn said(&self, charges: &[ChargeFact], tz: &TimeZone) -> String {
        if let Some(c) = self.imported(charges) {
            return charge_words(c);
        }
        let mut parts = vec![self.charge.clone()];
        if let Some(a) = self.amount {
            parts.push(self.amount(a));
        }
        if let Some(t) = self.created {
            parts.push(Moment::new(t, tz).text);
        }
        if self.fully_refunded() {
            parts.push("refunded in full".into());
        } else if self.refunded > 0 {
            parts.push(format!("refunded {}", self.amount(self.refunded)));
        }
        if self.disputed {
            parts.push("disputed by the customer".into());
        }
        parts.join(", ")
    }
}

fn payments_of(evidence: &Value) -> Vec<EvidencePayment> {
    fn text(o: &Value, f: &str) -> Option<String> {
        o.get(f).and_then(Value::as_str).map(str::to_owned)
    }
    let class = evidence.get("classification").unwrap_or(evidence);
    let objects: Vec<&Value> = class
        .get("objects")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .collect();
    let ps = class.get("payments").and_then(Value::as_array);
    ps.into_iter()
        .flatten()
        .filter_map(|p| {
            let id = p
                .get("group")
                .or_else(|| p.get("id"))
                .and_then(Value::as_str)?;
            let mine: Vec<&&Value> = objects
                .iter()
                .filter(|o| o.get("group").and_then(Value::as_str) == Some(id))
                .collect();
            // The charge of the payment: an object of the group that is a charge, else an id
            // the payment names that reads as one, else the payment itself.
            let charge = mine
                .iter()
                .find(|o| o.get("object").and_then(Value::as_str) == Some("charge"))
                .and_then(|o| text(o, "id"))
                .or_else(|| {
                    p.get("object_ids")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_str)
                        .find(|i| i.starts_with("ch_") || i.starts_with("py_"))
                        .map(str::to_owned)
                })
                .unwrap_or_else(|| id.to_owned());
            let created = mine
                .iter()
                .find(|o| text(o, "id").as_deref() == Some(charge.as_str()))
                .or_else(|| mine.first())
                .and_then(|o| o.get("created"))
                .and_then(Value::as_f64);
            Some(EvidencePayment {
                id: id.to_owned(),
                charge,
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
                created,
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
    let label = label_of(e.operation.as_deref());
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
    let details = details(&f, &recorded, resolution.as_ref(), lookup.as_ref());
    // The customer the provider named: on the charges its list holds for the effect.
    let customer = paid
        .iter()
        .copied()
        .chain(f.charges.iter())
        .find_map(|c| c.customer.clone());
    let cust = customer_words(customer.as_deref());

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
            let payments = payments_of(&r.evidence);
            let moved: Vec<&EvidencePayment> = payments.iter().filter(|p| p.moved).collect();
            let said = |ps: &[&EvidencePayment]| {
                ps.iter()
                    .map(|p| p.said(&f.charges, tz))
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            let s = match outcome {
                Verdict::Applied if moved.is_empty() => {
                    format!("Charged once{cust}: the provider confirms one payment.")
                }
                Verdict::Applied => format!("Charged once{cust}: {}.", said(&moved)),
                Verdict::Duplicate => format!(
                    "Charged {}{cust}: {}. {}",
                    times(moved.len().max(2)),
                    if moved.is_empty() {
                        "the provider confirms several payments".to_owned()
                    } else {
                        said(&moved)
                    },
                    duplicate_advice(&r.evidence)
                ),
                Verdict::NotApplied => {
                    let tried: Vec<&EvidencePayment> =
                        payments.iter().filter(|p| !p.moved).collect();
                    format!(
                        "Not charged: the provider shows no payment for it that went through{}. \
                         It is safe to try again.",
                        if tried.is_empty() {
                            String::new()
                        } else {
                            format!(
                                " (tried and not taken: {})",
                                tried
                                    .iter()
                                    .map(|p| p.words())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            )
                        }
                    )
                }
                _ => format!("Resolved as {} by reckon.", words(outcome)),
            };
            // "Not charged" never stands beside money the provider listed for the key: the
            // later finding outranks the verdict, and a person must reconcile the two.
            let against = finding("duplicate")
                .or_else(|| finding("orphan"))
                .or_else(|| finding("charged_not_recorded"))
                .map(|x| {
                    format!(
                        "the audit of {} found money taken for it{}",
                        x.day,
                        x.amount
                            .as_deref()
                            .map(|a| format!(" ({a})"))
                            .unwrap_or_default()
                    )
                });
            if outcome == Verdict::NotApplied && (!paid.is_empty() || against.is_some()) {
                let seen = if paid.is_empty() {
                    against.unwrap_or_default()
                } else {
                    format!(
                        "the provider now lists {} for it: {}",
                        if paid.len() == 1 {
                            "a charge"
                        } else {
                            "charges"
                        },
                        list_charges(&paid)
                    )
                };
                (
                    Verdict::Unknown,
                    false,
                    VerdictBy::Audit,
                    format!(
                        "Contradicted: reckon's first answer was not charged, but {seen}. Do not \
                         try again: a person must check which is right."
                    ),
                    true,
                )
            } else {
                (outcome, true, VerdictBy::Reconciler, s, false)
            }
        }
    } else if let Some(d) = finding("duplicate") {
        let s = if paid.is_empty() {
            format!(
                "Charged more than once{cust}: the audit of {} found a duplicate{}.",
                d.day,
                d.amount
                    .as_deref()
                    .map(|a| format!(" ({a})"))
                    .unwrap_or_default()
            )
        } else {
            format!(
                "Charged {}{cust}: {}. {} The audit of {} lists it as a duplicate.",
                times(paid.len().max(2)),
                list_charges(&paid),
                refund_advice(&paid),
                d.day
            )
        };
        (Verdict::Duplicate, true, VerdictBy::Audit, s, true)
    } else if paid.len() > 1 {
        (
            Verdict::Duplicate,
            true,
            VerdictBy::Audit,
            format!(
                "Charged {}{cust}: {}. {}",
                times(paid.len()),
                list_charges(&paid),
                refund_advice(&paid)
            ),
            true,
        )
    } else if let Some(c) = finding("charged_not_recorded") {
        (
            Verdict::Applied,
            false,
            VerdictBy::Audit,
            format!(
                "Charged{cust}, though the application recorded it as failed or released it: {} \
                 (the audit of {}). Do not charge again; a person must record it as done or \
                 refund it.",
                if paid.is_empty() {
                    c.amount.clone().unwrap_or_else(|| "a charge".into())
                } else {
                    list_charges(&paid)
                },
                c.day
            ),
            true,
        )
    } else if let Some(m) = finding("missing") {
        let mut named: Vec<String> = response_ids(e);
        if let Some(a) = recorded_amount(e).or_else(|| m.amount.clone()) {
            named.push(a);
        }
        (
            Verdict::Missing,
            false,
            VerdictBy::Audit,
            format!(
                "The application recorded it as done{}, but the provider's list of {} has no \
                 charge for it: the charge is missing. A person must check before telling the \
                 customer it was paid.",
                if named.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", named.join(", "))
                },
                m.day,
            ),
            true,
        )
    } else if let (Some(l), true) = (&lookup, unresolved.is_some()) {
        judge_open(&f, l, &paid, now, tz)
    } else if unresolved.is_some() {
        judge_unasked(&f, &paid, now, tz)
    } else {
        judge_recorded(e, &label, &paid, tz)
    };
    EffectAnswer {
        source: e.source.clone(),
        key: e.key.clone(),
        label,
        operation: e.operation.clone(),
        subject: e.subject.clone(),
        verdict,
        is_final,
        by,
        sentence,
        details,
        customer,
        needs_person,
        provider: f.provider.clone(),
        recorded,
        resolution,
        lookup,
        findings: f.findings.clone(),
        charges: f.charges.clone(),
    }
}

/// The technical detail behind a sentence, for whoever checks it: the application's row,
/// the ids it recorded, reckon's asking and the provider's last error, the provider's
/// reason, the audit's findings in its own words.
fn details(
    f: &Facts<'_>,
    recorded: &Recorded,
    resolution: Option<&ResolutionFact>,
    lookup: Option<&LookupState>,
) -> Vec<String> {
    let e = f.e;
    let mut out = Vec::new();
    let attempts = match recorded.attempts {
        1 => "1 attempt".to_owned(),
        n => format!("{n} attempts"),
    };
    out.push(format!(
        "The application's row ({} in {}) says {}{}, {attempts}, last written {}.",
        e.key,
        e.source,
        recorded.state,
        match recorded.unresolved {
            Some("abandoned") => " (an abandoned claim)",
            _ => "",
        },
        recorded.updated.text
    ));
    let ids = response_ids(e);
    if !ids.is_empty() {
        out.push(format!("The application recorded: {}.", ids.join(", ")));
    }
    if let Some(l) = lookup
        && l.lookups > 0
    {
        out.push(format!(
            "reckon asked {} {}{}.",
            f.provider.as_deref().unwrap_or("the provider"),
            match l.lookups {
                1 => "once".to_owned(),
                n => format!("{n} times"),
            },
            l.last_error
                .as_deref()
                .map(|e| format!("; the last answer: {e}"))
                .unwrap_or_default()
        ));
    }
    let evidence = resolution
        .filter(|r| !r.by_person)
        .map(|r| &r.evidence)
        .or_else(|| lookup.and_then(|l| l.evidence.as_ref()));
    if let Some(ev) = evidence {
        let payments = evidence_payments(ev);
        if !payments.is_empty() {
            out.push(format!("Payments the provider showed: {payments}."));
        }
        if let Some(reason) = ev
            .pointer("/classification/reason")
            .and_then(Value::as_str)
            .filter(|r| !r.is_empty())
        {
            out.push(format!(
                "The provider's answer, as reckon read it: {reason}."
            ));
        }
    }
    for x in &f.findings {
        out.push(format!(
            "The audit of {}: {}: {}",
            x.day,
            x.kind.replace('_', " "),
            x.summary
        ));
    }
    out
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
    let payments = l.evidence.as_ref().map(payments_of).unwrap_or_default();
    let moved: Vec<String> = payments
        .iter()
        .filter(|p| p.moved)
        .map(|p| p.said(&f.charges, tz))
        .collect();
    let label = label_of(f.e.operation.as_deref());
    match (l.last_outcome, l.provisional) {
        (Some(Outcome::Applied), true) => (
            Verdict::Applied,
            false,
            VerdictBy::Reconciler,
            format!(
                "Probably charged once{}{}, but the check for a second payment is not complete \
                 yet.{next}",
                customer_words(paid.iter().find_map(|c| c.customer.as_deref())),
                if moved.is_empty() {
                    ": the provider has a payment that went through".to_owned()
                } else {
                    format!(": {}", moved.join("; "))
                }
            ),
            l.needs_attention,
        ),
        (Some(Outcome::NotApplied), true) => (
            Verdict::Unknown,
            false,
            VerdictBy::Reconciler,
            format!(
                "Not found so far, but not proven: the provider shows no payment for it yet, and \
                 that does not prove none was made (it may show one later). Do not try again \
                 yet.{next}"
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
                    format!(
                        " ({})",
                        payments
                            .iter()
                            .map(EvidencePayment::words)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
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
                    "Contradicted: reckon's first answer was not charged, but the provider now \
                     lists {}. Do not try again: a person must check.",
                    list_charges(paid)
                ),
                _ => format!(
                    "Contradicted: the provider's charge list has {} for it, but reckon could \
                     not confirm it. Do not try again: a person must check.",
                    list_charges(paid)
                ),
            },
            true,
        ),
        _ if l.needs_attention => (
            Verdict::Unknown,
            false,
            VerdictBy::Nobody,
            format!(
                "Nobody knows yet whether the {} went through: {} did not answer. A person must \
                 check before telling the customer.{}",
                label.to_lowercase(),
                f.provider.as_deref().unwrap_or("the provider"),
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
    let label = label_of(e.operation.as_deref());
    let why = match e.unresolved_kind {
        Some(UnresolvedKind::Abandoned) => format!(
            "its worker stopped before recording the outcome ({since} ago), so nobody knows \
             whether it happened"
        ),
        _ => format!("the application did not record whether it went through ({since} ago)"),
    };
    if let [c] = paid {
        return (
            Verdict::Applied,
            false,
            VerdictBy::Audit,
            format!(
                "Probably charged once{}: {why}, but the provider's charge list has one charge \
                 for it ({}). reckon's own check for a second payment is still to come.",
                customer_words(c.customer.as_deref()),
                charge_words(c)
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
                plural(&label),
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
fn judge_recorded(e: &Effect, label: &str, paid: &[&ChargeFact], tz: &TimeZone) -> Judged {
    let when = Moment::new(e.updated_at, tz).text;
    let (done, not_done) = done_words(label);
    match e.state {
        State::Succeeded => (
            Verdict::Applied,
            true,
            VerdictBy::Application,
            match paid {
                [c] => format!(
                    "Charged once{}: {}.",
                    customer_words(c.customer.as_deref()),
                    charge_words(c)
                ),
                _ => {
                    let mut named = response_ids(e);
                    named.extend(recorded_amount(e));
                    format!(
                        "{done} once: the application recorded it as done on {when}{}.",
                        if named.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", named.join(", "))
                        }
                    )
                }
            },
            false,
        ),
        State::Failed => (
            Verdict::NotApplied,
            true,
            VerdictBy::Application,
            format!(
                "{not_done}: the application recorded a failure on {when}{}.",
                recorded_error(e)
                    .map(|w| format!(" ({w})"))
                    .unwrap_or_default()
            ),
            false,
        ),
        _ => (
            Verdict::InProgress,
            false,
            VerdictBy::Nobody,
            format!(
                "In progress: the application started it on {when} and is still working on it."
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

    fn spellings(q: &str, prefixes: &[&str]) -> Vec<String> {
        let prefixes: Vec<String> = prefixes.iter().map(|p| (*p).to_owned()).collect();
        near(q, &prefixes).into_iter().flatten().collect()
    }

    #[test]
    fn near_spellings_are_other_cases_and_trimmed_quotes() {
        let n = spellings("ord-1017", &[]);
        assert!(n.contains(&"ORD-1017".to_owned()), "{n:?}");
        let n = spellings("\"ORD-1017\"", &[]);
        assert_eq!(n.first().map(String::as_str), Some("ORD-1017"));
        assert!(spellings("ORD-1017", &[]).iter().all(|v| v != "ORD-1017"));
    }

    #[test]
    fn near_spellings_mend_lookalike_letters_extra_digits_and_bare_numbers() {
        let n = spellings("ORD-1O17", &[]);
        assert_eq!(near("ORD-1O17", &[])[1], ["ORD-1017"], "{n:?}");
        assert!(spellings("0RD-1017", &[]).contains(&"ORD-1017".to_owned()));
        assert!(spellings("ord-1o17", &[]).contains(&"ORD-1017".to_owned()));
        // One digit too many: the last one goes first.
        let extra = near("ORD-10170", &[]);
        let group = extra
            .iter()
            .find(|g| g.contains(&"ORD-1017".to_owned()))
            .unwrap();
        assert_eq!(group[0], "ORD-1017", "{extra:?}");
        // A doubled keystroke before the others.
        let extra = near("ORD-10177", &[]);
        assert!(extra.iter().any(|g| g[0] == "ORD-1017"), "{extra:?}");
        // A bare number takes the tenant's prefixes, never a guess of its own.
        assert!(spellings("1017", &["ORD-"]).contains(&"ORD-1017".to_owned()));
        assert!(spellings("1017", &[]).iter().all(|v| !v.contains('-')));
    }

    #[test]
    fn labels_name_what_an_effect_is() {
        assert_eq!(label_of(Some("charge")), "Charge");
        assert_eq!(label_of(Some("send_receipt")), "Receipt email");
        assert_eq!(label_of(Some("send_invoice")), "Invoice email");
        assert_eq!(label_of(Some("ship_order")), "Ship order");
        assert_eq!(label_of(None), "Record");
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
