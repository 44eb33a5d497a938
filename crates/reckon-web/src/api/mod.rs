//! `/api/v1`: JSON, one tenant per bearer token.

// audit (issue 6, branch `audit`)
mod audits;
mod effects;
mod push;
mod quarantine;
mod sources;
mod tokens;

pub use effects::EffectJson;

use crate::AppState;
use crate::error::ApiError;
use axum::Router;
use axum::routing::{delete, get};

/// At most this many records per push request.
pub const MAX_PUSH_ITEMS: usize = 10_000;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/sources", get(sources::list).post(sources::create))
        .route("/sources/{name}/quarantine", get(quarantine::entries))
        .route("/quarantine", get(quarantine::counts))
        .route("/effects", get(effects::list).post(push::push))
        // A wildcard, so a key holding `/` works whether or not the client encoded it.
        .route("/effects/{source}/{*key}", get(effects::detail))
        .route("/lookup", get(effects::lookup))
        .route("/tokens", get(tokens::list).post(tokens::create))
        .route("/tokens/{id}", delete(tokens::revoke))
        // ---- audit (issue 6, branch `audit`) ----
        .route("/audits", get(audits::list).post(audits::run))
        .route("/audits/{id}", get(audits::detail))
        .fallback(no_such_route)
}

async fn no_such_route() -> ApiError {
    ApiError::NotFound("no such API route".into())
}
