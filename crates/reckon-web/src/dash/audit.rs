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
use crate::web::WebSession;
use askama::Template;
use axum::Extension;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use jiff::tz::TimeZone;
use reckon_audit::{DayWindow, FindingKind};
use reckon_ledger::AuditRun;
use serde::Deserialize;
use serde_json::Value;
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
    /// The run shown: `?run=` or the day's newest complete run (else its newest).
    pub run: Option<RunView>,
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
    /// "$20.00 + €5.00" at stake in this group, per currency.
    pub at_stake: String,
    pub findings: Vec<FindingView>,
}

pub struct FindingView {
    pub summary: String,
    pub amount: String,
    pub refunded: bool,
    /// (href, "source/key", state)
    pub effects: Vec<(String, String, String)>,
    pub charges: Vec<ChargeView>,
    pub suggestions: Vec<String>,
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

fn title_of(kind: &str) -> (String, &'static str) {
    match kind {
        "duplicate" => (
            "Duplicate charges".into(),
            "One effect, charged more than once: money moved twice.",
        ),
        "orphan" => (
            "Orphan charges".into(),
            "Charged at the provider, with no effect record behind it.",
        ),
        "missing" => (
            "Missing charges".into(),
            "Recorded as succeeded, but the provider has no charge for it.",
        ),
        "unresolved" => (
            "Unresolved effects".into(),
            "Nobody knows yet whether these happened.",
        ),
        "risky_reclaim" => (
            "Risky reclaims".into(),
            "Claimed more than once (attempts > 1): a retry may have charged again.",
        ),
        "split_intent" => (
            "Split intents".into(),
            "One payment intent with several charges.",
        ),
        other => (other.replace('_', " "), ""),
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

fn str_of(v: &Value, field: &str) -> String {
    match &v[field] {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn findings_total(run: &AuditRun) -> i64 {
    run.run.counts["findings"]
        .as_object()
        .map(|m| m.values().filter_map(Value::as_i64).sum())
        .unwrap_or(0)
}

pub fn run_view(
    run: &AuditRun,
    tenant_slug: &str,
    base: &str,
    tz: &TimeZone,
    breaks: &HashMap<i64, String>,
) -> RunView {
    let empty = Vec::new();
    let findings = run.run.findings.as_array().unwrap_or(&empty);
    // Known kinds in their usual order, then anything newer the engine reports.
    let mut order: Vec<String> = FindingKind::ALL
        .iter()
        .map(|k| k.as_str().to_owned())
        .collect();
    for f in findings {
        let k = str_of(f, "kind");
        if !order.contains(&k) {
            order.push(k);
        }
    }
    let groups = order
        .into_iter()
        .filter_map(|kind| {
            let of_kind: Vec<&Value> = findings
                .iter()
                .filter(|f| f["kind"].as_str() == Some(kind.as_str()))
                .collect();
            if of_kind.is_empty() {
                return None;
            }
            let mut stake: BTreeMap<String, i64> = BTreeMap::new();
            let views = of_kind
                .iter()
                .map(|f| {
                    let currency = str_of(f, "currency");
                    let amount = f["amount"].as_i64();
                    if let Some(a) = amount {
                        *stake.entry(currency.to_ascii_lowercase()).or_default() += a;
                    }
                    FindingView {
                        summary: str_of(f, "summary"),
                        amount: amount.map(|a| money(a, &currency)).unwrap_or_default(),
                        refunded: f["refunded"].as_bool().unwrap_or(false),
                        effects: f["effects"]
                            .as_array()
                            .unwrap_or(&empty)
                            .iter()
                            .map(|e| {
                                let (src, key) = (str_of(e, "source"), str_of(e, "key"));
                                (
                                    effect_href(tenant_slug, &src, &key),
                                    format!("{src}/{key}"),
                                    str_of(e, "state"),
                                )
                            })
                            .collect(),
                        charges: f["charges"]
                            .as_array()
                            .unwrap_or(&empty)
                            .iter()
                            .map(|c| {
                                let cur = str_of(c, "currency");
                                let refunded = c["amount_refunded"].as_i64().unwrap_or(0);
                                ChargeView {
                                    id: str_of(c, "id"),
                                    amount: c["amount"]
                                        .as_i64()
                                        .map(|a| money(a, &cur))
                                        .unwrap_or_default(),
                                    status: str_of(c, "status"),
                                    refunded: if refunded > 0 {
                                        money(refunded, &cur)
                                    } else {
                                        String::new()
                                    },
                                    created: c["created"].as_f64().map(|t| when_in(t, tz)),
                                }
                            })
                            .collect(),
                        suggestions: f["suggestions"]
                            .as_array()
                            .unwrap_or(&empty)
                            .iter()
                            .map(|s| {
                                format!(
                                    "{} may be {}/{} ({})",
                                    str_of(s, "charge"),
                                    str_of(s, "source"),
                                    str_of(s, "key"),
                                    str_of(s, "why")
                                )
                            })
                            .collect(),
                    }
                })
                .collect();
            let (title, explain) = title_of(&kind);
            Some(FindingGroup {
                kind,
                title,
                explain,
                at_stake: per_currency(&stake),
                findings: views,
            })
        })
        .collect();
    let totals = run
        .run
        .totals
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .map(|t| {
            let cur = str_of(t, "currency");
            let m = |field: &str| money(t[field].as_i64().unwrap_or(0), &cur);
            TotalView {
                currency: cur.to_ascii_uppercase(),
                charged: m("charged"),
                refunded: m("refunded"),
                net: m("net"),
                matched: m("matched"),
                unmatched: m("unmatched"),
            }
        })
        .collect();
    RunView {
        id: run.id,
        seq: run.seq,
        complete: run.run.status == "complete" || run.run.status == "partial",
        failed_parts: run.run.evidence["providers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["status"].as_str() == Some("failed"))
            .map(|p| (str_of(p, "name"), str_of(p, "reason")))
            .collect(),
        reason: run.run.reason.clone().unwrap_or_default(),
        provider: provider_words(&run.run.provider),
        triggered_by: run.run.triggered_by.clone(),
        finished: when_in(run.run.finished_at, tz),
        verified: !breaks.contains_key(&run.id),
        problem: breaks.get(&run.id).cloned().unwrap_or_default(),
        csv_href: format!("{base}/audit/{}/csv", run.id),
        effects_in_day: run.run.counts["effects_in_day"].as_i64().unwrap_or(0),
        charges_in_day: run.run.counts["charges_in_day"].as_i64().unwrap_or(0),
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
            && let Some(b) = reckon_ledger::verify_content(tenant, r)
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
    let chosen: Option<AuditRun> = match run_id {
        Some(id) => match day_runs.iter().find(|r| r.id == id) {
            Some(r) => Some(r.clone()),
            // Another tenant's run and a run of another day look the same: not here.
            None => return Ok(not_found()),
        },
        None => day_runs
            .iter()
            .find(|r| r.run.status == "complete")
            .or_else(|| day_runs.iter().find(|r| r.run.status == "partial"))
            .or_else(|| day_runs.first())
            .cloned(),
    };
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
    #[allow(dead_code)]
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
