//! Settings, loaded once: defaults < `reckon.toml` < `RECKON_*` environment < flags.

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use secrecy::SecretString;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// The secrets (`database_url`, `master_key`, `metrics_token`) are [`SecretString`]s:
/// `Debug` shows `[REDACTED]` for them, nothing prints them, and they are never written
/// back out (`skip_serializing`: the defaults figment starts from hold none).
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Settings {
    /// `postgres://...` selects PostgreSQL; unset means the embedded SQLite file in
    /// `data_dir`. A secret: a PostgreSQL URL carries its password.
    #[serde(default, skip_serializing)]
    pub database_url: Option<SecretString>,
    pub data_dir: PathBuf,
    /// Where `reckon serve` listens.
    pub listen: String,
    /// Base64 of 32 bytes; unset means a key file in `data_dir` (single node only).
    #[serde(default, skip_serializing)]
    pub master_key: Option<SecretString>,
    /// Largest request body the API accepts, in bytes.
    pub max_body_bytes: usize,
    // `/metrics` is off unless one of these two is set.
    /// A listener of its own serving `/metrics` without a token (`RECKON_METRICS_LISTEN`).
    pub metrics_listen: Option<String>,
    /// Bearer token that may read `/metrics` on the main listener (`RECKON_METRICS_TOKEN`).
    #[serde(default, skip_serializing)]
    pub metrics_token: Option<SecretString>,
    /// Networks (CIDR) tenants' sources may reach although they are not public addresses
    /// (loopback, private, link-local), e.g. `["10.0.0.0/8"]`. Empty: public addresses only.
    #[serde(default)]
    pub egress_allow: Vec<String>,
    /// The proxies in front of reckon (CIDR or addresses, e.g. `["10.0.0.0/8"]`): from these
    /// peers only, the client's address for the sign-in throttle is read from
    /// `client_address_header`. Empty: the TCP peer is the client.
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    /// The header those proxies set: `x-forwarded-for` (default) or `forwarded`.
    #[serde(default = "default_client_header")]
    pub client_address_header: String,
    /// The sign-in throttle counts an IPv6 client by this many leading bits of its address
    /// (default 64: a subscriber's usual allocation; 128 counts every address apart).
    #[serde(default = "default_ipv6_prefix")]
    pub throttle_ipv6_prefix: u8,
    /// The directory whose per-tenant subdirectories hold SQLite sources: a tenant's
    /// SQLite source must be a file in `{sqlite_source_dir}/{tenant-slug}/` (after
    /// following links), so no tenant can name another's file. Unset: SQLite sources are
    /// refused.
    #[serde(default)]
    pub sqlite_source_dir: Option<PathBuf>,
    /// Run the reconciler in `reckon serve` (`RECKON_RECONCILE=false` for a replica that
    /// only serves and scans).
    #[serde(default = "yes")]
    pub reconcile: bool,
    /// Lookups of one provider in flight at once when reckon starts; the limit then
    /// follows the provider's answers (up while it answers as fast, down when it slows or
    /// refuses), between 1 and `reconcile_concurrency_max`. Each provider's `rate_per_sec`
    /// budget still holds.
    #[serde(default = "default_concurrency")]
    pub reconcile_concurrency: usize,
    /// The most lookups of one provider in flight at once. Set it to
    /// `reconcile_concurrency` for a fixed limit.
    #[serde(default = "default_concurrency_max")]
    pub reconcile_concurrency_max: usize,
    /// How long a claimed effect stays leased to one replica: a replica that dies gives its
    /// claims up this long after it took them.
    #[serde(
        rename = "reconcile_lease_secs",
        with = "seconds",
        default = "default_lease"
    )]
    pub reconcile_lease: Duration,
    /// On SIGTERM, readiness turns false this long before the server stops taking
    /// requests, so load balancers stop sending first.
    #[serde(
        rename = "shutdown_drain_secs",
        with = "seconds",
        default = "default_drain"
    )]
    pub shutdown_drain: Duration,
    /// How often each replica looks for tenants whose nightly audit is due (the day is
    /// claimed through the ledger, so any number of replicas run it once).
    #[serde(
        rename = "audit_check_secs",
        with = "seconds",
        default = "default_audit_check"
    )]
    pub audit_check: Duration,
    /// An API request still running after this many seconds is stopped and answered 503.
    #[serde(
        rename = "request_timeout_secs",
        with = "seconds",
        default = "default_request_timeout"
    )]
    pub request_timeout: Duration,
    /// Open client connections at most. Unset: derived from the descriptor limit
    /// (`ulimit -n`), a quarter of it (at least 256) kept for the ledger, sources and
    /// providers; a value above that is lowered to it.
    #[serde(default)]
    pub max_connections: Option<usize>,
    /// A client has this many seconds to send a request's headers, and an idle keep-alive
    /// connection is closed after as long.
    #[serde(
        rename = "header_read_timeout_secs",
        with = "seconds",
        default = "default_header_read_timeout"
    )]
    pub header_read_timeout: Duration,
    /// The largest answer read from a provider, in bytes; a larger one is refused unread
    /// past the limit and the lookup stays indeterminate ("answer too large").
    #[serde(default = "default_max_provider_answer")]
    pub max_provider_answer_bytes: usize,
}

fn yes() -> bool {
    true
}
fn default_concurrency() -> usize {
    8
}
fn default_concurrency_max() -> usize {
    64
}
fn default_lease() -> Duration {
    Duration::from_secs(120)
}
fn default_drain() -> Duration {
    Duration::from_secs(2)
}
fn default_audit_check() -> Duration {
    Duration::from_secs(60)
}
fn default_request_timeout() -> Duration {
    reckon_web::DEFAULT_REQUEST_TIMEOUT
}
fn default_header_read_timeout() -> Duration {
    reckon_web::server::DEFAULT_HEADER_READ_TIMEOUT
}

/// A duration of the configuration, written as a number of seconds (`audit_check_secs =
/// 0.5`), as the keys' names say. Anything that is not a finite number of seconds, 0 or
/// more, is refused while reading, and figment's error names the key.
mod seconds {
    use serde::de::Error;
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let secs = f64::deserialize(d)?;
        Duration::try_from_secs_f64(secs).map_err(|_| {
            D::Error::custom(format!(
                "{secs} is not a number of seconds (finite, 0 or more)"
            ))
        })
    }

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}
fn default_max_provider_answer() -> usize {
    reckon_providers::client::DEFAULT_MAX_ANSWER_BYTES
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            database_url: None,
            data_dir: PathBuf::from("./reckon-data"),
            listen: "127.0.0.1:8080".into(),
            master_key: None,
            max_body_bytes: 8 * 1024 * 1024,
            metrics_listen: None,
            metrics_token: None,
            egress_allow: Vec::new(),
            trusted_proxies: Vec::new(),
            client_address_header: default_client_header(),
            throttle_ipv6_prefix: default_ipv6_prefix(),
            sqlite_source_dir: None,
            reconcile: true,
            reconcile_concurrency: default_concurrency(),
            reconcile_concurrency_max: default_concurrency_max(),
            reconcile_lease: default_lease(),
            shutdown_drain: default_drain(),
            audit_check: default_audit_check(),
            request_timeout: default_request_timeout(),
            max_connections: None,
            header_read_timeout: default_header_read_timeout(),
            max_provider_answer_bytes: default_max_provider_answer(),
        }
    }
}

/// Flags that override everything else.
#[derive(Default, Serialize)]
pub struct Overrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub database_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
}

impl Settings {
    pub fn load(config_file: &std::path::Path, overrides: Overrides) -> anyhow::Result<Settings> {
        let s: Settings = Figment::from(Serialized::defaults(Settings::default()))
            .merge(Toml::file(config_file))
            .merge(Env::prefixed("RECKON_"))
            .merge(Serialized::defaults(overrides))
            .extract()?;
        // A day at most (a deadline is a timer), and a zero deadline would answer every
        // request 503.
        let day = Duration::from_secs(86_400);
        if s.request_timeout.is_zero() || s.request_timeout > day {
            anyhow::bail!(
                "request_timeout_secs must be a number of seconds above 0 and at most 86400, not {}",
                s.request_timeout.as_secs_f64()
            );
        }
        let hour = Duration::from_secs(3600);
        if s.header_read_timeout.is_zero() || s.header_read_timeout > hour {
            anyhow::bail!(
                "header_read_timeout_secs must be a number of seconds above 0 and at most 3600, not {}",
                s.header_read_timeout.as_secs_f64()
            );
        }
        Ok(s)
    }
}

/// Whether the data directory was chosen (in the configuration file, RECKON_DATA_DIR or
/// `--data-dir`) rather than left at its default: `reckon demo` builds its ledger there
/// when it was, and in a temporary directory when it was not.
pub fn data_dir_given(config_file: &std::path::Path, overrides: &Overrides) -> bool {
    overrides.data_dir.is_some()
        || Figment::from(Toml::file(config_file))
            .merge(Env::prefixed("RECKON_"))
            .find_value("data_dir")
            .is_ok()
}

fn default_client_header() -> String {
    "x-forwarded-for".into()
}

fn default_ipv6_prefix() -> u8 {
    reckon_web::client_addr::DEFAULT_IPV6_PREFIX
}

impl Settings {
    /// Where the sign-in throttle reads a client's address (`reckon_web::client_addr`).
    pub fn client_address(&self) -> anyhow::Result<reckon_web::client_addr::ClientAddress> {
        use reckon_web::client_addr::{ClientAddress, ForwardedHeader};
        let header = ForwardedHeader::parse(&self.client_address_header).ok_or_else(|| {
            anyhow::anyhow!("client_address_header must be x-forwarded-for or forwarded")
        })?;
        ClientAddress::new(&self.trusted_proxies, header)
            .and_then(|c| c.with_ipv6_prefix(self.throttle_ipv6_prefix))
            .map_err(anyhow::Error::msg)
    }

    /// The egress policy for tenants' sources: the operator's allow-list and SQLite
    /// directory, and reckon's own database, which no source may name (by address before
    /// connecting, and by `ledger`'s identity once connected).
    pub async fn egress_policy(
        &self,
        ledger: &dyn reckon_ledger::Ledger,
    ) -> anyhow::Result<reckon_sources::EgressPolicy> {
        use reckon_sources::{EgressPolicy, OwnDatabase};
        let mut p = EgressPolicy::new(&self.egress_allow, self.sqlite_source_dir.clone())
            .map_err(|e| anyhow::anyhow!("egress_allow: {e}"))?
            .with_own_database(OwnDatabase::File(self.data_dir.join("reckon.db")));
        if let Some(url) = &self.database_url
            && let Ok(o) = <sqlx::postgres::PgConnectOptions as std::str::FromStr>::from_str(
                secrecy::ExposeSecret::expose_secret(url),
            )
        {
            p = p.with_own_database(OwnDatabase::Network {
                host: o.get_host().to_owned(),
                port: o.get_port(),
                database: o.get_database().unwrap_or_default().to_owned(),
            });
        }
        let identity = ledger
            .instance_identity()
            .await
            .map_err(|e| anyhow::anyhow!("reading the ledger's identity: {e}"))?;
        Ok(p.with_own_identity(identity))
    }
}

#[cfg(test)]
mod duration_tests {
    use super::*;

    #[test]
    fn a_duration_that_is_not_a_number_of_seconds_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("reckon.toml");
        std::fs::write(&file, "audit_check_secs = inf\n").unwrap();
        let e = Settings::load(&file, Overrides::default()).unwrap_err();
        assert!(e.to_string().contains("audit_check_secs"), "{e}");
        std::fs::write(&file, "shutdown_drain_secs = -1.0\n").unwrap();
        let e = Settings::load(&file, Overrides::default()).unwrap_err();
        assert!(e.to_string().contains("shutdown_drain_secs"), "{e}");
        std::fs::write(&file, "audit_check_secs = 0.5\n").unwrap();
        let s = Settings::load(&file, Overrides::default()).unwrap();
        assert_eq!(s.audit_check, Duration::from_millis(500));
        assert_eq!(s.request_timeout, Duration::from_secs(120));
        // A zero deadline would answer every API request 503.
        for bad in ["0", "-1.0", "inf", "100000"] {
            std::fs::write(&file, format!("request_timeout_secs = {bad}\n")).unwrap();
            let e = Settings::load(&file, Overrides::default()).unwrap_err();
            assert!(e.to_string().contains("request_timeout_secs"), "{bad}: {e}");
        }
        std::fs::write(&file, "request_timeout_secs = 2.5\n").unwrap();
        let s = Settings::load(&file, Overrides::default()).unwrap();
        assert_eq!(s.request_timeout, Duration::from_millis(2500));
    }
}

#[cfg(test)]
mod secret_tests {
    use super::*;
    use secrecy::ExposeSecret;

    /// The configuration's secrets are read, and never shown by `Debug` (a log line or a
    /// panic message of the settings).
    #[test]
    fn the_settings_debug_shows_no_secret() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("reckon.toml");
        std::fs::write(
            &file,
            "database_url = \"postgres://reckon:pw-canary-1@db.internal/reckon\"\n\
             master_key = \"key-canary-2\"\n\
             metrics_token = \"tok-canary-3\"\n",
        )
        .unwrap();
        let s = Settings::load(&file, Overrides::default()).unwrap();
        let url = s.database_url.as_ref().map(ExposeSecret::expose_secret);
        assert_eq!(
            url,
            Some("postgres://reckon:pw-canary-1@db.internal/reckon")
        );
        assert_eq!(
            s.master_key.as_ref().map(ExposeSecret::expose_secret),
            Some("key-canary-2")
        );
        assert_eq!(
            s.metrics_token.as_ref().map(ExposeSecret::expose_secret),
            Some("tok-canary-3")
        );
        let shown = format!("{s:?} {s:#?}");
        for canary in ["pw-canary-1", "db.internal", "key-canary-2", "tok-canary-3"] {
            assert!(!shown.contains(canary), "{canary} in {shown}");
        }
        assert!(shown.contains("REDACTED"), "{shown}");
        // The flag overrides the file, and is as secret.
        let flags = Overrides {
            database_url: Some("postgres://u:pw-canary-4@h/db".into()),
            ..Overrides::default()
        };
        let s = Settings::load(&file, flags).unwrap();
        assert!(!format!("{s:?}").contains("pw-canary-4"));
        assert_eq!(
            s.database_url.as_ref().map(ExposeSecret::expose_secret),
            Some("postgres://u:pw-canary-4@h/db")
        );
    }
}
