//! A NUL character anywhere in a request (path, query, form, JSON body) is refused with a
//! 400 that names the field, on both ledgers, before any ledger query (PostgreSQL `text`
//! cannot hold one); in a push, only the item holding one is rejected.

use crate::common;

use axum::http::{Method, StatusCode};
use common::{Backend, Req, World, same_origin, send};
use serde_json::{Value, json};

fn json_req<'a>(token: &'a str, body: &Value) -> Req<'a> {
    Req {
        token: Some(token),
        content_type: Some("application/json"),
        body: body.to_string(),
        ..Default::default()
    }
}

/// Page text with askama's escaping of quotes undone, to find `"field"` in it.
fn unescaped(html: &str) -> String {
    html.replace("&quot;", "\"")
        .replace("&#34;", "\"")
        .replace("&#x22;", "\"")
}

fn record(key: &str, request_hash: &str, updated_at: f64) -> Value {
    json!({
        "key": key,
        "state": "unknown",
        "request_hash": request_hash,
        "response": null,
        "attempts": 1,
        "created_at": 1_700_000_000.0,
        "updated_at": updated_at,
    })
}

async fn every_field_refuses_a_nul(backend: Backend) {
    let w = World::new(backend).await;
    let t = w.token_a.as_str();
    let r = send(
        &w.app,
        Method::POST,
        "/api/v1/sources",
        json_req(t, &json!({"name": "payments", "kind": "push"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let r = send(
        &w.app,
        Method::POST,
        "/api/v1/effects?source=payments",
        json_req(
            t,
            &json!([record("charge:v1:ORD-1", "1:abc", 1_700_000_001.0)]),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let (session, csrf) = common::session(&w.app, "alice@acme.test").await;

    let api: Vec<(Method, &str, Option<Value>, &str)> = vec![
        (
            Method::POST,
            "/api/v1/sources",
            Some(json!({"name": "pay\u{0}", "kind": "push"})),
            "\"name\"",
        ),
        (
            Method::PATCH,
            "/api/v1/sources/payments",
            Some(json!({"scan_interval": "5m\u{0}"})),
            "\"scan_interval\"",
        ),
        (Method::GET, "/api/v1/lookup?q=ORD%00-1", None, "\"q\""),
        (
            Method::GET,
            "/api/v1/effects?source=pay%00",
            None,
            "\"source\"",
        ),
        (
            Method::GET,
            "/api/v1/effects/payments/charge:v1:ORD%00-1",
            None,
            "\"key\"",
        ),
        (
            Method::GET,
            "/api/v1/sources/pay%00ments/quarantine",
            None,
            "\"name\"",
        ),
        (
            Method::POST,
            "/api/v1/effects/payments/charge:v1:ORD-1/resolve",
            Some(json!({"outcome": "applied", "note": "seen in\u{0} stripe"})),
            "\"note\"",
        ),
        (
            Method::POST,
            "/api/v1/providers",
            Some(json!({"name": "p\u{0}", "kind": "demo"})),
            "\"name\"",
        ),
        (
            Method::POST,
            "/api/v1/tokens",
            Some(json!({"role": "viewer", "label": "ci\u{0}"})),
            "\"label\"",
        ),
        (
            Method::PUT,
            "/api/v1/routes",
            Some(json!({"source": "payments", "operation": "charge\u{0}", "provider": null})),
            "\"operation\"",
        ),
    ];
    for (method, uri, body, field) in api {
        let req = match &body {
            Some(b) => json_req(t, b),
            None => Req {
                token: Some(t),
                ..Default::default()
            },
        };
        let r = send(&w.app, method.clone(), uri, req).await;
        assert_eq!(
            r.status,
            StatusCode::BAD_REQUEST,
            "{method} {uri}: {}",
            r.text
        );
        let error = r.json["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(field) && error.contains("NUL"),
            "{method} {uri}: {error}"
        );
    }

    // Sign-in (a form) and dashboard pages (query, path, form): HTML 400 naming the field.
    let signin = common::sign_in(&w.app, "alice\u{0}@acme.test", "x", &[]).await;
    assert_eq!(signin.status, StatusCode::BAD_REQUEST, "{}", signin.text);
    assert!(
        unescaped(&signin.text).contains("\"email\""),
        "{}",
        signin.text
    );
    for (uri, field) in [
        ("/t/acme/lookup?q=ORD%00", "\"q\""),
        ("/t/ac%00me", "\"tenant\""),
        ("/t/acme/effects/payments/charge:v1:ORD%00-1", "\"key\""),
    ] {
        let r = send(
            &w.app,
            Method::GET,
            uri,
            Req {
                cookie: Some(&session),
                ..Default::default()
            },
        )
        .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{uri}: {}", r.text);
        let text = unescaped(&r.text);
        assert!(
            text.contains(field) && text.contains("NUL"),
            "{uri}: {}",
            r.text
        );
    }
    let r = send(
        &w.app,
        Method::POST,
        "/t/acme/resolve/payments/charge:v1:ORD-1",
        Req {
            cookie: Some(&session),
            headers: same_origin(),
            content_type: Some("application/x-www-form-urlencoded"),
            body: common::form(&[("csrf", &csrf), ("outcome", "applied"), ("note", "a\u{0}b")]),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(unescaped(&r.text).contains("\"note\""), "{}", r.text);

    // Nothing was stored: one source, no provider, the effect unresolved.
    let r = send(
        &w.app,
        Method::GET,
        "/api/v1/sources",
        Req {
            token: Some(t),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        r.json["sources"].as_array().map(Vec::len),
        Some(1),
        "{}",
        r.text
    );
    let r = send(
        &w.app,
        Method::GET,
        "/api/v1/providers",
        Req {
            token: Some(t),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        r.json["providers"].as_array().map(Vec::len),
        Some(0),
        "{}",
        r.text
    );
    let r = send(
        &w.app,
        Method::GET,
        "/api/v1/effects?unresolved=true",
        Req {
            token: Some(t),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        r.json["effects"].as_array().map(Vec::len),
        Some(1),
        "{}",
        r.text
    );
    w.finish().await;
}

async fn a_push_item_with_a_nul_fails_alone(backend: Backend) {
    let w = World::new(backend).await;
    let t = w.token_a.as_str();
    let r = send(
        &w.app,
        Method::POST,
        "/api/v1/sources",
        json_req(t, &json!({"name": "payments", "kind": "push"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let items = json!([
        record("charge:v1:ORD-1", "1:abc", 1_700_000_001.0),
        record("charge:v1:ORD-\u{0}2", "1:abc", 1_700_000_001.0),
        record("charge:v1:ORD-3", "1:abc", 1_700_000_001.0),
        record("charge:v1:ORD-4", "1:a\u{0}bc", 1_700_000_001.0),
    ]);
    for (content_type, body) in [
        ("application/json", items.to_string()),
        (
            "application/x-ndjson",
            items
                .as_array()
                .unwrap()
                .iter()
                .map(Value::to_string)
                .collect::<Vec<_>>()
                .join("\n"),
        ),
    ] {
        let r = send(
            &w.app,
            Method::POST,
            "/api/v1/effects?source=payments",
            Req {
                token: Some(t),
                content_type: Some(content_type),
                body,
                ..Default::default()
            },
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{content_type}: {}", r.text);
        let results = r.json["results"].as_array().unwrap();
        let statuses: Vec<&str> = results
            .iter()
            .map(|i| i["status"].as_str().unwrap())
            .collect();
        let first = content_type == "application/json";
        let stored = if first { "created" } else { "unchanged" };
        assert_eq!(
            statuses,
            [stored, "rejected", stored, "rejected"],
            "{}",
            r.text
        );
        assert_eq!(results[1]["reason"], "nul_byte");
        assert_eq!(results[3]["reason"], "nul_byte");
        assert!(
            results[3]["error"]
                .as_str()
                .unwrap()
                .contains("request_hash")
        );
    }
    let r = send(
        &w.app,
        Method::GET,
        "/api/v1/sources/payments/quarantine",
        Req {
            token: Some(t),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let entries = r.json["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 2, "{}", r.text);
    assert!(entries.iter().all(|e| e["reason"] == "nul_byte"));
    let r = send(
        &w.app,
        Method::GET,
        "/api/v1/effects",
        Req {
            token: Some(t),
            ..Default::default()
        },
    )
    .await;
    let mut keys: Vec<&str> = r.json["effects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["key"].as_str().unwrap())
        .collect();
    keys.sort();
    assert_eq!(keys, ["charge:v1:ORD-1", "charge:v1:ORD-3"]);
    w.finish().await;
}

#[tokio::test]
async fn a_nul_in_any_field_is_a_400_naming_it_on_sqlite() {
    every_field_refuses_a_nul(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_nul_in_any_field_is_a_400_naming_it_on_postgres() {
    every_field_refuses_a_nul(Backend::Postgres).await;
}

#[tokio::test]
async fn a_push_item_holding_a_nul_is_rejected_alone_on_sqlite() {
    a_push_item_with_a_nul_fails_alone(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_push_item_holding_a_nul_is_rejected_alone_on_postgres() {
    a_push_item_with_a_nul_fails_alone(Backend::Postgres).await;
}
