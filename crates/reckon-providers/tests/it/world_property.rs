//! The verdict property over generated worlds: a simulated Stripe (crates/reckon-sim)
//! holding payments with their real lifecycle, a fault schedule on its requests, and the
//! adapter's settings drawn too. Whatever the world and the faults:
//!
//! - a final verdict always equals the world's truth (what the payments come to once they
//!   settle);
//! - once the faults stop and the payments settle, every effect of a route with a witness
//!   (the creating request's events, on an account seen to carry the application's keys
//!   in them) reaches its final, true verdict within a bounded number of re-checks; on a
//!   route without one, what stays non-final is counted;
//! - nothing but GET is ever sent.
//!
//! The worlds need not match the configuration: the application's clock may be off the
//! provider's, a payment may be made long after the call, the key may live under another
//! metadata field, on charges too, and the lists may read charges only.
//!
//! The case count is `RECKON_WORLD_CASES` (default 2000); the soak with more is
//! `cargo run --release -p reckon-bench --bin verdict-soak`.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use reckon_providers::{GetClient, LookupQuery, Provider, build_provider, classify};
use reckon_sim::{EffectSpec, Fault, Life, PaymentSpec, Recorded, Sim, WorldConfig};
use secrecy::SecretString;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Re-checks allowed after the faults stop.
const CONVERGE_WITHIN: usize = 2;

fn life() -> impl Strategy<Value = Life> {
    prop_oneof![
        4 => Just(Life::Succeeded),
        2 => Just(Life::Declined),
        1 => Just(Life::DeclinedThenSucceeded),
        1 => Just(Life::Canceled),
        1 => Just(Life::Refunded),
        1 => Just(Life::Disputed),
        1 => any::<bool>().prop_map(|succeeds| Life::Processing { succeeds }),
        1 => any::<bool>().prop_map(|captured| Life::Authorized { captured }),
        1 => any::<bool>().prop_map(|succeeds| Life::RequiresAction { succeeds }),
    ]
}

fn fault() -> impl Strategy<Value = Fault> {
    prop_oneof![
        3 => Just(Fault::Status500),
        1 => Just(Fault::Status502),
        3 => Just(Fault::RateLimited),
        1 => Just(Fault::RateLimitedDoNotRetry),
        1 => Just(Fault::Unauthorized),
        2 => Just(Fault::Reset),
        2 => Just(Fault::Truncated),
        2 => Just(Fault::Malformed),
        2 => Just(Fault::HasMoreWithoutCursor),
        1 => Just(Fault::Timeout(400)),
    ]
}

/// One payment: its life, amount, and whether search's index has it.
type Payment = (Life, i64, bool);

#[derive(Debug, Clone)]
struct Case {
    /// Each effect's payments, and what the application recorded.
    effects: Vec<(Vec<Payment>, Recorded)>,
    faults: Vec<(usize, Fault)>,
    page_size: usize,
    noise: usize,
    use_events: bool,
    use_search: bool,
    /// 0: PaymentIntents and charges listed; 1: PaymentIntents only; 2: no list, the
    /// events of the creating request are the check; 3: charges only.
    lists: u8,
    /// The application's clock minus the provider's, seconds.
    clock: f64,
    /// The first effect's payments were made half an hour after its call.
    late: bool,
    /// The application puts its key under another metadata field than configured.
    other_field: bool,
    /// The application puts its key on charges too.
    keys_on_charges: bool,
}

fn case() -> impl Strategy<Value = Case> {
    let payment = (life(), 100i64..10_000, any::<bool>());
    let recorded = prop_oneof![
        Just(Recorded::Nothing),
        Just(Recorded::PaymentIntent),
        Just(Recorded::Charge),
    ];
    let effect = (prop::collection::vec(payment, 0..=3), recorded);
    let clock = prop_oneof![
        6 => Just(0.0),
        1 => Just(90.0),
        1 => Just(3600.0),
        1 => Just(-3600.0),
    ];
    let mismatch = (
        clock,
        prop::bool::weighted(0.15),
        prop::bool::weighted(0.2),
        any::<bool>(),
    );
    (
        (
            prop::collection::vec(effect, 1..=3),
            prop::collection::vec((0usize..40, fault()), 0..=6),
            1usize..=4,
            0usize..=5,
        ),
        any::<bool>(),
        any::<bool>(),
        0u8..4,
        mismatch,
    )
        .prop_map(
            |(
                (effects, faults, page_size, noise),
                use_events,
                use_search,
                lists,
                (clock, late, other_field, keys_on_charges),
            )| Case {
                effects,
                faults,
                page_size,
                noise,
                use_events: use_events || lists == 2,
                use_search,
                lists,
                clock,
                late,
                other_field,
                keys_on_charges,
            },
        )
}

#[derive(Default)]
struct Figures {
    cases: AtomicUsize,
    lookups: AtomicUsize,
    final_under_faults: AtomicUsize,
    effects: AtomicUsize,
    converged: AtomicUsize,
    /// Effects of routes without a witness left non-final after the faults stopped.
    unwitnessed: AtomicUsize,
    /// Effects of worlds that do not match the configuration.
    mismatched: AtomicUsize,
    finals: AtomicUsize,
    requests: AtomicUsize,
    non_get: AtomicUsize,
}

async fn run(c: Case, figures: &Figures) -> Result<(), TestCaseError> {
    let base = reckon_providers::now() - 7200.0;
    let world: Vec<EffectSpec> = c
        .effects
        .iter()
        .enumerate()
        .map(|(i, (payments, recorded))| {
            let created_at = base + i as f64 * 30.0;
            EffectSpec {
                key: format!("charge:v1:ORD-{i}"),
                created_at,
                updated_at: created_at + 5.0,
                recorded: *recorded,
                payments: payments
                    .iter()
                    .enumerate()
                    .map(|(j, (life, amount, indexed))| PaymentSpec {
                        life: *life,
                        amount: *amount,
                        offset: 0.5
                            + j as f64
                            + c.clock
                            + if c.late && i == 0 { 1800.0 } else { 0.0 },
                        indexed: *indexed,
                    })
                    .collect(),
            }
        })
        .collect();
    let sim = Sim::start(
        &world,
        WorldConfig {
            page_size: c.page_size,
            noise: c.noise,
            server_rate_limit: None,
            metadata_field: if c.other_field {
                "order_ref".into()
            } else {
                "idempotency_key".into()
            },
            keys_on_charges: c.keys_on_charges,
            request_keys: true,
            // Stripe's bound: "up to an hour behind during outages", as configured below.
            index_lag_secs: Some(3600.0),
            // The lists' own lag matters for payments seconds old (verdicts.rs); these are
            // hours old.
            list_lag_secs: 0.0,
        },
    )
    .await
    .map_err(|e| TestCaseError::fail(e.to_string()))?;
    for (n, f) in &c.faults {
        sim.fault_at(*n, *f);
    }
    let list_objects = match c.lists {
        0 => json!(["payment_intents", "charges"]),
        1 => json!(["payment_intents"]),
        2 => json!([]),
        _ => json!(["charges"]),
    };
    let mismatched = c.clock.abs() > 300.0 || c.late || c.other_field || c.lists == 3;
    let p: Arc<dyn Provider> = build_provider(
        reckon_providers::ProviderKind::Stripe,
        &json!({
            "base_url": sim.base_url, "mode": "test", "visibility_lag_secs": 60,
            "rate_per_sec": 0, "max_pages": 50, "list_objects": list_objects,
            "use_events": c.use_events, "use_search": c.use_search,
            "event_types": ["payment_intent.created"],
        }),
        Some(SecretString::from("rk_test_world".to_owned())),
        GetClient::new(Duration::from_millis(200)),
    )
    .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let clock = c.clock;
    let look = |e: &EffectSpec| {
        let q = LookupQuery {
            key: e.key.clone(),
            created_at: e.created_at,
            updated_at: e.updated_at,
            expires_at: None,
            response_json: sim.recorded_response(e),
            now: reckon_providers::now(),
            // reckon's clock is the provider's: it saw the row when the call had ended.
            observed_at: Some(e.updated_at + clock + 1.0),
        };
        let p = p.clone();
        async move {
            let report = p.lookup(&q).await;
            classify(&report, reckon_providers::now())
        }
    };
    // While the faults last and payments are still moving: any final verdict is the truth.
    for round in 0..2 {
        for e in &world {
            let v = look(e).await;
            figures.lookups.fetch_add(1, Ordering::Relaxed);
            if v.is_final() {
                figures.final_under_faults.fetch_add(1, Ordering::Relaxed);
                figures.finals.fetch_add(1, Ordering::Relaxed);
                prop_assert_eq!(
                    v.outcome.as_str(),
                    e.truth().as_str(),
                    "round {} under faults, {}: {:?}",
                    round,
                    e.key,
                    v
                );
            }
        }
    }
    sim.faults_off();
    sim.settle();
    for e in &world {
        figures.effects.fetch_add(1, Ordering::Relaxed);
        if mismatched {
            figures.mismatched.fetch_add(1, Ordering::Relaxed);
        }
        let mut last = None;
        for _ in 0..CONVERGE_WITHIN {
            let v = look(e).await;
            figures.lookups.fetch_add(1, Ordering::Relaxed);
            if v.is_final() {
                prop_assert_eq!(v.outcome.as_str(), e.truth().as_str(), "{}: {:?}", e.key, v);
                figures.converged.fetch_add(1, Ordering::Relaxed);
                figures.finals.fetch_add(1, Ordering::Relaxed);
                last = None;
                break;
            }
            last = Some(v);
        }
        if let Some(v) = last {
            // The creating request's events see the key's payments wherever and whenever
            // they were made: with them, every effect must reach its verdict, once the
            // account shows its events carry the application's keys (an event whose own
            // object carries its key under the configured field, or a payment of a key
            // reckon asked about) or holds no payment at all. Without them a whole, empty
            // view may have nobody to vouch for it, and stays provisional.
            let any_payment = c.effects.iter().any(|(p, _)| !p.is_empty());
            let keys_shown = !c.other_field || any_payment || c.noise == 0;
            if c.use_events && keys_shown {
                return Err(TestCaseError::fail(format!(
                    "{} did not converge to {} within {CONVERGE_WITHIN} re-checks: {v:?}",
                    e.key,
                    e.truth().as_str()
                )));
            }
            figures.unwitnessed.fetch_add(1, Ordering::Relaxed);
        }
    }
    figures
        .requests
        .fetch_add(sim.log().len(), Ordering::Relaxed);
    figures.non_get.fetch_add(sim.non_get(), Ordering::Relaxed);
    prop_assert_eq!(sim.non_get(), 0, "only GETs");
    figures.cases.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

#[test]
fn final_verdicts_equal_the_worlds_truth_and_converge_once_faults_stop() {
    let cases: u32 = std::env::var("RECKON_WORLD_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let figures = Figures::default();
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let started = std::time::Instant::now();
    let result = runner.run(&case(), |c| rt.block_on(run(c, &figures)));
    let f = |a: &AtomicUsize| a.load(Ordering::Relaxed);
    println!(
        "verdict property: {} cases, {} lookups, {} requests ({} not GET, {:.2} per final \
         verdict), {} final verdicts while faults lasted, {}; {} of {} effects ({} in worlds \
         that do not match the configuration) converged within {CONVERGE_WITHIN} re-checks \
         after the faults stopped, {} left provisional on routes without a witness; {:.1} s",
        f(&figures.cases),
        f(&figures.lookups),
        f(&figures.requests),
        f(&figures.non_get),
        f(&figures.requests) as f64 / f(&figures.finals).max(1) as f64,
        f(&figures.final_under_faults),
        if result.is_ok() {
            "0 wrong"
        } else {
            "A WRONG OR UNSETTLED VERDICT (below)"
        },
        f(&figures.converged),
        f(&figures.effects),
        f(&figures.mismatched),
        f(&figures.unwitnessed),
        started.elapsed().as_secs_f64()
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}
