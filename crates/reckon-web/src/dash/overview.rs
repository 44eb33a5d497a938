//! The overview: the unresolved effects by kind, the sources and providers' health,
//! yesterday's audit and the 7/30-day chart, from one cached reading of the tenant
//! ([`super::DashState`]).

use super::chart::{self, Chart};
use super::chrome::{Chrome, bad_request, other_tenants};
use super::fmt::{When, age, day_text, when_in, when_opt_in, zone};
use super::{PageError, html, wants_fragment};
use crate::AppState;
use crate::session::WebSession;
use askama::Template;
use axum::Extension;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use reckon_domain::time;
use reckon_engine::read::queue::last_unresolved;
use serde::Deserialize;

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
    /// The day as the pages write dates ("28 Nov 2026"); `day` stays the name commands take.
    pub day_words: String,
    pub href: String,
    /// `None`: no run of the day yet.
    pub run: Option<AuditRunGlance>,
}

pub struct AuditRunGlance {
    /// The run that counts for the day, as the audit page shows it.
    pub id: i64,
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
        day_words: day_text(&data.yesterday),
        run: data.audit.as_ref().map(|a| AuditRunGlance {
            id: a.id,
            failed: a.failed.clone(),
            failure: a
                .failure
                .as_ref()
                .map(|(why, at)| (why.clone(), when_in(*at, tz))),
            partial: a.partial,
            finished: when_in(a.finished_at, tz),
            findings: a.findings.clone(),
        }),
    };
    let providers = data
        .providers
        .iter()
        .map(|p| ProviderHealthView {
            name: p.name.clone(),
            kind: p.kind.clone(),
            lookups: p.lookups,
            indeterminate: p.indeterminate,
            indeterminate_rate: p.indeterminate_rate.clone(),
            last_error: p.last_error.clone(),
            last_error_at: p.last_error_at.map(|t| when_in(t, tz)),
        })
        .collect();
    let mut page = OverviewPage {
        total: data.total,
        needs_attention: data.needs_attention,
        replay_closing: data.replay_closing,
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
        .map(|(src, quarantined)| SourceView {
            name: src.name.clone(),
            kind: src.kind.as_str(),
            last_success: when_opt_in(src.last_success_at, tz),
            last_error: src.last_error.clone(),
            last_error_at: when_opt_in(src.last_error_at, tz),
            failures: src.consecutive_failures,
            quarantined: *quarantined,
        })
        .collect();
    page.c = c;
    Ok(html(StatusCode::OK, &page, true))
}
