//! The double-charge audit of a day as step functions over the ledger:
//!
//! - [`run_audit`]: import every provider charge of the day (plus a margin) from each audited
//!   provider, complete or failed; read the day's effects (by creation time) and charges back
//!   from the ledger; run the pure audit (`reckon_audit::audit`); store the run in the
//!   tenant's digest chain. A failed import stores a `failed` run with its reason and no
//!   findings: a partial day is never reported.
//! - [`audit_day`]: the audit alone over what the ledger holds (the benchmark measures it).
//! - [`run_due`]: the nightly run of yesterday at each tenant's local `audit_time`, exactly
//!   once across replicas (a lease `audit:<tenant>:<day>` plus the ledger's refusal of a
//!   second completed scheduled run).
//! - [`verify`]: walk a tenant's chain and report every break.
//! - [`findings_csv`]: one row per finding, formula-neutralised.

use crate::answer::route_of;
use reckon_audit::{
    AuditEffect, DayWindow, MARGIN_SECS, MatchRules, ProviderCharge, Refund, Releaser,
};
use reckon_domain::{ChargeStatus, Disappearance};
use reckon_ledger::{
    ALL_PROVIDERS, AuditRun, ChainBreak, Effect, Lease, Ledger, LedgerError, NewAuditRun,
    Provider as ProviderRow, SCHEDULE_AUTHOR, StoredCharge, TenantId,
};
use reckon_providers::listing::{ListedCharge, PageEvidence};
use reckon_providers::{GetClient, Redactor, build_provider, provider_key};
use secrecy::ExposeSecret;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Clone)]
pub struct AuditCtx {
    pub ledger: Arc<dyn Ledger>,
    pub client: GetClient,
    /// Who holds the schedule's leases (one per process).
    pub owner: String,
    pub metrics: Option<reckon_metrics::Metrics>,
    /// How long a scheduled run may hold its day's lease.
    pub lease_secs: f64,
    /// After a failed scheduled run, wait this long before trying the day again.
    pub retry_failed_after_secs: f64,
    /// Where providers may be reached (their base URLs are tenant input). The default
    /// refuses loopback and private networks, as for reconciliation.
    pub egress: Arc<reckon_sources::EgressPolicy>,
}

impl AuditCtx {
    pub fn new(ledger: Arc<dyn Ledger>) -> AuditCtx {
        AuditCtx {
            ledger,
            client: GetClient::shared(),
            owner: format!("reckon-{}-{}", std::process::id(), rand::random::<u32>()),
            metrics: None,
            lease_secs: 1800.0,
            retry_failed_after_secs: 900.0,
            egress: Arc::new(reckon_sources::EgressPolicy::default()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuditRunError {
    /// Bad input (date, zone, provider name): a 4xx for the API.
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

impl From<reckon_audit::AuditError> for AuditRunError {
    fn from(e: reckon_audit::AuditError) -> Self {
        AuditRunError::Invalid(e.to_string())
    }
}

/// What to audit.
#[derive(Debug, Clone)]
pub struct AuditRequest {
    /// `YYYY-MM-DD` in the tenant's zone; `None` = yesterday.
    pub date: Option<String>,
    /// One provider by name; `None` = every provider of the tenant.
    pub provider: Option<String>,
    /// A person's email, `operator`, or `schedule`.
    pub triggered_by: String,
    pub now: f64,
}

/// The tenant's day for `date` (or yesterday), in its zone.
pub async fn day_window(
    ledger: &dyn Ledger,
    tenant: TenantId,
    date: Option<&str>,
    now: f64,
) -> Result<DayWindow, AuditRunError> {
    let s = ledger.audit_settings(tenant).await?;
    Ok(match date {
        Some(d) => DayWindow::new(d, &s.time_zone)?,
        None => DayWindow::yesterday(now, &s.time_zone)?,
    })
}

/// Set the tenant's zone and nightly time, both checked (an unknown zone is refused by name).
pub async fn set_settings(
    ledger: &dyn Ledger,
    tenant: TenantId,
    time_zone: Option<&str>,
    audit_time: Option<&str>,
) -> Result<reckon_ledger::AuditSettings, AuditRunError> {
    let mut s = ledger.audit_settings(tenant).await?;
    if let Some(z) = time_zone {
        reckon_audit::validate_zone(z)?;
        s.time_zone = z.to_owned();
    }
    if let Some(t) = audit_time {
        reckon_audit::parse_local_time(t)?;
        s.audit_time = t.to_owned();
    }
    ledger.set_audit_settings(tenant, &s).await?;
    Ok(s)
}

/// The providers a run covers.
async fn providers_of(
    ledger: &dyn Ledger,
    tenant: TenantId,
    name: Option<&str>,
) -> Result<Vec<ProviderRow>, AuditRunError> {
    match name {
        Some(n) => match ledger.provider_by_name(tenant, n).await {
            Ok(p) => Ok(vec![p]),
            Err(LedgerError::NotFound(_)) => {
                Err(AuditRunError::Invalid(format!("no provider named {n:?}")))
            }
            Err(e) => Err(e.into()),
        },
        None => Ok(ledger.list_providers(tenant).await?),
    }
}

/// A listed charge as stored: what the provider sent, with its secret and any credential
/// shape redacted (metadata and the raw object are shown to finance and support).
fn stored(provider_id: i64, c: ListedCharge, now: f64, redactor: &Redactor) -> StoredCharge {
    let mut metadata = serde_json::to_value(&c.metadata).unwrap_or(json!({}));
    redactor.json(&mut metadata);
    let mut raw = c.raw;
    redactor.json(&mut raw);
    StoredCharge {
        provider_id,
        charge_id: c.id,
        // The ledger's columns keep their names; the words are the neutral model's.
        payment_intent: c.payment,
        amount: c.amount,
        currency: c.currency,
        status: c.status.as_str().to_owned(),
        amount_captured: c.amount_captured,
        amount_refunded: c.amount_refunded,
        refunds: serde_json::to_value(&c.refunds).unwrap_or(Value::Array(vec![])),
        metadata,
        idempotency_key: c.idempotency_key,
        customer: c.customer,
        created: c.created,
        raw,
        imported_at: now,
    }
}

/// One provider's part of a run: its listing came back whole, or it failed with a reason.
#[derive(Debug, Clone)]
pub struct ProviderPart {
    pub provider: String,
    pub kind: reckon_ledger::ProviderKind,
    /// `complete` or `failed`.
    pub status: &'static str,
    pub reason: Option<String>,
}

/// What importing the day did: the charges stored from the providers whose listing came back
/// whole, each provider's part, and the pages read (the run's evidence).
struct Imported {
    stored: u64,
    parts: Vec<ProviderPart>,
    pages: Vec<PageEvidence>,
}

/// List one provider's day (with its margin), whole or not at all.
async fn list_one(
    ctx: &AuditCtx,
    tenant: TenantId,
    p: &ProviderRow,
    window: &DayWindow,
    now: f64,
    pages: &mut Vec<PageEvidence>,
) -> Result<Vec<StoredCharge>, String> {
    let (from, to) = (window.start - MARGIN_SECS, window.end + MARGIN_SECS);
    let secret = ctx
        .ledger
        .provider_secret(tenant, p)
        .await
        .map_err(|e| format!("provider {}: {e}", p.name))?;
    if let Some(base) = p.settings.get("base_url").and_then(|u| u.as_str()) {
        let checked = match url::Url::parse(base) {
            Ok(u) => ctx.egress.check_url(&u).await.map_err(|e| e.to_string()),
            Err(e) => Err(format!("base_url: {e}")),
        };
        if let Err(why) = checked {
            return Err(format!(
                "provider {}: refused by the egress policy: {why}",
                p.name
            ));
        }
    }
    let redactor = Redactor::new(secret.iter().map(|s| s.expose_secret().to_owned()));
    // The client resolves every host through the egress policy when it connects.
    let client = crate::provider_client(&ctx.client, &ctx.egress);
    let adapter = build_provider(p.kind, &p.settings, secret, client)
        .map_err(|e| format!("provider {}: {e}", p.name))?;
    match adapter.list_charges(from, to).await {
        Ok(listing) => {
            pages.extend(listing.pages);
            Ok(listing
                .charges
                .into_iter()
                .map(|c| stored(p.id, c, now, &redactor))
                .collect())
        }
        Err(f) => {
            pages.extend(f.pages.iter().cloned());
            Err(redactor.text(&format!("provider {}: {f}", p.name)))
        }
    }
}

/// Import the day from every provider, each on its own: a provider whose listing fails
/// fails its own part (with its reason) and stores nothing, while the charges of those
/// whose listing came back whole are stored. Only the ledger failing fails the import.
async fn import(
    ctx: &AuditCtx,
    tenant: TenantId,
    providers: &[ProviderRow],
    window: &DayWindow,
    now: f64,
) -> Result<Imported, (String, Vec<PageEvidence>, LedgerError)> {
    let mut pages = Vec::new();
    let mut all = Vec::new();
    let mut parts = Vec::new();
    for p in providers {
        let part = match list_one(ctx, tenant, p, window, now, &mut pages).await {
            Ok(charges) => {
                all.extend(charges);
                ProviderPart {
                    provider: p.name.clone(),
                    kind: p.kind,
                    status: "complete",
                    reason: None,
                }
            }
            Err(reason) => ProviderPart {
                provider: p.name.clone(),
                kind: p.kind,
                status: "failed",
                reason: Some(reason),
            },
        };
        parts.push(part);
    }
    match ctx.ledger.store_provider_charges(tenant, &all).await {
        Ok(stored) => Ok(Imported {
            stored,
            parts,
            pages,
        }),
        Err(e) => Err((format!("storing the charges: {e}"), pages, e)),
    }
}

/// The effect's audit form. An `unknown` row that vanished is marked released by reckon
/// later, if reckon's own write-back deleted it (the ledger's write-back log says).
fn audit_effect(e: Effect, settings: Option<&Value>) -> AuditEffect {
    let released = (e.gone_reason.as_deref() == Some(Disappearance::Released.as_str()))
        .then_some(Releaser::Application);
    let mut provider_keys = vec![e.key.clone()];
    if let Some(s) = settings {
        let k = provider_key(s, &e.key, e.operation.as_deref(), e.subject.as_deref());
        if k != e.key {
            provider_keys.push(k);
        }
    }
    AuditEffect {
        response: e
            .response_json
            .as_deref()
            .and_then(|r| serde_json::from_str(r).ok()),
        source: e.source,
        key: e.key,
        operation: e.operation.unwrap_or_default(),
        subject: e.subject,
        state: e.state,
        unresolved: e.unresolved_kind,
        attempts: e.attempts,
        created_at: e.created_at,
        provider_keys,
        released,
        verdict: None,
    }
}

fn provider_charge(c: StoredCharge) -> ProviderCharge {
    let refunds = c
        .refunds
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|r| {
                    Some(Refund {
                        id: r["id"].as_str()?.to_owned(),
                        amount: r["amount"].as_i64()?,
                        reason: r["reason"].as_str().map(str::to_owned),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let metadata: reckon_audit::Metadata = c
        .metadata
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default();
    ProviderCharge {
        id: c.charge_id,
        payment: c.payment_intent,
        amount: c.amount,
        currency: c.currency,
        status: ChargeStatus::from_stored(&c.status),
        amount_captured: c.amount_captured,
        amount_refunded: c.amount_refunded,
        refunds,
        metadata,
        idempotency_key: c.idempotency_key,
        customer: c.customer,
        created: c.created,
    }
}

/// The audit of `window` over what the ledger holds: the effects routed to the audited
/// providers (a receipt never touches a payment provider, so it can be neither missing nor
/// matched) and those providers' charges, each read with the day's margin.
pub async fn audit_day(
    ledger: &dyn Ledger,
    tenant: TenantId,
    window: &DayWindow,
    providers: &[ProviderRow],
    now: f64,
) -> Result<reckon_audit::AuditReport, AuditRunError> {
    let (from, to) = (window.start - MARGIN_SECS, window.end + MARGIN_SECS);
    let routes = ledger.list_routes(tenant).await?;
    // The day's effects and its charges are independent reads of a day spread over the
    // ledger's pages: read at once, the server reads one's pages while reckon decodes the
    // other's rows.
    let effects = async {
        let audited: HashMap<i64, &ProviderRow> = providers.iter().map(|p| (p.id, p)).collect();
        // Each effect becomes its audit form as its row arrives (the ledger's record is
        // dropped there, never a day of them held at once), keyed for the sort.
        let mut keyed: Vec<(f64, i64, (AuditEffect, bool))> = Vec::new();
        ledger
            .each_effect_created_between(tenant, from, to, now, &mut |e| {
                let settings = route_of(&routes, &e)
                    .and_then(|r| r.provider_id)
                    .and_then(|p| audited.get(&p))
                    .map(|row| &row.settings);
                if let Some(settings) = settings {
                    let gone = e.gone_at.is_some();
                    keyed.push((e.created_at, e.id, (audit_effect(e, Some(settings)), gone)));
                }
            })
            .await?;
        // By (created_at, id): the report's order, whatever order the rows came in.
        keyed.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut effects: Vec<AuditEffect> = Vec::with_capacity(keyed.len());
        // (index in `effects`, effect id) of the ones whose source row says unresolved,
        // and of the `unknown` rows that are gone (reckon's write-back may have released
        // them).
        let mut unresolved: Vec<(usize, i64)> = Vec::new();
        let mut vanished: Vec<(usize, i64)> = Vec::new();
        for (_, id, (a, gone)) in keyed {
            if a.unresolved.is_some() {
                unresolved.push((effects.len(), id));
            }
            if gone && a.state == reckon_domain::State::Unknown {
                vanished.push((effects.len(), id));
            }
            effects.push(a);
        }
        let ids: Vec<i64> = vanished.iter().map(|&(_, id)| id).collect();
        let by_reckon = ledger.released_among(tenant, &ids).await?;
        for (i, id) in vanished {
            if by_reckon.binary_search(&id).is_ok() {
                effects[i].released = Some(Releaser::Reckon);
            }
        }
        // An effect reckon (or a person) resolved is no longer unresolved, whatever its
        // source row says: its outcome is known (its matching to charges is unchanged).
        let ids: Vec<i64> = unresolved.iter().map(|&(_, id)| id).collect();
        let resolved = ledger.resolved_among(tenant, &ids).await?;
        for (i, id) in unresolved {
            if let Ok(at) = resolved.binary_search_by_key(&id, |r| r.0) {
                effects[i].unresolved = None;
                // Shown beside the application's state, which still says it does not know.
                effects[i].verdict = Some(resolved[at].1);
            }
        }
        Ok::<_, AuditRunError>(effects)
    };
    let charges = async {
        let mut charges: Vec<ProviderCharge> = Vec::new();
        // Provider by provider, each charge converted as its row arrives, each provider's
        // by (created, id).
        for p in providers {
            let first = charges.len();
            ledger
                .each_charge_to_match(tenant, Some(p.id), from, to, &mut |c| {
                    charges.push(provider_charge(c));
                })
                .await?;
            charges[first..].sort_unstable_by(|a, b| {
                a.created
                    .total_cmp(&b.created)
                    .then_with(|| a.id.cmp(&b.id))
            });
        }
        Ok::<_, AuditRunError>(charges)
    };
    let (effects, charges) = futures::try_join!(effects, charges)?;
    let mut rules = MatchRules::default();
    for p in providers {
        if let Some(f) = p.settings.get("metadata_field").and_then(Value::as_str)
            && !rules.key_fields.iter().any(|k| k == f)
        {
            rules.key_fields.push(f.to_owned());
        }
    }
    Ok(reckon_audit::audit(window, &effects, &charges, &rules))
}

fn counts(report: Option<&reckon_audit::AuditReport>, imported: u64) -> Value {
    let n = |f: fn(&reckon_audit::AuditReport) -> usize| report.map_or(0, f) as i64;
    let counts = reckon_audit::chain::RunCounts {
        findings: reckon_audit::FindingKind::ALL
            .into_iter()
            .map(|k| (k, report.map_or(0, |r| r.count(k) as i64)))
            .collect(),
        effects_in_day: n(|r| r.effects_in_day),
        charges_in_day: n(|r| r.charges_in_day),
        matches: n(|r| r.matches.len()),
        charges_imported: imported as i64,
    };
    serde_json::to_value(counts).unwrap_or_default()
}

/// What a run stores of its day's report (none when no provider was read whole): the
/// counts, the findings, the totals, and in the evidence a summary of the matches
/// ([`reckon_audit::matches_summary`]: not the list, which is as long as the day).
/// `run.evidence` must be a JSON object.
pub fn store_report(
    run: &mut NewAuditRun,
    report: Option<&reckon_audit::AuditReport>,
    imported: u64,
) {
    run.counts = counts(report, imported);
    if let Some(report) = report {
        run.findings = serde_json::to_value(&report.findings).unwrap_or(json!([]));
        run.totals = serde_json::to_value(&report.totals).unwrap_or(json!([]));
    }
    run.evidence["matches"] = reckon_audit::matches_summary(report.map_or(&[], |r| &r.matches));
}

/// Import, audit and store one run. Returns the stored run, `complete` or `failed`.
pub async fn run_audit(
    ctx: &AuditCtx,
    tenant: TenantId,
    req: &AuditRequest,
    lease: Option<&Lease>,
) -> Result<AuditRun, AuditRunError> {
    let window = day_window(ctx.ledger.as_ref(), tenant, req.date.as_deref(), req.now).await?;
    run_window(ctx, tenant, req, &window, lease).await
}

async fn run_window(
    ctx: &AuditCtx,
    tenant: TenantId,
    req: &AuditRequest,
    window: &DayWindow,
    lease: Option<&Lease>,
) -> Result<AuditRun, AuditRunError> {
    let started = reckon_domain::time::now();
    let providers = providers_of(ctx.ledger.as_ref(), tenant, req.provider.as_deref()).await?;
    let mut run = NewAuditRun {
        day: window.date.clone(),
        time_zone: window.time_zone.clone(),
        window_start: window.start,
        window_end: window.end,
        provider: req.provider.clone().unwrap_or_else(|| ALL_PROVIDERS.into()),
        triggered_by: req.triggered_by.clone(),
        status: "complete".into(),
        reason: None,
        started_at: started,
        finished_at: started,
        counts: counts(None, 0),
        findings: json!([]),
        totals: json!([]),
        evidence: json!({"pages": []}),
    };
    let mut parts: Vec<ProviderPart> = Vec::new();
    if providers.is_empty() {
        run.status = "failed".into();
        run.reason = Some("the tenant has no provider to list charges from".into());
    } else {
        match import(ctx, tenant, &providers, window, req.now).await {
            Err((reason, pages, err)) => {
                if let LedgerError::LeaseLost(l) = err {
                    return Err(LedgerError::LeaseLost(l).into());
                }
                run.status = "failed".into();
                run.reason = Some(reason);
                run.evidence = json!({ "pages": pages });
            }
            Ok(imported) => {
                parts = imported.parts;
                let failed: Vec<&ProviderPart> =
                    parts.iter().filter(|p| p.status == "failed").collect();
                let reasons = failed
                    .iter()
                    .filter_map(|p| p.reason.clone())
                    .collect::<Vec<_>>()
                    .join("; ");
                let whole: Vec<ProviderRow> = providers
                    .iter()
                    .filter(|p| !failed.iter().any(|f| f.provider == p.name))
                    .cloned()
                    .collect();
                let report = if whole.is_empty() {
                    None
                } else {
                    // Only the providers read whole are audited: a failed provider's
                    // effects would otherwise all look "missing".
                    Some(audit_day(ctx.ledger.as_ref(), tenant, window, &whole, req.now).await?)
                };
                run.status = match (failed.is_empty(), &report) {
                    (true, _) => "complete",
                    (false, Some(_)) => "partial",
                    (false, None) => "failed",
                }
                .into();
                if !failed.is_empty() {
                    run.reason = Some(reasons);
                }
                run.evidence = json!({
                    "pages": imported.pages,
                    "providers": parts.iter().map(|p| json!({
                        "name": p.provider,
                        "kind": p.kind,
                        "status": p.status,
                        "reason": p.reason,
                    })).collect::<Vec<_>>(),
                });
                store_report(&mut run, report.as_ref(), imported.stored);
            }
        }
    }
    run.finished_at = reckon_domain::time::now();
    let imported_any = run.status != "failed";
    let stored = ctx.ledger.record_audit_run(tenant, run, lease).await?;
    if imported_any {
        // One truth per effect: a "not charged" verdict beside a charge of its key is
        // taken back and the effect parked for a person.
        let retracted = ctx
            .ledger
            .retract_contradicted_absence(tenant, reckon_domain::time::now())
            .await?;
        for (effect, charge) in &retracted {
            tracing::warn!(
                effect,
                charge = %charge,
                "a not_applied verdict was retracted: the provider lists a charge of its key"
            );
        }
    }
    if let Some(m) = &ctx.metrics
        && let Ok(t) = ctx.ledger.tenant_by_id(tenant).await
    {
        // Each provider's part is counted under its own name, so a failed provider is
        // the one an alert names; a run that reached no provider counts under the run's.
        if parts.is_empty() {
            m.record_audit_run(&t.slug, &stored.run.provider, &stored.run.status);
        }
        for p in &parts {
            m.record_audit_run(&t.slug, &p.provider, p.status);
        }
        publish_metric(m, ctx.ledger.as_ref(), tenant, &t.slug).await;
    }
    Ok(stored)
}

/// How many of a tenant's newest runs say whether each provider's audit is failing: the
/// schedule's retries (every 15 minutes) of a day that keeps failing are a day's worth.
const FAILING_HEADS: i64 = 200;

/// Set the tenant's audit gauges from its stored runs (any replica's): the findings of its
/// newest complete run, and whether each provider's newest run failed. Read from the ledger
/// at each publish (a start, each schedule tick, each run), so a restart changes nothing.
pub async fn publish_metric(
    m: &reckon_metrics::Metrics,
    ledger: &dyn Ledger,
    tenant: TenantId,
    slug: &str,
) {
    if let Ok(Some(metric)) = ledger.audit_metric(tenant).await {
        let findings: Vec<(&str, u64)> = metric
            .findings
            .iter()
            .map(|(k, v)| (k.as_str(), (*v).max(0) as u64))
            .collect();
        m.record_audit(slug, &findings, metric.finished_at);
    }
    // Left as they were when the ledger does not answer: the next publish tries again.
    if let (Ok(providers), Ok(heads)) = (
        ledger.list_providers(tenant).await,
        ledger.audit_run_heads(tenant, FAILING_HEADS).await,
    ) {
        let names: Vec<String> = providers.into_iter().map(|p| p.name).collect();
        // A tenant with no provider has nothing to audit, so nothing failing.
        let failing = if names.is_empty() {
            std::collections::BTreeMap::new()
        } else {
            reckon_ledger::failing_audits(&heads, &names)
        };
        m.record_audit_failing(slug, &failing);
    }
}

/// The latest instant at or before `now` when the tenant's nightly audit was due (its
/// `audit_time` on its local clock), with the day that run audits (the local day before).
/// Found by bisecting [`reckon_audit::due_day`] over the local day, so it is the scheduler's
/// own notion of "due", time-zone changes included. `None` for an invalid zone or time.
pub fn latest_schedule(now: f64, time_zone: &str, audit_time: &str) -> Option<(f64, DayWindow)> {
    let due = |t: f64| {
        reckon_audit::due_day(t, time_zone, audit_time)
            .ok()
            .flatten()
    };
    let yesterday = DayWindow::yesterday(now, time_zone).ok()?;
    // Today's run is due already: it became due between today's midnight and now.
    // Otherwise yesterday's run was the latest: due during yesterday. Whole seconds (audit
    // times are whole minutes), so the bisection below always narrows.
    let (mut lo, mut hi) = if due(now).is_some() {
        (yesterday.end, now.floor())
    } else {
        (yesterday.start, yesterday.end - 1.0)
    };
    due(hi)?;
    // Invariant: due(hi) is Some; find the first second of the local day for which it is.
    if due(lo).is_some() {
        hi = lo;
    }
    while hi - lo > 1.0 {
        let mid = ((lo + hi) / 2.0).floor();
        if due(mid).is_some() {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    due(hi).map(|w| (hi, w))
}

/// The schedule's health for one tenant: when its latest nightly run was due and whether the
/// day it audits has a complete scheduled run. A tenant with no provider has nothing to run.
/// Every tenant's nightly-run counters exist (at zero until a run): a first failure is then
/// an increase, and dashboards list every tenant from them.
async fn publish_schedule(
    m: &reckon_metrics::Metrics,
    ledger: &dyn Ledger,
    tenant: &reckon_ledger::Tenant,
    settings: &reckon_ledger::AuditSettings,
    now: f64,
) -> Result<(), AuditRunError> {
    m.touch_audit_runs(&tenant.slug);
    if ledger.list_providers(tenant.id).await?.is_empty() {
        m.forget_audit_schedule(&tenant.slug);
        return Ok(());
    }
    if let Some((due_at, window)) = latest_schedule(now, &settings.time_zone, &settings.audit_time)
    {
        let complete = ledger
            .scheduled_audit_done(tenant.id, &window.date, ALL_PROVIDERS)
            .await?;
        m.record_audit_schedule(&tenant.slug, due_at, complete);
    }
    Ok(())
}

/// Every tenant's audit gauges from the ledger (its newest complete run's findings, its
/// schedule's state), running nothing. A process that just started exports them from its
/// first scrape instead of after its first schedule tick: finance's alerts do not resolve
/// and fire again because reckon restarted.
pub async fn publish_all(
    m: &reckon_metrics::Metrics,
    ledger: &dyn Ledger,
    now: f64,
) -> Result<(), AuditRunError> {
    for t in ledger.list_tenants().await? {
        publish_metric(m, ledger, t.id, &t.slug).await;
        let s = ledger.audit_settings(t.id).await?;
        publish_schedule(m, ledger, &t, &s, now).await?;
    }
    Ok(())
}

/// What one tick of the schedule did for a tenant.
#[derive(Debug, Clone)]
pub struct DueRun {
    pub tenant: String,
    pub run: AuditRun,
}

/// The nightly audit: for every tenant whose local clock has passed its `audit_time`, run
/// yesterday's audit unless a completed scheduled run of that day is stored. Exactly once
/// across replicas: the day is claimed with the lease `audit:<tenant>:<day>` (the run is
/// written fenced by it), and the ledger refuses a second completed scheduled run of a day.
pub async fn run_due(ctx: &AuditCtx, now: f64) -> Result<Vec<DueRun>, AuditRunError> {
    let mut done = Vec::new();
    for t in ctx.ledger.list_tenants().await? {
        if let Some(m) = &ctx.metrics {
            publish_metric(m, ctx.ledger.as_ref(), t.id, &t.slug).await;
        }
        let s = ctx.ledger.audit_settings(t.id).await?;
        if let Some(m) = &ctx.metrics {
            publish_schedule(m, ctx.ledger.as_ref(), &t, &s, now).await?;
        }
        let window = match reckon_audit::due_day(now, &s.time_zone, &s.audit_time) {
            Ok(Some(w)) => w,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(tenant = %t.slug, "audit schedule: {e}");
                continue;
            }
        };
        if ctx.ledger.list_providers(t.id).await?.is_empty()
            || ctx
                .ledger
                .scheduled_audit_done(t.id, &window.date, ALL_PROVIDERS)
                .await?
            || recently_failed(ctx, t.id, &window.date, now).await?
        {
            continue;
        }
        let name = format!("audit:{}:{}", t.id.get(), window.date);
        let Some(lease) = ctx
            .ledger
            .try_lease(&name, &ctx.owner, ctx.lease_secs)
            .await?
        else {
            continue;
        };
        // Another replica may have finished the day between the check and the lease.
        let result = if ctx
            .ledger
            .scheduled_audit_done(t.id, &window.date, ALL_PROVIDERS)
            .await?
        {
            None
        } else {
            let req = AuditRequest {
                date: Some(window.date.clone()),
                provider: None,
                triggered_by: SCHEDULE_AUTHOR.into(),
                now,
            };
            Some(run_window(ctx, t.id, &req, &window, Some(&lease)).await)
        };
        let _ = ctx.ledger.release_lease(&lease).await;
        match result {
            None => {}
            Some(Ok(run)) => {
                if let Some(m) = &ctx.metrics {
                    publish_schedule(m, ctx.ledger.as_ref(), &t, &s, now).await?;
                }
                done.push(DueRun {
                    tenant: t.slug.clone(),
                    run,
                });
            }
            Some(Err(AuditRunError::Ledger(
                LedgerError::Conflict(_) | LedgerError::LeaseLost(_),
            ))) => {}
            Some(Err(e)) => tracing::warn!(tenant = %t.slug, "scheduled audit: {e}"),
        }
    }
    Ok(done)
}

async fn recently_failed(
    ctx: &AuditCtx,
    tenant: TenantId,
    day: &str,
    now: f64,
) -> Result<bool, AuditRunError> {
    Ok(ctx
        .ledger
        .scheduled_run_failed_since(tenant, day, now - ctx.retry_failed_after_secs)
        .await?)
}

/// Walk the tenant's whole chain, page by page. Returns (runs checked, breaks).
pub async fn verify(
    ledger: &dyn Ledger,
    tenant: TenantId,
) -> Result<(usize, Vec<ChainBreak>), AuditRunError> {
    // A page of runs at a time, keeping only their links: a run of a big day holds
    // megabytes of findings, and a tenant's chain grows by a run a night for years.
    const PAGE: i64 = 20;
    let mut links = Vec::new();
    let mut edited = Vec::new();
    let mut after = 0;
    loop {
        let page = ledger.audit_chain(tenant, after, PAGE).await?;
        let Some(last) = page.last() else { break };
        after = last.seq;
        for r in &page {
            links.push(r.link());
            edited.extend(reckon_ledger::verify_content(tenant.get(), r));
        }
    }
    // What `verify_chain` gives for the whole chain in memory, run by run in chain order.
    let mut breaks = reckon_ledger::verify_links(&links);
    breaks.extend(edited);
    breaks.sort_by_key(|b| b.seq);
    Ok((links.len(), breaks))
}

// CSV for finance.

/// A cell a spreadsheet would run as a formula (`=`, `+`, `-`, `@`, tab, CR) gets a leading
/// apostrophe, which every spreadsheet shows as text (OWASP CSV injection advice).
pub fn neutralise(cell: &str) -> String {
    match cell.chars().next() {
        Some('=' | '+' | '-' | '@' | '\t' | '\r') => format!("'{cell}"),
        _ => cell.to_owned(),
    }
}

pub const CSV_HEADER: [&str; 31] = [
    "run_id",
    "day",
    "time_zone",
    "finding",
    "kind",
    "summary",
    "amount",
    "currency",
    "amount_minor",
    "refunded",
    "effect_keys",
    "effect_sources",
    "effect_operations",
    "effect_subjects",
    "effect_states",
    "effect_attempts",
    "effect_created",
    "charge_ids",
    "charge_amounts",
    "charge_statuses",
    "charge_refunded",
    "charge_customers",
    "charge_created",
    "suggestions",
    "charge_keys",
    "charge_metadata",
    // Added after the columns above, which keep their places for the spreadsheets and
    // imports that read them by position.
    "action",
    "customer",
    "order",
    "at_stake",
    "effect_verdicts",
];

/// The column of `name` in [`CSV_HEADER`].
fn column(name: &str) -> usize {
    CSV_HEADER.iter().position(|h| *h == name).unwrap_or(0)
}

/// One row per finding of `run`, every value a spreadsheet needs, several values of one
/// field joined with `; `. Times in the tenant's zone; amounts as decimals and in minor units.
/// Each finding says what to do (`action`) and whom it concerns (`customer`, the provider's
/// id, and `order`, the application's); `at_stake` is empty when nothing is; each effect's
/// state as the application recorded it (`effect_states`) has reckon's verdict on it in
/// `effect_verdicts`, in the same order (empty where reckon has none).
pub fn findings_csv(run: &AuditRun) -> Result<String, csv::Error> {
    let tz = run.run.time_zone.as_str();
    let unreadable = |e: serde_json::Error| csv::Error::from(std::io::Error::other(e));
    let findings = run.findings().map_err(unreadable)?;
    let totals = run.totals().map_err(unreadable)?;
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(CSV_HEADER)?;
    // "12.34 USD" -> "12.34": the currency has its own column.
    let decimal = |minor: i64, cur: &str| {
        reckon_audit::money(minor, cur)
            .split(' ')
            .next()
            .unwrap_or("")
            .to_owned()
    };
    let time = |t: f64| reckon_audit::local_timestamp(t, tz);
    for (i, f) in findings.iter().enumerate() {
        let effects = |field: fn(&reckon_audit::EffectRef) -> String| {
            f.effects.iter().map(field).collect::<Vec<_>>().join("; ")
        };
        let charges = |field: &dyn Fn(&reckon_audit::ChargeRef) -> String| {
            f.charges.iter().map(field).collect::<Vec<_>>().join("; ")
        };
        let currency = f.currency.as_deref().unwrap_or("");
        let suggestions = f
            .suggestions
            .iter()
            .map(|s| format!("{} -> {}/{} ({})", s.charge, s.source, s.key, s.why))
            .collect::<Vec<_>>()
            .join("; ");
        let row: [String; CSV_HEADER.len()] = [
            run.id.to_string(),
            run.run.day.clone(),
            tz.to_owned(),
            (i + 1).to_string(),
            f.kind.as_str().to_owned(),
            f.summary.clone(),
            f.amount.map(|a| decimal(a, currency)).unwrap_or_default(),
            currency.to_ascii_uppercase(),
            f.amount.map(|a| a.to_string()).unwrap_or_default(),
            f.refunded.to_string(),
            effects(|e| e.key.clone()),
            effects(|e| e.source.clone()),
            effects(|e| e.operation.clone()),
            effects(|e| e.subject.clone().unwrap_or_default()),
            effects(|e| e.state.as_str().to_owned()),
            effects(|e| e.attempts.to_string()),
            f.effects
                .iter()
                .map(|e| time(e.created_at))
                .collect::<Vec<_>>()
                .join("; "),
            charges(&|c| c.id.clone()),
            charges(&|c| decimal(c.amount, &c.currency)),
            charges(&|c| c.status.clone()),
            charges(&|c| decimal(c.amount_refunded, &c.currency)),
            charges(&|c| c.customer.clone().unwrap_or_default()),
            charges(&|c| time(c.created)),
            suggestions,
            charges(&|c| c.idempotency_key.clone().unwrap_or_default()),
            charges(&|c| {
                if c.metadata.is_empty() {
                    String::new()
                } else {
                    serde_json::to_string(&c.metadata).unwrap_or_default()
                }
            }),
            f.action_words(),
            f.customer_named().unwrap_or_default(),
            f.order_named().unwrap_or_default(),
            f.at_stake_words().unwrap_or_default(),
            effects(|e| e.verdict.map(|v| v.as_str().to_owned()).unwrap_or_default()),
        ];
        w.write_record(row.iter().map(|c| neutralise(c)))?;
    }
    // The day's totals per currency, after the findings: kind `total`, the net as the
    // amount, and every figure in the summary.
    for t in &totals {
        let figure = |minor: i64| reckon_audit::money(minor, &t.currency);
        let mut row: Vec<String> = vec![String::new(); CSV_HEADER.len()];
        row[column("run_id")] = run.id.to_string();
        row[column("day")] = run.run.day.clone();
        row[column("time_zone")] = tz.to_owned();
        row[column("kind")] = "total".into();
        row[column("summary")] = format!(
            "charged {}, refunded {}, net {}; matched to effects {}, unmatched {}",
            figure(t.charged),
            figure(t.refunded),
            figure(t.net),
            figure(t.matched),
            figure(t.unmatched)
        );
        row[column("amount")] = decimal(t.net, &t.currency);
        row[column("currency")] = t.currency.to_ascii_uppercase();
        row[column("amount_minor")] = t.net.to_string();
        w.write_record(row.iter().map(|c| neutralise(c)))?;
    }
    let bytes = w.into_inner().map_err(csv::IntoInnerError::into_error)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// `1234, "usd"` -> `12.34 USD` (re-exported for the CLI).
pub fn money(minor: i64, currency: &str) -> String {
    reckon_audit::money(minor, currency)
}

#[cfg(test)]
#[allow(
    clippy::string_slice,
    reason = "the texts sliced here are the tests' own ASCII"
)]
mod tests {
    use super::*;

    /// Epoch seconds of a UTC time written `YYYY-MM-DDTHH:MM:SSZ`, checked against the
    /// civil calendar (days from 1970-01-01, Howard Hinnant's algorithm).
    fn at(utc: &str) -> f64 {
        let n = |r: std::ops::Range<usize>| utc[r].parse::<i64>().unwrap();
        let (y, m, d) = (n(0..4), n(5..7), n(8..10));
        let (y, m) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let doy = (153 * m + 2) / 5 + d - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        let days = era * 146097 + doe - 719468;
        (days * 86400 + n(11..13) * 3600 + n(14..16) * 60 + n(17..19)) as f64
    }

    #[test]
    fn the_test_clock_is_the_unix_clock() {
        assert_eq!(at("1970-01-01T00:00:00Z"), 0.0);
        assert_eq!(at("2026-11-29T10:00:00Z"), 1_795_946_400.0);
        assert_eq!(at("2024-02-29T23:59:59Z"), 1_709_251_199.0);
    }

    #[test]
    fn after_the_audit_time_the_latest_schedule_is_today_for_yesterday() {
        let (due, day) =
            latest_schedule(at("2026-11-29T10:00:00Z"), "Europe/Paris", "06:30").unwrap();
        assert_eq!(due, at("2026-11-29T05:30:00Z"));
        assert_eq!(day.date, "2026-11-28");
    }

    #[test]
    fn before_the_audit_time_the_latest_schedule_is_yesterday_for_the_day_before() {
        let (due, day) =
            latest_schedule(at("2026-11-29T05:00:00Z"), "Europe/Paris", "06:30").unwrap();
        assert_eq!(due, at("2026-11-28T05:30:00Z"));
        assert_eq!(day.date, "2026-11-27");
    }

    #[test]
    fn the_schedule_follows_the_zone_across_a_clock_change() {
        // Paris goes from UTC+2 to UTC+1 on 25 October 2026: 06:00 local is 05:00 UTC then.
        let (due, day) =
            latest_schedule(at("2026-10-25T12:00:00Z"), "Europe/Paris", "06:00").unwrap();
        assert_eq!(due, at("2026-10-25T05:00:00Z"));
        assert_eq!(day.date, "2026-10-24");
        let (due, _) =
            latest_schedule(at("2026-10-24T12:00:00Z"), "Europe/Paris", "06:00").unwrap();
        assert_eq!(due, at("2026-10-24T04:00:00Z"));
    }

    #[test]
    fn a_now_between_two_seconds_finds_the_same_schedule() {
        let now = at("2026-11-29T10:00:00Z") + 0.123_456;
        let (due, day) = latest_schedule(now, "UTC", "09:59").unwrap();
        assert_eq!(due, at("2026-11-29T09:59:00Z"));
        assert_eq!(day.date, "2026-11-28");
        let (due, _) = latest_schedule(at("2026-11-29T09:59:00Z") + 0.5, "UTC", "09:59").unwrap();
        assert_eq!(due, at("2026-11-29T09:59:00Z"));
    }

    #[test]
    fn midnight_is_due_at_the_first_second_of_the_day() {
        let (due, day) = latest_schedule(at("2026-11-29T00:00:30Z"), "UTC", "00:00").unwrap();
        assert_eq!(due, at("2026-11-29T00:00:00Z"));
        assert_eq!(day.date, "2026-11-28");
    }

    #[test]
    fn an_invalid_zone_or_time_has_no_schedule() {
        assert!(latest_schedule(at("2026-11-29T10:00:00Z"), "Mars/Olympus", "06:00").is_none());
        assert!(latest_schedule(at("2026-11-29T10:00:00Z"), "UTC", "25:00").is_none());
    }
}
