//! `kill -9` of reckon in the middle of a scan, then a restart: the ledger equals the
//! source, nothing lost, nothing doubled.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ROWS: usize = 60_000;

fn reckon(data: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_reckon"));
    c.arg("--data-dir").arg(data).env("RECKON_LOG", "warn");
    // The data directory's parent is the operator's SQLite source directory; the store is
    // in its `acme/` subdirectory (each tenant has its own).
    c.env(
        "RECKON_SQLITE_SOURCE_DIR",
        data.parent().expect("the data directory has a parent"),
    );
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
    let mut c = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(db)
        .read_only(true)
        .connect()
        .await
        .expect("open ledger file");
    sqlx::query_scalar(sql).fetch_one(&mut c).await.unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_scan_killed_mid_way_and_restarted_loses_nothing_and_doubles_nothing() {
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

    run_ok(reckon(&data).args(["tenant", "create", "acme"]));
    run_ok(
        reckon(&data)
            .args([
                "source",
                "add",
                "--tenant",
                "acme",
                "--name",
                "shop",
                "--kind",
                "sqlite",
                // The bulk rows are 1 ms apart: a second of overlap re-reads a thousand.
                "--overlap",
                "1s",
                "--dsn",
            ])
            .arg(&store),
    );

    let ledger_db = data.join("reckon.db");
    let mut child = reckon(&data)
        .args(["source", "scan", "--tenant", "acme", "--name", "shop"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until some batches are committed, then SIGKILL.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let n = count(&ledger_db, "SELECT COUNT(*) FROM effect").await;
        if n >= 4_000 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the scan never committed a batch"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "scan ended before it could be killed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.kill().unwrap(); // SIGKILL on unix
    child.wait().unwrap();
    let after_kill = count(&ledger_db, "SELECT COUNT(*) FROM effect").await;
    assert!(
        (after_kill as usize) < ROWS,
        "the scan finished before the kill ({after_kill} effects): the test proved nothing"
    );

    // Restart: the first pass goes on from the committed cursor, re-reading the overlap,
    // and is a full scan without comparing key sets. The killed process's lease went with
    // it: the restart does not wait for its term.
    let started = Instant::now();
    let out = reckon(&data)
        .args(["source", "scan", "--tenant", "acme", "--name", "shop"])
        .output()
        .unwrap();
    let (said, told) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{told}");
    assert!(
        !told.contains("another process is scanning it"),
        "the restart waited for the killed scan's lease ({:?}): {told}",
        started.elapsed()
    );
    let read: usize = said
        .split("read ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no row count in {said:?}"));
    let rest = ROWS - after_kill as usize;
    assert!(
        (rest..=rest + 2_500).contains(&read),
        "the scan went on after the {after_kill} stored rows: read {read}"
    );
    assert!(
        said.contains("key sets compared: 0 gone") && !said.contains("recovered"),
        "{said}"
    );

    assert_eq!(
        count(&ledger_db, "SELECT COUNT(*) FROM effect").await as usize,
        ROWS
    );
    assert_eq!(
        count(&ledger_db, "SELECT COUNT(DISTINCT key) FROM effect").await as usize,
        ROWS
    );
    // Exactly one first sight per effect: nothing was stored twice.
    assert_eq!(
        count(
            &ledger_db,
            "SELECT COUNT(*) FROM effect_history WHERE kind = 'first_seen'"
        )
        .await as usize,
        ROWS
    );
    assert_eq!(
        count(
            &ledger_db,
            "SELECT COUNT(*) FROM effect_history WHERE kind <> 'first_seen'"
        )
        .await,
        0,
        "re-reading rows after the crash must not invent changes"
    );
    // The ledger equals the source, row for row.
    let src_unknown = {
        use sqlx::ConnectOptions;
        let mut c = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&store)
            .read_only(true)
            .connect()
            .await
            .unwrap();
        let n: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM justonce_keys WHERE state = 'unknown'")
                .fetch_one(&mut c)
                .await
                .unwrap();
        n
    };
    assert_eq!(
        count(
            &ledger_db,
            "SELECT COUNT(*) FROM effect WHERE state = 'unknown'"
        )
        .await,
        src_unknown
    );
}
