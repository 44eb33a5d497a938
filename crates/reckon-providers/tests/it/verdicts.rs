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
        reckon_providers::ProviderKind::Stripe,
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
        observed_at: None,
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
        // The events of the creating request are the witness that nothing outside the
        // window carries the key.
        let p = stripe(&sim, json!({"use_search": false}));
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

/// The account's lists (and events) are read once for every effect whose window they cover:
/// a second effect in the same window costs its own retrieve, not the window's pages again.
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
    let p = stripe(&sim, json!({"use_search": false}));
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
    // Only the 20 seconds of b's window beyond a's are listed: one page of each list, and
    // one of the events.
    assert!(lists <= 3, "{:?}", &sim.log()[after_a..]);
    // The certificate names the pages it rests on, though a's lookup read most of them.
    let cert = c.certificate.expect("a certificate");
    assert!(cert.request_ids.len() > lists, "{cert:?}");
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
    let p = stripe(&sim, json!({"use_search": false}));
    let q = LookupQuery {
        key: e.key.clone(),
        created_at: e.created_at,
        updated_at: e.updated_at,
        expires_at: None,
        response_json: Some(json!({"id": declined}).to_string()),
        now: now(),
        observed_at: None,
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
    // The events of its span were read whole already: the next request is the retrieve.
    let base = sim.requests_so_far();
    sim.fault_at(base, Fault::Status502);
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
        ..WorldConfig::default()
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

/// Lookups of 60 effects, 16 at a time, against an account whose budget is 20 requests a
/// second: no second at the provider, as it counts arrivals, holds more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_second_at_the_provider_holds_more_than_the_budget() {
    use futures::StreamExt;
    let effects = reckon_sim::random_world(7, 60, now() - 7200.0);
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
    assert_eq!(verdicts.len(), 60);
    assert!(sim.log().len() > 40, "{} requests", sim.log().len());
    assert!(
        sim.busiest_second() <= 20,
        "{} requests in the busiest second",
        sim.busiest_second()
    );
}

// Worlds that do not match the configuration: reckon must never certify absence from a
// view that could not have seen the payment.

/// `lives` made `offset` seconds after the application's recorded call (an application
/// clock that is off, or a payment made later).
fn effect_at(key: &str, lives: &[Life], offset: f64) -> EffectSpec {
    let mut e = effect(key, lives);
    for p in &mut e.payments {
        p.offset += offset;
    }
    e
}

/// A declined attempt near `at`, so the lists have seen this account put keys under the
/// field (a search miss then says something).
fn neighbour(key: &str, e: &EffectSpec) -> EffectSpec {
    let mut n = effect(key, &[Life::Declined]);
    n.created_at = e.created_at + 30.0;
    n.updated_at = e.updated_at + 30.0;
    n
}

/// Each lookup of `effects` either is the truth or is not final.
async fn never_a_false_final(
    p: &Arc<dyn Provider>,
    sim: &Sim,
    effects: &[EffectSpec],
) -> Vec<Classification> {
    let mut out = Vec::new();
    for e in effects {
        let c = look(p, sim, e).await;
        if c.is_final() {
            assert_eq!(c.outcome.as_str(), e.truth().as_str(), "{}: {c:?}", e.key);
        }
        out.push(c);
    }
    out
}

#[tokio::test]
async fn a_charges_only_list_never_certifies_absence_of_a_paymentintent_keyed_payment() {
    // Stripe does not copy a PaymentIntent's metadata to its charges: the charges list comes
    // back whole and shows none of the key.
    let once = effect("charge:v1:ORD-30", &[Life::Succeeded]);
    let mut twice = effect("charge:v1:ORD-31", &[Life::Succeeded, Life::Succeeded]);
    twice.created_at += 60.0;
    twice.updated_at += 60.0;
    let world = [once.clone(), twice.clone()];
    let sim = Sim::start(&world, WorldConfig::default()).await.unwrap();
    // With the creating request's events: the events find the PaymentIntent.
    let p = stripe(
        &sim,
        json!({"list_objects": ["charges"], "use_search": false}),
    );
    let v = never_a_false_final(&p, &sim, &world).await;
    assert_eq!(v[0].outcome, Outcome::Applied, "{:?}", v[0]);
    assert!(v[0].is_final(), "{:?}", v[0]);
    assert_eq!(v[1].outcome, Outcome::Duplicate, "{:?}", v[1]);
    // Without event types (the default): search of PaymentIntents finds them, and with no
    // witness vouching for the rest nothing is final but the duplicate.
    let p = stripe(
        &sim,
        json!({"list_objects": ["charges"], "event_types": []}),
    );
    let v = never_a_false_final(&p, &sim, &world).await;
    assert_eq!(v[0].outcome, Outcome::Applied, "{:?}", v[0]);
    assert_eq!(v[1].outcome, Outcome::Duplicate, "{:?}", v[1]);
    // Events and search off: the lists alone see nothing, and say so without concluding.
    let p = stripe(
        &sim,
        json!({"list_objects": ["charges"], "use_events": false, "use_search": false}),
    );
    for c in never_a_false_final(&p, &sim, &world).await {
        assert!(!c.is_final() && c.certificate.is_none(), "{c:?}");
    }
}

#[tokio::test]
async fn a_key_under_another_metadata_field_is_never_certified_absent() {
    let paid = effect("charge:v1:ORD-32", &[Life::Succeeded]);
    let unpaid = neighbour("charge:v1:ORD-33", &paid);
    let world = [paid.clone(), unpaid.clone()];
    let cfg = WorldConfig {
        metadata_field: "order_ref".into(),
        noise: 3,
        ..WorldConfig::default()
    };
    let sim = Sim::start(&world, cfg).await.unwrap();
    // The creating request's events carry the key whatever the metadata says.
    let p = stripe(&sim, json!({}));
    let v = never_a_false_final(&p, &sim, &world).await;
    assert_eq!(v[0].outcome, Outcome::Applied, "{:?}", v[0]);
    assert!(v[0].is_final(), "{:?}", v[0]);
    // Without the events, search under the configured field finds nothing either, and no
    // object the lists saw carries that field: nothing vouches for the miss.
    let p = stripe(&sim, json!({"use_events": false}));
    let v = never_a_false_final(&p, &sim, &world).await;
    assert!(!v[0].is_final(), "{:?}", v[0]);
    assert_ne!(v[0].outcome, Outcome::Applied);
    assert!(
        v[0].reason.contains("no view that would have shown"),
        "{}",
        v[0].reason
    );
}

/// An application that sends Stripe idempotency keys of its own (or none) has events that
/// never carry its justonce key: reading them whole without the key proves nothing, and
/// with its key under another metadata field too, nothing vouches for a miss.
#[tokio::test]
async fn events_that_never_carry_the_applications_keys_are_no_witness() {
    let paid = effect("charge:v1:ORD-36", &[Life::Succeeded]);
    let unpaid = neighbour("charge:v1:ORD-37", &paid);
    let world = [paid.clone(), unpaid.clone()];
    let cfg = WorldConfig {
        metadata_field: "order_ref".into(),
        request_keys: false,
        noise: 3,
        ..WorldConfig::default()
    };
    let sim = Sim::start(&world, cfg).await.unwrap();
    let p = stripe(&sim, json!({}));
    let v = never_a_false_final(&p, &sim, &world).await;
    assert!(!v[0].is_final(), "{:?}", v[0]);
    assert!(!v[1].is_final(), "{:?}", v[1]);
    // Where the lists see the keys under the configured field and the events carry them
    // too, the events are a witness again: the unpaid one is certified.
    let cfg = WorldConfig {
        noise: 3,
        ..WorldConfig::default()
    };
    let sim = Sim::start(&world, cfg).await.unwrap();
    let p = stripe(&sim, json!({"use_search": false}));
    let v = never_a_false_final(&p, &sim, &world).await;
    assert_eq!(v[0].outcome, Outcome::Applied, "{:?}", v[0]);
    assert!(v[1].is_final(), "{:?}", v[1]);
}

#[tokio::test]
async fn an_application_clock_an_hour_off_is_never_certified_absent() {
    for hour in [3600.0, -3600.0] {
        let once = effect_at("charge:v1:ORD-34", &[Life::Succeeded], hour);
        let mut twice = effect_at(
            "charge:v1:ORD-35",
            &[Life::Succeeded, Life::Succeeded],
            hour,
        );
        twice.created_at += 60.0;
        twice.updated_at += 60.0;
        let world = [once.clone(), twice.clone()];
        let sim = Sim::start(&world, WorldConfig::default()).await.unwrap();
        // Events over the witness span (a day either side) see both.
        let p = stripe(&sim, json!({"use_search": false}));
        let v = never_a_false_final(&p, &sim, &world).await;
        assert_eq!(v[0].outcome, Outcome::Applied, "{hour}: {:?}", v[0]);
        assert_eq!(v[1].outcome, Outcome::Duplicate, "{hour}: {:?}", v[1]);
        // Search (by key, whatever `created` says) sees them too.
        let p = stripe(&sim, json!({"use_events": false}));
        let v = never_a_false_final(&p, &sim, &world).await;
        assert_eq!(v[0].outcome, Outcome::Applied, "{hour}: {:?}", v[0]);
        assert_eq!(v[1].outcome, Outcome::Duplicate, "{hour}: {:?}", v[1]);
    }
}

#[tokio::test]
async fn a_search_miss_witnesses_absence_only_once_past_the_index_lag() {
    // Nothing was paid; a neighbour shows the account's keys live under the field.
    let unpaid = effect("charge:v1:ORD-36", &[]);
    let world = [unpaid.clone(), neighbour("charge:v1:ORD-37", &unpaid)];
    let sim = Sim::start(&world, WorldConfig::default()).await.unwrap();
    let p = stripe(&sim, json!({"use_events": false}));
    let c = look(&p, &sim, &unpaid).await;
    assert_eq!(c.outcome, Outcome::NotApplied, "{c:?}");
    assert!(c.is_final(), "{c:?}");
    let witness = c.certificate.and_then(|c| c.witness).expect("a witness");
    assert!(witness.contains("stripe.search"), "{witness}");
    // The same miss while the index may still lag is not proof.
    let p = stripe(&sim, json!({"use_events": false, "search_lag_secs": 86400}));
    let c = look(&p, &sim, &unpaid).await;
    assert!(!c.is_final() && c.provisional, "{c:?}");
    assert!(c.not_before.is_some_and(|t| t > now() + 3600.0), "{c:?}");
}

#[tokio::test]
async fn a_certificate_never_covers_time_that_had_not_happened_when_it_was_read() {
    // The call ended 130 s ago: past its own window and the visibility lag, but the lists'
    // window reaches 300 s of skew further, into the future. A second payment is made 5 s
    // from now, inside that future part.
    let t = now();
    let e = EffectSpec {
        key: "charge:v1:ORD-38".into(),
        created_at: t - 135.0,
        updated_at: t - 130.0,
        recorded: Recorded::Nothing,
        payments: vec![
            PaymentSpec {
                life: Life::Succeeded,
                amount: 2000,
                offset: 1.0,
                indexed: true,
            },
            PaymentSpec {
                life: Life::Succeeded,
                amount: 2000,
                offset: 140.0,
                indexed: true,
            },
        ],
    };
    let sim = Sim::start(std::slice::from_ref(&e), WorldConfig::default())
        .await
        .unwrap();
    let p = stripe(&sim, json!({"max_call_secs": 60, "skew_secs": 300}));
    let c = look(&p, &sim, &e).await;
    assert_eq!(c.outcome, Outcome::Applied, "{c:?}");
    assert!(!c.is_final() && c.provisional, "{c:?}");
    // It is read again once the whole window (skew included) and the lag are past.
    let window_end = e.updated_at + 60.0 + 300.0;
    assert!(
        c.not_before.is_some_and(|nb| nb >= window_end + 60.0),
        "{c:?}"
    );
}

#[tokio::test]
async fn calibration_finds_a_wrong_field_and_a_charges_only_list_and_widens_for_a_clock() {
    // 24 effects the application recorded as done, paid, an hour off the provider's clock;
    // and one unknown that was never paid.
    let done: Vec<EffectSpec> = (0..24u32)
        .map(|i| {
            let mut e = effect_at(&format!("charge:v1:DONE-{i}"), &[Life::Succeeded], 3600.0);
            e.created_at += f64::from(i) * 40.0;
            e.updated_at += f64::from(i) * 40.0;
            e
        })
        .collect();
    let mut unpaid = effect("charge:v1:ORD-39", &[]);
    unpaid.created_at += 500.0;
    unpaid.updated_at += 500.0;
    let mut world = done.clone();
    world.push(unpaid.clone());
    let samples: Vec<LookupQuery> = done
        .iter()
        .map(|e| LookupQuery {
            key: e.key.clone(),
            created_at: e.created_at,
            updated_at: e.updated_at,
            expires_at: None,
            response_json: None,
            now: now(),
            observed_at: None,
        })
        .collect();
    // Keys under the configured field, on PaymentIntents, the clock an hour off: widened.
    // No events; search is asked for payments made outside the window, but its miss is no
    // witness yet (its lag is a day here).
    let sim = Sim::start(&world, WorldConfig::default()).await.unwrap();
    let no_witness = json!({"use_events": false, "search_lag_secs": 86400});
    let p = stripe(&sim, no_witness.clone());
    let cal = p.calibrate(&samples).await.expect("stripe calibrates");
    assert_eq!(
        cal.status,
        reckon_providers::CalibrationStatus::Calibrated,
        "{cal:?}"
    );
    assert!(
        cal.widen_secs >= 3300.0 && cal.offset_p50_secs > 3500.0,
        "{cal:?}"
    );
    // Calibrated for the window it now reads: its complete list is proof on its own.
    let c = look(&p, &sim, &unpaid).await;
    assert_eq!(c.outcome, Outcome::NotApplied, "{c:?}");
    assert!(c.is_final(), "{c:?}");
    assert!(
        c.certificate
            .and_then(|c| c.witness)
            .is_some_and(|w| w.contains("calibrated")),
        "the certificate says what vouches for it"
    );
    let paid = &done[3];
    let c = look(&p, &sim, paid).await;
    assert_eq!(c.outcome, Outcome::Applied, "{c:?}");
    assert!(c.is_final(), "{c:?}");
    // A later run builds its provider anew and reuses the calibration: an unpaid effect in
    // a quiet hour, with no keyed object in its window, still concludes.
    let mut quiet = effect("charge:v1:ORD-40", &[]);
    quiet.created_at -= 20_000.0;
    quiet.updated_at -= 20_000.0;
    let later = stripe(&sim, no_witness.clone());
    later.set_calibration(cal.clone());
    let c = look(&later, &sim, &quiet).await;
    assert_eq!(c.outcome, Outcome::NotApplied, "{c:?}");
    assert!(c.is_final(), "{c:?}");
    // Without any key-indexed method, nothing looks outside the window (a worker that
    // resumed after its lease and paid later): calibrated or not, nothing is final.
    let p = stripe(&sim, json!({"use_events": false, "use_search": false}));
    p.calibrate(&samples).await.expect("stripe calibrates");
    let c = look(&p, &sim, &unpaid).await;
    assert!(!c.is_final(), "{c:?}");

    // A charges-only list: the PaymentIntents carry the keys.
    let p = stripe(
        &sim,
        json!({"use_events": false, "list_objects": ["charges"]}),
    );
    let cal = p.calibrate(&samples).await.expect("stripe calibrates");
    assert_eq!(
        cal.status,
        reckon_providers::CalibrationStatus::Uncalibrated,
        "{cal:?}"
    );
    assert!(cal.reason.contains("payment_intents"), "{}", cal.reason);
    let c = look(&p, &sim, &unpaid).await;
    assert!(!c.is_final(), "{c:?}");
    assert!(c.reason.contains("uncalibrated"), "{}", c.reason);

    // The application's key under another field.
    let sim = Sim::start(
        &world,
        WorldConfig {
            metadata_field: "order_ref".into(),
            ..WorldConfig::default()
        },
    )
    .await
    .unwrap();
    let p = stripe(&sim, no_witness);
    let cal = p.calibrate(&samples).await.expect("stripe calibrates");
    assert_eq!(
        cal.status,
        reckon_providers::CalibrationStatus::Uncalibrated,
        "{cal:?}"
    );
    assert!(cal.reason.contains("metadata_field"), "{}", cal.reason);
    let c = look(&p, &sim, &unpaid).await;
    assert!(!c.is_final(), "{c:?}");
}

#[tokio::test]
async fn calibration_never_widens_a_window_past_the_witness_span() {
    // Known-done effects whose payments carry their keys three days from the recorded
    // time: no application clock is that far off (or the keys were reused). Widening to it
    // would list days of the account for every lookup.
    let done: Vec<EffectSpec> = (0..24u32)
        .map(|i| {
            let mut e = effect_at(&format!("charge:v1:FAR-{i}"), &[Life::Succeeded], 0.0);
            e.created_at -= 3.0 * 86_400.0 - f64::from(i) * 40.0;
            e.updated_at = e.created_at + 5.0;
            // The payment at the "right" time in Stripe's clock: three days after the record.
            e.payments[0].offset = 3.0 * 86_400.0 - f64::from(i) * 40.0 - 7200.0;
            e
        })
        .collect();
    let sim = Sim::start(&done, WorldConfig::default()).await.unwrap();
    let p = stripe(&sim, json!({"use_events": false}));
    let samples: Vec<LookupQuery> = done
        .iter()
        .map(|e| LookupQuery {
            key: e.key.clone(),
            created_at: e.created_at,
            updated_at: e.updated_at,
            expires_at: None,
            response_json: None,
            now: now(),
            observed_at: None,
        })
        .collect();
    let cal = p.calibrate(&samples).await.expect("stripe calibrates");
    assert_eq!(
        cal.status,
        reckon_providers::CalibrationStatus::Uncalibrated,
        "{cal:?}"
    );
    assert_eq!(cal.widen_secs, 0.0, "{cal:?}");
    assert!(cal.reason.contains("witness_span_secs"), "{}", cal.reason);
    // Searches stay within their budget (10), whatever the misses.
    let searches = sim
        .log()
        .iter()
        .filter(|l| l.target.contains("/search"))
        .count();
    assert!(searches <= 10, "{searches} searches");
}

/// What a request asked: `list`, `events`, `search` or `retrieve`.
fn kind(target: &str) -> &'static str {
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

fn requests_by_kind(sim: &Sim) -> std::collections::BTreeMap<&'static str, usize> {
    let mut out = std::collections::BTreeMap::new();
    for l in sim.log() {
        *out.entry(kind(&l.target)).or_default() += 1;
    }
    out
}

/// A run looks up effects created seconds apart, one after another: the lists are read
/// ahead past each window (about a page at the density seen) and the events' newest
/// seconds wait for a later read, so the run reads each page about once; a payment listed
/// succeeded with its latest charge (refunds, dispute) is not read a second time. Every
/// verdict is still final and true.
#[tokio::test]
async fn a_runs_lookups_share_their_pages_and_a_settled_listed_payment_is_not_read_again() {
    let base = now() - 7200.0;
    let effects: Vec<EffectSpec> = (0..40)
        .map(|i| {
            let mut e = effect(&format!("charge:v1:RUN-{i}"), &[Life::Succeeded]);
            e.created_at = base + 7.0 * f64::from(i);
            e.updated_at = e.created_at + 5.0;
            e
        })
        .collect();
    let cfg = WorldConfig {
        page_size: 100,
        noise: 2,
        ..WorldConfig::default()
    };
    let sim = Sim::start(&effects, cfg).await.unwrap();
    sim.settle();
    let p = stripe(&sim, json!({"use_events": true, "use_search": false}));
    for e in &effects {
        let c = look(&p, &sim, e).await;
        assert_eq!(c.outcome, Outcome::Applied, "{}: {c:?}", e.key);
        assert!(c.is_final(), "{}: {c:?}", e.key);
    }
    let by_kind = requests_by_kind(&sim);
    // Two lists and the events, once each for the first effect; a few more pages as the
    // run moves past what was read ahead. Read per effect, it was 3 requests each and a
    // retrieve: 160.
    assert_eq!(by_kind.get("retrieve"), None, "{by_kind:?}");
    let total: usize = by_kind.values().sum();
    assert!(total <= 12, "{total} requests for 40 lookups: {by_kind:?}");
}

/// A payment the list shows in a state that can still change (processing, authorised
/// only) is read itself, however fresh the page.
#[tokio::test]
async fn a_listed_payment_that_can_still_change_is_read_itself() {
    let e = effect(
        "charge:v1:RUN-PENDING",
        &[Life::Processing { succeeds: true }],
    );
    let sim = Sim::start(std::slice::from_ref(&e), WorldConfig::default())
        .await
        .unwrap();
    let p = stripe(&sim, json!({"use_events": true, "use_search": false}));
    let c = look(&p, &sim, &e).await;
    assert!(!c.is_final(), "{c:?}");
    assert_eq!(
        requests_by_kind(&sim).get("retrieve"),
        Some(&1),
        "{:?}",
        sim.log()
    );
}

/// One search of two answers `has_more: true` with no hits (a partial view of the key):
/// the other search's whole miss does not stand in for it, and the verdict is not final.
/// The PaymentIntent still awaiting its customer's action lives only in the search that
/// came back partial.
#[tokio::test]
async fn a_partial_search_is_no_witness_even_beside_a_whole_one() {
    let mut e = effect(
        "charge:v1:ORD-PARTIAL",
        &[Life::Declined, Life::RequiresAction { succeeds: true }],
    );
    for p in &mut e.payments {
        p.indexed = true;
    }
    let cfg = WorldConfig {
        keys_on_charges: true,
        index_lag_secs: Some(3600.0),
        ..WorldConfig::default()
    };
    let sim = Sim::start(std::slice::from_ref(&e), cfg).await.unwrap();
    let p = stripe(
        &sim,
        json!({"list_objects": ["charges"], "use_events": false, "use_search": true}),
    );
    // The charges list (request 0), the search of charges (1), then of PaymentIntents (2).
    sim.fault_at(2, Fault::HasMoreWithoutCursor);
    let c = look(&p, &sim, &e).await;
    assert!(!c.is_final(), "{c:?}");
    let targets: Vec<String> = sim.log().iter().map(|l| l.target.clone()).collect();
    assert!(
        targets
            .get(2)
            .is_some_and(|t| t.starts_with("/v1/payment_intents/search")),
        "{targets:?}"
    );
}

/// A payment created in the seconds before a run's first read, which the lists do not show
/// yet (they lag), is not skipped by a later lookup of the same run: the first read is
/// remembered as covering time only up to its start less the visibility lag.
#[tokio::test]
async fn a_read_is_never_trusted_for_the_seconds_the_lists_could_not_show_yet() {
    let t = now();
    // A: a call that ends in the future, so its lookup reads the lists up to now.
    let a = EffectSpec {
        key: "charge:v1:ORD-LAG-A".into(),
        created_at: t - 10.0,
        updated_at: t - 8.0,
        recorded: Recorded::Nothing,
        payments: vec![],
    };
    // B: paid 1.5 s before A's lookup; its window (max call 14 s, skew 1 s) ends 1 s ago.
    let b = EffectSpec {
        key: "charge:v1:ORD-LAG-B".into(),
        created_at: t - 17.0,
        updated_at: t - 16.0,
        recorded: Recorded::Nothing,
        payments: vec![PaymentSpec {
            life: Life::Succeeded,
            amount: 2000,
            offset: 15.5,
            indexed: true,
        }],
    };
    let cfg = WorldConfig {
        list_lag_secs: 3.0,
        ..WorldConfig::default()
    };
    let sim = Sim::start(&[a.clone(), b.clone()], cfg).await.unwrap();
    sim.settle();
    // The lists alone: the events channel bounds its reads by the lag on its own.
    let p = stripe(
        &sim,
        json!({"max_call_secs": 14, "skew_secs": 1, "visibility_lag_secs": 3,
               "use_events": false, "use_search": false}),
    );
    never_a_false_final(&p, &sim, std::slice::from_ref(&a)).await;
    // B's window and the lag are past: the lists show its payment now.
    let wait = t + 6.0 - now();
    tokio::time::sleep(Duration::from_secs_f64(wait.max(0.0))).await;
    let c = never_a_false_final(&p, &sim, std::slice::from_ref(&b)).await;
    assert_eq!(c[0].outcome, Outcome::Applied, "{:?}", c[0]);
}
