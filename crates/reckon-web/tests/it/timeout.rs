//! The API's request deadline: a request that runs past `request_timeout` is stopped and
//! answered 503 with the JSON error body, while quick requests are untouched. The slow
//! request is a real one: a provider test against an http provider on loopback that
//! accepts the connection and never answers.

use crate::common;

use axum::http::{Method, StatusCode};
use common::{Backend, Req, World, send};
use reckon_web::{AppState, app};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[tokio::test]
async fn a_request_past_the_deadline_gets_503_with_the_error_body() {
    let w = World::new(Backend::Sqlite).await;
    // A server that takes every connection and says nothing.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    let egress =
        reckon_sources::EgressPolicy::new(&["127.0.0.0/8".to_owned()], None).expect("policy");
    let app = app(AppState {
        egress: Arc::new(egress),
        request_timeout: Duration::from_millis(300),
        ..AppState::new(w.ledger.clone())
    });
    let token = w.token_a.as_str();
    let r = send(
        &app,
        Method::POST,
        "/api/v1/providers",
        Req {
            token: Some(token),
            content_type: Some("application/json"),
            body: json!({
                "name": "silent",
                "kind": "http",
                "settings": {"base_url": format!("http://127.0.0.1:{port}/")},
            })
            .to_string(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);

    let started = Instant::now();
    let r = send(
        &app,
        Method::POST,
        "/api/v1/providers/silent/test",
        Req {
            token: Some(token),
            ..Default::default()
        },
    )
    .await;
    let took = started.elapsed();
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text);
    assert_eq!(
        r.headers.get("content-type").unwrap(),
        "application/json",
        "{:?}",
        r.headers
    );
    let error = r.json["error"].as_str().expect("the JSON error body");
    assert!(error.contains("0.3 s"), "{error}");
    assert_eq!(r.json.as_object().unwrap().len(), 1, "{}", r.json);
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(5),
        "answered after {took:?}"
    );

    // A quick request on the same app is not affected.
    let r = send(
        &app,
        Method::GET,
        "/api/v1/providers",
        Req {
            token: Some(token),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    silent.abort();
    w.finish().await;
}
