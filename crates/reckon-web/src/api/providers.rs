//! Providers and routes of one tenant (`/api/v1/providers`, `/api/v1/routes`). A provider's
//! secret goes in once and never comes back out: answers carry `has_secret` only.

use crate::AppState;
use crate::auth::Auth;
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use reckon_engine::commands;
pub use reckon_engine::provider_input::{ProviderEdit, ProviderInput, new_provider};
use reckon_ledger::{Provider, Route};
use serde::{Deserialize, Serialize};

/// Change a provider's secret or settings (admin). The stored secret is only sent where it
/// was sent before: a new base_url needs the secret given again.
#[utoipa::path(
    patch,
    path = "/providers/{name}",
    operation_id = "editProvider",
    tag = "reconciliation",
    params(("name" = String, Path, description = "The provider's name.")),
    request_body = ProviderEdit,
    responses(
        (status = 200, description = "Changed.", body = reckon_engine::schema::Provider),
        (status = 404, description = "The tenant has no provider of that name."),
        (status = 413, description = "The body is larger than the server accepts."),
        (status = 422, description = "Nothing to change, or settings the kind does not accept; `error` says which."),
    )
)]
pub async fn edit(
    State(state): State<AppState>,
    auth: Auth,
    ApiPath(name): ApiPath<String>,
    ApiJson(edit): ApiJson<ProviderEdit>,
) -> Result<Json<Provider>, ApiError> {
    let ctx = crate::actions::api_ctx(&state, &auth);
    Ok(Json(commands::edit_provider(&ctx, &name, edit).await?))
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ProviderList {
    #[schema(value_type = Vec<reckon_engine::schema::Provider>)]
    providers: Vec<Provider>,
}

/// The tenant's providers (never their secrets).
#[utoipa::path(
    get,
    path = "/providers",
    operation_id = "listProviders",
    tag = "reconciliation",
    responses((status = 200, description = "Every provider of the token's tenant.", body = ProviderList))
)]
pub async fn list(
    State(state): State<AppState>,
    auth: Auth,
) -> Result<Json<ProviderList>, ApiError> {
    let providers = state.ledger.list_providers(auth.tenant.id).await?;
    Ok(Json(ProviderList { providers }))
}

/// Add a provider (admin): a known kind, settings it understands, a secret where needed, a
/// base URL the egress policy allows.
#[utoipa::path(
    post,
    path = "/providers",
    operation_id = "createProvider",
    tag = "reconciliation",
    request_body = ProviderInput,
    responses(
        (status = 201, description = "Added.", body = reckon_engine::schema::Provider),
        (status = 409, description = "A provider of that name exists."),
        (status = 413, description = "The body is larger than the server accepts."),
        (status = 422, description = "Not an acceptable provider; `error` says why (never quoting the secret)."),
    )
)]
pub async fn create(
    State(state): State<AppState>,
    auth: Auth,
    ApiJson(input): ApiJson<ProviderInput>,
) -> Result<(StatusCode, Json<Provider>), ApiError> {
    let ctx = crate::actions::api_ctx(&state, &auth);
    let provider = commands::add_provider(&ctx, input).await?;
    Ok((StatusCode::CREATED, Json(provider)))
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct RouteList {
    #[schema(value_type = Vec<reckon_engine::schema::Route>)]
    routes: Vec<Route>,
}

/// Which provider answers for which operations of which source.
#[utoipa::path(
    get,
    path = "/routes",
    operation_id = "listRoutes",
    tag = "reconciliation",
    responses((status = 200, description = "Every route of the token's tenant.", body = RouteList))
)]
pub async fn routes(
    State(state): State<AppState>,
    auth: Auth,
) -> Result<Json<RouteList>, ApiError> {
    let routes = state.ledger.list_routes(auth.tenant.id).await?;
    Ok(Json(RouteList { routes }))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RouteInput {
    /// The source's name.
    source: String,
    /// An operation name, or `*` for every operation of the source.
    #[schema(max_length = 63, pattern = "^(\\*|[a-z0-9][a-z0-9_-]*)$")]
    operation: String,
    /// A provider name, or null: no provider can answer (the effect says so).
    #[schema(required = true)]
    provider: Option<String>,
}

/// Set (or replace) the route of one operation pattern of a source (admin).
#[utoipa::path(
    put,
    path = "/routes",
    operation_id = "setRoute",
    tag = "reconciliation",
    request_body = RouteInput,
    responses(
        (status = 200, description = "The route as stored.", body = reckon_engine::schema::Route),
        (status = 404, description = "No source, or no provider, of that name."),
        (status = 413, description = "The body is larger than the server accepts."),
        (status = 422, description = "Not an operation pattern."),
    )
)]
pub async fn set_route(
    State(state): State<AppState>,
    auth: Auth,
    ApiJson(input): ApiJson<RouteInput>,
) -> Result<Json<Route>, ApiError> {
    let ctx = crate::actions::api_ctx(&state, &auth);
    let route = commands::set_route(
        &ctx,
        &input.source,
        &input.operation,
        input.provider.as_deref(),
    )
    .await?;
    Ok(Json(route))
}
