//! The audit's Stripe list path against `localstripe` (PyPI; a stateful fake of Stripe's
//! API), started on loopback by this test from the venv of scripts/test-env.sh.
//!
//! localstripe accepts a single `created[gt]` bound on the charges list and pages with
//! `starting_after`, so the provider runs with `upper_bound: false`: the list is read from
//! now back to the window's start and the upper bound is filtered here (against real Stripe:
//! more pages, never fewer). localstripe stamps objects with the current time, so the audited
//! day is today; the midnight edges are covered by `audit_day.rs`. Its refunds take no
//! `reason`, so a refunded duplicate here stays a duplicate (refunded, not as `duplicate`).

use reckon_domain::{SourceRecord, State, time};
use reckon_engine::audit::{AuditCtx, AuditRequest, run_audit, set_settings};
use reckon_ledger::{IngestBatch, Keyring, NewProvider, NewSource, Origin, SourceKind};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const KEY: &str = "sk_test_reckon_audit";

fn venv_python() -> String {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/test-env.sh");
    let out = Command::new(&script)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "test-env.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

struct LocalStripe {
    base: String,
    _child: tokio::process::Child,
    _cwd: tempfile::TempDir,
}

async fn localstripe() -> LocalStripe {
    let py = venv_python();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cwd = tempfile::tempdir().unwrap();
    let child = tokio::process::Command::new(&py)
        .args([
            "-m",
            "localstripe",
            "--port",
            &port.to_string(),
            "--from-scratch",
        ])
        .current_dir(cwd.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("start localstripe with {py}: {e}"));
    let base = format!("http://127.0.0.1:{port}");
    let client = http();
    for _ in 0..200 {
        if let Ok(r) = client
            .get(format!("{base}/v1/customers"))
            .bearer_auth(KEY)
            .send()
            .await
            && r.status().is_success()
        {
            return LocalStripe {
                base,
                _child: child,
                _cwd: cwd,
            };
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("localstripe did not answer on {base} within 20 s");
}

fn http() -> reqwest::Client {
    // GetClient installs the process's TLS provider, which reqwest's builder needs.
    let _ = reckon_providers::GetClient::new(Duration::from_secs(10));
    reqwest::Client::new()
}

async fn post(base: &str, path: &str, form: &[(&str, String)]) -> Value {
    let r = http()
        .post(format!("{base}{path}"))
        .bearer_auth(KEY)
        .form(form)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let v: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    assert!(status.is_success(), "{path}: {status} {v}");
    v
}

async fn charge(base: &str, pm: &str, amount: i64, currency: &str, key: Option<&str>) -> String {
    let mut form = vec![
        ("amount", amount.to_string()),
        ("currency", currency.to_owned()),
        ("source", pm.to_owned()),
    ];
    if let Some(k) = key {
        form.push(("metadata[idempotency_key]", k.to_owned()));
    }
    post(base, "/v1/charges", &form).await["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn record(key: &str, state: State, at: f64) -> SourceRecord {
    SourceRecord {
        key: key.into(),
        state,
        request_hash: "1:9f86d081884c7d65".into(),
        response: None,
        attempts: 1,
        created_at: at,
        updated_at: at + 1.0,
        expires_at: None,
    }
}

#[tokio::test]
async fn the_stripe_list_path_against_localstripe_finds_exactly_the_planted_problems() {
    let ls = localstripe().await;
    let pm = post(
        &ls.base,
        "/v1/payment_methods",
        &[
            ("type", "card".into()),
            ("card[number]", "4242424242424242".into()),
            ("card[exp_month]", "12".into()),
            ("card[exp_year]", "2030".into()),
            ("card[cvc]", "123".into()),
        ],
    )
    .await["id"]
        .as_str()
        .unwrap()
        .to_owned();

    // The day is today, in a zone where now is at least ten minutes from midnight.
    let now = time::now();
    let secs_of_day = now.rem_euclid(86_400.0);
    let zone = if (900.0..85_500.0).contains(&secs_of_day) {
        "UTC"
    } else {
        "Asia/Tokyo"
    };
    let today = reckon_audit::DayWindow::yesterday(now + 86_400.0, zone)
        .unwrap()
        .date;

    let dir = tempfile::tempdir().unwrap();
    let keyring = Keyring::from_base64(&Keyring::generate_base64()).unwrap();
    let ledger = reckon_ledger::connect(None, dir.path(), keyring)
        .await
        .unwrap();
    let t = ledger.create_tenant("acme").await.unwrap().id;
    set_settings(ledger.as_ref(), t, Some(zone), None)
        .await
        .unwrap();
    let source = ledger
        .add_source(
            t,
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

    // 105 ordinary charges (two pages of 100), in two currencies.
    let mut records = Vec::new();
    let at = now - 60.0;
    let (mut usd, mut eur) = (0i64, 0i64);
    for i in 0..105i64 {
        let key = format!("charge:v1:LS-{i}");
        records.push(record(&key, State::Succeeded, at));
        let (amount, cur) = if i % 4 == 0 {
            (700 + i, "eur")
        } else {
            (1100 + i, "usd")
        };
        if cur == "eur" {
            eur += amount;
        } else {
            usd += amount;
        }
        charge(&ls.base, &pm, amount, cur, Some(&key)).await;
    }
    // A duplicate, and a second one whose extra charge was refunded (no reason: localstripe
    // takes none), both under one key.
    records.push(record("charge:v1:DUP-1", State::Succeeded, at));
    charge(&ls.base, &pm, 4200, "usd", Some("charge:v1:DUP-1")).await;
    charge(&ls.base, &pm, 4200, "usd", Some("charge:v1:DUP-1")).await;
    records.push(record("charge:v1:DUP-2", State::Succeeded, at));
    charge(&ls.base, &pm, 990, "eur", Some("charge:v1:DUP-2")).await;
    let extra = charge(&ls.base, &pm, 990, "eur", Some("charge:v1:DUP-2")).await;
    post(&ls.base, "/v1/refunds", &[("charge", extra)]).await;
    usd += 8400;
    eur += 1980;
    // An orphan; a missing one; an unknown one.
    let orphan = charge(&ls.base, &pm, 31_415, "usd", None).await;
    usd += 31_415;
    records.push(record("charge:v1:MISS-1", State::Succeeded, at));
    records.push(record("charge:v1:UNK-1", State::Unknown, at));
    ledger
        .ingest(
            t,
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
    ledger
        .add_provider(
            t,
            NewProvider {
                name: "stripe-test".into(),
                kind: reckon_ledger::ProviderKind::Stripe,
                secret: Some(secrecy::SecretString::from(KEY.to_owned())),
                settings: json!({
                    "base_url": ls.base, "mode": "test", "list_objects": ["charges"],
                    "upper_bound": false, "rate_per_sec": 0
                }),
            },
        )
        .await
        .unwrap();
    ledger
        .set_route(t, "shop", "charge", Some("stripe-test"))
        .await
        .unwrap();

    let mut ctx = AuditCtx::new(ledger.clone());
    // localstripe listens on loopback, which the default policy refuses.
    ctx.egress = std::sync::Arc::new(
        reckon_sources::EgressPolicy::new(&["127.0.0.0/8".to_owned()], None).unwrap(),
    );
    let req = AuditRequest {
        date: Some(today.clone()),
        provider: None,
        triggered_by: "operator".into(),
        now: time::now(),
    };
    let run = run_audit(&ctx, t, &req, None).await.unwrap();
    assert_eq!(run.run.status, "complete", "{:?}", run.run.reason);

    let kinds = |kind: &str| -> BTreeSet<String> {
        run.run
            .findings
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["kind"] == kind)
            .map(|f| {
                let e = f["effects"].as_array().unwrap();
                match e.first() {
                    Some(e) => e["key"].as_str().unwrap().to_owned(),
                    None => f["charges"][0]["id"].as_str().unwrap().to_owned(),
                }
            })
            .collect()
    };
    let set = |items: &[&str]| {
        items
            .iter()
            .map(std::string::ToString::to_string)
            .collect::<BTreeSet<_>>()
    };
    assert_eq!(
        kinds("duplicate"),
        set(&["charge:v1:DUP-1", "charge:v1:DUP-2"])
    );
    assert_eq!(kinds("orphan"), set(&[orphan.as_str()]));
    assert_eq!(kinds("missing"), set(&["charge:v1:MISS-1"]));
    assert_eq!(kinds("unresolved"), set(&["charge:v1:UNK-1"]));
    assert_eq!(
        run.run.findings.as_array().unwrap().len(),
        5,
        "nothing spurious"
    );

    let totals = run.run.totals.as_array().unwrap();
    let of = |cur: &str| {
        totals
            .iter()
            .find(|x| x["currency"] == cur)
            .unwrap()
            .clone()
    };
    assert_eq!(of("usd")["charged"], usd);
    assert_eq!(of("usd")["unmatched"], 31_415);
    assert_eq!(of("usd")["refunded"], 0);
    assert_eq!(of("eur")["charged"], eur);
    assert_eq!(of("eur")["refunded"], 990);
    assert_eq!(of("eur")["net"], eur - 990);

    // Every page went through the list path with starting_after, to has_more: false.
    let pages = run.run.evidence["pages"].as_array().unwrap();
    let lists: Vec<&Value> = pages
        .iter()
        .filter(|p| p["method"] == "stripe.list.charges")
        .collect();
    assert!(lists.len() >= 2, "{pages:?}");
    assert!(lists[1]["cursor"].as_str().unwrap().starts_with("ch_"));
    let listed: u64 = lists.iter().map(|p| p["in_window"].as_u64().unwrap()).sum();
    assert_eq!(listed, 105 + 4 + 1);
}
