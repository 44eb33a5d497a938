//! Is this connection in reckon's own database? Addresses cannot say (a second address of
//! the host, a port forward, a proxy, a name the check never saw), so every source
//! connection asks the database itself: reckon's ledger holds one row with a random
//! identity (`reckon_instance`, migration 0016), and a connection that can see that value
//! is refused before it reads anything.
//!
//! The queries only read catalogs and a table of that one name, and never fail the
//! connection: a table the tenant's user may not read is one it cannot see.

use sqlx::{AssertSqlSafe, Connection, Executor, MySqlConnection, PgConnection, SqliteConnection};

pub const REFUSED: &str = "the DSN leads to reckon's own database (the connection can see \
     reckon's ledger identity), which no source may read";

/// PostgreSQL. The identity is also the comment of the ledger's `reckon_instance` table,
/// which any user of that database can read in `pg_description`, so even a user without
/// any grant on reckon's tables is recognised. Then each schema's `reckon_instance` table
/// the user can read, each read in a savepoint so a refusal of access leaves the
/// surrounding read-only transaction usable (`in_tx`).
pub(crate) async fn sees_identity_pg(
    conn: &mut PgConnection,
    identity: &str,
    in_tx: bool,
) -> Result<bool, sqlx::Error> {
    let commented: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_description WHERE description = $1)",
    )
    .bind(identity)
    .fetch_one(&mut *conn)
    .await?;
    if commented {
        return Ok(true);
    }
    let schemas: Vec<String> = sqlx::query_scalar(
        "SELECT n.nspname::text FROM pg_catalog.pg_class c \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.relname = 'reckon_instance' AND c.relkind IN ('r', 'p', 'v', 'm', 'f')",
    )
    .fetch_all(&mut *conn)
    .await?;
    for schema in schemas {
        let sql = format!(
            "SELECT EXISTS (SELECT 1 FROM \"{}\".reckon_instance WHERE identity::text = $1)",
            schema.replace('"', "\"\"")
        );
        if in_tx {
            conn.execute("SAVEPOINT reckon_identity").await?;
        }
        let seen = sqlx::query_scalar::<_, bool>(AssertSqlSafe(sql))
            .bind(identity)
            .fetch_one(&mut *conn)
            .await;
        if in_tx {
            let end = if seen.is_ok() {
                "RELEASE SAVEPOINT reckon_identity"
            } else {
                "ROLLBACK TO SAVEPOINT reckon_identity"
            };
            conn.execute(end).await?;
        }
        if seen.unwrap_or(false) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// MySQL / MariaDB: every `reckon_instance` table the user can see (any database of the
/// server), read for the identity. An error in MySQL does not end the transaction.
pub(crate) async fn sees_identity_mysql(
    conn: &mut MySqlConnection,
    identity: &str,
) -> Result<bool, sqlx::Error> {
    let schemas: Vec<Vec<u8>> = sqlx::query_scalar(
        "SELECT CAST(table_schema AS BINARY) FROM information_schema.tables \
         WHERE table_name = 'reckon_instance'",
    )
    .fetch_all(&mut *conn)
    .await?;
    for schema in schemas {
        let schema = String::from_utf8_lossy(&schema).replace('`', "``");
        let sql = format!(
            "SELECT COUNT(*) FROM `{schema}`.`reckon_instance` WHERE CAST(identity AS BINARY) = ?"
        );
        let seen = sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql))
            .bind(identity.as_bytes())
            .fetch_one(&mut *conn)
            .await;
        if seen.is_ok_and(|n| n > 0) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// SQLite: the file's own `reckon_instance` table (a hard link or a copy of the ledger
/// file has a path the path check cannot recognise).
pub(crate) async fn sees_identity_sqlite(
    conn: &mut SqliteConnection,
    identity: &str,
) -> Result<bool, sqlx::Error> {
    let exists: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE name = 'reckon_instance' \
         AND type IN ('table', 'view'))",
    )
    .fetch_one(&mut *conn)
    .await?;
    if !exists {
        return Ok(false);
    }
    let seen = sqlx::query_scalar::<_, bool>(
        "SELECT EXISTS (SELECT 1 FROM reckon_instance WHERE CAST(identity AS TEXT) = $1)",
    )
    .bind(identity)
    .fetch_one(&mut *conn)
    .await;
    Ok(seen.unwrap_or(false))
}

/// Close a connection that was refused, without waiting on a server that does not answer.
pub(crate) async fn close_quietly<C: Connection>(conn: C) {
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), conn.close()).await;
}
