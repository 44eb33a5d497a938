//! The audit page: one day of the tenant's double-charge audit for finance. A day picker
//! (yesterday in the tenant's zone by default), the day's run with its findings grouped by
//! kind and amounts per currency, the totals, a CSV download (the engine's `findings_csv`,
//! recorded in the audit log like the API's export), and the run history with each run's
//! place in the verified digest chain.
//!
//! What it shows is read and grouped by `reckon_engine::read::audit_day`; this page writes
//! it as HTML (amounts as money, times in the tenant's zone).

use super::chrome::Chrome;
use super::fmt::{When, effect_href, money, seg, when_in};
use super::{PageError, error_page, html, not_found, wants_fragment};
use crate::AppState;
use crate::authz::{Permission, allows};
use crate::session::WebSession;
use askama::Template;
use axum::Extension;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use jiff::tz::TimeZone;
use reckon_audit::Finding;
use reckon_engine::read::audit_day::{
    self, AuditDayError, AuditDayQuery, RunLine, RunReport, audit_day,
};
use serde::Deserialize;

/// Runs listed in the history.
pub use reckon_engine::read::audit_day::HISTORY;

#[derive(Template)]
#[template(path = "audit.html", blocks = ["report"])]
pub struct AuditPage {
    pub c: Chrome,
    pub day: String,
    pub time_zone: String,
    pub is_yesterday: bool,
    pub prev_href: String,
    pub next_href: Option<String>,
    /// The run shown: `?run=` or the run that counts for the day
    /// (`reckon_audit::chain::run_of_the_day`, the overview's).
    pub run: Option<RunView>,
    /// The day's newest run, when it did not complete and is not the run shown: its
    /// reason, and when it ended.
    pub newer_failure: Option<(String, When)>,
    pub day_runs: Vec<RunRow>,
    pub history: Vec<RunRow>,
    pub chain_checked: usize,
    pub chain_breaks: Vec<String>,
    pub can_export: bool,
}

pub struct RunView {
    pub id: i64,
    pub seq: i64,
    /// It has findings: every provider's part completed, or some did (`partial`).
    pub complete: bool,
    /// Providers whose part of the day failed, each with its reason.
    pub failed_parts: Vec<(String, String)>,
    pub reason: String,
    pub provider: String,
    pub triggered_by: String,
    pub finished: When,
    pub verified: bool,
    pub problem: String,
    pub csv_href: String,
    pub effects_in_day: i64,
    pub charges_in_day: i64,
    pub groups: Vec<FindingGroup>,
    pub totals: Vec<TotalView>,
}

pub struct FindingGroup {
    pub kind: String,
    pub title: String,
    pub explain: &'static str,
    /// What is at stake in this group, in words ("charged twice: $20.00 + €5.00 extra");
    /// empty when nothing is.
    pub at_stake: String,
    pub findings: Vec<FindingView>,
}

pub struct FindingView {
    pub summary: String,
    /// What to do, with the charge ids and amounts.
    pub action: String,
    /// Whom the money concerns (`cus_9 (order ORD-7)`).
    pub whom: String,
    /// What is at stake in words; empty when nothing is.
    pub at_stake: String,
    pub refunded: bool,
    pub effects: Vec<EffectView>,
    pub charges: Vec<ChargeView>,
    pub suggestions: Vec<String>,
}

pub struct EffectView {
    pub href: String,
    /// `source/key`
    pub label: String,
    /// The application's state of it.
    pub state: String,
    /// reckon's verdict (`duplicate`), empty when it has none, and in words.
    pub verdict: String,
    pub verdict_words: String,
}

pub struct ChargeView {
    pub id: String,
    pub amount: String,
    pub status: String,
    pub refunded: String,
    pub created: Option<When>,
}

pub struct TotalView {
    pub currency: String,
    pub charged: String,
    pub refunded: String,
    pub net: String,
    pub matched: String,
    pub unmatched: String,
}

pub struct RunRow {
    pub id: i64,
    pub seq: i64,
    pub day: String,
    pub href: String,
    pub complete: bool,
    pub status: String,
    pub provider: String,
    pub triggered_by: String,
    pub finished: When,
    pub findings: i64,
    pub verified: bool,
    pub problem: String,
    pub selected: bool,
}

#[derive(Deserialize)]
pub struct AuditQuery {
    day: Option<String>,
    run: Option<String>,
}

fn finding_view(f: &Finding, tenant_slug: &str, tz: &TimeZone) -> FindingView {
    FindingView {
        summary: f.summary.clone(),
        action: f.action_words(),
        whom: f.whom(),
        at_stake: f
            .at_stake()
            .map(|(a, cur)| reckon_audit::stake_words(f.kind, &money(a, &cur)))
            .unwrap_or_default(),
        refunded: f.refunded,
        effects: f
            .effects
            .iter()
            .map(|e| EffectView {
                href: effect_href(tenant_slug, &e.source, &e.key),
                label: format!("{}/{}", e.source, e.key),
                state: e.state.as_str().to_owned(),
                verdict: e.verdict.map(|v| v.as_str().to_owned()).unwrap_or_default(),
                verdict_words: e
                    .verdict
                    .map(|v| reckon_audit::verdict_words(v).to_owned())
                    .unwrap_or_default(),
            })
            .collect(),
        charges: f
            .charges
            .iter()
            .map(|c| ChargeView {
                id: c.id.clone(),
                amount: money(c.amount, &c.currency),
                status: c.status.clone(),
                refunded: if c.amount_refunded > 0 {
                    money(c.amount_refunded, &c.currency)
                } else {
                    String::new()
                },
                created: Some(when_in(c.created, tz)),
            })
            .collect(),
        suggestions: f
            .suggestions
            .iter()
            .map(|s| format!("{} may be {}/{} ({})", s.charge, s.source, s.key, s.why))
            .collect(),
    }
}

/// The page's view of a [`RunReport`]: amounts as money, times in the tenant's zone.
pub fn run_view(r: &RunReport, tenant_slug: &str, base: &str, tz: &TimeZone) -> RunView {
    let run = &r.run;
    RunView {
        id: run.id,
        seq: run.seq,
        complete: r.complete,
        failed_parts: r.failed_parts.clone(),
        reason: run.run.reason.clone().unwrap_or_default(),
        provider: r.provider.clone(),
        triggered_by: run.run.triggered_by.clone(),
        finished: when_in(run.run.finished_at, tz),
        verified: r.problem.is_none(),
        problem: r.problem.clone().unwrap_or_default(),
        csv_href: format!("{base}/audit/{}/csv", run.id),
        effects_in_day: r.counts.effects_in_day,
        charges_in_day: r.counts.charges_in_day,
        groups: r
            .groups
            .iter()
            .map(|g| FindingGroup {
                kind: g.kind.as_str().to_owned(),
                title: g.title.to_owned(),
                explain: g.explain,
                at_stake: g.at_stake.clone(),
                findings: g
                    .findings
                    .iter()
                    .map(|f| finding_view(f, tenant_slug, tz))
                    .collect(),
            })
            .collect(),
        totals: r
            .totals
            .iter()
            .map(|t| {
                let m = |minor: i64| money(minor, &t.currency);
                TotalView {
                    currency: t.currency.to_ascii_uppercase(),
                    charged: m(t.charged),
                    refunded: m(t.refunded),
                    net: m(t.net),
                    matched: m(t.matched),
                    unmatched: m(t.unmatched),
                }
            })
            .collect(),
    }
}

fn row(line: &RunLine, base: &str, tz: &TimeZone, selected: Option<i64>) -> RunRow {
    let run = &line.run;
    RunRow {
        id: run.id,
        seq: run.seq,
        day: run.run.day.clone(),
        href: format!("{base}/audit?day={}&run={}", run.run.day, run.id),
        complete: run.run.status == "complete",
        status: run.run.status.clone(),
        provider: line.provider.clone(),
        triggered_by: run.run.triggered_by.clone(),
        finished: when_in(run.run.finished_at, tz),
        findings: line.findings,
        verified: line.problem.is_none(),
        problem: line.problem.clone().unwrap_or_default(),
        selected: selected == Some(run.id),
    }
}

fn day_href(base: &str, day: &str) -> String {
    format!("{base}/audit?day={day}")
}

pub async fn audit_page(
    State(st): State<AppState>,
    Extension(s): Extension<WebSession>,
    headers: HeaderMap,
    q: Result<Query<AuditQuery>, QueryRejection>,
) -> Result<Response, PageError> {
    let Ok(Query(q)) = q else {
        return Ok(error_page(
            StatusCode::BAD_REQUEST,
            "The day or run is malformed.",
        ));
    };
    let run_id = match q.run.as_deref().map(str::trim).filter(|r| !r.is_empty()) {
        None => None,
        Some(r) => match r.parse::<i64>() {
            Ok(id) => Some(id),
            Err(_) => {
                return Ok(error_page(
                    StatusCode::BAD_REQUEST,
                    "run must be a run's number, as the history links have it.",
                ));
            }
        },
    };
    let fragment = wants_fragment(&headers);
    let asked = AuditDayQuery {
        day: q.day.as_deref().map(str::trim).filter(|d| !d.is_empty()),
        run: run_id,
        history: !fragment,
    };
    let now = reckon_domain::time::now();
    let v = match audit_day(&*st.ledger, s.tenant.id, &asked, now).await {
        Ok(v) => v,
        Err(AuditDayError::BadDay) => {
            return Ok(error_page(
                StatusCode::BAD_REQUEST,
                "day must be a date written YYYY-MM-DD.",
            ));
        }
        Err(AuditDayError::NoSuchRun) => return Ok(not_found()),
        Err(AuditDayError::Ledger(e)) => return Err(e.into()),
        Err(e @ AuditDayError::Zone(_)) => return Err(crate::error::ApiError::internal(e).into()),
    };
    let tz = &v.zone;
    let mut c = Chrome::new(&s, "audit");
    let base = c.base.clone();
    let selected = v.run.as_ref().map(|r| r.run.id);
    let run = v
        .run
        .as_ref()
        .map(|r| run_view(r, &s.tenant.slug, &base, tz));
    let day_rows = v
        .day_runs
        .iter()
        .map(|r| row(r, &base, tz, selected))
        .collect();
    let history = if fragment {
        vec![]
    } else {
        c.tenants = super::chrome::other_tenants(&st, &s).await?;
        v.history
            .iter()
            .map(|r| row(r, &base, tz, selected))
            .collect()
    };
    let civil: jiff::civil::Date = v.day.parse().map_err(crate::error::ApiError::internal)?;
    let prev = civil
        .yesterday()
        .map(|d| day_href(&base, &d.to_string()))
        .unwrap_or_default();
    // No link into days that have not ended yet.
    let next_href = civil
        .tomorrow()
        .ok()
        .filter(|d| d.to_string() <= v.yesterday)
        .map(|d| day_href(&base, &d.to_string()));
    let page = AuditPage {
        is_yesterday: v.day == v.yesterday,
        day: v.day.clone(),
        time_zone: v.time_zone.clone(),
        prev_href: prev,
        next_href,
        run,
        newer_failure: v
            .newer_failure
            .as_ref()
            .map(|(why, at)| (why.clone(), when_in(*at, tz))),
        day_runs: day_rows,
        history,
        chain_checked: v.chain_checked,
        chain_breaks: v
            .chain_breaks
            .iter()
            .map(|b| format!("run #{}: {}", b.seq, b.reason))
            .collect(),
        can_export: allows(s.role, Permission::Export),
        c,
    };
    if fragment {
        return Ok(html(StatusCode::OK, &page.as_report(), true));
    }
    Ok(html(StatusCode::OK, &page, true))
}

#[derive(Deserialize)]
pub struct CsvPath {
    #[allow(
        dead_code,
        reason = "the route guard resolved the path's tenant into the session, which the handler reads"
    )]
    tenant: String,
    id: String,
}

/// The run's findings as CSV (the same text as `GET /api/v1/audits/{id}?format=csv`). An
/// export leaves the building: the audit log says who took it.
pub async fn audit_csv(
    State(st): State<AppState>,
    Extension(s): Extension<WebSession>,
    Path(p): Path<CsvPath>,
) -> Result<Response, PageError> {
    let Ok(id) = p.id.parse::<i64>() else {
        return Ok(not_found());
    };
    let Some(run) = audit_day::run(&*st.ledger, s.tenant.id, id).await? else {
        return Ok(not_found());
    };
    let body =
        reckon_engine::audit::findings_csv(&run).map_err(crate::error::ApiError::internal)?;
    crate::actions::record(
        &st,
        s.tenant.id,
        format!("user:{}", s.user.email),
        "export",
        Some(format!("audit:{}", run.id)),
        serde_json::json!({ "format": "csv", "day": run.run.day, "via": "dashboard" }),
    )
    .await;
    let name = format!(
        "attachment; filename=\"reckon-audit-{}-{}-{}.csv\"",
        seg(&s.tenant.slug),
        run.run.day,
        run.id
    );
    Ok((
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_owned()),
            (header::CONTENT_DISPOSITION, name),
            (header::CACHE_CONTROL, "no-store".to_owned()),
        ],
        body,
    )
        .into_response())
}
