//! `verdict-soak`: the verdict property of `reckon-providers/tests/world_property.rs` over
//! many more random worlds, and the provider budget as the provider counts it.
//!
//! Part 1, verdicts: `--worlds` random Stripe-shaped worlds (crates/reckon-sim, seeded, each
//! with `--effects` effects), a random fault schedule on the first requests of each; every
//! effect is looked up twice while the faults last (any final verdict must equal the
//! world's truth), then the faults stop, the payments settle, and each effect must reach
//! its final, true verdict within two re-checks. Prints the worlds, lookups, final verdicts,
//! wrong verdicts (goal 0), converged (goal 100 %), requests per verdict and non-GET
//! requests (goal 0).
//!
//! Part 2, the budget: `--budget-effects` effects looked up with `--concurrency` lookups in
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
        "stripe",
        &s,
        Some(SecretString::from("rk_test_soak".to_owned())),
        GetClient::new(timeout),
    )
    .expect("settings")
}

async fn look(p: &Arc<dyn Provider>, sim: &Sim, e: &EffectSpec) -> Classification {
    let q = LookupQuery {
        key: e.key.clone(),
        created_at: e.created_at,
        updated_at: e.updated_at,
        expires_at: None,
        response_json: sim.recorded_response(e),
        now: reckon_providers::now(),
        observed_at: None,
    };
    let r = p.lookup(&q).await;
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
    non_get: u64,
    verdicts: u64,
}

async fn world(seed: u64, n: usize, t: &mut Tally) -> anyhow::Result<()> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5eed);
    let base = reckon_providers::now() - 7200.0;
    let effects = random_world(seed, n, base);
    let cfg = WorldConfig {
        page_size: rng.random_range(1..=5),
        noise: rng.random_range(0..=8),
        server_rate_limit: None,
    };
    let sim = Sim::start(&effects, cfg).await?;
    for _ in 0..rng.random_range(0..=8) {
        sim.fault_at(rng.random_range(0..60), fault(&mut rng));
    }
    let lists = match rng.random_range(0..3) {
        0 => json!(["payment_intents", "charges"]),
        1 => json!(["payment_intents"]),
        _ => json!([]),
    };
    let events = lists.as_array().is_some_and(std::vec::Vec::is_empty) || rng.random();
    let p = provider(
        &sim,
        json!({"list_objects": lists, "use_events": events, "use_search": rng.random::<bool>()}),
        Duration::from_millis(200),
    );
    for _ in 0..2 {
        for e in &effects {
            let v = look(&p, &sim, e).await;
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
    for e in &effects {
        t.effects += 1;
        for _ in 0..2 {
            let v = look(&p, &sim, e).await;
            t.lookups += 1;
            if v.is_final() {
                t.verdicts += 1;
                if v.outcome.as_str() == e.truth().as_str() {
                    t.converged += 1;
                } else {
                    t.wrong += 1;
                    eprintln!("WRONG after faults, seed {seed}, {}: {v:?}", e.key);
                }
                break;
            }
        }
    }
    t.requests += sim.log().len() as u64;
    t.non_get += sim.non_get() as u64;
    t.worlds += 1;
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
            async move { look(&p, sim, e).await }
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
        world(seed, args.effects, &mut t).await?;
    }
    println!(
        "verdicts: {} worlds, {} effects, {} lookups, {} requests ({} not GET); {} final \
         verdicts while faults lasted; wrong final verdicts: {} (goal 0); converged: {} of {} \
         ({:.1} %, goal 100 %); {:.1} requests per final verdict; {:.1} s",
        t.worlds,
        t.effects,
        t.lookups,
        t.requests,
        t.non_get,
        t.final_under_faults,
        t.wrong,
        t.converged,
        t.effects,
        100.0 * t.converged as f64 / t.effects.max(1) as f64,
        t.requests as f64 / (t.final_under_faults + t.verdicts).max(1) as f64,
        started.elapsed().as_secs_f64()
    );
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
    if t.wrong > 0 || t.non_get > 0 || t.converged < t.effects {
        anyhow::bail!("a goal was missed (above)");
    }
    Ok(())
}
