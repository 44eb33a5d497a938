//! The audit log of people's actions: what admins, support and people signing in
//! did is recorded per tenant, readable by that tenant's admins only, and append-only.

use crate::common;

use axum::http::{Method, StatusCode};
use common::{Backend, Reply, Req, World, send, sign_in, token};
use reckon_ledger::Role;
use serde_json::{Value, json};

async fn call(w: &World, method: Method, uri: &str, token: &str, body: Option<Value>) -> Reply {
    send(
        &w.app,
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

async fn story(backend: Backend) {
    let w = World::new(backend).await;
    let t = w.token_a.clone();
    let r = call(
        &w,
        Method::POST,
        "/api/v1/sources",
        &t,
        Some(json!({"name": "pay", "kind": "push"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let r = call(
        &w,
        Method::POST,
        "/api/v1/providers",
        &t,
        Some(json!({"name": "stripe-live", "kind": "stripe", "secret": "rk_live_auditcanary"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let r = call(
        &w,
        Method::PUT,
        "/api/v1/routes",
        &t,
        Some(json!({"source": "pay", "operation": "charge", "provider": "stripe-live"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = call(
        &w,
        Method::POST,
        "/api/v1/effects?source=pay",
        &t,
        Some(json!([{
        "key": "charge:v1:ORD-1", "state": "unknown", "request_hash": "1:a", "response": null,
        "attempts": 1, "created_at": 1_700_000_000.0, "updated_at": 1_700_000_001.0}])),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = call(
        &w,
        Method::POST,
        "/api/v1/effects/pay/charge:v1:ORD-1/resolve",
        &t,
        Some(json!({"outcome": "applied", "note": "seen in the dashboard"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let r = call(
        &w,
        Method::POST,
        "/api/v1/tokens",
        &t,
        Some(json!({"role": "viewer", "label": "ci"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let made = r.json["id"].as_i64().unwrap();
    let r = call(
        &w,
        Method::DELETE,
        &format!("/api/v1/tokens/{made}"),
        &t,
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text);
    // A failed and a good sign-in by alice (acme's admin).
    let r = sign_in(&w.app, "alice@acme.test", "wrong password", &[]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    // A failure's line is written after its answer: wait for it (bounded).
    for _ in 0..300 {
        let actions = w.ledger.list_actions(w.a.id, None, 50).await.unwrap();
        if actions.iter().any(|a| a.action == "signin_failed") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let r = sign_in(&w.app, "alice@acme.test", common::PASSWORD, &[]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);

    let r = call(&w, Method::GET, "/api/v1/audit-log", &t, None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let actions: Vec<(String, Option<String>)> = r.json["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["action"].as_str().unwrap().to_owned(),
                a["target"].as_str().map(str::to_owned),
            )
        })
        .collect();
    let words: Vec<&str> = actions.iter().map(|(a, _)| a.as_str()).collect();
    assert_eq!(
        words,
        [
            "signin",
            "signin_failed",
            "token.revoke",
            "token.create",
            "effect.resolve",
            "route.set",
            "provider.add",
            "source.add"
        ],
        "newest first: {}",
        r.text
    );
    assert!(actions.contains(&("effect.resolve".into(), Some("pay/charge:v1:ORD-1".into()))));
    // Sign-ins name the person, not a row id.
    for a in &r.json["actions"].as_array().unwrap()[..2] {
        assert_eq!(a["actor"], "user:alice@acme.test", "{a}");
    }
    assert!(
        r.text.contains("seen in the dashboard"),
        "the note is in the log"
    );
    assert!(
        !r.text.contains("auditcanary"),
        "a secret reached the audit log: {}",
        r.text
    );
    // Paging.
    let r = call(&w, Method::GET, "/api/v1/audit-log?limit=3", &t, None).await;
    assert_eq!(r.json["actions"].as_array().unwrap().len(), 3);
    let next = r.json["next"].as_i64().expect("a next page");
    let r = call(
        &w,
        Method::GET,
        &format!("/api/v1/audit-log?before={next}&limit=100"),
        &t,
        None,
    )
    .await;
    assert_eq!(r.json["actions"].as_array().unwrap().len(), 5, "{}", r.text);
    // What happened to one target: a token's two lines, newest first.
    let r = call(
        &w,
        Method::GET,
        &format!("/api/v1/audit-log?target=token:{made}"),
        &t,
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let on: Vec<&str> = r.json["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["action"].as_str().unwrap())
        .collect();
    assert_eq!(on, ["token.revoke", "token.create"], "{}", r.text);
    assert!(r.json["actions"][0]["detail"]["via"] == "api", "{}", r.text);

    // Admins only; another tenant sees its own (empty) log.
    let finance = token(w.ledger.as_ref(), &w.a, Role::Finance).await;
    let r = call(&w, Method::GET, "/api/v1/audit-log", &finance, None).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
    let r = call(&w, Method::GET, "/api/v1/audit-log", &w.token_b, None).await;
    assert_eq!(r.json["actions"], json!([]), "{}", r.text);
    w.finish().await;
}

#[tokio::test]
async fn people_s_actions_are_logged_for_the_tenant_s_admins_on_sqlite() {
    story(Backend::Sqlite).await;
}

#[tokio::test]
async fn people_s_actions_are_logged_for_the_tenant_s_admins_on_postgres() {
    story(Backend::Postgres).await;
}
