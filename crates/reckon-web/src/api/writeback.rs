//! Write-back: `POST /api/v1/sources/{name}/writeback[?dry_run=true]`
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
use reckon_engine::writeback::{
    WritebackCtx, WritebackError, WritebackOutcome, writeback_all, writeback_dry_run,
};
use reckon_ledger::{Source, WritebackPolicy};
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RunQuery {
    /// Show each row's diff and write nothing.
    #[serde(default)]
    dry_run: bool,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct WritebackRun {
    source: String,
    dry_run: bool,
    outcomes: Vec<WritebackOutcome>,
}

/// Write the source's resolved effects back into its own rows (or, as a dry run, show each
/// row's diff and write nothing).
#[utoipa::path(
    post,
    path = "/sources/{name}/writeback",
    operation_id = "runWriteback",
    tag = "writeback",
    params(("name" = String, Path, description = "The source's name.", example = json!("billing")), RunQuery),
    responses(
        (status = 200, description = "Each write-back's outcome.", body = WritebackRun),
        (status = 404, description = "The tenant has no source of that name."),
        (status = 409, description = "Write-back is off for the source, or another run holds it."),
    )
)]
pub async fn run(
    State(state): State<AppState>,
    auth: Auth,
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<RunQuery>,
) -> Result<Json<WritebackRun>, ApiError> {
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
    Ok(Json(WritebackRun {
        source: name,
        dry_run: q.dry_run,
        outcomes,
    }))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WritebackSetting {
    /// What to do with a `not_applied` resolution; null turns write-back off. Required:
    /// a body that forgot it must not turn write-back off by accident.
    #[serde(default, deserialize_with = "present")]
    #[schema(required = true, value_type = Option<reckon_engine::schema::WritebackPolicy>)]
    not_applied: Option<Option<String>>,
}

/// A field that is there, null or not: `Some(None)` for null, `None` (the default) when
/// the field is missing.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

/// Turn the source's write-back on (with its `not_applied` policy) or off.
#[utoipa::path(
    put,
    path = "/sources/{name}/writeback",
    operation_id = "setWriteback",
    tag = "writeback",
    params(("name" = String, Path, description = "The source's name.", example = json!("billing"))),
    request_body = WritebackSetting,
    responses(
        (status = 200, description = "The source with its new setting.", body = reckon_engine::schema::Source),
        (status = 404, description = "The tenant has no source of that name."),
        (status = 413, description = "The body is larger than the server accepts."),
        (status = 422, description = "Not a policy."),
    )
)]
pub async fn set(
    State(state): State<AppState>,
    auth: Auth,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<WritebackSetting>,
) -> Result<Json<Source>, ApiError> {
    let Some(not_applied) = body.not_applied else {
        return Err(ApiError::Unprocessable(
            "give not_applied: release, fail, or null to turn write-back off".into(),
        ));
    };
    let policy = match not_applied.as_deref() {
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
