//! The verdict table, row by row, against a simulated Stripe whose payments live the way
//! Stripe's do (crates/reckon-sim): events that carry the object as it was, declined
//! attempts, a search index that lags, list pages that fail half-way, authorizations,
//! refunds. Each test names the world, looks the effect up as reckon does, and checks the
//! verdict and whether it is final.

use reckon_providers::{
    Classification, GetClient, LookupQuery, Money, Outcome, Provider, build_provider, classify,
};
use reckon_sim::{EffectSpec, Fault, Life, PaymentSpec, Recorded, Sim, WorldConfig};
use secrecy::SecretString;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

fn now() -> f64 {
    reckon_providers::now()
}

fn effect(key: &str, lives: &[Life]) -> EffectSpec {
    let created_at = now() - 7200.0;
    EffectSpec {
        key: key.into(),
        created_at,
        updated_at: created_at + 5.0,
        recorded: Recorded::Nothing,
        payments: lives
            .iter()
            .enumerate()
            .map(|(i, life)| PaymentSpec {
                life: *life,
                amount: 2000,
                offset: 0.5 + i as f64,
                indexed: true,
            })
            .collect(),
    }
}

fn stripe(sim: &Sim, extra: serde_json::Value) -> Arc<dyn Provider> {
    let mut settings = json!({
        "base_url": sim.base_url, "mode": "test", "visibility_lag_secs": 60,
        "rate_per_sec": 0, "max_pages": 50, "event_types": ["payment_intent.created"],
    });
    for (k, v) in extra.as_object().unwrap() {
        settings[k] = v.clone();
    }
    build_provider(
        "stripe",
        &settings,
        Some(SecretString::from("rk_test_sim".to_owned())),
        GetClient::new(Duration::from_secs(2)),
    )
    .unwrap()
}

async fn look(p: &Arc<dyn Provider>, sim: &Sim, e: &EffectSpec) -> Classification {
    let q = LookupQuery {
        key: e.key.clone(),
        created_at: e.created_at,
        updated_at: e.updated_at,
        expires_at: None,
        response_json: sim.recorded_response(e),
        now: now(),
    };
    let report = p.lookup(&q).await;
    classify(&report, now())
}

#[tokio::test]
async fn a_duplicate_is_found_across_pages_with_a_failed_page_in_between() {
    let e = effect("charge:v1:ORD-1", &[Life::Succeeded, Life::Succeeded]);
    let cfg = WorldConfig {
        page_size: 2,
        noise: 6,
        ..WorldConfig::default()
    };
    let sim = Sim::start(std::slice::from_ref(&e), cfg).await.unwrap();
    // The PaymentIntents list's second page fails: the first charge was found, the second
    // page may hold another.
    sim.fault_at(1, Fault::Status500);
    let p = stripe(&sim, json!({"use_events": false, "use_search": false}));
    let first = look(&p, &sim, &e).await;
    assert!(
        !first.is_final(),
        "a failed page can never leave a final verdict: {first:?}"
    );
    let second = look(&p, &sim, &e).await;
    assert_eq!(second.outcome, Outcome::Duplicate, "{second:?}");
    assert!(second.is_final());
    assert_eq!(
        second
            .payments
            .iter()
            .filter(|p| p.confirmed && p.money == Money::Moved)
            .count(),
        2
    );
    assert_eq!(sim.non_get(), 0);
}

#[tokio::test]
async fn a_failed_page_after_the_first_charge_leaves_applied_provisional() {
    for fault in [
        Fault::Status500,
        Fault::RateLimited,
        Fault::Reset,
        Fault::Truncated,
        Fault::Malformed,
        Fault::HasMoreWithoutCursor,
        Fault::Timeout(2500),
    ] {
        // The payment is the newest object of the window (page 1 of the newest-first
        // list); four payments of other keys follow, one per page. Page 2 fails.
        let mut e = effect("charge:v1:ORD-2", &[Life::Succeeded]);
        e.payments[0].offset = 10.0;
        let cfg = WorldConfig {
            page_size: 1,
            noise: 4,
            ..WorldConfig::default()
        };
        let sim = Sim::start(std::slice::from_ref(&e), cfg).await.unwrap();
        let p = stripe(&sim, json!({"use_events": false, "use_search": false}));
        sim.fault_at(1, fault);
        let c = look(&p, &sim, &e).await;
        assert_eq!(c.outcome, Outcome::Applied, "{fault:?}: {c:?}");
        assert!(c.provisional && !c.is_final(), "{fault:?}: {c:?}");
        assert!(
            !c.faults.is_empty(),
            "{fault:?}: the failed page is in the evidence"
        );
        // The next look reads the window whole and concludes.
        let c = look(&p, &sim, &e).await;
        assert_eq!(c.outcome, Outcome::Applied, "{fault:?}: {c:?}");
        assert!(c.is_final(), "{fault:?}: {c:?}");
    }
}

/// The account's lists are read once for every effect whose window they cover: a second
/// effect in the same window costs its own retrieve, not the window's pages again.
#[tokio::test]
async fn one_complete_read_of_a_window_answers_every_effect_in_it() {
    let a = effect("charge:v1:ORD-20", &[Life::Succeeded]);
    let mut b = effect("charge:v1:ORD-21", &[Life::Declined]);
    b.created_at += 20.0;
    b.updated_at += 20.0;
    let cfg = WorldConfig {
        page_size: 2,
        noise: 10,
        ..WorldConfig::default()
    };
    let sim = Sim::start(&[a.clone(), b.clone()], cfg).await.unwrap();
    let p = stripe(&sim, json!({"use_events": false, "use_search": false}));
    let c = look(&p, &sim, &a).await;
    assert_eq!(c.outcome, Outcome::Applied);
    assert!(c.is_final());
    let after_a = sim.log().len();
    let c = look(&p, &sim, &b).await;
    assert_eq!(c.outcome, Outcome::NotApplied, "{c:?}");
    let lists = sim.log()[after_a..]
        .iter()
        .filter(|l| {
            !l.target.contains("/v1/payment_intents/") && !l.target.contains("/v1/charges/")
        })
        .count();
    // Only the 20 seconds of b's window beyond a's are listed: one page of each list.
    assert!(lists <= 2, "{:?}", &sim.log()[after_a..]);
}

#[tokio::test]
async fn declined_then_succeeded_is_applied() {
    // One PaymentIntent: a declined card, then a good one. And two PaymentIntents: the
    // first declined, the second paid.
    let same = effect("charge:v1:ORD-3", &[Life::DeclinedThenSucceeded]);
    let mut two = effect("charge:v1:ORD-4", &[Life::Declined, Life::Succeeded]);
    two.created_at += 60.0;
    two.updated_at += 60.0;
    let sim = Sim::start(&[same.clone(), two.clone()], WorldConfig::default())
        .await
        .unwrap();
    let p = stripe(&sim, json!({}));
    for e in [&same, &two] {
        let c = look(&p, &sim, e).await;
        assert_eq!(c.outcome, Outcome::Applied, "{}: {c:?}", e.key);
        assert!(c.is_final(), "{c:?}");
        assert!(
            c.certificate.is_some(),
            "the complete check is the evidence"
        );
    }
}

/// The application recorded the id of the first, declined charge; the customer then paid
/// with another card on the same PaymentIntent. The declined charge read by its id does
/// not answer for the PaymentIntent: it is read too, and the verdict is applied.
#[tokio::test]
async fn a_recorded_declined_charge_does_not_hide_the_paymentintents_later_success() {
    let e = effect("charge:v1:ORD-17", &[Life::DeclinedThenSucceeded]);
    let sim = Sim::start(std::slice::from_ref(&e), WorldConfig::default())
        .await
        .unwrap();
    let declined = sim.charge_ids(&e.key)[0].clone();
    let p = stripe(&sim, json!({"use_events": false, "use_search": false}));
    let q = LookupQuery {
        key: e.key.clone(),
        created_at: e.created_at,
        updated_at: e.updated_at,
        expires_at: None,
        response_json: Some(json!({"id": declined}).to_string()),
        now: now(),
    };
    let c = classify(&p.lookup(&q).await, now());
    assert_eq!(c.outcome, Outcome::Applied, "{c:?}");
    assert!(c.is_final(), "{c:?}");
    // Without any list, only the declined charge is known, and nothing is concluded.
    let p = stripe(
        &sim,
        json!({"use_events": false, "use_search": false, "list_objects": []}),
    );
    let c = classify(&p.lookup(&q).await, now());
    assert_ne!(c.outcome, Outcome::NotApplied, "{c:?}");
}

#[tokio::test]
async fn declined_only_is_not_applied_and_names_the_attempt() {
    let e = effect("charge:v1:ORD-5", &[Life::Declined]);
    let sim = Sim::start(std::slice::from_ref(&e), WorldConfig::default())
        .await
        .unwrap();
    let p = stripe(&sim, json!({}));
    let c = look(&p, &sim, &e).await;
    assert_eq!(c.outcome, Outcome::NotApplied, "{c:?}");
    let cert = c.certificate.expect("a certificate");
    let pi = &sim.payment_ids(&e.key)[0];
    assert!(
        cert.failed_attempts.iter().any(|a| a.contains(pi.as_str())),
        "{cert:?}"
    );
    assert!(c.objects.iter().any(|o| {
        o.failure
            .as_deref()
            .is_some_and(|f| f.contains("insufficient_funds"))
    }));
}

#[tokio::test]
async fn an_event_snapshot_at_creation_is_only_a_lead() {
    // The check is the events list (no lists configured): every event found by key carries
    // the PaymentIntent as it was at creation, `requires_payment_method`.
    let paid = effect("charge:v1:ORD-6", &[Life::Succeeded]);
    let mut declined = effect("charge:v1:ORD-7", &[Life::Declined]);
    declined.created_at += 60.0;
    declined.updated_at += 60.0;
    let sim = Sim::start(&[paid.clone(), declined.clone()], WorldConfig::default())
        .await
        .unwrap();
    let p = stripe(&sim, json!({"list_objects": [], "use_search": false}));
    let c = look(&p, &sim, &paid).await;
    let snapshot = c.objects.iter().find(|o| !o.confirmed);
    assert!(snapshot.is_none(), "every lead was confirmed: {c:?}");
    assert_eq!(c.outcome, Outcome::Applied, "{c:?}");
    assert!(c.is_final(), "{c:?}");
    assert_eq!(c.payments[0].status.as_deref(), Some("succeeded"));
    let c = look(&p, &sim, &declined).await;
    assert_eq!(c.outcome, Outcome::NotApplied, "{c:?}");
    // The confirming read failing leaves the snapshot unconfirmed: nothing is concluded.
    let base = sim.requests_so_far();
    sim.fault_at(base + 1, Fault::Status502);
    let c = look(&p, &sim, &paid).await;
    assert!(!c.is_final(), "{c:?}");
}

#[tokio::test]
async fn a_lagging_search_index_never_makes_a_duplicate_look_single() {
    let mut e = effect("charge:v1:ORD-8", &[Life::Succeeded, Life::Succeeded]);
    e.payments[1].indexed = false;
    let cfg = WorldConfig {
        page_size: 1,
        noise: 2,
        ..WorldConfig::default()
    };
    let sim = Sim::start(std::slice::from_ref(&e), cfg).await.unwrap();
    let p = stripe(&sim, json!({"use_events": false}));
    // The list fails on its first page: only search is left, and it shows one payment.
    sim.fault_at(0, Fault::Status500);
    let c = look(&p, &sim, &e).await;
    assert_eq!(c.outcome, Outcome::Applied, "{c:?}");
    assert!(c.provisional && !c.is_final(), "{c:?}");
    let c = look(&p, &sim, &e).await;
    assert_eq!(c.outcome, Outcome::Duplicate, "{c:?}");
}

#[tokio::test]
async fn an_authorization_not_captured_waits_and_becomes_not_applied_when_it_expires() {
    let e = effect("charge:v1:ORD-9", &[Life::Authorized { captured: false }]);
    let sim = Sim::start(std::slice::from_ref(&e), WorldConfig::default())
        .await
        .unwrap();
    let p = stripe(&sim, json!({}));
    let c = look(&p, &sim, &e).await;
    assert_eq!(c.outcome, Outcome::Indeterminate, "{c:?}");
    assert!(c.pending && c.non_final, "{c:?}");
    assert!(c.reason.contains("requires_capture"), "{}", c.reason);
    sim.settle();
    let c = look(&p, &sim, &e).await;
    assert_eq!(c.outcome, Outcome::NotApplied, "{c:?}");
    assert!(c.certificate.unwrap().failed_attempts[0].contains("canceled"));
}

#[tokio::test]
async fn a_captured_authorization_is_applied_once_captured() {
    let e = effect("charge:v1:ORD-10", &[Life::Authorized { captured: true }]);
    let sim = Sim::start(std::slice::from_ref(&e), WorldConfig::default())
        .await
        .unwrap();
    let p = stripe(&sim, json!({}));
    assert!(!look(&p, &sim, &e).await.is_final());
    sim.settle();
    let c = look(&p, &sim, &e).await;
    assert_eq!(c.outcome, Outcome::Applied, "{c:?}");
    assert!(c.is_final());
}

#[tokio::test]
async fn a_refund_still_moved_money_and_shows() {
    let once = effect("charge:v1:ORD-11", &[Life::Refunded]);
    let mut twice = effect("charge:v1:ORD-12", &[Life::Succeeded, Life::Refunded]);
    twice.created_at += 60.0;
    twice.updated_at += 60.0;
    let sim = Sim::start(&[once.clone(), twice.clone()], WorldConfig::default())
        .await
        .unwrap();
    let p = stripe(&sim, json!({}));
    let c = look(&p, &sim, &once).await;
    assert_eq!(c.outcome, Outcome::Applied, "{c:?}");
    assert!(c.is_final());
    let c = look(&p, &sim, &twice).await;
    assert_eq!(c.outcome, Outcome::Duplicate, "{c:?}");
    assert!(
        c.payments.iter().any(|p| p.amount_refunded == Some(2000)),
        "the refunded second charge shows as refunded: {c:?}"
    );
}

#[tokio::test]
async fn a_disputed_charge_still_moved_money_and_shows_the_dispute() {
    let e = effect("charge:v1:ORD-16", &[Life::Disputed]);
    let sim = Sim::start(std::slice::from_ref(&e), WorldConfig::default())
        .await
        .unwrap();
    let p = stripe(&sim, json!({}));
    let c = look(&p, &sim, &e).await;
    assert_eq!(c.outcome, Outcome::Applied, "{c:?}");
    assert!(c.is_final());
    assert!(c.payments[0].disputed, "{c:?}");
}

#[tokio::test]
async fn a_payment_still_processing_is_never_applied() {
    let e = effect("charge:v1:ORD-13", &[Life::Processing { succeeds: false }]);
    let sim = Sim::start(std::slice::from_ref(&e), WorldConfig::default())
        .await
        .unwrap();
    let p = stripe(&sim, json!({}));
    let c = look(&p, &sim, &e).await;
    assert_eq!(c.outcome, Outcome::Indeterminate, "{c:?}");
    assert!(c.pending);
    sim.settle();
    let c = look(&p, &sim, &e).await;
    assert_eq!(c.outcome, Outcome::NotApplied, "{c:?}");
}

#[tokio::test]
async fn after_a_401_or_should_retry_false_nothing_more_is_sent() {
    for fault in [Fault::Unauthorized, Fault::RateLimitedDoNotRetry] {
        let mut e = effect("charge:v1:ORD-14", &[Life::Succeeded]);
        e.recorded = Recorded::PaymentIntent;
        let sim = Sim::start(std::slice::from_ref(&e), WorldConfig::default())
            .await
            .unwrap();
        sim.fault_at(0, fault);
        let p = stripe(&sim, json!({}));
        let c = look(&p, &sim, &e).await;
        assert_eq!(c.outcome, Outcome::Indeterminate, "{c:?}");
        assert_eq!(c.retry, reckon_providers::RetryAdvice::DoNotRetry);
        assert_eq!(sim.log().len(), 1, "{fault:?}: {:?}", sim.log());
    }
}

#[tokio::test]
async fn the_providers_own_rate_limit_on_page_three_never_leaves_applied_final() {
    let e = effect("charge:v1:ORD-15", &[Life::Succeeded, Life::Succeeded]);
    let cfg = WorldConfig {
        page_size: 1,
        noise: 6,
        server_rate_limit: Some(2.0),
    };
    let sim = Sim::start(std::slice::from_ref(&e), cfg).await.unwrap();
    let p = stripe(&sim, json!({"use_events": false, "use_search": false}));
    let c = look(&p, &sim, &e).await;
    assert!(
        c.outcome == Outcome::Duplicate || !c.is_final(),
        "a 429 mid-list: {c:?}"
    );
    assert!(sim.log().iter().any(|l| l.status == 429));
}

/// Lookups of 30 effects, 16 at a time, against an account whose budget is 20 requests a
/// second: no second at the provider, as it counts arrivals, holds more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_second_at_the_provider_holds_more_than_the_budget() {
    use futures::StreamExt;
    let effects = reckon_sim::random_world(7, 30, now() - 7200.0);
    let sim = Sim::start(&effects, WorldConfig::default()).await.unwrap();
    let p = stripe(
        &sim,
        json!({"rate_per_sec": 20, "use_events": false, "use_search": false}),
    );
    let verdicts: Vec<Classification> = futures::stream::iter(&effects)
        .map(|e| look(&p, &sim, e))
        .buffer_unordered(16)
        .collect()
        .await;
    assert_eq!(verdicts.len(), 30);
    assert!(sim.log().len() > 40, "{} requests", sim.log().len());
    assert!(
        sim.busiest_second() <= 20,
        "{} requests in the busiest second",
        sim.busiest_second()
    );
}
