//! "Scan now", "test connection" and "test a provider" (`POST /api/v1/sources/{name}/scan`,
//! `.../sources/{name}/test`, `.../providers/{name}/test`), shared with the dashboard's
//! settings forms. A probe's answer is 200 whether the probe succeeded or not: the request
//! did what it was asked, and `ok` says what the source or provider answered.

use crate::AppState;
use crate::auth::Admin;
use crate::error::ApiError;
use crate::extract::ApiPath;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use reckon_engine::probe::{ProbeReport, test_provider, test_source};
use reckon_ledger::{Provider, Source, Tenant};
use reckon_providers::GetClient;
use secrecy::ExposeSecret;
use serde_json::json;

/// Probe a scanned source. A failure is one of the probe's fixed sentences
/// (`reckon_engine::probe::source_failure`), which quote nothing, so nothing is cut out of
/// them: a cut would tell where the stored password matched.
pub(crate) async fn probe_source(st: &AppState, tenant: &Tenant, source: &Source) -> ProbeReport {
    test_source(st.ledger.as_ref(), tenant, source, &st.egress).await
}

/// Probe a provider with its stored key; the key, in any of its encodings, is cut out of
/// any message that quotes it (a provider's key is long and random: no guess put in a
/// setting can match it).
pub(crate) async fn probe_provider(
    st: &AppState,
    tenant: &Tenant,
    provider: &Provider,
) -> ProbeReport {
    let now = reckon_domain::time::now();
    let mut report = test_provider(
        st.ledger.as_ref(),
        tenant,
        provider,
        &st.egress,
        &GetClient::shared(),
        now,
    )
    .await;
    if !report.ok
        && let Ok(Some(key)) = st.ledger.provider_secret(tenant.id, provider).await
    {
        report.message = reckon_domain::Redactor::new([key.expose_secret()]).text(&report.message);
    }
    report
}

/// A scan asked for.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct ScanRequested {
    #[schema(value_type = reckon_engine::schema::Source)]
    source: Source,
    scan_requested_at: f64,
}

/// Ask for a scan now (admin). Accepted: the scheduler of a running `reckon serve` (any
/// replica) starts it within a few seconds.
#[utoipa::path(
    post,
    path = "/sources/{name}/scan",
    operation_id = "scanSource",
    tag = "sources",
    params(("name" = String, Path, description = "The source's name.", example = json!("billing"))),
    responses(
        (status = 202, description = "Asked for.", body = ScanRequested),
        (status = 404, description = "The tenant has no source of that name."),
    )
)]
pub async fn scan(
    State(state): State<AppState>,
    Admin(auth): Admin,
    ApiPath(name): ApiPath<String>,
) -> Result<(StatusCode, Json<ScanRequested>), ApiError> {
    let now = reckon_domain::time::now();
    let source = state
        .ledger
        .request_scan(auth.tenant.id, &name, now)
        .await?;
    crate::actions::by_token(&state, &auth, "source.scan_now", &source.name, json!({})).await;
    Ok((
        StatusCode::ACCEPTED,
        Json(ScanRequested {
            source,
            scan_requested_at: now,
        }),
    ))
}

/// Test a scanned source (admin): connect read-only and query the table. 200 whether or
/// not it worked: `ok` says what the source answered.
#[utoipa::path(
    post,
    path = "/sources/{name}/test",
    operation_id = "testSource",
    tag = "sources",
    params(("name" = String, Path, description = "The source's name.", example = json!("billing"))),
    responses(
        (status = 200, description = "What the source answered.", body = ProbeReport),
        (status = 404, description = "The tenant has no source of that name."),
        (status = 422, description = "A push source: reckon never connects to it."),
    )
)]
pub async fn test(
    State(state): State<AppState>,
    Admin(auth): Admin,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<ProbeReport>, ApiError> {
    let source = state.ledger.source_by_name(auth.tenant.id, &name).await?;
    if !source.kind.is_scanned() {
        return Err(ApiError::Unprocessable(format!(
            "{name:?} is a push source: reckon never connects to it"
        )));
    }
    let report = probe_source(&state, &auth.tenant, &source).await;
    crate::actions::by_token(
        &state,
        &auth,
        "source.test",
        &source.name,
        json!({ "ok": report.ok }),
    )
    .await;
    Ok(Json(report))
}

/// Test a provider (admin): list the last five minutes' charges with its key. 200 whether
/// or not it worked: `ok` says what the provider answered.
#[utoipa::path(
    post,
    path = "/providers/{name}/test",
    operation_id = "testProvider",
    tag = "reconciliation",
    params(("name" = String, Path, description = "The provider's name.")),
    responses(
        (status = 200, description = "What the provider answered.", body = ProbeReport),
        (status = 404, description = "The tenant has no provider of that name."),
    )
)]
pub async fn test_provider_route(
    State(state): State<AppState>,
    Admin(auth): Admin,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<ProbeReport>, ApiError> {
    let provider = state.ledger.provider_by_name(auth.tenant.id, &name).await?;
    let report = probe_provider(&state, &auth.tenant, &provider).await;
    crate::actions::by_token(
        &state,
        &auth,
        "provider.test",
        &provider.name,
        json!({ "ok": report.ok }),
    )
    .await;
    Ok(Json(report))
}
