//! A viewer sees summaries (counts, ages, health), never a record: no key, no response
//! body, no quarantined row, on the API as on the pages (`dashboard.rs`). Support and
//! above read the records.

use crate::common;

use axum::http::{Method, StatusCode};
use common::{Backend, Reply, Req, World, send, token};
use reckon_ledger::Role;
use serde_json::json;

async fn get(w: &World, token: &str, uri: &str) -> Reply {
    send(
        &w.app,
        Method::GET,
        uri,
        Req {
            token: Some(token),
            ..Default::default()
        },
    )
    .await
}

#[tokio::test]
async fn a_viewer_token_reads_summaries_and_no_record() {
    let w = World::new(Backend::Sqlite).await;
    let admin = w.token_a.clone();
    for (uri, body) in [(
        "/api/v1/sources",
        json!({"name": "payments", "kind": "push"}),
    )] {
        let r = send(
            &w.app,
            Method::POST,
            uri,
            Req {
                token: Some(&admin),
                content_type: Some("application/json"),
                body: body.to_string(),
                ..Default::default()
            },
        )
        .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    }
    let items = json!([
        {"key": "charge:v1:ORD-SECRETKEY", "state": "unknown", "request_hash": "1:h",
         "response": {"card": "4242-body"}, "attempts": 1,
         "created_at": 1_700_000_000.0, "updated_at": 1_700_000_001.0},
        {"key": "charge:v1:ORD-BAD", "state": "weird", "request_hash": "1:h",
         "attempts": 1, "created_at": 1_700_000_000.0, "updated_at": 1_700_000_001.0},
    ]);
    let r = send(
        &w.app,
        Method::POST,
        "/api/v1/effects?source=payments",
        Req {
            token: Some(&admin),
            content_type: Some("application/json"),
            body: items.to_string(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);

    let viewer = token(w.ledger.as_ref(), &w.a, Role::Viewer).await;
    for uri in [
        "/api/v1/effects",
        "/api/v1/effects?unresolved=true",
        "/api/v1/sources/payments/quarantine",
        "/api/v1/lookup?q=ORD-SECRETKEY",
        "/api/v1/effects/payments/charge:v1:ORD-SECRETKEY",
    ] {
        let r = get(&w, &viewer, uri).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{uri}: {}", r.text);
        assert!(
            !r.text.contains("SECRETKEY") && !r.text.contains("4242"),
            "{uri}"
        );
    }
    for uri in [
        "/api/v1/sources",
        "/api/v1/quarantine",
        "/api/v1/metrics",
        "/api/v1/providers",
        "/api/v1/routes",
    ] {
        let r = get(&w, &viewer, uri).await;
        assert_eq!(r.status, StatusCode::OK, "{uri}: {}", r.text);
        assert!(
            !r.text.contains("SECRETKEY")
                && !r.text.contains("4242")
                && !r.text.contains("ORD-BAD"),
            "{uri}: {}",
            r.text
        );
    }
    let support = token(w.ledger.as_ref(), &w.a, Role::Support).await;
    let r = get(&w, &support, "/api/v1/effects").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.text.contains("ORD-SECRETKEY"), "{}", r.text);
    let r = get(&w, &support, "/api/v1/sources/payments/quarantine").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.text.contains("ORD-BAD"), "{}", r.text);
    w.finish().await;
}
