//! Write-back against SQLite, PostgreSQL and MariaDB sources whose rows
//! the real justonce library wrote (testdata/justonce_writer.py), on a real SQLite ledger,
//! with resolutions made by the real reconciler against the demo provider on loopback.
//!
//! A service that is down FAILS the test: nothing here skips a backend.

#[allow(
    dead_code,
    reason = "a module shared by several test modules; not each uses all of it"
)]
use crate::common;

use common::{Kind, SOURCE, SourceDb, TestLedger, test_egress};
use reckon_engine::reconcile::{ReconcileCtx, reconcile_all};
use reckon_engine::writeback::{
    MARKER, WritebackCtx, WritebackError, WritebackHooks, WritebackOutcome, writeback_all,
    writeback_dry_run, writeback_step,
};
use reckon_ledger::{NewProvider, WritebackPolicy, WritebackStatus};
use reckon_providers::demo::{DemoState, serve_loopback};
use reckon_sources::{SourceWriter, WriteError};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;

/// Charged at the provider: resolves `applied`, written back as `succeeded`.
const PAID: &str = "charge:v1:WB-PAID";
/// Never charged: resolves `not_applied`, released or failed per the source's policy.
const UNPAID: &str = "charge:v1:WB-UNPAID";
/// Charged too, but the application records it itself while reckon is writing.
const RACED: &str = "charge:v1:WB-RACED";

struct World {
    db: SourceDb,
    ledger: TestLedger,
    _provider: tokio::task::JoinHandle<()>,
}

/// Source rows UNKNOWN by the library's own path, scanned, reconciled to resolutions.
async fn world(kind: Kind, policy: Option<WritebackPolicy>) -> World {
    let db = SourceDb::fresh(kind).await;
    db.writer(&["unknown", "--key", PAID, "--key", UNPAID, "--key", RACED]);
    let ledger = TestLedger::new().await;
    ledger
        .add_source(SOURCE, kind.as_str(), &db.source_dsn)
        .await;
    ledger
        .ledger
        .set_source_writeback(ledger.tenant.id, SOURCE, policy)
        .await
        .expect("set write-back");
    let report = ledger.scan(SOURCE, false).await;
    assert_eq!(report.created, 3, "{report:?}");

    let demo = DemoState::new();
    let now = reckon_domain::time::now();
    demo.charge(PAID, 1999, "eur", now - 1.0);
    demo.charge(RACED, 500, "eur", now - 1.0);
    let (base, provider) = serve_loopback(demo).await.expect("demo provider");
    let t = ledger.tenant.id;
    ledger
        .ledger
        .add_provider(
            t,
            NewProvider {
                name: "demo".into(),
                kind: reckon_ledger::ProviderKind::Demo,
                secret: None,
                // The rows were written a moment ago: no visibility lag and no call time
                // after the row's updated_at, so a complete miss may conclude not_applied.
                settings: serde_json::json!({
                    "base_url": base, "visibility_lag_secs": 0, "max_call_secs": 0
                }),
            },
        )
        .await
        .expect("add provider");
    ledger
        .ledger
        .set_route(t, SOURCE, "charge", Some("demo"))
        .await
        .expect("route");
    // The demo provider listens on loopback, which the default egress policy refuses.
    let loopback = reckon_sources::EgressPolicy::new(&["127.0.0.0/8".to_owned()], None).unwrap();
    let ctx = ReconcileCtx::new(ledger.ledger.clone()).with_egress(std::sync::Arc::new(loopback));
    let outcomes = reconcile_all(&ctx, &ledger.tenant)
        .await
        .expect("reconcile");
    let got: HashMap<&str, &str> = outcomes
        .iter()
        .map(|o| (o.key.as_str(), o.outcome.as_str()))
        .collect();
    assert_eq!(got[PAID], "applied", "{outcomes:#?}");
    assert_eq!(got[RACED], "applied", "{outcomes:#?}");
    assert_eq!(got[UNPAID], "not_applied", "{outcomes:#?}");
    assert!(outcomes.iter().all(|o| o.resolved), "{outcomes:#?}");
    World {
        db,
        ledger,
        _provider: provider,
    }
}

fn ctx(w: &World, hooks: WritebackHooks) -> WritebackCtx {
    let mut c = WritebackCtx::new(w.ledger.ledger.clone(), test_egress());
    c.options.hooks = hooks;
    c
}

/// The source's rows of these keys, read by the library's side (raw stored values).
fn rows(w: &World, keys: &[&str]) -> HashMap<String, Value> {
    let mut args = vec!["rows"];
    for k in keys {
        args.extend(["--key", k]);
    }
    w.db.writer(&args)["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| (r["key"].as_str().unwrap().to_owned(), r.clone()))
        .collect()
}

fn response(row: &Value) -> Value {
    match &row["response"] {
        Value::Null => Value::Null,
        Value::String(s) => serde_json::from_str(s).expect("response is JSON text"),
        other => panic!("response {other}"),
    }
}

/// The justonce writer, outside a `SourceDb` (from inside the write-back hook).
fn run_writer(kind: &str, dsn: &str, args: &[&str]) {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/justonce_writer.py");
    let out = std::process::Command::new(common::python())
        .arg(&script)
        .args(["--backend", kind, "--dsn", dsn])
        .args(args)
        .output()
        .expect("run justonce_writer.py");
    assert!(
        out.status.success(),
        "justonce_writer.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn query_sqlite(path: &str, sql: &str) -> Vec<String> {
    use sqlx::Connection;
    let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{path}"))
        .await
        .expect("open the source file");
    let v = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_all(&mut conn)
        .await
        .expect("query the source file");
    conn.close().await.ok();
    v
}

fn by_key(v: &[WritebackOutcome]) -> HashMap<&str, &WritebackOutcome> {
    v.iter().map(|o| (o.key.as_str(), o)).collect()
}

/// The application completes RACED itself (through the library) in the window between
/// reckon's read of the row and reckon's conditional statement.
fn race_hook(w: &World) -> WritebackHooks {
    let kind = w.db.kind.as_str().to_owned();
    let dsn = w.db.writer_dsn.clone();
    WritebackHooks {
        after_read: Some(Arc::new(move |key: &str| {
            if key == RACED {
                run_writer(
                    &kind,
                    &dsn,
                    &[
                        "app-complete",
                        "--key",
                        RACED,
                        "--response",
                        r#"{"charge_id": "ch_by_the_app"}"#,
                    ],
                );
            }
        })),
        stop_after_write: false,
    }
}

async fn race(kind: Kind, policy: WritebackPolicy) {
    let w = world(kind, Some(policy)).await;
    let t = w.ledger.tenant.id;
    let out = writeback_all(&ctx(&w, race_hook(&w)), t, None)
        .await
        .expect("write-back");
    let got = by_key(&out);
    assert_eq!(got.len(), 3, "{out:#?}");

    // The race: reckon's statement affected no row, the conflict is recorded, the
    // application's value stands.
    assert_eq!(got[RACED].status, "conflict", "{out:#?}");
    assert!(
        got[RACED].detail.contains("application moved first"),
        "{}",
        got[RACED].detail
    );
    let after = rows(&w, &[PAID, UNPAID, RACED]);
    assert_eq!(after[RACED]["state"], "succeeded");
    assert_eq!(
        response(&after[RACED]),
        serde_json::json!({ "charge_id": "ch_by_the_app" }),
        "the application's value stands"
    );
    let recorded = w
        .ledger
        .ledger
        .list_writebacks(t, None, None, 100)
        .await
        .unwrap();
    let raced = recorded.iter().find(|r| r.key == RACED).expect("recorded");
    assert_eq!(raced.status, WritebackStatus::Conflict);
    assert!(!raced.recovered);

    // The others were written: applied -> succeeded with the provider object and the
    // resolution id; not_applied -> per the policy.
    assert_eq!(got[PAID].status, "written", "{out:#?}");
    assert_eq!(after[PAID]["state"], "succeeded");
    let paid = response(&after[PAID]);
    assert!(
        paid["id"].as_str().unwrap().starts_with("demo_ch_"),
        "{paid}"
    );
    assert_eq!(paid["amount"], 1999);
    assert_eq!(paid["currency"], "eur");
    assert_eq!(paid[MARKER]["resolution_id"], got[PAID].resolution_id);
    assert!(
        after[PAID]["expires_at"].is_null(),
        "kept: a sweep must not let a retry run"
    );
    // The library answers a retry from the row reckon wrote: the charge does not run again.
    let retry = w.db.writer(&["retry", "--key", PAID]);
    assert_eq!(retry["executed"], false, "{retry}");
    assert_eq!(retry["value"]["id"], paid["id"], "{retry}");

    assert_eq!(got[UNPAID].status, "written", "{out:#?}");
    match policy {
        WritebackPolicy::Release => {
            assert!(!after.contains_key(UNPAID), "released: the row is deleted");
            // The application's retry runs the effect now.
            let retry = w.db.writer(&["retry", "--key", UNPAID]);
            assert_eq!(retry["executed"], true, "{retry}");
        }
        WritebackPolicy::Fail => {
            assert_eq!(after[UNPAID]["state"], "failed");
            assert_eq!(
                response(&after[UNPAID])[MARKER]["resolution_id"],
                got[UNPAID].resolution_id
            );
            let retry = w.db.writer(&["retry", "--key", UNPAID]);
            assert_eq!(retry["executed"], false, "terminal: {retry}");
        }
    }

    // Nothing is written twice: a second run finds nothing to do.
    let again = writeback_all(&ctx(&w, WritebackHooks::default()), t, None)
        .await
        .unwrap();
    assert!(again.is_empty(), "{again:#?}");
    w.db.drop_db().await;
}

#[tokio::test]
async fn writeback_race_on_sqlite_source_conflict_recorded_and_the_applications_value_stands() {
    race(Kind::Sqlite, WritebackPolicy::Release).await;
}

#[tokio::test]
async fn writeback_race_on_postgres_source_conflict_recorded_and_the_applications_value_stands() {
    race(Kind::Postgres, WritebackPolicy::Fail).await;
}

#[tokio::test]
async fn writeback_race_on_mariadb_source_conflict_recorded_and_the_applications_value_stands() {
    race(Kind::Mysql, WritebackPolicy::Release).await;
}

/// A crash between the source write and the ledger's record (the hook stops right after
/// the statement) is settled by the next run from the row itself, without a second write.
/// A trigger counts every row the source's table actually had changed or deleted.
#[tokio::test]
async fn crash_between_source_write_and_ledger_record_is_settled_next_run_without_a_second_write() {
    let w = world(Kind::Sqlite, Some(WritebackPolicy::Release)).await;
    let t = w.ledger.tenant.id;
    w.db.exec(&[
        "CREATE TABLE changes (op TEXT, key TEXT)".into(),
        "CREATE TRIGGER count_updates AFTER UPDATE ON justonce_keys \
         BEGIN INSERT INTO changes VALUES ('update', old.key); END"
            .into(),
        "CREATE TRIGGER count_deletes AFTER DELETE ON justonce_keys \
         BEGIN INSERT INTO changes VALUES ('delete', old.key); END"
            .into(),
    ])
    .await;
    let crashing = || {
        ctx(
            &w,
            WritebackHooks {
                after_read: None,
                stop_after_write: true,
            },
        )
    };
    let pending = |v: &[reckon_ledger::Writeback]| {
        v.iter()
            .filter(|r| r.status == WritebackStatus::Pending)
            .count()
    };

    // Run 1 stops after its first source write.
    let e = writeback_step(&crashing(), t, None).await.unwrap_err();
    assert!(matches!(e, WritebackError::Stopped), "{e}");
    let log = w
        .ledger
        .ledger
        .list_writebacks(t, None, None, 100)
        .await
        .unwrap();
    assert_eq!(log.len(), 1, "{log:#?}");
    assert_eq!(pending(&log), 1, "the intent was recorded before the write");
    let first = log[0].clone();

    // Run 2 (still crashing on writes) settles the first from the row, writing nothing,
    // then stops after the next write.
    let e = writeback_step(&crashing(), t, None).await.unwrap_err();
    assert!(matches!(e, WritebackError::Stopped), "{e}");
    let log = w
        .ledger
        .ledger
        .list_writebacks(t, None, None, 100)
        .await
        .unwrap();
    let settled = log.iter().find(|r| r.id == first.id).unwrap();
    assert_eq!(settled.status, WritebackStatus::Written, "{settled:#?}");
    assert!(settled.recovered, "settled from the source row");

    // Run 3 settles the rest.
    let out = writeback_all(&ctx(&w, WritebackHooks::default()), t, None)
        .await
        .unwrap();
    assert!(out.iter().all(|o| o.status == "written"), "{out:#?}");
    let log = w
        .ledger
        .ledger
        .list_writebacks(t, None, None, 100)
        .await
        .unwrap();
    assert_eq!(log.len(), 3, "{log:#?}");
    assert_eq!(pending(&log), 0);
    assert!(log.iter().all(|r| r.status == WritebackStatus::Written));
    assert_eq!(
        log.iter().filter(|r| r.recovered).count(),
        2,
        "the two interrupted write-backs were recognised from the rows: {log:#?}"
    );

    // Each row was changed exactly once: two updates (applied) and one delete (released).
    let changes = query_sqlite(&w.db.writer_dsn, "SELECT op || ' ' || key FROM changes").await;
    let mut sorted = changes.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        vec![
            format!("delete {UNPAID}"),
            format!("update {PAID}"),
            format!("update {RACED}"),
        ],
        "{changes:?}"
    );
    let after = rows(&w, &[PAID, RACED]);
    for k in [PAID, RACED] {
        let wb = log.iter().find(|r| r.key == k).unwrap();
        assert_eq!(after[k]["updated_at"], wb.new_updated_at, "{k}");
        assert_eq!(
            response(&after[k])[MARKER]["resolution_id"],
            wb.resolution_id
        );
    }
}

/// A source added without write-back is never written to: no intent, no writer, no change.
#[tokio::test]
async fn a_source_without_writeback_is_never_written() {
    let w = world(Kind::Sqlite, None).await;
    let t = w.ledger.tenant.id;
    let before = rows(&w, &[PAID, UNPAID, RACED]);
    let out = writeback_all(&ctx(&w, WritebackHooks::default()), t, None)
        .await
        .unwrap();
    assert!(out.is_empty(), "{out:#?}");
    let dry = writeback_dry_run(&ctx(&w, WritebackHooks::default()), t, None)
        .await
        .unwrap();
    assert!(dry.is_empty(), "{dry:#?}");
    assert!(
        w.ledger
            .ledger
            .writeback_candidates(t, None, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(rows(&w, &[PAID, UNPAID, RACED]), before);

    // The writer cannot be opened for it at all.
    let source = w.ledger.source(SOURCE).await;
    let dsn = w.ledger.ledger.source_dsn(t, &source).await.unwrap();
    match SourceWriter::open(&source, &dsn, &test_egress()).await {
        Err(WriteError::NotOptedIn(name)) => assert_eq!(name, SOURCE),
        Err(e) => panic!("wrong refusal: {e}"),
        Ok(_) => panic!("a writer was opened for a source without write-back"),
    }
    // Nor will the ledger record an intent for it.
    let effect = w
        .ledger
        .ledger
        .get_effect(t, SOURCE, PAID)
        .await
        .unwrap()
        .unwrap()
        .effect;
    let resolution = w
        .ledger
        .ledger
        .reconcile_view(t, effect.id)
        .await
        .unwrap()
        .resolution
        .unwrap();
    let refused = w
        .ledger
        .ledger
        .begin_writeback(
            t,
            reckon_ledger::NewWriteback {
                source_id: source.id,
                effect_id: effect.id,
                resolution_id: resolution.id,
                key: PAID.into(),
                action: reckon_ledger::WritebackAction::Succeed,
                seen_state: "unknown".into(),
                seen_updated_at: effect.updated_at,
                new_response: Some("{}".into()),
                new_updated_at: 1.0,
            },
            None,
        )
        .await;
    assert!(refused.is_err(), "{refused:?}");

    // Turned on later, the same resolutions become write-backs.
    w.ledger
        .ledger
        .set_source_writeback(t, SOURCE, Some(WritebackPolicy::Fail))
        .await
        .unwrap();
    assert_eq!(
        w.ledger
            .ledger
            .writeback_candidates(t, None, 100)
            .await
            .unwrap()
            .len(),
        3
    );
}

/// A dry run shows each row's diff and writes nothing: not the source, not the ledger.
#[tokio::test]
async fn dry_run_shows_the_diff_and_writes_nothing() {
    let w = world(Kind::Sqlite, Some(WritebackPolicy::Release)).await;
    let t = w.ledger.tenant.id;
    let before = rows(&w, &[PAID, UNPAID, RACED]);
    let dry = writeback_dry_run(&ctx(&w, WritebackHooks::default()), t, Some(SOURCE))
        .await
        .unwrap();
    let got = by_key(&dry);
    assert_eq!(got.len(), 3, "{dry:#?}");
    for o in &dry {
        assert_eq!(o.status, "would_write", "{o:#?}");
        assert!(o.writeback_id.is_none());
        let b = o.before.as_ref().expect("the row as it is");
        assert_eq!(b.state, "unknown");
    }
    let paid_after = got[PAID].after.as_ref().expect("an updated row");
    assert_eq!(paid_after.state, "succeeded");
    assert_eq!(
        paid_after.response.as_ref().unwrap()[MARKER]["resolution_id"],
        got[PAID].resolution_id
    );
    assert!(got[UNPAID].after.is_none(), "a release deletes the row");
    assert_eq!(
        rows(&w, &[PAID, UNPAID, RACED]),
        before,
        "the source is unchanged"
    );
    assert!(
        w.ledger
            .ledger
            .list_writebacks(t, None, None, 100)
            .await
            .unwrap()
            .is_empty(),
        "no intent recorded"
    );
    // And the real run afterwards does what the dry run showed.
    let out = writeback_all(&ctx(&w, WritebackHooks::default()), t, None)
        .await
        .unwrap();
    assert_eq!(out.len(), 3);
    assert!(out.iter().all(|o| o.status == "written"), "{out:#?}");
}

/// A run that died holds the tenant's write-back lease until it expires. The next run says
/// who holds it and until when, as an error, and writes nothing; it never says "nothing to
/// do" while resolutions wait.
#[tokio::test]
async fn a_writeback_lease_held_by_a_dead_run_is_reported_and_nothing_is_written() {
    let w = world(Kind::Sqlite, Some(WritebackPolicy::Release)).await;
    let t = w.ledger.tenant.id;
    let dead = w
        .ledger
        .ledger
        .try_lease(&format!("writeback:{}", t.get()), "reckon-dead-42", 300.0)
        .await
        .unwrap()
        .expect("the dead run's lease");
    let before = rows(&w, &[PAID, UNPAID, RACED]);
    let e = writeback_all(&ctx(&w, WritebackHooks::default()), t, None)
        .await
        .unwrap_err();
    match &e {
        WritebackError::Busy { holder, until } => {
            assert_eq!(holder, "reckon-dead-42");
            assert!(
                (until - dead.expires_at).abs() < 1e-6,
                "{until} vs {dead:?}"
            );
        }
        other => panic!("expected Busy, got {other}"),
    }
    assert!(e.to_string().contains("reckon-dead-42"), "{e}");
    assert_eq!(rows(&w, &[PAID, UNPAID, RACED]), before, "nothing written");
    let log = w
        .ledger
        .ledger
        .list_writebacks(t, None, None, 100)
        .await
        .unwrap();
    assert!(log.is_empty(), "{log:#?}");
}

/// Killed after a release deleted the row and before the ledger recorded it; the
/// application then claims the key again (as a release is meant to let it). The next run
/// recognises reckon's own release from the new claim, and records it written, not as a
/// conflict that "changed nothing".
#[tokio::test]
async fn a_release_killed_before_its_record_then_reclaimed_is_recognised_as_reckons_own() {
    let w = world(Kind::Sqlite, Some(WritebackPolicy::Release)).await;
    let t = w.ledger.tenant.id;
    let crashing = ctx(
        &w,
        WritebackHooks {
            after_read: None,
            stop_after_write: true,
        },
    );
    // Each crashing run settles what the last one left and stops after its next write:
    // go on until the release of UNPAID is the one left pending.
    let mut release = None;
    for _ in 0..3 {
        let e = writeback_step(&crashing, t, None).await.unwrap_err();
        assert!(matches!(e, WritebackError::Stopped), "{e}");
        let log = w
            .ledger
            .ledger
            .list_writebacks(t, None, Some(WritebackStatus::Pending), 100)
            .await
            .unwrap();
        if let Some(p) = log.iter().find(|r| r.key == UNPAID) {
            release = Some(p.clone());
            break;
        }
    }
    let release = release.expect("the release of UNPAID was left pending");
    assert!(
        !rows(&w, &[UNPAID]).contains_key(UNPAID),
        "the release deleted the row"
    );
    // The application's retry claims the key anew and runs the effect.
    let retry = w.db.writer(&["retry", "--key", UNPAID]);
    assert_eq!(retry["executed"], true, "{retry}");
    assert!(rows(&w, &[UNPAID]).contains_key(UNPAID));

    let out = writeback_all(&ctx(&w, WritebackHooks::default()), t, None)
        .await
        .unwrap();
    let o = by_key(&out)[UNPAID];
    assert_eq!(o.status, "written", "{o:#?}");
    assert!(
        o.recovered && o.detail.contains("claimed the key"),
        "{o:#?}"
    );
    let log = w
        .ledger
        .ledger
        .list_writebacks(t, None, None, 100)
        .await
        .unwrap();
    let settled = log.iter().find(|r| r.id == release.id).unwrap();
    assert_eq!(settled.status, WritebackStatus::Written, "{settled:#?}");
    // The application's new row is left alone.
    assert_eq!(rows(&w, &[UNPAID])[UNPAID]["state"], "succeeded");
}

/// A `not_applied` verdict is never handed back to the application (a release, or a
/// failed row) while the provider's charges the audit imported hold one carrying the
/// key: that would let the application charge again. The intent is recorded as a
/// conflict naming the charge, the source row stays as it is; the dry run says so first.
#[tokio::test]
async fn a_not_charged_verdict_contradicted_by_an_imported_charge_is_never_written_back() {
    let w = world(Kind::Sqlite, Some(WritebackPolicy::Release)).await;
    let t = w.ledger.tenant.id;
    let provider = w.ledger.ledger.list_providers(t).await.unwrap()[0].id;
    let now = reckon_domain::time::now();
    // The day's audit found the customer paid after all (a late payment, a wrong answer).
    w.ledger
        .ledger
        .store_provider_charges(
            t,
            &[reckon_ledger::StoredCharge {
                provider_id: provider,
                charge_id: "ch_late_paid".into(),
                payment_intent: None,
                amount: 1999,
                currency: "eur".into(),
                status: "succeeded".into(),
                amount_captured: 1999,
                amount_refunded: 0,
                refunds: serde_json::json!([]),
                metadata: serde_json::json!({"idempotency_key": UNPAID}),
                idempotency_key: Some(UNPAID.into()),
                customer: None,
                created: now,
                raw: serde_json::json!({"id": "ch_late_paid"}),
                imported_at: now,
            }],
        )
        .await
        .unwrap();
    let before = rows(&w, &[UNPAID]);
    let dry = writeback_dry_run(&ctx(&w, WritebackHooks::default()), t, Some(SOURCE))
        .await
        .unwrap();
    let got = by_key(&dry);
    assert_eq!(got[UNPAID].status, "would_conflict", "{dry:#?}");
    assert!(got[UNPAID].detail.contains("ch_late_paid"), "{dry:#?}");
    let out = writeback_all(&ctx(&w, WritebackHooks::default()), t, None)
        .await
        .unwrap();
    let got = by_key(&out);
    assert_eq!(got[UNPAID].status, "conflict", "{out:#?}");
    assert!(got[UNPAID].detail.contains("ch_late_paid"), "{out:#?}");
    assert_eq!(got[PAID].status, "written", "the others go on: {out:#?}");
    assert_eq!(rows(&w, &[UNPAID]), before, "the row was not released");
    let recorded = w
        .ledger
        .ledger
        .list_writebacks(t, None, Some(WritebackStatus::Conflict), 10)
        .await
        .unwrap();
    assert!(recorded.iter().any(|wb| wb.key == UNPAID), "{recorded:#?}");
}

/// A `not_applied` verdict already written back (the application's row released, its key
/// handed back for a retry) that a charge later contradicts: nothing can take the write
/// back, so the day's audit names it (charged, not recorded, released by reckon: check the
/// application did not charge again), and support's lookup says a person must check rather
/// than "safe to try again".
#[tokio::test]
async fn a_written_back_not_charged_verdict_a_charge_contradicts_is_a_finding_and_needs_a_person() {
    let w = world(Kind::Sqlite, Some(WritebackPolicy::Release)).await;
    let t = w.ledger.tenant.id;
    let out = writeback_all(&ctx(&w, WritebackHooks::default()), t, None)
        .await
        .unwrap();
    assert_eq!(by_key(&out)[UNPAID].status, "written", "{out:#?}");
    assert!(!rows(&w, &[UNPAID]).contains_key(UNPAID), "released");
    // The next scan sees the row gone.
    w.ledger.scan(SOURCE, true).await;
    let effect = w
        .ledger
        .ledger
        .get_effect(t, SOURCE, UNPAID)
        .await
        .unwrap()
        .expect("the effect")
        .effect;
    assert!(effect.gone_at.is_some(), "{effect:#?}");

    // The day's charges: the customer paid after all.
    let provider = w.ledger.ledger.list_providers(t).await.unwrap()[0].clone();
    w.ledger
        .ledger
        .store_provider_charges(
            t,
            &[reckon_ledger::StoredCharge {
                provider_id: provider.id,
                charge_id: "ch_paid_after_all".into(),
                payment_intent: None,
                amount: 4200,
                currency: "eur".into(),
                status: "succeeded".into(),
                amount_captured: 4200,
                amount_refunded: 0,
                refunds: serde_json::json!([]),
                metadata: serde_json::json!({"idempotency_key": UNPAID}),
                idempotency_key: Some(UNPAID.into()),
                customer: None,
                created: effect.created_at + 1.0,
                raw: serde_json::json!({"id": "ch_paid_after_all"}),
                imported_at: effect.created_at + 2.0,
            }],
        )
        .await
        .unwrap();
    let day = jiff::Timestamp::from_microsecond((effect.created_at * 1e6) as i64)
        .unwrap()
        .to_zoned(jiff::tz::TimeZone::UTC)
        .date()
        .to_string();
    let window = reckon_audit::DayWindow::new(&day, "UTC").unwrap();
    let report = reckon_engine::audit::audit_day(
        w.ledger.ledger.as_ref(),
        t,
        &window,
        &[provider],
        reckon_domain::time::now(),
    )
    .await
    .unwrap();
    let found: Vec<&reckon_audit::Finding> = report
        .findings
        .iter()
        .filter(|f| f.effects.iter().any(|e| e.key == UNPAID))
        .collect();
    assert_eq!(found.len(), 1, "{:#?}", report.findings);
    assert_eq!(
        found[0].kind,
        reckon_audit::FindingKind::ChargedNotRecorded,
        "{:#?}",
        found[0]
    );
    assert!(
        found[0].summary.contains("released by reckon's write-back")
            && found[0].summary.contains("ch_paid_after_all"),
        "{}",
        found[0].summary
    );

    let tz = jiff::tz::TimeZone::UTC;
    let a = reckon_engine::answer::answer(
        w.ledger.ledger.as_ref(),
        t,
        UNPAID,
        reckon_domain::time::now(),
        &tz,
    )
    .await
    .unwrap();
    let e = &a.effects[0];
    assert!(e.needs_person && !e.is_final, "{e:#?}");
    assert!(
        e.sentence.contains("Contradicted") && !e.sentence.contains("safe to try again"),
        "{}",
        e.sentence
    );
}
