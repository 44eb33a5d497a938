//! One day of the tenant's double-charge audit, as finance reads it: the run that counts
//! for the day (`reckon_audit::chain::run_of_the_day`, the overview's and the lookup's),
//! its findings grouped by kind with what is at stake, the day's other runs, the recent
//! history, and where the digest chain does not check out.
//!
//! Reads: the tenant's settings, the chain's links (seq and digests, small whatever the runs
//! hold), the day's runs, the recent runs and the day's glance. Reading every run's findings
//! on each load would grow with the tenant's history; `reckon audit verify` does that.

use crate::answer::money;
use jiff::tz::TimeZone;
use reckon_audit::chain::RunCounts;
use reckon_audit::{DayWindow, Finding, FindingKind};
use reckon_ledger::{ALL_PROVIDERS, AuditRun, Audits, ChainBreak, LedgerError, TenantId};
use std::collections::{BTreeMap, HashMap, HashSet};

/// Runs listed in the history.
pub const HISTORY: i64 = 30;
/// Runs of one day listed (a day is audited a handful of times).
pub const DAY_RUNS: i64 = 50;

/// The audit of one day.
#[derive(Debug, Clone)]
pub struct AuditDayView {
    pub zone: TimeZone,
    pub time_zone: String,
    /// The day shown, `YYYY-MM-DD` in the tenant's zone.
    pub day: String,
    /// Yesterday there: the newest day that has ended.
    pub yesterday: String,
    /// The run shown: the one asked for, or the one that counts for the day.
    pub run: Option<RunReport>,
    /// The day's newest run, when it did not complete and is not the run shown: its reason,
    /// and when it ended.
    pub newer_failure: Option<(String, f64)>,
    pub day_runs: Vec<RunLine>,
    /// The tenant's recent runs, newest first (empty unless asked for).
    pub history: Vec<RunLine>,
    /// Links of the chain checked, and every break found in them or in the runs read.
    pub chain_checked: usize,
    pub chain_breaks: Vec<ChainBreak>,
}

/// A run in a list. As JSON it is the stored run itself (what `reckon audit list` prints).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(transparent)]
pub struct RunLine {
    pub run: AuditRun,
    /// Every finding of the run, of all kinds.
    #[serde(skip)]
    pub findings: i64,
    /// Why the run does not check out against the chain; `None`: it does.
    #[serde(skip)]
    pub problem: Option<String>,
    /// The provider scope in words ("all providers").
    #[serde(skip)]
    pub provider: String,
}

/// A run read whole, its findings grouped for people.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub run: AuditRun,
    /// It has findings: every provider's part completed, or some did (`partial`).
    pub complete: bool,
    /// Providers whose part of the day failed, each with its reason.
    pub failed_parts: Vec<(String, String)>,
    /// Why the run does not check out (the chain, or content that cannot be read).
    pub problem: Option<String>,
    pub provider: String,
    pub counts: RunCounts,
    pub groups: Vec<FindingGroup>,
    pub totals: Vec<reckon_audit::CurrencyTotals>,
}

/// The findings of one kind.
#[derive(Debug, Clone)]
pub struct FindingGroup {
    pub kind: FindingKind,
    pub title: &'static str,
    pub explain: &'static str,
    /// What is at stake in this group, in words ("charged twice: $20.00 + €5.00 extra");
    /// empty when nothing is.
    pub at_stake: String,
    pub findings: Vec<Finding>,
}

/// The day or run asked for is not one to show.
#[derive(Debug, thiserror::Error)]
pub enum AuditDayError {
    #[error("day must be a date written YYYY-MM-DD")]
    BadDay,
    /// Another tenant's run and a run of another day look the same: not here.
    #[error("no such run of that day")]
    NoSuchRun,
    #[error("the tenant's time zone: {0}")]
    Zone(String),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// What the page asks for.
#[derive(Debug, Clone, Default)]
pub struct AuditDayQuery<'a> {
    /// `None`: yesterday in the tenant's zone.
    pub day: Option<&'a str>,
    /// A run of that day; `None`: the run that counts for it.
    pub run: Option<i64>,
    /// With the recent history (a page, not its report fragment).
    pub history: bool,
}

/// The audit of a day of `tenant` as of `now`.
pub async fn audit_day<L: Audits + ?Sized>(
    ledger: &L,
    tenant: TenantId,
    q: &AuditDayQuery<'_>,
    now: f64,
) -> Result<AuditDayView, AuditDayError> {
    let settings = ledger.audit_settings(tenant).await?;
    let zone = crate::when::zone(&settings.time_zone);
    let yesterday = DayWindow::yesterday(now, &settings.time_zone)
        .map_err(|e| AuditDayError::Zone(e.to_string()))?;
    let window = match q.day {
        None => yesterday.clone(),
        Some(d) => match DayWindow::new(d, &settings.time_zone) {
            Ok(w) if d.len() == 10 => w,
            _ => return Err(AuditDayError::BadDay),
        },
    };
    let day = window.date;
    let links = ledger.audit_links(tenant).await?;
    let chain_checked = links.len();
    let mut breaks = reckon_ledger::verify_links(&links);
    let day_runs = ledger.list_audit_runs(tenant, Some(&day), DAY_RUNS).await?;
    let history_runs = if q.history {
        ledger.list_audit_runs(tenant, None, HISTORY).await?
    } else {
        Vec::new()
    };
    let mut seen = HashSet::new();
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
    let glance = ledger.audit_glance(tenant, &day).await?;
    let chosen: Option<AuditRun> = match q.run {
        Some(id) => match day_runs.iter().find(|r| r.id == id) {
            Some(r) => Some(r.clone()),
            None => return Err(AuditDayError::NoSuchRun),
        },
        None => match &glance {
            Some(g) => match day_runs.iter().find(|r| r.id == g.id) {
                Some(r) => Some(r.clone()),
                None => ledger.get_audit_run(tenant, g.id).await?,
            },
            None => None,
        },
    };
    let newer_failure = glance
        .as_ref()
        .and_then(|g| g.failure.clone())
        .filter(|_| day_runs.first().map(|r| r.id) != chosen.as_ref().map(|r| r.id));
    let line = |r: &AuditRun| run_line(r, broken.get(&r.id).cloned());
    Ok(AuditDayView {
        zone,
        time_zone: settings.time_zone,
        day,
        yesterday: yesterday.date,
        run: chosen.map(|r| {
            let problem = broken.get(&r.id).cloned();
            run_report(r, problem)
        }),
        newer_failure,
        day_runs: day_runs.iter().map(line).collect(),
        history: history_runs.iter().map(line).collect(),
        chain_checked,
        chain_breaks: breaks,
    })
}

/// The tenant's runs, newest first (of one day when `day` is given): `reckon audit list`.
pub async fn run_lines<L: Audits + ?Sized>(
    ledger: &L,
    tenant: TenantId,
    day: Option<&str>,
    limit: i64,
) -> Result<(TimeZone, Vec<RunLine>), LedgerError> {
    let zone = super::zone(ledger, tenant).await?;
    let runs = ledger.list_audit_runs(tenant, day, limit).await?;
    let lines = runs
        .iter()
        .map(|r| {
            run_line(
                r,
                reckon_ledger::verify_content(tenant.get(), r).map(|b| b.reason),
            )
        })
        .collect();
    Ok((zone, lines))
}

/// One stored run read whole, `None` when `tenant` has no run `id`: `reckon audit show`
/// and the CSV export.
pub async fn run<L: Audits + ?Sized>(
    ledger: &L,
    tenant: TenantId,
    id: i64,
) -> Result<Option<AuditRun>, LedgerError> {
    ledger.get_audit_run(tenant, id).await
}

fn run_line(run: &AuditRun, problem: Option<String>) -> RunLine {
    RunLine {
        findings: run.counts().map_or(0, |c| c.findings.values().sum()),
        problem,
        provider: provider_words(&run.run.provider),
        run: run.clone(),
    }
}

/// A run read whole, its findings grouped by kind; `problem`: where the chain says it does
/// not check out (content that cannot be read is a problem too).
pub fn run_report(run: AuditRun, problem: Option<String>) -> RunReport {
    let mut problem = problem;
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
            let of_kind: Vec<Finding> = findings
                .iter()
                .filter(|f| f.kind == kind)
                .cloned()
                .collect();
            let mut stake: BTreeMap<String, i64> = BTreeMap::new();
            for f in &of_kind {
                if let Some((a, cur)) = f.at_stake() {
                    *stake.entry(cur).or_default() += a;
                }
            }
            let (title, explain) = title_of(kind);
            FindingGroup {
                kind,
                title,
                explain,
                at_stake: if stake.is_empty() {
                    String::new()
                } else {
                    reckon_audit::stake_words(kind, &per_currency(&stake))
                },
                findings: of_kind,
            }
        })
        .collect();
    RunReport {
        complete: run.run.status == "complete" || run.run.status == "partial",
        failed_parts: run.failed_parts(),
        problem,
        provider: provider_words(&run.run.provider),
        counts,
        groups,
        totals,
        run,
    }
}

/// A run's provider scope in words.
pub fn provider_words(p: &str) -> String {
    if p == ALL_PROVIDERS {
        "all providers".into()
    } else {
        p.to_owned()
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

/// A kind of finding's title and what it means, for finance.
pub fn title_of(kind: FindingKind) -> (&'static str, &'static str) {
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
