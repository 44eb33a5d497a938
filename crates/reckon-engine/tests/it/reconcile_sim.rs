//! The reconciler end to end on a real SQLite ledger against a simulated Stripe
//! (crates/reckon-sim): a list page that fails after the payment was found leaves a
//! provisional `applied` (recorded, not resolved, re-checked soon, never written back);
//! the re-check resolves it; a duplicate and a declined card resolve as such.

use reckon_domain::{SourceRecord, State, time};
use reckon_engine::reconcile::{ReconcileCtx, reconcile_all, reconcile_one};
use reckon_ledger::{IngestBatch, Keyring, NewProvider, NewSource, Origin, SourceKind};
use reckon_sim::{EffectSpec, Fault, Life, PaymentSpec, Sim, WorldConfig};
use std::collections::HashMap;
use std::sync::Arc;

const PAID: &str = "charge:v1:ORD-PAID";
const TWICE: &str = "charge:v1:ORD-TWICE";
const DECLINED: &str = "charge:v1:ORD-DECLINED";

fn unknown(key: &str, updated_at: f64) -> SourceRecord {
    SourceRecord {
        key: key.to_owned(),
        state: State::Unknown,
        request_hash: "1:9f86d081884c7d65".to_owned(),
        response: None,
        attempts: 1,
        created_at: updated_at - 1.0,
        updated_at,
        expires_at: None,
    }
}

fn succeeded(key: &str, updated_at: f64) -> SourceRecord {
    SourceRecord {
        state: State::Succeeded,
        ..unknown(key, updated_at)
    }
}

fn spec(key: &str, updated_at: f64, lives: &[(Life, f64)]) -> EffectSpec {
    EffectSpec {
        key: key.into(),
        created_at: updated_at - 1.0,
        updated_at,
        recorded: reckon_sim::Recorded::Nothing,
        payments: lives
            .iter()
            .map(|(life, offset)| PaymentSpec {
                life: *life,
                amount: 1999,
                offset: *offset,
                indexed: true,
            })
            .collect(),
    }
}

/// A SQLite ledger with one tenant and a push source holding `records`.
async fn ledger_with(
    records: Vec<SourceRecord>,
) -> (
    tempfile::TempDir,
    Arc<dyn reckon_ledger::Ledger>,
    reckon_ledger::Tenant,
) {
    let dir = tempfile::tempdir().unwrap();
    let keyring = Keyring::from_base64(&Keyring::generate_base64()).unwrap();
    let ledger = reckon_ledger::connect(None, dir.path(), keyring)
        .await
        .unwrap();
    let t = ledger.create_tenant("acme").await.unwrap();
    let source = ledger
        .add_source(
            t.id,
            NewSource {
                name: "shop".into(),
                kind: SourceKind::Push,
                dsn: None,
                dsn_display: None,
                table_name: "justonce_keys".into(),
                scan_interval_secs: 60,
                abandoned_after_secs: 300.0,
                overlap_secs: 5.0,
                full_scan_every_secs: 3600,
                mapping: None,
            },
        )
        .await
        .unwrap();
    ledger
        .ingest(
            t.id,
            source.id,
            IngestBatch {
                origin: Origin::Push,
                // reckon saw the rows two minutes ago (a scan): a witness read now reaches
                // past that moment by more than the visibility lag.
                observed_at: time::now() - 120.0,
                records,
                rejected: vec![],
                abandoned_after_secs: 300.0,
                cursor: None,
                lease: None,
                expect_new: false,
            },
        )
        .await
        .unwrap();
    (dir, ledger, t)
}

/// A Stripe provider `stripe` with `key` and `settings`, routed for the source's `charge`.
async fn route_to_stripe(
    ledger: &dyn reckon_ledger::Ledger,
    t: &reckon_ledger::Tenant,
    key: &str,
    settings: serde_json::Value,
) {
    ledger
        .add_provider(
            t.id,
            NewProvider {
                name: "stripe".into(),
                kind: reckon_ledger::ProviderKind::Stripe,
                secret: Some(secrecy::SecretString::from(key.to_owned())),
                settings,
            },
        )
        .await
        .unwrap();
    ledger
        .set_route(t.id, "shop", "charge", Some("stripe"))
        .await
        .unwrap();
}

/// A reconciler allowed to reach loopback, where the simulated providers listen (with its
/// own egress policy, so its own confined client).
fn loopback_ctx(ledger: &Arc<dyn reckon_ledger::Ledger>) -> ReconcileCtx {
    let loopback =
        reckon_sources::EgressPolicy::new(&["127.0.0.0/8".to_owned()], None).expect("policy");
    ReconcileCtx::new(ledger.clone()).with_egress(Arc::new(loopback))
}

#[tokio::test]
async fn a_failed_page_leaves_a_provisional_applied_that_the_recheck_resolves() {
    let now = time::now();
    // Hours apart: each effect's window holds only its own payments and the noise.
    let at = |h: f64| now - 3600.0 * h;
    let (_dir, ledger, t) = ledger_with(vec![
        unknown(PAID, at(6.0)),
        unknown(TWICE, at(4.0)),
        unknown(DECLINED, at(2.0)),
    ])
    .await;
    // PAID's payment is the newest of its window: on the first page of the list.
    let world = [
        spec(PAID, at(6.0), &[(Life::Succeeded, 30.0)]),
        spec(
            TWICE,
            at(4.0),
            &[(Life::Succeeded, 0.5), (Life::Succeeded, 1.5)],
        ),
        spec(DECLINED, at(2.0), &[(Life::Declined, 0.5)]),
    ];
    let sim = Sim::start(
        &world,
        WorldConfig {
            page_size: 1,
            noise: 6,
            ..WorldConfig::default()
        },
    )
    .await
    .unwrap();
    route_to_stripe(
        &*ledger,
        &t,
        "rk_test_sim",
        serde_json::json!({
            "base_url": sim.base_url, "mode": "test", "rate_per_sec": 0,
            "event_types": ["payment_intent.created"], "use_search": false,
        }),
    )
    .await;
    let ctx = loopback_ctx(&ledger);
    let id = |key: &str| {
        let ledger = ledger.clone();
        let key = key.to_owned();
        async move {
            ledger
                .get_effect(t.id, "shop", &key)
                .await
                .unwrap()
                .expect("the effect")
                .effect
                .id
        }
    };

    // The second page of PAID's list fails: applied, provisional.
    sim.fault_at(1, Fault::Status500);
    let o = reconcile_one(&ctx, &t, id(PAID).await)
        .await
        .unwrap()
        .expect("claimed");
    assert_eq!(o.outcome, "applied", "{o:#?}");
    assert!(
        !o.resolved,
        "a provisional verdict is not a resolution: {o:#?}"
    );
    assert!(!o.needs_attention);
    let next = o.next_attempt_at.expect("re-checked");
    assert!(
        next <= time::now() + 30.0,
        "re-checked soon, not in 15 minutes"
    );
    let view = ledger.reconcile_view(t.id, o.effect_id).await.unwrap();
    assert!(view.resolution.is_none());
    let st = view.state.unwrap();
    assert!(st.non_final && st.last_outcome == Some(reckon_ledger::Outcome::Applied));
    let evidence = &view.attempts[0].evidence["classification"];
    assert_eq!(evidence["provisional"], true, "{evidence}");
    // Still unresolved: nothing for write-back, still in the queue.
    let candidates = ledger.writeback_candidates(t.id, None, 10).await.unwrap();
    assert!(candidates.is_empty(), "{candidates:#?}");

    // The re-check, with the provider whole again, resolves it.
    let o = reconcile_one(&ctx, &t, id(PAID).await)
        .await
        .unwrap()
        .expect("claimed");
    assert_eq!(o.outcome, "applied");
    assert!(o.resolved, "{o:#?}");

    let outcomes = reconcile_all(&ctx, &t).await.unwrap();
    let by_key: HashMap<&str, _> = outcomes.iter().map(|o| (o.key.as_str(), o)).collect();
    assert_eq!(by_key[TWICE].outcome, "duplicate", "{outcomes:#?}");
    assert!(by_key[TWICE].resolved);
    assert_eq!(by_key[DECLINED].outcome, "not_applied", "{outcomes:#?}");
    let view = ledger
        .reconcile_view(t.id, by_key[DECLINED].effect_id)
        .await
        .unwrap();
    let cert = &view.resolution.expect("resolved").evidence["classification"]["certificate"];
    let pi = &sim.payment_ids(DECLINED)[0];
    assert!(
        cert["failed_attempts"][0]
            .as_str()
            .is_some_and(|a| a.contains(pi.as_str())),
        "{cert}"
    );
    assert_eq!(sim.non_get(), 0);
}

/// A provider that echoes the key it was sent in its error message: what is stored of its
/// answer (the attempt's evidence, the effect's last error) holds no key, and neither does
/// anything shown to support or a viewer.
#[tokio::test]
async fn a_provider_echoing_its_key_gets_nothing_of_it_stored() {
    use wiremock::matchers::method;
    use wiremock::{Mock, MockServer, ResponseTemplate};
    const KEY: &str = "rk_test_EchoedCanary0123456789";
    let now = time::now();
    let (_dir, ledger, t) = ledger_with(vec![unknown(PAID, now - 7200.0)]).await;
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(500).set_body_json(serde_json::json!({
            "error": {"type": "api_error",
                      "message": format!("Invalid API Key provided: {KEY} (Bearer {KEY})")}
        })))
        .mount(&server)
        .await;
    route_to_stripe(
        &*ledger,
        &t,
        KEY,
        serde_json::json!({"base_url": server.uri(), "mode": "test", "rate_per_sec": 0}),
    )
    .await;
    let ctx = loopback_ctx(&ledger);
    let outcomes = reconcile_all(&ctx, &t).await.unwrap();
    assert_eq!(outcomes.len(), 1);
    assert_eq!(outcomes[0].outcome, "indeterminate");
    assert!(!outcomes[0].reason.contains(KEY), "{}", outcomes[0].reason);
    let view = ledger
        .reconcile_view(t.id, outcomes[0].effect_id)
        .await
        .unwrap();
    let stored = serde_json::to_string(&view).unwrap();
    assert!(
        stored.contains("Invalid API Key provided: [redacted]"),
        "the provider's message is kept, its key is not: {stored}"
    );
    assert!(!stored.contains(KEY), "{stored}");
    assert!(!stored.contains("EchoedCanary"), "{stored}");
}

/// Two replicas (each its own client and paces, as two processes have) reconcile one
/// tenant's backlog against one provider account with a budget of 10 requests a second:
/// the provider, counting arrivals, never sees more than 10 in any second from both
/// together, and every effect is resolved by one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_accounts_budget_as_the_provider_counts() {
    let now = time::now();
    let keys: Vec<String> = (0..24).map(|i| format!("charge:v1:ORD-R{i}")).collect();
    let at = |i: usize| now - 7200.0 - 600.0 * i as f64;
    let (_dir, ledger, t) = ledger_with(
        keys.iter()
            .enumerate()
            .map(|(i, k)| unknown(k, at(i)))
            .collect(),
    )
    .await;
    let world: Vec<EffectSpec> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| spec(k, at(i), &[(Life::Succeeded, 0.5)]))
        .collect();
    let sim = Sim::start(&world, WorldConfig::default()).await.unwrap();
    route_to_stripe(
        &*ledger,
        &t,
        "rk_test_shared",
        serde_json::json!({
            "base_url": sim.base_url, "mode": "test", "rate_per_sec": 10,
            "event_types": ["payment_intent.created"], "use_search": false,
        }),
    )
    .await;
    let replica = |owner: &str| {
        // Each replica its own egress policy, so each gets its own confined client.
        let mut ctx = loopback_ctx(&ledger);
        ctx.client = reckon_providers::GetClient::new(std::time::Duration::from_secs(5));
        ctx.options.owner = owner.to_owned();
        ctx.options.batch = 4;
        ctx.options.concurrency = 4;
        ctx
    };
    let (a, b) = (replica("replica-a"), replica("replica-b"));
    let (ra, rb) = tokio::join!(reconcile_all(&a, &t), reconcile_all(&b, &t));
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert!(!ra.is_empty() && !rb.is_empty(), "both replicas worked");
    let resolved = ra.iter().chain(&rb).filter(|o| o.resolved).count();
    assert_eq!(resolved, keys.len(), "{ra:#?} {rb:#?}");
    assert!(sim.log().len() > 30, "{} requests", sim.log().len());
    assert!(
        sim.busiest_second() <= 10,
        "{} requests in the busiest second at the provider",
        sim.busiest_second()
    );
}

/// A route with no key-indexed witness (no events; search's miss not yet one) is calibrated by the
/// reconciler against the effects the application recorded as succeeded: calibrated, its
/// complete list proves absence and uniqueness; with the key under another metadata field
/// it finds none of them, and nothing it misses is concluded.
#[tokio::test]
async fn the_reconciler_calibrates_a_route_against_the_applications_known_outcomes() {
    let now = time::now();
    let at = |i: usize| now - 7200.0 - 120.0 * i as f64;
    let done: Vec<String> = (0..24).map(|i| format!("charge:v1:ORD-D{i}")).collect();
    let mut records: Vec<SourceRecord> = done
        .iter()
        .enumerate()
        .map(|(i, k)| succeeded(k, at(i)))
        .collect();
    records.push(unknown(PAID, at(30)));
    records.push(unknown(DECLINED, at(31)));
    let mut world: Vec<EffectSpec> = done
        .iter()
        .enumerate()
        .map(|(i, k)| spec(k, at(i), &[(Life::Succeeded, 0.5)]))
        .collect();
    world.push(spec(PAID, at(30), &[(Life::Succeeded, 0.5)]));
    world.push(spec(DECLINED, at(31), &[(Life::Declined, 0.5)]));
    // No events; search looks outside the window, but its miss alone is no witness for a
    // day (its lag): the calibration is what lets the window's list conclude.
    let no_witness = |base: &str| {
        serde_json::json!({
            "base_url": base, "mode": "test", "rate_per_sec": 0,
            "use_events": false, "search_lag_secs": 86400,
        })
    };

    let (_dir, ledger, t) = ledger_with(records.clone()).await;
    let sim = Sim::start(&world, WorldConfig::default()).await.unwrap();
    route_to_stripe(&*ledger, &t, "rk_test_cal", no_witness(&sim.base_url)).await;
    let ctx = loopback_ctx(&ledger);
    let outcomes = reconcile_all(&ctx, &t).await.unwrap();
    let by_key: HashMap<&str, _> = outcomes.iter().map(|o| (o.key.as_str(), o)).collect();
    assert_eq!(by_key[PAID].outcome, "applied", "{outcomes:#?}");
    assert!(by_key[PAID].resolved, "{outcomes:#?}");
    assert_eq!(by_key[DECLINED].outcome, "not_applied", "{outcomes:#?}");
    assert!(by_key[DECLINED].resolved, "{outcomes:#?}");
    let provider = ledger.list_providers(t.id).await.unwrap()[0].id;
    let cal = ctx.calibrations.last("acme", provider).expect("measured");
    assert_eq!(
        cal.status,
        reckon_providers::CalibrationStatus::Calibrated,
        "{cal:?}"
    );
    assert_eq!((cal.samples, cal.found), (24, 24), "{cal:?}");
    let view = ledger
        .reconcile_view(t.id, by_key[DECLINED].effect_id)
        .await
        .unwrap();
    let cert = &view.resolution.expect("resolved").evidence["classification"]["certificate"];
    assert!(
        cert["witness"]
            .as_str()
            .is_some_and(|w| w.contains("calibrated")),
        "{cert}"
    );

    // The application keeps its key under another field: the same lookups find nothing.
    let (_dir, ledger, t) = ledger_with(records).await;
    let sim = Sim::start(
        &world,
        WorldConfig {
            metadata_field: "order_ref".into(),
            ..WorldConfig::default()
        },
    )
    .await
    .unwrap();
    route_to_stripe(&*ledger, &t, "rk_test_cal", no_witness(&sim.base_url)).await;
    let ctx = loopback_ctx(&ledger);
    let outcomes = reconcile_all(&ctx, &t).await.unwrap();
    for o in &outcomes {
        assert!(!o.resolved, "nothing concluded: {o:#?}");
        assert!(o.reason.contains("uncalibrated"), "{}", o.reason);
    }
    let provider = ledger.list_providers(t.id).await.unwrap()[0].id;
    let cal = ctx.calibrations.last("acme", provider).expect("measured");
    assert_eq!(
        cal.status,
        reckon_providers::CalibrationStatus::Uncalibrated,
        "{cal:?}"
    );
    assert!(cal.reason.contains("metadata_field"), "{}", cal.reason);
}

/// What reckon has read, it does not unsee: an earlier lookup saw a payment of the key move
/// money; a later lookup whose view is whole, witnessed and empty is a contradiction for a
/// person, never a certificate of absence.
#[tokio::test]
async fn a_payment_seen_earlier_is_never_certified_absent_later() {
    let now = time::now();
    let (_dir, ledger, t) = ledger_with(vec![unknown(DECLINED, now - 7200.0)]).await;
    // The provider's world today shows no payment of the key that moved money.
    let world = [spec(DECLINED, now - 7200.0, &[(Life::Declined, 0.5)])];
    let sim = Sim::start(&world, WorldConfig::default()).await.unwrap();
    route_to_stripe(
        &*ledger,
        &t,
        "rk_test_sim",
        serde_json::json!({
            "base_url": sim.base_url, "mode": "test", "rate_per_sec": 0,
            "event_types": ["payment_intent.created"], "use_search": false,
        }),
    )
    .await;
    // An earlier lookup (recorded as the reconciler records one) read a payment that moved
    // money: a provisional applied, re-checked.
    let claims = ledger.claim_due(t.id, "w", now, 60.0, 10).await.unwrap();
    let effect = claims[0].effect.id;
    ledger
        .record_attempt(
            t.id,
            effect,
            "w",
            reckon_ledger::NewAttempt {
                provider_id: None,
                started_at: now - 60.0,
                finished_at: now - 59.0,
                outcome: reckon_ledger::Outcome::Applied,
                method: Some("stripe.retrieve".into()),
                error: None,
                evidence: serde_json::json!({"classification": {"outcome": "applied",
                    "payments": [{"group": "pi_seen_before", "money": "moved",
                                  "confirmed": true, "status": "succeeded"}]}}),
                next_attempt_at: now - 1.0,
                non_final: true,
                needs_attention: false,
                resolve: false,
            },
        )
        .await
        .unwrap();
    let ctx = loopback_ctx(&ledger);
    let o = reconcile_one(&ctx, &t, effect)
        .await
        .unwrap()
        .expect("claimed");
    assert!(!o.resolved, "{o:#?}");
    assert!(o.needs_attention, "{o:#?}");
    assert!(
        o.reason.contains("contradiction") && o.reason.contains("pi_seen_before"),
        "{}",
        o.reason
    );
    let view = ledger.reconcile_view(t.id, effect).await.unwrap();
    assert!(view.resolution.is_none());
    let last = view.attempts.last().unwrap();
    assert_eq!(last.outcome, reckon_ledger::Outcome::Indeterminate);
    // The lookup itself is kept as it was read, beside the contradiction.
    assert_eq!(last.evidence["classification"]["outcome"], "not_applied");
}
