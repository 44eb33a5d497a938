//! Router tests: the whole app driven in-process against a real SQLite ledger.
#![allow(
    clippy::string_slice,
    reason = "the texts sliced here are the tests' own ASCII: URLs, templates, tokens, HTTP heads"
)]

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reckon_ledger::{Keyring, Ledger, Role, Tenant};
use reckon_web::{AppState, app, mint_token};
use serde_json::{Value, json};
use std::sync::Arc;
use tempfile::TempDir;
use tower::ServiceExt;

use crate::counting;

struct World {
    _dir: TempDir,
    app: Router,
    /// The operator's SQLite source directory: tenant `acme`'s files go in `acme/`.
    sqlite_dir: std::path::PathBuf,
    /// Admin token of tenant A.
    a: String,
    /// Admin token of tenant B.
    b: String,
    /// Viewer token of tenant A.
    viewer_a: String,
}

async fn token(ledger: &dyn Ledger, tenant: &Tenant, role: Role) -> String {
    let (token, hash) = mint_token();
    ledger
        .create_token(tenant.id, role, &hash, "test")
        .await
        .unwrap();
    token
}

async fn world_with(max_body_bytes: usize) -> World {
    let dir = TempDir::new().unwrap();
    let keyring = Keyring::from_bytes(&[7u8; 32]).unwrap();
    let ledger = reckon_ledger::connect(None, dir.path(), keyring)
        .await
        .unwrap();
    let tenant_a = ledger.create_tenant("acme").await.unwrap();
    let tenant_b = ledger.create_tenant("globex").await.unwrap();
    let a = token(ledger.as_ref(), &tenant_a, Role::Admin).await;
    let b = token(ledger.as_ref(), &tenant_b, Role::Admin).await;
    let viewer_a = token(ledger.as_ref(), &tenant_a, Role::Viewer).await;
    let sqlite_dir = dir.path().join("sqlite-sources");
    let egress = reckon_sources::EgressPolicy::new(&[], Some(sqlite_dir.clone())).unwrap();
    let app = app(AppState {
        max_body_bytes,
        egress: Arc::new(egress),
        ..AppState::new(ledger)
    });
    World {
        _dir: dir,
        app,
        sqlite_dir,
        a,
        b,
        viewer_a,
    }
}

async fn world() -> World {
    world_with(reckon_web::DEFAULT_MAX_BODY_BYTES).await
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Value,
    text: String,
}

async fn send(
    app: &Router,
    method: Method,
    uri: &str,
    token: Option<&str>,
    content_type: Option<&str>,
    body: impl Into<Body>,
) -> Reply {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    if let Some(ct) = content_type {
        req = req.header(header::CONTENT_TYPE, ct);
    }
    let res = app
        .clone()
        .oneshot(req.body(body.into()).unwrap())
        .await
        .unwrap();
    let status = res.status();
    let headers = res.headers().clone();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Reply {
        status,
        headers,
        body,
        text,
    }
}

async fn get(app: &Router, uri: &str, token: &str) -> Reply {
    send(app, Method::GET, uri, Some(token), None, Body::empty()).await
}

async fn post_json(app: &Router, uri: &str, token: &str, body: &Value) -> Reply {
    send(
        app,
        Method::POST,
        uri,
        Some(token),
        Some("application/json"),
        body.to_string(),
    )
    .await
}

async fn add_push_source(w: &World, token: &str, name: &str) {
    let r = post_json(
        &w.app,
        "/api/v1/sources",
        token,
        &json!({"name": name, "kind": "push"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
}

fn record(key: &str, state: &str, updated_at: f64, response: Value) -> Value {
    json!({
        "key": key,
        "state": state,
        "request_hash": "1:abc",
        "response": response,
        "attempts": 1,
        "created_at": 1_700_000_000.0,
        "updated_at": updated_at,
    })
}

async fn push(w: &World, token: &str, source: &str, items: &Value) -> Reply {
    post_json(
        &w.app,
        &format!("/api/v1/effects?source={source}"),
        token,
        items,
    )
    .await
}

fn statuses(r: &Reply) -> Vec<String> {
    r.body["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no results in {}", r.text))
        .iter()
        .map(|i| i["status"].as_str().unwrap().to_owned())
        .collect()
}

fn effect_keys(r: &Reply) -> Vec<String> {
    r.body["effects"]
        .as_array()
        .unwrap_or_else(|| panic!("no effects in {}", r.text))
        .iter()
        .map(|e| e["key"].as_str().unwrap().to_owned())
        .collect()
}

fn assert_error(r: &Reply, status: StatusCode) {
    assert_eq!(r.status, status, "{}", r.text);
    assert!(
        r.body["error"].as_str().is_some_and(|e| !e.is_empty()),
        "expected a JSON error sentence, got {}",
        r.text
    );
}

#[tokio::test]
async fn health_probes_answer_without_a_token() {
    let w = world().await;
    let r = send(&w.app, Method::GET, "/healthz", None, None, Body::empty()).await;
    assert_eq!((r.status, r.text.as_str()), (StatusCode::OK, "ok"));
    let r = send(&w.app, Method::GET, "/readyz", None, None, Body::empty()).await;
    assert_eq!(r.status, StatusCode::OK);
}

#[tokio::test]
async fn api_routes_refuse_missing_malformed_and_unknown_tokens() {
    let w = world().await;
    let lookups = counting::Calls::of("authenticate_token");
    let _counting = lookups.install();
    let (unknown, _) = mint_token();
    let malformed = [
        "rkn_nope".to_owned(),
        w.a.replacen("rkn_", "rkx_", 1),
        format!("{}0", w.a),
        // A valid shape with a wrong checksum.
        format!(
            "{}{}",
            &w.a[..w.a.len() - 1],
            if w.a.ends_with('0') { '1' } else { '0' }
        ),
    ];

    let r = send(
        &w.app,
        Method::GET,
        "/api/v1/sources",
        None,
        None,
        Body::empty(),
    )
    .await;
    assert_error(&r, StatusCode::UNAUTHORIZED);
    assert_eq!(r.headers[header::WWW_AUTHENTICATE], "Bearer");

    for bad in &malformed {
        let r = get(&w.app, "/api/v1/sources", bad).await;
        assert_error(&r, StatusCode::UNAUTHORIZED);
        assert_eq!(r.headers[header::WWW_AUTHENTICATE], "Bearer");
    }
    assert_eq!(
        lookups.count(),
        0,
        "a malformed token must be refused without reading the database"
    );

    let r = get(&w.app, "/api/v1/effects", &unknown).await;
    assert_error(&r, StatusCode::UNAUTHORIZED);
    assert_eq!(r.headers[header::WWW_AUTHENTICATE], "Bearer");
    assert_eq!(lookups.count(), 1, "a well-formed token is looked up");

    let r = get(&w.app, "/api/v1/sources", &w.a).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
}

#[tokio::test]
async fn one_tenant_never_sees_another_tenants_data() {
    let w = world().await;
    add_push_source(&w, &w.a, "payments").await;
    let r = push(
        &w,
        &w.a,
        "payments",
        &json!([
            record(
                "charge:v1:ORD-1",
                "succeeded",
                1_700_000_001.0,
                json!("done")
            ),
            record("charge:v1:ORD-2", "wat", 1_700_000_001.0, json!(null)),
        ]),
    )
    .await;
    assert_eq!(statuses(&r), ["created", "rejected"]);

    // A sees its own data.
    assert_eq!(
        get(&w.app, "/api/v1/sources", &w.a).await.body["sources"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        effect_keys(&get(&w.app, "/api/v1/effects", &w.a).await),
        ["charge:v1:ORD-1"]
    );
    assert_eq!(
        effect_keys(&get(&w.app, "/api/v1/lookup?q=ORD-1", &w.a).await),
        ["charge:v1:ORD-1"]
    );

    // B sees none of it, by any route.
    let r = get(&w.app, "/api/v1/sources", &w.b).await;
    assert_eq!(r.body, json!({"sources": []}));
    let r = get(&w.app, "/api/v1/effects", &w.b).await;
    assert_eq!(r.body, json!({"effects": [], "next": null}));
    let r = get(&w.app, "/api/v1/effects?source=payments", &w.b).await;
    assert_eq!(r.body, json!({"effects": [], "next": null}));
    for q in ["ORD-1", "charge:v1:ORD-1"] {
        let r = get(&w.app, &format!("/api/v1/lookup?q={q}"), &w.b).await;
        assert_eq!(r.body["found"], false, "{q}: {}", r.body);
        assert_eq!(r.body["effects"], json!([]), "{q}");
        assert_eq!(
            r.body["did_you_mean"],
            json!([]),
            "{q}: no hint of A's keys"
        );
    }
    assert_error(
        &get(&w.app, "/api/v1/effects/payments/charge:v1:ORD-1", &w.b).await,
        StatusCode::NOT_FOUND,
    );
    assert_eq!(
        get(&w.app, "/api/v1/quarantine", &w.b).await.body,
        json!({"counts": []})
    );
    assert_error(
        &get(&w.app, "/api/v1/sources/payments/quarantine", &w.b).await,
        StatusCode::NOT_FOUND,
    );
    // B cannot push into A's source either.
    let r = push(
        &w,
        &w.b,
        "payments",
        &json!([record("charge:v1:ORD-9", "succeeded", 1.0, json!(1))]),
    )
    .await;
    assert_error(&r, StatusCode::NOT_FOUND);

    // And B may use the same source name for its own, separate, source.
    add_push_source(&w, &w.b, "payments").await;
    assert_eq!(
        effect_keys(&get(&w.app, "/api/v1/effects", &w.b).await),
        Vec::<String>::new()
    );
}

#[tokio::test]
async fn a_mixed_push_is_judged_item_by_item_and_stores_the_good_ones() {
    let w = world().await;
    add_push_source(&w, &w.a, "payments").await;
    let r = push(
        &w,
        &w.a,
        "payments",
        &json!([
            record(
                "charge:v1:ORD-1",
                "succeeded",
                1_700_000_001.0,
                json!({"id": "ch_1"})
            ),
            json!({"key": 5, "state": "succeeded"}),
            record(
                "charge:v1:ORD-2",
                "partially_refunded",
                1_700_000_001.0,
                json!(null)
            ),
            42,
            record("charge:v1:ORD-3", "unknown", 1_700_000_002.0, json!(null)),
        ]),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        statuses(&r),
        ["created", "rejected", "rejected", "rejected", "created"]
    );
    let results = r.body["results"].as_array().unwrap();
    for (i, item) in results.iter().enumerate() {
        assert_eq!(item["index"], i);
    }
    assert_eq!(results[2]["reason"], "unknown_state");
    assert!(results[3]["error"].as_str().unwrap().contains("object"));
    assert_eq!(
        (
            &r.body["created"],
            &r.body["updated"],
            &r.body["unchanged"],
            &r.body["stale"],
            &r.body["rejected"]
        ),
        (&json!(2), &json!(0), &json!(0), &json!(0), &json!(3))
    );

    let mut keys = effect_keys(&get(&w.app, "/api/v1/effects", &w.a).await);
    keys.sort();
    assert_eq!(keys, ["charge:v1:ORD-1", "charge:v1:ORD-3"]);
    let r = get(
        &w.app,
        "/api/v1/effects?state=unknown&unresolved=true",
        &w.a,
    )
    .await;
    assert_eq!(effect_keys(&r), ["charge:v1:ORD-3"]);
    assert_eq!(r.body["effects"][0]["unresolved_kind"], "unknown");
    // The object response is a JSON object, not text.
    let r = get(&w.app, "/api/v1/effects?state=succeeded", &w.a).await;
    assert_eq!(r.body["effects"][0]["response"], json!({"id": "ch_1"}));
    assert!(r.body["effects"][0].get("response_json").is_none());

    // The hostile row is in quarantine with its reason.
    let r = get(&w.app, "/api/v1/sources/payments/quarantine", &w.a).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let entries = r.body["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0]["reason"], "unknown_state");
    let r = get(&w.app, "/api/v1/quarantine", &w.a).await;
    assert_eq!(r.body["counts"][0]["reason"], "unknown_state");
}

#[tokio::test]
async fn the_same_push_twice_is_unchanged_and_an_older_record_is_stale() {
    let w = world().await;
    add_push_source(&w, &w.a, "payments").await;
    let batch = json!([
        record(
            "charge:v1:ORD-1",
            "succeeded",
            1_700_000_010.0,
            json!("done")
        ),
        record(
            "charge:v1:ORD-2",
            "failed",
            1_700_000_010.0,
            json!({"code": 402})
        ),
    ]);
    assert_eq!(
        statuses(&push(&w, &w.a, "payments", &batch).await),
        ["created", "created"]
    );
    let again = push(&w, &w.a, "payments", &batch).await;
    assert_eq!(statuses(&again), ["unchanged", "unchanged"]);
    assert_eq!(again.body["unchanged"], 2);

    let older = json!([record(
        "charge:v1:ORD-1",
        "unknown",
        1_700_000_005.0,
        json!(null)
    )]);
    let r = push(&w, &w.a, "payments", &older).await;
    assert_eq!(statuses(&r), ["stale"]);
    assert_eq!(r.body["stale"], 1);
    let r = get(&w.app, "/api/v1/effects/payments/charge:v1:ORD-1", &w.a).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["effect"]["state"], "succeeded");
    assert_eq!(r.body["effect"]["updated_at"], 1_700_000_010.0);
    assert_eq!(r.body["effect"]["response"], "done");

    let newer = json!([record(
        "charge:v1:ORD-1",
        "succeeded",
        1_700_000_020.0,
        json!("refunded")
    )]);
    assert_eq!(
        statuses(&push(&w, &w.a, "payments", &newer).await),
        ["updated"]
    );
}

#[tokio::test]
async fn ndjson_pushes_judge_each_line_and_a_bad_line_costs_only_itself() {
    let w = world().await;
    add_push_source(&w, &w.a, "payments").await;
    let body = format!(
        "{}\n\n{{not json\r\n{}\n",
        record(
            "charge:v1:ORD-1",
            "succeeded",
            1_700_000_001.0,
            json!("done")
        ),
        record("charge:v1:ORD-2", "succeeded", 1_700_000_001.0, json!(null)),
    );
    let r = send(
        &w.app,
        Method::POST,
        "/api/v1/effects?source=payments",
        Some(&w.a),
        Some("application/x-ndjson"),
        body,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(statuses(&r), ["created", "rejected", "created"]);
    let error = r.body["results"][1]["error"].as_str().unwrap();
    assert!(error.starts_with("line 3:"), "{error}");
    assert_eq!(
        effect_keys(&get(&w.app, "/api/v1/effects", &w.a).await).len(),
        2
    );
}

#[tokio::test]
async fn a_push_envelope_that_is_wrong_is_refused_whole() {
    let w = world().await;
    add_push_source(&w, &w.a, "payments").await;
    let one = record("charge:v1:ORD-1", "succeeded", 1_700_000_001.0, json!(1));
    // Not an array.
    assert_error(
        &push(&w, &w.a, "payments", &one).await,
        StatusCode::BAD_REQUEST,
    );
    // Not JSON.
    let r = send(
        &w.app,
        Method::POST,
        "/api/v1/effects?source=payments",
        Some(&w.a),
        Some("application/json"),
        "[{",
    )
    .await;
    assert_error(&r, StatusCode::BAD_REQUEST);
    // No content type.
    let r = send(
        &w.app,
        Method::POST,
        "/api/v1/effects?source=payments",
        Some(&w.a),
        None,
        json!([one]).to_string(),
    )
    .await;
    assert_error(&r, StatusCode::BAD_REQUEST);
    // No such source, no source named, and a scanned source.
    assert_error(
        &push(&w, &w.a, "nope", &json!([one])).await,
        StatusCode::NOT_FOUND,
    );
    assert_error(
        &post_json(&w.app, "/api/v1/effects", &w.a, &json!([one])).await,
        StatusCode::BAD_REQUEST,
    );
    let r = post_json(
        &w.app,
        "/api/v1/sources",
        &w.a,
        &json!({"name": "scanned", "kind": "sqlite", "dsn": w.sqlite_dir.join("acme/app.db")}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_error(
        &push(&w, &w.a, "scanned", &json!([one])).await,
        StatusCode::UNPROCESSABLE_ENTITY,
    );
    // Too many items.
    let many = Value::Array(vec![json!({}); 10_001]);
    assert_error(
        &push(&w, &w.a, "payments", &many).await,
        StatusCode::PAYLOAD_TOO_LARGE,
    );
    // A viewer may not push (nor read records: see viewer.rs); nothing was stored.
    assert_error(
        &push(&w, &w.viewer_a, "payments", &json!([one])).await,
        StatusCode::FORBIDDEN,
    );
    assert_eq!(
        effect_keys(&get(&w.app, "/api/v1/effects", &w.a).await),
        Vec::<String>::new()
    );
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused_whole_and_stores_nothing() {
    let w = world_with(4096).await;
    add_push_source(&w, &w.a, "payments").await;
    let items: Vec<Value> = (0..100)
        .map(|i| {
            record(
                &format!("charge:v1:ORD-{i}"),
                "succeeded",
                1_700_000_001.0,
                json!("done"),
            )
        })
        .collect();
    let r = push(&w, &w.a, "payments", &Value::Array(items)).await;
    assert_error(&r, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(
        r.body["error"].as_str().unwrap().contains("4096"),
        "{}",
        r.text
    );
    let r = get(&w.app, "/api/v1/effects", &w.a).await;
    assert_eq!(r.body, json!({"effects": [], "next": null}));
    // NDJSON is held to the same limit.
    let body = "{}\n".repeat(2000);
    let r = send(
        &w.app,
        Method::POST,
        "/api/v1/effects?source=payments",
        Some(&w.a),
        Some("application/x-ndjson"),
        body,
    )
    .await;
    assert_error(&r, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn effects_are_paged_with_an_opaque_next_cursor() {
    let w = world().await;
    add_push_source(&w, &w.a, "payments").await;
    let items: Vec<Value> = (0..5)
        .map(|i| {
            record(
                &format!("charge:v1:ORD-{i}"),
                "succeeded",
                1_700_000_001.0,
                json!(i),
            )
        })
        .collect();
    let r = push(&w, &w.a, "payments", &Value::Array(items)).await;
    assert_eq!(r.body["created"], 5, "{}", r.text);

    let mut seen = Vec::new();
    let mut uri = "/api/v1/effects?limit=2".to_owned();
    let mut pages = 0;
    loop {
        let r = get(&w.app, &uri, &w.a).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        pages += 1;
        seen.extend(effect_keys(&r));
        match r.body["next"].as_str() {
            Some(next) => uri = format!("/api/v1/effects?limit=2&after={next}"),
            None => break,
        }
        assert!(pages < 10, "paging does not end");
    }
    let expected: Vec<String> = (0..5).map(|i| format!("charge:v1:ORD-{i}")).collect();
    assert_eq!(seen, expected);
    assert_eq!(pages, 3);

    for bad in [
        "/api/v1/effects?after=not-a-cursor",
        "/api/v1/effects?state=partially_refunded",
        "/api/v1/effects?limit=0",
        "/api/v1/effects?limit=1001",
        "/api/v1/effects?unresolved=maybe",
        "/api/v1/effects?updated_since=yesterday",
        "/api/v1/effects?tenant=globex",
        "/api/v1/lookup",
    ] {
        assert_error(&get(&w.app, bad, &w.a).await, StatusCode::BAD_REQUEST);
    }
    let r = get(
        &w.app,
        "/api/v1/effects?updated_since=1700000000.5&operation=charge&source=payments",
        &w.a,
    )
    .await;
    assert_eq!(effect_keys(&r).len(), 5, "{}", r.text);
    let r = get(&w.app, "/api/v1/effects?updated_since=1700000001.5", &w.a).await;
    assert_eq!(effect_keys(&r).len(), 0, "{}", r.text);
}

/// Percent-encode everything but letters and digits (what a careful client does)...
const EVERYTHING: &AsciiSet = NON_ALPHANUMERIC;
/// ...or leave `/` as it is (what a careless one does).
const ALL_BUT_SLASH: &AsciiSet = &NON_ALPHANUMERIC.remove(b'/');

#[tokio::test]
async fn a_key_with_any_character_round_trips_and_its_response_is_decoded_once() {
    let w = world().await;
    add_push_source(&w, &w.a, "payments").await;
    let key = "charge:v1:a/b?c%d\"é";
    let r = push(
        &w,
        &w.a,
        "payments",
        &json!([record(key, "succeeded", 1_700_000_001.0, json!("done"))]),
    )
    .await;
    assert_eq!(statuses(&r), ["created"]);

    for set in [EVERYTHING, ALL_BUT_SLASH] {
        let uri = format!("/api/v1/effects/payments/{}", utf8_percent_encode(key, set));
        let r = get(&w.app, &uri, &w.a).await;
        assert_eq!(r.status, StatusCode::OK, "{uri}: {}", r.text);
        assert_eq!(r.body["effect"]["key"], key);
        assert_eq!(r.body["effect"]["response"], Value::String("done".into()));
        assert_eq!(r.body["effect"]["source"], "payments");
        assert!(
            !r.body["history"].as_array().unwrap().is_empty(),
            "{}",
            r.text
        );
    }
    let r = get(&w.app, "/api/v1/effects", &w.a).await;
    assert_eq!(r.body["effects"][0]["response"], "done");
    let q = utf8_percent_encode("a/b?c%d\"é", EVERYTHING).to_string();
    let r = get(&w.app, &format!("/api/v1/lookup?q={q}"), &w.a).await;
    assert_eq!(effect_keys(&r), [key]);
    // A near miss is not found.
    let r = get(&w.app, "/api/v1/effects/payments/charge%3Av1%3Aa%2Fb", &w.a).await;
    assert_error(&r, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn adding_a_source_needs_an_admin_and_a_valid_description() {
    let w = world().await;
    let push_source = json!({"name": "payments", "kind": "push"});
    let r = post_json(&w.app, "/api/v1/sources", &w.viewer_a, &push_source).await;
    assert_error(&r, StatusCode::FORBIDDEN);
    // Refused before the body is even read.
    let r = send(
        &w.app,
        Method::POST,
        "/api/v1/sources",
        Some(&w.viewer_a),
        Some("application/json"),
        "{",
    )
    .await;
    assert_error(&r, StatusCode::FORBIDDEN);

    let r = post_json(&w.app, "/api/v1/sources", &w.a, &push_source).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(r.body["name"], "payments");
    assert_eq!(r.body["kind"], "push");
    assert_error(
        &post_json(&w.app, "/api/v1/sources", &w.a, &push_source).await,
        StatusCode::CONFLICT,
    );

    let r = post_json(
        &w.app,
        "/api/v1/sources",
        &w.a,
        &json!({"name": "x", "kind": "postgres", "dsn": "postgres://u@h/db?sslrootcert=/etc/passwd"}),
    )
    .await;
    assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY);
    let r = post_json(
        &w.app,
        "/api/v1/sources",
        &w.a,
        &json!({"name": "x", "kind": "postgres", "dsn": "postgres://u:canarypw@h/db?passfile=x"}),
    )
    .await;
    assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(!r.text.contains("canarypw"), "{}", r.text);

    // A scanned source with a password: stored sealed, shown redacted.
    let r = post_json(
        &w.app,
        "/api/v1/sources",
        &w.a,
        &json!({"name": "orders", "kind": "postgres", "dsn": "postgres://u:canarypw@db.internal/orders", "scan_interval": "30s"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert!(!r.text.contains("canarypw"), "{}", r.text);
    let r = get(&w.app, "/api/v1/sources", &w.a).await;
    assert!(!r.text.contains("canarypw"), "{}", r.text);
    let sources = r.body["sources"].as_array().unwrap();
    assert_eq!(sources.len(), 2);
    assert!(
        sources
            .iter()
            .all(|s| s.get("consecutive_failures").is_some())
    );

    for bad in [
        json!({"name": "y", "kind": "redis"}),
        json!({"name": "y", "kind": "push", "surprise": true}),
        json!({"name": "y", "kind": "push", "scan_interval": "soon"}),
    ] {
        assert_error(
            &post_json(&w.app, "/api/v1/sources", &w.a, &bad).await,
            StatusCode::UNPROCESSABLE_ENTITY,
        );
    }
}

// Write-back.

async fn put_json(app: &Router, uri: &str, token: &str, body: &Value) -> Reply {
    send(
        app,
        Method::PUT,
        uri,
        Some(token),
        Some("application/json"),
        body.to_string(),
    )
    .await
}

#[tokio::test]
async fn writeback_is_off_until_an_admin_turns_it_on_and_bad_settings_are_refused_clearly() {
    let w = world().await;
    let r = post_json(
        &w.app,
        "/api/v1/sources",
        &w.a,
        &json!({"name": "shop", "kind": "sqlite", "dsn": w.sqlite_dir.join("acme/shop.db")}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(r.body["writeback"], Value::Null, "off by default");
    add_push_source(&w, &w.a, "pushed").await;
    let uri = "/api/v1/sources/shop/writeback";

    // Off: a run is refused with the way to turn it on.
    let r = post_json(&w.app, uri, &w.a, &Value::Null).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    assert!(r.text.contains("write-back off"), "{}", r.text);

    // Only an admin may turn it on; another tenant cannot find the source.
    let on = json!({"not_applied": "release"});
    let r = put_json(&w.app, uri, &w.viewer_a, &on).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
    let r = put_json(&w.app, uri, &w.b, &on).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    let r = put_json(&w.app, uri, &w.a, &json!({"not_applied": "delete"})).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert!(r.text.contains("release, fail"), "{}", r.text);
    let r = put_json(&w.app, "/api/v1/sources/pushed/writeback", &w.a, &on).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert!(r.text.contains("push source"), "{}", r.text);

    let r = put_json(&w.app, uri, &w.a, &on).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["writeback"], "release");
    // Nothing resolved yet: the dry run has nothing to show (and opens no connection).
    let r = post_json(&w.app, &format!("{uri}?dry_run=true"), &w.a, &Value::Null).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["dry_run"], true);
    assert_eq!(r.body["outcomes"], json!([]));
    let r = post_json(&w.app, &format!("{uri}?dry_run=maybe"), &w.a, &Value::Null).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    // A body without the field is refused, not read as "off"; a body that is not an
    // object is refused before it is read (serde would take `[null]` as the fields).
    let r = put_json(&w.app, uri, &w.a, &json!({})).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert!(r.text.contains("give not_applied"), "{}", r.text);
    let r = put_json(&w.app, uri, &w.a, &json!([null])).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(r.text.contains("JSON object"), "{}", r.text);
    let r = put_json(&w.app, uri, &w.a, &json!({"not_applied": null})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["writeback"], Value::Null);
}

// T08 / T12 at save: the egress policy judges a DSN when it is saved.

async fn patch_json(app: &Router, uri: &str, token: &str, body: &Value) -> Reply {
    send(
        app,
        Method::PATCH,
        uri,
        Some(token),
        Some("application/json"),
        body.to_string(),
    )
    .await
}

async fn source_names(w: &World, token: &str) -> Vec<String> {
    let r = get(&w.app, "/api/v1/sources", token).await;
    let mut names: Vec<String> = r.body["sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    names
}

/// Adding or editing a source through the API, tenant `acme` (token `w.a`) names another
/// tenant's SQLite file (directly, through `..`, through a link in its own directory), a
/// file outside the SQLite directory, or a network DSN whose host is a private, loopback or
/// link-local address: each is refused with a 422 that says why and never repeats the
/// password, and nothing is stored or changed. Its own directory, and a host name that does
/// not resolve yet, are accepted (both are checked again before every connection).
#[tokio::test]
async fn dsns_are_judged_by_the_egress_policy_when_they_are_saved() {
    let w = world().await;
    let (mine, theirs) = (w.sqlite_dir.join("acme"), w.sqlite_dir.join("globex"));
    std::fs::create_dir_all(&mine).unwrap();
    std::fs::create_dir_all(&theirs).unwrap();
    std::fs::write(theirs.join("shop.db"), b"globex's data").unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(theirs.join("shop.db"), mine.join("link.db")).unwrap();
    let add = |name: &str, kind: &str, dsn: String| json!({"name": name, "kind": kind, "dsn": dsn});
    let p = |path: std::path::PathBuf| path.display().to_string();
    let refused: Vec<(Value, &str)> = vec![
        (
            add("x", "sqlite", p(theirs.join("shop.db"))),
            "SQLite sources must be files inside",
        ),
        (
            add("x", "sqlite", p(mine.join("../globex/shop.db"))),
            "may not contain '..'",
        ),
        (
            add("x", "sqlite", p(mine.join("link.db"))),
            "after following links",
        ),
        (
            add("x", "sqlite", p(w.sqlite_dir.join("shared.db"))),
            "inside",
        ),
        (add("x", "sqlite", "/etc/passwd".into()), "inside"),
        (
            add("x", "postgres", "postgres://u:canarypw@10.0.0.1/db".into()),
            "host 10.0.0.1 is a private address",
        ),
        (
            add(
                "x",
                "postgres",
                "postgres://u:canarypw@127.0.0.1:5432/db".into(),
            ),
            "loopback",
        ),
        (
            add("x", "postgres", "postgres://u:canarypw@localhost/db".into()),
            "loopback",
        ),
        (
            add("x", "mysql", "mysql://u:canarypw@169.254.169.254/db".into()),
            "link-local",
        ),
        (
            add(
                "x",
                "mysql",
                "mysql://u:canarypw@[::ffff:192.168.1.1]/db".into(),
            ),
            "private",
        ),
        (
            add(
                "x",
                "postgres",
                "postgres://u:canarypw@100.64.0.1/db".into(),
            ),
            "CGNAT",
        ),
    ];
    for (body, why) in &refused {
        let r = post_json(&w.app, "/api/v1/sources", &w.a, body).await;
        assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY);
        let said = r.body["error"].as_str().unwrap();
        assert!(said.contains("egress policy"), "{body}: {said}");
        assert!(said.contains(why), "{body}: {said}");
        assert!(!r.text.contains("canarypw"), "{body}: {said}");
    }
    let e = post_json(&w.app, "/api/v1/sources", &w.a, &refused[0].0).await;
    assert!(
        e.text.contains(&format!("{}/", mine.display())),
        "the answer names the tenant's own directory: {}",
        e.text
    );
    assert!(source_names(&w, &w.a).await.is_empty());

    // Its own directory (the file may come later) and a name that does not resolve yet.
    for body in [
        add("shop", "sqlite", p(mine.join("shop.db"))),
        add(
            "orders",
            "postgres",
            "postgres://u:canarypw@db.internal/orders".into(),
        ),
    ] {
        let r = post_json(&w.app, "/api/v1/sources", &w.a, &body).await;
        assert_eq!(r.status, StatusCode::CREATED, "{body}: {}", r.text);
    }
    // The other tenant has the mirror image: its own file is fine for it.
    let r = post_json(
        &w.app,
        "/api/v1/sources",
        &w.b,
        &add("shop", "sqlite", p(theirs.join("shop.db"))),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);

    // Edits: the same checks; the stored source is unchanged after a refusal.
    for (name, body, why) in [
        (
            "orders",
            // (A new host needs the password again, so it is given.)
            json!({"dsn": "postgres://u@127.0.0.1/orders", "password": "canarypw"}),
            "loopback",
        ),
        (
            "orders",
            json!({"dsn": "postgres://u:canarypw@192.168.0.10/orders"}),
            "private",
        ),
        ("shop", json!({"dsn": p(theirs.join("shop.db"))}), "inside"),
        ("shop", json!({"dsn": p(mine.join("link.db"))}), "links"),
    ] {
        let r = patch_json(&w.app, &format!("/api/v1/sources/{name}"), &w.a, &body).await;
        assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY);
        let said = r.body["error"].as_str().unwrap();
        assert!(said.contains(why), "{body}: {said}");
        assert!(!r.text.contains("canarypw"), "{said}");
    }
    let r = get(&w.app, "/api/v1/sources", &w.a).await;
    let displays: Vec<&str> = r.body["sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["dsn_display"].as_str().unwrap())
        .collect();
    assert!(
        displays
            .iter()
            .any(|d| d.contains("@db.internal:5432/orders")),
        "{displays:?}"
    );
    assert!(
        displays
            .iter()
            .any(|d| d.ends_with(&format!("{}", mine.join("shop.db").display()))),
        "{displays:?}"
    );
    // A good edit still goes through.
    let r = patch_json(
        &w.app,
        "/api/v1/sources/orders",
        &w.a,
        &json!({"dsn": "postgres://u@db2.internal/orders", "password": "canarypw"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(source_names(&w, &w.a).await, ["orders", "shop"]);
}

/// A source the operator's settings refuse is refused through the API with the setting
/// that would allow it and how to set it: the egress allow-list for a database at a private
/// address, the SQLite source directory for a file outside the tenant's own.
#[tokio::test]
async fn a_refused_source_names_the_setting_that_would_allow_it() {
    let w = world().await;
    let r = post_json(
        &w.app,
        "/api/v1/sources",
        &w.a,
        &json!({"name": "billing", "kind": "postgres",
                "dsn": "postgres://ro:canarypw@10.1.2.3:5432/billing"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert!(
        r.text
            .contains(r#"RECKON_EGRESS_ALLOW='[\"10.1.2.3/32\"]'"#)
            && r.text.contains("egress_allow"),
        "{}",
        r.text
    );
    assert!(!r.text.contains("canarypw"), "{}", r.text);
    let r = post_json(
        &w.app,
        "/api/v1/sources",
        &w.a,
        &json!({"name": "shop", "kind": "sqlite", "dsn": "/var/lib/elsewhere/shop.db"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert!(
        r.text.contains("RECKON_SQLITE_SOURCE_DIR")
            && r.text
                .contains(&format!("{}/", w.sqlite_dir.join("acme").display())),
        "{}",
        r.text
    );
}
