use crate::AppState;
use crate::auth::{Admin, Auth};
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::extract::ApiPath;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use reckon_engine::commands;
use reckon_engine::{SourceEdit, SourceInput};
use reckon_ledger::Source;
use serde::Serialize;

#[derive(Serialize, utoipa::ToSchema)]
pub struct SourceList {
    #[schema(value_type = Vec<reckon_engine::schema::Source>)]
    sources: Vec<Source>,
}

/// The tenant's sources with their scan health.
#[utoipa::path(
    get,
    path = "/sources",
    operation_id = "listSources",
    tag = "sources",
    responses((status = 200, description = "Every source of the token's tenant.", body = SourceList))
)]
pub async fn list(State(state): State<AppState>, auth: Auth) -> Result<Json<SourceList>, ApiError> {
    let sources = state.ledger.list_sources(auth.tenant.id).await?;
    Ok(Json(SourceList { sources }))
}

/// Add a source (admin). A scanned source's DSN is checked against the egress policy now
/// and before every connection; it is stored sealed and never shown again.
#[utoipa::path(
    post,
    path = "/sources",
    operation_id = "createSource",
    tag = "sources",
    request_body = reckon_engine::SourceInput,
    responses(
        (status = 201, description = "Added.", body = reckon_engine::schema::Source),
        (status = 409, description = "A source of that name exists."),
        (status = 413, description = "The body is larger than the server accepts."),
        (status = 422, description = "Not an acceptable source: the name, kind, DSN, table or a duration; `error` says which."),
    )
)]
pub async fn create(
    State(state): State<AppState>,
    Admin(auth): Admin,
    ApiJson(input): ApiJson<SourceInput>,
) -> Result<(StatusCode, Json<Source>), ApiError> {
    // The refusals never quote a DSN beyond its host (fixed sentences, see
    // `reckon_sources::dsn`), so they are answered as they are: cutting a secret out of
    // them would tell the caller where it matched.
    let source = commands::add_source(&crate::actions::api_ctx(&state, &auth), input).await?;
    Ok((StatusCode::CREATED, Json(source)))
}

/// Change a source's settings (admin). Fields left out keep their stored value; the DSN's
/// secret is replaced only when a new one is given (a DSN without a password keeps the
/// stored password). The same checks as adding apply: a new DSN is checked against the
/// egress policy now and before every connection, like one added.
#[utoipa::path(
    patch,
    path = "/sources/{name}",
    operation_id = "editSource",
    tag = "sources",
    params(("name" = String, Path, description = "The source's name.", example = json!("billing"))),
    request_body = reckon_engine::SourceEdit,
    responses(
        (status = 200, description = "Changed.", body = reckon_engine::schema::Source),
        (status = 404, description = "The tenant has no source of that name."),
        (status = 413, description = "The body is larger than the server accepts."),
        (status = 422, description = "Nothing to change, or not an acceptable value; `error` says which."),
    )
)]
pub async fn edit(
    State(state): State<AppState>,
    Admin(auth): Admin,
    ApiPath(name): ApiPath<String>,
    ApiJson(edit): ApiJson<SourceEdit>,
) -> Result<Json<Source>, ApiError> {
    let source =
        commands::edit_source(&crate::actions::api_ctx(&state, &auth), &name, edit).await?;
    Ok(Json(source))
}
