//! `POST /effects?source=NAME`: records pushed by clients for stores reckon cannot reach.
//! The request is refused whole only when its envelope is wrong (too large, not an array,
//! unknown content type); each item inside is judged on its own.

use super::MAX_PUSH_ITEMS;
use crate::AppState;
use crate::auth::Admin;
use crate::error::ApiError;
use crate::extract::ApiQuery;
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode, header};
use reckon_engine::push::{ItemResult, ingest_push};
use reckon_ledger::SourceKind;
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PushParams {
    /// The push source the records belong to.
    #[param(example = json!("billing"))]
    source: String,
}

/// What became of each record, and the counts.
#[derive(Debug, Default, Serialize, utoipa::ToSchema)]
pub struct PushResponse {
    /// One per record, in the order sent.
    results: Vec<ItemResult>,
    created: u64,
    updated: u64,
    unchanged: u64,
    stale: u64,
    rejected: u64,
}

enum BodyFormat {
    JsonArray,
    Ndjson,
}

fn body_format(headers: &HeaderMap) -> Result<BodyFormat, ApiError> {
    let essence = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase());
    match essence.as_deref() {
        Some("application/json") => Ok(BodyFormat::JsonArray),
        Some("application/x-ndjson") => Ok(BodyFormat::Ndjson),
        _ => Err(ApiError::BadRequest(
            "Content-Type must be application/json (an array of records) or \
             application/x-ndjson (one record per line)"
                .into(),
        )),
    }
}

fn too_many(n: usize) -> ApiError {
    ApiError::PayloadTooLarge(format!(
        "{n} records is over the limit of {MAX_PUSH_ITEMS} per request; send them in batches"
    ))
}

/// Split a body into items. A JSON array's elements are items; an NDJSON line that is not
/// JSON becomes an error item for that line only (blank lines are skipped).
fn split_items(format: BodyFormat, body: &[u8]) -> Result<Vec<Result<Value, String>>, ApiError> {
    match format {
        BodyFormat::JsonArray => {
            let value: Value = serde_json::from_slice(body)
                .map_err(|e| ApiError::BadRequest(format!("the body is not JSON: {e}")))?;
            let Value::Array(items) = value else {
                return Err(ApiError::BadRequest(
                    "the body must be a JSON array of records (or use Content-Type: \
                     application/x-ndjson with one record per line)"
                        .into(),
                ));
            };
            if items.len() > MAX_PUSH_ITEMS {
                return Err(too_many(items.len()));
            }
            Ok(items.into_iter().map(Ok).collect())
        }
        BodyFormat::Ndjson => {
            let lines: Vec<(usize, &[u8])> = body
                .split(|b| *b == b'\n')
                .enumerate()
                .map(|(i, line)| (i + 1, line.trim_ascii()))
                .filter(|(_, line)| !line.is_empty())
                .collect();
            if lines.len() > MAX_PUSH_ITEMS {
                return Err(too_many(lines.len()));
            }
            Ok(lines
                .into_iter()
                .map(|(n, line)| {
                    serde_json::from_slice(line).map_err(|e| format!("line {n}: not JSON ({e})"))
                })
                .collect())
        }
    }
}

/// Records of a push source (admin), for stores reckon cannot reach: a JSON array, or
/// NDJSON (one record per line). Each record is judged on its own; the request is refused
/// whole only when its envelope is wrong.
#[utoipa::path(
    post,
    path = "/effects",
    operation_id = "pushEffects",
    tag = "effects",
    params(PushParams),
    request_body(
        description = "At most 10000 records.",
        content(
            (Vec<reckon_engine::push::PushRecord> = "application/json"),
            (String = "application/x-ndjson"),
        )
    ),
    responses(
        (status = 200, description = "Every record's result.", body = PushResponse),
        (status = 404, description = "The tenant has no source of that name."),
        (status = 413, description = "More than 10000 records, or a body over the size limit."),
        (status = 422, description = "The source is scanned, not a push source."),
    )
)]
pub async fn push(
    State(state): State<AppState>,
    Admin(auth): Admin,
    ApiQuery(params): ApiQuery<PushParams>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<PushResponse>, ApiError> {
    let body = body.map_err(|r| match r.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge(format!(
            "the request body is over the limit of {} bytes; send fewer records per request",
            state.max_body_bytes
        )),
        _ => r.into(),
    })?;
    let format = body_format(&headers)?;
    let source = state
        .ledger
        .source_by_name(auth.tenant.id, &params.source)
        .await?;
    if source.kind != SourceKind::Push {
        return Err(ApiError::Unprocessable(format!(
            "source {:?} is a {} source, read by scanning; only push sources accept records",
            source.name,
            source.kind.as_str()
        )));
    }
    let items = split_items(format, &body)?;
    let results = ingest_push(state.ledger.as_ref(), auth.tenant.id, &source, items).await?;
    let mut response = PushResponse::default();
    for r in &results {
        match r.status {
            "created" => response.created += 1,
            "updated" => response.updated += 1,
            "unchanged" => response.unchanged += 1,
            "stale" => response.stale += 1,
            _ => response.rejected += 1,
        }
    }
    response.results = results;
    // Pushed records count as ingested, like scanned ones (`reckon_records_ingested_total`).
    state.metrics.instance.record_scan_success(
        &auth.tenant.slug,
        &source.name,
        response.created + response.updated,
    );
    Ok(Json(response))
}
