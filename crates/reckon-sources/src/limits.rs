//! How long a source may keep reckon waiting. A tenant's database is not reckon's to wait
//! on: a table locked by the application (`LOCK TABLE ... IN ACCESS EXCLUSIVE MODE`, a
//! long migration) or a query that does not come back must fail the scan, the probe or
//! the write-back in seconds, with the database's own message in the source's health, and
//! leave nothing running on the tenant's server.
//!
//! - Every connection sets a lock timeout and a statement timeout on the server, so the
//!   server itself ends a wait or a query that runs too long, whatever happens to reckon.
//! - A connection reckon gives up on (its future dropped: a probe's timeout, a cancelled
//!   task) has its running statement cancelled on the server through a second connection
//!   ([`CancelOnDrop`]): PostgreSQL `pg_cancel_backend`, MySQL `KILL QUERY`, both allowed
//!   to a user on its own sessions.

use sqlx::mysql::MySqlConnectOptions;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, Executor, MySqlConnection, PgConnection};
use std::time::Duration;

// A statement waits at most 5 s for a lock the application holds, and runs at most 30 s
// (each FETCH of a scan, each key lookup, each write-back statement).

/// PostgreSQL, for the read-only transaction of a scan or a probe.
pub(crate) const PG_TIMEOUTS_LOCAL: &str =
    "SET LOCAL lock_timeout = '5s'; SET LOCAL statement_timeout = '30s'";
/// PostgreSQL, for the first FETCH of a scan's cursor: it sorts every row the scan reads
/// (justonce's only index is (state, updated_at), the scan's order is (updated_at, key)),
/// which for a first scan of ten million rows takes longer than the per-statement limit
/// above, so a first scan of a large table could never start. Later FETCHes run under
/// [`PG_FETCH_TIMEOUT_LOCAL`] again.
pub(crate) const PG_SORT_TIMEOUT_LOCAL: &str = "SET LOCAL statement_timeout = '15min'";
/// PostgreSQL: back to the per-statement limit after the first FETCH.
pub(crate) const PG_FETCH_TIMEOUT_LOCAL: &str = "SET LOCAL statement_timeout = '30s'";
/// PostgreSQL, for a write-back session (autocommit).
pub(crate) const PG_TIMEOUTS_SESSION: &str =
    "SET lock_timeout = '5s'; SET statement_timeout = '30s'";

/// MySQL / MariaDB: the lock waits (metadata locks such as `LOCK TABLES ... WRITE`, and
/// InnoDB row locks), then the statement time limit, which MariaDB calls
/// `max_statement_time` (seconds) and MySQL `max_execution_time` (milliseconds, SELECT
/// only): whichever the server knows.
pub(crate) async fn mysql_timeouts(conn: &mut MySqlConnection) -> Result<(), sqlx::Error> {
    conn.execute("SET SESSION lock_wait_timeout = 5, innodb_lock_wait_timeout = 5")
        .await?;
    if conn
        .execute("SET SESSION max_statement_time = 30")
        .await
        .is_err()
    {
        conn.execute("SET SESSION max_execution_time = 30000")
            .await?;
    }
    Ok(())
}

/// What it takes to cancel a connection's running statement from another connection.
pub(crate) enum Canceller {
    Postgres(PgConnectOptions, i32),
    Mysql(MySqlConnectOptions, u64),
}

impl Canceller {
    pub(crate) async fn postgres(
        conn: &mut PgConnection,
        opts: &PgConnectOptions,
    ) -> Result<Canceller, sqlx::Error> {
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *conn)
            .await?;
        Ok(Canceller::Postgres(opts.clone(), pid))
    }

    pub(crate) async fn mysql(
        conn: &mut MySqlConnection,
        opts: &MySqlConnectOptions,
    ) -> Result<Canceller, sqlx::Error> {
        let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
            .fetch_one(&mut *conn)
            .await?;
        Ok(Canceller::Mysql(opts.clone(), id))
    }

    async fn cancel(self) {
        let attempt = async {
            match self {
                Canceller::Postgres(opts, pid) => {
                    let mut c = opts.application_name("reckon-cancel").connect().await?;
                    sqlx::query("SELECT pg_cancel_backend($1)")
                        .bind(pid)
                        .execute(&mut c)
                        .await?;
                    c.close().await
                }
                Canceller::Mysql(opts, id) => {
                    let mut c = opts.connect().await?;
                    // A number reckon read from the server: nothing of a tenant's text.
                    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL QUERY {id}")))
                        .execute(&mut c)
                        .await?;
                    c.close().await
                }
            }
        };
        match tokio::time::timeout(Duration::from_secs(10), attempt).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!(error = %crate::scan::describe(&e), "cancel failed"),
            Err(_) => tracing::debug!("cancel timed out"),
        }
    }
}

/// Held by an open connection: dropped while armed (reckon gave up on the connection
/// without closing it), it cancels the connection's running statement on the server.
#[derive(Default)]
pub(crate) struct CancelOnDrop(Option<Canceller>);

impl CancelOnDrop {
    pub(crate) fn new(c: Canceller) -> CancelOnDrop {
        CancelOnDrop(Some(c))
    }

    /// The connection is being closed in order: nothing to cancel.
    pub(crate) fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.0.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(c.cancel());
        }
    }
}
