//! `/api/v1/audits`: the finance role's view of stored audit runs, as JSON and as
//! CSV (by `Accept: text/csv` or `?format=csv`), running one, and the refusals (a viewer's
//! token, a malformed date or id, an unknown format, another tenant's run). Both ledgers.

use crate::common;

use axum::http::{Method, StatusCode, header};
use common::{Backend, Req, World, send, token};
use reckon_ledger::{NewAuditRun, Role};
use serde_json::json;

fn run_with_a_formula() -> NewAuditRun {
    NewAuditRun {
        day: "2026-11-28".into(),
        time_zone: "Europe/Paris".into(),
        window_start: 1_795_820_400.0,
        window_end: 1_795_906_800.0,
        provider: "*".into(),
        triggered_by: "schedule".into(),
        status: "complete".into(),
        reason: None,
        started_at: 1_795_930_000.0,
        finished_at: 1_795_930_002.0,
        counts: json!({"findings": {"orphan": 1}}),
        findings: json!([{
            "kind": "orphan", "summary": "charge =HYPERLINK(\"http://x\") matches no effect",
            "effects": [], "amount": 1999, "currency": "eur", "refunded": false,
            "charges": [{"id": "=HYPERLINK(\"http://x\")", "amount": 1999, "currency": "eur",
                         "status": "succeeded", "amount_refunded": 0, "customer": "cus_1",
                         "created": 1_795_830_000.0}],
            "suggestions": []
        }]),
        totals: json!([{"currency": "eur", "charged": 1999, "refunded": 0, "net": 1999,
                        "matched": 0, "unmatched": 1999}]),
        evidence: json!({"pages": []}),
    }
}

async fn audits_api(backend: Backend) {
    let w = World::new(backend).await;
    let id = w
        .ledger
        .record_audit_run(w.a.id, run_with_a_formula(), None)
        .await
        .unwrap()
        .id;
    let get = |uri: String, tok: String, accept: Option<&'static str>| {
        let app = w.app.clone();
        async move {
            let headers = accept
                .map(|a| vec![("accept", a.to_owned())])
                .unwrap_or_default();
            send(
                &app,
                Method::GET,
                &uri,
                Req {
                    token: Some(&tok),
                    headers,
                    ..Default::default()
                },
            )
            .await
        }
    };
    let admin = w.token_a.clone();

    // The list, of one day.
    let r = get("/api/v1/audits?date=2026-11-28".into(), admin.clone(), None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["runs"][0]["id"], id);
    assert_eq!(r.json["runs"][0]["status"], "complete");
    assert!(
        r.json["runs"][0].get("findings").is_none(),
        "the list is a summary"
    );
    let r = get("/api/v1/audits?date=2026-11-27".into(), admin.clone(), None).await;
    assert_eq!(r.json["runs"], json!([]));

    // One run, JSON.
    let r = get(format!("/api/v1/audits/{id}"), admin.clone(), None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["run"]["findings"][0]["kind"], "orphan");
    assert_eq!(r.json["run"]["digest"].as_str().unwrap().len(), 64);

    // CSV, by Accept and by ?format=csv: the same text, parsed back, neutralised.
    let by_accept = get(
        format!("/api/v1/audits/{id}"),
        admin.clone(),
        Some("text/csv"),
    )
    .await;
    let by_query = get(
        format!("/api/v1/audits/{id}?format=csv"),
        admin.clone(),
        None,
    )
    .await;
    for r in [&by_accept, &by_query] {
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        assert!(
            r.headers[header::CONTENT_TYPE]
                .to_str()
                .unwrap()
                .starts_with("text/csv")
        );
    }
    assert_eq!(by_accept.text, by_query.text);
    let mut rd = csv::Reader::from_reader(by_query.text.as_bytes());
    let header: Vec<String> = rd.headers().unwrap().iter().map(str::to_owned).collect();
    let rows: Vec<csv::StringRecord> = rd.records().map(|x| x.unwrap()).collect();
    let col = |n: &str| header.iter().position(|h| h == n).unwrap();
    // The finding, then the day's totals.
    assert_eq!(rows.len(), 2);
    assert_eq!(&rows[1][col("kind")], "total");
    assert_eq!(&rows[0][col("charge_ids")], "'=HYPERLINK(\"http://x\")");
    assert_eq!(&rows[0][col("amount")], "19.99");
    assert_eq!(&rows[0][col("currency")], "EUR");
    assert_eq!(&rows[0][col("charge_created")], "2026-11-28T02:40:00+01:00");
    // ?format=json wins over Accept.
    let r = get(
        format!("/api/v1/audits/{id}?format=json"),
        admin.clone(),
        Some("text/csv"),
    )
    .await;
    assert_eq!(r.json["run"]["id"], id);

    // Refusals, with clear words.
    let r = get("/api/v1/audits?date=28/11/2026".into(), admin.clone(), None).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(r.text.contains("YYYY-MM-DD"), "{}", r.text);
    let r = get("/api/v1/audits/abc".into(), admin.clone(), None).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    let r = get(
        format!("/api/v1/audits/{id}?format=xml"),
        admin.clone(),
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    let r = get("/api/v1/audits/999999".into(), admin.clone(), None).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    // Another tenant's run does not exist for B.
    let r = get(format!("/api/v1/audits/{id}"), w.token_b.clone(), None).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    assert!(!r.text.contains("HYPERLINK"));
    // Audits are finance's: a viewer or support token is refused.
    for role in [Role::Viewer, Role::Support] {
        let t = token(w.ledger.as_ref(), &w.a, role).await;
        let r = get("/api/v1/audits".into(), t.clone(), None).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
        let r = get(format!("/api/v1/audits/{id}"), t, None).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
    }
    let finance = token(w.ledger.as_ref(), &w.a, Role::Finance).await;
    let r = get(format!("/api/v1/audits/{id}"), finance.clone(), None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);

    // Running one: tenant A has no provider, so the run is stored as failed, with the reason.
    let r = send(
        &w.app,
        Method::POST,
        "/api/v1/audits",
        Req {
            token: Some(&finance),
            content_type: Some("application/json"),
            body: json!({"date": "2026-11-29"}).to_string(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(r.json["run"]["status"], "failed");
    assert!(
        r.json["run"]["reason"]
            .as_str()
            .unwrap()
            .contains("no provider")
    );
    assert_eq!(r.json["run"]["seq"], 2);
    assert!(
        r.json["run"]["triggered_by"]
            .as_str()
            .unwrap()
            .starts_with("token:")
    );
    // The gauges show the tenant's newest complete run (the seeded one), in its own series.
    let r = get("/api/v1/metrics".into(), admin.clone(), None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    for line in [
        "reckon_audit_findings{kind=\"orphan\",tenant=\"acme\"} 1",
        "reckon_audit_last_run_timestamp_seconds{tenant=\"acme\"} 1795930002",
    ] {
        assert!(r.text.contains(line), "{line} not in\n{}", r.text);
    }
    let r = send(
        &w.app,
        Method::POST,
        "/api/v1/audits",
        Req {
            token: Some(&finance),
            content_type: Some("application/json"),
            body: json!({"date": "2026-02-30"}).to_string(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert!(r.text.contains("2026-02-30"), "{}", r.text);
    let r = send(
        &w.app,
        Method::POST,
        "/api/v1/audits",
        Req {
            token: Some(&finance),
            content_type: Some("application/json"),
            body: json!({"day": "2026-11-28"}).to_string(),
            ..Default::default()
        },
    )
    .await;
    assert!(r.status.is_client_error(), "unknown field: {}", r.status);
    w.finish().await;
}

#[tokio::test]
async fn audits_api_json_csv_run_and_refusals_on_sqlite() {
    audits_api(Backend::Sqlite).await;
}

#[tokio::test]
async fn audits_api_json_csv_run_and_refusals_on_postgres() {
    audits_api(Backend::Postgres).await;
}
