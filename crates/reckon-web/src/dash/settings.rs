//! The settings page and its forms (admins): API tokens (made here, shown once, revoked),
//! providers (added with a write-only secret, checked by the API's own `new_provider`:
//! settings, secret and the egress policy), and routing. Every form carries the session's
//! CSRF token; every change goes to the audit log as the API's do. Secrets are never
//! rendered back: a provider shows only whether it has one.

use super::chrome::{Chrome, other_tenants, tenant_zone};
use super::csrf::{CsrfOnly, accept, csrf_form};
use super::fmt::{When, age, seg, sentence, when_in, when_opt_in};
use super::{PageError, html};
use crate::AppState;
use crate::actions::dash_ctx;
use crate::api::providers::ProviderInput;
use crate::session::WebSession;
use askama::Template;
use axum::extract::rejection::FormRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use reckon_engine::commands::{self, CommandError, Member};
use reckon_ledger::{LedgerError, TokenCreator, WritebackPolicy};
use serde::Deserialize;
use serde_json::json;
use std::collections::HashMap;

#[derive(Template)]
#[template(path = "settings.html")]
pub struct SettingsPage {
    pub c: Chrome,
    pub sources: Vec<SettingsSource>,
    pub providers: Vec<ProviderView>,
    pub routes: Vec<RouteView>,
    pub tokens: Vec<TokenView>,
    pub actions: Vec<ActionView>,
    /// (email, role, disabled)
    pub people: Vec<(String, &'static str, bool)>,
    pub flash: SettingsFlash,
}

/// What the last settings form did: a message, an error, or a new token (shown in this
/// one answer and nowhere else, ever).
#[derive(Default)]
pub struct SettingsFlash {
    pub message: Option<String>,
    pub error: Option<String>,
    pub new_token: Option<String>,
    /// The provider form's fields back after an error (never its secret).
    pub provider_name: String,
    pub provider_kind: String,
    pub provider_settings: String,
    /// The connect checks of a source just added or checked: (source, checks).
    pub checks: Option<(String, Vec<reckon_engine::connect::Check>)>,
}

/// One kind in the provider form's list, from the registry of provider kinds.
pub struct KindOption {
    pub value: &'static str,
    pub label: &'static str,
    pub selected: bool,
}

impl SettingsFlash {
    /// Every provider kind reckon knows, the one typed before an error selected.
    pub fn provider_kinds(&self) -> Vec<KindOption> {
        reckon_ledger::ProviderKind::ALL
            .into_iter()
            .map(|k| KindOption {
                value: k.as_str(),
                label: reckon_providers::adapter(k).label,
                selected: self.provider_kind.trim() == k.as_str(),
            })
            .collect()
    }
}

/// A route as its row's form shows it, prefilled.
pub struct RouteView {
    pub source: String,
    pub operation: String,
    /// The provider's name; empty for a route to none.
    pub provider: String,
}

pub struct SettingsSource {
    pub name: String,
    pub kind: &'static str,
    pub dsn: String,
    /// How the connection is protected (from the sealed DSN itself, so a display stored by
    /// an older version without its TLS mode does not mislead); empty for files and push.
    pub transport: String,
    pub table: String,
    pub interval: String,
    pub last_success: Option<When>,
    pub last_error: String,
    pub failures: i64,
    /// `off`, `release` or `fail`.
    pub writeback: &'static str,
    pub quarantine_href: String,
    pub writeback_href: String,
    /// Push sources hold no DSN: nothing to write back to, nothing to scan or test.
    pub can_writeback: bool,
    /// `.../settings/sources/{name}`: its `/scan` and `/test` forms post there.
    pub href: String,
    /// A "scan now" no scan has answered yet, and when it was asked.
    pub scan_pending: Option<When>,
}

pub struct TokenView {
    pub id: i64,
    pub label: String,
    pub role: &'static str,
    pub created_by: String,
    pub created: When,
    pub last_used: Option<When>,
    pub revoked: Option<When>,
}

pub struct ActionView {
    pub at: When,
    pub actor: String,
    pub action: String,
    pub target: String,
    pub detail: String,
}

pub async fn settings(
    State(st): State<AppState>,
    Extension(s): Extension<WebSession>,
) -> Result<Response, PageError> {
    settings_response(&st, &s, StatusCode::OK, SettingsFlash::default()).await
}

/// The settings page with what the last form did.
async fn settings_response(
    st: &AppState,
    s: &WebSession,
    status: StatusCode,
    flash: SettingsFlash,
) -> Result<Response, PageError> {
    let t = s.tenant.id;
    let sources = st.ledger.list_sources(t).await?;
    let mut transports: HashMap<i64, String> = HashMap::new();
    for x in &sources {
        let Some(dialect) = x.kind.dialect() else {
            continue;
        };
        let said = match st.ledger.source_dsn(t, x).await {
            Ok(dsn) => {
                use secrecy::ExposeSecret;
                reckon_sources::SourceDsn::parse(dialect, dsn.expose_secret())
                    .ok()
                    .and_then(|d| d.transport())
                    .map_or("unknown (the stored DSN does not parse)", |tr| {
                        tr.describe()
                    })
            }
            Err(_) => "unknown (the stored DSN does not open)",
        };
        transports.insert(x.id, said.to_owned());
    }
    let providers = st.ledger.list_providers(t).await?;
    let routes = st.ledger.list_routes(t).await?;
    let tokens = st.ledger.list_tokens(t).await?;
    let actions = st.ledger.list_actions(t, None, 50).await?;
    let members = st.ledger.members(t).await?;
    let emails: HashMap<i64, String> = members
        .iter()
        .map(|(u, _)| (u.id, u.email.clone()))
        .collect();
    let labels: HashMap<i64, String> = tokens.iter().map(|k| (k.id, k.label.clone())).collect();
    let people = members
        .into_iter()
        .map(|(u, r)| (u.email, r.as_str(), u.disabled))
        .collect();
    let tz = &tenant_zone(st, t).await?;
    let mut page = SettingsPage {
        sources: sources
            .iter()
            .map(|x| SettingsSource {
                name: x.name.clone(),
                kind: x.kind.as_str(),
                // The stored display form has no password; the DSN itself stays sealed.
                dsn: x.dsn_display.clone().unwrap_or_default(),
                transport: transports.remove(&x.id).unwrap_or_default(),
                table: x.table_name.clone(),
                interval: age(x.scan_interval_secs as f64),
                last_success: when_opt_in(x.last_success_at, tz),
                last_error: x.last_error.clone().unwrap_or_default(),
                failures: x.consecutive_failures,
                writeback: x
                    .writeback()
                    .map_or("off", reckon_ledger::WritebackPolicy::as_str),
                can_writeback: x.kind.is_scanned(),
                quarantine_href: format!(
                    "/t/{}/settings/sources/{}/quarantine",
                    seg(&s.tenant.slug),
                    seg(&x.name)
                ),
                writeback_href: format!(
                    "/t/{}/settings/sources/{}/writeback",
                    seg(&s.tenant.slug),
                    seg(&x.name)
                ),
                href: format!(
                    "/t/{}/settings/sources/{}",
                    seg(&s.tenant.slug),
                    seg(&x.name)
                ),
                scan_pending: x
                    .scan_pending()
                    .then_some(x.scan_requested_at)
                    .flatten()
                    .map(|at| when_in(at, tz)),
            })
            .collect(),
        providers: providers
            .iter()
            .map(|p| provider_view(p, &format!("/t/{}", seg(&s.tenant.slug))))
            .collect(),
        routes: routes
            .into_iter()
            .map(|r| RouteView {
                source: r.source,
                operation: r.operation,
                provider: r.provider.unwrap_or_default(),
            })
            .collect(),
        tokens: tokens
            .into_iter()
            .map(|k| TokenView {
                id: k.id,
                label: k.label,
                role: k.role.as_str(),
                created_by: k.created_by.unwrap_or_else(|| "operator".into()),
                created: when_in(k.created_at, tz),
                last_used: when_opt_in(k.last_used_at, tz),
                revoked: when_opt_in(k.revoked_at, tz),
            })
            .collect(),
        actions: actions
            .into_iter()
            .map(|a| ActionView {
                at: when_in(a.at, tz),
                actor: actor_words(&a.actor, &emails, &labels),
                action: a.action,
                target: a.target.unwrap_or_default(),
                detail: a.detail.to_string(),
            })
            .collect(),
        people,
        flash,
        c: Chrome::new(s, "settings"),
    };
    page.c.tenants = other_tenants(st, s).await?;
    Ok(html(status, &page, false))
}

/// An audit log's actor as people read it: `user:7 via token:3` becomes
/// `ann@acme.test via token “deploy-bot” (#3)`. People or tokens no longer in the tenant
/// keep their number.
pub fn actor_words(
    actor: &str,
    emails: &HashMap<i64, String>,
    labels: &HashMap<i64, String>,
) -> String {
    actor
        .split(' ')
        .map(|word| {
            if let Some(id) = word.strip_prefix("user:") {
                match id.parse::<i64>() {
                    Ok(i) => emails
                        .get(&i)
                        .cloned()
                        .unwrap_or_else(|| format!("person #{i}")),
                    // Recorded by email already.
                    Err(_) => id.to_owned(),
                }
            } else if let Some(id) = word.strip_prefix("token:") {
                match id.parse::<i64>().ok().and_then(|i| labels.get(&i)) {
                    Some(label) => format!("token “{label}” (#{id})"),
                    None => format!("token #{id}"),
                }
            } else {
                word.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

pub struct ProviderView {
    pub name: String,
    pub kind: String,
    pub has_secret: bool,
    pub settings: String,
    /// Its last calibration against the tenant's known outcomes, in words.
    pub calibration: String,
    /// Measured and found wanting: no final "not charged" on it.
    pub uncalibrated: bool,
    /// Where its "test" form posts (settings page).
    pub test_href: String,
}

fn provider_view(p: &reckon_ledger::Provider, base: &str) -> ProviderView {
    ProviderView {
        name: p.name.clone(),
        kind: p.kind.as_str().to_owned(),
        has_secret: p.has_secret,
        // Settings hold no secret (the key is sealed apart and never read back here).
        settings: p.settings.to_string(),
        calibration: match &p.calibration {
            None if reckon_providers::adapter(p.kind).calibrates => "not measured yet".into(),
            // A lookup by key needs none.
            None => "not needed (looked up by key)".into(),
            Some(c) => c["reason"].as_str().unwrap_or("").to_owned(),
        },
        uncalibrated: p
            .calibration
            .as_ref()
            .is_some_and(|c| c["status"] == "uncalibrated"),
        test_href: format!("{base}/settings/providers/{}/test", seg(&p.name)),
    }
}

csrf_form!(
    TokenForm,
    ProviderForm,
    RouteForm,
    WritebackForm,
    SourceForm,
    PersonForm
);

/// Back to the settings page after a change; the overview reads the tenant again (its
/// sources and providers may have changed).
fn back(st: &AppState, s: &WebSession) -> Response {
    st.dash.forget(s.tenant.id);
    Redirect::to(&format!("/t/{}/settings", super::fmt::seg(&s.tenant.slug))).into_response()
}

fn actor(s: &WebSession) -> String {
    format!("user:{}", s.user.email)
}

async fn refuse(
    st: &AppState,
    s: &WebSession,
    flash: SettingsFlash,
) -> Result<Response, PageError> {
    settings_response(st, s, StatusCode::UNPROCESSABLE_ENTITY, flash).await
}

/// A command's refusal on the page, its sentence capitalised; a failure of ours is an error
/// page.
async fn refused(
    st: &AppState,
    s: &WebSession,
    e: CommandError,
    flash: impl FnOnce(String) -> SettingsFlash,
) -> Result<Response, PageError> {
    let e = match e {
        CommandError::Ledger(LedgerError::NotFound(m)) => {
            CommandError::Invalid(format!("not found: {m}"))
        }
        other => other,
    };
    let api = crate::error::ApiError::from(e);
    if !api.status().is_client_error() {
        return Err(api.into());
    }
    refuse(st, s, flash(sentence(&api.to_string()))).await
}

#[derive(Deserialize)]
pub struct TokenForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    role: String,
    #[serde(default)]
    label: String,
}

/// Make an API token on the person's behalf: its role never exceeds theirs, it dies with
/// their generation, and its secret is in this one answer (200, not a redirect that would
/// lose it) and nowhere else.
pub async fn create_token(
    State(st): State<AppState>,
    Extension(s): Extension<WebSession>,
    form: Result<Form<TokenForm>, FormRejection>,
) -> Result<Response, PageError> {
    let f = match accept(&s, form) {
        Ok(f) => f,
        Err(refusal) => return Ok(refusal),
    };
    let error = |m: String| SettingsFlash {
        error: Some(m),
        ..SettingsFlash::default()
    };
    let (token, hash) = crate::auth::mint_token();
    let request = reckon_engine::commands::TokenRequest {
        role: &f.role,
        label: &f.label,
        creator: TokenCreator::User { id: s.user.id },
        ceiling: Some(s.role),
        hash: &hash,
    };
    let ctx = crate::actions::dash_ctx(&st, &s);
    let (id, role) = match reckon_engine::commands::create_token(&ctx, request).await {
        Ok(made) => made,
        Err(e) => return refused(&st, &s, e, error).await,
    };
    let label = f.label.trim();
    let flash = SettingsFlash {
        message: Some(format!(
            "Token {id} ({}, “{label}”) made. Copy it now: it is shown this once and never again.",
            role.as_str()
        )),
        new_token: Some(token),
        ..SettingsFlash::default()
    };
    settings_response(&st, &s, StatusCode::OK, flash).await
}

#[derive(Deserialize)]
pub struct TokenPath {
    #[allow(
        dead_code,
        reason = "the route guard resolved the path's tenant into the session, which the handler reads"
    )]
    tenant: String,
    id: String,
}

pub async fn revoke_token(
    State(st): State<AppState>,
    Extension(s): Extension<WebSession>,
    Path(p): Path<TokenPath>,
    form: Result<Form<CsrfOnly>, FormRejection>,
) -> Result<Response, PageError> {
    if let Err(refusal) = accept(&s, form) {
        return Ok(refusal);
    }
    let Ok(id) = p.id.parse::<i64>() else {
        return Ok(super::not_found());
    };
    let ctx = crate::actions::dash_ctx(&st, &s);
    match reckon_engine::commands::revoke_token(&ctx, id).await {
        Ok(()) => {}
        // Another tenant's token and a token already revoked look the same.
        Err(CommandError::Ledger(LedgerError::NotFound(_))) => return Ok(super::not_found()),
        Err(e) => return Err(crate::error::ApiError::from(e).into()),
    }
    Ok(back(&st, &s))
}

#[derive(Deserialize)]
pub struct ProviderForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    secret: String,
    #[serde(default)]
    settings: String,
}

/// Add a provider: the API's `new_provider` checks it (kind, settings, secret, egress).
pub async fn add_provider(
    State(st): State<AppState>,
    Extension(s): Extension<WebSession>,
    form: Result<Form<ProviderForm>, FormRejection>,
) -> Result<Response, PageError> {
    let f = match accept(&s, form) {
        Ok(f) => f,
        Err(refusal) => return Ok(refusal),
    };
    // The fields come back after an error, except the secret.
    let error = |m: String| SettingsFlash {
        error: Some(m),
        provider_name: f.name.clone(),
        provider_kind: f.kind.clone(),
        provider_settings: f.settings.clone(),
        ..SettingsFlash::default()
    };
    let name = f.name.trim().to_owned();
    if name.is_empty() || name.len() > 64 || name.chars().any(char::is_control) {
        return refuse(
            &st,
            &s,
            error("The name must be 1-64 printable characters.".into()),
        )
        .await;
    }
    let settings = if f.settings.trim().is_empty() {
        None
    } else {
        match serde_json::from_str(&f.settings) {
            Ok(v) => Some(v),
            Err(e) => {
                return refuse(&st, &s, error(format!("Settings are not JSON: {e}"))).await;
            }
        }
    };
    let input = ProviderInput {
        name: name.clone(),
        kind: f.kind.trim().to_owned(),
        secret: Some(f.secret.clone())
            .filter(|x| !x.is_empty())
            .map(secrecy::SecretString::from),
        settings,
    };
    let ctx = crate::actions::dash_ctx(&st, &s);
    if let Err(e) = reckon_engine::commands::add_provider(&ctx, input).await {
        return refused(&st, &s, e, error).await;
    }
    Ok(back(&st, &s))
}

#[derive(Deserialize)]
pub struct RouteForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    source: String,
    #[serde(default)]
    operation: String,
    /// Empty: no provider answers for this operation.
    #[serde(default)]
    provider: String,
}

pub async fn set_route(
    State(st): State<AppState>,
    Extension(s): Extension<WebSession>,
    form: Result<Form<RouteForm>, FormRejection>,
) -> Result<Response, PageError> {
    let f = match accept(&s, form) {
        Ok(f) => f,
        Err(refusal) => return Ok(refusal),
    };
    let provider = Some(f.provider.trim()).filter(|p| !p.is_empty());
    let ctx = crate::actions::dash_ctx(&st, &s);
    if let Err(e) =
        reckon_engine::commands::set_route(&ctx, &f.source, &f.operation, provider).await
    {
        let error = |m: String| SettingsFlash {
            error: Some(m),
            ..SettingsFlash::default()
        };
        return refused(&st, &s, e, error).await;
    }
    Ok(back(&st, &s))
}

#[derive(Deserialize)]
pub struct SourcePath {
    #[allow(
        dead_code,
        reason = "the route guard resolved the path's tenant into the session, which the handler reads"
    )]
    tenant: String,
    name: String,
}

#[derive(Deserialize)]
pub struct WritebackForm {
    #[serde(default)]
    csrf: String,
    /// `off`, `release` or `fail`.
    #[serde(default)]
    not_applied: String,
}

/// Turn a source's write-back on (`release` or `fail` for a `not_applied` verdict) or off,
/// as `PUT /api/v1/sources/{name}/writeback` does; the change goes to the audit log.
pub async fn set_writeback(
    State(st): State<AppState>,
    Extension(s): Extension<WebSession>,
    Path(p): Path<SourcePath>,
    form: Result<Form<WritebackForm>, FormRejection>,
) -> Result<Response, PageError> {
    let f = match accept(&s, form) {
        Ok(f) => f,
        Err(refusal) => return Ok(refusal),
    };
    let policy = match f.not_applied.as_str() {
        "off" => None,
        other => match WritebackPolicy::parse(other) {
            Some(p) => Some(p),
            None => {
                let flash = SettingsFlash {
                    error: Some("Write-back is off, release or fail.".into()),
                    ..SettingsFlash::default()
                };
                return refuse(&st, &s, flash).await;
            }
        },
    };
    match st
        .ledger
        .set_source_writeback(s.tenant.id, &p.name, policy)
        .await
    {
        Ok(_) => {}
        Err(LedgerError::NotFound(_)) => return Ok(super::not_found()),
        Err(e) => {
            // A refusal the person can act on (a push source has nothing to write to) is
            // said on the page; anything else is ours.
            let e = crate::error::ApiError::from(e);
            if !e.status().is_client_error() {
                return Err(e.into());
            }
            let flash = SettingsFlash {
                error: Some(e.to_string()),
                ..SettingsFlash::default()
            };
            return refuse(&st, &s, flash).await;
        }
    }
    crate::actions::record(
        &st,
        s.tenant.id,
        actor(&s),
        "source.writeback",
        Some(p.name.clone()),
        json!({ "not_applied": policy.map(reckon_ledger::WritebackPolicy::as_str), "via": "dashboard" }),
    )
    .await;
    Ok(back(&st, &s))
}

/// "Scan now": recorded in the ledger, so whichever replica's scheduler looks next (every
/// 2 s) scans it; the settings page shows the request until a scan answers it.
pub async fn scan_now(
    State(st): State<AppState>,
    Extension(s): Extension<WebSession>,
    Path(p): Path<SourcePath>,
    form: Result<Form<CsrfOnly>, FormRejection>,
) -> Result<Response, PageError> {
    if let Err(refusal) = accept(&s, form) {
        return Ok(refusal);
    }
    let now = reckon_domain::time::now();
    match st.ledger.request_scan(s.tenant.id, &p.name, now).await {
        Ok(_) => {}
        // Another tenant's source, a push source and no source look the same.
        Err(LedgerError::NotFound(_)) => return Ok(super::not_found()),
        Err(e) => return Err(e.into()),
    }
    crate::actions::record(
        &st,
        s.tenant.id,
        actor(&s),
        "source.scan_now",
        Some(p.name.clone()),
        json!({ "via": "dashboard" }),
    )
    .await;
    Ok(back(&st, &s))
}

/// "Test connection": the answer is on the settings page it returns (200 with the
/// message, 422 with the error), nothing is stored but the audit log's line.
pub async fn test_source(
    State(st): State<AppState>,
    Extension(s): Extension<WebSession>,
    Path(p): Path<SourcePath>,
    form: Result<Form<CsrfOnly>, FormRejection>,
) -> Result<Response, PageError> {
    if let Err(refusal) = accept(&s, form) {
        return Ok(refusal);
    }
    let source = match st.ledger.source_by_name(s.tenant.id, &p.name).await {
        Ok(x) if x.kind.is_scanned() => x,
        Ok(_) | Err(LedgerError::NotFound(_)) => return Ok(super::not_found()),
        Err(e) => return Err(e.into()),
    };
    let report = crate::api::probes::probe_source(&st, &s.tenant, &source).await;
    probed(&st, &s, "source.test", &source.name, report).await
}

/// "Test" a provider: list the last five minutes with its stored key.
pub async fn test_provider(
    State(st): State<AppState>,
    Extension(s): Extension<WebSession>,
    Path(p): Path<SourcePath>,
    form: Result<Form<CsrfOnly>, FormRejection>,
) -> Result<Response, PageError> {
    if let Err(refusal) = accept(&s, form) {
        return Ok(refusal);
    }
    let provider = match st.ledger.provider_by_name(s.tenant.id, &p.name).await {
        Ok(x) => x,
        Err(LedgerError::NotFound(_)) => return Ok(super::not_found()),
        Err(e) => return Err(e.into()),
    };
    let report = crate::api::probes::probe_provider(&st, &s.tenant, &provider).await;
    probed(&st, &s, "provider.test", &provider.name, report).await
}

async fn probed(
    st: &AppState,
    s: &WebSession,
    action: &str,
    target: &str,
    report: reckon_engine::probe::ProbeReport,
) -> Result<Response, PageError> {
    crate::actions::record(
        st,
        s.tenant.id,
        actor(s),
        action,
        Some(target.to_owned()),
        json!({ "ok": report.ok, "via": "dashboard" }),
    )
    .await;
    let text = format!("{target}: {} ({} ms)", report.message, report.millis);
    if report.ok {
        let flash = SettingsFlash {
            message: Some(text),
            ..SettingsFlash::default()
        };
        settings_response(st, s, StatusCode::OK, flash).await
    } else {
        let flash = SettingsFlash {
            error: Some(text),
            ..SettingsFlash::default()
        };
        refuse(st, s, flash).await
    }
}

#[derive(Template)]
#[template(path = "quarantine.html")]
pub struct QuarantinePage {
    pub c: Chrome,
    pub source: String,
    pub rows: Vec<QuarantineRow>,
}

pub struct QuarantineRow {
    pub reason: String,
    pub detail: String,
    pub key: String,
    pub excerpt: String,
    pub origin: String,
    pub first_seen: When,
}

/// Rows of a source reckon refused, with the reason (newest 100; excerpts only).
pub async fn quarantine(
    State(st): State<AppState>,
    Extension(s): Extension<WebSession>,
    Path(p): Path<SourcePath>,
) -> Result<Response, PageError> {
    let source = match st.ledger.source_by_name(s.tenant.id, &p.name).await {
        Ok(x) => x,
        Err(LedgerError::NotFound(_)) => return Ok(super::not_found()),
        Err(e) => return Err(e.into()),
    };
    let rows = st
        .ledger
        .list_quarantine(s.tenant.id, source.id, 100)
        .await?;
    let tz = tenant_zone(&st, s.tenant.id).await?;
    let mut c = Chrome::new(&s, "settings");
    c.tenants = other_tenants(&st, &s).await?;
    let page = QuarantinePage {
        c,
        source: source.name,
        rows: rows
            .into_iter()
            .map(|q| QuarantineRow {
                reason: q.reason,
                detail: q.detail,
                key: q.key_excerpt,
                excerpt: q.excerpt,
                origin: q.origin,
                first_seen: when_in(q.first_seen_at, &tz),
            })
            .collect(),
    };
    Ok(super::html(StatusCode::OK, &page, false))
}

/// "Check": the connect checks of a source, each with the click that fixes a failed one,
/// shown on the settings page (200 when every check passed, 422 otherwise).
pub async fn check_source(
    State(st): State<AppState>,
    Extension(s): Extension<WebSession>,
    Path(p): Path<SourcePath>,
    form: Result<Form<CsrfOnly>, FormRejection>,
) -> Result<Response, PageError> {
    if let Err(refusal) = accept(&s, form) {
        return Ok(refusal);
    }
    let source = match st.ledger.source_by_name(s.tenant.id, &p.name).await {
        Ok(x) => x,
        Err(LedgerError::NotFound(_)) => return Ok(super::not_found()),
        Err(e) => return Err(e.into()),
    };
    checked(&st, &s, source, None).await
}

/// The settings page with a source's connect checks (and `message` above them).
async fn checked(
    st: &AppState,
    s: &WebSession,
    source: reckon_ledger::Source,
    message: Option<String>,
) -> Result<Response, PageError> {
    let now = reckon_domain::time::now();
    let checks =
        reckon_engine::connect::check_source(&*st.ledger, &s.tenant, &source, &st.egress, now)
            .await?;
    // A source just added was added, whatever its checks say; a "Check" that finds
    // something to fix answers 422 like the connection test.
    let status = if message.is_some() || checks.iter().all(|c| c.ok) {
        StatusCode::OK
    } else {
        StatusCode::UNPROCESSABLE_ENTITY
    };
    st.dash.forget(s.tenant.id);
    let flash = SettingsFlash {
        message,
        checks: Some((source.name, checks)),
        ..SettingsFlash::default()
    };
    settings_response(st, s, status, flash).await
}

#[derive(Deserialize)]
pub struct SourceForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    dsn: String,
    /// A PostgreSQL / MySQL password, kept apart from the DSN so the DSN field (a file path
    /// for SQLite) is not masked; write-only.
    #[serde(default)]
    password: String,
    #[serde(default)]
    table: String,
    #[serde(default)]
    scan_interval: String,
    #[serde(default)]
    abandoned_after: String,
}

/// Add a source through the engine's command, as the CLI and the API do; its refusals quote
/// no DSN beyond its host. The DSN is write-only.
pub async fn add_source(
    State(st): State<AppState>,
    Extension(s): Extension<WebSession>,
    form: Result<Form<SourceForm>, FormRejection>,
) -> Result<Response, PageError> {
    let f = match accept(&s, form) {
        Ok(f) => f,
        Err(refusal) => return Ok(refusal),
    };
    let opt = |v: &str| Some(v.trim().to_owned()).filter(|x| !x.is_empty());
    let mut dsn = Some(f.dsn.trim().to_owned()).filter(|x| !x.is_empty());
    if !f.password.is_empty() {
        // The password goes into the URL's user part (percent-encoded by `url`); a DSN that
        // is not a URL with a user has nowhere to put it.
        let with = dsn
            .as_deref()
            .and_then(|d| url::Url::parse(d).ok())
            .filter(|u| !u.username().is_empty() && !u.cannot_be_a_base())
            .and_then(|mut u| u.set_password(Some(&f.password)).ok().map(|()| u));
        match with {
            Some(u) => dsn = Some(u.to_string()),
            None => {
                let flash = SettingsFlash {
                    error: Some(
                        "A password goes with a postgres:// or mysql:// DSN that names a user."
                            .into(),
                    ),
                    ..SettingsFlash::default()
                };
                return refuse(&st, &s, flash).await;
            }
        }
    }
    let input = reckon_engine::SourceInput {
        name: f.name.trim().to_owned(),
        kind: f.kind.trim().to_owned(),
        dsn,
        table: opt(&f.table),
        scan_interval: opt(&f.scan_interval),
        abandoned_after: opt(&f.abandoned_after),
        overlap: None,
        full_scan_every: None,
        mapping: None,
    };
    let error = |m: String| SettingsFlash {
        error: Some(m),
        ..SettingsFlash::default()
    };
    let ctx = crate::actions::dash_ctx(&st, &s);
    // A refusal of the egress policy at save, as the API's add, says the reason, never the
    // DSN.
    let source = match reckon_engine::commands::add_source(&ctx, input).await {
        Ok(x) => x,
        Err(e) => return refused(&st, &s, e, error).await,
    };
    // Added: said so, with the connect checks and the click that fixes each failed one.
    let message = format!("Source {} added ({}).", source.name, source.kind.as_str());
    checked(&st, &s, source, Some(message)).await
}

#[derive(Deserialize)]
pub struct PersonForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    email: String,
    #[serde(default)]
    role: String,
}

/// Change the role of a member of this tenant (the command says who may). Adding people
/// stays with `reckon user create --tenant`, the operator's.
pub async fn set_person(
    State(st): State<AppState>,
    Extension(s): Extension<WebSession>,
    form: Result<Form<PersonForm>, FormRejection>,
) -> Result<Response, PageError> {
    let f = match accept(&s, form) {
        Ok(f) => f,
        Err(refusal) => return Ok(refusal),
    };
    let member = Member {
        email: &f.email,
        role: &f.role,
        acting_user: Some(s.user.id),
        new_account: None,
    };
    if let Err(e) = commands::set_member(&dash_ctx(&st, &s), member).await {
        return refused(&st, &s, e, |m| SettingsFlash {
            error: Some(m),
            ..SettingsFlash::default()
        })
        .await;
    }
    Ok(back(&st, &s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_audit_log_names_people_and_tokens() {
        let emails = HashMap::from([(7, "ann@acme.test".to_owned())]);
        let labels = HashMap::from([(3, "deploy-bot".to_owned())]);
        assert_eq!(
            actor_words("user:7 via token:3", &emails, &labels),
            "ann@acme.test via token “deploy-bot” (#3)"
        );
        assert_eq!(actor_words("token:9", &emails, &labels), "token #9");
        assert_eq!(
            actor_words("user:ann@acme.test", &emails, &labels),
            "ann@acme.test"
        );
    }
}
