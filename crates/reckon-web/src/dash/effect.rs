//! One effect: its record, timeline (events, lookups, resolution) and reconcile state,
//! and its two actions, "resolve by hand" (with a note) and "reconcile now".

use super::chrome::{Chrome, other_tenants};
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
use reckon_domain::time;
use reckon_engine::commands::{self, CommandError};
use reckon_engine::read::effect::effect_view;
use reckon_ledger::{LedgerError, TenantId};
use serde::Deserialize;

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
    /// What happened, as support's lookup says it: the lookup's own judgement of this effect
    /// (`reckon_engine::answer::effect_answer`, read by the effect's read model), never two.
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
    let now = time::now();
    let Some(view) = effect_view(&*st.ledger, s.tenant.id, &path.source, &path.key, now).await?
    else {
        return Ok(not_found());
    };
    let page = effect_page(st, s, &view, now, flash);
    if fragment {
        return Ok(html(status, &page.as_live(), true));
    }
    let mut page = page;
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

/// The page of a read [`reckon_engine::read::effect::EffectView`]: its words as the model
/// has them, its times in the tenant's zone.
fn effect_page(
    st: &AppState,
    s: &WebSession,
    v: &reckon_engine::read::effect::EffectView,
    now: f64,
    flash: Flash,
) -> EffectPage {
    let e = &v.effect;
    let tz = &v.zone;
    let base = format!("/t/{}", seg(&s.tenant.slug));
    let tail = format!("{}/{}", seg(&e.source), seg(&e.key));
    let a = &v.answer;
    EffectPage {
        answer: Some(AnswerView {
            verdict: a.verdict.as_str().to_owned(),
            sentence: a.sentence.clone(),
            is_final: a.is_final,
            needs_person: a.needs_person,
        }),
        needs_person: a.needs_person,
        e: EffectView {
            id: e.id,
            source: e.source.clone(),
            key: e.key.clone(),
            operation: e.operation.clone().unwrap_or_default(),
            subject: e.subject.clone().unwrap_or_default(),
            state: e.state.as_str(),
            words: v.state_words.clone(),
            attempts: e.attempts,
            request_hash: e.request_hash.clone(),
            response: e.response_json.clone().unwrap_or_else(|| "null".into()),
            created: when_in(e.created_at, tz),
            updated: when_in(e.updated_at, tz),
            expires: when_opt_in(e.expires_at, tz),
            first_seen: when_in(e.first_seen_at, tz),
            gone: when_opt_in(e.gone_at, tz),
            gone_reason: e.gone_reason.clone().unwrap_or_default(),
            unresolved: v.open,
            replay_left: replay_left(st, e.created_at, now),
        },
        timeline: v
            .timeline
            .iter()
            .map(|t| TimelineItem {
                at: when_in(t.at, tz),
                class: t.class,
                title: t.title.clone(),
                detail: t.detail.clone(),
                evidence: t.evidence.clone(),
            })
            .collect(),
        resolution: v.reconcile.resolution.as_ref().map(|r| ResolutionView {
            outcome: r.outcome.to_string(),
            author: r.author.clone(),
            note: r.note.clone().unwrap_or_default(),
            at: when_in(r.created_at, tz),
        }),
        reconcile: v.lookups.as_ref().map(|x| ReconcileStateView {
            lookups: x.lookups,
            next_attempt: x.next_attempt.map(|t| when_in(t, tz)),
            last_outcome: x.last_outcome.clone(),
            last_error: x.last_error.clone().unwrap_or_default(),
            needs_attention: x.needs_attention,
            provider: x.provider.clone(),
        }),
        can_resolve: allows(s.role, Permission::ResolveWithNote) && v.open,
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
