//! The reconciler's API: providers and routes, reconcile one effect now, resolve
//! by hand with a required note, bulk re-lookup. A real ledger (SQLite file and a fresh
//! PostgreSQL database) and the demo provider on a real loopback port.

use crate::common;

use axum::Router;
use axum::http::{Method, StatusCode};
use common::{Backend, Reply, Req, World, send, token};
use reckon_ledger::Role;
use reckon_providers::demo::{DemoState, serve_loopback};
use reckon_web::{AppState, app};
use serde_json::{Value, json};
use std::sync::Arc;

const NOW_ISH: f64 = 1_700_000_000.0;

/// The app with an egress policy that lets providers on loopback be reached (the default
/// refuses loopback, as the next test shows).
fn app_allowing_loopback(w: &World) -> Router {
    let egress =
        reckon_sources::EgressPolicy::new(&["127.0.0.0/8".to_owned()], None).expect("policy");
    app(AppState {
        egress: Arc::new(egress),
        ..AppState::new(w.ledger.clone())
    })
}

async fn call(app: &Router, method: Method, uri: &str, token: &str, body: Option<Value>) -> Reply {
    send(
        app,
        method,
        uri,
        Req {
            token: Some(token),
            content_type: body.as_ref().map(|_| "application/json"),
            body: body.map(|b| b.to_string()).unwrap_or_default(),
            ..Default::default()
        },
    )
    .await
}

fn record(key: &str, state: &str, created_at: f64) -> Value {
    json!({
        "key": key, "state": state, "request_hash": "1:abc", "response": null,
        "attempts": 1, "created_at": created_at, "updated_at": created_at + 5.0,
    })
}

/// A push source `pay` with three unknown charges, a demo provider that charged `ORD-1`
/// once and `ORD-3` twice, a provider row and a route for `charge`.
async fn setup(w: &World, app: &Router) -> (DemoState, String) {
    let t = &w.token_a;
    let r = call(
        app,
        Method::POST,
        "/api/v1/sources",
        t,
        Some(json!({"name": "pay", "kind": "push"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let items = json!([
        record("charge:v1:ORD-1", "unknown", NOW_ISH),
        record("charge:v1:ORD-2", "unknown", NOW_ISH + 10.0),
        record("charge:v1:ORD-3", "unknown", NOW_ISH + 20.0),
        record("send_receipt:v1:ORD-1", "unknown", NOW_ISH + 30.0),
    ]);
    let r = call(
        app,
        Method::POST,
        "/api/v1/effects?source=pay",
        t,
        Some(items),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let demo = DemoState::new();
    demo.charge("charge:v1:ORD-1", 2000, "usd", NOW_ISH + 1.0);
    demo.charge("charge:v1:ORD-3", 500, "eur", NOW_ISH + 21.0);
    demo.charge("charge:v1:ORD-3", 500, "eur", NOW_ISH + 40.0);
    let (url, _server) = serve_loopback(demo.clone()).await.unwrap();
    let r = call(
        app,
        Method::POST,
        "/api/v1/providers",
        t,
        Some(
            json!({"name": "pay-demo", "kind": "demo", "secret": "s3cr3t-header-value",
                    "settings": {"base_url": url}}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert!(!r.text.contains("s3cr3t"), "a secret came back: {}", r.text);
    let r = call(
        app,
        Method::PUT,
        "/api/v1/routes",
        t,
        Some(json!({"source": "pay", "operation": "charge", "provider": "pay-demo"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["provider"], "pay-demo");
    (demo, url)
}

async fn reconcile_now_resolves_with_evidence_and_a_second_call_is_refused(backend: Backend) {
    let w = World::new(backend).await;
    let app = app_allowing_loopback(&w);
    let (_demo, _url) = setup(&w, &app).await;
    let t = &w.token_a;

    let r = call(
        &app,
        Method::POST,
        "/api/v1/effects/pay/charge:v1:ORD-1/reconcile",
        t,
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        (&r.json["outcome"], &r.json["resolved"]),
        (&json!("applied"), &json!(true))
    );
    let r = call(
        &app,
        Method::POST,
        "/api/v1/effects/pay/charge:v1:ORD-3/reconcile",
        t,
        None,
    )
    .await;
    assert_eq!(r.json["outcome"], "duplicate", "{}", r.text);
    let r = call(
        &app,
        Method::POST,
        "/api/v1/effects/pay/charge:v1:ORD-2/reconcile",
        t,
        None,
    )
    .await;
    assert_eq!(r.json["outcome"], "not_applied", "{}", r.text);
    // A receipt has no route: it stays unresolved and says why.
    let r = call(
        &app,
        Method::POST,
        "/api/v1/effects/pay/send_receipt:v1:ORD-1/reconcile",
        t,
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        (&r.json["outcome"], &r.json["resolved"]),
        (&json!("no_provider"), &json!(false))
    );

    // The detail shows the resolution with the provider's object as evidence.
    let r = call(
        &app,
        Method::GET,
        "/api/v1/effects/pay/charge:v1:ORD-1",
        t,
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let res = &r.json["reconcile"]["resolution"];
    assert_eq!(
        (&res["outcome"], &res["author"]),
        (&json!("applied"), &json!("reconciler"))
    );
    assert!(
        r.text.contains("demo_ch_"),
        "no provider object id in the evidence: {}",
        r.text
    );
    assert_eq!(
        r.json["reconcile"]["attempts"].as_array().map(Vec::len),
        Some(1)
    );
    assert!(
        r.json["replay_window"].is_null(),
        "a resolved effect has no open window"
    );

    // Resolved effects are no longer unresolved.
    let r = call(
        &app,
        Method::GET,
        "/api/v1/effects?unresolved=true",
        t,
        None,
    )
    .await;
    let keys: Vec<&str> = r.json["effects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["send_receipt:v1:ORD-1"], "{}", r.text);

    let r = call(
        &app,
        Method::POST,
        "/api/v1/effects/pay/charge:v1:ORD-1/reconcile",
        t,
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    let r = call(
        &app,
        Method::POST,
        "/api/v1/effects/pay/charge:v1:ORD-404/reconcile",
        t,
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    let r = call(
        &app,
        Method::POST,
        "/api/v1/effects/pay/charge:v1:ORD-1/explode",
        t,
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);

    // Another tenant sees none of it.
    let r = call(
        &app,
        Method::POST,
        "/api/v1/effects/pay/charge:v1:ORD-2/reconcile",
        &w.token_b,
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    let r = call(&app, Method::GET, "/api/v1/providers", &w.token_b, None).await;
    assert_eq!(r.json, json!({"providers": []}));
    w.finish().await;
}

#[tokio::test]
async fn reconcile_now_resolves_with_evidence_and_a_second_call_is_refused_sqlite() {
    reconcile_now_resolves_with_evidence_and_a_second_call_is_refused(Backend::Sqlite).await;
}

#[tokio::test]
async fn reconcile_now_resolves_with_evidence_and_a_second_call_is_refused_postgres() {
    reconcile_now_resolves_with_evidence_and_a_second_call_is_refused(Backend::Postgres).await;
}

#[tokio::test]
async fn a_resolution_by_hand_needs_a_note_and_a_conclusive_outcome_and_is_recorded_once() {
    let w = World::new(Backend::Sqlite).await;
    let app = app_allowing_loopback(&w);
    setup(&w, &app).await;
    let t = &w.token_a;
    let uri = "/api/v1/effects/pay/charge:v1:ORD-2/resolve";
    for (body, status) in [
        (
            json!({"outcome": "applied", "note": "   "}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (json!({"outcome": "applied"}), StatusCode::BAD_REQUEST),
        (
            json!({"outcome": "indeterminate", "note": "x"}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            json!({"outcome": "maybe", "note": "x"}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            json!({"outcome": "applied", "note": "x", "extra": 1}),
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let r = call(&app, Method::POST, uri, t, Some(body.clone())).await;
        assert_eq!(r.status, status, "{body}: {}", r.text);
        assert!(
            r.json["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{}",
            r.text
        );
    }
    // A viewer may not resolve; support may.
    let viewer = token(w.ledger.as_ref(), &w.a, Role::Viewer).await;
    let support = token(w.ledger.as_ref(), &w.a, Role::Support).await;
    let good =
        json!({"outcome": "not_applied", "note": "checked the provider dashboard: no charge"});
    let r = call(&app, Method::POST, uri, &viewer, Some(good.clone())).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
    let r = call(&app, Method::POST, uri, &support, Some(good.clone())).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(r.json["note"], "checked the provider dashboard: no charge");
    assert!(r.json["author"].as_str().unwrap().starts_with("token:"));
    assert!(r.json["evidence"]["frozen_at"].is_number(), "{}", r.text);
    let r = call(&app, Method::POST, uri, &support, Some(good)).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    // And the reconciler will not look it up again.
    let r = call(
        &app,
        Method::POST,
        "/api/v1/effects/pay/charge:v1:ORD-2/reconcile",
        t,
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    w.finish().await;
}

#[tokio::test]
async fn providers_are_checked_before_they_are_stored_and_secrets_never_come_back() {
    let w = World::new(Backend::Sqlite).await;
    let strict = w.app.clone(); // the default egress policy: loopback refused
    let t = &w.token_a;
    for (body, needle) in [
        (
            json!({"name": "x", "kind": "paypal"}),
            "is unknown: use stripe, http or demo",
        ),
        (
            json!({"name": "x", "kind": "demo", "settings": {"base_url": "http://example.com", "colour": 1}}),
            "colour",
        ),
        (json!({"name": "x", "kind": "stripe"}), "secret"),
        (
            json!({"name": "x", "kind": "demo", "settings": {"base_url": "http://127.0.0.1:9/"}}),
            "egress",
        ),
        (
            json!({"name": "x", "kind": "http", "settings": {"base_url": "http://169.254.169.254/"}}),
            "egress",
        ),
        (
            json!({"name": "x", "kind": "http", "settings": {"base_url": "file:///etc/passwd"}}),
            "http",
        ),
        (
            json!({"name": "x", "kind": "demo", "settings": "no"}),
            "object",
        ),
    ] {
        let r = call(
            &strict,
            Method::POST,
            "/api/v1/providers",
            t,
            Some(body.clone()),
        )
        .await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{body}: {}",
            r.text
        );
        assert!(
            r.text.contains(needle),
            "{body}: {} lacks {needle:?}",
            r.text
        );
    }
    let r = call(
        &strict,
        Method::POST,
        "/api/v1/providers",
        t,
        Some(
            json!({"name": "stripe-live", "kind": "stripe", "secret": "rk_live_abcdefSECRET",
                    "settings": {"account": "acct_1"}}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let r = call(
        &strict,
        Method::POST,
        "/api/v1/providers",
        t,
        Some(json!({"name": "stripe-live", "kind": "stripe", "secret": "rk_live_2"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    let r = call(&strict, Method::GET, "/api/v1/providers", t, None).await;
    assert_eq!(r.json["providers"][0]["has_secret"], true, "{}", r.text);
    assert!(!r.text.contains("SECRET"), "{}", r.text);
    // Only an admin manages providers; a viewer may read them.
    let viewer = token(w.ledger.as_ref(), &w.a, Role::Viewer).await;
    let r = call(
        &strict,
        Method::POST,
        "/api/v1/providers",
        &viewer,
        Some(json!({"name": "y", "kind": "stripe", "secret": "rk_live_3"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
    let r = call(&strict, Method::GET, "/api/v1/providers", &viewer, None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // Routes name existing sources and providers.
    let r = call(
        &strict,
        Method::PUT,
        "/api/v1/routes",
        t,
        Some(json!({"source": "nope", "operation": "charge", "provider": "stripe-live"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    w.finish().await;
}

#[tokio::test]
async fn the_replay_window_of_an_unresolved_effect_is_shown_and_bulk_requeue_counts() {
    let w = World::new(Backend::Sqlite).await;
    let app = app_allowing_loopback(&w);
    let (_demo, url) = setup(&w, &app).await;
    let t = &w.token_a;
    // A provider that forgets keys after an hour, for refunds, which it always fails to
    // answer (a closed port): indeterminate.
    let r = call(
        &app,
        Method::POST,
        "/api/v1/providers",
        t,
        Some(json!({"name": "refunds", "kind": "http",
                    "settings": {"base_url": "http://127.0.0.1:9/", "replay_window_secs": 3600.0}})),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let _ = url;
    let r = call(
        &app,
        Method::PUT,
        "/api/v1/routes",
        t,
        Some(json!({"source": "pay", "operation": "refund", "provider": "refunds"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let created = reckon_domain::time::now() - 600.0;
    let r = call(
        &app,
        Method::POST,
        "/api/v1/effects?source=pay",
        t,
        Some(json!([record("refund:v1:ORD-1", "unknown", created)])),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);

    let r = call(
        &app,
        Method::GET,
        "/api/v1/effects/pay/refund:v1:ORD-1",
        t,
        None,
    )
    .await;
    let w_ = &r.json["replay_window"];
    assert_eq!(w_["provider"], "refunds", "{}", r.text);
    assert!((w_["closes_at"].as_f64().unwrap() - (created + 3600.0)).abs() < 1e-6);
    let left = w_["seconds_left"].as_f64().unwrap();
    assert!(left > 2900.0 && left <= 3000.0, "{left}");

    let r = call(
        &app,
        Method::POST,
        "/api/v1/effects/pay/refund:v1:ORD-1/reconcile",
        t,
        None,
    )
    .await;
    assert_eq!(
        (&r.json["outcome"], &r.json["resolved"]),
        (&json!("indeterminate"), &json!(false)),
        "{}",
        r.text
    );
    let finance = token(w.ledger.as_ref(), &w.a, Role::Finance).await;
    let support = token(w.ledger.as_ref(), &w.a, Role::Support).await;
    let body = json!({"provider": "refunds", "from": created - 1.0, "to": created + 1.0});
    let r = call(
        &app,
        Method::POST,
        "/api/v1/reconcile/requeue",
        &support,
        Some(body.clone()),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
    let r = call(
        &app,
        Method::POST,
        "/api/v1/reconcile/requeue",
        &finance,
        Some(body),
    )
    .await;
    assert_eq!(
        (r.status, &r.json["requeued"]),
        (StatusCode::OK, &json!(1)),
        "{}",
        r.text
    );
    let r = call(
        &app,
        Method::POST,
        "/api/v1/reconcile/requeue",
        &finance,
        Some(json!({"provider": "refunds", "from": 5.0, "to": 1.0})),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    w.finish().await;
}
