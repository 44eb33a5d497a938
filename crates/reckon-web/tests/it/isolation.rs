//! Tenant isolation over every route of the router (T01, T02, T24 of the security
//! checklist): the sweep reads the route registry (`reckon_web::routes::ROUTES`), which the
//! router's guard enforces (a route missing from it answers 500), and calls each route with
//! tenant A's object names:
//!
//! - without credentials: token routes 401, session routes redirect to /signin;
//! - with tenant B's token and with tenant B's session: refused (401/403/404/3xx) or an
//!   answer that holds nothing of tenant A;
//! - afterwards tenant A's source, effect and token are all still there and unchanged.
//!
//! A new route needs a request in `sweep/mod.rs` ([`request_for`]) or the sweep fails:
//! that is the point. Run on both ledgers.

use crate::common;
use crate::sweep;

use axum::http::{Method, StatusCode};
use common::{Backend, Req, World, same_origin, send, session};
use reckon_web::routes::{Access, ROUTES};
use serde_json::json;
use sweep::{A_KEY, A_PROVIDER, A_SOURCE, CANARY, Fixture, method, request_for};

/// Tenant A's audit run, with the canary in a finding and in its evidence.
async fn seed_audit_a(w: &World) -> i64 {
    let run = reckon_ledger::NewAuditRun {
        day: "2023-11-14".into(),
        time_zone: "UTC".into(),
        window_start: 1_699_920_000.0,
        window_end: 1_700_006_400.0,
        provider: "*".into(),
        triggered_by: "operator".into(),
        status: "complete".into(),
        reason: None,
        started_at: 1_700_100_000.0,
        finished_at: 1_700_100_001.0,
        counts: json!({"findings": {"orphan": 1}}),
        findings: json!([{"kind": "orphan", "summary": "charge ch_zqleak matches no effect",
                          "effects": [], "charges": [{"id": "ch_zqleak", "amount": 100}]}]),
        totals: json!([]),
        evidence: json!({"pages": [{"request_id": "req_zqleak"}]}),
    };
    w.ledger
        .record_audit_run(w.a.id, run, None)
        .await
        .unwrap()
        .id
}

async fn seed_tenant_a(w: &World) -> Fixture {
    let r = send(
        &w.app,
        Method::POST,
        "/api/v1/sources",
        Req {
            token: Some(&w.token_a),
            content_type: Some("application/json"),
            body: json!({"name": A_SOURCE, "kind": "push"}).to_string(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let record = json!([{
        "key": A_KEY, "state": "unknown", "request_hash": "1:zqleak",
        "response": "zqleak-response", "attempts": 1, "created_at": 1_700_000_000.0,
        "updated_at": 1_700_000_001.0,
    }]);
    let r = send(
        &w.app,
        Method::POST,
        &format!("/api/v1/effects?source={A_SOURCE}"),
        Req {
            token: Some(&w.token_a),
            content_type: Some("application/json"),
            body: record.to_string(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = send(
        &w.app,
        Method::POST,
        "/api/v1/tokens",
        Req {
            token: Some(&w.token_a),
            content_type: Some("application/json"),
            body: json!({"role": "viewer", "label": "zqleak-label"}).to_string(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let a_token_id = r.json["id"].as_i64().unwrap();
    // Reconciliation: a provider and a route of A's.
    for (method, uri, body) in [
        (
            Method::POST,
            "/api/v1/providers",
            json!({"name": A_PROVIDER, "kind": "stripe", "secret": "rk_live_zqleak",
                   "settings": {"account": "acct_zqleak"}}),
        ),
        (
            Method::PUT,
            "/api/v1/routes",
            json!({"source": A_SOURCE, "operation": "charge", "provider": A_PROVIDER}),
        ),
    ] {
        let r = send(
            &w.app,
            method,
            uri,
            Req {
                token: Some(&w.token_a),
                content_type: Some("application/json"),
                body: body.to_string(),
                ..Default::default()
            },
        )
        .await;
        assert!(r.status.is_success(), "{uri}: {}", r.text);
    }
    Fixture {
        a_token_id,
        a_audit_id: seed_audit_a(w).await,
    }
}

async fn sweep(backend: Backend) {
    let w = World::new(backend).await;
    let fx = seed_tenant_a(&w).await;
    let mut swept = 0;

    for spec in ROUTES {
        // T01: no credentials.
        let (uri, ct, body) = request_for(spec, &fx, "");
        let r = send(
            &w.app,
            method(spec),
            &uri,
            Req {
                content_type: ct,
                headers: same_origin(),
                body: body.clone(),
                ..Default::default()
            },
        )
        .await;
        match spec.access {
            Access::Token(_) => assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{uri}"),
            Access::Session(_) => {
                assert_eq!(r.status, StatusCode::SEE_OTHER, "{uri}");
                assert_eq!(r.location(), Some("/signin"), "{uri}");
            }
            Access::Public => assert!(!r.status.is_server_error(), "{uri}: {}", r.text),
        }
        assert!(!r.text.contains(CANARY), "{uri} leaked without credentials");

        // T02: tenant B's token, then tenant B's session (a fresh one each time, since
        // signing out ends it).
        let (cookie, csrf) = session(&w.app, "bob@globex.test").await;
        let (uri, ct, body) = request_for(spec, &fx, &csrf);
        for (who, req) in [
            (
                "B's token",
                Req {
                    token: Some(&w.token_b),
                    content_type: ct,
                    body: body.clone(),
                    ..Default::default()
                },
            ),
            (
                "B's session",
                Req {
                    cookie: Some(&cookie),
                    content_type: ct,
                    headers: same_origin(),
                    body: body.clone(),
                    ..Default::default()
                },
            ),
        ] {
            let r = send(&w.app, method(spec), &uri, req).await;
            assert!(
                !r.status.is_server_error(),
                "{} {uri} with {who}: {} {}",
                spec.method,
                r.status,
                r.text
            );
            assert!(
                !r.text.contains(CANARY),
                "{} {uri} with {who} answered {} with tenant A's data: {}",
                spec.method,
                r.status,
                r.text
            );
            if r.status.is_success() {
                // Only routes that are about B's own things may succeed.
                assert!(
                    matches!(
                        (spec.method, spec.path),
                        ("GET", _)
                            | (
                                "POST",
                                "/api/v1/sources"
                                    | "/api/v1/tokens"
                                    | "/api/v1/providers"
                                    | "/api/v1/audits"
                            )
                    ),
                    "{} {uri} with {who} succeeded: {}",
                    spec.method,
                    r.text
                );
            }
            swept += 1;
        }
    }
    assert_eq!(swept, ROUTES.len() * 2);

    // Tenant A is untouched: its token works, its effect is as it was, its source is there.
    let r = send(
        &w.app,
        Method::GET,
        &format!("/api/v1/effects/{A_SOURCE}/charge%3Av1%3Aacanary-ORD-1"),
        Req {
            token: Some(&w.token_a),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["effect"]["state"], "unknown", "{}", r.text);
    assert_eq!(r.json["effect"]["attempts"], 1, "{}", r.text);
    assert!(
        r.json["reconcile"]["resolution"].is_null(),
        "B resolved A's effect: {}",
        r.text
    );
    let routes = w.ledger.list_routes(w.a.id).await.unwrap();
    assert_eq!(
        routes
            .iter()
            .map(|r| r.operation.as_str())
            .collect::<Vec<_>>(),
        ["charge"],
        "B changed A's routes"
    );
    let sources = w.ledger.list_sources(w.a.id).await.unwrap();
    assert_eq!(
        sources.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        vec![A_SOURCE]
    );
    // B could not turn on write-back of A's source.
    assert_eq!(
        sources[0].writeback(),
        None,
        "B changed A's write-back setting"
    );
    assert_eq!(
        sources[0].scan_requested_at, None,
        "B asked for a scan of A's source"
    );
    // B could not edit A's source or provider (PATCH routes).
    assert_eq!(
        sources[0].table_name, "justonce_keys",
        "B edited A's source"
    );
    let provider = w.ledger.provider_by_name(w.a.id, A_PROVIDER).await.unwrap();
    assert_eq!(
        provider.settings["account"], "acct_zqleak",
        "B edited A's provider"
    );
    let secret = w.ledger.provider_secret(w.a.id, &provider).await.unwrap();
    assert_eq!(
        secret.map(|s| secrecy::ExposeSecret::expose_secret(&s).to_owned()),
        Some("rk_live_zqleak".to_owned()),
        "B replaced A's provider key"
    );
    let tokens = w.ledger.list_tokens(w.a.id).await.unwrap();
    let made = tokens.iter().find(|t| t.id == fx.a_token_id).unwrap();
    assert_eq!(made.revoked_at, None, "B revoked A's token");
    // A's audit run is still A's, unchanged, and the only one of A's chain.
    let runs = w.ledger.list_audit_runs(w.a.id, None, 10).await.unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].id, fx.a_audit_id);
    assert!(reckon_ledger::verify_chain(w.a.id.get(), &runs).is_empty());
    let b_sources = w.ledger.list_sources(w.b.id).await.unwrap();
    assert!(b_sources.iter().all(|s| s.name != A_SOURCE));
    w.finish().await;
}

#[tokio::test]
async fn every_route_refuses_another_tenant_on_sqlite() {
    sweep(Backend::Sqlite).await;
}

#[tokio::test]
async fn every_route_refuses_another_tenant_on_postgres() {
    sweep(Backend::Postgres).await;
}

#[tokio::test]
async fn a_route_missing_from_the_registry_answers_500() {
    use axum::routing::get;
    let w = World::new(Backend::Sqlite).await;
    // The real app plus one route nobody registered, behind the same guard.
    let state = reckon_web::AppState::new(w.ledger.clone());
    let app = axum::Router::new()
        .route("/unregistered", get(|| async { "should never run" }))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            reckon_web::routes::guard,
        ))
        .with_state(state);
    let r = send(&app, Method::GET, "/unregistered", Req::default()).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(r.text.contains("route registry"), "{}", r.text);
    w.finish().await;
}
