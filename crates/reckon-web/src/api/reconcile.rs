//! Reconciliation on demand: look one effect up now, resolve one by hand, re-run the
//! lookups of a provider's indeterminate effects in bulk.
//!
//! The effect routes share the detail route's wildcard (`/effects/{source}/{*key}`), since a
//! key may hold `/`: a POST names its action in the last path segment
//! (`.../{key}/reconcile`, `.../{key}/resolve`). A key is never POSTed to otherwise, so the
//! last segment is always the action.

use crate::AppState;
use crate::auth::Auth;
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath};
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use reckon_domain::time;
use reckon_engine::reconcile::{ReconcileCtx, reconcile_one};
use reckon_ledger::{Effect, LedgerError, NewResolution};
use serde::Deserialize;
use serde_json::{Value, json};

/// The longest note a person may attach (it is evidence, not a document).
const MAX_NOTE: usize = 4000;

async fn find_effect(
    state: &AppState,
    auth: &Auth,
    source: &str,
    key: &str,
) -> Result<Effect, ApiError> {
    state
        .ledger
        .get_effect(auth.tenant.id, source, key)
        .await?
        .map(|f| f.effect)
        .ok_or_else(|| ApiError::NotFound(format!("no effect with that key in source {source:?}")))
}

/// `POST /api/v1/effects/{source}/{key}/reconcile` and `.../resolve`.
pub async fn action(
    State(state): State<AppState>,
    auth: Auth,
    ApiPath((source, tail)): ApiPath<(String, String)>,
    body: Bytes,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let Some((key, action)) = tail.rsplit_once('/') else {
        return Err(ApiError::NotFound(
            "POST to .../{key}/reconcile or .../{key}/resolve".into(),
        ));
    };
    match action {
        "reconcile" => {
            if !body.is_empty() {
                return Err(ApiError::BadRequest("reconcile takes no body".into()));
            }
            reconcile_now(&state, &auth, &source, key).await
        }
        "resolve" => {
            let input: ResolveInput = serde_json::from_slice(&body)
                .map_err(|e| ApiError::BadRequest(format!("the body is not a resolution: {e}")))?;
            resolve(&state, &auth, &source, key, input).await
        }
        other => Err(ApiError::NotFound(format!(
            "no action {other:?}: use reconcile or resolve"
        ))),
    }
}

async fn reconcile_now(
    state: &AppState,
    auth: &Auth,
    source: &str,
    key: &str,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let effect = find_effect(state, auth, source, key).await?;
    let view = state
        .ledger
        .reconcile_view(auth.tenant.id, effect.id)
        .await?;
    if let Some(r) = view.resolution {
        return Err(ApiError::Conflict(format!(
            "the effect is already resolved ({} by {})",
            r.outcome, r.author
        )));
    }
    let ctx = ReconcileCtx::new(state.ledger.clone())
        .with_egress(state.egress.clone())
        .with_metrics(state.metrics.instance.clone());
    let outcome = reconcile_one(&ctx, &auth.tenant, effect.id)
        .await
        .map_err(|e| match e {
            reckon_engine::reconcile::ReconcileError::Ledger(l) => ApiError::from(l),
        })?
        .ok_or_else(|| {
            ApiError::Conflict("another worker is reconciling this effect right now".into())
        })?;
    Ok((StatusCode::OK, Json(json!(outcome))))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResolveInput {
    /// `applied` | `not_applied` | `duplicate`: a person concludes; `indeterminate` is not
    /// a conclusion.
    outcome: String,
    /// Why: required, shown with the resolution forever.
    note: String,
}

async fn resolve(
    state: &AppState,
    auth: &Auth,
    source: &str,
    key: &str,
    input: ResolveInput,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    if !matches!(
        input.outcome.as_str(),
        "applied" | "not_applied" | "duplicate"
    ) {
        return Err(ApiError::Unprocessable(format!(
            "outcome {:?}: a person resolves with applied, not_applied or duplicate",
            input.outcome
        )));
    }
    let note = input.note.trim();
    if note.is_empty() {
        return Err(ApiError::Unprocessable(
            "a note is required: say why (ticket, provider dashboard, conversation)".into(),
        ));
    }
    if note.chars().count() > MAX_NOTE {
        return Err(ApiError::Unprocessable(format!(
            "the note is longer than {MAX_NOTE} characters"
        )));
    }
    let effect = find_effect(state, auth, source, key).await?;
    // What the person saw when deciding, frozen with the decision.
    let view = state
        .ledger
        .reconcile_view(auth.tenant.id, effect.id)
        .await?;
    let evidence = json!({
        "frozen_at": time::now(),
        "effect": {
            "state": effect.state,
            "updated_at": effect.updated_at,
            "attempts": effect.attempts,
            "response": effect.response_json,
        },
        "reconcile_state": view.state,
        "last_attempt": view.attempts.last(),
    });
    let author = match auth.user_id {
        Some(id) => format!("user:{id}"),
        None => format!("token:{}", auth.token_id),
    };
    let resolution = state
        .ledger
        .resolve_by_hand(
            auth.tenant.id,
            effect.id,
            NewResolution {
                outcome: input.outcome,
                author,
                note: Some(note.to_owned()),
                evidence,
            },
        )
        .await
        .map_err(|e| match e {
            LedgerError::Conflict(_) => ApiError::Conflict("the effect is already resolved".into()),
            other => other.into(),
        })?;
    crate::actions::by_token(
        state,
        auth,
        "effect.resolve",
        &format!("{source}/{key}"),
        json!({ "outcome": resolution.outcome, "note": resolution.note }),
    )
    .await;
    Ok((StatusCode::CREATED, Json(json!(resolution))))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequeueInput {
    provider: String,
    /// Effects created in [from, to], epoch seconds.
    from: f64,
    to: f64,
}

/// `POST /api/v1/reconcile/requeue`: every indeterminate effect of one provider created in
/// a time range is due again now (and no longer parked as needing attention).
pub async fn requeue(
    State(state): State<AppState>,
    auth: Auth,
    ApiJson(input): ApiJson<RequeueInput>,
) -> Result<Json<Value>, ApiError> {
    if !(input.from.is_finite() && input.to.is_finite() && input.from <= input.to) {
        return Err(ApiError::Unprocessable(
            "from and to must be epoch seconds with from <= to".into(),
        ));
    }
    let provider = state
        .ledger
        .provider_by_name(auth.tenant.id, &input.provider)
        .await?;
    let n = state
        .ledger
        .requeue_indeterminate(
            auth.tenant.id,
            provider.id,
            input.from,
            input.to,
            time::now(),
        )
        .await?;
    crate::actions::by_token(
        &state,
        &auth,
        "reconcile.requeue",
        &provider.name,
        json!({ "from": input.from, "to": input.to, "requeued": n }),
    )
    .await;
    Ok(Json(json!({ "requeued": n })))
}
