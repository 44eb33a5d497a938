use crate::AppState;
use crate::auth::Auth;
use crate::error::ApiError;
use crate::extract::{ApiPath, ApiQuery};
use axum::Json;
use axum::extract::State;
use reckon_ledger::{QuarantineCount, QuarantineEntry};
use serde::{Deserialize, Serialize};

#[derive(Serialize, utoipa::ToSchema)]
pub struct QuarantineCounts {
    #[schema(value_type = Vec<reckon_engine::schema::QuarantineCount>)]
    counts: Vec<QuarantineCount>,
}

/// How many rows of each source are quarantined, by reason.
#[utoipa::path(
    get,
    path = "/quarantine",
    operation_id = "quarantineCounts",
    tag = "sources",
    responses((status = 200, description = "Counts by source and reason.", body = QuarantineCounts))
)]
pub async fn counts(
    State(state): State<AppState>,
    auth: Auth,
) -> Result<Json<QuarantineCounts>, ApiError> {
    let counts = state.ledger.quarantine_counts(auth.tenant.id).await?;
    Ok(Json(QuarantineCounts { counts }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EntriesParams {
    /// At most this many entries; default 100.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct QuarantineEntries {
    #[schema(value_type = Vec<reckon_engine::schema::QuarantineEntry>)]
    entries: Vec<QuarantineEntry>,
}

/// A source's quarantined rows with excerpts (support and above).
#[utoipa::path(
    get,
    path = "/sources/{name}/quarantine",
    operation_id = "quarantineEntries",
    tag = "sources",
    params(("name" = String, Path, description = "The source's name.", example = json!("billing")), EntriesParams),
    responses(
        (status = 200, description = "The entries.", body = QuarantineEntries),
        (status = 404, description = "The tenant has no source of that name."),
    )
)]
pub async fn entries(
    State(state): State<AppState>,
    auth: Auth,
    ApiPath(name): ApiPath<String>,
    ApiQuery(params): ApiQuery<EntriesParams>,
) -> Result<Json<QuarantineEntries>, ApiError> {
    let limit = super::effects::page_limit(params.limit)?;
    let source = state.ledger.source_by_name(auth.tenant.id, &name).await?;
    let entries = state
        .ledger
        .list_quarantine(auth.tenant.id, source.id, limit)
        .await?;
    Ok(Json(QuarantineEntries { entries }))
}
