//! Write-back: the only write reckon ever makes to a tenant's database.
//!
//! A [`SourceWriter`] is opened from the ledger's [`Source`], and only when that source's
//! write-back setting is on ([`Source::writeback`], which only the ledger's stored setting
//! can turn on): a source without write-back cannot get a writer at all. It connects with
//! the source's own DSN, after the operator's egress policy allowed it, and can do exactly
//! two things to one row: one conditional `UPDATE` or one conditional `DELETE`,
//!
//! ```sql
//! ... WHERE key = ? AND state = <seen> AND updated_at = <seen>
//! ```
//!
//! in autocommit, so the application's row is changed only if it is still exactly what reckon
//! saw; zero rows affected means the application moved first. No transaction spans the read
//! and the write: holding one would block the application (SQLite's write lock), and the
//! condition is the guard. `key` is backquoted on MySQL/MariaDB, where it is also compared
//! as binary so a case-insensitive collation cannot match another spelling.

use crate::dsn::{Dialect, SourceDsn, validate_table_name};
use crate::egress::EgressPolicy;
use crate::limits::{CancelOnDrop, Canceller};
use crate::own;
use crate::scan::{describe, quote};
use reckon_ledger::{Source, WritebackPolicy};
use secrecy::{ExposeSecret, SecretString};
use sqlx::mysql::{MySqlConnectOptions, MySqlSslMode};
use sqlx::postgres::{PgConnectOptions, PgSslMode};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, Executor, Row};
use std::str::FromStr;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The source did not opt in: nothing is opened, nothing is written.
    #[error("source {0:?} has write-back off: reckon never writes to it")]
    NotOptedIn(String),
    #[error("refused by the egress policy: {0}")]
    Egress(String),
    #[error("cannot connect to the source: {0}")]
    Connect(String),
    #[error("source statement failed: {0}")]
    Query(String),
    #[error("{0}")]
    Invalid(String),
}

fn query_err(e: sqlx::Error) -> WriteError {
    WriteError::Query(describe(&e))
}

/// The row as it is now (read in autocommit, outside any transaction).
#[derive(Debug, Clone, PartialEq)]
pub struct RowNow {
    pub state: String,
    /// `None` when the stored value is not a number (the scan quarantines such rows).
    pub updated_at: Option<f64>,
    /// The response column as JSON text (`None` = SQL NULL).
    pub response: Option<String>,
    pub expires_at: Option<f64>,
    /// When the row was claimed: a row claimed anew after a delete has a later one than
    /// the row it replaced (an update in place keeps it). `None` when not a number.
    pub created_at: Option<f64>,
}

/// What one write-back does to the row.
#[derive(Debug, Clone, Copy)]
pub enum Change<'a> {
    /// `state`, `response` (JSON text), `updated_at` set; `expires_at` cleared (keep it:
    /// a swept row would let a retry run again).
    Set {
        state: &'a str,
        response: &'a str,
        updated_at: f64,
    },
    /// Delete the row (a release: the application's retry can claim the key again).
    Delete,
}

enum Inner {
    Sqlite(sqlx::SqliteConnection),
    Postgres(sqlx::PgConnection),
    Mysql(sqlx::MySqlConnection),
}

/// A read-write connection to the table of one source that opted in to write-back.
pub struct SourceWriter {
    inner: Inner,
    /// Cancels the running statement on the server if this is dropped unclosed.
    cancel: CancelOnDrop,
    table: String,
    policy: WritebackPolicy,
    source: String,
}

impl SourceWriter {
    /// Open a writer for `source`, whose DSN (the source's own, from the ledger) is `dsn`.
    /// Refused before anything is opened when the source's write-back is off, or when the
    /// egress policy does not allow the DSN. `egress` is the policy for the source's tenant
    /// ([`EgressPolicy::for_tenant`]): without one, every SQLite source is refused.
    pub async fn open(
        source: &Source,
        dsn: &SecretString,
        egress: &EgressPolicy,
    ) -> Result<SourceWriter, WriteError> {
        let Some(policy) = source.writeback() else {
            return Err(WriteError::NotOptedIn(source.name.clone()));
        };
        if source.mapping.is_some() {
            // Its one statement is written for justonce's table and states.
            return Err(WriteError::Invalid(format!(
                "source {:?} is read through a column mapping: reckon writes back only to \
                 justonce tables",
                source.name
            )));
        }
        let dialect = source.kind.dialect().ok_or_else(|| {
            WriteError::Invalid(format!(
                "source {:?} is a push source: reckon has no database to write to",
                source.name
            ))
        })?;
        let dsn = SourceDsn::parse(dialect, dsn.expose_secret())
            .map_err(|e| WriteError::Invalid(e.to_string()))?;
        // Resolved once and checked; the connection goes to the checked address (T09).
        let dsn = egress
            .pin(&dsn)
            .await
            .map_err(|e| WriteError::Egress(e.to_string()))?;
        validate_table_name(&source.table_name).map_err(|e| WriteError::Invalid(e.to_string()))?;
        let table = quote(dialect, &source.table_name);
        let connect_err = |e: sqlx::Error| WriteError::Connect(describe(&e));
        let mut cancel = CancelOnDrop::default();
        let inner = match &dsn {
            SourceDsn::Sqlite { path } => {
                if !path.is_file() {
                    return Err(WriteError::Connect(format!(
                        "no database file at {}",
                        path.display()
                    )));
                }
                let opts = SqliteConnectOptions::new()
                    .filename(path)
                    .create_if_missing(false)
                    .pragma("trusted_schema", "OFF")
                    .busy_timeout(Duration::from_secs(5));
                Inner::Sqlite(opts.connect().await.map_err(connect_err)?)
            }
            SourceDsn::Network {
                dialect: Dialect::Postgres,
                host,
                port,
                user,
                database,
                ssl_mode,
                ..
            } => {
                crate::dsn::refuse_service_pg_env()
                    .map_err(|e| WriteError::Invalid(e.to_string()))?;
                let ssl = match ssl_mode.as_deref() {
                    None => PgSslMode::Prefer,
                    Some(m) => PgSslMode::from_str(m).map_err(connect_err)?,
                };
                let opts = PgConnectOptions::new_without_pgpass()
                    .host(host)
                    .port(*port)
                    .username(user)
                    .password(dsn.password())
                    .database(database)
                    .ssl_mode(ssl)
                    .application_name("reckon-writeback");
                let mut conn = tokio::time::timeout(Duration::from_secs(15), opts.connect())
                    .await
                    .map_err(|_| WriteError::Connect("timed out after 15s".into()))?
                    .map_err(connect_err)?;
                // One row by primary key: anything slower is waiting on the application's
                // lock, and giving up leaves the row as it was (limits.rs).
                conn.execute(crate::limits::PG_TIMEOUTS_SESSION)
                    .await
                    .map_err(query_err)?;
                cancel = CancelOnDrop::new(
                    Canceller::postgres(&mut conn, &opts)
                        .await
                        .map_err(query_err)?,
                );
                Inner::Postgres(conn)
            }
            SourceDsn::Network {
                host,
                port,
                user,
                database,
                ssl_mode,
                ..
            } => {
                let ssl = match ssl_mode.as_deref() {
                    None => MySqlSslMode::Preferred,
                    Some(m) => MySqlSslMode::from_str(m).map_err(connect_err)?,
                };
                let opts = MySqlConnectOptions::new()
                    .host(host)
                    .port(*port)
                    .username(user)
                    .database(database)
                    .ssl_mode(ssl)
                    .charset("utf8mb4");
                let opts = match dsn.password() {
                    "" => opts,
                    pw => opts.password(pw),
                };
                let mut conn = tokio::time::timeout(Duration::from_secs(15), opts.connect())
                    .await
                    .map_err(|_| WriteError::Connect("timed out after 15s".into()))?
                    .map_err(connect_err)?;
                crate::limits::mysql_timeouts(&mut conn)
                    .await
                    .map_err(query_err)?;
                cancel = CancelOnDrop::new(
                    Canceller::mysql(&mut conn, &opts)
                        .await
                        .map_err(query_err)?,
                );
                Inner::Mysql(conn)
            }
        };
        let mut writer = SourceWriter {
            inner,
            cancel,
            table,
            policy,
            source: source.name.clone(),
        };
        // Never reckon's own database, whatever led there (see `own.rs`).
        if let Some(id) = egress.own_identity() {
            let seen = match &mut writer.inner {
                Inner::Sqlite(c) => own::sees_identity_sqlite(c, id).await,
                Inner::Postgres(c) => own::sees_identity_pg(c, id, false).await,
                Inner::Mysql(c) => own::sees_identity_mysql(c, id).await,
            };
            let refused = match seen {
                Ok(false) => None,
                Ok(true) => Some(WriteError::Egress(own::REFUSED.into())),
                Err(e) => Some(query_err(e)),
            };
            if let Some(e) = refused {
                let _ = tokio::time::timeout(Duration::from_secs(2), writer.close()).await;
                return Err(e);
            }
        }
        Ok(writer)
    }

    /// The source's not_applied policy, as it was when the writer was opened.
    pub fn policy(&self) -> WritebackPolicy {
        self.policy
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// The row with exactly this key, as it is now.
    pub async fn read(&mut self, key: &str) -> Result<Option<RowNow>, WriteError> {
        let table = &self.table;
        let text = |b: Option<Vec<u8>>| b.map(|b| String::from_utf8_lossy(&b).into_owned());
        match &mut self.inner {
            Inner::Sqlite(c) => {
                let row = sqlx::query(AssertSqlSafe(format!(
                    "SELECT CAST(state AS BLOB) AS st, CASE WHEN typeof(updated_at) IN \
                     ('integer', 'real') THEN CAST(updated_at AS REAL) END AS u, \
                     CAST(response AS BLOB) AS resp, CASE WHEN typeof(expires_at) IN \
                     ('integer', 'real') THEN CAST(expires_at AS REAL) END AS e, \
                     CASE WHEN typeof(created_at) IN ('integer', 'real') \
                     THEN CAST(created_at AS REAL) END AS c \
                     FROM {table} WHERE key = $1"
                )))
                .bind(key)
                .fetch_optional(&mut *c)
                .await
                .map_err(query_err)?;
                row.map(|r| {
                    Ok(RowNow {
                        state: text(r.try_get("st").map_err(query_err)?).unwrap_or_default(),
                        updated_at: r.try_get("u").map_err(query_err)?,
                        response: text(r.try_get("resp").map_err(query_err)?),
                        expires_at: r.try_get("e").map_err(query_err)?,
                        created_at: r.try_get("c").map_err(query_err)?,
                    })
                })
                .transpose()
            }
            Inner::Postgres(c) => {
                let row = sqlx::query(AssertSqlSafe(format!(
                    "SELECT state::text AS st, updated_at::float8 AS u, response::text AS resp, \
                     expires_at::float8 AS e, created_at::float8 AS c FROM {table} WHERE key = $1"
                )))
                .bind(key)
                .fetch_optional(&mut *c)
                .await
                .map_err(query_err)?;
                row.map(|r| {
                    Ok(RowNow {
                        state: r
                            .try_get::<Option<String>, _>("st")
                            .map_err(query_err)?
                            .unwrap_or_default(),
                        updated_at: r.try_get("u").map_err(query_err)?,
                        response: r.try_get("resp").map_err(query_err)?,
                        expires_at: r.try_get("e").map_err(query_err)?,
                        created_at: r.try_get("c").map_err(query_err)?,
                    })
                })
                .transpose()
            }
            Inner::Mysql(c) => {
                let row = sqlx::query(AssertSqlSafe(format!(
                    "SELECT CAST(state AS BINARY) AS st, CAST(updated_at AS DOUBLE) AS u, \
                     CAST(response AS BINARY) AS resp, CAST(expires_at AS DOUBLE) AS e, \
                     CAST(created_at AS DOUBLE) AS c FROM {table} WHERE `key` = ? AND CAST(`key` AS BINARY) = CAST(? AS BINARY)"
                )))
                .bind(key)
                .bind(key)
                .fetch_optional(&mut *c)
                .await
                .map_err(query_err)?;
                row.map(|r| {
                    Ok(RowNow {
                        state: text(r.try_get("st").map_err(query_err)?).unwrap_or_default(),
                        updated_at: r.try_get("u").map_err(query_err)?,
                        response: text(r.try_get("resp").map_err(query_err)?),
                        expires_at: r.try_get("e").map_err(query_err)?,
                        created_at: r.try_get("c").map_err(query_err)?,
                    })
                })
                .transpose()
            }
        }
    }

    /// The one conditional statement: change the row only if its state and updated_at are
    /// still what reckon saw. Returns the rows affected (0 or 1): 0 means the application
    /// moved first, and nothing was changed.
    pub async fn apply(
        &mut self,
        key: &str,
        seen_state: &str,
        seen_updated_at: f64,
        change: Change<'_>,
    ) -> Result<u64, WriteError> {
        let table = &self.table;
        let done = match (&mut self.inner, change) {
            (
                Inner::Sqlite(c),
                Change::Set {
                    state,
                    response,
                    updated_at,
                },
            ) => sqlx::query(AssertSqlSafe(format!(
                "UPDATE {table} SET state = $1, response = $2, updated_at = $3, \
                 expires_at = NULL WHERE key = $4 AND state = $5 AND updated_at = $6"
            )))
            .bind(state)
            .bind(response)
            .bind(updated_at)
            .bind(key)
            .bind(seen_state)
            .bind(seen_updated_at)
            .execute(&mut *c)
            .await
            .map_err(query_err)?
            .rows_affected(),
            (Inner::Sqlite(c), Change::Delete) => sqlx::query(AssertSqlSafe(format!(
                "DELETE FROM {table} WHERE key = $1 AND state = $2 AND updated_at = $3"
            )))
            .bind(key)
            .bind(seen_state)
            .bind(seen_updated_at)
            .execute(&mut *c)
            .await
            .map_err(query_err)?
            .rows_affected(),
            (
                Inner::Postgres(c),
                Change::Set {
                    state,
                    response,
                    updated_at,
                },
            ) => sqlx::query(AssertSqlSafe(format!(
                // $2::jsonb: justonce's column is JSONB; a drifted TEXT column takes the
                // same text by PostgreSQL's assignment cast.
                "UPDATE {table} SET state = $1, response = $2::jsonb, updated_at = $3, \
                 expires_at = NULL WHERE key = $4 AND state = $5 AND updated_at = $6"
            )))
            .bind(state)
            .bind(response)
            .bind(updated_at)
            .bind(key)
            .bind(seen_state)
            .bind(seen_updated_at)
            .execute(&mut *c)
            .await
            .map_err(query_err)?
            .rows_affected(),
            (Inner::Postgres(c), Change::Delete) => sqlx::query(AssertSqlSafe(format!(
                "DELETE FROM {table} WHERE key = $1 AND state = $2 AND updated_at = $3"
            )))
            .bind(key)
            .bind(seen_state)
            .bind(seen_updated_at)
            .execute(&mut *c)
            .await
            .map_err(query_err)?
            .rows_affected(),
            (
                Inner::Mysql(c),
                Change::Set {
                    state,
                    response,
                    updated_at,
                },
            ) => sqlx::query(AssertSqlSafe(format!(
                "UPDATE {table} SET state = ?, response = ?, updated_at = ?, expires_at = NULL \
                 WHERE `key` = ? AND CAST(`key` AS BINARY) = CAST(? AS BINARY) \
                 AND state = ? AND updated_at = ?"
            )))
            .bind(state)
            .bind(response)
            .bind(updated_at)
            .bind(key)
            .bind(key)
            .bind(seen_state)
            .bind(seen_updated_at)
            .execute(&mut *c)
            .await
            .map_err(query_err)?
            .rows_affected(),
            (Inner::Mysql(c), Change::Delete) => sqlx::query(AssertSqlSafe(format!(
                "DELETE FROM {table} WHERE `key` = ? AND CAST(`key` AS BINARY) = CAST(? AS BINARY) \
                 AND state = ? AND updated_at = ?"
            )))
            .bind(key)
            .bind(key)
            .bind(seen_state)
            .bind(seen_updated_at)
            .execute(&mut *c)
            .await
            .map_err(query_err)?
            .rows_affected(),
        };
        Ok(done)
    }

    pub async fn close(mut self) {
        self.cancel.disarm();
        match self.inner {
            Inner::Sqlite(c) => {
                let _ = c.close().await;
            }
            Inner::Postgres(c) => {
                let _ = c.close().await;
            }
            Inner::Mysql(c) => {
                let _ = c.close().await;
            }
        }
    }
}
