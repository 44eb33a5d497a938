//! Secrets never reach a log line, an error or the ledger's error column (T14, partly), and
//! the egress policy refuses hostile DSNs with a reason (T08, T12), before any connection.
//!
//! Run: `cargo test -p reckon-engine --test secrets` (PostgreSQL at 127.0.0.1:5432).

#[allow(dead_code)]
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
    let _guard = tracing::subscriber::set_default(subscriber);

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
