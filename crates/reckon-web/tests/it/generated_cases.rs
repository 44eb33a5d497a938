//! Generated cases against the real server: schemathesis (from the test venv,
//! `scripts/test-env.sh`) reads the API document the server serves, generates requests for
//! every operation (valid ones and invalid ones, from the schemas' types, enums, limits and
//! examples) and sends them to `reckon_web::app` listening on loopback, with a tenant seeded
//! with a push source, effects, a route, a resolution and an audit run, and an admin token.
//! It must find no server error (a 5xx: bad input gets a 4xx that says what is wrong), no
//! mismatch between an answer and the document (status code, content type, headers, body
//! schema), and no request that breaks the document's schema accepted; the checks and the
//! one exception are in `tests/schemathesis.toml`, with the reasons. The run is
//! reproducible (fixed seed, one worker) and bounded (examples per operation). Both
//! ledgers.

use crate::common;

use axum::http::{Method, StatusCode};
use common::{Backend, Req, World, send, token};
use reckon_ledger::Role;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Stdio;

/// Cases per operation and phase; the seed makes the run the same every time.
const MAX_EXAMPLES: &str = "25";
const SEED: &str = "20261201";

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The venv's `st`, made by scripts/test-env.sh (pinned in testdata/requirements.txt).
fn schemathesis() -> PathBuf {
    let out = std::process::Command::new(repo_root().join("scripts/test-env.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("scripts/test-env.sh");
    assert!(out.status.success(), "scripts/test-env.sh failed");
    let python = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    let st = python.parent().unwrap().join("st");
    assert!(st.exists(), "{st:?}: schemathesis is not in the test venv");
    st
}

async fn call(w: &World, method: Method, uri: &str, body: Option<Value>) -> (StatusCode, Value) {
    let r = send(
        &w.app,
        method,
        uri,
        Req {
            token: Some(&w.token_a),
            content_type: body.as_ref().map(|_| "application/json"),
            body: body.map(|b| b.to_string()).unwrap_or_default(),
            ..Default::default()
        },
    )
    .await;
    (r.status, r.json)
}

/// The tenant the cases run against: the objects the document's examples name exist.
async fn seed(w: &World) {
    let (s, b) = call(
        w,
        Method::POST,
        "/api/v1/sources",
        Some(json!({"name": "billing", "kind": "push"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let t = 1_700_000_000.0;
    let (s, b) = call(
        w,
        Method::POST,
        "/api/v1/effects?source=billing",
        Some(json!([
            {"key": "charge:v1:ORD-1", "state": "succeeded", "request_hash": "1:a",
             "response": {"id": "ch_1"}, "attempts": 1, "created_at": t, "updated_at": t + 1.0},
            {"key": "charge:v1:ORD-2", "state": "unknown", "request_hash": "1:b",
             "response": null, "attempts": 2, "created_at": t, "updated_at": t + 2.0},
            {"key": "charge:v1:ORD-3", "state": "in_progress", "request_hash": "1:c",
             "attempts": 1, "created_at": t, "updated_at": t, "expires_at": t + 30.0},
            {"key": "refund:v1:ORD-1/part", "state": "unknown", "request_hash": "1:d",
             "created_at": t, "updated_at": t},
        ])),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["created"], 4, "{b}");
    let (s, b) = call(
        w,
        Method::PUT,
        "/api/v1/routes",
        Some(json!({"source": "billing", "operation": "charge", "provider": null})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let (s, b) = call(
        w,
        Method::POST,
        "/api/v1/effects/billing/charge:v1:ORD-2/resolve",
        Some(json!({"outcome": "applied", "note": "seen in the provider's dashboard"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (s, b) = call(w, Method::POST, "/api/v1/audits", Some(json!({}))).await;
    assert!(
        s.is_success() || s == StatusCode::UNPROCESSABLE_ENTITY,
        "{s} {b}"
    );
}

struct Figures {
    cases: u64,
    server_errors: u64,
    mismatches: u64,
    report: Value,
}

async fn run(backend: Backend) -> Figures {
    let st = schemathesis();
    let w = World::new(backend).await;
    seed(&w).await;
    // Tokens the cases may revoke (DELETE /tokens/{id} with small ids) before the run's own.
    for _ in 0..20 {
        token(w.ledger.as_ref(), &w.a, Role::Viewer).await;
    }
    let run_token = token(w.ledger.as_ref(), &w.a, Role::Admin).await;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = w.app.clone();
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
        .await
    });

    let dir = tempfile::TempDir::new().unwrap();
    let report = dir.path().join("report.json");
    let base = format!("http://{addr}");
    let config = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/schemathesis.toml");
    let args = [
        "--config-file".to_owned(),
        config.display().to_string(),
        "run".to_owned(),
        format!("{base}/api/v1/openapi.json"),
        "--url".to_owned(),
        base.clone(),
        "--phases".to_owned(),
        "examples,coverage,fuzzing".to_owned(),
        "--max-examples".to_owned(),
        MAX_EXAMPLES.to_owned(),
        "--seed".to_owned(),
        SEED.to_owned(),
        "--workers".to_owned(),
        "1".to_owned(),
        "--request-timeout".to_owned(),
        "30".to_owned(),
        "--suppress-health-check".to_owned(),
        "all".to_owned(),
        "--header".to_owned(),
        format!("Authorization: Bearer {run_token}"),
        "--report".to_owned(),
        "json".to_owned(),
        "--report-json-path".to_owned(),
        report.display().to_string(),
        "--output-truncate".to_owned(),
        "false".to_owned(),
    ];
    eprintln!("{} {}", st.display(), args.join(" "));
    let out = tokio::process::Command::new(&st)
        .args(&args)
        .current_dir(dir.path())
        .env("NO_COLOR", "1")
        .output()
        .await
        .expect("run schemathesis");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    server.abort();
    let report: Value = serde_json::from_slice(
        &std::fs::read(&report).unwrap_or_else(|e| panic!("no report ({e}): {stdout}")),
    )
    .expect("the report is JSON");
    w.finish().await;
    figures(report)
}

fn figures(report: Value) -> Figures {
    let cases = report["test_cases"]["generated"].as_u64().unwrap_or(0);
    let mut server_errors = 0;
    let mut mismatches = 0;
    for f in report["failures"].as_array().cloned().unwrap_or_default() {
        let n = f["count"].as_u64().unwrap_or(1);
        if f["code"] == "ST101" {
            server_errors += n;
        } else {
            mismatches += n;
        }
    }
    Figures {
        cases,
        server_errors,
        mismatches,
        report,
    }
}

fn check(name: &str, f: &Figures) {
    eprintln!(
        "{name}: {} cases, {} server errors, {} mismatches",
        f.cases, f.server_errors, f.mismatches
    );
    let r = &f.report;
    assert_eq!(r["complete"], true, "{r:#}");
    assert!(
        r["errors"].as_array().is_some_and(Vec::is_empty),
        "schemathesis could not run some cases: {r:#}"
    );
    assert_eq!(
        r["operations"]["tested"], r["operations"]["selected"],
        "every operation is tested: {r:#}"
    );
    assert!(f.cases > 500, "only {} cases: {r:#}", f.cases);
    assert_eq!(f.server_errors, 0, "server errors: {r:#}");
    assert_eq!(
        f.mismatches, 0,
        "answers that differ from the document: {r:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_cases_on_sqlite_find_no_server_error_and_no_mismatch() {
    let f = run(Backend::Sqlite).await;
    check("sqlite", &f);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_cases_on_postgres_find_no_server_error_and_no_mismatch() {
    let f = run(Backend::Postgres).await;
    check("postgres", &f);
}
