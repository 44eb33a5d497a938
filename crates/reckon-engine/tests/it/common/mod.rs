//! Harness for scan tests: fresh source databases written by the real justonce library
//! (testdata/justonce_writer.py), and a fresh SQLite ledger per test.
//!
//! A service that is down FAILS the test: nothing here ever skips a backend.

use reckon_engine::scan::ScanFailure;
use reckon_engine::{ScanOptions, ScanReport, SourceInput};
use reckon_ledger::{Keyring, Ledger, Source, Tenant};
use reckon_testkit::{FreshDb, Server};
use serde_json::Value;
use sqlx::{AssertSqlSafe, Connection};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, OnceLock};
use tempfile::TempDir;

pub const SOURCE: &str = "src";
/// The slug of [`TestLedger`]'s tenant.
pub const TENANT: &str = "acme";

/// The operator's SQLite source directory of these tests; tenant `acme`'s files are in
/// its `acme/` subdirectory.
pub fn sqlite_root() -> PathBuf {
    std::env::temp_dir().join("reckon-engine-tests-sqlite-sources")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Sqlite,
    Postgres,
    Mysql,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Sqlite => "sqlite",
            Kind::Postgres => "postgres",
            Kind::Mysql => "mysql",
        }
    }
}

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The venv python, set up once per test process by scripts/test-env.sh.
pub fn python() -> &'static str {
    static PY: OnceLock<String> = OnceLock::new();
    PY.get_or_init(|| {
        let script = manifest_dir().join("../../scripts/test-env.sh");
        let out = Command::new(&script)
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
        assert!(
            out.status.success(),
            "test-env.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let py = String::from_utf8(out.stdout).expect("utf-8 python path");
        let py = py.trim().to_owned();
        assert!(!py.is_empty(), "test-env.sh printed no python path");
        py
    })
}

/// A fresh, empty database for a source.
pub struct SourceDb {
    pub kind: Kind,
    /// DSN as the Python writer takes it.
    pub writer_dsn: String,
    /// DSN as reckon's source takes it.
    pub source_dsn: String,
    _dir: TempDir,
}

impl SourceDb {
    pub async fn fresh(kind: Kind) -> SourceDb {
        // A SQLite source lives in its tenant's directory of the operator's SQLite source
        // directory (T12): `{sqlite_root()}/acme/`.
        let dir = match kind {
            Kind::Sqlite => {
                let tenant_dir = sqlite_root().join(TENANT);
                std::fs::create_dir_all(&tenant_dir).expect("the tenant's SQLite directory");
                tempfile::tempdir_in(&tenant_dir).expect("tempdir")
            }
            _ => tempfile::tempdir().expect("tempdir"),
        };
        let (writer_dsn, source_dsn) = match kind {
            Kind::Sqlite => {
                let p = dir.path().join("justonce.db");
                let p = p.to_str().expect("utf-8 temp path").to_owned();
                (p.clone(), p)
            }
            Kind::Postgres => {
                let url = FreshDb::postgres("reckon_scan").await.url;
                let writer = url.replacen("postgres://", "postgresql://", 1);
                let source = url.replacen("postgresql://", "postgres://", 1);
                (writer, source)
            }
            Kind::Mysql => {
                let url = FreshDb::mysql("reckon_scan").await.url;
                (url.clone(), url)
            }
        };
        SourceDb {
            kind,
            writer_dsn,
            source_dsn,
            _dir: dir,
        }
    }

    /// Drop the server database (call at the end of a passing test; a failing test leaves
    /// it behind for inspection). SQLite files go with the temporary directory.
    pub async fn drop_db(self) {
        let name = self
            .source_dsn
            .rsplit('/')
            .next()
            .expect("database name")
            .to_owned();
        let server = match self.kind {
            Kind::Sqlite => return,
            Kind::Postgres => Server::Postgres,
            Kind::Mysql => Server::Mysql,
        };
        let admin_url = match server {
            Server::Postgres => reckon_testkit::pg_admin_url(),
            Server::Mysql => reckon_testkit::mysql_admin_url(),
        };
        let url = self.source_dsn.clone();
        FreshDb {
            server,
            admin_url,
            name,
            url,
        }
        .drop_now()
        .await;
    }

    /// Run the justonce writer with a scenario and return its JSON output.
    pub fn writer(&self, args: &[&str]) -> Value {
        let script = manifest_dir().join("../../testdata/justonce_writer.py");
        let out = Command::new(python())
            .arg(&script)
            .args(["--backend", self.kind.as_str(), "--dsn", &self.writer_dsn])
            .args(args)
            .output()
            .expect("run justonce_writer.py");
        assert!(
            out.status.success(),
            "justonce_writer.py {args:?} on {} failed: {}",
            self.kind.as_str(),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("writer prints JSON")
    }

    /// Execute raw SQL statements on the source database.
    pub async fn exec(&self, statements: &[String]) {
        match self.kind {
            Kind::Sqlite => {
                let opts = sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(&self.writer_dsn)
                    .create_if_missing(true);
                let mut conn = sqlx::SqliteConnection::connect_with(&opts)
                    .await
                    .expect("open source SQLite file");
                for s in statements {
                    sqlx::raw_sql(AssertSqlSafe(s.clone()))
                        .execute(&mut conn)
                        .await
                        .unwrap_or_else(|e| panic!("{s}: {e}"));
                }
                conn.close().await.ok();
            }
            Kind::Postgres => {
                let mut conn = sqlx::PgConnection::connect(&self.source_dsn)
                    .await
                    .expect("connect to source PostgreSQL");
                for s in statements {
                    sqlx::raw_sql(AssertSqlSafe(s.clone()))
                        .execute(&mut conn)
                        .await
                        .unwrap_or_else(|e| panic!("{s}: {e}"));
                }
                conn.close().await.ok();
            }
            Kind::Mysql => {
                let mut conn = sqlx::MySqlConnection::connect(&self.source_dsn)
                    .await
                    .expect("connect to source MariaDB");
                for s in statements {
                    sqlx::raw_sql(AssertSqlSafe(s.clone()))
                        .execute(&mut conn)
                        .await
                        .unwrap_or_else(|e| {
                            panic!("{}: {e}", s.chars().take(200).collect::<String>())
                        });
                }
                conn.close().await.ok();
            }
        }
    }
}

/// A fresh SQLite ledger with one tenant.
pub struct TestLedger {
    pub ledger: Arc<dyn Ledger>,
    pub tenant: Tenant,
    _dir: TempDir,
}

impl TestLedger {
    pub async fn new() -> TestLedger {
        let dir = tempfile::tempdir().expect("tempdir");
        let keyring = Keyring::from_base64(&Keyring::generate_base64()).expect("keyring");
        let ledger = reckon_ledger::connect(None, dir.path(), keyring)
            .await
            .expect("open SQLite ledger");
        let tenant = ledger.create_tenant(TENANT).await.expect("create tenant");
        TestLedger {
            ledger,
            tenant,
            _dir: dir,
        }
    }

    pub async fn add_source(&self, name: &str, kind: &str, dsn: &str) -> Source {
        let new = reckon_engine::new_source(SourceInput {
            name: name.into(),
            kind: kind.into(),
            dsn: Some(dsn.into()),
            table: None,
            scan_interval: None,
            abandoned_after: Some("0s".into()),
            overlap: None,
            full_scan_every: None,
            mapping: None,
        })
        .expect("valid source input");
        self.ledger
            .add_source(self.tenant.id, new)
            .await
            .expect("add source")
    }

    pub async fn source(&self, name: &str) -> Source {
        self.ledger
            .source_by_name(self.tenant.id, name)
            .await
            .expect("source exists")
    }

    /// Scan `name`, re-reading the source first (its cursor changes).
    pub async fn try_scan(&self, name: &str, full: bool) -> Result<ScanReport, ScanFailure> {
        let source = self.source(name).await;
        reckon_engine::scan_source(
            &*self.ledger,
            &self.tenant,
            &source,
            &ScanOptions {
                full,
                egress: test_egress(),
                ..Default::default()
            },
        )
        .await
    }

    pub async fn scan(&self, name: &str, full: bool) -> ScanReport {
        self.try_scan(name, full)
            .await
            .unwrap_or_else(|e| panic!("scan of {name} failed: {e}"))
    }
}

/// The operator allow-list these tests need: their sources are on loopback and in
/// [`sqlite_root`] (each tenant in its own subdirectory).
pub fn test_egress() -> std::sync::Arc<reckon_sources::EgressPolicy> {
    std::sync::Arc::new(
        reckon_sources::EgressPolicy::new(
            &["127.0.0.0/8".into(), "::1".into()],
            Some(sqlite_root()),
        )
        .expect("valid networks"),
    )
}
