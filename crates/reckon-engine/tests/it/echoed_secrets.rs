//! A provider that echoes the key it was sent, disguised (base64 in both alphabets, padded
//! or not, inside `Basic` credentials, percent-encoded, hex, reversed, upper case, split
//! between two fields of its error), gets none of it stored: not in the attempt's evidence,
//! the effect's last error or the reason shown to support and finance. And what is kept of
//! its error answer is its type, code and message, not the rest of the body. On both
//! ledgers.

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use reckon_domain::{SourceRecord, State, time};
use reckon_engine::reconcile::{ReconcileCtx, reconcile_all};
use reckon_ledger::{IngestBatch, Keyring, Ledger, NewProvider, NewSource, Origin, SourceKind};
use serde_json::{Value, json};
use sqlx::{AssertSqlSafe, Connection};
use std::sync::Arc;
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

const KEY: &str = "rk_test_51EchoedCanaryAbCdEfGhIjKlMnOpQrStUv";
/// Only in the part of the body that explains nothing.
const BODY_ONLY: &str = "NotAnExplanationMarker";

fn disguises() -> Vec<(&'static str, String, Option<String>)> {
    let b = KEY.as_bytes();
    let (first, second) = KEY.split_at(22);
    vec![
        ("std base64", STANDARD.encode(b), None),
        ("std base64 unpadded", STANDARD_NO_PAD.encode(b), None),
        ("url-safe base64", URL_SAFE.encode(b), None),
        ("url-safe base64 unpadded", URL_SAFE_NO_PAD.encode(b), None),
        (
            "basic credentials",
            STANDARD.encode(format!("{KEY}:")),
            None,
        ),
        (
            "percent-encoded",
            b.iter().map(|x| format!("%{x:02X}")).collect(),
            None,
        ),
        ("hex", hex::encode(b), None),
        ("HEX", hex::encode_upper(b), None),
        // JSON escapes are left out here: six characters a byte, the key's escapes do not
        // fit the message's 200-character excerpt, and a cut form is not recognised (the
        // redactor's own tests cover a whole one).
        ("reversed", KEY.chars().rev().collect(), None),
        ("upper case", KEY.to_uppercase(), None),
        ("split", first.to_owned(), Some(second.to_owned())),
    ]
}

/// Every string of `v`.
fn strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        Value::Object(m) => {
            for (k, x) in m {
                out.push(k.clone());
                strings(x, out);
            }
        }
        _ => {}
    }
}

async fn one_tenant(ledger: &dyn Ledger, n: usize, server: &MockServer) -> reckon_ledger::Tenant {
    let t = ledger.create_tenant(&format!("t{n}")).await.unwrap();
    let source = ledger
        .add_source(
            t.id,
            NewSource {
                name: "shop".into(),
                kind: SourceKind::Push,
                dsn: None,
                dsn_display: None,
                table_name: "justonce_keys".into(),
                scan_interval_secs: 60,
                abandoned_after_secs: 300.0,
                overlap_secs: 5.0,
                full_scan_every_secs: 3600,
                mapping: None,
            },
        )
        .await
        .unwrap();
    let at = time::now() - 7200.0;
    ledger
        .ingest(
            t.id,
            source.id,
            IngestBatch {
                origin: Origin::Push,
                observed_at: time::now() - 120.0,
                records: vec![SourceRecord {
                    key: "charge:v1:ORD-ECHO".into(),
                    state: State::Unknown,
                    request_hash: "1:9f86d081884c7d65".into(),
                    response: None,
                    attempts: 1,
                    created_at: at - 1.0,
                    updated_at: at,
                    expires_at: None,
                }],
                rejected: vec![],
                abandoned_after_secs: 300.0,
                cursor: None,
                lease: None,
                expect_new: false,
            },
        )
        .await
        .unwrap();
    ledger
        .add_provider(
            t.id,
            NewProvider {
                name: "stripe".into(),
                kind: reckon_ledger::ProviderKind::Stripe,
                secret: Some(secrecy::SecretString::from(KEY.to_owned())),
                settings: json!({"base_url": server.uri(), "mode": "test", "rate_per_sec": 0}),
            },
        )
        .await
        .unwrap();
    ledger
        .set_route(t.id, "shop", "charge", Some("stripe"))
        .await
        .unwrap();
    t
}

async fn nothing_stored(ledger: Arc<dyn Ledger>) {
    let loopback =
        reckon_sources::EgressPolicy::new(&["127.0.0.0/8".to_owned()], None).expect("policy");
    let ctx = ReconcileCtx::new(ledger.clone()).with_egress(Arc::new(loopback));
    for (n, (what, form, second)) in disguises().into_iter().enumerate() {
        let server = MockServer::start().await;
        let (message, code) = match &second {
            None => (
                format!("Invalid API Key provided: {form}"),
                "api_key_invalid".to_owned(),
            ),
            Some(rest) => (format!("Invalid API Key provided: {form}"), rest.clone()),
        };
        Mock::given(method("GET"))
            .respond_with(ResponseTemplate::new(500).set_body_json(json!({
                "error": {"type": "api_error", "code": code, "message": message,
                          "echo": {"note": BODY_ONLY, "authorization": format!("Basic {form}")}}
            })))
            .mount(&server)
            .await;
        let t = one_tenant(ledger.as_ref(), n, &server).await;
        let outcomes = reconcile_all(&ctx, &t).await.unwrap();
        assert_eq!(outcomes.len(), 1, "{what}");
        let view = ledger
            .reconcile_view(t.id, outcomes[0].effect_id)
            .await
            .unwrap();
        let mut all = vec![outcomes[0].reason.clone()];
        strings(&serde_json::to_value(&view).unwrap(), &mut all);
        let text = all.join("\n");
        assert!(
            text.contains("Invalid API Key provided: [redacted]"),
            "{what}: the provider's message is kept, its key is not: {text}"
        );
        for s in &all {
            assert!(!s.contains(&form), "{what}: {s}");
            if let Some(rest) = &second {
                assert!(!s.contains(rest.as_str()), "{what}: {s}");
            }
            assert!(!s.contains("EchoedCanary"), "{what}: {s}");
            assert!(
                !s.contains(BODY_ONLY),
                "{what}: the whole body was kept: {s}"
            );
        }
    }
}

#[tokio::test]
async fn an_echoed_key_in_disguise_is_not_stored_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let keyring = Keyring::from_base64(&Keyring::generate_base64()).unwrap();
    let ledger = reckon_ledger::connect(None, dir.path(), keyring)
        .await
        .unwrap();
    nothing_stored(ledger).await;
}

#[tokio::test]
async fn an_echoed_key_in_disguise_is_not_stored_on_postgres() {
    let admin = "postgres://postgres@127.0.0.1:5432/postgres";
    let db = format!("reckon_echo_{:016x}", rand::random::<u64>());
    let mut conn = sqlx::PgConnection::connect(admin)
        .await
        .expect("PostgreSQL must be running for this test");
    sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE \"{db}\"")))
        .execute(&mut conn)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let keyring = Keyring::from_base64(&Keyring::generate_base64()).unwrap();
    let url = format!("postgres://postgres@127.0.0.1:5432/{db}");
    let ledger = reckon_ledger::connect(Some(&url), dir.path(), keyring)
        .await
        .unwrap();
    nothing_stored(ledger.clone()).await;
    drop(ledger);
    let _ = sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS \"{db}\" WITH (FORCE)"
    )))
    .execute(&mut conn)
    .await;
}
