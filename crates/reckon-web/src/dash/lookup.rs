//! Support's lookup page: renders [`reckon_engine::answer`]'s answer (the same one the API
//! and the CLI give); nothing here judges.

use super::chrome::{Chrome, other_tenants};
use super::fmt::{When, effect_href, seg, when_in};
use super::{PageError, html, wants_fragment};
use crate::AppState;
use crate::session::WebSession;
use askama::Template;
use axum::Extension;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use jiff::tz::TimeZone;
use reckon_domain::time;
use reckon_engine::answer::{
    Answer, AnswerError, ChargeFact, EffectAnswer, FindingFact, Verdict, VerdictBy,
};
use reckon_engine::read::lookup as lookup_view;
use serde::Deserialize;

#[derive(Template)]
#[template(path = "lookup.html", blocks = ["result"])]
pub struct LookupPage {
    pub c: Chrome,
    pub q: String,
    pub searched: bool,
    /// A search refused before it was answered (too long, a NUL byte).
    pub refused: Option<String>,
    pub sentence: String,
    /// The answer, one line per effect of the order (then per orphan charge).
    pub lines: Vec<String>,
    pub did_you_mean: Vec<(String, String)>,
    pub effects: Vec<EffectCard>,
    pub orphans: Vec<OrphanRow>,
    pub truncated: bool,
}

/// One effect as the lookup shows it.
pub struct EffectCard {
    pub href: String,
    pub source: String,
    pub key: String,
    /// What it is: "Charge", "Receipt email".
    pub label: String,
    pub operation: String,
    /// The verdict's machine word (`applied`, `not_applied`, …), for tests and styling.
    pub verdict: &'static str,
    /// The verdict in words, with its finality: "applied (provisional)".
    pub verdict_words: String,
    pub by: &'static str,
    pub sentence: String,
    /// The technical detail behind the sentence (shown folded, under "Details").
    pub details: Vec<String>,
    pub customer: String,
    pub needs_person: bool,
    /// What the application recorded: "unknown, 1 attempt".
    pub recorded: String,
    pub created: When,
    pub next_lookup: Option<When>,
    pub provider: String,
    /// (who, when, note)
    pub resolution: Option<(String, When, String)>,
    pub findings: Vec<FindingRow>,
    pub charges: Vec<ChargeRow>,
}

pub struct FindingRow {
    pub kind: String,
    pub day: String,
    pub href: String,
    pub summary: String,
    pub amount: String,
}

pub struct ChargeRow {
    pub id: String,
    pub provider: String,
    pub amount: String,
    pub status: String,
    pub refunded: String,
    pub key: String,
    pub created: When,
}

pub struct OrphanRow {
    pub sentence: String,
    pub charge: ChargeRow,
    pub findings: Vec<FindingRow>,
}

#[derive(Deserialize)]
pub struct LookupQuery {
    q: Option<String>,
}

fn charge_row(c: &ChargeFact, tz: &TimeZone) -> ChargeRow {
    ChargeRow {
        id: c.id.clone(),
        provider: c.provider.clone(),
        amount: c.amount.clone(),
        status: c.status.clone(),
        refunded: c.refunded.clone().unwrap_or_default(),
        key: c.key.clone().unwrap_or_default(),
        created: when_in(c.created.epoch, tz),
    }
}

fn finding_row(f: &FindingFact, base: &str) -> FindingRow {
    FindingRow {
        kind: f.kind.replace('_', " "),
        day: f.day.clone(),
        href: format!("{base}/audit?day={}&run={}", seg(&f.day), f.run_id),
        summary: f.summary.clone(),
        amount: f.amount.clone().unwrap_or_default(),
    }
}

fn verdict_words(e: &EffectAnswer) -> String {
    let w = match e.verdict {
        Verdict::Applied => "applied",
        Verdict::Duplicate => "duplicate",
        Verdict::NotApplied => "not applied",
        Verdict::Pending => "payment pending",
        Verdict::Missing => "missing at the provider",
        Verdict::Unknown => "unknown",
        Verdict::InProgress => "in progress",
    };
    match (e.verdict, e.is_final) {
        (Verdict::Applied, false) => format!("{w} (provisional)"),
        _ => w.to_owned(),
    }
}

fn by_words(b: VerdictBy) -> &'static str {
    match b {
        VerdictBy::Person => "resolved by hand",
        VerdictBy::Reconciler => "reckon asked the provider",
        VerdictBy::Audit => "the provider's charge list",
        VerdictBy::Application => "the application's record",
        VerdictBy::Nobody => "nobody yet",
    }
}

fn card(e: &EffectAnswer, tenant: &str, base: &str, tz: &TimeZone) -> EffectCard {
    let attempts = match e.recorded.attempts {
        1 => "1 attempt".to_owned(),
        n => format!("{n} attempts"),
    };
    EffectCard {
        href: effect_href(tenant, &e.source, &e.key),
        source: e.source.clone(),
        key: e.key.clone(),
        label: e.label.clone(),
        operation: e.operation.clone().unwrap_or_default(),
        verdict: e.verdict.as_str(),
        verdict_words: verdict_words(e),
        by: by_words(e.by),
        sentence: e.sentence.clone(),
        details: e.details.clone(),
        customer: e.customer.clone().unwrap_or_default(),
        needs_person: e.needs_person,
        recorded: match e.recorded.unresolved {
            Some("abandoned") => format!("{} (abandoned claim), {attempts}", e.recorded.state),
            _ => format!("{}, {attempts}", e.recorded.state),
        },
        created: when_in(e.recorded.created.epoch, tz),
        next_lookup: e
            .lookup
            .as_ref()
            .and_then(|l| l.next_lookup.as_ref())
            .map(|m| when_in(m.epoch, tz)),
        provider: e.provider.clone().unwrap_or_default(),
        resolution: e.resolution.as_ref().filter(|r| r.by_person).map(|r| {
            (
                r.author.clone(),
                when_in(r.at.epoch, tz),
                r.note.clone().unwrap_or_default(),
            )
        }),
        findings: e.findings.iter().map(|f| finding_row(f, base)).collect(),
        charges: e.charges.iter().map(|c| charge_row(c, tz)).collect(),
    }
}

pub async fn lookup(
    State(st): State<AppState>,
    Extension(s): Extension<WebSession>,
    headers: HeaderMap,
    q: Result<Query<LookupQuery>, QueryRejection>,
) -> Result<Response, PageError> {
    let c = Chrome::new(&s, "lookup");
    let mut page = LookupPage {
        q: String::new(),
        searched: false,
        refused: None,
        sentence: String::new(),
        lines: Vec::new(),
        did_you_mean: Vec::new(),
        effects: Vec::new(),
        orphans: Vec::new(),
        truncated: false,
        c,
    };
    let mut status = StatusCode::OK;
    let text = match q {
        Ok(Query(q)) => q.q.unwrap_or_default().trim().to_owned(),
        Err(_) => {
            page.refused = Some("The search is malformed.".into());
            status = StatusCode::BAD_REQUEST;
            String::new()
        }
    };
    if !text.is_empty() {
        page.searched = true;
        match lookup_view(&*st.ledger, s.tenant.id, &text, time::now()).await {
            Ok(v) => fill(&mut page, &v.answer, &s.tenant.slug, &v.zone),
            Err(AnswerError::Invalid(why)) => {
                page.refused = Some(format!("{}.", capitalise(&why)));
                status = StatusCode::BAD_REQUEST;
            }
            Err(AnswerError::Ledger(e)) => return Err(e.into()),
        }
        // Echo at most what the field accepts (a refused search may be longer).
        page.q = text
            .chars()
            .take(reckon_engine::answer::MAX_QUERY_CHARS)
            .collect();
    }
    if wants_fragment(&headers) {
        return Ok(html(status, &page.as_result(), true));
    }
    page.c.tenants = other_tenants(&st, &s).await?;
    Ok(html(status, &page, true))
}

fn capitalise(s: &str) -> String {
    let mut it = s.chars();
    match it.next() {
        Some(f) => f.to_uppercase().chain(it).collect(),
        None => String::new(),
    }
}

fn fill(page: &mut LookupPage, a: &Answer, tenant: &str, tz: &TimeZone) {
    let base = format!("/t/{}", seg(tenant));
    page.sentence = a.sentence.clone();
    page.lines = a.lines.clone();
    page.did_you_mean = a
        .did_you_mean
        .iter()
        .map(|v| {
            (
                v.clone(),
                format!(
                    "{base}/lookup?q={}",
                    url::form_urlencoded::byte_serialize(v.as_bytes()).collect::<String>()
                ),
            )
        })
        .collect();
    page.effects = a
        .effects
        .iter()
        .map(|e| card(e, tenant, &base, tz))
        .collect();
    page.orphans = a
        .orphans
        .iter()
        .map(|o| OrphanRow {
            sentence: o.sentence.clone(),
            charge: charge_row(&o.charge, tz),
            findings: o.findings.iter().map(|f| finding_row(f, &base)).collect(),
        })
        .collect();
    page.truncated = a.truncated;
}
