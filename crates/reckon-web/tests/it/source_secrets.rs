//! A source's stored password is sent nowhere weaker than where it was given, and the
//! connection test is no oracle for it. On both ledgers, through the real router.
//!
//! - An edit that weakens the DSN's transport (TLS dropped, `sslmode` removed, the
//!   certificate or host name no longer checked) needs the password again, as a new host
//!   does; the settings page shows each source's transport.
//! - A connection test that fails on a table named like a guess of the password answers
//!   the same sentence whether the guess is right or wrong (it used to cut the stored
//!   password out of the server's message, which quoted the table name).

use crate::common;

use axum::http::{Method, StatusCode};
use common::{Backend, Reply, Req, World, send};
use serde_json::{Value, json};
use std::sync::Arc;

const STORED: &str = "hunter2";

async fn call(w: &World, app: &axum::Router, method: Method, uri: &str, body: Value) -> Reply {
    send(
        app,
        method,
        uri,
        Req {
            token: Some(&w.token_a),
            content_type: Some("application/json"),
            body: body.to_string(),
            ..Default::default()
        },
    )
    .await
}

async fn weaker_transport(backend: Backend) {
    let w = World::new(backend).await;
    let app = w.app.clone();
    let r = call(
        &w,
        &app,
        Method::POST,
        "/api/v1/sources",
        json!({"name": "shop", "kind": "postgres",
               "dsn": format!("postgres://app:{STORED}@93.184.216.34:5432/shop?sslmode=verify-full")}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(
        r.json["dsn_display"], "postgres://app@93.184.216.34:5432/shop?sslmode=verify-full",
        "{}",
        r.text
    );
    for dsn in [
        "postgres://app@93.184.216.34:5432/shop?sslmode=disable",
        "postgres://app@93.184.216.34:5432/shop?sslmode=prefer",
        "postgres://app@93.184.216.34:5432/shop?sslmode=require",
        "postgres://app@93.184.216.34:5432/shop",
    ] {
        let r = call(
            &w,
            &app,
            Method::PATCH,
            "/api/v1/sources/shop",
            json!({ "dsn": dsn }),
        )
        .await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{dsn}: {}",
            r.text
        );
        assert!(r.text.contains("password again"), "{dsn}: {}", r.text);
    }
    // The display sent back keeps the password; a weaker transport with it given is taken.
    let r = call(
        &w,
        &app,
        Method::PATCH,
        "/api/v1/sources/shop",
        json!({"dsn": "postgres://app@93.184.216.34:5432/shop?sslmode=verify-full"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let (cookie, _) = common::session(&app, "alice@acme.test").await;
    let page = send(
        &app,
        Method::GET,
        "/t/acme/settings",
        Req {
            cookie: Some(&cookie),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        page.text
            .contains("transport: TLS, the certificate and the host name checked"),
        "{}",
        page.text
    );
    let r = call(
        &w,
        &app,
        Method::PATCH,
        "/api/v1/sources/shop",
        json!({"dsn": "postgres://app@93.184.216.34:5432/shop?sslmode=disable",
               "password": "a new one"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let page = send(
        &app,
        Method::GET,
        "/t/acme/settings",
        Req {
            cookie: Some(&cookie),
            ..Default::default()
        },
    )
    .await;
    assert!(
        page.text
            .contains("transport: no TLS: the password and data travel in clear"),
        "{}",
        page.text
    );
    w.finish().await;
}

#[tokio::test]
async fn a_weaker_transport_needs_the_password_again_on_sqlite() {
    weaker_transport(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_weaker_transport_needs_the_password_again_on_postgres() {
    weaker_transport(Backend::Postgres).await;
}

/// The source is the test PostgreSQL server (trust authentication: it lets the DSN's
/// password pass), so the probe connects and fails on the table the admin named.
async fn no_oracle(backend: Backend) {
    let w = World::new(backend).await;
    let egress = reckon_sources::EgressPolicy::new(&["127.0.0.0/8".to_owned()], None).unwrap();
    let app = reckon_web::app(reckon_web::AppState {
        egress: Arc::new(egress),
        ..reckon_web::AppState::new(w.ledger.clone())
    });
    let r = call(
        &w,
        &app,
        Method::POST,
        "/api/v1/sources",
        json!({"name": "shop", "kind": "postgres",
               "dsn": format!("postgres://postgres:{STORED}@127.0.0.1:5432/test")}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let mut said = Vec::new();
    for guess in [STORED, "hunter3", "letmein"] {
        let r = call(
            &w,
            &app,
            Method::PATCH,
            "/api/v1/sources/shop",
            json!({ "table": guess }),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        let r = call(
            &w,
            &app,
            Method::POST,
            "/api/v1/sources/shop/test",
            json!({}),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        assert_eq!(r.json["ok"], false, "{}", r.text);
        let message = r.json["message"].as_str().unwrap().to_owned();
        assert!(!message.contains("redacted"), "{message}");
        said.push(message.replace(guess, "GUESS"));
    }
    assert!(
        said.windows(2).all(|p| p[0] == p[1]),
        "the answer depends on the guess: {said:?}"
    );
    assert!(said[0].contains("table"), "{}", said[0]);
    w.finish().await;
}

#[tokio::test]
async fn a_connection_test_is_no_password_oracle_on_sqlite() {
    no_oracle(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_connection_test_is_no_password_oracle_on_postgres() {
    no_oracle(Backend::Postgres).await;
}
