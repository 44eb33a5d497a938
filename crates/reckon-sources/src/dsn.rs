//! Tenants' DSNs are hostile input. We parse them ourselves, allow only the parameters we
//! understand, and build driver options field by field, so a DSN can never pull in the
//! service's own environment (a missing password is sent as empty, not read from
//! PGPASSWORD or ~/.pgpass) nor name local files (sslrootcert, passfile, service).

use secrecy::{ExposeSecret, SecretString};
use std::path::PathBuf;

/// libpq environment variables sqlx's `PgConnectOptions` reads from reckon's own process
/// even for options built field by field, and that no call here can take back: the
/// service's TLS client certificate and key (its credentials, presented to the tenant's
/// server), its root certificate, and its session options. A tenant's PostgreSQL connection
/// is refused while one is set, naming it (T11): the operator gives reckon's own database
/// these in `database_url` instead.
const SERVICE_PG_ENV: [&str; 4] = ["PGSSLCERT", "PGSSLKEY", "PGSSLROOTCERT", "PGOPTIONS"];

/// `Err` naming the first of [`SERVICE_PG_ENV`] set in this process.
pub(crate) fn refuse_service_pg_env() -> Result<(), String> {
    for name in SERVICE_PG_ENV {
        if std::env::var_os(name).is_some_and(|v| !v.is_empty()) {
            return Err(format!(
                "reckon's own environment sets {name}, which a tenant's PostgreSQL connection \
                 would inherit; the operator must unset it (reckon's own database takes it \
                 in database_url)"
            ));
        }
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
    Mysql,
}

impl Dialect {
    pub fn parse(s: &str) -> Option<Dialect> {
        match s {
            "sqlite" => Some(Dialect::Sqlite),
            "postgres" => Some(Dialect::Postgres),
            "mysql" => Some(Dialect::Mysql),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid DSN: {0}")]
pub struct DsnError(pub String);

/// A parsed, validated DSN. `Debug` never shows the password.
#[derive(Clone)]
pub enum SourceDsn {
    Sqlite {
        path: PathBuf,
    },
    Network {
        dialect: Dialect,
        host: String,
        port: u16,
        user: String,
        password: Option<SecretString>,
        database: String,
        /// `sslmode` (PostgreSQL) or `ssl-mode` (MySQL), as given.
        ssl_mode: Option<String>,
    },
}

impl std::fmt::Debug for SourceDsn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

const PG_SSL_MODES: [&str; 6] = [
    "disable",
    "allow",
    "prefer",
    "require",
    "verify-ca",
    "verify-full",
];
const MYSQL_SSL_MODES: [&str; 5] = [
    "disabled",
    "preferred",
    "required",
    "verify_ca",
    "verify_identity",
];

impl SourceDsn {
    pub fn parse(dialect: Dialect, dsn: &str) -> Result<SourceDsn, DsnError> {
        let err = |m: &str| DsnError(m.to_owned());
        match dialect {
            Dialect::Sqlite => {
                let path = dsn
                    .strip_prefix("sqlite://")
                    .or_else(|| dsn.strip_prefix("sqlite:"))
                    .unwrap_or(dsn);
                if path.is_empty() || path.contains(":memory:") || path.starts_with("file:") {
                    return Err(err(
                        "a SQLite source is a path to an existing database file",
                    ));
                }
                if path.contains('?') || path.contains('\0') {
                    return Err(err(
                        "SQLite source paths take no URI parameters (no '?', no NUL)",
                    ));
                }
                let path = PathBuf::from(path);
                if !path.is_absolute() {
                    return Err(err("a SQLite source path must be absolute"));
                }
                Ok(SourceDsn::Sqlite { path })
            }
            Dialect::Postgres | Dialect::Mysql => {
                let url = url::Url::parse(dsn).map_err(|e| DsnError(format!("not a URL ({e})")))?;
                let schemes: &[&str] = match dialect {
                    Dialect::Postgres => &["postgres", "postgresql"],
                    _ => &["mysql", "mariadb"],
                };
                if !schemes.contains(&url.scheme()) {
                    return Err(DsnError(format!(
                        "scheme {:?} does not match the source kind (expected {})",
                        url.scheme(),
                        schemes.join(" or ")
                    )));
                }
                let host = url
                    .host_str()
                    .filter(|h| !h.is_empty())
                    .ok_or_else(|| err("a host is required (sockets and defaults are not used)"))?
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_owned();
                let user = decode(url.username())?;
                if user.is_empty() {
                    return Err(err("a user name is required"));
                }
                let password = url
                    .password()
                    .map(decode)
                    .transpose()?
                    .map(SecretString::from);
                let database = decode(url.path().trim_start_matches('/'))?;
                if database.is_empty() || database.contains('/') {
                    return Err(err("a database name is required"));
                }
                let mut ssl_mode = None;
                for (k, v) in url.query_pairs() {
                    let allowed = match (dialect, k.as_ref()) {
                        (Dialect::Postgres, "sslmode") => PG_SSL_MODES.contains(&v.as_ref()),
                        (Dialect::Mysql, "ssl-mode") => {
                            MYSQL_SSL_MODES.contains(&v.to_ascii_lowercase().as_str())
                        }
                        _ => {
                            return Err(DsnError(format!(
                                "parameter {k:?} is not allowed (only sslmode / ssl-mode)"
                            )));
                        }
                    };
                    if !allowed {
                        return Err(DsnError(format!("{k} value {v:?} is not recognised")));
                    }
                    ssl_mode = Some(v.into_owned());
                }
                let port = url.port().unwrap_or(match dialect {
                    Dialect::Postgres => 5432,
                    _ => 3306,
                });
                Ok(SourceDsn::Network {
                    dialect,
                    host,
                    port,
                    user,
                    password,
                    database,
                    ssl_mode,
                })
            }
        }
    }

    pub fn dialect(&self) -> Dialect {
        match self {
            SourceDsn::Sqlite { .. } => Dialect::Sqlite,
            SourceDsn::Network { dialect, .. } => *dialect,
        }
    }

    /// The DSN without its password, for people and logs.
    pub fn redacted(&self) -> String {
        match self {
            SourceDsn::Sqlite { path } => format!("sqlite://{}", path.display()),
            SourceDsn::Network {
                dialect,
                host,
                port,
                user,
                database,
                ..
            } => {
                let scheme = if *dialect == Dialect::Postgres {
                    "postgres"
                } else {
                    "mysql"
                };
                let host = if host.contains(':') {
                    format!("[{host}]")
                } else {
                    host.clone()
                };
                format!("{scheme}://{user}@{host}:{port}/{database}")
            }
        }
    }

    pub(crate) fn password(&self) -> &str {
        match self {
            SourceDsn::Network {
                password: Some(p), ..
            } => p.expose_secret(),
            _ => "",
        }
    }
}

fn decode(s: &str) -> Result<String, DsnError> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| DsnError("percent-encoded part is not UTF-8".into()))
}

/// A table name is interpolated into SQL, so it is held to a strict shape: an identifier,
/// optionally schema-qualified, quoted by the scanner.
pub fn validate_table_name(name: &str) -> Result<(), DsnError> {
    let ident = |s: &str| {
        !s.is_empty()
            && s.len() <= 63
            && (s.as_bytes()[0].is_ascii_alphabetic() || s.as_bytes()[0] == b'_')
            && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    };
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() <= 2 && parts.iter().all(|p| ident(p)) {
        Ok(())
    } else {
        Err(DsnError(format!(
            "table name {name:?} must be an identifier (letters, digits, '_'), optionally schema.table"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_dsns_are_parsed_field_by_field_and_redacted() {
        let d = SourceDsn::parse(
            Dialect::Postgres,
            "postgres://shop:s3cr%40t@db.example.com:6432/orders?sslmode=verify-full",
        )
        .unwrap();
        assert_eq!(d.redacted(), "postgres://shop@db.example.com:6432/orders");
        assert_eq!(d.password(), "s3cr@t");
        assert!(!format!("{d:?}").contains("s3cr"));
    }

    #[test]
    fn parameters_outside_the_allow_list_are_refused() {
        for bad in [
            "postgres://u:p@h/db?sslrootcert=/etc/passwd",
            "postgres://u:p@h/db?passfile=/root/.pgpass",
            "postgres://u:p@h/db?options=-c%20role%3Dpostgres",
            "postgres://u:p@h/db?service=prod",
            "postgres://u:p@h/db?sslmode=bogus",
            "postgres://u:p@/db",
            "postgres://:p@h/db",
            "postgres://u:p@h/",
            "mysql://u:p@h/db",
        ] {
            assert!(SourceDsn::parse(Dialect::Postgres, bad).is_err(), "{bad}");
        }
        assert!(SourceDsn::parse(Dialect::Mysql, "mysql://u:p@h/db?local_infile=1").is_err());
        assert!(SourceDsn::parse(Dialect::Mysql, "mysql://u:p@h/db?ssl-mode=REQUIRED").is_ok());
    }

    #[test]
    fn sqlite_paths_are_plain_absolute_files() {
        assert!(SourceDsn::parse(Dialect::Sqlite, "/data/shop.db").is_ok());
        assert!(SourceDsn::parse(Dialect::Sqlite, "sqlite:///data/shop.db").is_ok());
        for bad in [
            ":memory:",
            "file:x.db?mode=rwc",
            "rel/x.db",
            "/x.db?vfs=unix",
            "",
        ] {
            assert!(SourceDsn::parse(Dialect::Sqlite, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn table_names_are_identifiers() {
        assert!(validate_table_name("justonce_keys").is_ok());
        assert!(validate_table_name("billing.justonce_keys").is_ok());
        for bad in ["", "a b", "x;drop", "a.b.c", "\"x\"", "1abc", "x`y"] {
            assert!(validate_table_name(bad).is_err(), "{bad}");
        }
    }
}
