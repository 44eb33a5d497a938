//! `reckon serve` while another process migrates the ledger (an upgrade's `reckon migrate`
//! step, another replica starting): it waits, and says so. Its port is open from the
//! start: `/healthz` answers 200 "migrating" (alive: probes must not restart it mid-way, or
//! the upgrade crash-loops), `/readyz` 503 "migrating" (no traffic yet), and its log says
//! what it waits for, again every 10 s. Once the migration lock is let go it serves.
//!
//! The other process is played by a transaction holding sqlx's migrations table locked
//! (what a migration in progress holds): PostgreSQL, the ledger several processes share.

use sqlx::{AssertSqlSafe, Connection};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn reckon(url: &str, key: &str, data: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_reckon"));
    c.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RECKON_DATABASE_URL", url)
        .env("RECKON_MASTER_KEY", key)
        .env("RECKON_DATA_DIR", data)
        .env("RECKON_LOG", "info")
        .env("RECKON_LOG_FORMAT", "text");
    c
}

/// One HTTP/1.1 GET on loopback; `None` when nothing listens.
async fn get(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.ok()?;
    let raw = String::from_utf8_lossy(&raw);
    let (head, body) = raw.split_once("\r\n\r\n")?;
    Some((head.get(9..12)?.parse().ok()?, body.to_owned()))
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_answers_migrating_and_says_it_waits_while_another_process_holds_the_migrations() {
    let admin = "postgres://postgres@127.0.0.1:5432/postgres";
    let db = format!("reckon_migrate_wait_{:016x}", rand::random::<u64>());
    let mut adm = sqlx::PgConnection::connect(admin)
        .await
        .expect("PostgreSQL at 127.0.0.1:5432 is required");
    sqlx::query(AssertSqlSafe(format!("CREATE DATABASE \"{db}\"")))
        .execute(&mut adm)
        .await
        .unwrap();
    let url = format!("postgres://postgres@127.0.0.1:5432/{db}");
    let key = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 32]>())
    };
    let dir = tempfile::tempdir().unwrap();

    // The migration step, as the deploy files run it before the server.
    let out = reckon(&url, &key, dir.path())
        .arg("migrate")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "reckon migrate: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Another process migrating: the migrations table locked in a transaction held open.
    let mut holder = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::raw_sql("BEGIN; LOCK TABLE _sqlx_migrations IN ACCESS EXCLUSIVE MODE")
        .execute(&mut holder)
        .await
        .unwrap();

    let port = free_port();
    let log = dir.path().join("serve.log");
    let mut server = Killed(
        reckon(&url, &key, dir.path())
            .arg("serve")
            .env("RECKON_LISTEN", format!("127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();

    // The port answers while the ledger cannot be opened.
    let deadline = Instant::now() + Duration::from_secs(60);
    let health = loop {
        if let Some(status) = server.0.try_wait().unwrap() {
            panic!("serve exited ({status}):\n{}", log_text());
        }
        if let Some(answer) = get(port, "/healthz").await {
            break answer;
        }
        assert!(
            Instant::now() < deadline,
            "nothing answered on the port while the migrations were locked:\n{}",
            log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(health, (200, "migrating\n".to_owned()), "/healthz");
    assert_eq!(
        get(port, "/readyz").await,
        Some((503, "migrating\n".to_owned())),
        "/readyz"
    );
    assert_eq!(
        get(port, "/api/v1/effects").await.map(|(s, _)| s),
        Some(503),
        "the API is not served before the ledger is open"
    );
    // It says what it waits for, and keeps saying it.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !log_text().contains("still waiting for the ledger's migrations") {
        assert!(
            Instant::now() < deadline,
            "no reminder that serve still waits:\n{}",
            log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let text = log_text();
    assert!(
        text.contains("waiting first if another process holds the migration lock"),
        "{text}"
    );
    assert_eq!(
        get(port, "/healthz").await,
        Some((200, "migrating\n".to_owned())),
        "still alive while it waits"
    );

    // The other process finishes: serve opens the ledger and becomes ready.
    sqlx::raw_sql("COMMIT").execute(&mut holder).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = server.0.try_wait().unwrap() {
            panic!("serve exited ({status}):\n{}", log_text());
        }
        if get(port, "/readyz").await.is_some_and(|(s, _)| s == 200) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "serve not ready after the lock was let go:\n{}",
            log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(log_text().contains("ledger open"), "{}", log_text());

    drop(server);
    drop(holder);
    let _ = sqlx::query(AssertSqlSafe(format!(
        "DROP DATABASE \"{db}\" WITH (FORCE)"
    )))
    .execute(&mut adm)
    .await;
}
