//! The audit page: one day of the tenant's double-charge audit for finance. A day picker
//! (yesterday in the tenant's zone by default), the day's run with its findings grouped by
//! kind and amounts per currency, the totals, a CSV download (the engine's `findings_csv`,
//! recorded in the audit log like the API's export), and the run history with each run's
//! place in the verified digest chain.
//!
//! Reads: the tenant's settings, the day's runs, the recent runs, and the whole chain for
//! its verification (`reckon_engine::audit::verify`: one run a day per provider scope, so
//! it grows by a few hundred rows a year).

use super::chrome::Chrome;
use super::fmt::{When, effect_href, money, seg, when_in, zone};
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
use reckon_audit::chain::RunCounts;
use reckon_audit::{DayWindow, Finding, FindingKind};
use reckon_ledger::AuditRun;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};

/// Runs listed in the history.
pub const HISTORY: i64 = 30;

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

fn title_of(kind: FindingKind) -> (&'static str, &'static str) {
    match kind {
        FindingKind::Duplicate => (
            "Duplicate charges",
            "One effect, charged more than once: money moved twice.",
        ),
        FindingKind::Orphan => (
            "Orphan charges",
            "Charged at the provider, with no effect record behind it.",
        ),
        FindingKind::Missing => (
            "Missing charges",
            "Recorded as succeeded, but the provider has no charge for it.",
        ),
        FindingKind::Unresolved => (
            "Unresolved effects",
            "Nobody knows yet whether these happened.",
        ),
        FindingKind::RiskyReclaim => (
            "Risky reclaims",
            "Claimed more than once (attempts > 1): a retry may have charged again.",
        ),
        FindingKind::SplitIntent => ("Split intents", "One payment intent with several charges."),
        FindingKind::ChargedNotRecorded => (
            "Charged, recorded as failed",
            "The application recorded it as failed, but the provider took the money: record \
             it as paid or refund it; never charge again.",
        ),
        FindingKind::Other => (
            "Other findings",
            "Of a kind a newer version of reckon reports.",
        ),
    }
}

/// Sum per currency, written `$20.00 + €5.00`.
fn per_currency(amounts: &BTreeMap<String, i64>) -> String {
    amounts
        .iter()
        .map(|(cur, minor)| money(*minor, cur))
        .collect::<Vec<_>>()
        .join(" + ")
}

fn findings_total(run: &AuditRun) -> i64 {
    run.counts().map_or(0, |c| c.findings.values().sum())
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

pub fn run_view(
    run: &AuditRun,
    tenant_slug: &str,
    base: &str,
    tz: &TimeZone,
    breaks: &HashMap<i64, String>,
) -> RunView {
    let mut problem = breaks.get(&run.id).cloned();
    let mut unreadable = |what: &str, e: serde_json::Error| {
        problem.get_or_insert_with(|| format!("its stored {what} could not be read ({e})"));
    };
    let findings = run.findings().unwrap_or_else(|e| {
        unreadable("findings", e);
        Vec::new()
    });
    let totals = run.totals().unwrap_or_else(|e| {
        unreadable("totals", e);
        Vec::new()
    });
    let counts = run.counts().unwrap_or_else(|e| {
        unreadable("counts", e);
        RunCounts::default()
    });
    let mut kinds: Vec<FindingKind> = findings.iter().map(|f| f.kind).collect();
    kinds.sort();
    kinds.dedup();
    let groups = kinds
        .into_iter()
        .map(|kind| {
            let of_kind = findings.iter().filter(|f| f.kind == kind);
            let mut stake: BTreeMap<String, i64> = BTreeMap::new();
            for f in of_kind.clone() {
                if let Some((a, cur)) = f.at_stake() {
                    *stake.entry(cur).or_default() += a;
                }
            }
            let (title, explain) = title_of(kind);
            FindingGroup {
                kind: kind.as_str().to_owned(),
                title: title.to_owned(),
                explain,
                at_stake: if stake.is_empty() {
                    String::new()
                } else {
                    reckon_audit::stake_words(kind, &per_currency(&stake))
                },
                findings: of_kind.map(|f| finding_view(f, tenant_slug, tz)).collect(),
            }
        })
        .collect();
    let totals = totals
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
        .collect();
    RunView {
        id: run.id,
        seq: run.seq,
        complete: run.run.status == "complete" || run.run.status == "partial",
        failed_parts: run.failed_parts(),
        reason: run.run.reason.clone().unwrap_or_default(),
        provider: provider_words(&run.run.provider),
        triggered_by: run.run.triggered_by.clone(),
        finished: when_in(run.run.finished_at, tz),
        verified: problem.is_none(),
        problem: problem.unwrap_or_default(),
        csv_href: format!("{base}/audit/{}/csv", run.id),
        effects_in_day: counts.effects_in_day,
        charges_in_day: counts.charges_in_day,
        groups,
        totals,
    }
}

fn provider_words(p: &str) -> String {
    if p == reckon_ledger::ALL_PROVIDERS {
        "all providers".into()
    } else {
        p.to_owned()
    }
}

fn row(
    run: &AuditRun,
    base: &str,
    tz: &TimeZone,
    breaks: &HashMap<i64, String>,
    selected: Option<i64>,
) -> RunRow {
    RunRow {
        id: run.id,
        seq: run.seq,
        day: run.run.day.clone(),
        href: format!("{base}/audit?day={}&run={}", run.run.day, run.id),
        complete: run.run.status == "complete",
        status: run.run.status.clone(),
        provider: provider_words(&run.run.provider),
        triggered_by: run.run.triggered_by.clone(),
        finished: when_in(run.run.finished_at, tz),
        findings: findings_total(run),
        verified: !breaks.contains_key(&run.id),
        problem: breaks.get(&run.id).cloned().unwrap_or_default(),
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
    let tenant = s.tenant.id;
    let settings = st.ledger.audit_settings(tenant).await?;
    let tz = zone(&settings.time_zone);
    let now = reckon_domain::time::now();
    let yesterday =
        DayWindow::yesterday(now, &settings.time_zone).map_err(crate::error::ApiError::internal)?;
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
    let asked = q.day.as_deref().map(str::trim).filter(|d| !d.is_empty());
    let window = match asked {
        None => yesterday.clone(),
        Some(d) => match DayWindow::new(d, &settings.time_zone) {
            Ok(w) if d.len() == 10 => w,
            _ => {
                return Ok(error_page(
                    StatusCode::BAD_REQUEST,
                    "day must be a date written YYYY-MM-DD.",
                ));
            }
        },
    };
    let day = window.date.clone();
    let mut c = Chrome::new(&s, "audit");
    let base = c.base.clone();
    // The whole chain's links (seq and digests, small whatever the runs hold), and the
    // content of every run this page shows. Reading every run's findings and evidence on
    // each load would grow with the tenant's history; `reckon audit verify` does that.
    let links = st.ledger.audit_links(tenant).await?;
    let checked = links.len();
    let mut breaks = reckon_ledger::verify_links(&links);
    let day_runs = st.ledger.list_audit_runs(tenant, Some(&day), 50).await?;
    let history_runs = if wants_fragment(&headers) {
        vec![]
    } else {
        st.ledger.list_audit_runs(tenant, None, HISTORY).await?
    };
    let mut seen = std::collections::HashSet::new();
    for r in day_runs.iter().chain(&history_runs) {
        if seen.insert(r.id)
            && let Some(b) = reckon_ledger::verify_content(tenant.get(), r)
        {
            breaks.push(b);
        }
    }
    breaks.sort_by_key(|b| b.seq);
    let mut broken: HashMap<i64, String> = HashMap::new();
    for b in &breaks {
        broken
            .entry(b.id)
            .and_modify(|r| {
                r.push_str("; ");
                r.push_str(&b.reason);
            })
            .or_insert_with(|| b.reason.clone());
    }
    // The day's run as the overview, the API and support's lookup have it.
    let glance = st.ledger.audit_glance(tenant, &day).await?;
    let chosen: Option<AuditRun> = match run_id {
        Some(id) => match day_runs.iter().find(|r| r.id == id) {
            Some(r) => Some(r.clone()),
            // Another tenant's run and a run of another day look the same: not here.
            None => return Ok(not_found()),
        },
        None => match &glance {
            Some(g) => match day_runs.iter().find(|r| r.id == g.id) {
                Some(r) => Some(r.clone()),
                None => st.ledger.get_audit_run(tenant, g.id).await?,
            },
            None => None,
        },
    };
    let newer_failure = glance
        .as_ref()
        .and_then(|g| g.failure.clone())
        .filter(|_| day_runs.first().map(|r| r.id) != chosen.as_ref().map(|r| r.id))
        .map(|(why, at)| (why, when_in(at, &tz)));
    let selected = chosen.as_ref().map(|r| r.id);
    let run = chosen
        .as_ref()
        .map(|r| run_view(r, &s.tenant.slug, &base, &tz, &broken));
    let day_rows = day_runs
        .iter()
        .map(|r| row(r, &base, &tz, &broken, selected))
        .collect();
    let history = if wants_fragment(&headers) {
        vec![]
    } else {
        c.tenants = super::chrome::other_tenants(&st, &s).await?;
        history_runs
            .iter()
            .map(|r| row(r, &base, &tz, &broken, selected))
            .collect()
    };
    let civil: jiff::civil::Date = day.parse().map_err(crate::error::ApiError::internal)?;
    let prev = civil
        .yesterday()
        .map(|d| day_href(&base, &d.to_string()))
        .unwrap_or_default();
    // No link into days that have not ended yet.
    let next_href = civil
        .tomorrow()
        .ok()
        .filter(|d| d.to_string() <= yesterday.date)
        .map(|d| day_href(&base, &d.to_string()));
    let page = AuditPage {
        is_yesterday: day == yesterday.date,
        day,
        time_zone: settings.time_zone.clone(),
        prev_href: prev,
        next_href,
        run,
        newer_failure,
        day_runs: day_rows,
        history,
        chain_checked: checked,
        chain_breaks: breaks
            .iter()
            .map(|b| format!("run #{}: {}", b.seq, b.reason))
            .collect(),
        can_export: allows(s.role, Permission::Export),
        c,
    };
    if wants_fragment(&headers) {
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
    let Some(run) = st.ledger.get_audit_run(s.tenant.id, id).await? else {
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
