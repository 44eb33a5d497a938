//! `reckon audit` as an operator runs it: the binary against an embedded ledger
//! whose tenant has a demo provider on loopback (served by this test) and a day of effects.
//! Settings, a run in each format (JSON and CSV parsed back), `list`, `verify` on an intact
//! chain and after an edit (exit 1), and a bad date refused by name.

use reckon_domain::{SourceRecord, State};
use reckon_ledger::{IngestBatch, Keyring, NewProvider, NewSource, Origin, SourceKind};
use reckon_providers::demo::{DemoCharge, DemoState, serve_loopback};
use serde_json::Value;
use sqlx::Connection;
use std::collections::BTreeMap;
use std::path::Path;

const DAY: &str = "2026-11-28";
/// Midnight in New York on DAY, in UTC.
const START: f64 = 1_795_842_000.0;

async fn reckon(data: &Path, args: &[&str]) -> (i32, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_reckon"))
        .arg("--data-dir")
        .arg(data)
        .args(args)
        .env("RECKON_LOG", "warn")
        // The demo provider listens on loopback, which the default egress policy refuses.
        .env("RECKON_EGRESS_ALLOW", r#"["127.0.0.1/32"]"#)
        .output()
        .await
        .expect("run reckon");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
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

fn charge(id: &str, key: &str, amount: i64, at: f64) -> DemoCharge {
    DemoCharge {
        id: id.into(),
        key: key.into(),
        status: "succeeded".into(),
        amount,
        currency: "usd".into(),
        created: at,
        refunds: vec![],
        metadata: BTreeMap::new(),
        customer: None,
    }
}

#[tokio::test]
async fn reckon_audit_runs_prints_every_format_and_verify_catches_an_edit() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    // The same master key file the binary loads.
    let keyring = Keyring::load_or_create_file(&data.join("master.key")).unwrap();
    let ledger = reckon_ledger::connect(None, &data, keyring).await.unwrap();
    let t = ledger.create_tenant("acme").await.unwrap().id;
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
    let h = START + 3600.0;
    ledger
        .ingest(
            t,
            source.id,
            IngestBatch {
                origin: Origin::Push,
                observed_at: reckon_domain::time::now(),
                records: vec![
                    record("charge:v1:A", State::Succeeded, h),
                    record("charge:v1:B", State::Succeeded, h + 10.0),
                    record("charge:v1:C", State::Unknown, h + 20.0),
                ],
                rejected: vec![],
                abandoned_after_secs: 300.0,
                cursor: None,
                lease: None,
                expect_new: false,
            },
        )
        .await
        .unwrap();
    let demo = DemoState::new();
    demo.add(charge("ch_a1", "charge:v1:A", 2500, h + 1.0));
    demo.add(charge("ch_a2", "charge:v1:A", 2500, h + 30.0));
    demo.add(charge("ch_orphan", "", 990, h + 60.0));
    let (base, _server) = serve_loopback(demo).await.unwrap();
    ledger
        .add_provider(
            t,
            NewProvider {
                name: "pay".into(),
                kind: reckon_ledger::ProviderKind::Demo,
                secret: None,
                settings: serde_json::json!({ "base_url": base }),
            },
        )
        .await
        .unwrap();
    ledger
        .set_route(t, "shop", "charge", Some("pay"))
        .await
        .unwrap();
    drop(ledger);

    let (code, out, err) = reckon(
        &data,
        &[
            "audit",
            "settings",
            "--tenant",
            "acme",
            "--time-zone",
            "America/New_York",
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("time_zone = America/New_York"), "{out}");

    // JSON: the stored run.
    let (code, out, err) = reckon(
        &data,
        &[
            "audit", "--tenant", "acme", "--date", DAY, "--format", "json",
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let run: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(run["status"], "complete");
    assert_eq!(run["day"], DAY);
    assert_eq!(run["time_zone"], "America/New_York");
    let kinds: Vec<&str> = run["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["duplicate", "orphan", "missing", "unresolved"],
        "{out}"
    );

    // CSV: one row per finding and per currency's totals, parsed back.
    let (code, out, err) = reckon(
        &data,
        &[
            "audit", "--tenant", "acme", "--date", DAY, "--format", "csv",
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let mut rd = csv::Reader::from_reader(out.as_bytes());
    let rows: Vec<csv::StringRecord> = rd.records().map(|r| r.unwrap()).collect();
    // Four findings, then the day's totals (one currency).
    assert_eq!(rows.len(), 5);
    assert_eq!(&rows[4][4], "total");
    assert_eq!(&rows[0][4], "duplicate");
    assert_eq!(&rows[0][6], "25.00");

    // Table: readable, with the totals.
    let (code, out, err) = reckon(&data, &["audit", "--tenant", "acme", "--date", DAY]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("duplicate") && out.contains("USD") && out.contains("digest"),
        "{out}"
    );

    let (code, out, _) = reckon(&data, &["audit", "list", "--tenant", "acme"]).await;
    assert_eq!(code, 0);
    assert_eq!(out.matches(DAY).count(), 3, "{out}");

    let (code, out, err) = reckon(&data, &["audit", "verify", "--tenant", "acme"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("3 runs, intact"), "{out}");

    // Someone edits the second run's totals in the database file.
    let url = format!("sqlite://{}", data.join("reckon.db").display());
    let mut c = sqlx::SqliteConnection::connect(&url).await.unwrap();
    sqlx::query("UPDATE audit_run SET totals = '[]' WHERE seq = 2")
        .execute(&mut c)
        .await
        .unwrap();
    c.close().await.unwrap();
    let (code, out, err) = reckon(&data, &["audit", "verify", "--tenant", "acme"]).await;
    assert_eq!(code, 1, "{out} {err}");
    assert!(out.contains("(seq 2)") && out.contains("edited"), "{out}");
    assert!(err.contains("1 of 3 runs"), "{err}");

    // Bad input: refused by name, nothing stored.
    let (code, _, err) = reckon(
        &data,
        &["audit", "--tenant", "acme", "--date", "2026-13-01"],
    )
    .await;
    assert_ne!(code, 0);
    assert!(err.contains("2026-13-01"), "{err}");
    let (code, _, err) = reckon(
        &data,
        &[
            "audit",
            "settings",
            "--tenant",
            "acme",
            "--time-zone",
            "Nowhere/Land",
        ],
    )
    .await;
    assert_ne!(code, 0);
    assert!(err.contains("Nowhere/Land"), "{err}");
}
