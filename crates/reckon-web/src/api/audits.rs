//! `/api/v1/audits`: the tenant's audit runs (JSON, or CSV for finance) and a
//! POST that runs one. Every route needs `Permission::Audit` (finance and admin).

use crate::AppState;
use crate::auth::Auth;
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use reckon_engine::audit::{AuditCtx, AuditRequest, AuditRunError, findings_csv, run_audit};
use reckon_ledger::AuditRun;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

impl From<AuditRunError> for ApiError {
    fn from(e: AuditRunError) -> Self {
        match e {
            AuditRunError::Invalid(m) => ApiError::Unprocessable(m),
            AuditRunError::Ledger(l) => l.into(),
        }
    }
}

/// A run without its findings and evidence (the list view).
fn summary(r: &AuditRun) -> Value {
    json!({
        "id": r.id, "seq": r.seq, "day": r.run.day, "time_zone": r.run.time_zone,
        "provider": r.run.provider, "triggered_by": r.run.triggered_by,
        "status": r.run.status, "reason": r.run.reason,
        "started_at": r.run.started_at, "finished_at": r.run.finished_at,
        "counts": r.run.counts, "totals": r.run.totals, "digest": r.digest,
    })
}

fn check_date(d: &str) -> Result<(), ApiError> {
    date_shape(d).map_err(ApiError::BadRequest)
}

/// `YYYY-MM-DD`, a real calendar date.
fn date_shape(d: &str) -> Result<(), String> {
    let ok = d.len() == 10
        && d.as_bytes()[4] == b'-'
        && d.as_bytes()[7] == b'-'
        && d.chars()
            .enumerate()
            .all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit());
    let valid = ok
        && d.get(5..7)
            .and_then(|m| m.parse::<u8>().ok())
            .is_some_and(|m| (1..=12).contains(&m))
        && d.get(8..)
            .and_then(|x| x.parse::<u8>().ok())
            .is_some_and(|x| (1..=31).contains(&x));
    if valid {
        Ok(())
    } else {
        Err(format!("date {d:?} is not a date (use YYYY-MM-DD)"))
    }
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// Only the runs of this tenant-local day.
    #[param(format = Date, pattern = "^[0-9]{4}-[0-9]{2}-[0-9]{2}$")]
    date: Option<String>,
    /// At most this many runs; default 100.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct AuditRunList {
    /// Newest first, without findings and evidence.
    #[schema(value_type = Vec<reckon_engine::schema::AuditRunSummary>)]
    runs: Vec<Value>,
    /// With `date`: the id of the run that counts for that day, the one the dashboard's
    /// overview and audit page show (the day's newest complete run, else its newest partial
    /// run, else its newest run); `null` without `date` or when the day has no run.
    #[schema(required = true)]
    day_run: Option<i64>,
}

/// One stored audit run, whole.
#[derive(Serialize, utoipa::ToSchema)]
pub struct AuditRunDetail {
    #[schema(value_type = reckon_engine::schema::AuditRun)]
    run: AuditRun,
}

/// The tenant's audit runs (finance and admin).
#[utoipa::path(
    get,
    path = "/audits",
    operation_id = "listAudits",
    tag = "audit",
    params(ListParams),
    responses((status = 200, description = "The runs.", body = AuditRunList))
)]
pub async fn list(
    State(state): State<AppState>,
    auth: Auth,
    ApiQuery(p): ApiQuery<ListParams>,
) -> Result<Json<AuditRunList>, ApiError> {
    if let Some(d) = &p.date {
        check_date(d)?;
    }
    let limit = super::effects::page_limit(p.limit)?;
    let runs = state
        .ledger
        .list_audit_runs(auth.tenant.id, p.date.as_deref(), limit)
        .await?;
    let day_run = match &p.date {
        Some(d) => state
            .ledger
            .audit_glance(auth.tenant.id, d)
            .await?
            .map(|g| g.id),
        None => None,
    };
    Ok(Json(AuditRunList {
        runs: runs.iter().map(summary).collect(),
        day_run,
    }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DetailParams {
    /// The findings as CSV (an export, recorded in the audit log) or the run as JSON.
    /// Without it, `Accept: text/csv` asks for CSV.
    #[param(value_type = Option<DetailFormat>, inline)]
    format: Option<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[allow(
    dead_code,
    reason = "the words the handler checks, for the API document"
)]
pub enum DetailFormat {
    Json,
    Csv,
}

/// One audit run with its findings (finance and admin), as JSON or as CSV.
#[utoipa::path(
    get,
    path = "/audits/{id}",
    operation_id = "getAudit",
    tag = "audit",
    params(("id" = i64, Path, description = "The run's id."), DetailParams),
    responses(
        (status = 200, description = "The run.", content(
            (AuditRunDetail = "application/json"),
            (String = "text/csv"),
        )),
        (status = 404, description = "No run of that id in this tenant."),
    )
)]
pub async fn detail(
    State(state): State<AppState>,
    auth: Auth,
    headers: HeaderMap,
    ApiPath(id): ApiPath<String>,
    ApiQuery(p): ApiQuery<DetailParams>,
) -> Result<Response, ApiError> {
    let id: i64 = id
        .parse()
        .map_err(|_| ApiError::BadRequest(format!("audit id {id:?} is not a number")))?;
    let csv = match p.format.as_deref() {
        Some("csv") => true,
        Some("json") => false,
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "format {other:?} (use json or csv)"
            )));
        }
        None => headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.split(',').any(|t| t.trim().starts_with("text/csv"))),
    };
    let run = state
        .ledger
        .get_audit_run(auth.tenant.id, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no audit run {id}")))?;
    if csv {
        let body = findings_csv(&run).map_err(ApiError::internal)?;
        // An export leaves the building: the audit log says who took it.
        crate::actions::by_token(
            &state,
            &auth,
            "export",
            &format!("audit:{}", run.id),
            json!({ "format": "csv", "day": run.run.day }),
        )
        .await;
        let name = format!(
            "attachment; filename=\"reckon-audit-{}-{}.csv\"",
            run.run.day, run.id
        );
        return Ok((
            [
                (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_owned()),
                (header::CONTENT_DISPOSITION, name),
            ],
            body,
        )
            .into_response());
    }
    Ok(Json(AuditRunDetail { run }).into_response())
}

#[derive(Debug, Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditRunInput {
    /// The tenant-local day; default yesterday.
    #[schema(format = Date, pattern = "^[0-9]{4}-[0-9]{2}-[0-9]{2}$")]
    date: Option<String>,
    /// One provider's charges; default every provider the tenant audits.
    provider: Option<String>,
}

/// Run the audit of a day now (finance and admin): import, audit, store. Answers with the
/// stored run, complete or failed; 201 either way (a failed run is stored too, with its
/// reason).
#[utoipa::path(
    post,
    path = "/audits",
    operation_id = "runAudit",
    tag = "audit",
    request_body = AuditRunInput,
    responses(
        (status = 201, description = "The stored run.", body = AuditRunDetail),
        (status = 404, description = "No provider of that name."),
        (status = 409, description = "Another run of that day is in progress."),
        (status = 413, description = "The body is larger than the server accepts."),
        (status = 422, description = "A day or provider the audit cannot run for; `error` says why."),
    )
)]
pub async fn run(
    State(state): State<AppState>,
    auth: Auth,
    ApiJson(input): ApiJson<AuditRunInput>,
) -> Result<(StatusCode, Json<AuditRunDetail>), ApiError> {
    if let Some(d) = &input.date {
        check_date(d)?;
    }
    let mut ctx = AuditCtx::new(state.ledger.clone());
    ctx.metrics = Some(state.metrics.instance.clone());
    ctx.egress = state.egress.clone();
    let by = match auth.user_id {
        Some(u) => format!("user:{u}"),
        None => format!("token:{}", auth.token_id),
    };
    let req = AuditRequest {
        date: input.date,
        provider: input.provider,
        triggered_by: by,
        now: reckon_domain::time::now(),
    };
    let run = run_audit(&ctx, auth.tenant.id, &req, None).await?;
    Ok((StatusCode::CREATED, Json(AuditRunDetail { run })))
}
