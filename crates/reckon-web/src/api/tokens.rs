//! `/api/v1/tokens`: an admin lists, creates and revokes the tenant's API tokens. A new
//! token's role never exceeds the role of the token that asks for it, and a token made on a
//! person's behalf stays capped by that person's role and dies with their generation.

use crate::AppState;
use crate::auth::{Auth, mint_token};
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use reckon_engine::commands;
use reckon_ledger::{Role, TokenCreator, TokenInfo};
use serde::{Deserialize, Serialize};

#[derive(Serialize, utoipa::ToSchema)]
pub struct TokenList {
    #[schema(value_type = Vec<reckon_engine::schema::TokenInfo>)]
    tokens: Vec<TokenInfo>,
}

/// The tenant's tokens, live and revoked (admin).
#[utoipa::path(
    get,
    path = "/tokens",
    operation_id = "listTokens",
    tag = "tokens",
    responses((status = 200, description = "Every token of the tenant.", body = TokenList))
)]
pub async fn list(State(state): State<AppState>, auth: Auth) -> Result<Json<TokenList>, ApiError> {
    let tokens = state.ledger.list_tokens(auth.tenant.id).await?;
    Ok(Json(TokenList { tokens }))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewToken {
    /// At most the role of the token that asks.
    #[schema(value_type = reckon_engine::schema::Role)]
    role: String,
    /// Default `api`. Printable characters only.
    #[serde(default)]
    #[schema(
        min_length = 1,
        max_length = 100,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"
    )]
    label: Option<String>,
}

/// A new token: the only answer that ever holds it.
#[derive(Serialize, utoipa::ToSchema)]
pub struct CreatedToken {
    id: i64,
    #[schema(value_type = reckon_engine::schema::Role)]
    role: Role,
    label: String,
    /// The token itself (`rkn_...`), shown this once.
    token: String,
}

/// Make a token (admin), of a role at most the asking token's.
#[utoipa::path(
    post,
    path = "/tokens",
    operation_id = "createToken",
    tag = "tokens",
    request_body = NewToken,
    responses(
        (status = 201, description = "Made.", body = CreatedToken),
        (status = 403, description = "The role asked for is above the asking token's."),
        (status = 413, description = "The body is larger than the server accepts."),
        (status = 422, description = "Not a role, or not a label; `error` says which."),
    )
)]
pub async fn create(
    State(state): State<AppState>,
    auth: Auth,
    ApiJson(input): ApiJson<NewToken>,
) -> Result<(StatusCode, Json<CreatedToken>), ApiError> {
    let label = input.label.unwrap_or_else(|| "api".into());
    let (token, hash) = mint_token();
    let request = commands::TokenRequest {
        role: &input.role,
        label: &label,
        creator: match auth.user_id {
            Some(id) => TokenCreator::User { id },
            None => TokenCreator::Operator,
        },
        ceiling: Some(auth.role),
        hash: &hash,
    };
    let ctx = crate::actions::api_ctx(&state, &auth);
    let (id, role) = commands::create_token(&ctx, request).await?;
    // The token is in this answer and nowhere else, ever.
    Ok((
        StatusCode::CREATED,
        Json(CreatedToken {
            id,
            role,
            label: label.trim().to_owned(),
            token,
        }),
    ))
}

/// Revoke a token (admin).
#[utoipa::path(
    delete,
    path = "/tokens/{id}",
    operation_id = "revokeToken",
    tag = "tokens",
    params(("id" = i64, Path, description = "The token's id.")),
    responses(
        (status = 204, description = "Revoked."),
        (status = 404, description = "No live token of that id in this tenant."),
    )
)]
pub async fn revoke(
    State(state): State<AppState>,
    auth: Auth,
    ApiPath(id): ApiPath<i64>,
) -> Result<StatusCode, ApiError> {
    let ctx = crate::actions::api_ctx(&state, &auth);
    commands::revoke_token(&ctx, id).await?;
    Ok(StatusCode::NO_CONTENT)
}
