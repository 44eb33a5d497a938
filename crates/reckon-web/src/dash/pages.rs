//! The dashboard's pages: overview, unresolved queue, effect detail (with its actions),
//! support lookup and settings. Each handler reads a fixed number of ledger queries (no
//! per-row query) and fills a template struct with finished strings.

use super::chart::{self, Chart};
use super::fmt::{When, age, effect_href, seg, when_in, when_opt_in, zone};
use super::{PageError, assets, error_page, html, not_found, wants_fragment};
use crate::AppState;
use crate::authz::{Permission, allows};
use crate::web::WebSession;
use askama::Template;
use axum::Extension;
use axum::Form;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use jiff::tz::TimeZone;
use reckon_domain::{State as EffectState, UnresolvedKind, time};
use reckon_ledger::{
    Effect, LedgerError, NewResolution, Outcome, QueueQuery, ReconcileView, TenantId,
};
use serde::Deserialize;
use std::collections::HashMap;

/// Queue rows per page.
pub const QUEUE_PAGE: i64 = 50;
const MAX_NOTE_CHARS: usize = 4000;

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

fn bad_request(msg: &str) -> Response {
    error_page(StatusCode::BAD_REQUEST, msg)
}

/// Empty form fields mean "no filter".
fn given(v: &Option<String>) -> Option<String> {
    v.as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

/// For an empty queue: when effects were last seen unresolved, from the hourly snapshots
/// ("3 h ago"), or that none were in the period the snapshots cover.
pub fn last_unresolved(snapshots: &[reckon_ledger::Snapshot], now: f64, days: u32) -> String {
    match snapshots
        .iter()
        .filter(|x| x.unresolved > 0)
        .map(|x| x.hour)
        .reduce(f64::max)
    {
        // The snapshot of an hour counts what was unresolved during it: cleared after.
        Some(hour) => format!(
            "the last unresolved effects were cleared {} ago (hourly snapshots)",
            age(now - (hour + 3600.0).min(now))
        ),
        None => format!("none was unresolved in the last {days} days"),
    }
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

fn replay_left(st: &AppState, created_at: f64, now: f64) -> String {
    let left = created_at + st.metrics.settings.replay_window.as_secs_f64() - now;
    if left <= 0.0 {
        "closed".into()
    } else {
        age(left)
    }
}

// ---------------------------------------------------------------------------------------
// Overview
// ---------------------------------------------------------------------------------------

#[derive(Template)]
#[template(path = "overview.html", blocks = ["chart"])]
pub struct OverviewPage {
    pub c: Chrome,
    pub kinds: Vec<KindView>,
    pub total: i64,
    pub needs_attention: i64,
    pub replay_closing: i64,
    pub sources: Vec<SourceView>,
    pub providers: Vec<ProviderHealthView>,
    pub audit: AuditSummaryView,
    pub chart: Chart,
    pub cleared: String,
}

pub struct KindView {
    pub kind: String,
    pub count: i64,
    pub oldest_age: String,
    pub oldest: When,
    pub href: String,
}

pub struct SourceView {
    pub name: String,
    pub kind: &'static str,
    pub last_success: Option<When>,
    pub last_error: Option<String>,
    pub last_error_at: Option<When>,
    pub failures: i64,
    pub quarantined: i64,
}

pub struct ProviderView {
    pub name: String,
    pub kind: String,
    pub has_secret: bool,
    pub settings: String,
    /// Where its "test" form posts (settings page).
    pub test_href: String,
}

/// A provider on the overview: how often its lookups could not tell, and its last error.
pub struct ProviderHealthView {
    pub name: String,
    pub kind: String,
    pub lookups: i64,
    /// "12.5 %", or "–" without lookups in the window.
    pub indeterminate_rate: String,
    pub indeterminate: i64,
    pub last_error: Option<String>,
    pub last_error_at: Option<When>,
}

/// Yesterday's audit on the overview.
pub struct AuditSummaryView {
    pub day: String,
    pub href: String,
    /// `None`: no run of the day yet.
    pub run: Option<AuditRunGlance>,
}

pub struct AuditRunGlance {
    /// No provider's part of the day completed: nothing to show but why.
    pub failed: Option<String>,
    /// Some provider's part failed (in this run or a later one): its reason and when.
    pub failure: Option<(String, When)>,
    /// Findings stand for the providers read whole, not for every provider.
    pub partial: bool,
    pub finished: When,
    /// (kind, count) of the kinds found, in the audit page's order; empty: nothing found.
    pub findings: Vec<(String, i64)>,
}

/// The audit page's order of finding kinds (the most expensive first).
const FINDING_ORDER: [&str; 6] = [
    "duplicate",
    "missing",
    "orphan",
    "unresolved",
    "risky_reclaim",
    "split_intent",
];

#[derive(Deserialize)]
pub struct OverviewQuery {
    days: Option<u32>,
}

pub async fn overview(
    State(st): State<AppState>,
    Extension(s): Extension<WebSession>,
    headers: HeaderMap,
    q: Result<Query<OverviewQuery>, QueryRejection>,
) -> Result<Response, PageError> {
    let Ok(Query(q)) = q else {
        return Ok(bad_request("days must be 7 or 30."));
    };
    let days = match q.days {
        None => 7,
        Some(d @ (7 | 30)) => d,
        Some(_) => return Ok(bad_request("days must be 7 or 30.")),
    };
    let now = time::now();
    let tenant = s.tenant.id;
    let settings = &st.metrics.settings;
    let replay = reckon_ledger::ReplayClosing {
        open_after: now - settings.replay_window.as_secs_f64(),
        closing_before: now
            - settings
                .replay_window
                .saturating_sub(settings.replay_warning)
                .as_secs_f64(),
    };
    let data = st.dash.overview(&st, tenant, now, replay).await?;
    let from = now - f64::from(days) * 86400.0 - 3600.0;
    let snapshots: Vec<_> = data
        .snapshots
        .iter()
        .filter(|x| x.hour >= from)
        .cloned()
        .collect();
    let chart = chart::build(&snapshots, now, days);
    let cleared = last_unresolved(&snapshots, now, days);
    let mut c = Chrome::new(&s, "overview");
    let tz = &zone(&data.time_zone);
    let audit = AuditSummaryView {
        href: format!("{}/audit?day={}", c.base, data.yesterday),
        day: data.yesterday.clone(),
        run: data.audit.as_ref().map(|a| AuditRunGlance {
            failed: (a.status == "failed")
                .then(|| a.reason.clone().unwrap_or_else(|| "failed".into())),
            failure: a
                .failure
                .as_ref()
                .filter(|_| a.status != "failed")
                .map(|(why, at)| (why.clone(), when_in(*at, tz))),
            partial: a.status == "partial",
            finished: when_in(a.finished_at, tz),
            findings: FINDING_ORDER
                .iter()
                .filter_map(|k| {
                    a.findings
                        .iter()
                        .find(|(kind, n)| kind == k && *n > 0)
                        .map(|(kind, n)| (kind.replace('_', " "), *n))
                })
                .collect(),
        }),
    };
    let providers = data
        .providers
        .iter()
        .map(|p| {
            let h = data.health.iter().find(|h| h.provider == p.name);
            let (lookups, indeterminate) = h.map_or((0, 0), |h| (h.lookups, h.indeterminate));
            ProviderHealthView {
                name: p.name.clone(),
                kind: p.kind.clone(),
                lookups,
                indeterminate,
                indeterminate_rate: if lookups == 0 {
                    "–".into()
                } else {
                    format!("{:.1} %", 100.0 * indeterminate as f64 / lookups as f64)
                },
                last_error: h.and_then(|h| h.last_error.clone()),
                last_error_at: h.and_then(|h| h.last_error_at).map(|t| when_in(t, tz)),
            }
        })
        .collect();
    let mut page = OverviewPage {
        total: data.kinds.iter().map(|k| k.count).sum(),
        needs_attention: data.kinds.iter().map(|k| k.needs_attention).sum(),
        replay_closing: data.kinds.iter().map(|k| k.replay_closing).sum(),
        kinds: vec![],
        sources: vec![],
        providers,
        audit,
        chart,
        cleared,
        c: Chrome::new(&s, "overview"),
    };
    if wants_fragment(&headers) {
        return Ok(html(StatusCode::OK, &page.as_chart(), true));
    }
    c.tenants = other_tenants(&st, &s).await?;
    let mut quarantined: HashMap<&str, i64> = HashMap::new();
    for qc in &data.quarantine {
        *quarantined.entry(qc.source.as_str()).or_default() += qc.count;
    }
    page.kinds = data
        .kinds
        .iter()
        .map(|k| KindView {
            kind: k.kind.clone(),
            count: k.count,
            oldest_age: age(now - k.oldest_since),
            oldest: when_in(k.oldest_since, tz),
            href: format!("{}/queue?kind={}", c.base, k.kind),
        })
        .collect();
    page.sources = data
        .sources
        .iter()
        .map(|src| SourceView {
            name: src.name.clone(),
            kind: src.kind.as_str(),
            last_success: when_opt_in(src.last_success_at, tz),
            last_error: src.last_error.clone(),
            last_error_at: when_opt_in(src.last_error_at, tz),
            failures: src.consecutive_failures,
            quarantined: quarantined.get(src.name.as_str()).copied().unwrap_or(0),
        })
        .collect();
    page.c = c;
    Ok(html(StatusCode::OK, &page, true))
}

fn provider_view(p: &reckon_ledger::Provider, base: &str) -> ProviderView {
    ProviderView {
        name: p.name.clone(),
        kind: p.kind.clone(),
        has_secret: p.has_secret,
        // Settings hold no secret (the key is sealed apart and never read back here).
        settings: p.settings.to_string(),
        test_href: format!("{base}/settings/providers/{}/test", seg(&p.name)),
    }
}

// ---------------------------------------------------------------------------------------
// Unresolved queue
// ---------------------------------------------------------------------------------------

#[derive(Deserialize, Default)]
pub struct QueueParams {
    source: Option<String>,
    operation: Option<String>,
    kind: Option<String>,
    provider: Option<String>,
    outcome: Option<String>,
    attention: Option<String>,
    after: Option<String>,
    requeued: Option<i64>,
}

pub struct Filters {
    pub source: String,
    pub operation: String,
    pub kind: String,
    pub provider: String,
    pub outcome: String,
    pub attention: bool,
}

#[derive(Template)]
#[template(path = "queue.html", blocks = ["rows"])]
pub struct QueuePage {
    pub c: Chrome,
    pub f: Filters,
    /// (name, selected)
    pub sources: Vec<(String, bool)>,
    pub providers: Vec<(String, bool)>,
    pub outcomes: Vec<(&'static str, bool)>,
    pub rows: Vec<QueueRowView>,
    pub next_href: Option<String>,
    pub filtered: bool,
    /// Finance and admin may re-look up a provider's indeterminate effects in bulk.
    pub can_requeue: bool,
    /// After a bulk re-lookup: how many effects are due again.
    pub requeued: Option<i64>,
    /// For the empty state: when the queue last held something.
    pub cleared: String,
}

pub struct QueueRowView {
    /// No provider is routed for it: a person must check.
    pub unrouted: bool,
    pub href: String,
    pub source: String,
    pub key: String,
    pub operation: String,
    pub kind: &'static str,
    pub age: String,
    pub since: When,
    pub attempts: i64,
    pub lookups: i64,
    pub last_outcome: Option<String>,
    pub last_error: Option<String>,
    pub next_attempt: Option<When>,
    pub replay_left: String,
    pub needs_attention: bool,
    pub provider: Option<String>,
}

pub const KINDS: [&str; 2] = ["unknown", "abandoned"];
pub const OUTCOMES: [&str; 4] = ["indeterminate", "applied", "not_applied", "duplicate"];

pub async fn queue(
    State(st): State<AppState>,
    Extension(s): Extension<WebSession>,
    headers: HeaderMap,
    p: Result<Query<QueueParams>, QueryRejection>,
) -> Result<Response, PageError> {
    let Ok(Query(p)) = p else {
        return Ok(bad_request("The filters are malformed."));
    };
    let kind = given(&p.kind);
    if kind.as_deref().is_some_and(|k| !KINDS.contains(&k)) {
        return Ok(bad_request("kind must be unknown or abandoned."));
    }
    let outcome = given(&p.outcome);
    if outcome.as_deref().is_some_and(|o| !OUTCOMES.contains(&o)) {
        return Ok(bad_request(
            "outcome must be indeterminate, applied, not_applied or duplicate.",
        ));
    }
    let after = match given(&p.after) {
        None => None,
        Some(a) => match a
            .split_once(':')
            .and_then(|(t, id)| Some((t.parse::<f64>().ok()?, id.parse::<i64>().ok()?)))
        {
            Some((t, id)) if t.is_finite() => Some((t, id)),
            _ => {
                return Ok(bad_request(
                    "after must be <since>:<id>, as the next-page link has it.",
                ));
            }
        },
    };
    let attention = given(&p.attention).is_some();
    let now = time::now();
    let q = QueueQuery {
        source: given(&p.source),
        operation: given(&p.operation),
        kind,
        provider: given(&p.provider),
        outcome,
        needs_attention: attention,
        after,
        limit: QUEUE_PAGE + 1,
        now,
    };
    let mut found = st.ledger.unresolved_queue(s.tenant.id, &q).await?;
    let tz = &tenant_zone(&st, s.tenant.id).await?;
    let more = found.len() as i64 > QUEUE_PAGE;
    found.truncate(QUEUE_PAGE as usize);
    let mut c = Chrome::new(&s, "queue");
    let f = Filters {
        source: q.source.clone().unwrap_or_default(),
        operation: q.operation.clone().unwrap_or_default(),
        kind: q.kind.clone().unwrap_or_default(),
        provider: q.provider.clone().unwrap_or_default(),
        outcome: q.outcome.clone().unwrap_or_default(),
        attention,
    };
    let next_href = match (more, found.last()) {
        (true, Some(last)) => {
            let mut qs = url::form_urlencoded::Serializer::new(String::new());
            for (k, v) in [
                ("source", &f.source),
                ("operation", &f.operation),
                ("kind", &f.kind),
                ("provider", &f.provider),
                ("outcome", &f.outcome),
            ] {
                if !v.is_empty() {
                    qs.append_pair(k, v);
                }
            }
            if attention {
                qs.append_pair("attention", "1");
            }
            qs.append_pair("after", &format!("{}:{}", last.since, last.effect.id));
            Some(format!("{}/queue?{}", c.base, qs.finish()))
        }
        _ => None,
    };
    let rows: Vec<QueueRowView> = found
        .iter()
        .map(|r| QueueRowView {
            href: effect_href(&s.tenant.slug, &r.effect.source, &r.effect.key),
            source: r.effect.source.clone(),
            key: r.effect.key.clone(),
            operation: r.effect.operation.clone().unwrap_or_default(),
            kind: match r.effect.state {
                EffectState::Unknown => "unknown",
                _ => "abandoned",
            },
            age: age(now - r.since),
            since: when_in(r.since, tz),
            attempts: r.effect.attempts,
            lookups: r.lookups,
            last_outcome: r.last_outcome.as_deref().map(|o| match (o, r.non_final) {
                ("applied", true) => "applied (provisional)".to_owned(),
                ("indeterminate", true) => "indeterminate (payment pending)".to_owned(),
                _ => o.to_owned(),
            }),
            last_error: r.last_error.clone(),
            // An effect no provider answers for is never looked up: no time to show.
            next_attempt: if r.provider.is_none() || r.needs_attention {
                None
            } else {
                when_opt_in(r.next_attempt_at, tz)
            },
            unrouted: r.provider.is_none() && r.lookups == 0 && r.last_error.is_some(),
            replay_left: replay_left(&st, r.effect.created_at, now),
            needs_attention: r.needs_attention,
            provider: r.provider.clone(),
        })
        .collect();
    let filtered = q.source.is_some()
        || q.operation.is_some()
        || q.kind.is_some()
        || q.provider.is_some()
        || q.outcome.is_some()
        || attention
        || after.is_some();
    let fragment = wants_fragment(&headers);
    if !fragment {
        c.tenants = other_tenants(&st, &s).await?;
    }
    let (sources, providers) = if fragment {
        (vec![], vec![])
    } else {
        (
            st.ledger
                .list_sources(s.tenant.id)
                .await?
                .into_iter()
                .map(|x| {
                    let on = x.name == f.source;
                    (x.name, on)
                })
                .collect(),
            st.ledger
                .list_providers(s.tenant.id)
                .await?
                .into_iter()
                .map(|x| {
                    let on = x.name == f.provider;
                    (x.name, on)
                })
                .collect(),
        )
    };
    let outcomes = OUTCOMES.iter().map(|o| (*o, *o == f.outcome)).collect();
    let cleared = if rows.is_empty() && !filtered {
        let snapshots = st
            .ledger
            .snapshots(s.tenant.id, now - 30.0 * 86400.0)
            .await?;
        last_unresolved(&snapshots, now, 30)
    } else {
        String::new()
    };
    let page = QueuePage {
        c,
        f,
        sources,
        providers,
        outcomes,
        rows,
        next_href,
        filtered,
        can_requeue: allows(s.role, Permission::ResolveManually),
        requeued: p.requeued,
        cleared,
    };
    if fragment {
        return Ok(html(StatusCode::OK, &page.as_rows(), true));
    }
    Ok(html(StatusCode::OK, &page, true))
}

#[derive(Deserialize)]
pub struct RequeueForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    provider: String,
}

/// The queue's bulk re-lookup: every indeterminate effect of the filtered provider is due
/// again now (and no longer parked as needing attention), through the same ledger step as
/// `POST /api/v1/reconcile/requeue`, recorded in the audit log the same way. Answered 303
/// to the queue filtered by that provider, saying how many.
pub async fn requeue(
    State(st): State<AppState>,
    Extension(s): Extension<WebSession>,
    form: Result<Form<RequeueForm>, FormRejection>,
) -> Result<Response, PageError> {
    let form = match accept(&s, form) {
        Ok(f) => f,
        Err(refusal) => return Ok(refusal),
    };
    let name = form.provider.trim();
    if name.is_empty() {
        return Ok(bad_request(
            "Choose a provider first: a bulk re-lookup asks one provider again.",
        ));
    }
    let provider = match st.ledger.provider_by_name(s.tenant.id, name).await {
        Ok(p) => p,
        Err(LedgerError::NotFound(_)) => return Ok(not_found()),
        Err(e) => return Err(e.into()),
    };
    let now = time::now();
    let n = st
        .ledger
        .requeue_indeterminate(s.tenant.id, provider.id, 0.0, now, now)
        .await?;
    st.dash.forget(s.tenant.id);
    crate::actions::record(
        &st,
        s.tenant.id,
        format!("user:{}", s.user.email),
        "reconcile.requeue",
        Some(provider.name.clone()),
        serde_json::json!({ "from": 0.0, "to": now, "requeued": n, "via": "dashboard" }),
    )
    .await;
    let mut qs = url::form_urlencoded::Serializer::new(String::new());
    qs.append_pair("provider", &provider.name);
    qs.append_pair("requeued", &n.to_string());
    Ok(Redirect::to(&format!("/t/{}/queue?{}", seg(&s.tenant.slug), qs.finish())).into_response())
}

// ---------------------------------------------------------------------------------------
// Effect detail, resolve by hand, reconcile now
// ---------------------------------------------------------------------------------------

#[derive(Template)]
#[template(path = "effect.html", blocks = ["live"])]
pub struct EffectPage {
    pub c: Chrome,
    pub e: EffectView,
    pub timeline: Vec<TimelineItem>,
    pub resolution: Option<ResolutionView>,
    pub reconcile: Option<ReconcileStateView>,
    pub can_resolve: bool,
    pub resolve_href: String,
    pub reconcile_href: String,
    pub message: Option<String>,
    pub error: Option<String>,
    pub note: String,
}

pub struct EffectView {
    pub id: i64,
    pub source: String,
    pub key: String,
    pub operation: String,
    pub subject: String,
    pub state: &'static str,
    pub words: String,
    pub attempts: i64,
    pub request_hash: String,
    pub response: String,
    pub created: When,
    pub updated: When,
    pub expires: Option<When>,
    pub first_seen: When,
    pub gone: Option<When>,
    pub gone_reason: String,
    pub unresolved: bool,
    pub replay_left: String,
}

pub struct ResolutionView {
    pub outcome: String,
    pub author: String,
    pub note: String,
    pub at: When,
}

pub struct ReconcileStateView {
    pub lookups: i64,
    /// `None` when reckon will not look again: resolved, given up, or no provider routed.
    pub next_attempt: Option<When>,
    pub last_outcome: String,
    pub last_error: String,
    pub needs_attention: bool,
    pub provider: String,
}

pub struct TimelineItem {
    pub at: When,
    pub class: &'static str,
    pub title: String,
    pub detail: String,
    pub evidence: String,
}

/// How an effect stands, in words for support.
pub fn state_words(e: &Effect, now: f64, tz: &TimeZone) -> String {
    if let Some(g) = e.gone_at {
        return format!(
            "gone from the source ({}) at {}",
            e.gone_reason.as_deref().unwrap_or("removed"),
            when_in(g, tz).text
        );
    }
    match (e.state, e.unresolved_kind) {
        (EffectState::Succeeded, _) => {
            format!("done: succeeded at {}", when_in(e.updated_at, tz).text)
        }
        (EffectState::Failed, _) => {
            format!(
                "failed at {}: the application did not apply it",
                when_in(e.updated_at, tz).text
            )
        }
        (_, Some(UnresolvedKind::Unknown)) => format!(
            "outcome unknown for {}: nobody knows yet whether it happened",
            age(now - e.unresolved_since.unwrap_or(e.updated_at))
        ),
        (_, Some(UnresolvedKind::Abandoned)) => format!(
            "abandoned for {}: its worker stopped before finishing",
            age(now - e.unresolved_since.unwrap_or(e.updated_at))
        ),
        _ => format!("in progress since {}", when_in(e.updated_at, tz).text),
    }
}

#[derive(Deserialize)]
pub struct EffectPath {
    #[allow(dead_code)]
    tenant: String,
    source: String,
    key: String,
}

async fn effect_response(
    st: &AppState,
    s: &WebSession,
    path: &EffectPath,
    fragment: bool,
    status: StatusCode,
    flash: Flash,
) -> Result<Response, PageError> {
    let tenant = s.tenant.id;
    let Some(detail) = st
        .ledger
        .get_effect(tenant, &path.source, &path.key)
        .await?
    else {
        return Ok(not_found());
    };
    let view = st.ledger.reconcile_view(tenant, detail.effect.id).await?;
    let tz = tenant_zone(st, tenant).await?;
    let providers: HashMap<i64, String> = if view.attempts.is_empty() && view.state.is_none() {
        HashMap::new()
    } else {
        st.ledger
            .list_providers(tenant)
            .await?
            .into_iter()
            .map(|p| (p.id, p.name))
            .collect()
    };
    let now = time::now();
    let mut page = effect_page(st, &tz, s, &detail, &view, &providers, now, flash);
    if fragment {
        return Ok(html(status, &page.as_live(), true));
    }
    page.c.tenants = other_tenants(st, s).await?;
    Ok(html(status, &page, true))
}

#[derive(Default)]
struct Flash {
    message: Option<String>,
    error: Option<String>,
    note: String,
}

#[allow(clippy::too_many_arguments)]
fn effect_page(
    st: &AppState,
    tz: &TimeZone,
    s: &WebSession,
    d: &reckon_ledger::EffectDetail,
    view: &ReconcileView,
    providers: &HashMap<i64, String>,
    now: f64,
    flash: Flash,
) -> EffectPage {
    let e = &d.effect;
    let name = |id: Option<i64>| {
        id.and_then(|i| providers.get(&i).cloned())
            .unwrap_or_else(|| "none".into())
    };
    let mut timeline: Vec<(f64, TimelineItem)> = Vec::new();
    for ev in &d.history {
        let change = match (&ev.from_state, &ev.to_state) {
            (Some(a), Some(b)) if a != b => format!("{a} → {b}"),
            (None, Some(b)) => format!("first seen as {b}"),
            (_, Some(b)) => b.clone(),
            _ => String::new(),
        };
        timeline.push((
            ev.observed_at,
            TimelineItem {
                at: when_in(ev.observed_at, tz),
                class: "event",
                title: format!("{} ({})", ev.kind, ev.origin),
                detail: [
                    change,
                    ev.attempts
                        .map(|a| format!("attempts {a}"))
                        .unwrap_or_default(),
                    ev.detail.clone().unwrap_or_default(),
                ]
                .into_iter()
                .filter(|x| !x.is_empty())
                .collect::<Vec<_>>()
                .join(" · "),
                evidence: String::new(),
            },
        ));
    }
    for a in &view.attempts {
        timeline.push((
            a.finished_at,
            TimelineItem {
                at: when_in(a.finished_at, tz),
                class: "attempt",
                title: format!("lookup at {}: {}", name(a.provider_id), a.outcome),
                detail: [
                    a.method
                        .clone()
                        .map(|m| format!("method {m}"))
                        .unwrap_or_default(),
                    a.error
                        .clone()
                        .map(|m| format!("error: {m}"))
                        .unwrap_or_default(),
                ]
                .into_iter()
                .filter(|x| !x.is_empty())
                .collect::<Vec<_>>()
                .join(" · "),
                evidence: serde_json::to_string_pretty(&a.evidence).unwrap_or_default(),
            },
        ));
    }
    if let Some(r) = &view.resolution {
        timeline.push((
            r.created_at,
            TimelineItem {
                at: when_in(r.created_at, tz),
                class: "resolution",
                title: format!("resolved as {} by {}", r.outcome, r.author),
                detail: r.note.clone().unwrap_or_default(),
                evidence: String::new(),
            },
        ));
    }
    // Stable: events of one moment keep the order they were recorded in.
    timeline.sort_by(|a, b| a.0.total_cmp(&b.0));
    let unresolved = e.unresolved_kind.is_some();
    let base = format!("/t/{}", seg(&s.tenant.slug));
    let tail = format!("{}/{}", seg(&e.source), seg(&e.key));
    EffectPage {
        e: EffectView {
            id: e.id,
            source: e.source.clone(),
            key: e.key.clone(),
            operation: e.operation.clone().unwrap_or_default(),
            subject: e.subject.clone().unwrap_or_default(),
            state: e.state.as_str(),
            // The source keeps saying `unknown` until write-back; say what reckon decided.
            words: match &view.resolution {
                Some(r) if unresolved => format!(
                    "the source still says {}; resolved here as {} by {}",
                    e.state.as_str(),
                    r.outcome,
                    r.author
                ),
                _ => state_words(e, now, tz),
            },
            attempts: e.attempts,
            request_hash: e.request_hash.clone(),
            response: e.response_json.clone().unwrap_or_else(|| "null".into()),
            created: when_in(e.created_at, tz),
            updated: when_in(e.updated_at, tz),
            expires: when_opt_in(e.expires_at, tz),
            first_seen: when_in(e.first_seen_at, tz),
            gone: when_opt_in(e.gone_at, tz),
            gone_reason: e.gone_reason.clone().unwrap_or_default(),
            unresolved,
            replay_left: replay_left(st, e.created_at, now),
        },
        timeline: timeline.into_iter().map(|(_, t)| t).collect(),
        resolution: view.resolution.as_ref().map(|r| ResolutionView {
            outcome: r.outcome.to_string(),
            author: r.author.clone(),
            note: r.note.clone().unwrap_or_default(),
            at: when_in(r.created_at, tz),
        }),
        reconcile: view.state.as_ref().map(|x| ReconcileStateView {
            lookups: x.attempts,
            next_attempt: (view.resolution.is_none()
                && unresolved
                && !x.needs_attention
                && x.provider_id.is_some())
            .then(|| when_in(x.next_attempt_at, tz)),
            last_outcome: outcome_words(x.last_outcome, x.non_final),
            last_error: x.last_error.clone().unwrap_or_default(),
            needs_attention: x.needs_attention && view.resolution.is_none(),
            provider: name(x.provider_id),
        }),
        can_resolve: allows(s.role, Permission::ResolveWithNote)
            && unresolved
            && view.resolution.is_none(),
        resolve_href: format!("{base}/resolve/{tail}"),
        reconcile_href: format!("{base}/reconcile/{tail}"),
        message: flash.message,
        error: flash.error,
        note: flash.note,
        c: Chrome::new(s, "effect"),
    }
}

pub async fn effect(
    State(st): State<AppState>,
    Extension(s): Extension<WebSession>,
    headers: HeaderMap,
    Path(path): Path<EffectPath>,
) -> Result<Response, PageError> {
    effect_response(
        &st,
        &s,
        &path,
        wants_fragment(&headers),
        StatusCode::OK,
        Flash::default(),
    )
    .await
}

#[derive(Deserialize)]
pub struct ResolveForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    outcome: String,
    #[serde(default)]
    note: String,
}

pub(crate) fn csrf_ok(s: &WebSession, token: &str) -> bool {
    crate::web::same_token(token, &s.csrf_token)
}

/// A dashboard form that carries the session's CSRF token.
pub(crate) trait HasCsrf {
    fn csrf(&self) -> &str;
}

/// Implements [`HasCsrf`] for forms whose token is the field `csrf`.
macro_rules! csrf_form {
    ($($t:ty),* $(,)?) => {
        $(impl $crate::dash::pages::HasCsrf for $t {
            fn csrf(&self) -> &str {
                &self.csrf
            }
        })*
    };
}
pub(crate) use csrf_form;

/// Every state-changing form's first step, in one place: the form, or the page refusing
/// it (400 when it does not parse or is too large, 403 when its CSRF token is not the
/// session's). Nothing else is read or written before this passes.
// The refusal is a whole response, returned at once, once per request: boxing it buys
// nothing.
#[allow(clippy::result_large_err)]
pub(crate) fn accept<F: HasCsrf>(
    s: &WebSession,
    form: Result<Form<F>, FormRejection>,
) -> Result<F, Response> {
    let Ok(Form(f)) = form else {
        return Err(bad_request("The form is malformed or too large."));
    };
    if !csrf_ok(s, f.csrf()) {
        return Err(error_page(
            StatusCode::FORBIDDEN,
            "Missing or wrong CSRF token: reload the page and try again.",
        ));
    }
    Ok(f)
}

csrf_form!(RequeueForm, ResolveForm, CsrfOnly);

pub async fn resolve(
    State(st): State<AppState>,
    Extension(s): Extension<WebSession>,
    headers: HeaderMap,
    Path(path): Path<EffectPath>,
    form: Result<Form<ResolveForm>, FormRejection>,
) -> Result<Response, PageError> {
    let form = match accept(&s, form) {
        Ok(f) => f,
        Err(refusal) => return Ok(refusal),
    };
    let fragment = wants_fragment(&headers);
    let note = form.note.trim().to_owned();
    let refuse = |error: &str| Flash {
        error: Some(error.to_owned()),
        note: form.note.clone(),
        message: None,
    };
    // htmx 2 swaps only 2xx answers, so a refusal it should show comes as 200 with the
    // error in the fragment; a plain form post gets the page with the real status.
    let refused = |fragment: bool| {
        if fragment {
            StatusCode::OK
        } else {
            StatusCode::UNPROCESSABLE_ENTITY
        }
    };
    let outcome = match form.outcome.as_str() {
        "applied" => Outcome::Applied,
        "not_applied" => Outcome::NotApplied,
        _ => {
            let flash = refuse("Choose whether it happened (applied) or not (not applied).");
            return effect_response(&st, &s, &path, fragment, refused(fragment), flash).await;
        }
    };
    if note.is_empty() {
        let flash = refuse("A note is required: say how you know.");
        return effect_response(&st, &s, &path, fragment, refused(fragment), flash).await;
    }
    if note.chars().count() > MAX_NOTE_CHARS {
        let flash = refuse("The note is too long (at most 4000 characters).");
        return effect_response(&st, &s, &path, fragment, refused(fragment), flash).await;
    }
    let tenant = s.tenant.id;
    let Some(detail) = st
        .ledger
        .get_effect(tenant, &path.source, &path.key)
        .await?
    else {
        return Ok(not_found());
    };
    if detail.effect.unresolved_kind.is_none() {
        let flash = refuse("This effect is not unresolved: there is nothing to decide.");
        return effect_response(&st, &s, &path, fragment, refused(fragment), flash).await;
    }
    // The evidence the person decided on: what the last lookup had found, if any.
    let view = st.ledger.reconcile_view(tenant, detail.effect.id).await?;
    let evidence = serde_json::json!({
        "seen_by": "dashboard",
        "last_attempt_id": view.attempts.last().map(|a| a.id),
        "last_attempt_evidence": view.attempts.last().map(|a| a.evidence.clone()),
    });
    let done = st
        .ledger
        .resolve_by_hand(
            tenant,
            detail.effect.id,
            NewResolution {
                outcome,
                author: s.user.email.clone(),
                note: Some(note),
                evidence,
            },
        )
        .await;
    let flash = match done {
        Ok(r) => {
            st.dash.forget(tenant);
            tracing::info!(tenant = %s.tenant.slug, effect = detail.effect.id, outcome = %r.outcome, "resolved by hand");
            crate::actions::record(
                &st,
                tenant,
                format!("user:{}", s.user.email),
                "effect.resolve",
                Some(format!("{}/{}", path.source, path.key)),
                serde_json::json!({ "outcome": r.outcome, "note": r.note, "via": "dashboard" }),
            )
            .await;
            if !fragment {
                let href = effect_href(&s.tenant.slug, &path.source, &path.key);
                return Ok(Redirect::to(&href).into_response());
            }
            Flash {
                message: Some(format!("Resolved as {}.", r.outcome)),
                ..Flash::default()
            }
        }
        Err(LedgerError::Conflict(_)) => {
            let flash = refuse("Someone resolved this effect already; see the timeline.");
            let status = if fragment {
                StatusCode::OK
            } else {
                StatusCode::CONFLICT
            };
            return effect_response(&st, &s, &path, fragment, status, flash).await;
        }
        Err(e) => return Err(e.into()),
    };
    effect_response(&st, &s, &path, fragment, StatusCode::OK, flash).await
}

/// A form with nothing but its CSRF token (a button).
#[derive(Deserialize)]
pub struct CsrfOnly {
    #[serde(default)]
    csrf: String,
}

pub async fn reconcile_now(
    State(st): State<AppState>,
    Extension(s): Extension<WebSession>,
    headers: HeaderMap,
    Path(path): Path<EffectPath>,
    form: Result<Form<CsrfOnly>, FormRejection>,
) -> Result<Response, PageError> {
    if let Err(refusal) = accept(&s, form) {
        return Ok(refusal);
    }
    let fragment = wants_fragment(&headers);
    let tenant: TenantId = s.tenant.id;
    let Some(detail) = st
        .ledger
        .get_effect(tenant, &path.source, &path.key)
        .await?
    else {
        return Ok(not_found());
    };
    // The shared HTTP client and the default options; the lease owner is this request's.
    let ctx = reckon_engine::reconcile::ReconcileCtx::new(st.ledger.clone())
        .with_egress(st.egress.clone())
        .with_metrics(st.metrics.instance.clone());
    let message = match reckon_engine::reconcile::reconcile_one(&ctx, &s.tenant, detail.effect.id)
        .await
    {
        Ok(Some(o)) => format!("Looked up now: {} ({}).", o.outcome, o.reason),
        Ok(None) => {
            "Not looked up: it is resolved already, or another worker holds it right now.".into()
        }
        Err(e) => return Err(crate::error::ApiError::internal(e).into()),
    };
    // The overview's counts and provider health changed: the person sees their own lookup.
    st.dash.forget(tenant);
    if !fragment {
        let href = effect_href(&s.tenant.slug, &path.source, &path.key);
        return Ok(Redirect::to(&href).into_response());
    }
    let flash = Flash {
        message: Some(message),
        ..Flash::default()
    };
    effect_response(&st, &s, &path, fragment, StatusCode::OK, flash).await
}

// ---------------------------------------------------------------------------------------
// Settings (admins): read-only views; secrets are never read back.
// ---------------------------------------------------------------------------------------

#[derive(Template)]
#[template(path = "settings.html")]
pub struct SettingsPage {
    pub c: Chrome,
    pub sources: Vec<SettingsSource>,
    pub providers: Vec<ProviderView>,
    pub routes: Vec<(String, String, String)>,
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
}

pub struct SettingsSource {
    pub name: String,
    pub kind: &'static str,
    pub dsn: String,
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
pub async fn settings_response(
    st: &AppState,
    s: &WebSession,
    status: StatusCode,
    flash: SettingsFlash,
) -> Result<Response, PageError> {
    let t = s.tenant.id;
    let sources = st.ledger.list_sources(t).await?;
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
                table: x.table_name.clone(),
                interval: age(x.scan_interval_secs as f64),
                last_success: when_opt_in(x.last_success_at, tz),
                last_error: x.last_error.clone().unwrap_or_default(),
                failures: x.consecutive_failures,
                writeback: x.writeback().map(|w| w.as_str()).unwrap_or("off"),
                can_writeback: x.kind.as_str() != "push",
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
            .map(|r| {
                (
                    r.source,
                    r.operation,
                    r.provider.unwrap_or_else(|| "none".into()),
                )
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

/// A lookup's outcome as the effect page says it: a verdict that is not final says so.
fn outcome_words(outcome: Option<Outcome>, non_final: bool) -> String {
    match (outcome, non_final) {
        (None, _) => "none yet".into(),
        (Some(Outcome::Applied), true) => {
            "applied, provisional (the check for a second payment is not complete yet; \
             re-checked, never written back)"
                .into()
        }
        (Some(Outcome::Indeterminate), true) => {
            "indeterminate: a payment can still move money (re-checked until it settles)".into()
        }
        (Some(o), _) => o.to_string(),
    }
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
