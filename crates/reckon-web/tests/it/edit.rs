//! Editing sources and providers (`PATCH /api/v1/sources/{name}`,
//! `PATCH /api/v1/providers/{name}`): fields left out keep their value, a secret is replaced
//! only when a new one is given (T16), new values pass the checks an addition passes, only
//! admins may edit, another tenant gets 404, and every edit is in the audit log without its
//! secret. On both ledgers.

use crate::common;

use axum::http::{Method, StatusCode};
use common::{Backend, Reply, Req, World, send, token};
use reckon_ledger::Role;
use secrecy::ExposeSecret;
use serde_json::{Value, json};

const PW1: &str = "pw-editcanary-1";
const PW2: &str = "pw-editcanary-2";
const KEY1: &str = "rk_live_editcanary3";
const KEY2: &str = "rk_live_editcanary4";

async fn call(w: &World, method: Method, uri: &str, token: &str, body: Value) -> Reply {
    let r = send(
        &w.app,
        method,
        uri,
        Req {
            token: Some(token),
            content_type: Some("application/json"),
            body: body.to_string(),
            ..Default::default()
        },
    )
    .await;
    assert!(
        !r.text.contains("editcanary"),
        "{uri} answered a secret: {}",
        r.text
    );
    r
}

async fn stored_dsn(w: &World, name: &str) -> String {
    let s = w.ledger.source_by_name(w.a.id, name).await.unwrap();
    w.ledger
        .source_dsn(w.a.id, &s)
        .await
        .unwrap()
        .expose_secret()
        .to_owned()
}

async fn stored_key(w: &World, name: &str) -> Option<String> {
    let p = w.ledger.provider_by_name(w.a.id, name).await.unwrap();
    w.ledger
        .provider_secret(w.a.id, &p)
        .await
        .unwrap()
        .map(|s| s.expose_secret().to_owned())
}

async fn edits(backend: Backend) {
    let w = World::new(backend).await;
    let t = w.token_a.clone();
    let viewer = token(w.ledger.as_ref(), &w.a, Role::Viewer).await;
    let finance = token(w.ledger.as_ref(), &w.a, Role::Finance).await;

    // A source.
    let r = call(
        &w,
        Method::POST,
        "/api/v1/sources",
        &t,
        json!({"name": "orders", "kind": "postgres",
               "dsn": format!("postgres://app:{PW1}@db1.example.com:5432/orders")}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let uri = "/api/v1/sources/orders";

    // Other fields only: the stored DSN (and its password) is untouched.
    let r = call(
        &w,
        Method::PATCH,
        uri,
        &t,
        json!({"scan_interval": "2m", "overlap": "90s"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["scan_interval_secs"], 120);
    assert_eq!(r.json["overlap_secs"], 90.0);
    assert_eq!(r.json["table_name"], "justonce_keys");
    assert_eq!(
        stored_dsn(&w, "orders").await,
        format!("postgres://app:{PW1}@db1.example.com:5432/orders")
    );

    // A new DSN without a password (e.g. the redacted one) keeps it while it names the same
    // host, port, user and database...
    let r = call(
        &w,
        Method::PATCH,
        uri,
        &t,
        json!({"dsn": "postgres://app@db1.example.com:5432/orders?sslmode=require"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        stored_dsn(&w, "orders").await,
        format!("postgres://app:{PW1}@db1.example.com:5432/orders?sslmode=require")
    );
    // ...and a new host needs the password again: the stored one is never sent elsewhere.
    let moved = json!({"dsn": "postgres://app@db2.example.com:5432/orders"});
    let r = call(&w, Method::PATCH, uri, &t, moved).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert!(r.text.contains("password again"), "{}", r.text);
    assert!(!r.text.contains(PW1), "{}", r.text);
    let r = call(
        &w,
        Method::PATCH,
        uri,
        &t,
        json!({"dsn": "postgres://app@db2.example.com:5432/orders", "password": PW1}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(
        r.json["dsn_display"]
            .as_str()
            .unwrap()
            .contains("db2.example.com"),
        "{}",
        r.text
    );
    assert_eq!(
        stored_dsn(&w, "orders").await,
        format!("postgres://app:{PW1}@db2.example.com:5432/orders")
    );
    assert_eq!(r.json["scan_interval_secs"], 120, "other fields stay");

    // The password alone is replaced.
    let r = call(&w, Method::PATCH, uri, &t, json!({"password": PW2})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        stored_dsn(&w, "orders").await,
        format!("postgres://app:{PW2}@db2.example.com:5432/orders")
    );

    // Refused: the same checks as adding, nothing stored, no secret echoed.
    for (body, why) in [
        (
            json!({"dsn": format!("postgres://app:{PW1}@h/db?passfile=/root/.pgpass")}),
            "not allowed",
        ),
        (json!({"dsn": format!("mysql://app:{PW1}@h/db")}), "scheme"),
        (
            json!({"dsn": format!("postgres://app:{PW1}@h/db"), "password": PW1}),
            "not both",
        ),
        (json!({"password": ""}), "empty"),
        (json!({"scan_interval": "0s"}), "at least 1s"),
        (json!({"table": "x; DROP TABLE y"}), "table"),
        (json!({}), "nothing to change"),
    ] {
        let r = call(&w, Method::PATCH, uri, &t, body.clone()).await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{body}: {}",
            r.text
        );
        assert!(r.text.contains(why), "{body}: {}", r.text);
    }
    for (body, status) in [
        (json!({"name": "renamed"}), StatusCode::UNPROCESSABLE_ENTITY),
        (json!({"kind": "mysql"}), StatusCode::UNPROCESSABLE_ENTITY),
    ] {
        let r = call(&w, Method::PATCH, uri, &t, body.clone()).await;
        assert!(r.status.is_client_error(), "{body}: {status} {}", r.text);
    }
    assert_eq!(
        stored_dsn(&w, "orders").await,
        format!("postgres://app:{PW2}@db2.example.com:5432/orders")
    );

    // Only admins; another tenant cannot find it; an unknown name is 404.
    for tok in [&viewer, &finance] {
        let r = call(&w, Method::PATCH, uri, tok, json!({"scan_interval": "5s"})).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
    }
    let r = call(
        &w,
        Method::PATCH,
        uri,
        &w.token_b,
        json!({"scan_interval": "5s"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    let r = call(
        &w,
        Method::PATCH,
        "/api/v1/sources/nope",
        &t,
        json!({"scan_interval": "5s"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    let s = w.ledger.source_by_name(w.a.id, "orders").await.unwrap();
    assert_eq!(s.scan_interval_secs, 120, "a refused edit changed nothing");

    // A push source takes no DSN.
    let r = call(
        &w,
        Method::POST,
        "/api/v1/sources",
        &t,
        json!({"name": "pushed", "kind": "push"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let r = call(
        &w,
        Method::PATCH,
        "/api/v1/sources/pushed",
        &t,
        json!({"dsn": format!("postgres://app:{PW1}@h/db")}),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);

    // A provider.
    let r = call(
        &w,
        Method::POST,
        "/api/v1/providers",
        &t,
        json!({"name": "stripe-live", "kind": "stripe", "secret": KEY1,
               "settings": {"account": "acct_1"}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let puri = "/api/v1/providers/stripe-live";
    let r = call(
        &w,
        Method::PATCH,
        puri,
        &t,
        json!({"settings": {"account": "acct_2"}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["settings"]["account"], "acct_2");
    assert_eq!(r.json["has_secret"], true);
    assert_eq!(stored_key(&w, "stripe-live").await.as_deref(), Some(KEY1));
    let r = call(&w, Method::PATCH, puri, &t, json!({"secret": KEY2})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["settings"]["account"], "acct_2", "settings stay");
    assert_eq!(stored_key(&w, "stripe-live").await.as_deref(), Some(KEY2));
    for (body, why) in [
        (json!({"secret": "  "}), "empty"),
        (json!({"settings": "acct_3"}), "object"),
        (json!({"settings": {"mode": "sandbox"}}), "mode"),
        (json!({}), "nothing to change"),
        // Charges only: keys on PaymentIntents would never be found there.
        (
            json!({"settings": {"list_objects": ["charges"]}}),
            "Stripe does not copy a PaymentIntent's metadata to its charges",
        ),
        (
            json!({"settings": {"list_objects": ["charges"], "override_reason": " "}}),
            "override_reason",
        ),
    ] {
        let r = call(&w, Method::PATCH, puri, &t, body.clone()).await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{body}: {}",
            r.text
        );
        assert!(r.text.contains(why), "{body}: {}", r.text);
    }
    // With a stated reason, the person's word stands (and the calibration checks it).
    let r = call(
        &w,
        Method::PATCH,
        puri,
        &t,
        json!({"settings": {"account": "acct_2", "list_objects": ["charges"],
                            "override_reason": "our keys are on charges (Charges API)"}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = call(&w, Method::PATCH, puri, &viewer, json!({"secret": KEY1})).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
    let r = call(&w, Method::PATCH, puri, &w.token_b, json!({"secret": KEY1})).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    assert_eq!(stored_key(&w, "stripe-live").await.as_deref(), Some(KEY2));

    // An http provider's new base URL passes the egress policy, like one added.
    let r = call(
        &w,
        Method::POST,
        "/api/v1/providers",
        &t,
        json!({"name": "inhouse", "kind": "http", "secret": KEY1,
               "settings": {"base_url": "https://93.184.216.34/lookup"}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    for base in [
        "http://127.0.0.1:9/lookup",
        "http://169.254.169.254/latest",
        "http://[::1]/x",
        "file:///etc/passwd",
    ] {
        let r = call(
            &w,
            Method::PATCH,
            "/api/v1/providers/inhouse",
            &t,
            json!({"settings": {"base_url": base}}),
        )
        .await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{base}: {}",
            r.text
        );
    }
    let p = w.ledger.provider_by_name(w.a.id, "inhouse").await.unwrap();
    assert_eq!(p.settings["base_url"], "https://93.184.216.34/lookup");
    assert_eq!(stored_key(&w, "inhouse").await.as_deref(), Some(KEY1));

    // The audit log has every edit, and no secret.
    let r = send(
        &w.app,
        Method::GET,
        "/api/v1/audit-log",
        Req {
            token: Some(&t),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(!r.text.contains("editcanary"), "{}", r.text);
    let actions: Vec<(String, String)> = r.json["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["action"].as_str().unwrap().to_owned(),
                a["target"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let count = |action: &str, target: &str| {
        actions
            .iter()
            .filter(|(a, t)| a == action && t == target)
            .count()
    };
    assert_eq!(count("source.edit", "orders"), 4, "{actions:?}");
    assert_eq!(count("provider.edit", "stripe-live"), 3, "{actions:?}");
    assert_eq!(count("provider.edit", "inhouse"), 0, "{actions:?}");
    w.finish().await;
}

#[tokio::test]
async fn sources_and_providers_are_edited_keeping_their_secrets_on_sqlite() {
    edits(Backend::Sqlite).await;
}

#[tokio::test]
async fn sources_and_providers_are_edited_keeping_their_secrets_on_postgres() {
    edits(Backend::Postgres).await;
}
