//! The Stripe adapter's list path (L2) against `localstripe` (PyPI), someone else's model
//! of Stripe, started on loopback from this test: charges made with the key in their
//! metadata resolve `applied`, `duplicate`, and `not_applied` (a complete window with no
//! match, past the visibility lag). localstripe accepts only a single `created[gt]` bound
//! on lists, so the provider is configured without the upper bound (more pages, never
//! fewer: correct against real Stripe too). Its other answers, a 400 to `created[gte]`
//! and a 404 to search, are exactly the kind that must come out `indeterminate`.

use reckon_domain::{SourceRecord, State, time};
use reckon_engine::reconcile::{ReconcileCtx, reconcile_all};
use reckon_ledger::{IngestBatch, Keyring, Ledger, NewProvider, NewSource, Origin, SourceKind};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const KEY: &str = "sk_test_reckon_localstripe";

struct LocalStripe {
    child: Child,
    base: String,
}

impl Drop for LocalStripe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn venv_bin(name: &str) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/test-env.sh");
    let out = Command::new(script).output().expect("scripts/test-env.sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let python = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    Path::new(&python)
        .with_file_name(name)
        .to_string_lossy()
        .into_owned()
}

async fn start_localstripe() -> LocalStripe {
    // reqwest is built without a bundled TLS crypto provider; this installs the process's
    // (ring), as reckon itself does.
    let _ = reckon_providers::GetClient::shared();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = Command::new(venv_bin("localstripe"))
        // Every localstripe keeps its state in the one file /tmp/localstripe.pickle and,
        // without --from-scratch, loads it at start: instances running side by side
        // would read each other's half-written state (and charges).
        .args(["--port", &port.to_string(), "--from-scratch"])
        .stdout(Stdio::null())
        .stderr(log.reopen().unwrap())
        .spawn()
        .expect("start localstripe (testdata/requirements.txt)");
    let base = format!("http://127.0.0.1:{port}/");
    // Generous: a loaded 2-core CI machine starts Python slowly.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "localstripe exited ({status}): {}",
                std::fs::read_to_string(log.path()).unwrap_or_default()
            );
        }
        let up = reqwest::Client::new()
            .get(format!("{base}v1/events"))
            .basic_auth(KEY, Some(""))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if up {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "localstripe did not answer within 120 s: {}",
            std::fs::read_to_string(log.path()).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    LocalStripe { child, base }
}

/// Make a charge the way an application would (this test's setup is allowed to POST; the
/// adapter under test is not able to).
async fn charge(base: &str, amount: i64, key: &str) -> Value {
    let http = reqwest::Client::new();
    let pm: Value = http
        .post(format!("{base}v1/payment_methods"))
        .basic_auth(KEY, Some(""))
        .form(&[
            ("type", "card"),
            ("card[number]", "4242424242424242"),
            ("card[exp_month]", "12"),
            ("card[exp_year]", "2034"),
            ("card[cvc]", "123"),
        ])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let pm = pm["id"].as_str().expect("a payment method id").to_owned();
    let amount = amount.to_string();
    let ch: Value = http
        .post(format!("{base}v1/charges"))
        .basic_auth(KEY, Some(""))
        .form(&[
            ("amount", amount.as_str()),
            ("currency", "usd"),
            ("source", pm.as_str()),
            ("metadata[idempotency_key]", key),
        ])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ch["status"], "succeeded", "{ch}");
    ch
}

fn unknown(key: &str, created_at: f64) -> SourceRecord {
    SourceRecord {
        key: key.to_owned(),
        state: State::Unknown,
        request_hash: "1:9f86d081884c7d65".to_owned(),
        response: None,
        attempts: 1,
        created_at,
        updated_at: created_at + 1.0,
        expires_at: None,
    }
}

async fn ledger_with(
    records: Vec<SourceRecord>,
) -> (tempfile::TempDir, Arc<dyn Ledger>, reckon_ledger::Tenant) {
    let dir = tempfile::tempdir().unwrap();
    let keyring = Keyring::from_base64(&Keyring::generate_base64()).unwrap();
    let ledger = reckon_ledger::connect(None, dir.path(), keyring)
        .await
        .unwrap();
    let t = ledger.create_tenant("acme").await.unwrap();
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
    ledger
        .ingest(
            t.id,
            source.id,
            IngestBatch {
                origin: Origin::Push,
                observed_at: time::now(),
                records,
                rejected: vec![],
                abandoned_after_secs: 300.0,
                cursor: None,
                lease: None,
                expect_new: false,
            },
        )
        .await
        .unwrap();
    (dir, ledger, t)
}

async fn add_stripe(ledger: &dyn Ledger, t: &reckon_ledger::Tenant, name: &str, settings: Value) {
    ledger
        .add_provider(
            t.id,
            NewProvider {
                name: name.into(),
                kind: reckon_ledger::ProviderKind::Stripe,
                secret: Some(KEY.to_owned().into()),
                settings,
            },
        )
        .await
        .unwrap();
    ledger
        .set_route(t.id, "shop", "charge", Some(name))
        .await
        .unwrap();
}

fn loopback() -> Arc<reckon_sources::EgressPolicy> {
    Arc::new(reckon_sources::EgressPolicy::new(&["127.0.0.0/8".to_owned()], None).unwrap())
}

/// localstripe lists charges, but has no search, and its events carry no request key: a
/// provider like it has no key-indexed view that could show a payment made outside the
/// effect's window (another clock, another object). reckon finds the charge and the
/// duplicate, and certifies neither absence nor uniqueness from its lists: those stay
/// provisional and say which witness is missing.
#[tokio::test(flavor = "multi_thread")]
async fn the_stripe_list_path_against_localstripe_finds_applied_duplicate_and_certifies_no_absence_without_a_witness()
 {
    let ls = start_localstripe().await;
    let once = charge(&ls.base, 2000, "charge:v1:ORD-1").await;
    charge(&ls.base, 500, "charge:v1:ORD-3").await;
    charge(&ls.base, 500, "charge:v1:ORD-3").await;
    // Someone else's charge in the same window: it must not be matched to anything.
    charge(&ls.base, 700, "charge:v1:ORD-OTHER").await;
    // The calls ended now: every charge is inside their windows, however long localstripe
    // took to make them.
    let now = time::now();
    // Effects made a few seconds ago (their window, 2 s of skew included, and the 1 s
    // visibility lag set below are past by the lookup, in the whole seconds lists are
    // read in).
    let (_dir, ledger, t) = ledger_with(vec![
        unknown("charge:v1:ORD-1", now - 3.0),
        unknown("charge:v1:ORD-2", now - 3.0),
        unknown("charge:v1:ORD-3", now - 3.0),
    ])
    .await;
    tokio::time::sleep(Duration::from_millis(4500)).await;
    add_stripe(
        &*ledger,
        &t,
        "stripe-test",
        json!({
            "base_url": ls.base, "mode": "test", "upper_bound": false,
            "use_search": false, "use_events": false, "visibility_lag_secs": 1.0,
            "max_call_secs": 1.0, "skew_secs": 2.0,
            "list_objects": ["charges"], "rate_per_sec": 0,
        }),
    )
    .await;
    let ctx = ReconcileCtx::new(ledger.clone()).with_egress(loopback());
    let out = reconcile_all(&ctx, &t).await.unwrap();
    let by_key: HashMap<&str, (&str, bool)> = out
        .iter()
        .map(|o| (o.key.as_str(), (o.outcome.as_str(), o.resolved)))
        .collect();
    assert_eq!(by_key["charge:v1:ORD-1"], ("applied", false), "{out:?}");
    assert_eq!(by_key["charge:v1:ORD-3"], ("duplicate", true), "{out:?}");
    assert_eq!(by_key["charge:v1:ORD-2"], ("not_applied", false), "{out:?}");
    for o in out.iter().filter(|o| !o.resolved) {
        assert!(
            o.reason.contains("no view that would have shown"),
            "{}: {}",
            o.key,
            o.reason
        );
    }

    // The evidence names localstripe's own object; the absence has no certificate.
    let e1 = ledger
        .get_effect(t.id, "shop", "charge:v1:ORD-1")
        .await
        .unwrap()
        .unwrap();
    let v1 = ledger.reconcile_view(t.id, e1.effect.id).await.unwrap();
    let ev = v1.attempts.last().unwrap().evidence.to_string();
    assert!(ev.contains(once["id"].as_str().unwrap()), "{ev}");
    let e2 = ledger
        .get_effect(t.id, "shop", "charge:v1:ORD-2")
        .await
        .unwrap()
        .unwrap();
    let v2 = ledger.reconcile_view(t.id, e2.effect.id).await.unwrap();
    assert!(v2.resolution.is_none());
    let ev2 = &v2.attempts.last().unwrap().evidence["classification"];
    assert!(ev2["certificate"].is_null(), "{ev2}");
    assert_eq!(ev2["provisional"], true, "{ev2}");
}

#[tokio::test(flavor = "multi_thread")]
async fn what_localstripe_cannot_answer_comes_out_indeterminate_never_not_applied() {
    let ls = start_localstripe().await;
    let now = time::now();
    charge(&ls.base, 2000, "charge:v1:ORD-1").await;
    let (_dir, ledger, t) = ledger_with(vec![
        unknown("charge:v1:ORD-1", now - 5.0),
        unknown("charge:v1:ORD-2", now - 5.0),
    ])
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // With both bounds (`created[gte]` + `created[lte]`, what real Stripe takes) localstripe
    // answers 400; its search endpoint does not exist (404).
    add_stripe(
        &*ledger,
        &t,
        "stripe-both-bounds",
        json!({
            "base_url": ls.base, "mode": "test", "upper_bound": true,
            "use_search": true, "use_events": false, "visibility_lag_secs": 1.0,
            "max_call_secs": 1.0, "skew_secs": 30.0,
            "rate_per_sec": 0,
        }),
    )
    .await;
    let ctx = ReconcileCtx::new(ledger.clone()).with_egress(loopback());
    let out = reconcile_all(&ctx, &t).await.unwrap();
    let absent = out.iter().find(|o| o.key == "charge:v1:ORD-2").unwrap();
    assert_eq!(
        (absent.outcome.as_str(), absent.resolved),
        ("indeterminate", false),
        "{out:?}"
    );
    // A key mode that does not match the configured mode is refused before any request.
    let (_dir2, ledger2, t2) = ledger_with(vec![unknown("charge:v1:ORD-1", now - 5.0)]).await;
    add_stripe(
        &*ledger2,
        &t2,
        "stripe-live-with-test-key",
        json!({ "base_url": ls.base, "mode": "live", "upper_bound": false, "use_search": false,
                "use_events": false }),
    )
    .await;
    let ctx2 = ReconcileCtx::new(ledger2.clone()).with_egress(loopback());
    let out2 = reconcile_all(&ctx2, &t2).await.unwrap();
    assert_eq!(out2[0].outcome, "indeterminate", "{out2:?}");
    assert!(
        out2[0].needs_attention,
        "a wrong key needs a person: {out2:?}"
    );
}
