//! `verdict-soak`: the verdict property of `reckon-providers/tests/it/world_property.rs` over
//! many more random worlds, and the provider budget as the provider counts it.
//!
//! Part 1, verdicts: `--worlds` random Stripe-shaped worlds (crates/reckon-sim, seeded, each
//! with `--effects` effects), a random fault schedule on the first requests of each; every
//! effect is looked up twice while the faults last (any final verdict must equal the
//! world's truth), then the faults stop, the payments settle, and each effect must reach
//! its final, true verdict within two re-checks where the route has a witness (the creating
//! request's events, or a calibration). Worlds need not match the configuration: the
//! application's clock off by 90 s or an hour, a payment made half an hour late, the key
//! under another metadata field or on charges too, a charges-only list; a third of the
//! worlds hold 24 effects the application recorded as done, and the route is calibrated
//! against them first. Prints the worlds, lookups, final verdicts, wrong verdicts (goal 0),
//! converged (goal 100 % of witnessed effects), what stayed provisional without a witness,
//! requests per final verdict and non-GET requests (goal 0).
//!
//! Part 2, the economy of one healthy run: `--economy-effects` effects of one busy account
//! (other payments fill the pages; Stripe's page size of 100), the payments settled, each
//! looked up once as one reconcile run would, then again while it has a witness to wait for;
//! per route (events, or search beside a calibration), the requests the provider counted per
//! final verdict (goal: under 2), calibration included and apart.
//!
//! Part 3, the budget: `--budget-effects` effects looked up with `--concurrency` lookups in
//! flight against one provider account with `rate_per_sec = --budget`: the busiest sliding
//! second at the server (goal: at most the budget) and the sustained rate against the
//! budget (goal: at least 95 %). Then the same with the provider rate limiting at half the
//! budget: the 429s slow the account's pace, and the run still ends.

use clap::Parser;
use futures::StreamExt;
use rand::{Rng, SeedableRng};
use reckon_providers::{
    Classification, GetClient, LookupQuery, Provider, build_provider, classify,
};
use reckon_sim::{EffectSpec, Fault, Sim, WorldConfig, random_world};
use secrecy::SecretString;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(about = "Verdicts over random provider worlds with faults, and the provider budget")]
struct Args {
    #[arg(long, default_value_t = 2000)]
    worlds: u64,
    #[arg(long, default_value_t = 4)]
    effects: usize,
    /// Seed of the first world (worlds are `seed..seed + worlds`).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, default_value_t = 50.0)]
    budget: f64,
    #[arg(long, default_value_t = 150)]
    budget_effects: usize,
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    #[arg(long, default_value_t = 300)]
    economy_effects: usize,
    /// Items per list page at the provider (default: drawn from 1 to 5 per world, so every
    /// few objects cost a request; Stripe's is 100).
    #[arg(long)]
    page_size: Option<usize>,
}

fn provider(sim: &Sim, settings: serde_json::Value, timeout: Duration) -> Arc<dyn Provider> {
    let mut s = json!({
        "base_url": sim.base_url, "mode": "test", "visibility_lag_secs": 60,
        "rate_per_sec": 0, "max_pages": 50, "event_types": ["payment_intent.created"],
    });
    for (k, v) in settings.as_object().expect("an object") {
        s[k] = v.clone();
    }
    build_provider(
        reckon_providers::ProviderKind::Stripe,
        &s,
        Some(SecretString::from("rk_test_soak".to_owned())),
        GetClient::new(timeout),
    )
    .expect("settings")
}

/// The lookup of `e` as the reconciler asks it: reckon saw the row (by its clock, the
/// provider's) a second after the call ended, `clock` off the application's.
fn query(sim: &Sim, e: &EffectSpec, clock: f64) -> LookupQuery {
    LookupQuery {
        key: e.key.clone(),
        created_at: e.created_at,
        updated_at: e.updated_at,
        expires_at: None,
        response_json: sim.recorded_response(e),
        now: reckon_providers::now(),
        observed_at: Some(e.updated_at + clock + 1.0),
    }
}

async fn look(p: &Arc<dyn Provider>, sim: &Sim, e: &EffectSpec, clock: f64) -> Classification {
    let r = p.lookup(&query(sim, e, clock)).await;
    classify(&r, reckon_providers::now())
}

fn fault(rng: &mut impl Rng) -> Fault {
    match rng.random_range(0..19) {
        0..=2 => Fault::Status500,
        3 => Fault::Status502,
        4..=6 => Fault::RateLimited,
        7 => Fault::RateLimitedDoNotRetry,
        8 => Fault::Unauthorized,
        9 | 10 => Fault::Reset,
        11 | 12 => Fault::Truncated,
        13 | 14 => Fault::Malformed,
        15 | 16 => Fault::HasMoreWithoutCursor,
        _ => Fault::Timeout(400),
    }
}

#[derive(Default)]
struct Tally {
    worlds: u64,
    lookups: u64,
    final_under_faults: u64,
    wrong: u64,
    effects: u64,
    converged: u64,
    requests: u64,
    /// Requests once the faults stopped (the lookups that reach the final verdicts).
    requests_healthy: u64,
    non_get: u64,
    verdicts: u64,
    /// Effects of routes with neither events nor a calibration (with search beside it)
    /// left provisional.
    unwitnessed: u64,
    /// Requests by what they asked: list, events, search, retrieve.
    by_kind: std::collections::BTreeMap<&'static str, u64>,
    /// Effects held provisional on routes measured uncalibrated (by design).
    uncalibrated: u64,
    /// Effects of worlds that do not match the configuration.
    mismatched: u64,
    /// Calibrated worlds, their effects, and those that converged.
    calibrated: u64,
    calibrated_effects: u64,
    calibrated_converged: u64,
}

async fn world(seed: u64, n: usize, page_size: Option<usize>, t: &mut Tally) -> anyhow::Result<()> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5eed);
    let base = reckon_providers::now() - 7200.0;
    let mut effects = random_world(seed, n, base);
    // The application's clock minus the provider's, and a payment made late.
    let clock = match rng.random_range(0..8) {
        0 => 3600.0,
        1 => -3600.0,
        2 => 90.0,
        _ => 0.0,
    };
    let late = rng.random_bool(0.15);
    for (i, e) in effects.iter_mut().enumerate() {
        for p in &mut e.payments {
            p.offset += clock + if late && i == 0 { 1800.0 } else { 0.0 };
        }
    }
    // The application's own known outcomes: paid once, recorded as done.
    let calibrate = rng.random_bool(1.0 / 3.0);
    let done: Vec<EffectSpec> = if calibrate {
        (0..24u32)
            .map(|i| {
                let at = base - 600.0 - 60.0 * f64::from(i);
                EffectSpec {
                    key: format!("charge:v1:DONE-{seed}-{i}"),
                    created_at: at,
                    updated_at: at + 5.0,
                    recorded: reckon_sim::Recorded::Nothing,
                    payments: vec![reckon_sim::PaymentSpec {
                        life: reckon_sim::Life::Succeeded,
                        amount: 500,
                        offset: 0.5 + clock,
                        indexed: true,
                    }],
                }
            })
            .collect()
    } else {
        Vec::new()
    };
    let other_field = rng.random_bool(0.2);
    let cfg = WorldConfig {
        page_size: page_size.unwrap_or_else(|| rng.random_range(1..=5)),
        noise: rng.random_range(0..=8),
        server_rate_limit: None,
        metadata_field: if other_field {
            "order_ref".into()
        } else {
            "idempotency_key".into()
        },
        keys_on_charges: rng.random(),
        request_keys: true,
        // Stripe's bound for search, as the provider is configured (search_lag_secs).
        index_lag_secs: Some(3600.0),
        // The lists' own lag matters for payments seconds old (verdicts.rs); these are
        // hours old.
        list_lag_secs: 0.0,
    };
    let world: Vec<EffectSpec> = effects.iter().chain(&done).cloned().collect();
    let sim = Sim::start(&world, cfg).await?;
    let lists = match rng.random_range(0..4) {
        0 => json!(["payment_intents", "charges"]),
        1 => json!(["payment_intents"]),
        2 => json!([]),
        _ => json!(["charges"]),
    };
    let charges_only = lists == json!(["charges"]);
    let events = lists.as_array().is_some_and(std::vec::Vec::is_empty) || rng.random();
    let search = rng.random::<bool>();
    let p = provider(
        &sim,
        json!({"list_objects": lists, "use_events": events, "use_search": search}),
        Duration::from_millis(200),
    );
    let calibration = if calibrate {
        let samples: Vec<LookupQuery> = done.iter().map(|e| query(&sim, e, clock)).collect();
        p.calibrate(&samples).await
    } else {
        None
    };
    let calibrated = calibration
        .as_ref()
        .is_some_and(|c| c.status == reckon_providers::CalibrationStatus::Calibrated);
    let uncalibrated = calibration
        .as_ref()
        .is_some_and(|c| c.status == reckon_providers::CalibrationStatus::Uncalibrated);
    // Faults from here on: the calibration read the provider whole.
    let first = sim.requests_so_far();
    for _ in 0..rng.random_range(0..=8) {
        sim.fault_at(first + rng.random_range(0..60), fault(&mut rng));
    }
    let mismatched = clock.abs() > 300.0 || late || other_field || charges_only;
    for _ in 0..2 {
        for e in &effects {
            let v = look(&p, &sim, e, clock).await;
            t.lookups += 1;
            if v.is_final() {
                t.final_under_faults += 1;
                if v.outcome.as_str() != e.truth().as_str() {
                    t.wrong += 1;
                    eprintln!("WRONG under faults, seed {seed}, {}: {v:?}", e.key);
                }
            }
        }
    }
    sim.faults_off();
    sim.settle();
    let healthy_from = sim.requests_so_far();
    if calibrated {
        t.calibrated += 1;
    }
    for e in &effects {
        t.effects += 1;
        t.mismatched += u64::from(mismatched);
        t.calibrated_effects += u64::from(calibrated);
        let mut settled = false;
        let mut last = None;
        for _ in 0..2 {
            let v = look(&p, &sim, e, clock).await;
            last = Some(v.reason.clone());
            t.lookups += 1;
            if v.is_final() {
                t.verdicts += 1;
                if v.outcome.as_str() == e.truth().as_str() {
                    t.converged += 1;
                    t.calibrated_converged += u64::from(calibrated);
                } else {
                    t.wrong += 1;
                    eprintln!("WRONG after faults, seed {seed}, {}: {v:?}", e.key);
                }
                settled = true;
                break;
            }
        }
        if !settled && uncalibrated {
            t.uncalibrated += 1;
        } else if !(settled || events || calibrated && search) {
            t.unwitnessed += 1;
        } else if !settled {
            eprintln!(
                "UNSETTLED, seed {seed}, {} (truth {}): {}",
                e.key,
                e.truth().as_str(),
                last.unwrap_or_default()
            );
        }
    }
    t.requests += sim.log().len() as u64;
    t.requests_healthy += (sim.log().len() - healthy_from) as u64;
    for l in sim.log() {
        *t.by_kind.entry(kind_of(&l.target)).or_default() += 1;
    }
    t.non_get += sim.non_get() as u64;
    t.worlds += 1;
    Ok(())
}

/// What a request to the provider asked: list, events, search or retrieve.
fn kind_of(target: &str) -> &'static str {
    let path = target.split('?').next().unwrap_or("");
    if path.ends_with("/search") {
        "search"
    } else if path.starts_with("/v1/events") {
        "events"
    } else if path.matches('/').count() > 2 {
        "retrieve"
    } else {
        "list"
    }
}

/// One healthy run over one busy account: requests per final verdict for the route
/// `settings` (calibrated first against 24 effects recorded as done when `calibrate`).
async fn economy(
    label: &str,
    args: &Args,
    settings: serde_json::Value,
    calibrate: bool,
) -> anyhow::Result<()> {
    let base = reckon_providers::now() - 7200.0;
    let effects = random_world(args.seed, args.economy_effects, base);
    let done: Vec<EffectSpec> = (0..24u32)
        .map(|i| {
            let at = base - 600.0 - 60.0 * f64::from(i);
            EffectSpec {
                key: format!("charge:v1:DONE-{i}"),
                created_at: at,
                updated_at: at + 5.0,
                recorded: reckon_sim::Recorded::Nothing,
                payments: vec![reckon_sim::PaymentSpec {
                    life: reckon_sim::Life::Succeeded,
                    amount: 500,
                    offset: 0.5,
                    indexed: true,
                }],
            }
        })
        .collect();
    let world: Vec<EffectSpec> = effects.iter().chain(&done).cloned().collect();
    let sim = Sim::start(
        &world,
        WorldConfig {
            page_size: 100,
            // Four other payments for each of ours: a busy account's pages.
            noise: 4,
            index_lag_secs: Some(3600.0),
            ..WorldConfig::default()
        },
    )
    .await?;
    sim.settle();
    let p = provider(&sim, settings, Duration::from_secs(10));
    if calibrate {
        let samples: Vec<LookupQuery> = done.iter().map(|e| query(&sim, e, 0.0)).collect();
        let c = p.calibrate(&samples).await;
        anyhow::ensure!(
            c.as_ref()
                .is_some_and(|c| c.status == reckon_providers::CalibrationStatus::Calibrated),
            "{label}: not calibrated: {c:?}"
        );
    }
    let calibration = sim.requests_so_far();
    let (mut finals, mut wrong) = (0u64, 0u64);
    for e in &effects {
        for _ in 0..2 {
            let v = look(&p, &sim, e, 0.0).await;
            if v.is_final() {
                finals += 1;
                wrong += u64::from(v.outcome.as_str() != e.truth().as_str());
                break;
            }
        }
    }
    let log = sim.log();
    let requests = log.len();
    let mut by_kind: std::collections::BTreeMap<&str, usize> = Default::default();
    for l in &log[calibration..] {
        *by_kind.entry(kind_of(&l.target)).or_default() += 1;
    }
    println!(
        "  {label}: {} effects, {finals} final ({wrong} wrong), {requests} requests \
         ({calibration} of them calibrating): {:.2} requests per final verdict ({:.2} \
         without the calibration: {})",
        effects.len(),
        requests as f64 / finals.max(1) as f64,
        (requests - calibration) as f64 / finals.max(1) as f64,
        by_kind
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    anyhow::ensure!(wrong == 0, "{label}: a wrong final verdict");
    Ok(())
}

/// Every effect of `effects` looked up once, `concurrency` at a time, against a provider
/// limiting at `server_limit` (if any); prints what the provider counted.
async fn budget_run(
    effects: &[EffectSpec],
    args: &Args,
    server_limit: Option<f64>,
) -> anyhow::Result<()> {
    let sim = Sim::start(
        effects,
        WorldConfig {
            page_size: 100,
            noise: 0,
            server_rate_limit: server_limit,
            ..WorldConfig::default()
        },
    )
    .await?;
    let p = provider(
        &sim,
        json!({"rate_per_sec": args.budget, "use_search": false, "use_events": false}),
        Duration::from_secs(10),
    );
    let started = Instant::now();
    let verdicts: Vec<Classification> = futures::stream::iter(effects)
        .map(|e| {
            let p = p.clone();
            let sim = &sim;
            async move { look(&p, sim, e, 0.0).await }
        })
        .buffer_unordered(args.concurrency)
        .collect()
        .await;
    let wall = started.elapsed().as_secs_f64();
    let log = sim.log();
    let first = log.iter().map(|l| l.at).min().expect("requests");
    let last = log.iter().map(|l| l.at).max().expect("requests");
    let span = (last - first).as_secs_f64();
    let sustained = (log.len() - 1) as f64 / span;
    let busiest = sim.busiest_second();
    let limited = log.iter().filter(|l| l.status == 429).count();
    let finals = verdicts.iter().filter(|v| v.is_final()).count();
    println!(
        "  {} lookups, {} requests in {:.1} s ({:.1} s wall): sustained {:.1}/s = {:.1} % of the \
         budget {}; busiest sliding second {} (goal <= {}); {} answered 429; {} final verdicts",
        effects.len(),
        log.len(),
        span,
        wall,
        sustained,
        100.0 * sustained / args.budget,
        args.budget,
        busiest,
        args.budget.floor(),
        limited,
        finals
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let started = Instant::now();
    let mut t = Tally::default();
    for seed in args.seed..args.seed + args.worlds {
        world(seed, args.effects, args.page_size, &mut t).await?;
    }
    println!(
        "verdicts: {} worlds, {} effects ({} in worlds that do not match the configuration), \
         {} lookups, {} requests ({} not GET); {} final verdicts while faults lasted; wrong \
         final verdicts: {} (goal 0); converged: {} of {} witnessed ({:.1} %, goal 100 %); \
         left provisional on routes with no witness: {} ({:.1} % of all effects), on routes \
         measured uncalibrated: {} ({:.1} %); calibrated worlds: {}, {} of their {} effects \
         converged; {:.2} requests per final verdict ({:.2} once the faults stopped); {:.1} s",
        t.worlds,
        t.effects,
        t.mismatched,
        t.lookups,
        t.requests,
        t.non_get,
        t.final_under_faults,
        t.wrong,
        t.converged,
        t.effects - t.unwitnessed - t.uncalibrated,
        100.0 * t.converged as f64 / (t.effects - t.unwitnessed - t.uncalibrated).max(1) as f64,
        t.unwitnessed,
        100.0 * t.unwitnessed as f64 / t.effects.max(1) as f64,
        t.uncalibrated,
        100.0 * t.uncalibrated as f64 / t.effects.max(1) as f64,
        t.calibrated,
        t.calibrated_converged,
        t.calibrated_effects,
        t.requests as f64 / (t.final_under_faults + t.verdicts).max(1) as f64,
        t.requests_healthy as f64 / t.verdicts.max(1) as f64,
        started.elapsed().as_secs_f64()
    );
    println!(
        "requests by kind: {}",
        t.by_kind
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("economy of one healthy run (page size 100, a busy account):");
    economy(
        "lists + events",
        &args,
        json!({"use_search": false, "use_events": true}),
        false,
    )
    .await?;
    economy(
        "lists + events + search",
        &args,
        json!({"use_search": true, "use_events": true}),
        false,
    )
    .await?;
    economy(
        "lists + search, calibrated",
        &args,
        json!({"use_search": true, "use_events": false}),
        true,
    )
    .await?;
    let effects = random_world(
        args.seed,
        args.budget_effects,
        reckon_providers::now() - 7200.0,
    );
    println!("budget (rate_per_sec {}):", args.budget);
    budget_run(&effects, &args, None).await?;
    println!(
        "budget, the provider rate limiting at half of it ({}/s):",
        args.budget / 2.0
    );
    budget_run(&effects, &args, Some(args.budget / 2.0)).await?;
    if t.wrong > 0 || t.non_get > 0 || t.converged < t.effects - t.unwitnessed - t.uncalibrated {
        anyhow::bail!("a goal was missed (above)");
    }
    Ok(())
}
