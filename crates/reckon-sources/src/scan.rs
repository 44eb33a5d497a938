//! Reading `justonce_keys`, read-only, in the three dialects of the reference.
//!
//! Every read runs inside a read-only transaction (PostgreSQL `READ ONLY` with a
//! statement timeout, MySQL `READ ONLY` with a consistent snapshot, SQLite opened
//! read-only with `query_only` and `trusted_schema=OFF`), so a scan can neither write nor
//! be tricked into running functions a hostile schema hides in views or triggers.
//! Columns are fetched as bytes and numbers as the source actually stored them, and decoded
//! by `reckon_domain::validate_row`.

use crate::dsn::{Dialect, SourceDsn, validate_table_name};
use crate::egress::EgressPolicy;
use crate::limits::{CancelOnDrop, Canceller};
use crate::mapping::cond::Lit;
use crate::mapping::{Mapping, RequestSpec, render};
use crate::own;
use futures::stream::{BoxStream, StreamExt, TryStreamExt};
use reckon_domain::{RawNum, RawRow};
use sqlx::mysql::{MySqlConnectOptions, MySqlSslMode};
use sqlx::postgres::{PgConnectOptions, PgSslMode};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, Executor, Row};
use std::str::FromStr;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("cannot connect to the source: {0}")]
    Connect(String),
    #[error("cannot read the source table: {0}")]
    Query(String),
    #[error("{0}")]
    Invalid(String),
}

/// sqlx errors can carry connection details; keep only the database's own message.
pub(crate) fn describe(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(db) => db.message().to_owned(),
        sqlx::Error::Io(io) => format!("I/O error: {}", io.kind()),
        sqlx::Error::Tls(_) => "TLS error".into(),
        sqlx::Error::PoolTimedOut => "timed out".into(),
        sqlx::Error::ColumnDecode { index, source } => {
            format!("column {index} has an unexpected type ({source})")
        }
        sqlx::Error::ColumnNotFound(c) => format!("column {c} not found"),
        other => {
            // Variants without connection details: safe to show.
            let s = other.to_string();
            s.chars().take(300).collect()
        }
    }
}

pub(crate) fn query_err(e: sqlx::Error) -> ScanError {
    ScanError::Query(describe(&e))
}

pub(crate) enum Inner {
    Sqlite(sqlx::SqliteConnection),
    Postgres(sqlx::PgConnection),
    Mysql(sqlx::MySqlConnection),
}

/// One open, read-only connection to a source's table.
pub struct SourceConn {
    pub(crate) inner: Inner,
    /// The table name, validated and quoted for the dialect.
    table: String,
    /// Cancels the running statement on the server if this is dropped unclosed.
    cancel: CancelOnDrop,
    /// A table read through a mapping rather than as justonce's `justonce_keys`.
    mapping: Option<Box<Mapping>>,
}

/// Bind a rendered statement's literals, each as its own type.
macro_rules! bind_lits {
    ($q:expr, $params:expr) => {{
        let mut q = $q;
        for p in $params {
            q = match p {
                Lit::Text(s) => q.bind(s.clone()),
                Lit::Int(i) => q.bind(*i),
                Lit::Real(r) => q.bind(*r),
                Lit::Bool(b) => q.bind(*b),
                Lit::Bytes(b) => q.bind(b.clone()),
            };
        }
        q
    }};
}
pub(crate) use bind_lits;

/// What the first statement of the PostgreSQL cursor binds.
enum PgBind {
    Justonce { since: Option<f64>, states: bool },
    Lits(Vec<Lit>),
}

/// Rows per FETCH of the PostgreSQL incremental read (bounded memory, bounded statement).
const PG_FETCH_SQL: &str = "FETCH 2000 FROM reckon_rows";

const KNOWN_STATES: [&str; 4] = ["in_progress", "succeeded", "failed", "unknown"];

pub(crate) fn quote(dialect: Dialect, table: &str) -> String {
    let q = if dialect == Dialect::Mysql { '`' } else { '"' };
    table
        .split('.')
        .map(|p| format!("{q}{p}{q}"))
        .collect::<Vec<_>>()
        .join(".")
}

impl SourceConn {
    /// Open `dsn` (as [`EgressPolicy::pin`] returned it) for reading `table`. Once
    /// connected, a connection that can see reckon's ledger identity
    /// ([`EgressPolicy::with_own_identity`] of `egress`) is closed and refused.
    pub async fn open(
        dsn: &SourceDsn,
        table: &str,
        egress: &EgressPolicy,
    ) -> Result<SourceConn, ScanError> {
        SourceConn::connect(dsn, table, egress, None).await
    }

    /// Open `dsn` as [`SourceConn::open`] does, for reading the table of `mapping` through
    /// it.
    pub async fn open_mapped(
        dsn: &SourceDsn,
        mapping: &Mapping,
        egress: &EgressPolicy,
    ) -> Result<SourceConn, ScanError> {
        SourceConn::connect(dsn, &mapping.table, egress, Some(Box::new(mapping.clone()))).await
    }

    async fn connect(
        dsn: &SourceDsn,
        table: &str,
        egress: &EgressPolicy,
        mapping: Option<Box<Mapping>>,
    ) -> Result<SourceConn, ScanError> {
        let own = egress.own_identity();
        let mut cancel = CancelOnDrop::default();
        validate_table_name(table).map_err(|e| ScanError::Invalid(e.to_string()))?;
        let table = quote(dsn.dialect(), table);
        let connect_err = |e: sqlx::Error| ScanError::Connect(describe(&e));
        let inner = match dsn {
            SourceDsn::Sqlite { path } => {
                if !path.is_file() {
                    return Err(ScanError::Connect(format!(
                        "no database file at {}",
                        path.display()
                    )));
                }
                let opts = SqliteConnectOptions::new()
                    .filename(path)
                    .read_only(true)
                    .create_if_missing(false)
                    .pragma("query_only", "ON")
                    .pragma("trusted_schema", "OFF")
                    // A file another process holds locked fails the scan in seconds.
                    .busy_timeout(Duration::from_secs(5));
                let mut conn = opts.connect().await.map_err(connect_err)?;
                // A deferred read transaction: every query of this scan sees one snapshot.
                conn.execute("BEGIN").await.map_err(query_err)?;
                if let Some(id) = own
                    && own::sees_identity_sqlite(&mut conn, id)
                        .await
                        .map_err(query_err)?
                {
                    cancel.disarm();
                    own::close_quietly(conn).await;
                    return Err(ScanError::Invalid(own::REFUSED.into()));
                }
                Inner::Sqlite(conn)
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
                    .map_err(|e| ScanError::Invalid(e.to_string()))?;
                let ssl = match ssl_mode.as_deref() {
                    None => PgSslMode::Prefer,
                    Some(m) => PgSslMode::from_str(m).map_err(connect_err)?,
                };
                let opts = PgConnectOptions::new_without_pgpass()
                    .host(host)
                    .port(*port)
                    .username(user)
                    // Always set, even empty: an absent password must not be filled
                    // from the service's own PGPASSWORD.
                    .password(dsn.password())
                    .database(database)
                    .ssl_mode(ssl)
                    .application_name("reckon-scan");
                let mut conn = tokio::time::timeout(Duration::from_secs(15), opts.connect())
                    .await
                    .map_err(|_| ScanError::Connect("timed out after 15s".into()))?
                    .map_err(connect_err)?;
                cancel = CancelOnDrop::new(
                    Canceller::postgres(&mut conn, &opts)
                        .await
                        .map_err(query_err)?,
                );
                conn.execute("BEGIN TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                    .await
                    .map_err(query_err)?;
                // Each statement (a FETCH of the cursor, a key lookup) waits at most 5 s
                // for a lock and runs at most 30 s (limits.rs).
                conn.execute(crate::limits::PG_TIMEOUTS_LOCAL)
                    .await
                    .map_err(query_err)?;
                if let Some(id) = own
                    && own::sees_identity_pg(&mut conn, id, true)
                        .await
                        .map_err(query_err)?
                {
                    cancel.disarm();
                    own::close_quietly(conn).await;
                    return Err(ScanError::Invalid(own::REFUSED.into()));
                }
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
                // MySQL options never read the environment, and an empty password set
                // explicitly is still sent scrambled, which a passwordless account refuses:
                // set one only when the DSN has one.
                let opts = match dsn.password() {
                    "" => opts,
                    pw => opts.password(pw),
                };
                let mut conn = tokio::time::timeout(Duration::from_secs(15), opts.connect())
                    .await
                    .map_err(|_| ScanError::Connect("timed out after 15s".into()))?
                    .map_err(connect_err)?;
                crate::limits::mysql_timeouts(&mut conn)
                    .await
                    .map_err(query_err)?;
                if mapping.is_some() {
                    // A mapped table's DATETIME columns carry no zone: read as UTC.
                    conn.execute("SET time_zone = '+00:00'")
                        .await
                        .map_err(query_err)?;
                }
                cancel = CancelOnDrop::new(
                    Canceller::mysql(&mut conn, &opts)
                        .await
                        .map_err(query_err)?,
                );
                conn.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
                    .await
                    .map_err(query_err)?;
                if let Some(id) = own
                    && own::sees_identity_mysql(&mut conn, id)
                        .await
                        .map_err(query_err)?
                {
                    cancel.disarm();
                    own::close_quietly(conn).await;
                    return Err(ScanError::Invalid(own::REFUSED.into()));
                }
                Inner::Mysql(conn)
            }
        };
        Ok(SourceConn {
            inner,
            table,
            cancel,
            mapping,
        })
    }

    pub(crate) fn dialect(&self) -> Dialect {
        match self.inner {
            Inner::Sqlite(_) => Dialect::Sqlite,
            Inner::Postgres(_) => Dialect::Postgres,
            Inner::Mysql(_) => Dialect::Mysql,
        }
    }

    /// The mapping this connection reads through, if any.
    pub fn mapping(&self) -> Option<&Mapping> {
        self.mapping.as_deref()
    }

    /// Rows in `(updated_at, key)` order. With `since`, only rows whose `updated_at >=
    /// since`, and of those (unless `every_state`) only the four known states (the form
    /// justonce's `(state, updated_at)` index serves); without it, every row of the table,
    /// whatever it holds. `every_state` keeps what a first pass reads from `since` on:
    /// every state, and the rows whose `updated_at` is NULL or not a number (wherever the
    /// database sorts those), so that they are quarantined as the first pass would have.
    pub fn rows(
        &mut self,
        since: Option<f64>,
        every_state: bool,
    ) -> BoxStream<'_, Result<RawRow, ScanError>> {
        let table = &self.table;
        let states = since.is_some() && !every_state;
        if let Some(m) = self.mapping.as_deref() {
            let dialect = self.dialect();
            let fp = fingerprints(m);
            let sql = render::rows(dialect, m, since, every_state);
            return match &mut self.inner {
                Inner::Sqlite(c) => bind_lits!(sqlx::query(AssertSqlSafe(sql.text)), &sql.params)
                    .fetch(c)
                    .map(move |r| {
                        r.map_err(query_err)
                            .and_then(|row| sqlite_row(&row))
                            .map(|r| fingerprint(r, fp))
                    })
                    .boxed(),
                Inner::Postgres(c) => {
                    let declare = format!("DECLARE reckon_rows NO SCROLL CURSOR FOR {}", sql.text);
                    pg_cursor(c, declare, PgBind::Lits(sql.params))
                        .map(move |r| r.map(|r| fingerprint(r, fp)))
                        .boxed()
                }
                Inner::Mysql(c) => bind_lits!(sqlx::query(AssertSqlSafe(sql.text)), &sql.params)
                    .fetch(c)
                    .map(move |r| {
                        r.map_err(query_err)
                            .and_then(|row| mysql_row(&row))
                            .map(|r| fingerprint(r, fp))
                    })
                    .boxed(),
            };
        }
        match &mut self.inner {
            Inner::Sqlite(c) => {
                // SQLite sorts text and blobs after every number, so `>=` keeps them.
                let filter = match (since, every_state) {
                    (None, _) => "",
                    (Some(_), true) => "WHERE updated_at >= $1 OR updated_at IS NULL",
                    (Some(_), false) => {
                        "WHERE state IN ('in_progress', 'succeeded', 'failed', 'unknown') \
                         AND updated_at >= $1"
                    }
                };
                let sql = format!(
                    "SELECT {SQLITE_COLUMNS} FROM {table} {filter} \
                     ORDER BY updated_at, CAST(key AS BLOB)"
                );
                let q = sqlx::query(AssertSqlSafe(sql));
                let q = match since {
                    Some(s) => q.bind(s),
                    None => q,
                };
                q.fetch(c)
                    .map(|r| r.map_err(query_err).and_then(|row| sqlite_row(&row)))
                    .boxed()
            }
            Inner::Postgres(c) => {
                // NaN sorts after every number and is `>=` all of them.
                let filter = match (since, every_state) {
                    (None, _) => "",
                    (Some(_), true) => "WHERE updated_at >= $1 OR updated_at IS NULL",
                    (Some(_), false) => "WHERE state = ANY($1) AND updated_at >= $2",
                };
                // A server-side cursor read PG_FETCH rows at a time, not one streamed
                // SELECT: the source's statement_timeout then bounds each FETCH, not the
                // whole table, which a slow ledger could make outlast it. Same statement,
                // same snapshot, same order, so nothing about the cursor invariants
                // changes. (Keyset chunks on (updated_at, key) were measured and rejected:
                // justonce's only index is (state, updated_at), so PostgreSQL answers each
                // chunk with a scan and top-N sort of the rest of the table: quadratic.)
                let declare = format!(
                    "DECLARE reckon_rows NO SCROLL CURSOR FOR \
                     SELECT {PG_COLUMNS} FROM {table} {filter} ORDER BY updated_at, key"
                );
                pg_cursor(c, declare, PgBind::Justonce { since, states })
            }
            Inner::Mysql(c) => {
                let filter = match (since, every_state) {
                    (None, _) => "",
                    (Some(_), true) => "WHERE updated_at >= ? OR updated_at IS NULL",
                    (Some(_), false) => {
                        "WHERE state IN ('in_progress', 'succeeded', 'failed', 'unknown') \
                         AND updated_at >= ?"
                    }
                };
                let sql = format!(
                    "SELECT {MYSQL_COLUMNS} FROM {table} {filter} ORDER BY updated_at, `key`"
                );
                let q = sqlx::query(AssertSqlSafe(sql));
                let q = match since {
                    Some(s) => q.bind(s),
                    None => q,
                };
                q.fetch(c)
                    .map(|r| r.map_err(query_err).and_then(|row| mysql_row(&row)))
                    .boxed()
            }
        }
    }

    /// Every key of the table, as bytes, in no particular order.
    pub fn keys(&mut self) -> BoxStream<'_, Result<Vec<u8>, ScanError>> {
        let table = &self.table;
        if let Some(m) = self.mapping.as_deref() {
            let sql = render::keys(self.dialect(), m);
            return match &mut self.inner {
                Inner::Sqlite(c) => bind_lits!(
                    sqlx::query_scalar::<_, Option<Vec<u8>>>(AssertSqlSafe(sql.text)),
                    &sql.params
                )
                .fetch(c)
                .map(|r| r.map(Option::unwrap_or_default).map_err(query_err))
                .boxed(),
                Inner::Postgres(c) => bind_lits!(
                    sqlx::query_scalar::<_, Option<String>>(AssertSqlSafe(sql.text)),
                    &sql.params
                )
                .fetch(c)
                .map(|r| {
                    r.map(|k| k.unwrap_or_default().into_bytes())
                        .map_err(query_err)
                })
                .boxed(),
                Inner::Mysql(c) => bind_lits!(
                    sqlx::query_scalar::<_, Option<Vec<u8>>>(AssertSqlSafe(sql.text)),
                    &sql.params
                )
                .fetch(c)
                .map(|r| r.map(Option::unwrap_or_default).map_err(query_err))
                .boxed(),
            };
        }
        match &mut self.inner {
            Inner::Sqlite(c) => sqlx::query_scalar::<_, Option<Vec<u8>>>(AssertSqlSafe(format!(
                "SELECT substr(CAST(key AS BLOB), 1, 4097) FROM {table}"
            )))
            .fetch(c)
            .map(|r| r.map(Option::unwrap_or_default).map_err(query_err))
            .boxed(),
            Inner::Postgres(c) => sqlx::query_scalar::<_, Option<String>>(AssertSqlSafe(format!(
                "SELECT left(key::text, 4097) FROM {table}"
            )))
            .fetch(c)
            .map(|r| {
                r.map(|k| k.unwrap_or_default().into_bytes())
                    .map_err(query_err)
            })
            .boxed(),
            Inner::Mysql(c) => sqlx::query_scalar::<_, Option<Vec<u8>>>(AssertSqlSafe(format!(
                "SELECT LEFT(CAST(`key` AS BINARY), 4097) FROM {table}"
            )))
            .fetch(c)
            .map(|r| r.map(Option::unwrap_or_default).map_err(query_err))
            .boxed(),
        }
    }

    /// The rows with exactly these keys (those still present).
    pub async fn rows_by_key(&mut self, keys: &[Vec<u8>]) -> Result<Vec<RawRow>, ScanError> {
        if self.mapping.is_some() {
            return self.mapped_rows_by_key(keys).await;
        }
        let table = self.table.clone();
        let mut out = Vec::new();
        for key in keys {
            let row = match &mut self.inner {
                Inner::Sqlite(c) => sqlx::query(AssertSqlSafe(format!(
                    "SELECT {SQLITE_COLUMNS} FROM {table} WHERE key = CAST($1 AS TEXT)"
                )))
                .bind(key.clone())
                .fetch_optional(&mut *c)
                .await
                .map_err(query_err)?
                .map(|r| sqlite_row(&r))
                .transpose()?,
                Inner::Postgres(c) => {
                    let Ok(k) = std::str::from_utf8(key) else {
                        continue;
                    };
                    sqlx::query(AssertSqlSafe(format!(
                        "SELECT {PG_COLUMNS} FROM {table} WHERE key = $1"
                    )))
                    .bind(k.to_owned())
                    .fetch_optional(&mut *c)
                    .await
                    .map_err(query_err)?
                    .map(|r| pg_row(&r))
                    .transpose()?
                }
                Inner::Mysql(c) => sqlx::query(AssertSqlSafe(format!(
                    "SELECT {MYSQL_COLUMNS} FROM {table} WHERE CAST(`key` AS BINARY) = ?"
                )))
                .bind(key.clone())
                .fetch_optional(&mut *c)
                .await
                .map_err(query_err)?
                .map(|r| mysql_row(&r))
                .transpose()?,
            };
            out.extend(row);
        }
        Ok(out)
    }

    async fn mapped_rows_by_key(&mut self, keys: &[Vec<u8>]) -> Result<Vec<RawRow>, ScanError> {
        let dialect = self.dialect();
        let m = self.mapping.as_deref().expect("a mapped connection");
        let fp = fingerprints(m);
        let mut out = Vec::new();
        for key in keys {
            // As the justonce reader looks keys up: bytes where the database compares bytes,
            // text in PostgreSQL, where a key that is not UTF-8 cannot be.
            let key = match dialect {
                Dialect::Postgres => match std::str::from_utf8(key) {
                    Ok(k) => Lit::Text(k.to_owned()),
                    Err(_) => continue,
                },
                _ => Lit::Bytes(key.clone()),
            };
            let sql = render::by_key(dialect, m, key);
            // One statement, bound for whichever database this is.
            macro_rules! q {
                () => {
                    bind_lits!(sqlx::query(AssertSqlSafe(sql.text.clone())), &sql.params)
                };
            }
            let row = match &mut self.inner {
                Inner::Sqlite(c) => q!()
                    .fetch_optional(&mut *c)
                    .await
                    .map_err(query_err)?
                    .map(|r| sqlite_row(&r))
                    .transpose()?,
                Inner::Postgres(c) => q!()
                    .fetch_optional(&mut *c)
                    .await
                    .map_err(query_err)?
                    .map(|r| pg_row(&r))
                    .transpose()?,
                Inner::Mysql(c) => q!()
                    .fetch_optional(&mut *c)
                    .await
                    .map_err(query_err)?
                    .map(|r| mysql_row(&r))
                    .transpose()?,
            };
            out.extend(row.map(|r| fingerprint(r, fp)));
        }
        Ok(out)
    }

    /// End the read-only transaction and the connection.
    pub async fn close(mut self) {
        self.cancel.disarm();
        match self.inner {
            Inner::Sqlite(mut c) => {
                let _ = c.execute("ROLLBACK").await;
                let _ = c.close().await;
            }
            Inner::Postgres(mut c) => {
                let _ = c.execute("ROLLBACK").await;
                let _ = c.close().await;
            }
            Inner::Mysql(mut c) => {
                let _ = c.execute("ROLLBACK").await;
                let _ = c.close().await;
            }
        }
    }
}

/// The PostgreSQL read: a server-side cursor over `declare`, fetched [`PG_FETCH_SQL`] rows
/// at a time (see `SourceConn::rows` for why a cursor).
fn pg_cursor(
    c: &mut sqlx::PgConnection,
    declare: String,
    bind: PgBind,
) -> BoxStream<'_, Result<RawRow, ScanError>> {
    futures::stream::try_unfold((c, Some((declare, bind))), |(c, declare)| async move {
        let first = declare.is_some();
        if let Some((sql, bind)) = declare {
            c.execute(crate::limits::PG_SORT_TIMEOUT_LOCAL)
                .await
                .map_err(query_err)?;
            let q = sqlx::query(AssertSqlSafe(sql));
            let q = match bind {
                PgBind::Justonce {
                    since: Some(s),
                    states: true,
                } => q.bind(KNOWN_STATES.map(String::from).to_vec()).bind(s),
                PgBind::Justonce { since: Some(s), .. } => q.bind(s),
                PgBind::Justonce { since: None, .. } => q,
                PgBind::Lits(params) => bind_lits!(q, &params),
            };
            q.execute(&mut *c).await.map_err(query_err)?;
        }
        let rows = sqlx::query(PG_FETCH_SQL)
            .fetch_all(&mut *c)
            .await
            .map_err(query_err)?;
        if first {
            c.execute(crate::limits::PG_FETCH_TIMEOUT_LOCAL)
                .await
                .map_err(query_err)?;
        }
        if rows.is_empty() {
            c.execute("CLOSE reckon_rows").await.map_err(query_err)?;
            return Ok(None);
        }
        let rows: Vec<Result<RawRow, ScanError>> = rows.iter().map(pg_row).collect();
        Ok(Some((futures::stream::iter(rows), (c, None))))
    })
    .try_flatten()
    .boxed()
}

/// Whether a mapping's request column holds the request itself, to be fingerprinted.
fn fingerprints(m: &Mapping) -> bool {
    matches!(m.request, Some(RequestSpec::Fingerprint(_)))
}

/// A request read whole becomes its fingerprint, `sha256:` and the hex digest of its bytes
/// (a request over the read limit is cut there, and so still differs from a shorter one
/// only if they differ before it). It is compared, never shown.
fn fingerprint(mut row: RawRow, fingerprints: bool) -> RawRow {
    use sha2::{Digest, Sha256};
    if fingerprints && let Some(r) = &row.request_hash {
        row.request_hash = Some(format!("sha256:{}", hex::encode(Sha256::digest(r))).into_bytes());
    }
    row
}

/// SQLite is dynamically typed: a REAL column can hold text. Each numeric column is read as
/// its storage class plus its value, so nothing is silently coerced.
/// Text columns are read only up to one byte past their limit (limits.rs), so a hostile
/// row's value of any size is seen as over the limit and quarantined without being read.
const SQLITE_COLUMNS: &str = "substr(CAST(key AS BLOB), 1, 4097) AS k, \
    substr(CAST(state AS BLOB), 1, 65) AS st, \
    substr(CAST(request_hash AS BLOB), 1, 1025) AS rh, \
    substr(CAST(response AS BLOB), 1, 1048577) AS resp, \
    typeof(attempts) AS t_a, CASE WHEN typeof(attempts) = 'integer' THEN attempts END AS i_a, \
    CASE WHEN typeof(attempts) = 'real' THEN attempts END AS r_a, \
    typeof(created_at) AS t_c, CASE WHEN typeof(created_at) = 'integer' THEN created_at END AS i_c, \
    CASE WHEN typeof(created_at) = 'real' THEN created_at END AS r_c, \
    typeof(updated_at) AS t_u, CASE WHEN typeof(updated_at) = 'integer' THEN updated_at END AS i_u, \
    CASE WHEN typeof(updated_at) = 'real' THEN updated_at END AS r_u, \
    typeof(expires_at) AS t_e, CASE WHEN typeof(expires_at) = 'integer' THEN expires_at END AS i_e, \
    CASE WHEN typeof(expires_at) = 'real' THEN expires_at END AS r_e";

fn sqlite_row(row: &sqlx::sqlite::SqliteRow) -> Result<RawRow, ScanError> {
    let num = |t: &str, i: &str, r: &str| -> Result<RawNum, ScanError> {
        let ty: String = row.try_get(t).map_err(query_err)?;
        Ok(match ty.as_str() {
            "null" => RawNum::Null,
            "integer" => RawNum::Int(row.try_get(i).map_err(query_err)?),
            "real" => RawNum::Real(row.try_get(r).map_err(query_err)?),
            other => RawNum::NotNumber(format!("SQLite {other} value")),
        })
    };
    Ok(RawRow {
        key: row.try_get("k").map_err(query_err)?,
        state: row.try_get("st").map_err(query_err)?,
        request_hash: row.try_get("rh").map_err(query_err)?,
        response: row.try_get("resp").map_err(query_err)?,
        attempts: num("t_a", "i_a", "r_a")?,
        created_at: num("t_c", "i_c", "r_c")?,
        updated_at: num("t_u", "i_u", "r_u")?,
        expires_at: num("t_e", "i_e", "r_e")?,
    })
}

/// PostgreSQL: `response::text`, because a JSONB string and a still-encoded string are
/// otherwise indistinguishable; casts so a drifted column type fails the scan clearly.
/// Text is cut in characters (PostgreSQL's `left`), each at least one byte: a value over
/// its byte limit still reads as over it, and at most four times the limit is read.
const PG_COLUMNS: &str = "left(key::text, 4097) AS k, left(state::text, 65) AS st, \
    left(request_hash::text, 1025) AS rh, left(response::text, 1048577) AS resp, \
    attempts::int8 AS a, created_at::float8 AS c, \
    updated_at::float8 AS u, expires_at::float8 AS e";

fn pg_row(row: &sqlx::postgres::PgRow) -> Result<RawRow, ScanError> {
    let bytes = |c: &str| -> Result<Option<Vec<u8>>, ScanError> {
        Ok(row
            .try_get::<Option<String>, _>(c)
            .map_err(query_err)?
            .map(String::into_bytes))
    };
    let real = |c: &str| -> Result<RawNum, ScanError> {
        Ok(match row.try_get::<Option<f64>, _>(c).map_err(query_err)? {
            None => RawNum::Null,
            Some(f) => RawNum::Real(f),
        })
    };
    Ok(RawRow {
        key: bytes("k")?,
        state: bytes("st")?,
        request_hash: bytes("rh")?,
        response: bytes("resp")?,
        attempts: match row.try_get::<Option<i64>, _>("a").map_err(query_err)? {
            None => RawNum::Null,
            Some(i) => RawNum::Int(i),
        },
        created_at: real("c")?,
        updated_at: real("u")?,
        expires_at: real("e")?,
    })
}

/// MySQL/MariaDB (the Django store): `key` needs backquotes; text is read as bytes so the
/// connection's character set cannot reinterpret it.
const MYSQL_COLUMNS: &str = "LEFT(CAST(`key` AS BINARY), 4097) AS k, \
    LEFT(CAST(state AS BINARY), 65) AS st, LEFT(CAST(request_hash AS BINARY), 1025) AS rh, \
    LEFT(CAST(response AS BINARY), 1048577) AS resp, \
    CAST(attempts AS SIGNED) AS a, CAST(created_at AS DOUBLE) AS c, \
    CAST(updated_at AS DOUBLE) AS u, CAST(expires_at AS DOUBLE) AS e";

fn mysql_row(row: &sqlx::mysql::MySqlRow) -> Result<RawRow, ScanError> {
    let bytes = |c: &str| -> Result<Option<Vec<u8>>, ScanError> {
        row.try_get::<Option<Vec<u8>>, _>(c).map_err(query_err)
    };
    let real = |c: &str| -> Result<RawNum, ScanError> {
        Ok(match row.try_get::<Option<f64>, _>(c).map_err(query_err)? {
            None => RawNum::Null,
            Some(f) => RawNum::Real(f),
        })
    };
    Ok(RawRow {
        key: bytes("k")?,
        state: bytes("st")?,
        request_hash: bytes("rh")?,
        response: bytes("resp")?,
        attempts: match row.try_get::<Option<i64>, _>("a").map_err(query_err)? {
            None => RawNum::Null,
            Some(i) => RawNum::Int(i),
        },
        created_at: real("c")?,
        updated_at: real("u")?,
        expires_at: real("e")?,
    })
}
