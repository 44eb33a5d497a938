//! `/api/v1`: JSON, one tenant per bearer token.
//!
//! Every route is registered through an [`OpenApiRouter`] together with its
//! `#[utoipa::path]` description, so the API document ([`openapi`]) is made from the same
//! list the router serves. The one exception is the effect routes' wildcard
//! (`/effects/{source}/{*key}`): a key may hold `/`, which no OpenAPI path template can
//! express, so it is registered by hand and described as the three paths clients call
//! ([`wildcard_doc`]); `tests/it/openapi.rs` walks every documented path on the real router.

mod audits;
mod effects;
pub(crate) mod probes;
pub mod providers;
mod push;
mod quarantine;
mod reconcile;
pub(crate) mod sources;
mod tokens;
mod writeback;

pub use effects::EffectJson;

use crate::AppState;
use crate::error::ApiError;
use crate::{actions, metrics};
use axum::routing::get;
use std::sync::LazyLock;
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// At most this many records per push request.
pub const MAX_PUSH_ITEMS: usize = 10_000;

/// The API's routes under `/api/v1`, each with its description.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(wildcard_doc())
        .routes(routes!(sources::list, sources::create))
        .routes(routes!(sources::edit))
        .routes(routes!(probes::scan))
        .routes(routes!(probes::test))
        .routes(routes!(quarantine::entries))
        .routes(routes!(quarantine::counts))
        .routes(routes!(effects::list, push::push))
        // A wildcard, so a key holding `/` works whether or not the client encoded it;
        // described by `wildcard_doc`.
        .route(
            "/effects/{source}/{*key}",
            get(effects::detail).post(reconcile::action),
        )
        .routes(routes!(effects::lookup))
        .routes(routes!(providers::list, providers::create))
        .routes(routes!(providers::edit))
        .routes(routes!(probes::test_provider_route))
        .routes(routes!(providers::routes, providers::set_route))
        .routes(routes!(reconcile::requeue))
        .routes(routes!(actions::list))
        .routes(routes!(openapi_json))
        .routes(routes!(tokens::list, tokens::create))
        .routes(routes!(tokens::revoke))
        .routes(routes!(audits::list, audits::run))
        .routes(routes!(audits::detail))
        .routes(routes!(writeback::run, writeback::set))
        .routes(routes!(metrics::tenant_metrics))
        .fallback(no_such_route)
}

/// The descriptions of the wildcard route's three uses (see the module's notes).
fn wildcard_doc() -> utoipa::openapi::OpenApi {
    #[derive(OpenApi)]
    #[openapi(paths(effects::detail, reconcile::reconcile_doc, reconcile::resolve_doc))]
    struct Wildcard;
    Wildcard::openapi()
}

/// The document's frame: title, the bearer scheme, tags, the error body.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "reckon API",
        version = "1",
        description = "Find out what really happened to every side effect. One tenant per \
            bearer token (`Authorization: Bearer rkn_...`); what a token may do is its role's \
            (viewer < support < finance < admin). Every error, 4xx or 5xx, is JSON \
            `{\"error\": sentence}`. Times are epoch seconds. A request that runs past the \
            server's deadline is answered 503. `webhooks` describes the http provider \
            protocol: the requests reckon makes to a tenant's own system \
            (docs/http-provider-protocol.md)."
    ),
    security(("bearer" = [])),
    modifiers(&BearerScheme),
    components(schemas(crate::error::ErrorBody)),
    tags(
        (name = "health", description = "Probes for load balancers and orchestrators."),
        (name = "sources", description = "The justonce stores reckon reads, and their quarantine."),
        (name = "effects", description = "Effects as reckon keeps them, pushed records, and support's lookup."),
        (name = "reconciliation", description = "Providers, routes, and asking a provider what happened."),
        (name = "audit", description = "The daily audit of a day's charges, and the audit log of people's actions."),
        (name = "tokens", description = "The tenant's API tokens."),
        (name = "writeback", description = "Writing verdicts back into the application's rows (opt-in per source)."),
        (name = "meta", description = "This document and the metrics."),
        (name = "provider protocol", description = "Under `webhooks`: the requests reckon makes to a tenant's own system (the `http` provider kind), docs/http-provider-protocol.md."),
    )
)]
pub struct ApiDoc;

struct BearerScheme;

impl utoipa::Modify for BearerScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A tenant's API token (`reckon token create`, or POST /api/v1/tokens). \
                         `/metrics` takes the operator's metrics token instead.",
                    ))
                    .build(),
            ),
        );
    }
}

/// The API document, served at `/api/v1/openapi.json` and committed as `docs/openapi.json`.
pub static OPENAPI_JSON: LazyLock<String> = LazyLock::new(|| {
    let mut text = crate::openapi::document()
        .to_pretty_json()
        .expect("the API document serializes");
    text.push('\n');
    text
});

/// This document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "getOpenapi",
    tag = "meta",
    security(()),
    responses((status = 200, description = "The OpenAPI 3.1 document of this API.", content_type = "application/json", body = Object))
)]
async fn openapi_json() -> impl axum::response::IntoResponse {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        OPENAPI_JSON.as_str(),
    )
}

async fn no_such_route() -> ApiError {
    ApiError::NotFound("no such API route".into())
}
