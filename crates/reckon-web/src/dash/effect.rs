//! One effect: its record, timeline (events, lookups, resolution) and reconcile state,
//! and its two actions, "resolve by hand" (with a note) and "reconcile now".

use super::chrome::{Chrome, other_tenants, tenant_zone};
use super::csrf::{CsrfOnly, accept, csrf_form};
use super::fmt::{When, age, effect_href, seg, sentence, when_in, when_opt_in};
use super::{PageError, html, not_found, wants_fragment};
use crate::AppState;
use crate::authz::{Permission, allows};
use crate::session::WebSession;
use askama::Template;
use axum::Extension;
use axum::Form;
use axum::extract::rejection::FormRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use jiff::tz::TimeZone;
use reckon_domain::{State as EffectState, UnresolvedKind, time};
use reckon_engine::commands::{self, CommandError};
use reckon_ledger::{Effect, LedgerError, Outcome, ReconcileView, TenantId};
use serde::Deserialize;
use std::collections::HashMap;

/// What is left of an effect's replay window ("3 h 5 min"), or "closed".
pub(super) fn replay_left(st: &AppState, created_at: f64, now: f64) -> String {
    let left = created_at + st.metrics.settings.replay_window.as_secs_f64() - now;
    if left <= 0.0 {
        "closed".into()
    } else {
        age(left)
    }
}

#[derive(Template)]
#[template(path = "effect.html", blocks = ["live"])]
pub struct EffectPage {
    pub c: Chrome,
    pub e: EffectView,
    /// What happened, as support's lookup says it: the page and the lookup read the same
    /// judgement (`reckon_engine::answer`), never two.
    pub answer: Option<AnswerView>,
    /// The answer says a person must check (the page then claims no outcome is known).
    pub needs_person: bool,
    pub timeline: Vec<TimelineItem>,
    pub resolution: Option<ResolutionView>,
    pub reconcile: Option<ReconcileStateView>,
    pub can_resolve: bool,
    pub resolve_href: String,
    pub reconcile_href: String,
    pub message: Option<String>,
    pub error: Option<String>,
    pub note: String,
    /// The outcome the person chose in a refused form, checked again so they need not
    /// choose it twice.
    pub outcome: String,
}

pub struct AnswerView {
    pub verdict: String,
    pub sentence: String,
    pub is_final: bool,
    pub needs_person: bool,
}

pub struct EffectView {
    pub id: i64,
    pub source: String,
    pub key: String,
    pub operation: String,
    pub subject: String,
    pub state: &'static str,
    pub words: String,
    pub attempts: i64,
    pub request_hash: String,
    pub response: String,
    pub created: When,
    pub updated: When,
    pub expires: Option<When>,
    pub first_seen: When,
    pub gone: Option<When>,
    pub gone_reason: String,
    pub unresolved: bool,
    pub replay_left: String,
}

pub struct ResolutionView {
    pub outcome: String,
    pub author: String,
    pub note: String,
    pub at: When,
}

pub struct ReconcileStateView {
    pub lookups: i64,
    /// `None` when reckon will not look again: resolved, given up, or no provider routed.
    pub next_attempt: Option<When>,
    pub last_outcome: String,
    pub last_error: String,
    pub needs_attention: bool,
    pub provider: String,
}

pub struct TimelineItem {
    pub at: When,
    pub class: &'static str,
    pub title: String,
    pub detail: String,
    pub evidence: String,
}

/// How an effect stands, in words for support.
pub fn state_words(e: &Effect, now: f64, tz: &TimeZone) -> String {
    if let Some(g) = e.gone_at {
        return format!(
            "gone from the source ({}) at {}",
            e.gone_reason.as_deref().unwrap_or("removed"),
            when_in(g, tz).text
        );
    }
    match (e.state, e.unresolved_kind) {
        (EffectState::Succeeded, _) => {
            format!("done: succeeded at {}", when_in(e.updated_at, tz).text)
        }
        (EffectState::Failed, _) => {
            format!(
                "failed at {}: the application did not apply it",
                when_in(e.updated_at, tz).text
            )
        }
        (_, Some(UnresolvedKind::Unknown)) => format!(
            "outcome unknown for {}: nobody knows yet whether it happened",
            age(now - e.unresolved_since.unwrap_or(e.updated_at))
        ),
        (_, Some(UnresolvedKind::Abandoned)) => format!(
            "abandoned for {}: its worker stopped before finishing",
            age(now - e.unresolved_since.unwrap_or(e.updated_at))
        ),
        _ => format!("in progress since {}", when_in(e.updated_at, tz).text),
    }
}

#[derive(Deserialize)]
pub struct EffectPath {
    #[allow(
        dead_code,
        reason = "the route guard resolved the path's tenant into the session, which the handler reads"
    )]
    tenant: String,
    source: String,
    key: String,
}

async fn effect_response(
    st: &AppState,
    s: &WebSession,
    path: &EffectPath,
    fragment: bool,
    status: StatusCode,
    flash: Flash,
) -> Result<Response, PageError> {
    let tenant = s.tenant.id;
    let Some(detail) = st
        .ledger
        .get_effect(tenant, &path.source, &path.key)
        .await?
    else {
        return Ok(not_found());
    };
    let view = st.ledger.reconcile_view(tenant, detail.effect.id).await?;
    let tz = tenant_zone(st, tenant).await?;
    let providers: HashMap<i64, String> = if view.attempts.is_empty() && view.state.is_none() {
        HashMap::new()
    } else {
        st.ledger
            .list_providers(tenant)
            .await?
            .into_iter()
            .map(|p| (p.id, p.name))
            .collect()
    };
    let now = time::now();
    let answer = reckon_engine::answer::answer(st.ledger.as_ref(), tenant, &path.key, now, &tz)
        .await
        .ok()
        .and_then(|a| {
            a.effects
                .into_iter()
                .find(|x| x.source == path.source && x.key == path.key)
        })
        .map(|x| AnswerView {
            verdict: x.verdict.as_str().to_owned(),
            sentence: x.sentence,
            is_final: x.is_final,
            needs_person: x.needs_person,
        });
    let mut page = effect_page(st, &tz, s, &detail, &view, &providers, now, flash);
    page.needs_person = answer.as_ref().is_some_and(|a| a.needs_person);
    page.answer = answer;
    if fragment {
        return Ok(html(status, &page.as_live(), true));
    }
    page.c.tenants = other_tenants(st, s).await?;
    Ok(html(status, &page, true))
}

#[derive(Default)]
struct Flash {
    message: Option<String>,
    error: Option<String>,
    note: String,
    outcome: String,
}

#[allow(
    clippy::too_many_arguments,
    reason = "the page is built from each of its parts; a struct of them would only be unpacked again"
)]
fn effect_page(
    st: &AppState,
    tz: &TimeZone,
    s: &WebSession,
    d: &reckon_ledger::EffectDetail,
    view: &ReconcileView,
    providers: &HashMap<i64, String>,
    now: f64,
    flash: Flash,
) -> EffectPage {
    let e = &d.effect;
    let name = |id: Option<i64>| {
        id.and_then(|i| providers.get(&i).cloned())
            .unwrap_or_else(|| "none".into())
    };
    let mut timeline: Vec<(f64, TimelineItem)> = Vec::new();
    for ev in &d.history {
        let change = match (&ev.from_state, &ev.to_state) {
            (Some(a), Some(b)) if a != b => format!("{a} → {b}"),
            (None, Some(b)) => format!("first seen as {b}"),
            (_, Some(b)) => b.clone(),
            _ => String::new(),
        };
        timeline.push((
            ev.observed_at,
            TimelineItem {
                at: when_in(ev.observed_at, tz),
                class: "event",
                title: format!("{} ({})", ev.kind, ev.origin),
                detail: [
                    change,
                    ev.attempts
                        .map(|a| format!("attempts {a}"))
                        .unwrap_or_default(),
                    ev.detail.clone().unwrap_or_default(),
                ]
                .into_iter()
                .filter(|x| !x.is_empty())
                .collect::<Vec<_>>()
                .join(" · "),
                evidence: String::new(),
            },
        ));
    }
    for a in &view.attempts {
        timeline.push((
            a.finished_at,
            TimelineItem {
                at: when_in(a.finished_at, tz),
                class: "attempt",
                title: format!("lookup at {}: {}", name(a.provider_id), a.outcome),
                detail: [
                    a.method
                        .clone()
                        .map(|m| format!("method {m}"))
                        .unwrap_or_default(),
                    a.error
                        .clone()
                        .map(|m| format!("error: {m}"))
                        .unwrap_or_default(),
                ]
                .into_iter()
                .filter(|x| !x.is_empty())
                .collect::<Vec<_>>()
                .join(" · "),
                evidence: serde_json::to_string_pretty(&a.evidence).unwrap_or_default(),
            },
        ));
    }
    if let Some(r) = &view.resolution {
        timeline.push((
            r.created_at,
            TimelineItem {
                at: when_in(r.created_at, tz),
                class: "resolution",
                title: format!("resolved as {} by {}", r.outcome, r.author),
                detail: r.note.clone().unwrap_or_default(),
                evidence: String::new(),
            },
        ));
    }
    // Stable: events of one moment keep the order they were recorded in.
    timeline.sort_by(|a, b| a.0.total_cmp(&b.0));
    let unresolved = e.unresolved_kind.is_some();
    let base = format!("/t/{}", seg(&s.tenant.slug));
    let tail = format!("{}/{}", seg(&e.source), seg(&e.key));
    EffectPage {
        answer: None,
        needs_person: false,
        e: EffectView {
            id: e.id,
            source: e.source.clone(),
            key: e.key.clone(),
            operation: e.operation.clone().unwrap_or_default(),
            subject: e.subject.clone().unwrap_or_default(),
            state: e.state.as_str(),
            // The source keeps saying `unknown` until write-back; say what reckon decided.
            words: match &view.resolution {
                Some(r) if unresolved => format!(
                    "resolved as {} by {} on {}; the application's row still says {} \
                     until it is written back",
                    r.outcome,
                    r.author,
                    when_in(r.created_at, tz).text,
                    e.state.as_str(),
                ),
                _ => state_words(e, now, tz),
            },
            attempts: e.attempts,
            request_hash: e.request_hash.clone(),
            response: e.response_json.clone().unwrap_or_else(|| "null".into()),
            created: when_in(e.created_at, tz),
            updated: when_in(e.updated_at, tz),
            expires: when_opt_in(e.expires_at, tz),
            first_seen: when_in(e.first_seen_at, tz),
            gone: when_opt_in(e.gone_at, tz),
            gone_reason: e.gone_reason.clone().unwrap_or_default(),
            // Resolved here: no longer open, whatever the source's row says.
            unresolved: unresolved && view.resolution.is_none(),
            replay_left: replay_left(st, e.created_at, now),
        },
        timeline: timeline.into_iter().map(|(_, t)| t).collect(),
        resolution: view.resolution.as_ref().map(|r| ResolutionView {
            outcome: r.outcome.to_string(),
            author: r.author.clone(),
            note: r.note.clone().unwrap_or_default(),
            at: when_in(r.created_at, tz),
        }),
        reconcile: view.state.as_ref().map(|x| ReconcileStateView {
            lookups: x.attempts,
            next_attempt: (view.resolution.is_none()
                && unresolved
                && !x.needs_attention
                && x.provider_id.is_some())
            .then(|| when_in(x.next_attempt_at, tz)),
            last_outcome: outcome_words(x.last_outcome, x.non_final),
            last_error: x.last_error.clone().unwrap_or_default(),
            needs_attention: x.needs_attention && view.resolution.is_none(),
            provider: name(x.provider_id),
        }),
        can_resolve: allows(s.role, Permission::ResolveWithNote)
            && unresolved
            && view.resolution.is_none(),
        resolve_href: format!("{base}/resolve/{tail}"),
        reconcile_href: format!("{base}/reconcile/{tail}"),
        message: flash.message,
        error: flash.error,
        note: flash.note,
        outcome: flash.outcome,
        c: Chrome::new(s, "effect"),
    }
}

pub async fn effect(
    State(st): State<AppState>,
    Extension(s): Extension<WebSession>,
    headers: HeaderMap,
    Path(path): Path<EffectPath>,
) -> Result<Response, PageError> {
    effect_response(
        &st,
        &s,
        &path,
        wants_fragment(&headers),
        StatusCode::OK,
        Flash::default(),
    )
    .await
}

#[derive(Deserialize)]
pub struct ResolveForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    outcome: String,
    #[serde(default)]
    note: String,
}

csrf_form!(ResolveForm);

pub async fn resolve(
    State(st): State<AppState>,
    Extension(s): Extension<WebSession>,
    headers: HeaderMap,
    Path(path): Path<EffectPath>,
    form: Result<Form<ResolveForm>, FormRejection>,
) -> Result<Response, PageError> {
    let form = match accept(&s, form) {
        Ok(f) => f,
        Err(refusal) => return Ok(refusal),
    };
    let fragment = wants_fragment(&headers);
    let refuse = |error: String| Flash {
        error: Some(error),
        note: form.note.clone(),
        outcome: form.outcome.clone(),
        message: None,
    };
    // htmx 2 swaps only 2xx answers, so a refusal it should show comes as 200 with the
    // error in the fragment; a plain form post gets the page with the real status.
    let refused = |fragment: bool| {
        if fragment {
            StatusCode::OK
        } else {
            StatusCode::UNPROCESSABLE_ENTITY
        }
    };
    // The form offers what a person on the dashboard can know: it happened, or it did not.
    if !matches!(form.outcome.as_str(), "applied" | "not_applied") {
        let flash = refuse("Choose whether it happened (applied) or not (not applied).".into());
        return effect_response(&st, &s, &path, fragment, refused(fragment), flash).await;
    }
    let tenant = s.tenant.id;
    let decision = commands::Decision {
        source: &path.source,
        key: &path.key,
        outcome: &form.outcome,
        note: &form.note,
        author: s.user.email.clone(),
    };
    let ctx = crate::actions::dash_ctx(&st, &s);
    let flash = match commands::resolve(&ctx, decision).await {
        Ok(r) => {
            st.dash.forget(tenant);
            tracing::info!(tenant = %s.tenant.slug, effect = %format!("{}/{}", path.source, path.key), outcome = %r.outcome, "resolved by hand");
            if !fragment {
                let href = effect_href(&s.tenant.slug, &path.source, &path.key);
                return Ok(Redirect::to(&href).into_response());
            }
            Flash {
                message: Some(format!("Resolved as {}.", r.outcome)),
                ..Flash::default()
            }
        }
        Err(CommandError::Ledger(LedgerError::NotFound(_))) => return Ok(not_found()),
        Err(CommandError::Invalid(why)) => {
            let flash = refuse(sentence(&why));
            return effect_response(&st, &s, &path, fragment, refused(fragment), flash).await;
        }
        Err(CommandError::Exists(why)) => {
            let flash = refuse(format!(
                "{}; see the timeline.",
                sentence(&why).trim_end_matches('.')
            ));
            let status = if fragment {
                StatusCode::OK
            } else {
                StatusCode::CONFLICT
            };
            return effect_response(&st, &s, &path, fragment, status, flash).await;
        }
        Err(e) => return Err(crate::error::ApiError::from(e).into()),
    };
    effect_response(&st, &s, &path, fragment, StatusCode::OK, flash).await
}

pub async fn reconcile_now(
    State(st): State<AppState>,
    Extension(s): Extension<WebSession>,
    headers: HeaderMap,
    Path(path): Path<EffectPath>,
    form: Result<Form<CsrfOnly>, FormRejection>,
) -> Result<Response, PageError> {
    if let Err(refusal) = accept(&s, form) {
        return Ok(refusal);
    }
    let fragment = wants_fragment(&headers);
    let tenant: TenantId = s.tenant.id;
    let Some(detail) = st
        .ledger
        .get_effect(tenant, &path.source, &path.key)
        .await?
    else {
        return Ok(not_found());
    };
    // The shared HTTP client and the default options; the lease owner is this request's.
    let ctx = reckon_engine::reconcile::ReconcileCtx::new(st.ledger.clone())
        .with_egress(st.egress.clone())
        .with_metrics(st.metrics.instance.clone());
    let message = match reckon_engine::reconcile::reconcile_one(&ctx, &s.tenant, detail.effect.id)
        .await
    {
        Ok(Some(o)) => format!("Looked up now: {} ({}).", o.outcome, o.reason),
        Ok(None) => {
            "Not looked up: it is resolved already, or another worker holds it right now.".into()
        }
        Err(e) => return Err(crate::error::ApiError::internal(e).into()),
    };
    // The overview's counts and provider health changed: the person sees their own lookup.
    st.dash.forget(tenant);
    if !fragment {
        let href = effect_href(&s.tenant.slug, &path.source, &path.key);
        return Ok(Redirect::to(&href).into_response());
    }
    let flash = Flash {
        message: Some(message),
        ..Flash::default()
    };
    effect_response(&st, &s, &path, fragment, StatusCode::OK, flash).await
}

/// A lookup's outcome as the effect page says it: a verdict that is not final says so.
fn outcome_words(outcome: Option<Outcome>, non_final: bool) -> String {
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
