//! One place that turns what a person typed (CLI flags or an API body) into a source,
//! with the defaults and the validation both surfaces share.

use reckon_ledger::{NewSource, SourceKind};
use reckon_sources::{
    Dialect, EgressPolicy, Mapping, MappingCheck, SourceConn, SourceDsn, validate_table_name,
};
use secrecy::SecretString;
use serde::Deserialize;
use std::time::Duration;

pub const DEFAULT_TABLE: &str = "justonce_keys";

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SourceInput {
    #[schema(max_length = 63, pattern = "^[a-z0-9][a-z0-9_-]*$")]
    pub name: String,
    #[schema(value_type = crate::schema::SourceKind)]
    pub kind: String,
    /// The database to read (sqlite: an absolute path; postgres, mysql: a URL whose
    /// parameters may only be `sslmode` / `ssl-mode`). Not for push sources.
    #[serde(default)]
    pub dsn: Option<String>,
    /// The justonce table; default `justonce_keys`.
    #[serde(default)]
    #[schema(
        max_length = 127,
        pattern = "^[A-Za-z_][A-Za-z0-9_]{0,62}(\\.[A-Za-z_][A-Za-z0-9_]{0,62})?$"
    )]
    pub table: Option<String>,
    /// A table that is not justonce's, read through a column mapping: a preset's name
    /// (`justonce`, `brandur`) or JSON settings (docs/mapped-sources.md). With the kind
    /// `mapped`, the dialect is the DSN's.
    #[serde(default)]
    pub mapping: Option<String>,
    /// e.g. "60s", "5m"
    #[serde(default)]
    #[schema(example = "60s")]
    pub scan_interval: Option<String>,
    /// Grace after a lease ends before a claim counts as abandoned; default "5m".
    #[serde(default)]
    #[schema(example = "60s")]
    pub abandoned_after: Option<String>,
    /// How far back each incremental scan re-reads, to absorb late commits; default "60s".
    #[serde(default)]
    #[schema(example = "60s")]
    pub overlap: Option<String>,
    /// How often the key sets are compared to notice deleted rows; default "1h".
    #[serde(default)]
    #[schema(example = "60s")]
    pub full_scan_every: Option<String>,
}

fn duration(what: &str, v: &Option<String>, default: Duration) -> Result<Duration, String> {
    match v {
        None => Ok(default),
        Some(s) => humantime::parse_duration(s)
            .map_err(|e| format!("{what} {s:?} is not a duration like 30s, 5m or 1h ({e})")),
    }
}

/// Validate and complete a source description. Errors are sentences for the person who
/// typed the input; they never echo a DSN.
pub fn new_source(input: SourceInput) -> Result<NewSource, String> {
    let kind = match input.kind.as_str() {
        "mapped" => {
            let dsn = input
                .dsn
                .as_deref()
                .ok_or("a mapped source needs a DSN (the database its table is in)")?;
            if input.mapping.is_none() {
                return Err(
                    "a mapped source needs a mapping: a preset (justonce, brandur) or \
                     JSON settings"
                        .into(),
                );
            }
            dialect_of(dsn)?.into()
        }
        k => SourceKind::parse(k).ok_or_else(|| {
            format!("kind {k:?} is not one of sqlite, postgres, mysql, push, mapped")
        })?,
    };
    let (table, mapping) = match input.mapping {
        None => (
            input.table.unwrap_or_else(|| DEFAULT_TABLE.to_owned()),
            None,
        ),
        Some(_) if !kind.is_scanned() => return Err("a push source takes no mapping".into()),
        Some(settings) => {
            let m = Mapping::parse(&settings).map_err(|e| e.to_string())?;
            if input.table.as_ref().is_some_and(|t| *t != m.table) {
                return Err(format!(
                    "a mapped source reads the mapping's table ({}): give the table in the \
                     mapping, not as table",
                    m.table
                ));
            }
            (m.table, Some(settings))
        }
    };
    validate_table_name(&table).map_err(|e| e.to_string())?;
    let (dsn, dsn_display) = match (kind, input.dsn) {
        (SourceKind::Push, None) => (None, None),
        (SourceKind::Push, Some(_)) => return Err("a push source takes no DSN".into()),
        (_, None) => return Err(format!("a {} source needs a DSN", kind.as_str())),
        (k, Some(d)) => {
            let dialect = k.dialect().expect("scanned kinds are dialects");
            let parsed = SourceDsn::parse(dialect, &d).map_err(|e| e.to_string())?;
            (Some(SecretString::from(d)), Some(parsed.redacted()))
        }
    };
    let scan_interval = duration(
        "scan_interval",
        &input.scan_interval,
        Duration::from_secs(60),
    )?;
    let abandoned_after = duration(
        "abandoned_after",
        &input.abandoned_after,
        Duration::from_secs(300),
    )?;
    let overlap = duration("overlap", &input.overlap, Duration::from_secs(60))?;
    let full_every = duration(
        "full_scan_every",
        &input.full_scan_every,
        Duration::from_secs(3600),
    )?;
    if scan_interval < Duration::from_secs(1) {
        return Err("scan_interval must be at least 1s".into());
    }
    Ok(NewSource {
        name: input.name,
        kind,
        dsn,
        dsn_display,
        table_name: table,
        scan_interval_secs: scan_interval.as_secs() as i64,
        abandoned_after_secs: abandoned_after.as_secs_f64(),
        overlap_secs: overlap.as_secs_f64(),
        full_scan_every_secs: full_every.as_secs().max(1) as i64,
        mapping,
    })
}

/// The dialect of a mapped source's DSN: its URL scheme, or a SQLite file's path.
fn dialect_of(dsn: &str) -> Result<Dialect, String> {
    let scheme = dsn.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
    match scheme.as_deref() {
        Some("postgres" | "postgresql") => Ok(Dialect::Postgres),
        Some("mysql" | "mariadb") => Ok(Dialect::Mysql),
        Some("sqlite") => Ok(Dialect::Sqlite),
        None if dsn.starts_with('/') || dsn.starts_with("sqlite:") => Ok(Dialect::Sqlite),
        _ => Err(
            "a mapped source's DSN is a postgres:// or mysql:// URL, or the absolute path \
             of a SQLite file"
                .into(),
        ),
    }
}

/// A mapped source's mapping held against its live table at save (`source add`): its DSN
/// checked by the egress policy like every connection, the table read in a read-only
/// transaction. The answer is what each state's condition matches now, or the sentence
/// that refuses the mapping (naming the field and the column).
pub async fn check_mapping_at_save(
    kind: SourceKind,
    dsn: Option<&SecretString>,
    settings: &str,
    egress: &EgressPolicy,
    tenant_slug: &str,
) -> Result<MappingCheck, String> {
    use secrecy::ExposeSecret;
    let (Some(dsn), Some(dialect)) = (dsn, kind.dialect()) else {
        return Err("a mapped source needs a DSN".into());
    };
    let mapping = Mapping::parse(settings).map_err(|e| e.to_string())?;
    let parsed = SourceDsn::parse(dialect, dsn.expose_secret()).map_err(|e| e.to_string())?;
    let pinned = egress
        .for_tenant(tenant_slug)
        .pin(&parsed)
        .await
        .map_err(|e| format!("the DSN is refused by the egress policy: {e}"))?;
    let mut conn = SourceConn::open_mapped(&pinned, &mapping, egress)
        .await
        .map_err(|e| format!("the mapping cannot be checked: {e}"))?;
    let checked = conn.check_mapping().await;
    conn.close().await;
    checked.map_err(|e| e.to_string())
}

/// T08 / T12 at save: a new or changed DSN (`dsn`, of a source of `kind`) must pass the
/// operator's egress policy for the tenant `tenant_slug`: no loopback, private or
/// link-local address the operator has not allowed, not reckon's own database, a SQLite
/// file only inside the tenant's own directory. The answer is a sentence for the person
/// who typed the DSN; it names the host or path, never the password. Every connection is
/// checked again (scan, write-back): this is the early, clear refusal.
pub async fn check_dsn_at_save(
    kind: SourceKind,
    dsn: Option<&SecretString>,
    egress: &EgressPolicy,
    tenant_slug: &str,
) -> Result<(), String> {
    use secrecy::ExposeSecret;
    let (Some(dsn), Some(dialect)) = (dsn, kind.dialect()) else {
        return Ok(());
    };
    let parsed = SourceDsn::parse(dialect, dsn.expose_secret()).map_err(|e| e.to_string())?;
    egress
        .for_tenant(tenant_slug)
        .check_at_save(&parsed)
        .await
        .map_err(|e| format!("the DSN is refused by the egress policy: {e}"))
}

/// An edit of a source as the API takes it: every field optional, `None` keeps the stored
/// value. The name and the kind cannot change.
#[derive(Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SourceEdit {
    /// A new DSN. For PostgreSQL / MySQL, a DSN without a password keeps the stored
    /// password (so the redacted DSN reckon shows can be sent back with a new host);
    /// a DSN with a password replaces it.
    #[serde(default)]
    pub dsn: Option<String>,
    /// A new password alone (PostgreSQL / MySQL), kept with the stored (or the given) DSN.
    #[serde(default)]
    pub password: Option<String>,
    #[serde(default)]
    #[schema(
        max_length = 127,
        pattern = "^[A-Za-z_][A-Za-z0-9_]{0,62}(\\.[A-Za-z_][A-Za-z0-9_]{0,62})?$"
    )]
    pub table: Option<String>,
    #[serde(default)]
    #[schema(example = "60s")]
    pub scan_interval: Option<String>,
    #[serde(default)]
    #[schema(example = "60s")]
    pub abandoned_after: Option<String>,
    #[serde(default)]
    #[schema(example = "60s")]
    pub overlap: Option<String>,
    #[serde(default)]
    #[schema(example = "60s")]
    pub full_scan_every: Option<String>,
}

impl std::fmt::Debug for SourceEdit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceEdit")
            .field("dsn", &self.dsn.as_ref().map(|_| "<redacted>"))
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("table", &self.table)
            .field("scan_interval", &self.scan_interval)
            .field("abandoned_after", &self.abandoned_after)
            .field("overlap", &self.overlap)
            .field("full_scan_every", &self.full_scan_every)
            .finish()
    }
}

impl SourceEdit {
    /// The names of the fields this edit sets (for the audit log; never their values).
    pub fn fields(&self) -> Vec<&'static str> {
        [
            ("dsn", self.dsn.is_some()),
            ("password", self.password.is_some()),
            ("table", self.table.is_some()),
            ("scan_interval", self.scan_interval.is_some()),
            ("abandoned_after", self.abandoned_after.is_some()),
            ("overlap", self.overlap.is_some()),
            ("full_scan_every", self.full_scan_every.is_some()),
        ]
        .into_iter()
        .filter_map(|(n, set)| set.then_some(n))
        .collect()
    }
}

/// Whether the network DSN `new` would send the stored password somewhere it was not given
/// for: another server, user or database, or over a weaker transport (TLS dropped, or its
/// certificate or host name no longer checked; an absent `sslmode` is the drivers'
/// opportunistic default). A `new` that does not parse is refused later with its own
/// reason, so it is not judged here; a `stored` that does not parse is not the same as
/// anything.
fn moves_elsewhere(dialect: Dialect, stored: &str, new: &str) -> bool {
    let target = |d: &str| {
        let parsed = SourceDsn::parse(dialect, d).ok()?;
        let transport = parsed.transport();
        match parsed {
            SourceDsn::Network {
                host,
                port,
                user,
                database,
                ..
            } => Some(((host.to_ascii_lowercase(), port, user, database), transport)),
            SourceDsn::Sqlite { .. } => None,
        }
    };
    match (target(stored), target(new)) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some((was, was_transport)), Some((now, now_transport))) => {
            was != now || now_transport < was_transport
        }
    }
}

/// Validate an edit of a source of `kind` whose stored DSN is `stored` (decrypted; `None`
/// for a push source) and turn it into the ledger's change. The same checks as
/// [`new_source`] apply to every field given. Errors never quote a DSN or a password.
pub fn source_change(
    kind: SourceKind,
    stored: Option<&SecretString>,
    edit: SourceEdit,
) -> Result<reckon_ledger::SourceChange, String> {
    use secrecy::ExposeSecret;
    let mut change = reckon_ledger::SourceChange::default();
    if edit.dsn.is_some() || edit.password.is_some() {
        let Some(dialect) = kind.dialect() else {
            return Err("a push source takes no DSN".into());
        };
        if let Some(p) = &edit.password
            && p.is_empty()
        {
            return Err("password is empty".into());
        }
        let dsn = match (dialect, edit.dsn, edit.password) {
            (Dialect::Sqlite, _, Some(_)) => {
                return Err("a SQLite source has no password".into());
            }
            (Dialect::Sqlite, Some(d), None) => d,
            (Dialect::Sqlite, None, None) => return Err("nothing to change".into()),
            (_, base, password) => {
                let given = base.is_some();
                let base = match base {
                    Some(d) => d,
                    None => stored
                        .map(|s| s.expose_secret().to_owned())
                        .ok_or("the source has no stored DSN to change the password of")?,
                };
                let mut url =
                    url::Url::parse(&base).map_err(|e| format!("invalid DSN: not a URL ({e})"))?;
                match password {
                    Some(_) if given && url.password().is_some() => {
                        return Err(
                            "give the password either in the DSN or as password, not both".into(),
                        );
                    }
                    Some(p) => {
                        let encoded: String =
                            url::form_urlencoded::byte_serialize(p.as_bytes()).collect();
                        url.set_password(Some(&encoded.replace('+', "%20")))
                            .map_err(|()| "invalid DSN: it cannot carry a password")?;
                    }
                    None if url.password().is_none() => {
                        // The stored password stays (T16: an edit never drops a secret it
                        // was not given), but only where it already went: a new host,
                        // port, user or database needs it given again, or whoever may
                        // edit the source could send it to a server of their own.
                        let kept = stored.and_then(|s| {
                            url::Url::parse(s.expose_secret())
                                .ok()
                                .and_then(|u| u.password().map(str::to_owned))
                        });
                        if kept.is_some()
                            && let Some(stored) = stored
                            && moves_elsewhere(dialect, stored.expose_secret(), url.as_str())
                        {
                            return Err("the DSN's host, port, user or database changed, or its \
                                        transport is weaker (sslmode / ssl-mode): give the \
                                        password again (in the DSN or as password)"
                                .into());
                        }
                        if let Some(kept) = kept {
                            url.set_password(Some(&kept))
                                .map_err(|()| "invalid DSN: it cannot carry a password")?;
                        }
                    }
                    None => {}
                }
                url.to_string()
            }
        };
        let parsed = SourceDsn::parse(dialect, &dsn).map_err(|e| e.to_string())?;
        change.dsn_display = Some(parsed.redacted());
        change.dsn = Some(SecretString::from(dsn));
    }
    if let Some(table) = edit.table {
        validate_table_name(&table).map_err(|e| e.to_string())?;
        change.table_name = Some(table);
    }
    let parse = |what: &str, v: &Option<String>| -> Result<Option<Duration>, String> {
        match v {
            None => Ok(None),
            Some(_) => duration(what, v, Duration::ZERO).map(Some),
        }
    };
    if let Some(d) = parse("scan_interval", &edit.scan_interval)? {
        if d < Duration::from_secs(1) {
            return Err("scan_interval must be at least 1s".into());
        }
        change.scan_interval_secs = Some(d.as_secs() as i64);
    }
    change.abandoned_after_secs =
        parse("abandoned_after", &edit.abandoned_after)?.map(|d| d.as_secs_f64());
    change.overlap_secs = parse("overlap", &edit.overlap)?.map(|d| d.as_secs_f64());
    change.full_scan_every_secs =
        parse("full_scan_every", &edit.full_scan_every)?.map(|d| d.as_secs().max(1) as i64);
    Ok(change)
}

#[cfg(test)]
mod tests {
    use super::*;
    use secrecy::ExposeSecret;

    fn decode_lossy(s: &str) -> String {
        url::form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
            .next()
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default()
    }

    fn stored() -> SecretString {
        SecretString::from("postgres://app:s3cr%40t@db.example.com:5432/shop".to_owned())
    }

    #[test]
    fn an_edit_without_a_password_keeps_the_stored_one() {
        let edit = SourceEdit {
            dsn: Some("postgres://app@DB.example.com/shop?sslmode=require".into()),
            ..Default::default()
        };
        let c = source_change(SourceKind::Postgres, Some(&stored()), edit).unwrap();
        assert_eq!(
            c.dsn.unwrap().expose_secret(),
            "postgres://app:s3cr%40t@DB.example.com/shop?sslmode=require"
        );
        assert!(!c.dsn_display.unwrap().contains("s3cr"));
    }

    /// The stored password goes only where it went before: a DSN naming another host,
    /// port, user or database without a password is refused, and with one is taken.
    #[test]
    fn a_new_host_port_user_or_database_needs_the_password_again() {
        for dsn in [
            "postgres://app@db2.example.com:5432/shop",
            "postgres://app@db.example.com:6432/shop",
            "postgres://postgres@db.example.com:5432/shop",
            "postgres://app@db.example.com:5432/other",
        ] {
            let edit = SourceEdit {
                dsn: Some(dsn.into()),
                ..Default::default()
            };
            let e = source_change(SourceKind::Postgres, Some(&stored()), edit).unwrap_err();
            assert!(e.contains("password again"), "{dsn}: {e}");
            let edit = SourceEdit {
                dsn: Some(dsn.into()),
                password: Some("n3w".into()),
                ..Default::default()
            };
            let c = source_change(SourceKind::Postgres, Some(&stored()), edit).unwrap();
            assert!(!c.dsn.unwrap().expose_secret().contains("s3cr"), "{dsn}");
        }
    }

    #[test]
    fn a_password_alone_replaces_only_the_password() {
        let edit = SourceEdit {
            password: Some("n3w p@ss".into()),
            ..Default::default()
        };
        let c = source_change(SourceKind::Postgres, Some(&stored()), edit).unwrap();
        let dsn = c.dsn.unwrap();
        let url = url::Url::parse(dsn.expose_secret()).unwrap();
        assert_eq!(url.host_str(), Some("db.example.com"));
        assert_eq!(decode_lossy(url.password().unwrap()), "n3w p@ss");
        let parsed = SourceDsn::parse(Dialect::Postgres, dsn.expose_secret()).unwrap();
        match parsed {
            SourceDsn::Network { password, .. } => {
                assert_eq!(password.unwrap().expose_secret(), "n3w p@ss");
            }
            SourceDsn::Sqlite { .. } => panic!(),
        }
    }

    #[test]
    fn other_fields_leave_the_dsn_alone_and_bad_values_are_refused() {
        let edit = SourceEdit {
            scan_interval: Some("2m".into()),
            ..Default::default()
        };
        let c = source_change(SourceKind::Postgres, Some(&stored()), edit).unwrap();
        assert!(c.dsn.is_none() && c.dsn_display.is_none());
        assert_eq!(c.scan_interval_secs, Some(120));
        assert!(!c.moves_the_source());
        for bad in [
            SourceEdit {
                dsn: Some("postgres://u:canary@h/db?passfile=x".into()),
                ..Default::default()
            },
            SourceEdit {
                dsn: Some("postgres://u:canary@h/db".into()),
                password: Some("canary".into()),
                ..Default::default()
            },
            SourceEdit {
                scan_interval: Some("0s".into()),
                ..Default::default()
            },
            SourceEdit {
                table: Some("x; drop".into()),
                ..Default::default()
            },
        ] {
            let e = source_change(SourceKind::Postgres, Some(&stored()), bad).unwrap_err();
            assert!(!e.contains("canary"), "{e}");
        }
        let e = source_change(
            SourceKind::Push,
            None,
            SourceEdit {
                dsn: Some("postgres://u:p@h/db".into()),
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(e.contains("push"), "{e}");
    }

    /// The stored password is never sent over a weaker transport than the one it was given
    /// for: dropping TLS, removing `sslmode`, or checking less of the certificate needs the
    /// password again; keeping or strengthening the transport does not.
    #[test]
    fn a_weaker_transport_needs_the_password_again() {
        let pg = SecretString::from(
            "postgres://app:s3cr%40t@db.example.com:5432/shop?sslmode=verify-full".to_owned(),
        );
        for weaker in ["disable", "allow", "prefer", "require", "verify-ca"] {
            let dsn = format!("postgres://app@db.example.com:5432/shop?sslmode={weaker}");
            let edit = SourceEdit {
                dsn: Some(dsn.clone()),
                ..Default::default()
            };
            let e = source_change(SourceKind::Postgres, Some(&pg), edit).unwrap_err();
            assert!(e.contains("password again"), "{dsn}: {e}");
            let edit = SourceEdit {
                dsn: Some(dsn.clone()),
                password: Some("given again".into()),
                ..Default::default()
            };
            assert!(
                source_change(SourceKind::Postgres, Some(&pg), edit).is_ok(),
                "{dsn}"
            );
        }
        // No sslmode at all: the drivers' opportunistic default, weaker too.
        let edit = SourceEdit {
            dsn: Some("postgres://app@db.example.com:5432/shop".into()),
            ..Default::default()
        };
        assert!(source_change(SourceKind::Postgres, Some(&pg), edit).is_err());
        // The same transport (the display sent back) keeps the stored password.
        let edit = SourceEdit {
            dsn: Some("postgres://app@db.example.com:5432/shop?sslmode=verify-full".into()),
            ..Default::default()
        };
        let c = source_change(SourceKind::Postgres, Some(&pg), edit).unwrap();
        assert!(c.dsn.unwrap().expose_secret().contains("s3cr"));
        // Stronger than before: fine without the password.
        let edit = SourceEdit {
            dsn: Some("postgres://app@db.example.com:5432/shop?sslmode=require".into()),
            ..Default::default()
        };
        assert!(source_change(SourceKind::Postgres, Some(&stored()), edit).is_ok());

        let my = SecretString::from(
            "mysql://app:s3cr%40t@db.example.com:3306/shop?ssl-mode=VERIFY_IDENTITY".to_owned(),
        );
        for weaker in [
            "mysql://app@db.example.com:3306/shop?ssl-mode=DISABLED",
            "mysql://app@db.example.com:3306/shop?ssl-mode=required",
            "mysql://app@db.example.com:3306/shop",
        ] {
            let edit = SourceEdit {
                dsn: Some(weaker.into()),
                ..Default::default()
            };
            let e = source_change(SourceKind::Mysql, Some(&my), edit).unwrap_err();
            assert!(e.contains("password again"), "{weaker}: {e}");
        }
        let edit = SourceEdit {
            dsn: Some("mysql://app@db.example.com:3306/shop?ssl-mode=verify_identity".into()),
            ..Default::default()
        };
        assert!(source_change(SourceKind::Mysql, Some(&my), edit).is_ok());
    }
}
