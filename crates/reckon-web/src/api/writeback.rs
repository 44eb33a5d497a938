//! Write-back (issue 4 item 7): `POST /api/v1/sources/{name}/writeback[?dry_run=true]`
//! writes the source's resolved effects back into its own rows (or, as a dry run, shows each
//! row's diff and writes nothing); `PUT /api/v1/sources/{name}/writeback` turns the source's
//! write-back on (`{"not_applied": "release" | "fail"}`) or off (`{"not_applied": null}`).
//! Both need `Permission::WriteBack` (the route registry checks it before these run).

use crate::AppState;
use crate::auth::Auth;
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use axum::Json;
use axum::extract::State;
use reckon_engine::writeback::{WritebackCtx, WritebackError, writeback_all, writeback_dry_run};
use reckon_ledger::{Source, WritebackPolicy};
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunQuery {
    #[serde(default)]
    dry_run: bool,
}

pub async fn run(
    State(state): State<AppState>,
    auth: Auth,
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<RunQuery>,
) -> Result<Json<Value>, ApiError> {
    let tenant = auth.tenant.id;
    // 404 for a source of another tenant (or none), before anything else.
    let source = state.ledger.source_by_name(tenant, &name).await?;
    if source.writeback().is_none() {
        return Err(ApiError::Conflict(format!(
            "source {name:?} has write-back off: turn it on with PUT \
             /api/v1/sources/{name}/writeback first"
        )));
    }
    let ctx = WritebackCtx::new(state.ledger.clone(), state.egress.clone());
    let outcomes = if q.dry_run {
        writeback_dry_run(&ctx, tenant, Some(&name)).await
    } else {
        writeback_all(&ctx, tenant, Some(&name)).await
    }
    .map_err(|e| match e {
        WritebackError::Ledger(l) => ApiError::from(l),
        WritebackError::NoSource(s) => ApiError::NotFound(format!("source {s:?} not found")),
        busy @ WritebackError::Busy { .. } => ApiError::Conflict(busy.to_string()),
        other => ApiError::internal(other),
    })?;
    Ok(Json(json!({
        "source": name,
        "dry_run": q.dry_run,
        "outcomes": outcomes,
    })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Setting {
    /// `release`, `fail`, or null (write-back off).
    not_applied: Option<String>,
}

pub async fn set(
    State(state): State<AppState>,
    auth: Auth,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<Setting>,
) -> Result<Json<Source>, ApiError> {
    let policy = match body.not_applied.as_deref() {
        None => None,
        Some(p) => Some(WritebackPolicy::parse(p).ok_or_else(|| {
            ApiError::Unprocessable(format!(
                "not_applied {p:?} is not one of release, fail (or null for write-back off)"
            ))
        })?),
    };
    let source = state
        .ledger
        .set_source_writeback(auth.tenant.id, &name, policy)
        .await?;
    Ok(Json(source))
}
