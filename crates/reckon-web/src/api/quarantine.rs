use crate::AppState;
use crate::auth::Auth;
use crate::error::ApiError;
use crate::extract::{ApiPath, ApiQuery};
use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use serde_json::{Value, json};

pub async fn counts(State(state): State<AppState>, auth: Auth) -> Result<Json<Value>, ApiError> {
    let counts = state.ledger.quarantine_counts(auth.tenant.id).await?;
    Ok(Json(json!({ "counts": counts })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntriesParams {
    limit: Option<i64>,
}

pub async fn entries(
    State(state): State<AppState>,
    auth: Auth,
    ApiPath(name): ApiPath<String>,
    ApiQuery(params): ApiQuery<EntriesParams>,
) -> Result<Json<Value>, ApiError> {
    let limit = super::effects::page_limit(params.limit)?;
    let source = state.ledger.source_by_name(auth.tenant.id, &name).await?;
    let entries = state
        .ledger
        .list_quarantine(auth.tenant.id, source.id, limit)
        .await?;
    Ok(Json(json!({ "entries": entries })))
}
