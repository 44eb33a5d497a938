//! The HTTP surface: health probes and the JSON API under `/api/v1`.
//!
//! [`app`] builds the whole router from an [`AppState`]; the binary binds a listener and
//! serves it, tests drive it in-process. Every `/api/v1` route takes an [`auth::Auth`]
//! (or [`auth::Admin`]) extractor and uses its tenant for every ledger call.

pub mod actions;
pub mod api;
pub mod auth;
pub mod authz;
pub mod client_addr;
pub mod dash;
pub mod error;
mod extract;
pub mod headers;
pub mod metrics;
mod nul;
pub mod openapi;
pub mod password;
pub mod routes;
pub mod server;
pub mod session;
pub mod web;

pub use auth::{mint_token, token_hash};
pub use error::ApiError;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, State};
use axum::http::{Request, StatusCode, header};
use reckon_ledger::Ledger;
use std::sync::Arc;
use tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer;
use tower_http::trace::TraceLayer;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// The request body limit unless configured otherwise.
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// How long an API request may run unless configured otherwise. Generous: a request that
/// asks a provider (a lookup, a provider test, a day's audit import) waits on the
/// provider's own timeouts first, which are shorter.
pub const DEFAULT_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

#[derive(Clone)]
pub struct AppState {
    pub ledger: Arc<dyn Ledger>,
    /// Larger request bodies are refused whole with 413.
    pub max_body_bytes: usize,
    /// An API request still running after this is given up and answered 503.
    pub request_timeout: std::time::Duration,
    /// Instance metrics, `/metrics` access and the scrape cache (`metrics.rs`).
    pub metrics: metrics::MetricsState,
    /// Where tenant-named endpoints (provider base URLs) may be reached.
    pub egress: Arc<reckon_sources::EgressPolicy>,
    /// Set on SIGTERM: `/readyz` answers 503 so load balancers stop sending while
    /// in-flight requests and work finish.
    pub draining: Arc<std::sync::atomic::AtomicBool>,
    /// The proxies whose forwarding header names the client (sign-in throttle).
    pub client_address: client_addr::ClientAddress,
    // The overview's short-lived counts cache.
    pub dash: dash::DashState,
}

impl AppState {
    pub fn new(ledger: Arc<dyn Ledger>) -> AppState {
        AppState {
            ledger,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            metrics: metrics::MetricsState::default(),
            egress: Arc::new(reckon_sources::EgressPolicy::default()),
            draining: Arc::default(),
            client_address: client_addr::ClientAddress::default(),
            dash: dash::DashState::default(),
        }
    }
}

/// The documented surface: the probes, the operator's `/metrics` and the API, each route
/// registered with its description ([`openapi::document`] is made from the same value).
/// API requests that run longer than `request_timeout` are stopped and answered 503 with
/// the JSON error body (not 408, which says the client was slow to send and which some
/// clients answer by sending the request again on their own).
pub fn documented_router(request_timeout: std::time::Duration) -> OpenApiRouter<AppState> {
    let deadline = tower::ServiceBuilder::new()
        .layer(axum::error_handling::HandleErrorLayer::new(
            move |_: tower::BoxError| async move {
                ApiError::Unavailable(format!(
                    "the request ran longer than this server's limit of {} s and was \
                     stopped; try again later",
                    request_timeout.as_secs_f64()
                ))
            },
        ))
        .layer(tower::timeout::TimeoutLayer::new(request_timeout));
    OpenApiRouter::with_openapi(api::ApiDoc::openapi())
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics::operator_metrics))
        .nest("/api/v1", api::router().layer(deadline))
}

pub fn app(state: AppState) -> Router {
    let max_body_bytes = state.max_body_bytes;
    let instance_metrics = state.metrics.instance.clone();
    let (documented, _) = documented_router(state.request_timeout).split_for_parts();
    Router::new()
        .merge(documented)
        .merge(web::router())
        .merge(dash::router())
        // Not a route's: the API's JSON 404, or a 404 page inside the dashboard's frame.
        .fallback(dash::fallback)
        // Every matched route passes the registry's access check (routes.rs) first.
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            routes::guard,
        ))
        // Before the guard: a NUL must not reach even its lookups (nul.rs).
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            nul::refuse_nul,
        ))
        .with_state(state)
        .layer(axum::middleware::from_fn_with_state(
            instance_metrics,
            metrics::track_http,
        ))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(axum::middleware::from_fn(metrics::operator_view))
        .layer(headers::security_headers())
        // Spans are keyed by the route template, never the raw path: keys and names in
        // paths are tenant data and unbounded.
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|req: &Request<_>| {
                    let route = req
                        .extensions()
                        .get::<MatchedPath>()
                        .map_or("unmatched", MatchedPath::as_str);
                    tracing::info_span!("http", method = %req.method(), route)
                })
                // ApiError logs a 500's cause inside this span; logging the status again here
                // would report one error twice.
                .on_failure(()),
        )
        // Outside the trace layer, so the trace layer already sees these as sensitive.
        .layer(SetSensitiveRequestHeadersLayer::new([
            header::AUTHORIZATION,
            header::COOKIE,
        ]))
}

/// Liveness: the process answers.
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    tag = "health",
    security(()),
    responses((status = 200, description = "The process is up.", content_type = "text/plain", body = String))
)]
async fn healthz() -> &'static str {
    "ok"
}

/// Readiness: the ledger answers and the process is not shutting down.
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = "health",
    security(()),
    responses(
        (status = 200, description = "Ready for traffic.", content_type = "text/plain", body = String),
        (status = 503, description = "Shutting down, or the ledger does not answer.", content_type = "text/plain", body = String),
    )
)]
async fn readyz(State(state): State<AppState>) -> (StatusCode, &'static str) {
    if state.draining.load(std::sync::atomic::Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down");
    }
    match state.ledger.ping().await {
        Ok(()) => (StatusCode::OK, "ready"),
        Err(e) => {
            tracing::warn!(error = %e, "ledger ping failed");
            (StatusCode::SERVICE_UNAVAILABLE, "ledger unavailable")
        }
    }
}
