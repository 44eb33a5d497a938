//! A source that cannot answer fails in seconds with the database's message in its health:
//! with the tenant's table locked by the application, the scan and the probe give up on
//! the lock within seconds (the servers' own defaults would wait for as long as the lock is
//! held), and a connection reckon abandons mid-statement has that statement cancelled on
//! the server.

#[allow(
    dead_code,
    reason = "a module shared by several test modules; not each uses all of it"
)]
use crate::common;

use common::{Kind, SourceDb, TestLedger, test_egress};
use futures::StreamExt;
use reckon_engine::probe::test_source;
use reckon_engine::scan::open_source;
use sqlx::{AssertSqlSafe, Connection};
use std::time::{Duration, Instant};

/// Scan and probe `name` while its table is locked: each fails within seconds, naming the
/// lock, and the scan's failure is in the source's health.
async fn fails_in_seconds(l: &TestLedger, name: &str, says: &str) {
    let started = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(25), l.try_scan(name, false))
        .await
        .expect("the scan of a locked table did not end within 25 s")
        .expect_err("a locked table cannot be scanned");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    assert!(err.to_string().contains(says), "{err}");
    let s = l.source(name).await;
    assert!(s.consecutive_failures >= 1, "{s:?}");
    assert!(
        s.last_error.as_deref().is_some_and(|e| e.contains(says)),
        "{:?}",
        s.last_error
    );
    let report = test_source(&*l.ledger, &l.tenant, &s, &test_egress()).await;
    assert!(!report.ok, "{report:?}");
    // The connection test answers in a fixed sentence (never the server's own text, which
    // may carry what the admin configured); it names the lock.
    assert!(report.message.contains("the table is locked"), "{report:?}");
    assert!(report.millis < 15_000, "{report:?}");
}

#[tokio::test]
async fn a_locked_postgres_table_fails_the_scan_in_seconds_and_leaves_nothing_waiting() {
    let db = SourceDb::fresh(Kind::Postgres).await;
    db.writer(&["populate"]);
    let l = TestLedger::new().await;
    l.add_source("shop", "postgres", &db.source_dsn).await;
    let mut app = sqlx::PgConnection::connect(&db.source_dsn).await.unwrap();
    sqlx::raw_sql("BEGIN; LOCK TABLE justonce_keys IN ACCESS EXCLUSIVE MODE")
        .execute(&mut app)
        .await
        .unwrap();

    fails_in_seconds(&l, "shop", "lock timeout").await;

    // reckon gives up after one second on a read stuck behind the lock (as a probe's
    // timeout or a cancelled task would): its statement is cancelled on the server at
    // once, not left waiting for the lock (nor for the 5 s lock timeout).
    let database = db.source_dsn.rsplit('/').next().unwrap().to_owned();
    let mut admin = sqlx::PgConnection::connect(&db.source_dsn).await.unwrap();
    let waiting = async |admin: &mut sqlx::PgConnection| -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 \
             AND application_name = 'reckon-scan' AND wait_event_type = 'Lock'",
        )
        .bind(&database)
        .fetch_one(admin)
        .await
        .unwrap()
    };
    assert_eq!(
        waiting(&mut admin).await,
        0,
        "a scan or probe left a waiting query"
    );
    let s = l.source("shop").await;
    let started = Instant::now();
    let gave_up = tokio::time::timeout(Duration::from_secs(1), async {
        let mut conn = open_source(&*l.ledger, &l.tenant, &s, &test_egress())
            .await
            .unwrap();
        let first = conn.rows(None, true).next().await;
        drop(first);
    })
    .await;
    assert!(gave_up.is_err(), "the read did not wait for the lock");
    let mut cleared = false;
    while started.elapsed() < Duration::from_millis(3500) {
        if waiting(&mut admin).await == 0 {
            cleared = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(cleared, "the abandoned query still waits on the server");
    assert!(started.elapsed() < Duration::from_millis(3500));

    // The lock released, the same source scans.
    sqlx::raw_sql("ROLLBACK").execute(&mut app).await.unwrap();
    let report = l.scan("shop", false).await;
    assert!(report.created > 0, "{report:?}");
    let s = l.source("shop").await;
    assert_eq!(s.consecutive_failures, 0, "{s:?}");
    app.close().await.ok();
    admin.close().await.ok();
    db.drop_db().await;
}

/// The first FETCH of a scan's cursor sorts every row it reads (justonce's only index is
/// not the scan's order): for a first scan of millions of rows that takes longer than the
/// 30 s each statement may run, and no first scan of such a table could ever start. Here
/// the table's rows take 31 s to come (a view over a function that sleeps first), as a
/// sort of ten million rows does; the scan still stores them.
#[tokio::test]
async fn a_postgres_table_slower_to_sort_than_the_statement_limit_is_still_scanned() {
    let db = SourceDb::fresh(Kind::Postgres).await;
    db.writer(&["populate"]);
    let l = TestLedger::new().await;
    l.add_source("shop", "postgres", &db.source_dsn).await;
    let mut app = sqlx::PgConnection::connect(&db.source_dsn).await.unwrap();
    sqlx::raw_sql(
        "ALTER TABLE justonce_keys RENAME TO justonce_keys_data; \
         CREATE FUNCTION slow_keys() RETURNS SETOF justonce_keys_data LANGUAGE plpgsql AS $$ \
         BEGIN PERFORM pg_sleep(31); RETURN QUERY SELECT * FROM justonce_keys_data; END $$; \
         CREATE VIEW justonce_keys AS SELECT * FROM slow_keys()",
    )
    .execute(&mut app)
    .await
    .unwrap();
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM justonce_keys_data")
        .fetch_one(&mut app)
        .await
        .unwrap();
    let started = Instant::now();
    let report = l.scan("shop", false).await;
    assert!(
        started.elapsed() >= Duration::from_secs(31),
        "the rows came before the sleep ended: {:?}",
        started.elapsed()
    );
    assert_eq!(report.created as i64, rows, "{report:?}");
    let s = l.source("shop").await;
    assert_eq!(s.consecutive_failures, 0, "{s:?}");
    app.close().await.ok();
    db.drop_db().await;
}

#[tokio::test]
async fn a_locked_mysql_table_fails_the_scan_in_seconds() {
    let db = SourceDb::fresh(Kind::Mysql).await;
    db.writer(&["populate"]);
    let l = TestLedger::new().await;
    l.add_source("shop", "mysql", &db.source_dsn).await;
    let mut app = sqlx::MySqlConnection::connect(&db.source_dsn)
        .await
        .unwrap();
    sqlx::raw_sql(AssertSqlSafe("LOCK TABLES justonce_keys WRITE".to_owned()))
        .execute(&mut app)
        .await
        .unwrap();

    fails_in_seconds(&l, "shop", "Lock wait timeout").await;

    sqlx::raw_sql("UNLOCK TABLES")
        .execute(&mut app)
        .await
        .unwrap();
    let report = l.scan("shop", false).await;
    assert!(report.created > 0, "{report:?}");
    app.close().await.ok();
    db.drop_db().await;
}
