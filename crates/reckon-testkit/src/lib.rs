//! What every crate's tests share: where the test database servers are
//! (`RECKON_TEST_PG_URL`, `RECKON_TEST_MYSQL_URL`, else this machine's defaults) and a fresh,
//! empty database on one of them. An unreachable server fails the test that needs it, naming
//! the address and the variable: a test that needs PostgreSQL is never skipped.

use sqlx::{AssertSqlSafe, Connection};

#[cfg(feature = "cases")]
pub mod answer_cases;

/// PostgreSQL as the tests reach it when `RECKON_TEST_PG_URL` is unset.
pub const DEFAULT_PG_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
/// MariaDB (or MySQL) as the tests reach it when `RECKON_TEST_MYSQL_URL` is unset.
pub const DEFAULT_MYSQL_ADMIN_URL: &str = "mysql://root@127.0.0.1:3306/test";

fn from_env(var: &str, default: &str) -> String {
    std::env::var(var)
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

/// A PostgreSQL URL allowed to create databases.
pub fn pg_admin_url() -> String {
    from_env("RECKON_TEST_PG_URL", DEFAULT_PG_ADMIN_URL)
}

/// A MySQL URL allowed to create databases.
pub fn mysql_admin_url() -> String {
    from_env("RECKON_TEST_MYSQL_URL", DEFAULT_MYSQL_ADMIN_URL)
}

/// `url` naming `database` instead of its own, its query kept.
pub fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let start = base.find("://").map_or(0, |i| i + 3);
    let base = match base.get(start..).and_then(|rest| rest.find('/')) {
        Some(i) => base.get(..start + i).unwrap_or(base),
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{database}?{q}"),
        None => format!("{base}/{database}"),
    }
}

/// `prefix` and 16 random hex digits: a database name no other test run takes.
pub fn random_name(prefix: &str) -> String {
    format!("{prefix}_{:016x}", rand::random::<u64>())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    Postgres,
    Mysql,
}

/// A database created for one test.
#[derive(Debug, Clone)]
pub struct FreshDb {
    pub server: Server,
    /// The server's admin URL it was created through.
    pub admin_url: String,
    pub name: String,
    /// The URL of the new database.
    pub url: String,
}

impl FreshDb {
    /// A new, empty database on `server`, named `prefix_<random>`.
    pub async fn create(server: Server, prefix: &str) -> FreshDb {
        let name = random_name(prefix);
        let (admin_url, ddl, var) = match server {
            Server::Postgres => (
                pg_admin_url(),
                format!("CREATE DATABASE \"{name}\""),
                "RECKON_TEST_PG_URL",
            ),
            Server::Mysql => (
                mysql_admin_url(),
                format!("CREATE DATABASE `{name}`"),
                "RECKON_TEST_MYSQL_URL",
            ),
        };
        let unreachable = |e: sqlx::Error| -> ! {
            panic!(
                "the test database server at {admin_url} is required ({e}): start it (see \
                 .ci/run) or point {var} at one"
            )
        };
        match server {
            Server::Postgres => {
                let mut c = sqlx::PgConnection::connect(&admin_url)
                    .await
                    .unwrap_or_else(|e| unreachable(e));
                sqlx::raw_sql(AssertSqlSafe(ddl))
                    .execute(&mut c)
                    .await
                    .unwrap_or_else(|e| panic!("create database {name}: {e}"));
                c.close().await.ok();
            }
            Server::Mysql => {
                let mut c = sqlx::MySqlConnection::connect(&admin_url)
                    .await
                    .unwrap_or_else(|e| unreachable(e));
                sqlx::raw_sql(AssertSqlSafe(ddl))
                    .execute(&mut c)
                    .await
                    .unwrap_or_else(|e| panic!("create database {name}: {e}"));
                c.close().await.ok();
            }
        }
        let url = with_database(&admin_url, &name);
        FreshDb {
            server,
            admin_url,
            name,
            url,
        }
    }

    pub async fn postgres(prefix: &str) -> FreshDb {
        FreshDb::create(Server::Postgres, prefix).await
    }

    pub async fn mysql(prefix: &str) -> FreshDb {
        FreshDb::create(Server::Mysql, prefix).await
    }

    /// Drops the database, closing other sessions on it first (a passing test's cleanup;
    /// a failing one leaves it to look at).
    pub async fn drop_now(&self) {
        match self.server {
            Server::Postgres => {
                if let Ok(mut c) = sqlx::PgConnection::connect(&self.admin_url).await {
                    let ddl = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name);
                    sqlx::raw_sql(AssertSqlSafe(ddl)).execute(&mut c).await.ok();
                    c.close().await.ok();
                }
            }
            Server::Mysql => {
                if let Ok(mut c) = sqlx::MySqlConnection::connect(&self.admin_url).await {
                    let ddl = format!("DROP DATABASE IF EXISTS `{}`", self.name);
                    sqlx::raw_sql(AssertSqlSafe(ddl)).execute(&mut c).await.ok();
                    c.close().await.ok();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn another_database_keeps_the_servers_address_and_query() {
        assert_eq!(
            with_database("postgres://u@h:5432/postgres?sslmode=disable", "t1"),
            "postgres://u@h:5432/t1?sslmode=disable"
        );
        assert_eq!(
            with_database("mysql://root@h:3306", "t2"),
            "mysql://root@h:3306/t2"
        );
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:5432/postgres", "x"),
            "postgres://postgres@127.0.0.1:5432/x"
        );
    }
}
