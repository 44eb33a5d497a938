//! The two backends the conformance suite runs against, and a way to look at their tables
//! without going through the `Ledger` trait (to check what is really stored).
//!
//! SQLite: a fresh temporary directory per test. PostgreSQL: a fresh database per test on
//! the server named by `RECKON_TEST_PG_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`),
//! dropped when the test passes and left behind for inspection when it fails. An unreachable
//! PostgreSQL fails the test: the suite never skips a backend silently.
#![allow(
    clippy::string_slice,
    reason = "the texts sliced here are the tests' own ASCII: URLs, templates, tokens, HTTP heads"
)]

use reckon_domain::{SourceRecord, time};
use reckon_ledger::{IngestBatch, Keyring, Ledger, NewSource, Origin, SourceKind};
use sqlx::postgres::PgConnection;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{AssertSqlSafe, Connection, Row};
use std::path::PathBuf;
use std::sync::Arc;

/// One master key for the test process, so a ledger can be opened again.
pub fn keyring() -> Keyring {
    static KEY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    Keyring::from_base64(KEY.get_or_init(Keyring::generate_base64))
        .expect("a generated key is valid")
}

/// Where a test ledger's database lives, for direct queries.
#[derive(Debug, Clone)]
pub enum RawDb {
    Sqlite(PathBuf),
    Postgres(String),
}

impl RawDb {
    /// Run `sql` (several statements) on the database directly, as its owner.
    #[allow(
        dead_code,
        reason = "not every test binary that shares this module uses it"
    )]
    pub async fn exec(&self, sql: &str) {
        match self {
            RawDb::Sqlite(path) => {
                let opts = SqliteConnectOptions::new()
                    .filename(path)
                    .create_if_missing(false);
                let mut conn = sqlx::SqliteConnection::connect_with(&opts)
                    .await
                    .expect("open the SQLite ledger file directly");
                sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                    .execute(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
                conn.close().await.ok();
            }
            RawDb::Postgres(url) => {
                let mut conn = PgConnection::connect(url).await.expect("connect");
                sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                    .execute(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
                conn.close().await.ok();
            }
        }
    }

    /// The ledger on this database opened again (migrations run as at any start).
    #[allow(
        dead_code,
        reason = "not every test binary that shares this module uses it"
    )]
    pub async fn reopen(&self) -> Arc<dyn Ledger> {
        match self {
            RawDb::Sqlite(path) => {
                reckon_ledger::connect(None, path.parent().expect("a data dir"), keyring()).await
            }
            RawDb::Postgres(url) => {
                reckon_ledger::connect(Some(url), std::env::temp_dir().as_path(), keyring()).await
            }
        }
        .unwrap_or_else(|e| panic!("open the ledger again: {e}"))
    }

    /// Every non-NULL cell of `table` as (column name, the stored bytes). Text columns give
    /// their text, binary columns their raw bytes, numbers their text form.
    pub async fn cells(&self, table: &str) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        match self {
            RawDb::Sqlite(path) => {
                let opts = SqliteConnectOptions::new()
                    .filename(path)
                    .create_if_missing(false);
                let mut conn = sqlx::SqliteConnection::connect_with(&opts)
                    .await
                    .expect("open the SQLite ledger file directly");
                let columns: Vec<String> =
                    sqlx::query_scalar("SELECT name FROM pragma_table_info($1) ORDER BY cid")
                        .bind(table)
                        .fetch_all(&mut conn)
                        .await
                        .expect("list the table's columns");
                assert!(!columns.is_empty(), "table {table} has no columns");
                for col in columns {
                    let values: Vec<Option<Vec<u8>>> = sqlx::query_scalar(AssertSqlSafe(format!(
                        "SELECT CAST(\"{col}\" AS BLOB) FROM \"{table}\""
                    )))
                    .fetch_all(&mut conn)
                    .await
                    .expect("read a column");
                    out.extend(values.into_iter().flatten().map(|v| (col.clone(), v)));
                }
                conn.close().await.ok();
            }
            RawDb::Postgres(url) => {
                let mut conn = PgConnection::connect(url)
                    .await
                    .expect("connect to the test database directly");
                let columns = sqlx::query(
                    "SELECT column_name::text AS name, data_type::text AS ty \
                     FROM information_schema.columns \
                     WHERE table_schema = 'public' AND table_name = $1 ORDER BY ordinal_position",
                )
                .bind(table)
                .fetch_all(&mut conn)
                .await
                .expect("list the table's columns");
                assert!(!columns.is_empty(), "table {table} has no columns");
                for c in columns {
                    let col: String = c.get("name");
                    let ty: String = c.get("ty");
                    let values: Vec<Option<Vec<u8>>> = if ty == "bytea" {
                        sqlx::query_scalar(AssertSqlSafe(format!(
                            "SELECT \"{col}\" FROM \"{table}\""
                        )))
                        .fetch_all(&mut conn)
                        .await
                        .expect("read a column")
                    } else {
                        let v: Vec<Option<String>> = sqlx::query_scalar(AssertSqlSafe(format!(
                            "SELECT \"{col}\"::text FROM \"{table}\""
                        )))
                        .fetch_all(&mut conn)
                        .await
                        .expect("read a column");
                        v.into_iter().map(|s| s.map(String::into_bytes)).collect()
                    };
                    out.extend(values.into_iter().flatten().map(|v| (col.clone(), v)));
                }
                conn.close().await.ok();
            }
        }
        out
    }
}

enum Cleanup {
    Sqlite(
        #[allow(dead_code, reason = "held for its Drop, which removes the directory")]
        tempfile::TempDir,
    ),
    Postgres {
        admin_url: String,
        database: String,
    },
}

/// A push source (nothing to scan) with the defaults a tenant's first source gets.
pub fn push_source(name: &str) -> NewSource {
    NewSource {
        name: name.to_owned(),
        kind: SourceKind::Push,
        dsn: None,
        dsn_display: None,
        table_name: "justonce_keys".to_owned(),
        scan_interval_secs: 60,
        abandoned_after_secs: 300.0,
        overlap_secs: 5.0,
        full_scan_every_secs: 3600,
        mapping: None,
    }
}

/// A scan's batch of `records`, as a scheduled scan sends it (no cursor, no lease).
#[allow(
    dead_code,
    reason = "not every test binary that shares this module uses it"
)]
pub fn batch(records: Vec<SourceRecord>) -> IngestBatch {
    IngestBatch {
        origin: Origin::Scan,
        observed_at: time::now(),
        records,
        rejected: Vec::new(),
        abandoned_after_secs: 300.0,
        cursor: None,
        lease: None,
        expect_new: false,
    }
}

/// One fresh ledger for one test.
pub struct TestDb {
    pub ledger: Arc<dyn Ledger>,
    pub raw: RawDb,
    cleanup: Cleanup,
}

impl TestDb {
    pub async fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().expect("create a temporary directory");
        let ledger = reckon_ledger::connect(None, dir.path(), keyring())
            .await
            .unwrap_or_else(|e| panic!("open the SQLite ledger: {e}"));
        TestDb {
            ledger,
            raw: RawDb::Sqlite(dir.path().join("reckon.db")),
            cleanup: Cleanup::Sqlite(dir),
        }
    }

    pub async fn postgres() -> TestDb {
        let db = reckon_testkit::FreshDb::postgres("reckon_t").await;
        let (admin_url, database, url) = (db.admin_url, db.name, db.url);
        let ledger = reckon_ledger::connect(Some(&url), std::env::temp_dir().as_path(), keyring())
            .await
            .unwrap_or_else(|e| panic!("open the PostgreSQL ledger {url}: {e}"));
        TestDb {
            ledger,
            raw: RawDb::Postgres(url),
            cleanup: Cleanup::Postgres {
                admin_url,
                database,
            },
        }
    }

    pub fn ledger(&self) -> Arc<dyn Ledger> {
        self.ledger.clone()
    }

    /// The PostgreSQL database's URL, for tests that look under the `Ledger` trait there.
    #[allow(
        dead_code,
        reason = "not every test binary that shares this module uses it"
    )]
    pub fn pg_url(&self) -> String {
        match &self.raw {
            RawDb::Postgres(u) => u.clone(),
            RawDb::Sqlite(_) => panic!("this test runs on PostgreSQL only"),
        }
    }

    /// Called at the end of a passing test (a failing one panics before it, which leaves
    /// the PostgreSQL database behind to look at).
    pub async fn finish(self) {
        let TestDb {
            ledger, cleanup, ..
        } = self;
        drop(ledger);
        if let Cleanup::Postgres {
            admin_url,
            database,
        } = cleanup
            && let Ok(mut admin) = PgConnection::connect(&admin_url).await
        {
            // Best effort: WITH (FORCE) ends the dropped pool's connections still closing.
            let _ = sqlx::raw_sql(AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)"
            )))
            .execute(&mut admin)
            .await;
            admin.close().await.ok();
        }
    }
}
