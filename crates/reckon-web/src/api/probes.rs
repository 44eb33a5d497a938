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
use serde_json::{Value, json};

/// Probe a scanned source. The message comes from drivers and servers the tenant runs;
/// whatever of the DSN's secret it might quote is cut out before anyone sees it.
pub(crate) async fn probe_source(st: &AppState, tenant: &Tenant, source: &Source) -> ProbeReport {
    let mut report = test_source(st.ledger.as_ref(), tenant, source, &st.egress).await;
    if !report.ok {
        let secrets = match st.ledger.source_dsn(tenant.id, source).await {
            Ok(dsn) => super::sources::dsn_secrets(Some(dsn.expose_secret())),
            Err(_) => Vec::new(),
        };
        report.message = super::sources::scrub(report.message, &secrets);
    }
    report
}

/// Probe a provider with its stored key; the key is cut out of any message that quotes it.
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
        report.message = super::sources::scrub(report.message, &[key.expose_secret().to_owned()]);
    }
    report
}

/// `POST /api/v1/sources/{name}/scan`: ask for a scan now. Accepted (202): the scheduler
/// of a running `reckon serve` (any replica) starts it within a few seconds.
pub async fn scan(
    State(state): State<AppState>,
    Admin(auth): Admin,
    ApiPath(name): ApiPath<String>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let now = reckon_domain::time::now();
    let source = state
        .ledger
        .request_scan(auth.tenant.id, &name, now)
        .await?;
    crate::actions::by_token(&state, &auth, "source.scan_now", &source.name, json!({})).await;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "source": source, "scan_requested_at": now })),
    ))
}

/// `POST /api/v1/sources/{name}/test`: connect read-only and query the table.
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

/// `POST /api/v1/providers/{name}/test`: list the last five minutes' charges with the key.
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
