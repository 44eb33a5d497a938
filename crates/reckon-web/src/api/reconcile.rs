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
use axum::response::{IntoResponse, Response};
use reckon_engine::commands;
use reckon_engine::reconcile::{EffectOutcome, ReconcileCtx, reconcile_one};
use reckon_ledger::{Effect, Resolution};
use serde::Deserialize;

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

/// Look one effect up at its provider now (admin; support and above with a note). The
/// reconciler's verdict for it, recorded as any lookup is.
#[utoipa::path(
    post,
    path = "/effects/{source}/{key}/reconcile",
    operation_id = "reconcileEffect",
    tag = "reconciliation",
    params(
        ("source" = String, Path, description = "The source's name.", example = json!("billing")),
        ("key" = String, Path, description = "The effect's whole key.", example = json!("charge:v1:ORD-1")),
    ),
    responses(
        (status = 200, description = "The lookup's outcome.", body = reckon_engine::reconcile::EffectOutcome),
        (status = 404, description = "No effect with that key in that source."),
        (status = 409, description = "Already resolved, or another worker is looking it up right now."),
    )
)]
#[allow(dead_code, reason = "only its description is used")]
pub fn reconcile_doc() {}

/// Resolve one effect by hand, with a note that says why. A person concludes `applied`,
/// `not_applied` or `duplicate`; the resolution is final and shown with its author.
#[utoipa::path(
    post,
    path = "/effects/{source}/{key}/resolve",
    operation_id = "resolveEffect",
    tag = "reconciliation",
    params(
        ("source" = String, Path, description = "The source's name.", example = json!("billing")),
        ("key" = String, Path, description = "The effect's whole key.", example = json!("charge:v1:ORD-1")),
    ),
    request_body = ResolveInput,
    responses(
        (status = 201, description = "Resolved.", body = reckon_engine::schema::Resolution),
        (status = 404, description = "No effect with that key in that source."),
        (status = 409, description = "The effect is already resolved."),
        (status = 413, description = "The body is larger than the server accepts."),
        (status = 422, description = "Not an outcome a person may conclude, or no note; `error` says which."),
    )
)]
#[allow(dead_code, reason = "only its description is used")]
pub fn resolve_doc() {}

/// `POST /api/v1/effects/{source}/{key}/reconcile` and `.../resolve` (described by
/// [`reconcile_doc`] and [`resolve_doc`]: they share the detail route's wildcard).
pub async fn action(
    State(state): State<AppState>,
    auth: Auth,
    ApiPath((source, tail)): ApiPath<(String, String)>,
    body: Bytes,
) -> Result<Response, ApiError> {
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
            Ok(reconcile_now(&state, &auth, &source, key)
                .await?
                .into_response())
        }
        "resolve" => {
            let input: ResolveInput = serde_json::from_slice(&body)
                .map_err(|e| ApiError::BadRequest(format!("the body is not a resolution: {e}")))?;
            Ok(resolve(&state, &auth, &source, key, input)
                .await?
                .into_response())
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
) -> Result<Json<EffectOutcome>, ApiError> {
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
    Ok(Json(outcome))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResolveInput {
    /// A person concludes; `indeterminate` is not a conclusion.
    #[schema(value_type = ManualOutcome)]
    outcome: String,
    /// Why: required, shown with the resolution forever. Surrounding spaces are ignored;
    /// it must hold more than them.
    #[schema(min_length = 1, max_length = 4000)]
    note: String,
}

/// The outcomes a person may conclude.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[allow(
    dead_code,
    reason = "the words the handler checks, for the API document"
)]
pub enum ManualOutcome {
    Applied,
    NotApplied,
    Duplicate,
}

async fn resolve(
    state: &AppState,
    auth: &Auth,
    source: &str,
    key: &str,
    input: ResolveInput,
) -> Result<(StatusCode, Json<Resolution>), ApiError> {
    let decision = commands::Decision {
        source,
        key,
        outcome: &input.outcome,
        note: &input.note,
        author: match auth.user_id {
            Some(id) => format!("user:{id}"),
            None => format!("token:{}", auth.token_id),
        },
    };
    let ctx = crate::actions::api_ctx(state, auth);
    let resolution = commands::resolve(&ctx, decision).await?;
    Ok((StatusCode::CREATED, Json(resolution)))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RequeueInput {
    /// The provider's name.
    provider: String,
    /// Effects created in [from, to], epoch seconds; from <= to.
    from: f64,
    to: f64,
}

#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct Requeued {
    /// How many effects are due again.
    requeued: u64,
}

/// Every indeterminate effect of one provider created in a time range is due again now
/// (and no longer parked as needing attention).
#[utoipa::path(
    post,
    path = "/reconcile/requeue",
    operation_id = "requeueIndeterminate",
    tag = "reconciliation",
    request_body = RequeueInput,
    responses(
        (status = 200, description = "Requeued.", body = Requeued),
        (status = 404, description = "The tenant has no provider of that name."),
        (status = 413, description = "The body is larger than the server accepts."),
        (status = 422, description = "from and to are not a range of epoch seconds."),
    )
)]
pub async fn requeue(
    State(state): State<AppState>,
    auth: Auth,
    ApiJson(input): ApiJson<RequeueInput>,
) -> Result<Json<Requeued>, ApiError> {
    let ctx = crate::actions::api_ctx(&state, &auth);
    let (_, n) = commands::requeue(&ctx, &input.provider, input.from, input.to).await?;
    Ok(Json(Requeued { requeued: n }))
}
