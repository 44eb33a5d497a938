//! One effect as its page shows it: the record, the timeline (events, lookups,
//! resolution), where its reconciliation stands, and the lookup's verdict of it.

use super::LookupReads;
use crate::answer::{EffectAnswer, effect_answer};
use jiff::tz::TimeZone;
use reckon_domain::{State as EffectState, UnresolvedKind};
use reckon_ledger::{
    Effect, EffectEvent, LedgerError, Outcome, ReconcileView, Resolution, TenantId,
};
use std::collections::HashMap;

/// Everything the effect's page says of it. The verdict is the lookup's own
/// ([`crate::answer::effect_answer`]), never judged again here.
#[derive(Debug, Clone)]
pub struct EffectView {
    pub effect: Effect,
    /// Every change reckon observed in the row, oldest first.
    pub history: Vec<EffectEvent>,
    /// Lease, schedule, every attempt with its evidence, and the resolution if any.
    pub reconcile: ReconcileView,
    /// The tenant's zone, in which every time of the page is written.
    pub zone: TimeZone,
    /// How the effect stands in words: what reckon decided when the source still says
    /// `unknown`, else what the source says.
    pub state_words: String,
    /// Nobody knows its outcome: unresolved at the source and not resolved here.
    pub open: bool,
    /// The lookup's verdict of this effect, with its sentence.
    pub answer: EffectAnswer,
    /// Events, lookups and the resolution, in the order they happened.
    pub timeline: Vec<TimelineEntry>,
    /// Where its lookups stand; `None` when reckon never looked it up.
    pub lookups: Option<LookupStanding>,
}

/// One line of the timeline.
#[derive(Debug, Clone)]
pub struct TimelineEntry {
    pub at: f64,
    /// `event`, `attempt` or `resolution`.
    pub class: &'static str,
    pub title: String,
    pub detail: String,
    /// The lookup's evidence, pretty JSON; empty for the others.
    pub evidence: String,
}

/// Where an effect's lookups stand.
#[derive(Debug, Clone)]
pub struct LookupStanding {
    pub lookups: i64,
    /// `None` when reckon will not look again: resolved, given up, or no provider routed.
    pub next_attempt: Option<f64>,
    /// The last lookup's outcome in words (a verdict that is not final says so).
    pub last_outcome: String,
    pub last_error: Option<String>,
    /// Parked for a person (and not resolved since).
    pub needs_attention: bool,
    /// The provider asked, or "none".
    pub provider: String,
}

/// The effect `source`/`key` of `tenant` as of `now`; `None` when it has no such effect.
pub async fn effect_view<L: LookupReads + ?Sized>(
    ledger: &L,
    tenant: TenantId,
    source: &str,
    key: &str,
    now: f64,
) -> Result<Option<EffectView>, LedgerError> {
    let Some(detail) = ledger.get_effect(tenant, source, key).await? else {
        return Ok(None);
    };
    let view = ledger.reconcile_view(tenant, detail.effect.id).await?;
    let zone = super::zone(ledger, tenant).await?;
    let providers: HashMap<i64, String> = if view.attempts.is_empty() && view.state.is_none() {
        HashMap::new()
    } else {
        ledger
            .list_providers(tenant)
            .await?
            .into_iter()
            .map(|p| (p.id, p.name))
            .collect()
    };
    let answer = effect_answer(ledger, tenant, &detail.effect, &view, now, &zone).await?;
    Ok(Some(build(
        detail.effect,
        detail.history,
        view,
        &providers,
        answer,
        zone,
        now,
    )))
}

fn build(
    e: Effect,
    history: Vec<EffectEvent>,
    view: ReconcileView,
    providers: &HashMap<i64, String>,
    answer: EffectAnswer,
    zone: TimeZone,
    now: f64,
) -> EffectView {
    let name = |id: Option<i64>| {
        id.and_then(|i| providers.get(&i).cloned())
            .unwrap_or_else(|| "none".into())
    };
    let unresolved = e.unresolved_kind.is_some();
    let resolved = view.resolution.is_some();
    let timeline = timeline(&history, &view, &name);
    // The source keeps saying `unknown` until write-back; say what reckon decided.
    let state_words = match &view.resolution {
        Some(r) if unresolved => resolved_words(r, &e, &zone),
        _ => state_words(&e, now, &zone),
    };
    let lookups = view.state.as_ref().map(|x| LookupStanding {
        lookups: x.attempts,
        next_attempt: (!resolved && unresolved && !x.needs_attention && x.provider_id.is_some())
            .then_some(x.next_attempt_at),
        last_outcome: outcome_words(x.last_outcome, x.non_final),
        last_error: x.last_error.clone(),
        needs_attention: x.needs_attention && !resolved,
        provider: name(x.provider_id),
    });
    EffectView {
        open: unresolved && !resolved,
        state_words,
        timeline,
        lookups,
        answer,
        effect: e,
        history,
        reconcile: view,
        zone,
    }
}

fn resolved_words(r: &Resolution, e: &Effect, tz: &TimeZone) -> String {
    format!(
        "resolved as {} by {} on {}; the application's row still says {} until it is \
         written back",
        r.outcome,
        r.author,
        crate::when::text(r.created_at, tz),
        e.state.as_str(),
    )
}

fn timeline(
    history: &[EffectEvent],
    view: &ReconcileView,
    name: &dyn Fn(Option<i64>) -> String,
) -> Vec<TimelineEntry> {
    let joined = |parts: [String; 3]| {
        parts
            .into_iter()
            .filter(|x| !x.is_empty())
            .collect::<Vec<_>>()
            .join(" · ")
    };
    let mut out: Vec<TimelineEntry> = Vec::new();
    for ev in history {
        let change = match (&ev.from_state, &ev.to_state) {
            (Some(a), Some(b)) if a != b => format!("{a} → {b}"),
            (None, Some(b)) => format!("first seen as {b}"),
            (_, Some(b)) => b.clone(),
            _ => String::new(),
        };
        out.push(TimelineEntry {
            at: ev.observed_at,
            class: "event",
            title: format!("{} ({})", ev.kind, ev.origin),
            detail: joined([
                change,
                ev.attempts
                    .map(|a| format!("attempts {a}"))
                    .unwrap_or_default(),
                ev.detail.clone().unwrap_or_default(),
            ]),
            evidence: String::new(),
        });
    }
    for a in &view.attempts {
        out.push(TimelineEntry {
            at: a.finished_at,
            class: "attempt",
            title: format!("lookup at {}: {}", name(a.provider_id), a.outcome),
            detail: joined([
                a.method
                    .clone()
                    .map(|m| format!("method {m}"))
                    .unwrap_or_default(),
                a.error
                    .clone()
                    .map(|m| format!("error: {m}"))
                    .unwrap_or_default(),
                String::new(),
            ]),
            evidence: serde_json::to_string_pretty(&a.evidence).unwrap_or_default(),
        });
    }
    if let Some(r) = &view.resolution {
        out.push(TimelineEntry {
            at: r.created_at,
            class: "resolution",
            title: format!("resolved as {} by {}", r.outcome, r.author),
            detail: r.note.clone().unwrap_or_default(),
            evidence: String::new(),
        });
    }
    // Stable: events of one moment keep the order they were recorded in.
    out.sort_by(|a, b| a.at.total_cmp(&b.at));
    out
}

/// How an effect stands, in words for support.
pub fn state_words(e: &Effect, now: f64, tz: &TimeZone) -> String {
    let text = |t: f64| crate::when::text(t, tz);
    if let Some(g) = e.gone_at {
        return format!(
            "gone from the source ({}) at {}",
            e.gone_reason.as_deref().unwrap_or("removed"),
            text(g)
        );
    }
    let age = crate::answer::age;
    match (e.state, e.unresolved_kind) {
        (EffectState::Succeeded, _) => format!("done: succeeded at {}", text(e.updated_at)),
        (EffectState::Failed, _) => format!(
            "failed at {}: the application did not apply it",
            text(e.updated_at)
        ),
        (_, Some(UnresolvedKind::Unknown)) => format!(
            "outcome unknown for {}: nobody knows yet whether it happened",
            age(now - e.unresolved_since.unwrap_or(e.updated_at))
        ),
        (_, Some(UnresolvedKind::Abandoned)) => format!(
            "abandoned for {}: its worker stopped before finishing",
            age(now - e.unresolved_since.unwrap_or(e.updated_at))
        ),
        _ => format!("in progress since {}", text(e.updated_at)),
    }
}

/// A lookup's outcome as the effect page says it: a verdict that is not final says so.
pub fn outcome_words(outcome: Option<Outcome>, non_final: bool) -> String {
    match (outcome, non_final) {
        (None, _) => "none yet".into(),
        (Some(Outcome::Applied), true) => {
            "applied, provisional (the check for a second payment is not complete yet; \
             re-checked, never written back)"
                .into()
        }
        (Some(Outcome::Indeterminate), true) => {
            "indeterminate: a payment can still move money (re-checked until it settles)".into()
        }
        (Some(Outcome::NotApplied), true) => {
            "not found so far, not proven (nothing vouches that the lookup could have seen the \
             payment; re-checked, never written back)"
                .into()
        }
        (Some(o), _) => o.to_string(),
    }
}
