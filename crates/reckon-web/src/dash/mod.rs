//! The dashboard: server-rendered pages under `/t/{tenant}/...`, askama templates in the
//! workspace's `templates/`, htmx 2 (vendored, `assets.rs`) for what changes in place.
//!
//! - Access: every route is in the registry (`routes.rs`) as `Session(permission)`. The
//!   tenant in the path is checked by the guard against the person's memberships
//!   ([`scope_to_path_tenant`]) before any handler runs; handlers use the session's tenant,
//!   which the guard set from that check, never the path's text.
//! - Pages and fragments: one handler answers both. An htmx request (`HX-Request`, not a
//!   history restore) gets the template's block; anything else the full page; every such
//!   response says `Vary: HX-Request`. Every page works without JavaScript: filters and
//!   lookup are GET forms, actions are POST forms answered with 303 (Post/Redirect/Get).
//! - Actions: POST with the session's CSRF token (besides `CsrfLayer`'s Origin check).
//! - Lists are bounded (LIMIT + keyset pages) and read with a fixed number of queries per
//!   page, never one per row.

pub mod assets;
pub mod audit;
pub mod chart;
pub mod chrome;
pub mod csrf;
pub mod effect;
pub mod fmt;
pub mod lookup;
pub mod overview;
pub mod queue;
pub mod settings;

use crate::AppState;
use crate::error::ApiError;
use crate::session::WebSession;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::header::{CACHE_CONTROL, VARY};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use percent_encoding::percent_decode_str;
use tower_http::csrf::CsrfLayer;

/// How long one reading of a tenant's overview serves other requests of the same tenant.
/// Counting a large backlog is O(unresolved effects) (40 ms at 10,000), the provider
/// health O(lookups of the last day), and an overview a second or two old says the same
/// thing. A person's own action (a resolution, "scan now") clears it.
pub const SUMMARY_TTL: std::time::Duration = std::time::Duration::from_secs(2);

/// The provider health window (the overview's "last 24 h").
pub use reckon_engine::read::provider_health::HEALTH_SECS;

/// Everything the overview shows of one tenant, read together (seven tenant-scoped reads,
/// one after another).
pub use reckon_engine::read::overview::OverviewView as OverviewData;

/// The dashboard's share of [`AppState`]: the overview per tenant. A reading older than
/// [`SUMMARY_TTL`] is still answered at once while one background task reads the tenant
/// again (no request waits for a refresh, and a tenant is read at most once per TTL
/// however many people watch it). A reading older than [`STALE_LIMIT`] is never
/// answered: the request reads itself, so a ledger that stopped answering shows as an error,
/// not as an old page.
#[derive(Clone, Default)]
pub struct DashState {
    overviews: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<i64, Cached>>>,
}

/// See [`DashState`].
pub const STALE_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

struct Cached {
    at: std::time::Instant,
    data: std::sync::Arc<OverviewData>,
    /// When the background refresh of this reading started, if one runs.
    refreshing: Option<std::time::Instant>,
}

impl DashState {
    pub async fn overview(
        &self,
        state: &AppState,
        tenant: reckon_ledger::TenantId,
        now: f64,
        replay: reckon_ledger::ReplayClosing,
    ) -> Result<std::sync::Arc<OverviewData>, ApiError> {
        {
            let mut cache = self.overviews.lock().expect("overview cache");
            if let Some(c) = cache.get_mut(&tenant.get()) {
                let age = c.at.elapsed();
                if age < SUMMARY_TTL || (age < STALE_LIMIT && c.refreshing.is_some()) {
                    return Ok(c.data.clone());
                }
                if age < STALE_LIMIT {
                    let started = std::time::Instant::now();
                    c.refreshing = Some(started);
                    let stale = c.data.clone();
                    let (this, st) = (self.clone(), state.clone());
                    let age = age.as_secs_f64();
                    tokio::spawn(async move {
                        // The reading is of now, not of when the stale one was asked for.
                        let read = read_overview(
                            &st,
                            tenant,
                            now + age,
                            reckon_ledger::ReplayClosing {
                                open_after: replay.open_after + age,
                                closing_before: replay.closing_before + age,
                            },
                        )
                        .await;
                        if let Err(e) = &read {
                            tracing::warn!(error = %e, "overview refresh failed");
                        }
                        let _ = this.store(tenant, read, Some(started));
                    });
                    return Ok(stale);
                }
            }
        }
        let read = read_overview(state, tenant, now, replay).await;
        self.store(tenant, read, None)
    }

    /// Keep a reading. A background refresh is kept only while the reading it replaces
    /// is still there: after [`DashState::forget`] (a person's own change) its reading,
    /// started before the change, would hide the change.
    fn store(
        &self,
        tenant: reckon_ledger::TenantId,
        read: Result<OverviewData, ApiError>,
        background: Option<std::time::Instant>,
    ) -> Result<std::sync::Arc<OverviewData>, ApiError> {
        let mut cache = self.overviews.lock().expect("overview cache");
        if background.is_some()
            && cache.get(&tenant.get()).map(|c| c.refreshing) != Some(background)
        {
            return read.map(std::sync::Arc::new);
        }
        match read {
            Ok(data) => {
                let data = std::sync::Arc::new(data);
                cache.insert(
                    tenant.get(),
                    Cached {
                        at: std::time::Instant::now(),
                        data: data.clone(),
                        refreshing: None,
                    },
                );
                Ok(data)
            }
            Err(e) => {
                // The next request tries again.
                if let Some(c) = cache.get_mut(&tenant.get()) {
                    c.refreshing = None;
                }
                Err(e)
            }
        }
    }

    pub fn forget(&self, tenant: reckon_ledger::TenantId) {
        self.overviews
            .lock()
            .expect("overview cache")
            .remove(&tenant.get());
    }
}

async fn read_overview(
    st: &AppState,
    tenant: reckon_ledger::TenantId,
    now: f64,
    replay: reckon_ledger::ReplayClosing,
) -> Result<OverviewData, ApiError> {
    use reckon_engine::read::overview::{OverviewError, overview};
    overview(&*st.ledger, tenant, now, replay)
        .await
        .map_err(|e| match e {
            OverviewError::Ledger(e) => e.into(),
            OverviewError::Zone(why) => ApiError::internal(why),
        })
}

/// Forms of the dashboard are small (a note is at most a few KB).
const FORM_LIMIT_BYTES: usize = 32 * 1024;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/t/{tenant}", get(overview::overview))
        .route("/t/{tenant}/queue", get(queue::queue))
        .route("/t/{tenant}/queue/requeue", post(queue::requeue))
        .route("/t/{tenant}/lookup", get(lookup::lookup))
        .route("/t/{tenant}/settings", get(settings::settings))
        .route("/t/{tenant}/settings/tokens", post(settings::create_token))
        .route(
            "/t/{tenant}/settings/tokens/{id}/revoke",
            post(settings::revoke_token),
        )
        .route(
            "/t/{tenant}/settings/providers",
            post(settings::add_provider),
        )
        .route("/t/{tenant}/settings/routes", post(settings::set_route))
        .route("/t/{tenant}/settings/sources", post(settings::add_source))
        .route("/t/{tenant}/settings/people", post(settings::set_person))
        .route(
            "/t/{tenant}/settings/sources/{name}/writeback",
            post(settings::set_writeback),
        )
        .route(
            "/t/{tenant}/settings/sources/{name}/quarantine",
            get(settings::quarantine),
        )
        .route(
            "/t/{tenant}/settings/sources/{name}/scan",
            post(settings::scan_now),
        )
        .route(
            "/t/{tenant}/settings/sources/{name}/test",
            post(settings::test_source),
        )
        .route(
            "/t/{tenant}/settings/sources/{name}/check",
            post(settings::check_source),
        )
        .route(
            "/t/{tenant}/settings/providers/{name}/test",
            post(settings::test_provider),
        )
        .route("/t/{tenant}/audit", get(audit::audit_page))
        .route("/t/{tenant}/audit/{id}/csv", get(audit::audit_csv))
        .route("/t/{tenant}/effects/{source}/{*key}", get(effect::effect))
        .route("/t/{tenant}/resolve/{source}/{*key}", post(effect::resolve))
        .route(
            "/t/{tenant}/reconcile/{source}/{*key}",
            post(effect::reconcile_now),
        )
        .layer(DefaultBodyLimit::max(FORM_LIMIT_BYTES))
        .layer(CsrfLayer::new())
        .route("/static/{name}", get(assets::serve))
        .route("/favicon.ico", get(assets::favicon))
}

/// The registry's route templates of the dashboard start with this: the guard checks the
/// tenant they name.
pub const TENANT_PREFIX: &str = "/t/{tenant}";

/// The guard's tenant check (routes.rs): the session stands for the tenant named in the
/// path when the person is a member of it, with their role there. `None` (answered 404,
/// the same as for a tenant that does not exist) otherwise.
pub async fn scope_to_path_tenant(
    state: &AppState,
    mut session: WebSession,
    uri_path: &str,
) -> Result<Option<WebSession>, ApiError> {
    let Some(raw) = uri_path
        .strip_prefix("/t/")
        .map(|rest| rest.split('/').next().unwrap_or_default())
    else {
        return Ok(None);
    };
    let Ok(slug) = percent_decode_str(raw).decode_utf8() else {
        return Ok(None);
    };
    if slug == session.tenant.slug {
        return Ok(Some(session));
    }
    let memberships = state.ledger.memberships(session.user.id).await?;
    Ok(memberships
        .into_iter()
        .find(|(t, _)| *t.slug == *slug)
        .map(|(tenant, role)| {
            session.tenant = tenant;
            session.role = role;
            session
        }))
}

/// Every request no route matched. Under `/api/` it is the API's JSON 404 (a client reads
/// the error body); under a tenant the person is a member of, a 404 page inside the
/// dashboard's frame, with its navigation; anywhere else (another tenant's path included,
/// which must look the same as one that does not exist) the plain 404 page. Without a
/// session, a path under `/t/` goes to sign-in, as the dashboard's routes do.
pub async fn fallback(
    axum::extract::State(st): axum::extract::State<AppState>,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Response {
    let path = uri.path();
    if path == "/api" || path.starts_with("/api/") {
        return ApiError::NotFound("no such API route".into()).into_response();
    }
    if !path.starts_with("/t/") {
        return not_found();
    }
    let session = match crate::session::current_session(&st, &headers).await {
        Ok(Some(s)) => s,
        Ok(None) => return axum::response::Redirect::to("/signin").into_response(),
        Err(e) => return PageError(e).into_response(),
    };
    let session = match scope_to_path_tenant(&st, session, path).await {
        Ok(Some(s)) => s,
        Ok(None) => return not_found(),
        Err(e) => return PageError(e).into_response(),
    };
    let mut c = chrome::Chrome::new(&session, "");
    c.tenants = match chrome::other_tenants(&st, &session).await {
        Ok(t) => t,
        Err(e) => return PageError(e.into()).into_response(),
    };
    let shown: String = path.chars().take(200).collect();
    let page = chrome::NotFoundPage { c, path: shown };
    html(StatusCode::NOT_FOUND, &page, false)
}

/// A 404 that says no more than "nothing here" (another tenant's names look the same as
/// names that do not exist).
pub fn not_found() -> Response {
    error_page(
        StatusCode::NOT_FOUND,
        "There is nothing here, or it is not yours to see.",
    )
}

pub fn error_page(status: StatusCode, message: &str) -> Response {
    let tpl = chrome::ErrorPage {
        status: status.as_u16(),
        message,
        css: assets::css_href(),
    };
    html(status, &tpl, false)
}

/// Is this an htmx request for a fragment? (A history restore wants the whole page.)
pub fn wants_fragment(headers: &HeaderMap) -> bool {
    let is = |h: &str| headers.get(h).is_some_and(|v| v.as_bytes() == b"true");
    is("hx-request") && !is("hx-history-restore-request")
}

/// Render a template; `vary` marks responses of URLs that serve a page or a fragment.
/// Pages of tenant data are never stored by caches.
pub fn html(status: StatusCode, tpl: &impl askama::Template, vary: bool) -> Response {
    match tpl.render() {
        Ok(body) => {
            let mut res = (status, Html(body)).into_response();
            let h = res.headers_mut();
            h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
            if vary {
                h.insert(VARY, HeaderValue::from_static("HX-Request"));
            }
            res
        }
        Err(e) => ApiError::internal(e).into_response(),
    }
}

/// A ledger or other failure on a page: the status of [`ApiError`], as an HTML page.
impl From<ApiError> for PageError {
    fn from(e: ApiError) -> Self {
        PageError(e)
    }
}

impl From<reckon_ledger::LedgerError> for PageError {
    fn from(e: reckon_ledger::LedgerError) -> Self {
        PageError(e.into())
    }
}

pub struct PageError(ApiError);

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let status = self.0.status();
        if let ApiError::Internal(cause) = &self.0 {
            tracing::error!(error = %cause, "page failed");
            return error_page(
                status,
                "Something went wrong on our side; the server log has the details.",
            );
        }
        error_page(status, &self.0.to_string())
    }
}
