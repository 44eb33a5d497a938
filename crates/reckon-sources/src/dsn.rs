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

/// One of [`SERVICE_PG_ENV`] is set in reckon's own process (its name).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "reckon's own environment sets {0}, which a tenant's PostgreSQL connection would \
     inherit; the operator must unset it (reckon's own database takes it in database_url)"
)]
pub struct ServicePgEnv(pub &'static str);

/// `Err` naming the first of [`SERVICE_PG_ENV`] set in this process.
pub(crate) fn refuse_service_pg_env() -> Result<(), ServicePgEnv> {
    match SERVICE_PG_ENV
        .into_iter()
        .find(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()))
    {
        Some(name) => Err(ServicePgEnv(name)),
        None => Ok(()),
    }
}

pub use reckon_domain::Dialect;

/// Why a DSN (or a table name) is refused, one variant per reason. The text is fixed or
/// names only the allow-list: a parameter's name or value, a user or a password is never
/// repeated, so no answer can depend on what a DSN holds beyond its shape (a caller that
/// cut a stored password out of an echoed name would say whether the name was that
/// password).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DsnError {
    #[error("invalid DSN: a SQLite source is a path to an existing database file")]
    SqliteNotAFile,
    #[error("invalid DSN: SQLite source paths take no URI parameters (no '?', no NUL)")]
    SqliteParameters,
    #[error("invalid DSN: a SQLite source path must be absolute")]
    SqliteRelative,
    #[error("invalid DSN: not a URL ({0})")]
    NotAUrl(url::ParseError),
    /// The scheme is not one of the dialect's (`expected`: `postgres or postgresql`).
    #[error("invalid DSN: the scheme does not match the source kind (expected {expected})")]
    Scheme { expected: &'static str },
    #[error("invalid DSN: a host is required (sockets and defaults are not used)")]
    NoHost,
    #[error("invalid DSN: a user name is required")]
    NoUser,
    #[error("invalid DSN: a database name is required")]
    NoDatabase,
    /// A parameter outside the allow-list (`only`: the one parameter accepted).
    #[error("invalid DSN: the DSN has a parameter that is not allowed: only {only} is accepted")]
    Parameter { only: &'static str },
    #[error("invalid DSN: {only} is given more than once")]
    Repeated { only: &'static str },
    /// A TLS mode outside the dialect's list.
    #[error("invalid DSN: {only} is not one of {}", .modes.join(", "))]
    TlsMode {
        only: &'static str,
        modes: &'static [&'static str],
    },
    #[error("invalid DSN: percent-encoded part is not UTF-8")]
    NotUtf8,
    #[error(
        "invalid DSN: the table name must be an identifier (letters, digits, '_', up to 63), \
         optionally schema.table"
    )]
    TableName,
}

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

/// How well a network source's connection is protected, weakest first: the order an edit
/// may not go down without the password given again (reckon would otherwise send the
/// stored password over a weaker connection than the one it was given for).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Transport {
    /// No TLS (`sslmode=disable`, `ssl-mode=DISABLED`).
    Plain,
    /// Plain first, TLS only if the server insists (`allow`).
    PlainFirst,
    /// TLS if the server offers it, else plain: what the drivers do when the DSN says
    /// nothing (`prefer`, `PREFERRED`). Anyone in the path can strip it.
    Opportunistic,
    /// TLS required, the server's certificate not checked (`require`, `REQUIRED`).
    Encrypted,
    /// TLS with the certificate checked against the roots (`verify-ca`, `VERIFY_CA`).
    VerifiedCa,
    /// TLS with the certificate and the host name checked (`verify-full`,
    /// `VERIFY_IDENTITY`).
    VerifiedName,
}

impl Transport {
    /// One line for the settings page.
    pub fn describe(self) -> &'static str {
        match self {
            Transport::Plain => "no TLS: the password and data travel in clear",
            Transport::PlainFirst => "plain first, TLS only if the server demands it",
            Transport::Opportunistic => {
                "TLS if the server offers it, else plain (anyone on the path can strip it)"
            }
            Transport::Encrypted => "TLS, the server's certificate not checked",
            Transport::VerifiedCa => "TLS, the certificate checked (not the host name)",
            Transport::VerifiedName => "TLS, the certificate and the host name checked",
        }
    }
}

impl SourceDsn {
    pub fn parse(dialect: Dialect, dsn: &str) -> Result<SourceDsn, DsnError> {
        match dialect {
            Dialect::Sqlite => {
                let path = dsn
                    .strip_prefix("sqlite://")
                    .or_else(|| dsn.strip_prefix("sqlite:"))
                    .unwrap_or(dsn);
                if path.is_empty() || path.contains(":memory:") || path.starts_with("file:") {
                    return Err(DsnError::SqliteNotAFile);
                }
                if path.contains('?') || path.contains('\0') {
                    return Err(DsnError::SqliteParameters);
                }
                let path = PathBuf::from(path);
                if !path.is_absolute() {
                    return Err(DsnError::SqliteRelative);
                }
                Ok(SourceDsn::Sqlite { path })
            }
            Dialect::Postgres | Dialect::Mysql => {
                let url = url::Url::parse(dsn).map_err(DsnError::NotAUrl)?;
                let (schemes, expected): (&[&str], _) = match dialect {
                    Dialect::Postgres => (&["postgres", "postgresql"], "postgres or postgresql"),
                    _ => (&["mysql", "mariadb"], "mysql or mariadb"),
                };
                if !schemes.contains(&url.scheme()) {
                    return Err(DsnError::Scheme { expected });
                }
                let host = url
                    .host_str()
                    .filter(|h| !h.is_empty())
                    .ok_or(DsnError::NoHost)?
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_owned();
                let user = decode(url.username())?;
                if user.is_empty() {
                    return Err(DsnError::NoUser);
                }
                let password = url
                    .password()
                    .map(decode)
                    .transpose()?
                    .map(SecretString::from);
                let database = decode(url.path().trim_start_matches('/'))?;
                if database.is_empty() || database.contains('/') {
                    return Err(DsnError::NoDatabase);
                }
                // The refusals below name the allow-list only, never the parameter given.
                let (only, modes): (&'static str, &'static [&'static str]) = match dialect {
                    Dialect::Postgres => ("sslmode", &PG_SSL_MODES),
                    _ => ("ssl-mode", &MYSQL_SSL_MODES),
                };
                let mut ssl_mode = None;
                for (k, v) in url.query_pairs() {
                    if k != only {
                        return Err(DsnError::Parameter { only });
                    }
                    if ssl_mode.is_some() {
                        return Err(DsnError::Repeated { only });
                    }
                    let known = match dialect {
                        Dialect::Postgres => modes.contains(&v.as_ref()),
                        _ => modes.contains(&v.to_ascii_lowercase().as_str()),
                    };
                    if !known {
                        return Err(DsnError::TlsMode { only, modes });
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

    /// The transport of a network source (`None` for a SQLite file): what its `sslmode` /
    /// `ssl-mode` asks for, or the driver's default (opportunistic TLS) when it says none.
    pub fn transport(&self) -> Option<Transport> {
        let SourceDsn::Network { ssl_mode, .. } = self else {
            return None;
        };
        let mode = ssl_mode.as_deref().map(str::to_ascii_lowercase);
        Some(match mode.as_deref() {
            Some("disable" | "disabled") => Transport::Plain,
            Some("allow") => Transport::PlainFirst,
            Some("require" | "required") => Transport::Encrypted,
            Some("verify-ca" | "verify_ca") => Transport::VerifiedCa,
            Some("verify-full" | "verify_identity") => Transport::VerifiedName,
            // `prefer`, `preferred`, or nothing said: the drivers' default.
            _ => Transport::Opportunistic,
        })
    }

    /// The DSN without its password, for people and logs. Its TLS mode stays, so the
    /// display shows the transport, and sending it back as an edit keeps it.
    pub fn redacted(&self) -> String {
        match self {
            SourceDsn::Sqlite { path } => format!("sqlite://{}", path.display()),
            SourceDsn::Network {
                dialect,
                host,
                port,
                user,
                database,
                ssl_mode,
                ..
            } => {
                let (scheme, param) = if *dialect == Dialect::Postgres {
                    ("postgres", "sslmode")
                } else {
                    ("mysql", "ssl-mode")
                };
                let host = if host.contains(':') {
                    format!("[{host}]")
                } else {
                    host.clone()
                };
                // Only values of the allow-list are ever stored here (parse refused others).
                let query = ssl_mode
                    .as_deref()
                    .map(|m| format!("?{param}={m}"))
                    .unwrap_or_default();
                format!("{scheme}://{user}@{host}:{port}/{database}{query}")
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
        .map(std::borrow::Cow::into_owned)
        .map_err(|_| DsnError::NotUtf8)
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
        Err(DsnError::TableName)
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
        assert_eq!(
            d.redacted(),
            "postgres://shop@db.example.com:6432/orders?sslmode=verify-full"
        );
        assert_eq!(d.transport(), Some(Transport::VerifiedName));
        assert_eq!(d.password(), "s3cr@t");
        assert!(!format!("{d:?}").contains("s3cr"));
    }

    #[test]
    fn parameters_outside_the_allow_list_are_refused() {
        let only = "sslmode";
        for (bad, why) in [
            (
                "postgres://u:p@h/db?sslrootcert=/etc/passwd",
                DsnError::Parameter { only },
            ),
            (
                "postgres://u:p@h/db?passfile=/root/.pgpass",
                DsnError::Parameter { only },
            ),
            (
                "postgres://u:p@h/db?options=-c%20role%3Dpostgres",
                DsnError::Parameter { only },
            ),
            (
                "postgres://u:p@h/db?service=prod",
                DsnError::Parameter { only },
            ),
            (
                "postgres://u:p@h/db?sslmode=bogus",
                DsnError::TlsMode {
                    only,
                    modes: &PG_SSL_MODES,
                },
            ),
            (
                "postgres://u:p@h/db?sslmode=require&sslmode=disable",
                DsnError::Repeated { only },
            ),
            (
                "postgres://u:p@/db",
                DsnError::NotAUrl(url::ParseError::EmptyHost),
            ),
            ("postgres://:p@h/db", DsnError::NoUser),
            ("postgres://u:p@h/", DsnError::NoDatabase),
            ("postgres://u:p@h/a/b", DsnError::NoDatabase),
            ("postgres://u:p@h/%FF", DsnError::NotUtf8),
            (
                "mysql://u:p@h/db",
                DsnError::Scheme {
                    expected: "postgres or postgresql",
                },
            ),
            (
                "not a dsn",
                DsnError::NotAUrl(url::ParseError::RelativeUrlWithoutBase),
            ),
        ] {
            assert_eq!(
                SourceDsn::parse(Dialect::Postgres, bad).unwrap_err(),
                why,
                "{bad}"
            );
        }
        assert_eq!(
            SourceDsn::parse(Dialect::Mysql, "mysql://u:p@h/db?local_infile=1").unwrap_err(),
            DsnError::Parameter { only: "ssl-mode" }
        );
        assert_eq!(
            SourceDsn::parse(Dialect::Mysql, "postgres://u:p@h/db").unwrap_err(),
            DsnError::Scheme {
                expected: "mysql or mariadb"
            }
        );
        assert!(SourceDsn::parse(Dialect::Mysql, "mysql://u:p@h/db?ssl-mode=REQUIRED").is_ok());
    }

    /// No refusal repeats what the DSN holds: the message for an unknown parameter is the
    /// same whatever its name and value, so nothing cut out of it later can tell a caller
    /// what was there.
    #[test]
    fn refusals_never_repeat_a_parameter_name_or_value() {
        let said = |dialect, dsn: &str| SourceDsn::parse(dialect, dsn).unwrap_err().to_string();
        let one = said(Dialect::Postgres, "postgres://u:hunter2@h/db?hunter2=1");
        let other = said(Dialect::Postgres, "postgres://u:hunter2@h/db?GUESS=zz");
        assert_eq!(one, other);
        assert!(!one.contains("hunter2") && !one.contains("GUESS"), "{one}");
        let value = said(Dialect::Postgres, "postgres://u:p@h/db?sslmode=hunter2");
        assert!(!value.contains("hunter2"), "{value}");
        assert!(value.contains("verify-full"), "{value}");
        let m = said(Dialect::Mysql, "mysql://u:p@h/db?local_infile=hunter2");
        assert!(!m.contains("local_infile") && !m.contains("hunter2"), "{m}");
        let twice = said(
            Dialect::Postgres,
            "postgres://u:p@h/db?sslmode=require&sslmode=disable",
        );
        assert!(twice.contains("more than once"), "{twice}");
        let scheme = said(Dialect::Postgres, "hunter2://u:p@h/db");
        assert!(!scheme.contains("hunter2"), "{scheme}");
        let table = validate_table_name("hunter2;x").unwrap_err().to_string();
        assert!(!table.contains("hunter2"), "{table}");
    }

    #[test]
    fn sqlite_paths_are_plain_absolute_files() {
        assert!(SourceDsn::parse(Dialect::Sqlite, "/data/shop.db").is_ok());
        assert!(SourceDsn::parse(Dialect::Sqlite, "sqlite:///data/shop.db").is_ok());
        for (bad, why) in [
            (":memory:", DsnError::SqliteNotAFile),
            ("file:x.db?mode=rwc", DsnError::SqliteNotAFile),
            ("", DsnError::SqliteNotAFile),
            ("rel/x.db", DsnError::SqliteRelative),
            ("/x.db?vfs=unix", DsnError::SqliteParameters),
            ("/x\0.db", DsnError::SqliteParameters),
        ] {
            assert_eq!(
                SourceDsn::parse(Dialect::Sqlite, bad).unwrap_err(),
                why,
                "{bad}"
            );
        }
    }

    #[test]
    fn table_names_are_identifiers() {
        assert!(validate_table_name("justonce_keys").is_ok());
        assert!(validate_table_name("billing.justonce_keys").is_ok());
        for bad in ["", "a b", "x;drop", "a.b.c", "\"x\"", "1abc", "x`y"] {
            assert_eq!(validate_table_name(bad), Err(DsnError::TableName), "{bad}");
        }
    }
}
