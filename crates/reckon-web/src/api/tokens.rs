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
use reckon_ledger::{Role, TokenCreator};
use serde::Deserialize;
use serde_json::{Value, json};

pub async fn list(State(state): State<AppState>, auth: Auth) -> Result<Json<Value>, ApiError> {
    let tokens = state.ledger.list_tokens(auth.tenant.id).await?;
    Ok(Json(json!({ "tokens": tokens })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewToken {
    role: String,
    #[serde(default)]
    label: Option<String>,
}

pub async fn create(
    State(state): State<AppState>,
    auth: Auth,
    ApiJson(input): ApiJson<NewToken>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
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
    if label.is_empty() || label.len() > 100 || label.chars().any(char::is_control) {
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
        Json(json!({ "id": id, "role": role, "label": label, "token": token })),
    ))
}

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
