//! Secrets never reach a log line, an error or the ledger's error column (T14, partly), and
//! the egress policy refuses hostile DSNs with a reason (T08, T12), before any connection.
//!
//! Run: `cargo test -p reckon-engine --test secrets` (PostgreSQL at 127.0.0.1:5432).

#[allow(
    dead_code,
    reason = "a module shared by several test modules; not each uses all of it"
)]
#[path = "it/common/mod.rs"]
mod common;

use common::{TestLedger, test_egress};
use reckon_engine::{ScanOptions, scan_source};
use reckon_sources::EgressPolicy;
use std::io::Write;
use std::sync::{Arc, Mutex};

const CANARY: &str = "CanaryPw-7f3a9c";

/// Every line tracing writes during the test, at every level.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_failing_connection_logs_and_stores_no_password() {
    let logs = Captured::default();
    let sink = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || sink.clone())
        .finish();
    // The global default, not a thread-local one: callsites the other test of this binary
    // hits first (on its own thread, with no subscriber) would otherwise cache "never
    // interested" and this test could capture nothing. Its logs are captured too, and must
    // not leak the secret either.
    tracing::subscriber::set_global_default(subscriber).expect("only this test sets one");

    let l = TestLedger::new().await;
    // Nothing listens on port 1; a database that does not exist on the real server; a
    // user that does not exist there.
    let dsns = [
        format!("postgres://shop:{CANARY}@127.0.0.1:1/orders?sslmode=disable"),
        format!("postgres://postgres:{CANARY}@127.0.0.1:5432/no_such_db_reckon_t"),
        format!("postgres://nobody_reckon_t:{CANARY}@127.0.0.1:5432/postgres"),
        format!("mysql://shop:{CANARY}@127.0.0.1:1/orders"),
    ];
    for (i, dsn) in dsns.iter().enumerate() {
        let kind = if dsn.starts_with("mysql") {
            "mysql"
        } else {
            "postgres"
        };
        let name = format!("s{i}");
        l.add_source(&name, kind, dsn).await;
        let err = l
            .try_scan(&name, false)
            .await
            .expect_err("the connection fails");
        for shown in [err.to_string(), format!("{err:?}")] {
            assert!(!shown.contains(CANARY), "error shows the secret: {shown}");
        }
        let s = l.source(&name).await;
        let stored = s.last_error.clone().expect("the failure is recorded");
        assert!(
            !stored.contains(CANARY),
            "ledger stores the secret: {stored}"
        );
        assert!(!format!("{s:?}").contains(CANARY));
        assert!(!serde_json::to_string(&s).unwrap().contains(CANARY));
    }
    let text = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    assert!(
        !text.is_empty(),
        "nothing was captured: the test would prove nothing"
    );
    assert!(
        !text.contains(CANARY),
        "a log line holds the secret:\n{text}"
    );
}

#[tokio::test]
async fn hostile_dsns_are_refused_before_connecting() {
    let l = TestLedger::new().await;
    let strict = ScanOptions {
        egress: Arc::new(EgressPolicy::default()),
        ..ScanOptions::default()
    };
    for (i, (kind, dsn, why)) in [
        ("postgres", "postgres://u:p@127.0.0.1:5432/db", "loopback"),
        ("postgres", "postgres://u:p@localhost/db", "loopback"),
        ("postgres", "postgres://u:p@[::1]/db", "loopback"),
        (
            "postgres",
            "postgres://u:p@169.254.169.254/db",
            "link-local",
        ),
        ("postgres", "postgres://u:p@10.0.0.8/db", "private"),
        ("mysql", "mysql://u:p@192.168.0.3/db", "private"),
        ("sqlite", "/etc/passwd", "not enabled"),
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("h{i}");
        l.add_source(&name, kind, dsn).await;
        let s = l.source(&name).await;
        let err = scan_source(&*l.ledger, &l.tenant, &s, &strict)
            .await
            .expect_err(dsn);
        let text = err.to_string();
        assert!(text.contains("egress policy"), "{dsn}: {text}");
        assert!(text.contains(why), "{dsn}: {text}");
    }
    // With the operator's allow-list the same loopback source is allowed (and then fails
    // for its own reasons: no such database).
    let s = l.source("h0").await;
    let opts = ScanOptions {
        egress: test_egress(),
        ..ScanOptions::default()
    };
    let err = scan_source(&*l.ledger, &l.tenant, &s, &opts)
        .await
        .expect_err("no such database");
    assert!(!err.to_string().contains("egress policy"), "{err}");
}

/// Every file of `dir` (name and bytes), sorted.
fn files(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

/// T12, read-only: a SQLite source written by the real justonce library (WAL mode) is
/// scanned twice, incrementally and with the key-set comparison; the database file's bytes
/// are the same before and after, and no write-ahead log with content appears beside it.
#[tokio::test]
async fn a_scan_leaves_the_sqlite_file_byte_identical() {
    let db = common::SourceDb::fresh(common::Kind::Sqlite).await;
    db.writer(&["populate"]);
    let path = std::path::PathBuf::from(&db.source_dsn);
    let dir = path.parent().unwrap().to_path_buf();
    let before = files(&dir);
    assert!(
        before
            .iter()
            .any(|(n, b)| n == "justonce.db" && !b.is_empty())
    );
    let l = TestLedger::new().await;
    l.add_source("shop", "sqlite", &db.source_dsn).await;
    let first = l.scan("shop", false).await;
    assert!(first.created > 0, "the scan read nothing: {first:?}");
    let second = l.scan("shop", true).await;
    assert!(second.full, "{second:?}");
    let after = files(&dir);
    let main = |v: &[(String, Vec<u8>)]| {
        v.iter()
            .find(|(n, _)| n == "justonce.db")
            .map(|(_, b)| b.clone())
            .unwrap()
    };
    assert!(
        main(&before) == main(&after),
        "the scan changed the database file"
    );
    for (name, bytes) in &after {
        if name.ends_with("-wal") {
            assert!(bytes.is_empty(), "the scan wrote a WAL frame into {name}");
        }
    }
    db.drop_db().await;
}

/// T12, per tenant, at connect: tenant `acme`'s source names tenant `beta`'s file (stored
/// directly in the ledger, as a row saved before the check at save existed would be),
/// through a link in acme's own directory, or through `..`: every scan is refused by the
/// egress policy before the file is opened, and so is a write-back writer. The same file
/// copied into acme's own directory scans, so the refusal is the confinement, nothing else.
#[tokio::test]
async fn another_tenants_sqlite_file_is_refused_at_every_connection() {
    let db = common::SourceDb::fresh(common::Kind::Sqlite).await;
    db.writer(&["populate"]);
    let beta_dir = common::sqlite_root().join("beta");
    std::fs::create_dir_all(&beta_dir).unwrap();
    let beta = tempfile::tempdir_in(&beta_dir).unwrap();
    let theirs = beta.path().join("justonce.db");
    std::fs::copy(&db.source_dsn, &theirs).unwrap();
    let mine = std::path::Path::new(&db.source_dsn).parent().unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(&theirs, mine.join("link.db")).unwrap();
    let beta_name = beta
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let dotdot = mine.join(format!("../../beta/{beta_name}/justonce.db"));
    assert!(dotdot.exists(), "{}", dotdot.display());

    let l = TestLedger::new().await;
    let opts = ScanOptions {
        egress: test_egress(),
        ..ScanOptions::default()
    };
    for (name, path, why) in [
        ("theirs", theirs.clone(), "inside"),
        ("link", mine.join("link.db"), "after following links"),
        ("dotdot", dotdot, "'..'"),
    ] {
        l.add_source(name, "sqlite", path.to_str().unwrap()).await;
        let s = l.source(name).await;
        let err = scan_source(&*l.ledger, &l.tenant, &s, &opts)
            .await
            .expect_err(name);
        let text = err.to_string();
        assert!(text.contains("egress policy"), "{name}: {text}");
        assert!(text.contains(why), "{name}: {text}");
        // A write-back writer for it (write-back on) is refused the same way.
        l.ledger
            .set_source_writeback(
                l.tenant.id,
                name,
                Some(reckon_ledger::WritebackPolicy::Release),
            )
            .await
            .unwrap();
        let s = l.source(name).await;
        let dsn = l.ledger.source_dsn(l.tenant.id, &s).await.unwrap();
        let policy = test_egress().for_tenant(&l.tenant.slug);
        match reckon_sources::SourceWriter::open(&s, &dsn, &policy).await {
            Err(reckon_sources::WriteError::Egress(e)) => assert!(e.contains(why), "{e}"),
            Err(e) => panic!("{name}: wrong refusal: {e}"),
            Ok(_) => panic!("{name}: a writer was opened on another tenant's file"),
        }
    }
    // The control: acme's own copy of the same file scans.
    l.add_source("mine", "sqlite", &db.source_dsn).await;
    let s = l.source("mine").await;
    let report = scan_source(&*l.ledger, &l.tenant, &s, &opts)
        .await
        .expect("acme's own file scans");
    assert!(report.created > 0, "{report:?}");
    db.drop_db().await;
}
