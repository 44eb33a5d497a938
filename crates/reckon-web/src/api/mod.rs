//! `/api/v1`: JSON, one tenant per bearer token.

// audit (issue 6, branch `audit`)
mod audits;
mod effects;
pub(crate) mod probes;
pub mod providers;
mod push;
mod quarantine;
mod reconcile;
pub(crate) mod sources;
mod tokens;
// write-back (issue 4 item 7)
mod writeback;

pub use effects::EffectJson;

use crate::AppState;
use crate::error::ApiError;
use axum::Router;
use axum::routing::{delete, get, patch, post};

/// At most this many records per push request.
pub const MAX_PUSH_ITEMS: usize = 10_000;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/sources", get(sources::list).post(sources::create))
        .route("/sources/{name}", patch(sources::edit))
        .route("/sources/{name}/scan", post(probes::scan))
        .route("/sources/{name}/test", post(probes::test))
        .route("/sources/{name}/quarantine", get(quarantine::entries))
        .route("/quarantine", get(quarantine::counts))
        .route("/effects", get(effects::list).post(push::push))
        // A wildcard, so a key holding `/` works whether or not the client encoded it.
        .route(
            "/effects/{source}/{*key}",
            get(effects::detail).post(reconcile::action),
        )
        .route("/lookup", get(effects::lookup))
        // ---- reconciliation (issue 4) ----
        .route("/providers", get(providers::list).post(providers::create))
        .route("/providers/{name}", patch(providers::edit))
        .route("/providers/{name}/test", post(probes::test_provider_route))
        .route("/routes", get(providers::routes).put(providers::set_route))
        .route("/reconcile/requeue", post(reconcile::requeue))
        .route("/audit-log", get(crate::actions::list))
        // ---- end reconciliation ----
        .route("/openapi.json", get(openapi))
        .route("/tokens", get(tokens::list).post(tokens::create))
        .route("/tokens/{id}", delete(tokens::revoke))
        // ---- audit (issue 6, branch `audit`) ----
        .route("/audits", get(audits::list).post(audits::run))
        .route("/audits/{id}", get(audits::detail))
        // ---- write-back (issue 4 item 7) ----
        .route(
            "/sources/{name}/writeback",
            post(writeback::run).put(writeback::set),
        )
        // ---- end write-back ----
        .fallback(no_such_route)
}

/// The API's description (`docs/openapi.json`, kept in step with the route registry by the
/// `openapi` test).
pub const OPENAPI_JSON: &str = include_str!("../../../../docs/openapi.json");

async fn openapi() -> impl axum::response::IntoResponse {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        OPENAPI_JSON,
    )
}

async fn no_such_route() -> ApiError {
    ApiError::NotFound("no such API route".into())
}
