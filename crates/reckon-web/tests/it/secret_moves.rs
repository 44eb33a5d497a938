//! A stored secret goes only where it went before: changing where a DSN's password or a
//! provider's key would be sent (a DSN's host, port, user or database; a provider's base
//! URL) needs the secret given again, so an admin cannot read one back by pointing it at a
//! server of their own and asking for a probe. A live Stripe key is only sent over https.
//! The servers here listen on loopback and record what reaches them.

use crate::common;

use axum::http::{Method, StatusCode};
use common::{Backend, Reply, Req, World, send};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A server on loopback that records the head of every request (or the first bytes of
/// any connection) and answers 500.
async fn recorder() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let n = tokio::time::timeout(std::time::Duration::from_secs(2), s.read(&mut buf))
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .unwrap_or(0);
                log.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&buf[..n]).into_owned());
                let _ = s
                    .write_all(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n")
                    .await;
            });
        }
    });
    (port, seen)
}

async fn call(app: &axum::Router, token: &str, method: Method, uri: &str, body: Value) -> Reply {
    send(
        app,
        method,
        uri,
        Req {
            token: Some(token),
            content_type: Some("application/json"),
            body: body.to_string(),
            ..Default::default()
        },
    )
    .await
}

/// An app on `w`'s ledger whose egress policy allows loopback, where these servers are.
fn app(w: &World) -> axum::Router {
    reckon_web::app(reckon_web::AppState {
        egress: Arc::new(reckon_sources::EgressPolicy::new(&["127.0.0.0/8".into()], None).unwrap()),
        ..reckon_web::AppState::new(w.ledger.clone())
    })
}

#[tokio::test]
async fn a_dsn_moved_to_another_host_needs_its_password_again() {
    let w = World::new(Backend::Sqlite).await;
    let app = app(&w);
    let t = w.token_a.as_str();
    let (port, seen) = recorder().await;
    // Stored with its password, pointing at a closed port.
    let r = call(
        &app,
        t,
        Method::POST,
        "/api/v1/sources",
        json!({"name": "shop", "kind": "postgres",
               "dsn": "postgres://app:hunter2@127.0.0.1:1/shop?sslmode=disable"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    // To the recording server, without the password: refused, nothing changed...
    let moved = format!("postgres://app@127.0.0.1:{port}/shop?sslmode=disable");
    let r = call(
        &app,
        t,
        Method::PATCH,
        "/api/v1/sources/shop",
        json!({"dsn": moved}),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert!(r.text.contains("password again"), "{}", r.text);
    // ...so a probe still goes to the closed port, and the server hears nothing.
    let r = call(
        &app,
        t,
        Method::POST,
        "/api/v1/sources/shop/test",
        json!({}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["ok"], false, "{}", r.text);
    assert!(
        seen.lock().unwrap().is_empty(),
        "{:?}",
        seen.lock().unwrap()
    );
    // With a password given, the DSN moves (and the new password is what it carries).
    let r = call(
        &app,
        t,
        Method::PATCH,
        "/api/v1/sources/shop",
        json!({"dsn": moved, "password": "given-again"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = call(
        &app,
        t,
        Method::POST,
        "/api/v1/sources/shop/test",
        json!({}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(!seen.lock().unwrap().is_empty(), "the moved DSN is used");
    w.finish().await;
}

#[tokio::test]
async fn a_provider_moved_to_another_base_url_needs_its_secret_again() {
    let w = World::new(Backend::Sqlite).await;
    let app = app(&w);
    let t = w.token_a.as_str();
    let (port, seen) = recorder().await;
    let r = call(
        &app,
        t,
        Method::POST,
        "/api/v1/providers",
        json!({"name": "ledger-svc", "kind": "http", "secret": "Bearer canary-key-5s1",
               "settings": {"base_url": "http://127.0.0.1:1/", "auth_header": "Authorization"}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let moved = json!({"settings": {"base_url": format!("http://127.0.0.1:{port}/"),
                                    "auth_header": "Authorization"}});
    let r = call(
        &app,
        t,
        Method::PATCH,
        "/api/v1/providers/ledger-svc",
        moved.clone(),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert!(r.text.contains("secret again"), "{}", r.text);
    let r = call(
        &app,
        t,
        Method::POST,
        "/api/v1/providers/ledger-svc/test",
        json!({}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(
        seen.lock()
            .unwrap()
            .iter()
            .all(|h| !h.contains("canary-key")),
        "{:?}",
        seen.lock().unwrap()
    );
    assert!(
        seen.lock().unwrap().is_empty(),
        "{:?}",
        seen.lock().unwrap()
    );
    // Other settings change without the secret; a new base URL with one.
    let r = call(
        &app,
        t,
        Method::PATCH,
        "/api/v1/providers/ledger-svc",
        json!({"settings": {"base_url": "http://127.0.0.1:1/", "auth_header": "X-Key"}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let mut with_secret = moved.clone();
    with_secret["secret"] = json!("Bearer new-key");
    let r = call(
        &app,
        t,
        Method::PATCH,
        "/api/v1/providers/ledger-svc",
        with_secret,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    w.finish().await;
}

#[tokio::test]
async fn a_live_stripe_key_is_only_sent_over_https() {
    let w = World::new(Backend::Sqlite).await;
    let app = app(&w);
    let t = w.token_a.as_str();
    let (port, seen) = recorder().await;
    let plain = format!("http://127.0.0.1:{port}/");
    for body in [
        json!({"name": "s1", "kind": "stripe", "secret": "rk_live_canary",
               "settings": {"base_url": plain}}),
        json!({"name": "s2", "kind": "stripe", "secret": "rk_live_canary",
               "settings": {"base_url": plain, "mode": "live"}}),
        json!({"name": "s3", "kind": "stripe", "secret": "rk_live_canary",
               "settings": {"base_url": plain, "mode": "test"}}),
    ] {
        let r = call(&app, t, Method::POST, "/api/v1/providers", body.clone()).await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{body}: {}",
            r.text
        );
        assert!(r.text.contains("https"), "{body}: {}", r.text);
    }
    // A test key in test mode may use a local stand-in over http.
    let r = call(
        &app,
        t,
        Method::POST,
        "/api/v1/providers",
        json!({"name": "s4", "kind": "stripe", "secret": "rk_test_local",
               "settings": {"base_url": plain, "mode": "test"}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    // A live one over https, then moved to http with its key given again: refused.
    let r = call(
        &app,
        t,
        Method::POST,
        "/api/v1/providers",
        json!({"name": "live", "kind": "stripe", "secret": "rk_live_canary"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let r = call(
        &app,
        t,
        Method::PATCH,
        "/api/v1/providers/live",
        json!({"secret": "rk_live_canary", "settings": {"base_url": plain}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert!(
        seen.lock().unwrap().is_empty(),
        "{:?}",
        seen.lock().unwrap()
    );
    w.finish().await;
}
