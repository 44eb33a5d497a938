//! `kill -9` of `reckon serve` in the middle of reconciliation, then a restart: every
//! unresolved effect ends with exactly one resolution, the right one, and none is lost.
//!
//! Real parts: a justonce store written by the real library (bulk scenario: 300 unknown
//! charges among 30,000 rows), the reckon binary, and the demo provider on a loopback port
//! in this process, answering slowly so the kill lands mid-run.

use reckon_providers::demo::{DemoState, serve_loopback};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ROWS: usize = 30_000;
/// Every 100th bulk row is unknown.
const UNKNOWN: i64 = (ROWS / 100) as i64;

fn reckon(data: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_reckon"));
    c.arg("--data-dir")
        .arg(data)
        .env("RECKON_LOG", "warn")
        .env(
            "RECKON_SQLITE_SOURCE_DIR",
            data.parent().expect("the data directory has a parent"),
        )
        // The demo provider listens on loopback.
        .env("RECKON_EGRESS_ALLOW", r#"["127.0.0.1/32"]"#);
    c
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run reckon");
    assert!(
        out.status.success(),
        "{:?} failed: {}",
        cmd,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn python() -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/test-env.sh");
    let out = Command::new(script).output().expect("scripts/test-env.sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

async fn count(db: &Path, sql: &'static str) -> i64 {
    use sqlx::ConnectOptions;
    let Ok(mut c) = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(db)
        .read_only(true)
        .connect()
        .await
    else {
        return 0;
    };
    sqlx::query_scalar(sql).fetch_one(&mut c).await.unwrap_or(0)
}

fn serve(data: &Path) -> Child {
    reckon(data)
        .args(["serve", "--listen", "127.0.0.1:0"])
        // Short leases, so the restarted process takes the dead one's claims soon.
        .env("RECKON_RECONCILE_LEASE_SECS", "3")
        .env("RECKON_RECONCILE_CONCURRENCY", "4")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start reckon serve")
}

async fn wait_until(db: &Path, sql: &'static str, at_least: i64, child: &mut Child, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let n = count(db, sql).await;
        if n >= at_least {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: only {n} after 180 s");
        assert!(
            child.try_wait().unwrap().is_none(),
            "{what}: reckon serve exited"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reconciler_killed_mid_run_and_restarted_records_every_resolution_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    // acme's SQLite source sits in acme's own directory of the SQLite source
    // directory (T12: `{sqlite_source_dir}/{tenant-slug}/`).
    let store = dir.path().join("acme").join("shop.db");
    std::fs::create_dir_all(store.parent().unwrap()).unwrap();
    let data = dir.path().join("data");
    let writer = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/justonce_writer.py");
    let out = Command::new(python())
        .arg(&writer)
        .args(["--backend", "sqlite", "--dsn"])
        .arg(&store)
        .args(["bulk", "--count", &ROWS.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The provider charged the unknown orders whose number is a multiple of 200 and never
    // saw the others; it answers in 40 ms.
    let provider = DemoState::with_delay(Duration::from_millis(40));
    let mut charged = 0;
    for i in (0..ROWS).step_by(200) {
        provider.charge(&format!("charge:v1:BULK-{i}"), 100, "eur", 1_000.0);
        charged += 1;
    }
    let (url, _server) = serve_loopback(provider).await.unwrap();

    run_ok(reckon(&data).args(["tenant", "create", "acme"]));
    run_ok(
        reckon(&data)
            .args([
                "source", "add", "--tenant", "acme", "--name", "shop", "--kind", "sqlite", "--dsn",
            ])
            .arg(&store),
    );
    run_ok(reckon(&data).args([
        "provider",
        "add",
        "--tenant",
        "acme",
        "--name",
        "pay",
        "--kind",
        "demo",
        "--settings",
        &format!(r#"{{"base_url": "{url}"}}"#),
    ]));
    run_ok(reckon(&data).args([
        "route",
        "set",
        "--tenant",
        "acme",
        "--source",
        "shop",
        "--operation",
        "charge",
        "--provider",
        "pay",
    ]));

    let db = data.join("reckon.db");
    let mut first = serve(&data);
    wait_until(
        &db,
        "SELECT COUNT(*) FROM resolution",
        40,
        &mut first,
        "first run",
    )
    .await;
    first.kill().unwrap(); // SIGKILL
    first.wait().unwrap();
    let at_kill = count(&db, "SELECT COUNT(*) FROM resolution").await;
    assert!(
        at_kill < UNKNOWN,
        "every effect was resolved before the kill ({at_kill}): the test proved nothing"
    );

    let mut second = serve(&data);
    wait_until(
        &db,
        "SELECT COUNT(*) FROM resolution",
        UNKNOWN,
        &mut second,
        "after restart",
    )
    .await;
    // Let the restarted process run on a little: nothing more may appear.
    tokio::time::sleep(Duration::from_secs(2)).await;
    second.kill().unwrap();
    second.wait().unwrap();

    assert_eq!(count(&db, "SELECT COUNT(*) FROM resolution").await, UNKNOWN);
    assert_eq!(
        count(&db, "SELECT COUNT(DISTINCT effect_id) FROM resolution").await,
        UNKNOWN
    );
    // Each verdict is the provider's truth.
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM resolution WHERE outcome = 'applied'"
        )
        .await,
        charged
    );
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM resolution WHERE outcome = 'not_applied'"
        )
        .await,
        UNKNOWN - charged
    );
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM resolution r JOIN effect e ON e.id = r.effect_id \
             WHERE (CAST(substr(e.key, 16) AS INTEGER) % 200 = 0) <> (r.outcome = 'applied')"
        )
        .await,
        0,
        "a verdict disagrees with what the provider holds"
    );
    // Every resolution points at the attempt that concluded it.
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM resolution r LEFT JOIN reconcile_attempt a ON a.id = r.attempt_id \
             WHERE a.id IS NULL OR a.effect_id <> r.effect_id"
        )
        .await,
        0
    );
}
