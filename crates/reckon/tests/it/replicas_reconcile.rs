//! Several `reckon serve` replicas reconciling one PostgreSQL ledger against the demo
//! provider (in this process, on loopback, counting its lookups):
//!
//! - three replicas, 10,000 unresolved effects, one replica `kill -9`ed mid-run: every
//!   effect resolved exactly once, the others finish its work once its leases expire, and
//!   the provider saw at most one extra lookup per effect the dead replica held;
//! - a replica paused with SIGSTOP past its leases and resumed with SIGCONT writes nothing:
//!   every effect has exactly one attempt and one resolution;
//! - the nightly audit, due on three replicas that each look five times a second, is run
//!   and stored once.

use reckon_domain::{SourceRecord, State};
use reckon_ledger::{IngestBatch, Keyring, Ledger, NewProvider, NewSource, Origin, SourceKind};
use reckon_providers::demo::{DemoState, serve_loopback};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MASTER_KEY: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
/// Claims a replica takes per step (`ReconcileOptions::batch`): what a dead one can hold.
const BATCH: u64 = 32;

struct PgDb {
    name: String,
    url: String,
}

impl Drop for PgDb {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args(["-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-c"])
            .arg(format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .output();
    }
}

fn fresh_pg_database() -> PgDb {
    let name = format!(
        "reckon_rrec_{}_{}",
        std::process::id(),
        rand::random::<u32>()
    );
    let out = Command::new("psql")
        .args(["-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-c"])
        .arg(format!("CREATE DATABASE {name}"))
        .output()
        .expect("psql");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PgDb {
        url: format!("postgres://postgres@127.0.0.1:5432/{name}"),
        name,
    }
}

/// A ledger with `n` unknown charges in a push source, half of them (even numbers) charged
/// at the demo provider, and the route to it.
async fn seed(
    db: &PgDb,
    dir: &std::path::Path,
    n: usize,
    delay: Duration,
) -> (Arc<dyn Ledger>, DemoState) {
    let keyring = Keyring::from_base64(MASTER_KEY).unwrap();
    let ledger = reckon_ledger::connect(Some(&db.url), dir, keyring)
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
                scan_interval_secs: 3600,
                abandoned_after_secs: 300.0,
                overlap_secs: 5.0,
                full_scan_every_secs: 3600,
                mapping: None,
            },
        )
        .await
        .unwrap();
    let demo = DemoState::with_delay(delay);
    let created = reckon_domain::time::now() - 3600.0;
    let records: Vec<SourceRecord> = (0..n)
        .map(|i| {
            let key = format!("charge:v1:ORD-{i}");
            if i % 2 == 0 {
                demo.charge(&key, 100, "eur", created + 1.0);
            }
            SourceRecord {
                key,
                state: State::Unknown,
                request_hash: "1:9f86d081884c7d65".into(),
                response: None,
                attempts: 1,
                created_at: created,
                updated_at: created + 1.0,
                expires_at: None,
            }
        })
        .collect();
    for chunk in records.chunks(2000) {
        ledger
            .ingest(
                t.id,
                source.id,
                IngestBatch {
                    origin: Origin::Push,
                    observed_at: reckon_domain::time::now(),
                    records: chunk.to_vec(),
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
    let (url, _server) = serve_loopback(demo.clone()).await.unwrap();
    ledger
        .add_provider(
            t.id,
            NewProvider {
                name: "pay".into(),
                kind: reckon_ledger::ProviderKind::Demo,
                secret: None,
                settings: serde_json::json!({ "base_url": url }),
            },
        )
        .await
        .unwrap();
    ledger
        .set_route(t.id, "shop", "charge", Some("pay"))
        .await
        .unwrap();
    (ledger, demo)
}

fn replica(db: &PgDb, data: &std::path::Path, lease_secs: &str) -> Child {
    replica_cmd(db, data, lease_secs)
        .spawn()
        .expect("start reckon serve")
}

fn replica_cmd(db: &PgDb, data: &std::path::Path, lease_secs: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_reckon"));
    c.arg("--data-dir")
        .arg(data)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("RECKON_LOG", "warn")
        .env("RECKON_DATABASE_URL", &db.url)
        .env("RECKON_MASTER_KEY", MASTER_KEY)
        .env("RECKON_EGRESS_ALLOW", r#"["127.0.0.1/32"]"#)
        .env("RECKON_RECONCILE_LEASE_SECS", lease_secs)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(data.with_extension("log")).expect("replica log"));
    c
}

/// The warnings the replicas logged under `dir` (for a failure's message).
fn replica_logs(dir: &std::path::Path) -> String {
    let mut out = String::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "log") {
            out.push_str(&std::fs::read_to_string(e.path()).unwrap_or_default());
        }
    }
    out
}

async fn scalar(pool: &sqlx::PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

async fn wait_for(pool: &sqlx::PgPool, sql: &'static str, at_least: i64, secs: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let n = scalar(pool, sql).await;
        if n >= at_least {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {n} < {at_least} after {secs} s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

struct Killed(Vec<Child>);

impl Drop for Killed {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_resolve_every_effect_once_and_finish_a_killed_ones_work() {
    const N: usize = 10_000;
    let dir = tempfile::tempdir().unwrap();
    let db = fresh_pg_database();
    let (_ledger, demo) = seed(&db, dir.path(), N, Duration::from_millis(2)).await;
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();

    let mut replicas = Killed(
        (0..3)
            .map(|i| replica(&db, &dir.path().join(format!("r{i}")), "5"))
            .collect(),
    );
    wait_for(
        &pool,
        "SELECT COUNT(*) FROM resolution",
        1500,
        300,
        "before the kill",
    )
    .await;
    replicas.0[0].kill().unwrap(); // SIGKILL, mid-run
    replicas.0[0].wait().unwrap();
    let at_kill = scalar(&pool, "SELECT COUNT(*) FROM resolution").await;
    assert!(
        at_kill < N as i64,
        "all done before the kill ({at_kill}): nothing proved"
    );

    wait_for(
        &pool,
        "SELECT COUNT(*) FROM resolution",
        N as i64,
        600,
        "after the kill",
    )
    .await;
    // A few more scheduler ticks with two replicas looking: nothing more is recorded.
    tokio::time::sleep(Duration::from_secs(5)).await;
    drop(replicas);

    assert_eq!(
        scalar(&pool, "SELECT COUNT(*) FROM resolution").await,
        N as i64
    );
    assert_eq!(
        scalar(&pool, "SELECT COUNT(DISTINCT effect_id) FROM resolution").await,
        N as i64
    );
    assert_eq!(
        scalar(
            &pool,
            "SELECT COUNT(*) FROM resolution WHERE outcome = 'applied'"
        )
        .await,
        (N / 2) as i64
    );
    let attempts = scalar(&pool, "SELECT COUNT(*) FROM reconcile_attempt").await;
    let breakdown: Vec<(String, Option<String>, i64)> = sqlx::query_as(
        "SELECT outcome, left(error, 120), COUNT(*) FROM reconcile_attempt \
         GROUP BY 1, 2 ORDER BY 3 DESC",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        attempts, N as i64,
        "one recorded lookup per effect: {breakdown:?}"
    );
    // The provider's side: one lookup per effect, plus at most the dead replica's claims
    // whose answers it never recorded.
    let lookups = demo.lookups();
    assert!(
        lookups >= N as u64 && lookups <= N as u64 + BATCH,
        "{lookups} lookups for {N} effects; the replicas said:\n{}",
        replica_logs(dir.path())
    );
    drop(pool);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_paused_past_its_leases_writes_nothing_when_it_resumes() {
    const N: usize = 400;
    let dir = tempfile::tempdir().unwrap();
    let db = fresh_pg_database();
    // Slow answers, so the pause lands while lookups are in flight.
    let (_ledger, demo) = seed(&db, dir.path(), N, Duration::from_millis(400)).await;
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();

    let mut a = Killed(vec![replica(&db, &dir.path().join("a"), "2")]);
    let pid = a.0[0].id();
    // Wait until A holds claims, then freeze it with its lookups in flight.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let held: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM reconcile_state WHERE lease_owner LIKE $1")
                .bind(format!("%-{pid}-%"))
                .fetch_one(&pool)
                .await
                .unwrap();
        if held > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "replica A never claimed anything"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stop = Command::new("kill")
        .args(["-STOP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(stop.success());
    let lookups_at_pause = demo.lookups();

    // B takes everything over once A's leases (2 s) expire, and finishes.
    let b = Killed(vec![replica(&db, &dir.path().join("b"), "2")]);
    wait_for(
        &pool,
        "SELECT COUNT(*) FROM resolution",
        N as i64,
        300,
        "B finishing",
    )
    .await;
    let attempts_before = scalar(&pool, "SELECT COUNT(*) FROM reconcile_attempt").await;

    // A resumes: its in-flight answers arrive, and every write of them is refused.
    let cont = Command::new("kill")
        .args(["-CONT", &pid.to_string()])
        .status()
        .unwrap();
    assert!(cont.success());
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        a.0[0].try_wait().unwrap().is_none(),
        "replica A died on resuming"
    );
    drop(b);
    drop(a);

    assert_eq!(
        scalar(&pool, "SELECT COUNT(*) FROM resolution").await,
        N as i64
    );
    assert_eq!(
        scalar(&pool, "SELECT COUNT(*) FROM reconcile_attempt").await,
        attempts_before,
        "the resumed replica wrote attempts after losing its leases"
    );
    assert_eq!(attempts_before, N as i64, "one recorded lookup per effect");
    // (A's lookups were in flight, not answered, when it stopped: the provider answers
    // after its delay.)
    let _ = lookups_at_pause;
    drop(pool);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_nightly_audit_scheduled_on_three_replicas_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = fresh_pg_database();
    let (ledger, demo) = seed(&db, dir.path(), 20, Duration::from_millis(1)).await;
    // Yesterday (UTC): one charge the ledger knows nothing of, so the run has a finding.
    let yesterday = reckon_audit::DayWindow::yesterday(reckon_domain::time::now(), "UTC").unwrap();
    demo.charge(
        "charge:v1:NOBODY",
        2500,
        "eur",
        yesterday.start + 12.0 * 3600.0,
    );
    let t = ledger.tenant_by_slug("acme").await.unwrap();
    ledger
        .set_audit_settings(
            t.id,
            &reckon_ledger::AuditSettings {
                time_zone: "UTC".into(),
                // Due from midnight: every check of every replica finds yesterday due
                // until one of them has stored it.
                audit_time: "00:00".into(),
            },
        )
        .await
        .unwrap();
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();

    let mut replicas = Killed(
        (0..3)
            .map(|i| {
                let mut c = replica_cmd(&db, &dir.path().join(format!("a{i}")), "5");
                c.env("RECKON_AUDIT_CHECK_SECS", "0.2");
                c.spawn().expect("start reckon serve")
            })
            .collect(),
    );
    wait_for(
        &pool,
        "SELECT COUNT(*) FROM audit_run WHERE triggered_by = 'schedule'",
        1,
        120,
        "the nightly audit",
    )
    .await;
    // Each replica looks five times a second: give them many more chances to run it again.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for c in &mut replicas.0 {
        assert!(c.try_wait().unwrap().is_none(), "a replica died");
    }
    drop(replicas);

    let runs: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT day, status, findings FROM audit_run WHERE triggered_by = 'schedule'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0].0, yesterday.date);
    assert_eq!(runs[0].1, "complete", "{runs:?}");
    assert!(runs[0].2.contains("orphan"), "{}", runs[0].2);
    drop(pool);
}
