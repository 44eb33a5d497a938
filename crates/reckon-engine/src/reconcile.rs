//! The reconciler as a step function: [`reconcile_next`] claims due unresolved effects of
//! one tenant with a lease, looks each up with its routed provider, classifies the answer
//! (`reckon_providers::classify`, the one judgement), records the attempt with its
//! evidence, resolves when the outcome is conclusive, and releases the lease, all through
//! the ledger. The scheduler, `reckon reconcile` and the API call it; so do tests.

use crate::limit::{Bounds, Limits, Permit, Signal};
use futures::StreamExt;
use reckon_ledger::{
    Claim, Effect, Ledger, LedgerError, NewAttempt, Provider as ProviderRow, Route, Tenant,
};
use reckon_metrics::Metrics;
use reckon_providers::{
    Calibration, Classification, FaultKind, GetClient, LookupQuery, Outcome, Provider, Redactor,
    RetryAdvice, build_provider, classify, provider_key,
};
use secrecy::ExposeSecret;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Debug, Clone)]
pub struct ReconcileOptions {
    /// Who holds the leases (one per process).
    pub owner: String,
    pub lease_secs: f64,
    /// Effects claimed per step.
    pub batch: i64,
    /// Lookups of one provider in flight at once when the reconciler starts; from there
    /// the limit follows the provider's answers (see [`crate::limit`]), up to
    /// `max_concurrency`. The provider's `rate_per_sec` budget still applies.
    pub concurrency: usize,
    /// The most lookups of one provider in flight at once. Equal to `concurrency`, the
    /// limit is fixed.
    pub max_concurrency: usize,
    /// Backoff after an indeterminate outcome: base * 2^attempts, capped, jittered.
    pub backoff_base_secs: f64,
    pub backoff_cap_secs: f64,
    /// After this many indeterminate attempts the effect needs attention (and stays
    /// unresolved, still re-checked at the cap).
    pub max_attempts: i64,
    /// The longest wait between re-checks of a provisional `applied` or a payment that can
    /// still move money (they back off from `backoff_base_secs` up to this).
    pub non_final_recheck_secs: f64,
    /// Look again for a route this long after "no provider".
    pub no_route_recheck_secs: f64,
}

impl ReconcileOptions {
    pub fn bounds(&self) -> Bounds {
        Bounds::new(self.concurrency, self.max_concurrency.max(self.concurrency))
    }
}

impl Default for ReconcileOptions {
    fn default() -> Self {
        ReconcileOptions {
            owner: format!("reckon-{}-{}", std::process::id(), rand::random::<u32>()),
            lease_secs: 120.0,
            batch: 32,
            concurrency: 8,
            max_concurrency: 64,
            backoff_base_secs: 30.0,
            backoff_cap_secs: 6.0 * 3600.0,
            max_attempts: 8,
            non_final_recheck_secs: 900.0,
            no_route_recheck_secs: 600.0,
        }
    }
}

pub struct ReconcileCtx {
    pub ledger: Arc<dyn Ledger>,
    pub client: GetClient,
    pub options: ReconcileOptions,
    /// Outcomes and provider requests are counted here when set (`reckon serve`).
    pub metrics: Option<Metrics>,
    /// Where providers may be reached: their base URLs are the tenant's input. The default
    /// refuses loopback and private networks.
    pub egress: Arc<reckon_sources::EgressPolicy>,
    /// Each provider's concurrency limit, learnt from its answers over the process's life.
    pub limits: Arc<Limits>,
    /// Each provider's calibration against its tenant's known outcomes, measured at most
    /// every [`CALIBRATION_TTL_SECS`] by this process.
    pub calibrations: Arc<Calibrations>,
}

/// How long a route's calibration stands before it is measured again.
pub const CALIBRATION_TTL_SECS: f64 = 1800.0;
/// Effects the application recorded as done, held against a provider's lookup per
/// calibration (spread over its routes; searches for misses are capped apart).
pub const CALIBRATION_SAMPLES: i64 = 50;
/// How far back known-done effects are taken from.
const CALIBRATION_SINCE_SECS: f64 = 7.0 * 86_400.0;

/// The calibrations this process measured, by tenant and provider, with the settings they
/// were measured for (a changed setting is measured again).
#[derive(Default)]
pub struct Calibrations(std::sync::Mutex<HashMap<(String, i64), (String, Calibration)>>);

impl Calibrations {
    fn get(&self, tenant: &str, provider: i64, settings: &str, now: f64) -> Option<Calibration> {
        let map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.get(&(tenant.to_owned(), provider))
            .filter(|(s, c)| s == settings && now - c.measured_at < CALIBRATION_TTL_SECS)
            .map(|(_, c)| c.clone())
    }

    fn put(&self, tenant: &str, provider: i64, settings: String, c: Calibration) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert((tenant.to_owned(), provider), (settings, c));
    }

    /// The last calibration measured for a provider, however old.
    pub fn last(&self, tenant: &str, provider: i64) -> Option<Calibration> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&(tenant.to_owned(), provider))
            .map(|(_, c)| c.clone())
    }
}

impl ReconcileCtx {
    pub fn new(ledger: Arc<dyn Ledger>) -> ReconcileCtx {
        ReconcileCtx {
            ledger,
            client: GetClient::shared(),
            options: ReconcileOptions::default(),
            metrics: None,
            egress: Arc::new(reckon_sources::EgressPolicy::default()),
            limits: Arc::new(Limits::default()),
            calibrations: Arc::new(Calibrations::default()),
        }
    }

    pub fn with_egress(mut self, egress: Arc<reckon_sources::EgressPolicy>) -> ReconcileCtx {
        self.egress = egress;
        self
    }

    pub fn with_metrics(mut self, metrics: Metrics) -> ReconcileCtx {
        self.metrics = Some(metrics);
        self
    }
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct EffectOutcome {
    pub effect_id: i64,
    pub source: String,
    pub key: String,
    #[schema(required = true)]
    pub provider: Option<String>,
    /// `applied` | `not_applied` | `duplicate` | `indeterminate`, or `no_provider`, or
    /// `lease_lost` (nothing recorded: another worker owns the effect now).
    pub outcome: String,
    pub reason: String,
    pub resolved: bool,
    pub needs_attention: bool,
    #[schema(required = true)]
    pub next_attempt_at: Option<f64>,
}

#[derive(Debug, Clone)]
pub enum Step {
    Done(Vec<EffectOutcome>),
    Empty,
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// Count one lookup's outcome (`reckon_reconcile_outcomes_total`); the ledger's attempt
/// rows are the durable record, this is the rate on-call alerts on.
fn observe_outcome(ctx: &ReconcileCtx, tenant: &Tenant, provider: &str, outcome: Outcome) {
    let Some(m) = &ctx.metrics else { return };
    m.record_reconcile(&tenant.slug, provider, outcome);
}

/// One step: claim, look up, classify, record, release. `Empty` when nothing is due.
pub async fn reconcile_next(ctx: &ReconcileCtx, tenant: &Tenant) -> Result<Step, ReconcileError> {
    let now = reckon_domain::time::now();
    let o = &ctx.options;
    let claims = ctx
        .ledger
        .claim_due(tenant.id, &o.owner, now, o.lease_secs, o.batch)
        .await?;
    if claims.is_empty() {
        return Ok(Step::Empty);
    }
    let routing = Routing::load(ctx, tenant).await?;
    let results: Vec<Result<EffectOutcome, ReconcileError>> = futures::stream::iter(claims)
        .map(|c| process(ctx, tenant, &routing, c, None))
        .buffer_unordered(o.concurrency.max(1))
        .collect()
        .await;
    results
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .map(Step::Done)
}

/// Reconcile one effect now (the API's and CLI's one-off), whatever its schedule.
pub async fn reconcile_one(
    ctx: &ReconcileCtx,
    tenant: &Tenant,
    effect_id: i64,
) -> Result<Option<EffectOutcome>, ReconcileError> {
    let now = reckon_domain::time::now();
    let o = &ctx.options;
    let Some(claim) = ctx
        .ledger
        .claim_effect(tenant.id, effect_id, &o.owner, now, o.lease_secs)
        .await?
    else {
        return Ok(None);
    };
    let routing = Routing::load(ctx, tenant).await?;
    process(ctx, tenant, &routing, claim, None).await.map(Some)
}

/// Reconcile until nothing is due; returns every outcome.
///
/// Unlike a loop of [`reconcile_next`], whose every step waits for its slowest lookup
/// before it claims again, this keeps `concurrency` lookups in flight across batches: the
/// next batch (at least `options.batch` effects) is claimed while a round of lookups is
/// still waiting to start. Routes and providers are read once per call.
pub async fn reconcile_all(
    ctx: &ReconcileCtx,
    tenant: &Tenant,
) -> Result<Vec<EffectOutcome>, ReconcileError> {
    reconcile_until(ctx, tenant, || false).await
}

/// [`reconcile_all`], claiming no more once `stop()` answers true (a shutdown): the
/// effects already claimed (at most two rounds of lookups) are looked up and recorded,
/// nothing new is claimed, so a stopping replica leaves no lease behind.
///
/// A hand-written loop rather than a stream of claims through `buffer_unordered`: rustc
/// cannot prove that stream's closure futures `Send` for every lifetime
/// (rust-lang/rust#102211), and `reckon serve` spawns this. The claim runs *beside* the
/// lookups and writes in flight, never instead of them: a write holds a pooled connection,
/// so a claim awaited alone could wait for a connection that only the writes can give back
/// (seen: 28 s pool stalls at concurrency 32 on PostgreSQL).
pub async fn reconcile_until<F: Fn() -> bool>(
    ctx: &ReconcileCtx,
    tenant: &Tenant,
    stop: F,
) -> Result<Vec<EffectOutcome>, ReconcileError> {
    let routing = Routing::load(ctx, tenant).await?;
    let shares = PaceShares::join(ctx, &routing).await;
    let result = reconcile_loop(ctx, tenant, &routing, stop).await;
    shares.leave().await;
    result
}

/// How often a replica renews its share of each provider account's budget and counts the
/// others; a replica that joins waits two of these before its first request, so the others
/// have slowed down by then.
const PACE_RECOUNT: std::time::Duration = std::time::Duration::from_secs(1);
/// A replica that died stops counting after this.
const PACE_LEASE_SECS: f64 = 10.0;

/// This process's share of each budgeted provider account of a run: a lease
/// `pace:{account}:{owner}` per account, held while the run lasts, and the number of such
/// leases (the replicas sending to that account) divides the account's budget, so the
/// provider never sees more than `rate_per_sec` from all replicas together.
struct PaceShares {
    ledger: Arc<dyn Ledger>,
    names: Vec<String>,
    keeper: Option<tokio::task::JoinHandle<()>>,
}

impl PaceShares {
    async fn join(ctx: &ReconcileCtx, routing: &Routing) -> PaceShares {
        let mut paces: Vec<Arc<reckon_providers::Pace>> = Vec::new();
        for (_, built, _) in routing.providers.values() {
            if let Some(p) = built.as_ref().ok().and_then(|b| b.pace())
                && !paces.iter().any(|q| q.id() == p.id())
            {
                paces.push(p);
            }
        }
        let owner = ctx.options.owner.clone();
        let names: Vec<String> = paces
            .iter()
            .map(|p| format!("pace:{}:{owner}", p.id()))
            .collect();
        let mut shares = PaceShares {
            ledger: ctx.ledger.clone(),
            names,
            keeper: None,
        };
        if paces.is_empty() {
            return shares;
        }
        let mut joined = false;
        for name in &shares.names {
            let held = matches!(
                ctx.ledger.lease_holder(name).await,
                Ok(Some(ref l)) if l.owner == owner
            );
            joined |= !held;
        }
        let crowded = recount(&*ctx.ledger, &paces, &shares.names, &owner).await;
        if joined && crowded {
            // The others learn of this replica at their next count.
            tokio::time::sleep(PACE_RECOUNT * 2).await;
        }
        let ledger = ctx.ledger.clone();
        let names = shares.names.clone();
        shares.keeper = Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(PACE_RECOUNT).await;
                recount(&*ledger, &paces, &names, &owner).await;
            }
        }));
        shares
    }

    /// Hand the shares back, so the other replicas take the whole budget at their next
    /// count.
    async fn leave(mut self) {
        if let Some(k) = self.keeper.take() {
            k.abort();
        }
        for name in &self.names {
            if let Ok(Some(l)) = self.ledger.lease_holder(name).await {
                let _ = self.ledger.release_lease(&l).await;
            }
        }
    }
}

/// Renew this replica's lease of each account and set each pace's share from the leases
/// held now; true when another replica shares an account. A ledger that does not answer
/// leaves the shares as they were.
async fn recount(
    ledger: &dyn Ledger,
    paces: &[Arc<reckon_providers::Pace>],
    names: &[String],
    owner: &str,
) -> bool {
    let mut crowded = false;
    for (pace, name) in paces.iter().zip(names) {
        if let Err(e) = ledger.try_lease(name, owner, PACE_LEASE_SECS).await {
            tracing::warn!(error = %e, "could not renew this replica's share of a provider budget");
            continue;
        }
        match ledger.count_leases(&format!("pace:{}:", pace.id())).await {
            Ok(n) => {
                pace.set_share(n.max(1) as usize);
                crowded |= n > 1;
            }
            Err(e) => tracing::warn!(error = %e, "could not count the replicas of a provider"),
        }
    }
    crowded
}

/// [`reconcile_until`]'s loop, over routes and providers read once.
///
/// Three kinds of work run side by side: the claim (one at a time), the lookups (as many
/// as the providers' limits allow) and the ledger writes of the answered lookups. The next
/// claim is made while a round of lookups is still queued, so the claim's round trip is
/// never a gap in the providers' work; a lookup's place is free again as soon as its
/// provider has answered.
async fn reconcile_loop<F: Fn() -> bool>(
    ctx: &ReconcileCtx,
    tenant: &Tenant,
    routing: &Routing,
    stop: F,
) -> Result<Vec<EffectOutcome>, ReconcileError> {
    let o = &ctx.options;
    let bounds = o.bounds();
    let providers: Vec<i64> = routing.providers.keys().copied().collect();
    let mut claimed: std::collections::VecDeque<Claim> = std::collections::VecDeque::new();
    let mut looking = futures::stream::FuturesUnordered::new();
    let mut recording = futures::stream::FuturesUnordered::new();
    let mut claiming = None;
    let mut more = true;
    let mut outcomes = Vec::new();
    // The first error ends the claiming, not the lookups in flight: their answers are
    // recorded first (dropping them would leave the provider asked and nothing written,
    // and whoever claims the effects next asks again).
    let mut failed: Option<ReconcileError> = None;
    loop {
        // Every claim whose provider has room starts; the others wait for a place. An
        // effect with no provider costs the ledger one write, and starts at once.
        let mut i = 0;
        while i < claimed.len() {
            let c = &claimed[i];
            // A claim that waited in line (a slow ledger, a starved process, a provider at
            // its limit) may be close to its lease's end: another replica can take it then
            // and ask the provider a second time. Leave it to expire instead of starting a
            // lookup on borrowed time.
            if c.lease_until - reckon_domain::time::now() < o.lease_secs / 2.0 {
                tracing::debug!(
                    effect = c.effect.id,
                    "claim too old to start; left to expire"
                );
                claimed.remove(i);
                continue;
            }
            let permit = match routing.provider_of(&c.effect) {
                Some(p) => match ctx.limits.try_start(p, bounds) {
                    Some(permit) => Some(permit),
                    None => {
                        i += 1;
                        continue;
                    }
                },
                None => None,
            };
            let c = claimed.remove(i).expect("index in range");
            looking.push(look(ctx, routing, c, permit));
        }
        // One round of lookups: what the providers' limits let this process ask at once.
        let round = ctx.limits.total(providers.iter().copied(), bounds).max(1);
        // Claim ahead while less than a round waits, unless the ledger is behind with the
        // writes (then claiming more would only queue more of them).
        if claiming.is_none() && more && claimed.len() < round && recording.len() < round {
            if stop() || failed.is_some() {
                more = false;
            } else {
                let want = (2 * round).saturating_sub(claimed.len() + looking.len());
                claiming = Some(ctx.ledger.claim_due(
                    tenant.id,
                    &o.owner,
                    reckon_domain::time::now(),
                    o.lease_secs,
                    (want as i64).clamp(o.batch, MAX_CLAIM.max(o.batch)),
                ));
            }
        }
        if claiming.is_none() && looking.is_empty() && recording.is_empty() {
            if claimed.is_empty() {
                return match failed {
                    Some(e) => Err(e),
                    None => Ok(outcomes),
                };
            }
            // Claimed effects whose provider is at its limit with lookups of another run
            // of this process: wait for a place.
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            continue;
        }
        tokio::select! {
            claim = async { claiming.as_mut().expect("checked by the guard").await },
                if claiming.is_some() =>
            {
                claiming = None;
                match claim {
                    Ok(batch) => {
                        more = !batch.is_empty();
                        claimed.extend(batch);
                    }
                    Err(e) => {
                        more = false;
                        failed.get_or_insert(e.into());
                    }
                }
            }
            Some(looked) = looking.next() => recording.push(record(ctx, tenant, looked)),
            Some(done) = recording.next() => take(done, &mut outcomes, &mut failed),
        }
    }
}

/// The most effects one claim takes, however many lookups the providers' limits allow.
const MAX_CLAIM: i64 = 256;

/// One recorded lookup into the run's outcomes, or its first error.
fn take(
    done: Result<EffectOutcome, ReconcileError>,
    outcomes: &mut Vec<EffectOutcome>,
    failed: &mut Option<ReconcileError>,
) {
    match done {
        Ok(r) => outcomes.push(r),
        Err(e) => {
            failed.get_or_insert(e);
        }
    }
}

/// A built adapter, or why it could not be built (bad settings, missing secret): an effect
/// routed to it is deferred with that reason rather than failing the whole batch.
type BuiltProvider = Result<Arc<dyn Provider>, String>;

struct Routing {
    routes: Vec<Route>,
    /// Each provider with what answers for it, and the redactor of its secret (what the
    /// provider answers is stored, and shown to people who may not see the secret).
    providers: HashMap<i64, (ProviderRow, BuiltProvider, Redactor)>,
}

impl Routing {
    async fn load(ctx: &ReconcileCtx, tenant: &Tenant) -> Result<Routing, ReconcileError> {
        let routes = ctx.ledger.list_routes(tenant.id).await?;
        let mut providers = HashMap::new();
        // T09: the client resolves every host through the egress policy when it connects.
        let confined = crate::provider_client(&ctx.client, &ctx.egress);
        for p in ctx.ledger.list_providers(tenant.id).await? {
            let secret = ctx.ledger.provider_secret(tenant.id, &p).await?;
            let redactor = Redactor::new(secret.iter().map(|s| s.expose_secret().to_owned()));
            let client = match &ctx.metrics {
                Some(m) => confined.observed(m.clone(), p.kind, &p.name),
                None => confined.clone(),
            };
            let mut built =
                build_provider(p.kind, &p.settings, secret, client).map_err(|e| e.to_string());
            if built.is_ok()
                && let Some(base) = p.settings.get("base_url").and_then(|u| u.as_str())
            {
                let checked = match url::Url::parse(base) {
                    Ok(u) => ctx.egress.check_url(&u).await.map_err(|e| e.to_string()),
                    Err(e) => Err(format!("base_url: {e}")),
                };
                if let Err(why) = checked {
                    built = Err(format!("refused by the egress policy: {why}"));
                }
            }
            if let Ok(adapter) = &built {
                calibrate(ctx, tenant, &routes, &p, adapter).await?;
            }
            providers.insert(p.id, (p, built, redactor));
        }
        Ok(Routing { routes, providers })
    }

    /// The provider that answers for an effect, if its route names one that exists.
    fn provider_of(&self, e: &Effect) -> Option<i64> {
        self.route(e)
            .and_then(|r| r.provider_id)
            .filter(|id| self.providers.contains_key(id))
    }

    /// The route of an effect: its operation's own, else the source's `*`.
    fn route(&self, e: &Effect) -> Option<&Route> {
        let op = e.operation.as_deref();
        self.routes
            .iter()
            .find(|r| r.source == e.source && Some(r.operation.as_str()) == op)
            .or_else(|| {
                self.routes
                    .iter()
                    .find(|r| r.source == e.source && r.operation == "*")
            })
    }
}

/// Hold a provider's lookup against effects its routes' sources recorded as succeeded (the
/// application's own known outcomes), or reuse this process's recent measurement. A route
/// that misses them gives no final verdict of absence; one whose provider clock is off is
/// widened to it (`reckon_providers::Calibration`).
async fn calibrate(
    ctx: &ReconcileCtx,
    tenant: &Tenant,
    routes: &[Route],
    row: &ProviderRow,
    adapter: &Arc<dyn Provider>,
) -> Result<(), ReconcileError> {
    if !adapter.calibrates() {
        return Ok(());
    }
    let now = reckon_domain::time::now();
    let settings = row.settings.to_string();
    if let Some(c) = ctx.calibrations.get(&tenant.slug, row.id, &settings, now) {
        adapter.set_calibration(c);
        return Ok(());
    }
    // Measured recently for these settings, by this or another process: reused.
    if let Some(c) = row
        .calibration
        .as_ref()
        .and_then(|v| serde_json::from_value::<Calibration>(v.clone()).ok())
        .filter(|c| now - c.measured_at < CALIBRATION_TTL_SECS)
    {
        adapter.set_calibration(c.clone());
        ctx.calibrations.put(&tenant.slug, row.id, settings, c);
        return Ok(());
    }
    let mine: Vec<&Route> = routes
        .iter()
        .filter(|r| r.provider_id == Some(row.id))
        .collect();
    if mine.is_empty() {
        return Ok(());
    }
    let per = (CALIBRATION_SAMPLES / mine.len() as i64).max(1);
    let mut samples = Vec::new();
    for r in mine {
        let done = ctx
            .ledger
            .list_effects(
                tenant.id,
                &reckon_ledger::EffectQuery {
                    source: Some(r.source.clone()),
                    state: Some(reckon_domain::State::Succeeded),
                    operation: (r.operation != "*").then(|| r.operation.clone()),
                    updated_since: Some(now - CALIBRATION_SINCE_SECS),
                    limit: per,
                    now,
                    ..Default::default()
                },
            )
            .await?;
        samples.extend(done.iter().map(|e| LookupQuery {
            // Found by the key, as an unknown's payment must be, not by a recorded id.
            response_json: None,
            expires_at: None,
            ..query_of(row, e, now)
        }));
    }
    if let Some(c) = adapter.calibrate(&samples).await {
        if let Some(m) = &ctx.metrics {
            let found = if c.samples == 0 {
                0.0
            } else {
                c.found as f64 / c.samples as f64
            };
            m.provider_calibration(&tenant.slug, &row.name, calibration_state(&c), found);
        }
        if let Ok(v) = serde_json::to_value(&c) {
            ctx.ledger
                .record_calibration(tenant.id, row.id, &row.settings, &v)
                .await?;
        }
        ctx.calibrations.put(&tenant.slug, row.id, settings, c);
    }
    Ok(())
}

/// What the provider is asked about an effect: its key as the application sent it (the
/// provider's key template), its times, what it recorded, and when reckon saw its row.
fn query_of(row: &ProviderRow, e: &Effect, now: f64) -> LookupQuery {
    LookupQuery {
        key: provider_key(
            &row.settings,
            &e.key,
            e.operation.as_deref(),
            e.subject.as_deref(),
        ),
        created_at: e.created_at,
        updated_at: e.updated_at,
        expires_at: e.expires_at,
        response_json: e.response_json.clone(),
        now,
        observed_at: Some(e.last_changed_at),
    }
}

/// The calibration gauge's value: 1 calibrated, 0 uncalibrated, -1 not measured yet.
fn calibration_state(c: &Calibration) -> i64 {
    match c.status {
        reckon_providers::CalibrationStatus::Calibrated => 1,
        reckon_providers::CalibrationStatus::Uncalibrated => 0,
        reckon_providers::CalibrationStatus::Unmeasured => -1,
    }
}

fn jitter() -> f64 {
    0.5 + rand::random::<f64>() * 0.5
}

/// What a lookup says about its provider's capacity: a fault of the kind an overloaded or
/// unreachable provider gives, or an answer and how long it took (`paced`: the lookup
/// waited on the provider's budget, so its time is the budget's, not the provider's).
fn signal(class: &Classification, took: std::time::Duration, paced: bool) -> Signal {
    let overloaded = class.faults.iter().any(|f| {
        matches!(
            f.kind,
            FaultKind::Timeout
                | FaultKind::Connection
                | FaultKind::ServerError
                | FaultKind::RateLimited
        )
    });
    if overloaded {
        Signal::Overloaded
    } else if paced {
        Signal::Paced
    } else {
        Signal::Answered(took)
    }
}

/// Look one claimed effect up and record what came of it. `permit`: its place in the
/// provider's concurrency limit, handed back with what the answer says about the provider
/// as soon as the provider has answered (recording the answer is the ledger's time).
async fn process(
    ctx: &ReconcileCtx,
    tenant: &Tenant,
    routing: &Routing,
    claim: Claim,
    permit: Option<Permit<'_>>,
) -> Result<EffectOutcome, ReconcileError> {
    record(ctx, tenant, look(ctx, routing, claim, permit).await).await
}

/// A claimed effect once its provider has answered (or once it is known to have no
/// provider to ask), waiting for the ledger write that ends its lookup.
struct Looked {
    claim: Claim,
    out: EffectOutcome,
    write: Write,
}

enum Write {
    /// No provider to ask: look for a route again at this time.
    Defer(f64),
    /// The attempt, by the provider of this name.
    Attempt(String, NewAttempt),
}

/// Ask the effect's provider and decide what to record. The provider's place (`permit`)
/// is given back as soon as it has answered: the ledger write that follows is not the
/// provider's work, and a slot held through it would idle for a commit's time per lookup.
async fn look(
    ctx: &ReconcileCtx,
    routing: &Routing,
    claim: Claim,
    permit: Option<Permit<'_>>,
) -> Looked {
    let o = &ctx.options;
    let e = &claim.effect;
    let mut out = EffectOutcome {
        effect_id: e.id,
        source: e.source.clone(),
        key: e.key.clone(),
        provider: None,
        outcome: "no_provider".into(),
        reason: String::new(),
        resolved: false,
        needs_attention: false,
        next_attempt_at: None,
    };
    let route = routing.route(e);
    let Some((row, adapter, redactor)) = route
        .and_then(|r| r.provider_id)
        .and_then(|id| routing.providers.get(&id))
    else {
        let next = reckon_domain::time::now() + o.no_route_recheck_secs;
        out.reason = match route {
            Some(_) => "no provider: routed to none".into(),
            None => "no provider: no route for this operation".into(),
        };
        return Looked {
            claim,
            out,
            write: Write::Defer(next),
        };
    };
    out.provider = Some(row.name.clone());
    let started = reckon_domain::time::now();
    let (class, evidence) = match adapter {
        Ok(p) => {
            let q = query_of(row, e, started);
            let asked = std::time::Instant::now();
            let report = p.lookup(&q).await;
            let mut class = classify(&report, reckon_domain::time::now());
            if let Some(permit) = permit {
                permit.finish(signal(&class, asked.elapsed(), p.pace().is_some()));
            }
            class.reason = redactor.text(&class.reason);
            let mut evidence = serde_json::json!({ "classification": class, "report": report });
            redactor.json(&mut evidence);
            (Some(class), evidence)
        }
        Err(msg) => (None, serde_json::json!({ "configuration_error": msg })),
    };
    let finished = reckon_domain::time::now();
    let attempts = claim.state.attempts + 1;
    let Decision {
        outcome,
        resolve,
        non_final,
        next,
        attention,
        error,
        method,
    } = match &class {
        Some(c) => decide(o, c, attempts, finished),
        None => Decision {
            outcome: Outcome::Indeterminate,
            resolve: false,
            non_final: false,
            next: finished + o.backoff_cap_secs,
            attention: true,
            error: Some(format!("provider {:?} is misconfigured", row.name)),
            method: None,
        },
    };
    out.outcome = outcome.as_str().to_owned();
    out.reason = class
        .as_ref()
        .map_or_else(|| error.clone().unwrap_or_default(), |c| c.reason.clone());
    let attempt = NewAttempt {
        provider_id: Some(row.id),
        started_at: started,
        finished_at: finished,
        outcome,
        method,
        error,
        evidence,
        next_attempt_at: next,
        non_final,
        needs_attention: attention,
        resolve,
    };
    Looked {
        write: Write::Attempt(row.name.clone(), attempt),
        claim,
        out,
    }
}

/// Write what a lookup found: the attempt (and the resolution it makes), or the deferral.
async fn record(
    ctx: &ReconcileCtx,
    tenant: &Tenant,
    looked: Looked,
) -> Result<EffectOutcome, ReconcileError> {
    let Looked {
        claim,
        mut out,
        write,
    } = looked;
    let (provider, mut attempt) = match write {
        Write::Defer(next) => {
            ctx.ledger
                .defer(tenant.id, claim.effect.id, &claim.owner, next, &out.reason)
                .await?;
            out.next_attempt_at = Some(next);
            return Ok(out);
        }
        Write::Attempt(provider, attempt) => (provider, attempt),
    };
    if attempt.resolve
        && claim.state.attempts > 0
        && let Some(why) = unseen(ctx, tenant, &claim, &attempt).await?
    {
        // What reckon read before, it does not unsee: a person reconciles the two views.
        attempt.resolve = false;
        attempt.outcome = Outcome::Indeterminate;
        attempt.non_final = false;
        attempt.needs_attention = true;
        attempt.error = Some(why.clone());
        attempt.evidence["contradiction"] = serde_json::Value::String(why.clone());
        out.outcome = Outcome::Indeterminate.as_str().to_owned();
        out.reason = why;
    }
    let (outcome, attention, next) = (
        attempt.outcome,
        attempt.needs_attention,
        attempt.next_attempt_at,
    );
    let recorded = ctx
        .ledger
        .record_attempt(tenant.id, claim.effect.id, &claim.owner, attempt)
        .await;
    let recorded = match recorded {
        Ok(r) => r,
        // This worker was paused past its lease and another took the effect: its answer
        // is dropped whole; the new owner looks again.
        Err(LedgerError::LeaseLost(_)) => {
            out.outcome = "lease_lost".into();
            out.reason = "the lease expired and another worker took the effect over".into();
            return Ok(out);
        }
        Err(e) => return Err(e.into()),
    };
    observe_outcome(ctx, tenant, &provider, outcome);
    out.resolved = recorded.resolution.is_some();
    out.needs_attention = attention;
    out.next_attempt_at = (!out.resolved).then_some(next);
    Ok(out)
}

/// The payments that moved money in a lookup's evidence, by payment group (a
/// PaymentIntent, or a charge of its own), whether read itself or seen in a snapshot.
fn moved_payments(evidence: &serde_json::Value) -> Vec<String> {
    evidence
        .pointer("/classification/payments")
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .filter(|p| p["money"] == "moved")
        .filter_map(|p| p["group"].as_str().map(str::to_owned))
        .collect()
}

/// Why a final verdict contradicts what earlier lookups of the effect read: a payment
/// that moved money was seen before and this lookup, saying `not_applied`, does not show
/// it; or this lookup's `applied` names one payment while another was seen before. `None`
/// when nothing earlier disagrees.
async fn unseen(
    ctx: &ReconcileCtx,
    tenant: &Tenant,
    claim: &Claim,
    attempt: &NewAttempt,
) -> Result<Option<String>, ReconcileError> {
    if !matches!(attempt.outcome, Outcome::NotApplied | Outcome::Applied) {
        return Ok(None);
    }
    let view = ctx
        .ledger
        .reconcile_view(tenant.id, claim.effect.id)
        .await?;
    let now = moved_payments(&attempt.evidence);
    let mut seen: Vec<(String, f64)> = Vec::new();
    for a in &view.attempts {
        for g in moved_payments(&a.evidence) {
            if !now.contains(&g) && !seen.iter().any(|(s, _)| *s == g) {
                seen.push((g, a.finished_at));
            }
        }
    }
    let Some((group, at)) = seen.first() else {
        return Ok(None);
    };
    Ok(Some(match attempt.outcome {
        Outcome::NotApplied => format!(
            "contradiction: an earlier lookup (finished at {at:.0}) saw {group} move money for \
             this key, and this one shows no payment that did; a person must check before \
             anyone tries again"
        ),
        _ => format!(
            "contradiction: an earlier lookup (finished at {at:.0}) saw {group} move money for \
             this key, besides the payment this one found: it may have been charged twice; a \
             person must check"
        ),
    }))
}

/// What to record for a classification.
struct Decision {
    outcome: Outcome,
    /// Record it as the effect's resolution (final verdicts only).
    resolve: bool,
    non_final: bool,
    next: f64,
    attention: bool,
    error: Option<String>,
    method: Option<String>,
}

fn decide(o: &ReconcileOptions, c: &Classification, attempts: i64, now: f64) -> Decision {
    let factor = match c.retry {
        RetryAdvice::Normal => 1.0,
        RetryAdvice::Harder => 4.0,
        RetryAdvice::DoNotRetry => f64::INFINITY,
    };
    let exp = o.backoff_base_secs * 2f64.powi((attempts - 1).clamp(0, 30) as i32) * factor;
    // Too recent: come back when it is old enough, not later.
    let at_least = |next: f64| match c.not_before {
        Some(nb) => nb.max(now),
        None => next,
    };
    if c.is_final() {
        return Decision {
            outcome: c.outcome,
            resolve: true,
            non_final: false,
            next: now + o.non_final_recheck_secs,
            attention: false,
            error: None,
            method: c.method.clone(),
        };
    }
    if c.non_final {
        // A provisional `applied` or a payment still moving: the verdict waits for a
        // complete check or for the provider, re-checked with backoff up to the re-check
        // interval. A check that never completes needs a person; a payment that takes
        // days to settle (a bank debit) does not.
        let next = at_least(now + exp.min(o.non_final_recheck_secs) * jitter());
        let attention =
            c.retry == RetryAdvice::DoNotRetry || (c.provisional && attempts >= o.max_attempts);
        return Decision {
            outcome: c.outcome,
            resolve: false,
            non_final: true,
            next,
            attention,
            error: (c.outcome == Outcome::Indeterminate).then(|| c.reason.clone()),
            method: c.method.clone(),
        };
    }
    let next = at_least(now + exp.min(o.backoff_cap_secs) * jitter());
    Decision {
        outcome: Outcome::Indeterminate,
        resolve: false,
        non_final: false,
        next,
        attention: attempts >= o.max_attempts || c.retry == RetryAdvice::DoNotRetry,
        error: Some(c.reason.clone()),
        method: None,
    }
}

/// Where an unresolved effect stands against its provider's idempotency window: after
/// `closes_at` the provider may have forgotten the key, and an application retry would
/// run the call again (Stripe: 24 hours). `None` when no provider is routed for the
/// effect or the provider does not say.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ReplayWindow {
    pub provider: String,
    pub closes_at: f64,
    /// Negative once closed.
    pub seconds_left: f64,
}

pub async fn replay_window(
    ledger: &dyn Ledger,
    tenant: &Tenant,
    effect: &Effect,
    now: f64,
) -> Result<Option<ReplayWindow>, LedgerError> {
    let routes = ledger.list_routes(tenant.id).await?;
    let routing = Routing {
        routes,
        providers: HashMap::new(),
    };
    let Some(provider_id) = routing.route(effect).and_then(|r| r.provider_id) else {
        return Ok(None);
    };
    let p = ledger.provider_by_id(tenant.id, provider_id).await?;
    Ok(
        reckon_providers::settings::replay_window_secs(p.kind, &p.settings).map(|w| {
            let closes_at = effect.created_at + w;
            ReplayWindow {
                provider: p.name,
                closes_at,
                seconds_left: closes_at - now,
            }
        }),
    )
}
