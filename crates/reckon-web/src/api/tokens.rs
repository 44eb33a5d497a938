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
use reckon_ledger::{Role, TokenCreator, TokenInfo};
use serde::{Deserialize, Serialize};
use serde_json::json;

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
    let role = Role::parse(&input.role).ok_or_else(|| {
        ApiError::Unprocessable(format!(
            "role {:?} is not one of viewer, support, finance, admin",
            input.role
        ))
    })?;
    if role > auth.role {
        return Err(ApiError::Forbidden(format!(
            "a token cannot make a token with a higher role ({}) than its own ({})",
            role.as_str(),
            auth.role.as_str()
        )));
    }
    let label = input.label.unwrap_or_else(|| "api".into());
    // Characters, not bytes: the limit the API document states (JSON Schema's maxLength).
    if label.is_empty() || label.chars().count() > 100 || label.chars().any(char::is_control) {
        return Err(ApiError::Unprocessable(
            "label must be 1-100 printable characters".into(),
        ));
    }
    let creator = match auth.user_id {
        Some(id) => TokenCreator::User { id },
        None => TokenCreator::Operator,
    };
    let (token, hash) = mint_token();
    let id = state
        .ledger
        .create_token_by(auth.tenant.id, role, &hash, &label, creator)
        .await?;
    crate::actions::by_token(
        &state,
        &auth,
        "token.create",
        &format!("token:{id}"),
        json!({ "role": role, "label": label }),
    )
    .await;
    // The token is in this answer and nowhere else, ever.
    Ok((
        StatusCode::CREATED,
        Json(CreatedToken {
            id,
            role,
            label,
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
    if state.ledger.revoke_token(auth.tenant.id, id).await? {
        crate::actions::by_token(
            &state,
            &auth,
            "token.revoke",
            &format!("token:{id}"),
            json!({}),
        )
        .await;
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::NotFound(format!(
            "no live token {id} in this tenant"
        )))
    }
}
