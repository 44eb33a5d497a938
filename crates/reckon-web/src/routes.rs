//! The route registry: every route of [`crate::app`], with who may call it. It is the one
//! place access is decided: [`guard`] runs before every handler, looks the matched route
//! up here, authenticates the caller the way the entry says (bearer token or dashboard
//! session), checks the role against the permission matrix ([`crate::authz`]) and hands the
//! result to the handler. A route missing from this table answers 500 to every request, so
//! a route added without an entry fails its first test; the isolation sweep
//! (`tests/it/isolation.rs`) calls every entry with another tenant's token and session.

use crate::AppState;
use crate::auth::Auth;
use crate::authz::{Permission, allows};
use crate::error::ApiError;
use crate::session::{self, WebSession};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone: health probes, the sign-in page.
    Public,
    /// `Authorization: Bearer` with a token of a role that has the permission. Not
    /// CSRF-able: a browser never attaches this header to a cross-site request by itself.
    Token(Permission),
    /// The dashboard session cookie, of a person whose role has the permission. Every
    /// state-changing request on these routes also passes the CSRF checks.
    Session(Permission),
}

#[derive(Debug, Clone, Copy)]
pub struct RouteSpec {
    pub method: &'static str,
    /// The route template exactly as registered (`/api/v1/effects/{source}/{*key}`).
    pub path: &'static str,
    pub access: Access,
}

const fn r(method: &'static str, path: &'static str, access: Access) -> RouteSpec {
    RouteSpec {
        method,
        path,
        access,
    }
}

use Access::{Public, Session, Token};
use Permission as P;

pub const ROUTES: &[RouteSpec] = &[
    r("GET", "/healthz", Public),
    r("GET", "/readyz", Public),
    r("GET", "/api/v1/openapi.json", Public),
    // JSON API (bearer tokens)
    r("GET", "/api/v1/sources", Token(P::Read)),
    r("POST", "/api/v1/sources", Token(P::ManageSources)),
    r("PATCH", "/api/v1/sources/{name}", Token(P::ManageSources)),
    // "Scan now" and "test connection" (api/probes.rs).
    r(
        "POST",
        "/api/v1/sources/{name}/scan",
        Token(P::ManageSources),
    ),
    r(
        "POST",
        "/api/v1/sources/{name}/test",
        Token(P::ManageSources),
    ),
    // Quarantined rows carry excerpts of the record: support and above, like effects.
    r("GET", "/api/v1/sources/{name}/quarantine", Token(P::Lookup)),
    r("GET", "/api/v1/quarantine", Token(P::Read)),
    // Full records (keys, response bodies): support and above; viewers get summaries.
    r("GET", "/api/v1/effects", Token(P::Lookup)),
    r("POST", "/api/v1/effects", Token(P::ManageSources)),
    r("GET", "/api/v1/effects/{source}/{*key}", Token(P::Lookup)),
    r("GET", "/api/v1/lookup", Token(P::Lookup)),
    // Reconciliation.
    r("GET", "/api/v1/providers", Token(P::Read)),
    r("POST", "/api/v1/providers", Token(P::ManageProviders)),
    r(
        "PATCH",
        "/api/v1/providers/{name}",
        Token(P::ManageProviders),
    ),
    r(
        "POST",
        "/api/v1/providers/{name}/test",
        Token(P::ManageProviders),
    ),
    r("GET", "/api/v1/routes", Token(P::Read)),
    r("PUT", "/api/v1/routes", Token(P::ManageProviders)),
    // `.../{key}/reconcile` and `.../{key}/resolve` (the action is the last segment).
    r(
        "POST",
        "/api/v1/effects/{source}/{*key}",
        Token(P::ResolveWithNote),
    ),
    r(
        "POST",
        "/api/v1/reconcile/requeue",
        Token(P::ResolveManually),
    ),
    // The audit log of people's actions: the tenant's admins.
    r("GET", "/api/v1/audit-log", Token(P::ManageUsers)),
    r("GET", "/api/v1/tokens", Token(P::ManageTokens)),
    r("POST", "/api/v1/tokens", Token(P::ManageTokens)),
    r("DELETE", "/api/v1/tokens/{id}", Token(P::ManageTokens)),
    // The double-charge audit: runs, as JSON or CSV, and running one.
    r("GET", "/api/v1/audits", Token(P::Audit)),
    r("POST", "/api/v1/audits", Token(P::Audit)),
    r("GET", "/api/v1/audits/{id}", Token(P::Audit)),
    // Write-back.
    r(
        "POST",
        "/api/v1/sources/{name}/writeback",
        Token(P::WriteBack),
    ),
    r(
        "PUT",
        "/api/v1/sources/{name}/writeback",
        Token(P::WriteBack),
    ),
    // Metrics: a tenant's token reads its own series; `/metrics` is the operator's (off
    // unless configured; its handler checks the operator's metrics token, not a tenant's).
    r("GET", "/api/v1/metrics", Token(P::Read)),
    r("GET", "/metrics", Public),
    // Dashboard (session cookie)
    r("GET", "/signin", Public),
    r("POST", "/signin", Public),
    r("POST", "/signout", Session(P::Read)),
    r("GET", "/app", Session(P::Read)),
    // `/t/{tenant}` is checked against the person's memberships by the guard
    // (crate::dash::scope_to_path_tenant).
    r("GET", "/static/{name}", Public),
    r("GET", "/favicon.ico", Public),
    r("GET", "/t/{tenant}", Session(P::Read)),
    r("GET", "/t/{tenant}/queue", Session(P::Lookup)),
    // Bulk re-lookup of a provider's indeterminate effects (as POST /api/v1/reconcile/requeue).
    r(
        "POST",
        "/t/{tenant}/queue/requeue",
        Session(P::ResolveManually),
    ),
    r("GET", "/t/{tenant}/lookup", Session(P::Lookup)),
    r("GET", "/t/{tenant}/settings", Session(P::ManageSources)),
    // Settings forms (admins): tokens, providers, routing.
    r(
        "POST",
        "/t/{tenant}/settings/tokens",
        Session(P::ManageTokens),
    ),
    r(
        "POST",
        "/t/{tenant}/settings/tokens/{id}/revoke",
        Session(P::ManageTokens),
    ),
    r(
        "POST",
        "/t/{tenant}/settings/providers",
        Session(P::ManageProviders),
    ),
    r(
        "POST",
        "/t/{tenant}/settings/routes",
        Session(P::ManageProviders),
    ),
    r(
        "POST",
        "/t/{tenant}/settings/sources",
        Session(P::ManageSources),
    ),
    r(
        "POST",
        "/t/{tenant}/settings/people",
        Session(P::ManageUsers),
    ),
    r(
        "POST",
        "/t/{tenant}/settings/sources/{name}/writeback",
        Session(P::WriteBack),
    ),
    r(
        "GET",
        "/t/{tenant}/settings/sources/{name}/quarantine",
        Session(P::ManageSources),
    ),
    r(
        "POST",
        "/t/{tenant}/settings/sources/{name}/scan",
        Session(P::ManageSources),
    ),
    r(
        "POST",
        "/t/{tenant}/settings/sources/{name}/test",
        Session(P::ManageSources),
    ),
    r(
        "POST",
        "/t/{tenant}/settings/sources/{name}/check",
        Session(P::ManageSources),
    ),
    r(
        "POST",
        "/t/{tenant}/settings/providers/{name}/test",
        Session(P::ManageProviders),
    ),
    // The day's audit (finance and admin); its CSV is an export.
    r("GET", "/t/{tenant}/audit", Session(P::Audit)),
    r("GET", "/t/{tenant}/audit/{id}/csv", Session(P::Export)),
    r(
        "GET",
        "/t/{tenant}/effects/{source}/{*key}",
        Session(P::Lookup),
    ),
    r(
        "POST",
        "/t/{tenant}/resolve/{source}/{*key}",
        Session(P::ResolveWithNote),
    ),
    r(
        "POST",
        "/t/{tenant}/reconcile/{source}/{*key}",
        Session(P::ResolveWithNote),
    ),
];

pub fn lookup(method: &Method, path: &str) -> Option<&'static RouteSpec> {
    // axum answers HEAD with the GET handler.
    let method = if method == Method::HEAD {
        "GET"
    } else {
        method.as_str()
    };
    ROUTES.iter().find(|r| r.method == method && r.path == path)
}

/// Runs before every matched route (a `route_layer` of the whole app).
pub async fn guard(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let path = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_default();
    let Some(spec) = lookup(req.method(), &path) else {
        if ROUTES.iter().any(|r| r.path == path) {
            // The path is known for other methods: refuse this one (never pass it through:
            // a handler added for it without a registry entry would run unguarded).
            return StatusCode::METHOD_NOT_ALLOWED.into_response();
        }
        tracing::error!(method = %req.method(), route = %path, "route missing from the registry");
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "this route is not in the route registry (crates/reckon-web/src/routes.rs)",
        )
            .into_response();
    };
    let (mut parts, body) = req.into_parts();
    match spec.access {
        Public => {}
        Token(permission) => {
            let auth = match Auth::authenticate(&parts.headers, &state).await {
                Ok(a) => a,
                Err(e) => return e.into_response(),
            };
            if !allows(auth.role, permission) {
                return ApiError::Forbidden(format!(
                    "this needs a token with the {} role; this token has {}",
                    permission.least_role().as_str(),
                    auth.role.as_str()
                ))
                .into_response();
            }
            parts.extensions.insert(auth);
        }
        Session(permission) => {
            let mut session: WebSession =
                match session::current_session(&state, &parts.headers).await {
                    Ok(Some(s)) => s,
                    Ok(None) => return Redirect::to("/signin").into_response(),
                    Err(e) => return e.into_response(),
                };
            // The tenant named in the path, if the person is a member of it (their role
            // there); 404 otherwise.
            if spec.path.starts_with(crate::dash::TENANT_PREFIX) {
                match crate::dash::scope_to_path_tenant(&state, session, parts.uri.path()).await {
                    Ok(Some(s)) => session = s,
                    Ok(None) => return crate::dash::not_found(),
                    Err(e) => return e.into_response(),
                }
            }
            if !allows(session.role, permission) {
                if spec.path.starts_with(crate::dash::TENANT_PREFIX) {
                    return crate::dash::error_page(
                        StatusCode::FORBIDDEN,
                        "Your role in this tenant may not do this.",
                    );
                }
                return (StatusCode::FORBIDDEN, "your role may not do this").into_response();
            }
            parts.extensions.insert(session);
        }
    }
    next.run(Request::from_parts(parts, body)).await
}
