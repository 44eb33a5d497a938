//! `/api/v1`: JSON, one tenant per bearer token.

mod effects;
mod push;
mod quarantine;
mod sources;
mod tokens;
// write-back (issue 4 item 7)
mod writeback;

pub use effects::EffectJson;

use crate::AppState;
use crate::error::ApiError;
use axum::Router;
use axum::routing::{delete, get, post};

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
        // ---- write-back (issue 4 item 7) ----
        .route(
            "/sources/{name}/writeback",
            post(writeback::run).put(writeback::set),
        )
        // ---- end write-back ----
        .fallback(no_such_route)
}

async fn no_such_route() -> ApiError {
    ApiError::NotFound("no such API route".into())
}
