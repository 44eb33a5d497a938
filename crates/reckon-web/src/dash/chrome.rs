//! What every dashboard page shares: the frame (`base.html`) with who, which tenant and
//! the tenant switcher, the error page, the tenant's time zone, and the reading of filter
//! fields.

use super::fmt::{seg, zone};
use super::{assets, error_page};
use crate::AppState;
use crate::authz::{Permission, allows};
use crate::session::WebSession;
use askama::Template;
use axum::http::StatusCode;
use axum::response::Response;
use jiff::tz::TimeZone;
use reckon_ledger::{LedgerError, TenantId};

/// What every page's frame (`base.html`) shows: who, which tenant, where, and the CSRF
/// token of the sign-out form.
pub struct Chrome {
    pub tenant: String,
    pub base: String,
    pub email: String,
    pub role: &'static str,
    pub csrf: String,
    pub css: String,
    pub js: String,
    pub page: &'static str,
    pub can_lookup: bool,
    pub can_audit: bool,
    pub can_settings: bool,
    /// The person's other tenants (name with role, href), for the switcher; empty for a
    /// person in one tenant and on fragments.
    pub tenants: Vec<(String, String)>,
}

impl Chrome {
    pub fn new(s: &WebSession, page: &'static str) -> Chrome {
        Chrome {
            tenant: s.tenant.slug.clone(),
            base: format!("/t/{}", seg(&s.tenant.slug)),
            email: s.user.email.clone(),
            role: s.role.as_str(),
            csrf: s.csrf_token.clone(),
            css: assets::css_href(),
            js: assets::htmx_href(),
            page,
            can_lookup: allows(s.role, Permission::Lookup),
            can_audit: allows(s.role, Permission::Audit),
            can_settings: allows(s.role, Permission::ManageSources),
            tenants: Vec::new(),
        }
    }
}

#[derive(Template)]
#[template(path = "error.html")]
pub struct ErrorPage<'a> {
    pub status: u16,
    pub message: &'a str,
    pub css: String,
}

/// A page under a tenant that does not exist, inside the dashboard's frame, so the person
/// keeps the navigation (the browser's bare 404 strands them).
#[derive(Template)]
#[template(path = "not_found.html")]
pub struct NotFoundPage {
    pub c: Chrome,
    /// The path asked for, as typed (escaped by the template), cut to a readable length.
    pub path: String,
}

pub(super) fn bad_request(msg: &str) -> Response {
    error_page(StatusCode::BAD_REQUEST, msg)
}

/// Empty form fields mean "no filter".
pub(super) fn given(v: &Option<String>) -> Option<String> {
    v.as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

/// The person's other tenants for the header's switcher (one query).
pub async fn other_tenants(
    st: &AppState,
    s: &WebSession,
) -> Result<Vec<(String, String)>, LedgerError> {
    let all = st.ledger.memberships(s.user.id).await?;
    Ok(all
        .into_iter()
        .filter(|(t, _)| t.id != s.tenant.id)
        .map(|(t, role)| {
            (
                format!("{} ({})", t.slug, role.as_str()),
                format!("/t/{}", seg(&t.slug)),
            )
        })
        .collect())
}

/// The tenant's time zone (its audit settings, UTC unless set): every time on its pages is
/// written in it, with UTC on hover.
pub async fn tenant_zone(st: &AppState, tenant: TenantId) -> Result<TimeZone, LedgerError> {
    Ok(zone(&st.ledger.audit_settings(tenant).await?.time_zone))
}
