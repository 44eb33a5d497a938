//! Where tenants' DSNs may point. A DSN is hostile input: without this, a tenant could make
//! reckon connect to its own database, to a cloud metadata endpoint, or to any service on
//! the private network (and read the answer back through error messages).
//!
//! - PostgreSQL / MySQL hosts are resolved and EVERY address checked: loopback, private
//!   (RFC 1918, CGNAT, ULA, site-local), link-local (incl. 169.254.169.254), unspecified,
//!   multicast, broadcast and documentation ranges are refused unless the operator
//!   allow-lists the network in configuration. An IPv6 address that carries an IPv4
//!   address (IPv4-mapped, IPv4-compatible, SIIT, 6to4, Teredo, NAT64) is judged by the
//!   IPv4 address it carries as well, since that is where it leads.
//! - reckon's own database is refused even when allow-listed: by host and port, or file,
//!   before connecting, and by identity once connected (a connection that can see the
//!   ledger's `reckon_instance` identity is closed, see `own.rs`), since another address,
//!   a port forward or a link to the same database is not recognisable by its address.
//! - SQLite sources must be files inside their tenant's own directory,
//!   `{sqlite_source_dir}/{tenant-slug}/`, after resolving symlinks and `..`
//!   (canonicalised), so no path or link leads outside it, and no tenant reaches another's
//!   file. The check needs the tenant ([`EgressPolicy::for_tenant`]): a policy without one
//!   refuses every SQLite source (fail closed), so a caller that forgets cannot fall back
//!   to the shared directory.
//!
//! Two moments: at save ([`EgressPolicy::check_at_save`], when a person adds or edits a
//! source) and before every connection ([`EgressPolicy::pin`]). The second is the one that
//! guards; the first tells the person at once. At save, a host name that does not resolve
//! (yet) and a SQLite file that does not exist (yet) are accepted, since DNS and files
//! change either way; everything that can be judged is.
//!
//! DNS rebinding (T09): a host name is resolved once, every address checked, and the
//! connection goes to a checked address ([`EgressPolicy::pin`] returns the DSN with its
//! host replaced by that IP), so a name that answers a public address to the check and a
//! private one a moment later is never connected to the second. Exception: a DSN whose TLS
//! mode verifies the server's name (`verify-full`, `verify_identity`) keeps the name, since
//! the certificate check needs it; a rebound address then fails the TLS handshake, before
//! any credential is sent. The resolver is injectable ([`Resolver`]) so tests can rebind.

use crate::dsn::SourceDsn;
use ipnet::IpNet;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Component, Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

/// Resolves host names for the egress policy. The default is the system resolver
/// (`tokio::net::lookup_host`); tests inject their own to play a rebinding DNS server.
pub trait Resolver: Send + Sync + std::fmt::Debug {
    fn lookup<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send + 'a>>;
}

/// Why the egress policy refuses a destination (or its own configuration), one variant per
/// reason. A refusal names a host or an address, never a DSN's user, password or database.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressError {
    /// An `egress_allow` entry that is not a network.
    #[error("{0:?} is not a network (like 10.1.0.0/16 or ::1/128)")]
    NotANetwork(String),
    #[error(
        "SQLite sources are not enabled: the operator allows them by setting \
         RECKON_SQLITE_SOURCE_DIR=/some/dir (or sqlite_source_dir = \"/some/dir\" in \
         reckon.toml), restarting reckon, and putting each tenant's files in \
         /some/dir/TENANT-SLUG/"
    )]
    SqliteDisabled,
    /// A policy not told whose source it checks: never the shared directory.
    #[error("SQLite sources are checked per tenant, and no tenant was given")]
    NoTenant,
    #[error("tenant {0:?} has no SQLite source directory (not a plain name)")]
    TenantNotPlain(String),
    #[error("host {0:?} could not be resolved")]
    Unresolved(String),
    #[error("host {0:?} has no address")]
    NoAddress(String),
    #[error("unix sockets and encoded hosts are not allowed")]
    SocketOrEncodedHost,
    /// reckon's own database, by address, name or file.
    #[error("the DSN points at reckon's own database")]
    OwnDatabase,
    /// An address (of `host`) that is not public and not allow-listed; `why` says what it
    /// is (`loopback`, `private`, `6to4 form of 10.0.0.1, a private`, ...).
    #[error("{}", forbidden_words(.host, *.ip, .why))]
    Forbidden {
        host: String,
        ip: IpAddr,
        why: String,
    },
    #[error("a provider URL must be http or https")]
    ProviderScheme,
    #[error("a provider URL needs a host")]
    ProviderNoHost,
    #[error("a SQLite source path may not contain '..'")]
    SqliteParentDir,
    #[error(
        "this tenant's SQLite source directory {dir} does not exist: the operator creates \
         it (mkdir -p {dir}) and puts the file there (the directory above it is \
         RECKON_SQLITE_SOURCE_DIR)",
        dir = .0.display()
    )]
    SqliteDirMissing(PathBuf),
    #[error("the SQLite source file does not exist")]
    SqliteMissing,
    #[error("a SQLite source must be a regular file")]
    SqliteNotAFile,
    /// A file outside the tenant's own directory (after following links).
    #[error(
        "this tenant's SQLite sources must be files inside {dir}/ (after following links); \
         other directories, including other tenants', are not allowed: the operator puts or \
         mounts the file there, making the directory if needed (mkdir -p {dir}); the \
         directory above it is RECKON_SQLITE_SOURCE_DIR (sqlite_source_dir in reckon.toml)",
        dir = .0.display()
    )]
    SqliteOutside(PathBuf),
}

/// The refusal of a forbidden address, with the way an operator allows it.
fn forbidden_words(host: &str, ip: IpAddr, why: &str) -> String {
    let what = if host.parse::<IpAddr>().is_ok_and(|h| canonical(h) == ip) {
        format!("host {host} is a {why} address")
    } else {
        format!("host {host:?} resolves to {ip}, a {why} address")
    };
    // The host's own address: allow-listed as such, it passes whatever it carries.
    let net = match ip {
        IpAddr::V4(_) => format!("{ip}/32"),
        IpAddr::V6(_) => format!("{ip}/128"),
    };
    format!(
        "{what}, not allowed by the operator's egress policy (egress_allow): the operator \
         allows it by adding its network to RECKON_EGRESS_ALLOW, e.g. \
         RECKON_EGRESS_ALLOW='[\"{net}\"]' (or egress_allow = [\"{net}\"] in reckon.toml), \
         and restarting reckon"
    )
}

/// A network `addr/prefix` (or a bare address: that one address), parsed by `ipnet`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network(IpNet);

impl Network {
    pub fn parse(s: &str) -> Result<Network, EgressError> {
        let s = s.trim();
        let net = s
            .parse::<IpNet>()
            .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
            .map_err(|_| EgressError::NotANetwork(s.to_owned()))?;
        Ok(Network(net.trunc()))
    }

    /// Whether `ip` is in this network. An IPv4-mapped or -compatible IPv6 address is the
    /// IPv4 address it carries, so `10.0.0.0/8` also covers `::ffff:10.0.0.1`.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.contains(&ip) || self.0.contains(&canonical(ip))
    }
}

/// IPv4-mapped (`::ffff:a.b.c.d`) and IPv4-compatible (`::a.b.c.d`) IPv6 addresses are the
/// IPv4 address they carry: the kernel connects to that address, so reckon connects to it
/// as IPv4 and judges it as such.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                if s[..6] == [0, 0, 0, 0, 0, 0] && !v6.is_loopback() && !v6.is_unspecified() {
                    IpAddr::V4(v4_at(v6, 96))
                } else {
                    IpAddr::V6(v6)
                }
            }
        },
        v4 @ IpAddr::V4(_) => v4,
    }
}

/// The 32 bits of `v6` starting at bit `at` (0 = most significant), as an IPv4 address.
fn v4_at(v6: Ipv6Addr, at: u32) -> Ipv4Addr {
    Ipv4Addr::from((u128::from(v6) >> (96 - at)) as u32)
}

/// The IPv4 addresses an IPv6 address leads to through a translation or tunnelling
/// mechanism, each with the mechanism's name. Such an address reaches the IPv4 address it
/// carries (a 6to4 relay, a Teredo relay, a SIIT or NAT64 translator does the rest), so
/// what it carries is judged like any IPv4 address: `2002:7f00:1::` is 127.0.0.1.
/// (IPv4-mapped and -compatible forms are turned into IPv4 by [`canonical`] first.)
fn embedded_v4(v6: Ipv6Addr) -> Vec<(&'static str, Ipv4Addr)> {
    let s = v6.segments();
    let bits = u128::from(v6);
    let mut out = Vec::new();
    if s[0] == 0x2002 {
        // 6to4 (RFC 3056): 2002:AABB:CCDD::/48, the site's IPv4 address in bits 16..48.
        out.push(("6to4", v4_at(v6, 16)));
    }
    if s[0] == 0x2001 && s[1] == 0 {
        // Teredo (RFC 4380): the client's address in the last 32 bits, every bit flipped;
        // the Teredo server's address in bits 32..64.
        out.push(("Teredo", Ipv4Addr::from(!(bits as u32))));
        out.push(("Teredo server", v4_at(v6, 32)));
    }
    if s[..6] == [0, 0, 0, 0, 0xffff, 0] {
        // SIIT's IPv4-translated form (RFC 2765): ::ffff:0:a.b.c.d.
        out.push(("SIIT", v4_at(v6, 96)));
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        // The well-known NAT64 prefix (RFC 6052): 64:ff9b::/96.
        out.push(("NAT64", v4_at(v6, 96)));
    }
    if s[..3] == [0x64, 0xff9b, 1] {
        // The local-use NAT64 prefix (RFC 8215) 64:ff9b:1::/48 may be used with any prefix
        // length RFC 6052 allows, and which one a site uses cannot be known from here, so
        // every position the IPv4 address could sit at is judged (bits 64..72 are the
        // reserved "u" octet, skipped), the common /96 first so a refusal names it. An
        // operator whose translator uses this prefix allow-lists it (or the part in use).
        for prefix in [96u32, 80, 72, 64, 56, 48] {
            let mut v4 = 0u32;
            let mut got = 0;
            let mut bit = prefix;
            while got < 32 {
                if !(64..72).contains(&bit) {
                    v4 = (v4 << 1) | ((bits >> (127 - bit)) & 1) as u32;
                    got += 1;
                }
                bit += 1;
            }
            out.push(("NAT64", Ipv4Addr::from(v4)));
        }
    }
    out
}

fn forbidden_v4(v4: Ipv4Addr) -> Option<&'static str> {
    let o = v4.octets();
    if v4.is_loopback() {
        Some("loopback")
    } else if v4.is_unspecified() || o[0] == 0 {
        Some("unspecified")
    } else if v4.is_private() {
        Some("private")
    } else if o[0] == 100 && (o[1] & 0xc0) == 64 {
        Some("shared (CGNAT)")
    } else if v4.is_link_local() {
        Some("link-local (cloud metadata)")
    } else if v4.is_multicast() || v4.is_broadcast() || o[0] >= 240 {
        Some("multicast or reserved")
    } else if v4.is_documentation() || (o[0] == 198 && (o[1] & 0xfe) == 18) {
        Some("documentation or benchmarking")
    } else if o[0] == 192 && o[1] == 0 && o[2] == 0 {
        Some("IETF protocol assignment")
    } else {
        None
    }
}

fn forbidden_v6(v6: Ipv6Addr) -> Option<&'static str> {
    let s = v6.segments();
    if v6.is_loopback() {
        Some("loopback")
    } else if v6.is_unspecified() {
        Some("unspecified")
    } else if (s[0] & 0xfe00) == 0xfc00 {
        Some("private (unique local)")
    } else if (s[0] & 0xffc0) == 0xfe80 {
        Some("link-local")
    } else if (s[0] & 0xffc0) == 0xfec0 {
        // Deprecated (RFC 3879) but still routed inside some sites: private, like ULA.
        Some("private (site-local)")
    } else if v6.is_multicast() {
        Some("multicast")
    } else if s[0] == 0x2001 && s[1] == 0x0db8 {
        Some("documentation")
    } else {
        None
    }
}

/// Every reason `ip` is not a public address, each with the address it is about: the
/// address itself, and each IPv4 address it carries ([`embedded_v4`]) named by its form.
/// Empty when it is public through and through.
fn judgements(ip: IpAddr) -> Vec<(IpAddr, String)> {
    match canonical(ip) {
        IpAddr::V4(v4) => forbidden_v4(v4)
            .map(|why| (IpAddr::V4(v4), why.to_owned()))
            .into_iter()
            .collect(),
        IpAddr::V6(v6) => {
            let mut out: Vec<(IpAddr, String)> = forbidden_v6(v6)
                .map(|why| (IpAddr::V6(v6), why.to_owned()))
                .into_iter()
                .collect();
            for (form, v4) in embedded_v4(v6) {
                if let Some(why) = forbidden_v4(v4) {
                    out.push((IpAddr::V4(v4), format!("{form} form of {v4}, a {why}")));
                }
            }
            out
        }
    }
}

/// Why an address is not a public one, or `None` when it is. An IPv6 address carrying an
/// IPv4 address (6to4, Teredo, SIIT, NAT64, mapped, compatible) is judged by what it
/// carries too.
pub fn forbidden_reason(ip: IpAddr) -> Option<String> {
    judgements(ip).into_iter().next().map(|(_, why)| why)
}

/// reckon's own database, which no source may name.
#[derive(Debug, Clone)]
pub enum OwnDatabase {
    /// Same server and same database name. (Another database on the same server is a
    /// tenant's business: its DSN's own credentials decide what it may read.)
    Network {
        host: String,
        port: u16,
        database: String,
    },
    File(PathBuf),
}

/// The operator's policy. The default allows no private network and no SQLite source.
#[derive(Debug, Clone, Default)]
pub struct EgressPolicy {
    allow: Vec<Network>,
    sqlite_root: Option<PathBuf>,
    /// The tenant whose sources are checked ([`EgressPolicy::for_tenant`]): its SQLite
    /// files live in `{sqlite_root}/{tenant}/`. `None`: every SQLite source is refused.
    tenant: Option<String>,
    own: Vec<OwnDatabase>,
    /// reckon's ledger identity ([`EgressPolicy::with_own_identity`]).
    own_identity: Option<String>,
    /// `None`: the system resolver.
    resolver: Option<Arc<dyn Resolver>>,
}

impl EgressPolicy {
    /// `allow`: networks sources may reach although not public (e.g. `10.0.0.0/8` for a
    /// private deployment, `127.0.0.0/8` in tests). `sqlite_root`: the directory whose
    /// per-tenant subdirectories (`{sqlite_root}/{tenant-slug}/`) SQLite sources must live
    /// in (`None`: SQLite sources are refused).
    pub fn new(
        allow: &[String],
        sqlite_root: Option<PathBuf>,
    ) -> Result<EgressPolicy, EgressError> {
        Ok(EgressPolicy {
            allow: allow
                .iter()
                .map(|s| Network::parse(s))
                .collect::<Result<_, _>>()?,
            sqlite_root,
            tenant: None,
            own: Vec::new(),
            own_identity: None,
            resolver: None,
        })
    }

    /// The same policy, checking the sources of the tenant `slug`: its SQLite sources must
    /// be inside `{sqlite_source_dir}/{slug}/`. Network rules do not depend on the tenant.
    pub fn for_tenant(&self, slug: &str) -> EgressPolicy {
        EgressPolicy {
            tenant: Some(slug.to_owned()),
            ..self.clone()
        }
    }

    /// The directory the current tenant's SQLite sources must be in, as configured (not
    /// canonicalised), or why there is none.
    pub fn sqlite_dir(&self) -> Result<PathBuf, EgressError> {
        let Some(root) = &self.sqlite_root else {
            return Err(EgressError::SqliteDisabled);
        };
        let Some(slug) = &self.tenant else {
            // A caller that did not say whose source this is: never the shared directory.
            return Err(EgressError::NoTenant);
        };
        let mut parts = Path::new(slug).components();
        let plain = matches!(parts.next(), Some(Component::Normal(_))) && parts.next().is_none();
        if !plain || slug.contains(['/', '\\']) {
            return Err(EgressError::TenantNotPlain(slug.clone()));
        }
        Ok(root.join(slug))
    }

    /// Resolve host names with `resolver` instead of the system's.
    pub fn with_resolver(mut self, resolver: Arc<dyn Resolver>) -> EgressPolicy {
        self.resolver = Some(resolver);
        self
    }

    pub fn with_own_database(mut self, own: OwnDatabase) -> EgressPolicy {
        self.own.push(own);
        self
    }

    /// reckon's own database by identity: `identity` is the value the ledger keeps in its
    /// `reckon_instance` row (`Ledger::instance_identity`). Every source connection
    /// ([`crate::SourceConn::open`], [`crate::SourceWriter::open`]) looks for it once
    /// connected and is refused if it can see it, so no address, port, proxy or alias that
    /// leads to reckon's database gets through; the address check of
    /// [`EgressPolicy::with_own_database`] only refuses the obvious ones before connecting.
    pub fn with_own_identity(mut self, identity: String) -> EgressPolicy {
        self.own_identity = Some(identity);
        self
    }

    /// The identity set by [`EgressPolicy::with_own_identity`], if any.
    pub fn own_identity(&self) -> Option<&str> {
        self.own_identity.as_deref()
    }

    fn allowed(&self, ip: IpAddr) -> bool {
        self.allow.iter().any(|n| n.contains(ip))
    }

    async fn resolve(&self, host: &str, port: u16) -> Result<Vec<IpAddr>, EgressError> {
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(vec![ip]);
        }
        let unresolved = |_| EgressError::Unresolved(host.to_owned());
        let addrs: Vec<IpAddr> = match &self.resolver {
            Some(r) => r.lookup(host, port).await.map_err(unresolved)?,
            None => tokio::net::lookup_host((host, port))
                .await
                .map_err(unresolved)?
                .map(|a| a.ip())
                .collect(),
        };
        if addrs.is_empty() {
            return Err(EgressError::NoAddress(host.to_owned()));
        }
        Ok(addrs)
    }

    /// Check `dsn` like [`EgressPolicy::check`] and return the DSN to connect with: for a
    /// network DSN, its host replaced by the checked address (the name is resolved once,
    /// here), unless its TLS mode verifies the server's name (see the module's notes).
    pub async fn pin(&self, dsn: &SourceDsn) -> Result<SourceDsn, EgressError> {
        match dsn {
            SourceDsn::Sqlite { path } => {
                self.check_sqlite(path)?;
                Ok(dsn.clone())
            }
            SourceDsn::Network {
                dialect,
                host,
                port,
                user,
                password,
                database,
                ssl_mode,
            } => {
                let addrs = self.check_network(host, *port, database).await?;
                let verifies_name = ssl_mode.as_deref().is_some_and(|m| {
                    m.eq_ignore_ascii_case("verify-full")
                        || m.eq_ignore_ascii_case("verify_identity")
                });
                if verifies_name {
                    return Ok(dsn.clone());
                }
                Ok(SourceDsn::Network {
                    dialect: *dialect,
                    host: addrs[0].to_string(),
                    port: *port,
                    user: user.clone(),
                    password: password.clone(),
                    database: database.clone(),
                    ssl_mode: ssl_mode.clone(),
                })
            }
        }
    }

    /// May a source connect where `dsn` points? The answer names the reason, never the DSN's
    /// password.
    pub async fn check(&self, dsn: &SourceDsn) -> Result<(), EgressError> {
        match dsn {
            SourceDsn::Sqlite { path } => self.check_sqlite(path),
            SourceDsn::Network {
                host,
                port,
                database,
                ..
            } => self.check_network(host, *port, database).await.map(|_| ()),
        }
    }

    /// The check when a person adds or edits a source (T08, T12 at save): everything
    /// [`EgressPolicy::check`] refuses is refused, except what may still change before the
    /// first connection: a host name that does not resolve now, a SQLite file not there
    /// yet (its path must still be inside the tenant's directory as written). Every
    /// connection is checked again ([`EgressPolicy::pin`]).
    pub async fn check_at_save(&self, dsn: &SourceDsn) -> Result<(), EgressError> {
        match dsn {
            SourceDsn::Sqlite { path } => {
                let dir = self.sqlite_dir()?;
                if path.components().any(|c| matches!(c, Component::ParentDir)) {
                    return Err(EgressError::SqliteParentDir);
                }
                if path.symlink_metadata().is_ok() {
                    return self.check_sqlite(path);
                }
                // Not there yet: inside the tenant's directory as written (or as the
                // directory really is, when it exists).
                let real_dir = dir.canonicalize().ok();
                if path.starts_with(&dir) || real_dir.is_some_and(|d| path.starts_with(d)) {
                    Ok(())
                } else {
                    Err(EgressError::SqliteOutside(dir))
                }
            }
            SourceDsn::Network {
                host,
                port,
                database,
                ..
            } => {
                if host.parse::<IpAddr>().is_err() && self.resolve(host, *port).await.is_err() {
                    // Does not resolve (yet): judged at every connection.
                    return Ok(());
                }
                self.check_network(host, *port, database).await.map(|_| ())
            }
        }
    }

    /// The checked addresses of a network DSN's host (every one allowed), or why not.
    async fn check_network(
        &self,
        host: &str,
        port: u16,
        database: &str,
    ) -> Result<Vec<IpAddr>, EgressError> {
        if host.starts_with('/') || host.contains('%') || host.contains('\\') {
            return Err(EgressError::SocketOrEncodedHost);
        }
        let addrs = self.resolve(host, port).await?;
        let mut own_addrs = Vec::new();
        for own in &self.own {
            if let OwnDatabase::Network {
                host: oh,
                port: op,
                database: od,
            } = own
                && *op == port
                && od == database
            {
                own_addrs.extend(self.resolve(oh, *op).await.unwrap_or_default());
                if oh.eq_ignore_ascii_case(host) {
                    return Err(EgressError::OwnDatabase);
                }
            }
        }
        let mut checked = Vec::with_capacity(addrs.len());
        for ip in addrs {
            let ip = canonical(ip);
            if own_addrs.iter().any(|o| canonical(*o) == ip) {
                return Err(EgressError::OwnDatabase);
            }
            self.refuse_forbidden(host, ip)?;
            checked.push(ip);
        }
        Ok(checked)
    }

    /// `Err` naming why when `ip` (an address of `host`) is not public and not allowed.
    /// An address that carries another (6to4, Teredo, NAT64, ...) passes only when the
    /// address and everything it carries are public or allow-listed, each on its own.
    /// An address the operator allow-listed as such passes whatever it carries.
    fn refuse_forbidden(&self, host: &str, ip: IpAddr) -> Result<(), EgressError> {
        if self.allowed(ip) {
            return Ok(());
        }
        for (about, why) in judgements(ip) {
            if self.allowed(about) {
                continue;
            }
            return Err(EgressError::Forbidden {
                host: host.to_owned(),
                ip,
                why,
            });
        }
        Ok(())
    }

    /// The addresses a provider's host may be connected at: resolved (with this policy's
    /// resolver) and every one checked, or why not. The provider HTTP client resolves
    /// through this at every connection (T09), so it only ever connects to an address
    /// that passed the check.
    pub async fn provider_addresses(
        &self,
        host: &str,
        port: u16,
    ) -> Result<Vec<IpAddr>, EgressError> {
        let addrs = self.resolve(host, port).await?;
        let mut checked = Vec::with_capacity(addrs.len());
        for ip in addrs {
            let ip = canonical(ip);
            self.refuse_forbidden(host, ip)?;
            checked.push(ip);
        }
        Ok(checked)
    }

    /// May a provider lookup go to `url`? Tenants name their providers' base URLs, so a
    /// URL is hostile input like a DSN: no loopback, private or link-local address unless
    /// the operator allows it. Checked before every reconcile step (a name that re-resolves
    /// elsewhere is caught at the next step, not mid-step).
    pub async fn check_url(&self, url: &url::Url) -> Result<(), EgressError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(EgressError::ProviderScheme);
        }
        let host = match url.host() {
            Some(url::Host::Domain(d)) => d.to_owned(),
            Some(url::Host::Ipv4(ip)) => ip.to_string(),
            Some(url::Host::Ipv6(ip)) => ip.to_string(),
            None => return Err(EgressError::ProviderNoHost),
        };
        let port = url.port_or_known_default().unwrap_or(443);
        self.provider_addresses(&host, port).await.map(|_| ())
    }

    /// The connection-time check of a SQLite source: an existing regular file inside the
    /// tenant's directory after every link is followed, and not reckon's own database.
    fn check_sqlite(&self, path: &Path) -> Result<(), EgressError> {
        let dir = self.sqlite_dir()?;
        if path.components().any(|c| matches!(c, Component::ParentDir)) {
            return Err(EgressError::SqliteParentDir);
        }
        let Ok(real_dir) = dir.canonicalize() else {
            return Err(EgressError::SqliteDirMissing(dir));
        };
        // Resolves every symlink: a link inside the directory pointing out of it (to
        // another tenant's directory, say) is caught.
        let real = path
            .canonicalize()
            .map_err(|_| EgressError::SqliteMissing)?;
        if !real.starts_with(&real_dir) {
            return Err(EgressError::SqliteOutside(dir));
        }
        if !real.is_file() {
            return Err(EgressError::SqliteNotAFile);
        }
        for own in &self.own {
            if let OwnDatabase::File(f) = own
                && f.canonicalize().is_ok_and(|f| f == real)
            {
                return Err(EgressError::OwnDatabase);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dsn::Dialect;

    fn pg(dsn: &str) -> SourceDsn {
        SourceDsn::parse(Dialect::Postgres, dsn).unwrap()
    }

    #[tokio::test]
    async fn non_public_addresses_are_refused_unless_allow_listed() {
        let strict = EgressPolicy::default();
        for (host, why) in [
            ("127.0.0.1", "loopback"),
            ("127.8.9.10", "loopback"),
            ("[::1]", "loopback"),
            ("localhost", "loopback"),
            ("0.0.0.0", "unspecified"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("192.168.1.1", "private"),
            ("100.64.0.1", "CGNAT"),
            ("169.254.169.254", "link-local"),
            ("[fe80::1]", "link-local"),
            ("[fd00::1]", "unique local"),
            ("[::ffff:127.0.0.1]", "loopback"),
            ("[::ffff:169.254.169.254]", "link-local"),
            ("224.0.0.1", "multicast"),
            ("2130706433", "loopback"), // decimal 127.0.0.1, as the URL parser normalises it
            ("0x7f.1", "loopback"),
        ] {
            let e = strict
                .check(&pg(&format!("postgres://u:pw@{host}/db")))
                .await
                .expect_err(host);
            assert!(matches!(e, EgressError::Forbidden { .. }), "{host}: {e:?}");
            assert!(e.to_string().contains(why), "{host}: {e}");
            assert!(!e.to_string().contains("pw"), "{e}");
        }
        let tests = EgressPolicy::new(&["127.0.0.0/8".into(), "::1".into()], None).unwrap();
        assert!(
            tests
                .check(&pg("postgres://u:p@127.0.0.1/db"))
                .await
                .is_ok()
        );
        assert!(tests.check(&pg("postgres://u:p@[::1]/db")).await.is_ok());
        assert!(
            tests
                .check(&pg("postgres://u:p@10.0.0.1/db"))
                .await
                .is_err()
        );
        assert!(
            tests
                .check(&pg("postgres://u:p@93.184.216.34/db"))
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn reckons_own_database_is_refused_even_when_allow_listed() {
        let p = EgressPolicy::new(&["127.0.0.0/8".into()], None)
            .unwrap()
            .with_own_database(OwnDatabase::Network {
                host: "localhost".into(),
                port: 5432,
                database: "reckon".into(),
            });
        for dsn in [
            "postgres://u:p@127.0.0.1:5432/reckon",
            "postgres://u:p@localhost/reckon",
            "postgres://u:p@[::ffff:127.0.0.1]/reckon",
        ] {
            let e = p.check(&pg(dsn)).await.expect_err(dsn);
            assert_eq!(e, EgressError::OwnDatabase, "{dsn}");
            assert!(e.to_string().contains("own database"), "{dsn}: {e}");
        }
        assert!(
            p.check(&pg("postgres://u:p@127.0.0.1:5433/reckon"))
                .await
                .is_ok()
        );
        assert!(
            p.check(&pg("postgres://u:p@127.0.0.1:5432/shop"))
                .await
                .is_ok()
        );
    }

    /// T12: each tenant's SQLite sources are confined to `{dir}/{slug}/`, at save and at
    /// connect: another tenant's file (named directly, through `..`, or through a link in
    /// the tenant's own directory), the shared directory itself, anything outside, reckon's
    /// own file and a policy that was not told the tenant are all refused.
    #[tokio::test]
    async fn sqlite_paths_stay_inside_the_tenants_own_directory() {
        let base = tempfile::tempdir().unwrap();
        let root = base.path().join("sources");
        let (a, b) = (root.join("acme"), root.join("beta"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let inside = a.join("shop.db");
        let theirs = b.join("shop.db");
        let shared = root.join("shared.db");
        let outside = base.path().join("secret.db");
        let own = a.join("reckon.db");
        for f in [&inside, &theirs, &shared, &outside, &own] {
            std::fs::write(f, b"x").unwrap();
        }
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(&outside, a.join("link.db")).unwrap();
            std::os::unix::fs::symlink(&theirs, a.join("theirs.db")).unwrap();
            std::os::unix::fs::symlink(&b, a.join("beta-dir")).unwrap();
        }
        let operator = EgressPolicy::new(&[], Some(root.clone()))
            .unwrap()
            .with_own_database(OwnDatabase::File(own.clone()));
        let p = operator.for_tenant("acme");
        let sq = |p: &Path| SourceDsn::Sqlite {
            path: p.to_path_buf(),
        };
        assert!(p.check(&sq(&inside)).await.is_ok());
        assert!(p.check_at_save(&sq(&inside)).await.is_ok());
        // Not there yet: fine to save (inside the directory as written), refused to open.
        assert!(p.check_at_save(&sq(&a.join("later.db"))).await.is_ok());
        assert_eq!(
            p.check(&sq(&a.join("later.db"))).await,
            Err(EgressError::SqliteMissing)
        );
        let out = || EgressError::SqliteOutside(a.clone());
        for (bad, at_save, at_connect) in [
            (theirs.clone(), out(), out()),
            (
                a.join("../beta/shop.db"),
                EgressError::SqliteParentDir,
                EgressError::SqliteParentDir,
            ),
            (a.join("theirs.db"), out(), out()),
            (a.join("beta-dir/shop.db"), out(), out()),
            (shared.clone(), out(), out()),
            (outside.clone(), out(), out()),
            (
                root.join("../secret.db"),
                EgressError::SqliteParentDir,
                EgressError::SqliteParentDir,
            ),
            (a.join("link.db"), out(), out()),
            (
                a.clone(),
                EgressError::SqliteNotAFile,
                EgressError::SqliteNotAFile,
            ),
            (
                own.clone(),
                EgressError::OwnDatabase,
                EgressError::OwnDatabase,
            ),
            (b.join("later.db"), out(), EgressError::SqliteMissing),
        ] {
            let saved = p.check_at_save(&sq(&bad)).await;
            let opened = p.check(&sq(&bad)).await;
            assert_eq!(saved, Err(at_save), "saved: {}", bad.display());
            assert_eq!(opened, Err(at_connect), "opened: {}", bad.display());
        }
        let e = p.check_at_save(&sq(&theirs)).await.unwrap_err();
        assert!(e.to_string().contains(&format!("{}/", a.display())), "{e}");
        let e = p.check(&sq(&a.join("theirs.db"))).await.unwrap_err();
        assert!(e.to_string().contains("other tenants'"), "{e}");
        // The other tenant, with the same operator policy, has the mirror image.
        let pb = operator.for_tenant("beta");
        assert!(pb.check(&sq(&theirs)).await.is_ok());
        assert!(pb.check(&sq(&inside)).await.is_err());
        // No tenant given, an odd slug, or no directory configured: nothing is allowed.
        let e = operator.check(&sq(&inside)).await.unwrap_err();
        assert_eq!(e, EgressError::NoTenant);
        assert!(e.to_string().contains("per tenant"), "{e}");
        assert_eq!(
            operator.check_at_save(&sq(&inside)).await,
            Err(EgressError::NoTenant)
        );
        for slug in ["..", ".", "acme/..", ""] {
            assert_eq!(
                operator.for_tenant(slug).check(&sq(&inside)).await,
                Err(EgressError::TenantNotPlain(slug.into())),
                "{slug:?}"
            );
        }
        let none = EgressPolicy::default().for_tenant("acme");
        let e = none.check_at_save(&sq(&inside)).await.unwrap_err();
        assert_eq!(e, EgressError::SqliteDisabled);
        assert!(e.to_string().contains("not enabled"), "{e}");
    }

    /// T08 at save: what can be judged when a person saves a DSN is refused then, with the
    /// reason; a name that does not resolve yet is left to the connection-time check.
    #[tokio::test]
    async fn network_dsns_are_judged_at_save_as_far_as_they_can_be() {
        let strict = EgressPolicy::default().with_resolver(rebinding(&["10.9.8.7"]));
        let e = strict
            .check_at_save(&pg("postgres://u:pw@10.0.0.1/db"))
            .await
            .unwrap_err();
        assert!(
            e.to_string().contains("host 10.0.0.1 is a private address"),
            "{e}"
        );
        assert!(e.to_string().contains("egress policy"), "{e}");
        let e = strict
            .check_at_save(&pg("postgres://u:pw@db.internal/db"))
            .await
            .unwrap_err();
        assert_eq!(
            e,
            EgressError::Forbidden {
                host: "db.internal".into(),
                ip: "10.9.8.7".parse().unwrap(),
                why: "private".into(),
            }
        );
        assert!(
            e.to_string().contains("resolves to 10.9.8.7, a private"),
            "{e}"
        );
        assert!(!e.to_string().contains("pw"), "{e}");
        #[derive(Debug)]
        struct Nothing;
        impl Resolver for Nothing {
            fn lookup<'a>(
                &'a self,
                _host: &'a str,
                _port: u16,
            ) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send + 'a>>
            {
                Box::pin(async { Err(std::io::Error::other("NXDOMAIN")) })
            }
        }
        let unresolved = EgressPolicy::default().with_resolver(Arc::new(Nothing));
        let later = pg("postgres://u:pw@not-yet.example/db");
        assert!(unresolved.check_at_save(&later).await.is_ok());
        assert_eq!(
            unresolved.check(&later).await,
            Err(EgressError::Unresolved("not-yet.example".into()))
        );
        let public = EgressPolicy::default().with_resolver(rebinding(&["93.184.216.34"]));
        assert!(
            public
                .check_at_save(&pg("postgres://u:pw@db.example/db"))
                .await
                .is_ok()
        );
    }

    /// A DNS server that answers each lookup with the next of its answers (the last one
    /// again when they run out), and counts the lookups.
    #[derive(Debug)]
    struct Rebinding {
        answers: Vec<IpAddr>,
        calls: std::sync::atomic::AtomicUsize,
    }

    impl Resolver for Rebinding {
        fn lookup<'a>(
            &'a self,
            _host: &'a str,
            _port: u16,
        ) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send + 'a>> {
            let n = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let ip = self.answers[n.min(self.answers.len() - 1)];
            Box::pin(async move { Ok(vec![ip]) })
        }
    }

    fn rebinding(answers: &[&str]) -> Arc<Rebinding> {
        Arc::new(Rebinding {
            answers: answers.iter().map(|a| a.parse().unwrap()).collect(),
            calls: Default::default(),
        })
    }

    fn host_of(dsn: &SourceDsn) -> String {
        match dsn {
            SourceDsn::Network { host, .. } => host.clone(),
            SourceDsn::Sqlite { .. } => panic!("not a network DSN"),
        }
    }

    /// T09: the name answers a public address to the check, then 127.0.0.1. The DSN to
    /// connect with carries the checked address, so the second answer is never used; asking
    /// again (the next connection) gets the loopback answer, which is refused.
    #[tokio::test]
    async fn a_rebinding_name_is_connected_to_at_the_address_that_was_checked() {
        let dns = rebinding(&["93.184.216.34", "127.0.0.1"]);
        let p = EgressPolicy::default().with_resolver(dns.clone());
        let dsn = pg("postgres://u:pw@rebind.example/db");
        let pinned = p.pin(&dsn).await.unwrap();
        assert_eq!(host_of(&pinned), "93.184.216.34");
        assert_eq!(dns.calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        let e = p.pin(&dsn).await.unwrap_err();
        assert!(e.to_string().contains("loopback"), "{e}");
        assert!(p.check(&dsn).await.is_err());
        // A name-verifying TLS mode keeps the name (the certificate is checked against it).
        let p = EgressPolicy::default().with_resolver(rebinding(&["93.184.216.34"]));
        let tls = pg("postgres://u:pw@rebind.example/db?sslmode=verify-full");
        assert_eq!(host_of(&p.pin(&tls).await.unwrap()), "rebind.example");
    }

    /// The same against a real server: `rebind.invalid` exists only in the test's resolver,
    /// which answers 127.0.0.1 (allowed here, MariaDB listens there) and then the metadata
    /// address. The connection succeeds, so it went to the checked address: nothing
    /// resolved the name a second time.
    #[tokio::test]
    async fn the_scan_connection_uses_the_pinned_address() {
        let dns = rebinding(&["127.0.0.1", "169.254.169.254"]);
        let p = EgressPolicy::new(&["127.0.0.0/8".into()], None)
            .unwrap()
            .with_resolver(dns.clone());
        let dsn =
            SourceDsn::parse(Dialect::Mysql, "mysql://root@rebind.invalid:3306/test").unwrap();
        let pinned = p.pin(&dsn).await.unwrap();
        let conn = crate::SourceConn::open(&pinned, "justonce_keys", &p)
            .await
            .expect("MariaDB on 127.0.0.1:3306 (root, no password) is needed for this test");
        conn.close().await;
        assert_eq!(dns.calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        let e = p.pin(&dsn).await.unwrap_err();
        assert!(e.to_string().contains("link-local"), "{e}");
    }

    /// Checks that `host` (an IPv6 literal) is refused by the default policy with a reason
    /// containing `why`, and that `public` (the same form carrying a public IPv4 address)
    /// is accepted.
    async fn judged_by_what_it_carries(host: &str, why: &str, public: &str) {
        let strict = EgressPolicy::default();
        let e = strict
            .check(&pg(&format!("postgres://u:pw@[{host}]/db")))
            .await
            .expect_err(host);
        assert!(e.to_string().contains(why), "{host}: {e}");
        assert!(e.to_string().contains("egress_allow"), "{host}: {e}");
        strict
            .check(&pg(&format!("postgres://u:pw@[{public}]/db")))
            .await
            .unwrap_or_else(|e| panic!("{public}: {e}"));
    }

    #[tokio::test]
    async fn six_to_four_addresses_are_judged_by_the_ipv4_address_they_carry() {
        judged_by_what_it_carries(
            "2002:7f00:1::",
            "6to4 form of 127.0.0.1, a loopback",
            "2002:5db8:d822::1",
        )
        .await;
        judged_by_what_it_carries(
            "2002:a9fe:a9fe::",
            "6to4 form of 169.254.169.254, a link-local",
            "2002:808:808::",
        )
        .await;
        judged_by_what_it_carries(
            "2002:0a00:0001:1::5",
            "6to4 form of 10.0.0.1, a private",
            "2002:808:808::",
        )
        .await;
    }

    #[tokio::test]
    async fn teredo_addresses_are_judged_by_the_client_address_they_carry() {
        // Client 127.0.0.1 is stored as its complement, 0x80fffffe; server 65.54.227.120.
        judged_by_what_it_carries(
            "2001:0:4136:e378:8000:63bf:80ff:fffe",
            "Teredo form of 127.0.0.1, a loopback",
            "2001:0:4136:e378:8000:63bf:a247:f7f7",
        )
        .await;
        // Client 169.254.169.254 (complement 0x56015601).
        judged_by_what_it_carries(
            "2001:0:4136:e378:8000:63bf:5601:5601",
            "Teredo form of 169.254.169.254",
            "2001:0:4136:e378:8000:63bf:a247:f7f7",
        )
        .await;
        // A private Teredo server is refused too.
        judged_by_what_it_carries(
            "2001:0:a00:1:8000:63bf:a247:f7f7",
            "Teredo server form of 10.0.0.1",
            "2001:0:4136:e378:8000:63bf:a247:f7f7",
        )
        .await;
    }

    #[tokio::test]
    async fn siit_translated_addresses_are_judged_by_the_ipv4_address_they_carry() {
        judged_by_what_it_carries(
            "::ffff:0:127.0.0.1",
            "SIIT form of 127.0.0.1, a loopback",
            "::ffff:0:8.8.8.8",
        )
        .await;
        judged_by_what_it_carries(
            "::ffff:0:169.254.169.254",
            "SIIT form of 169.254.169.254",
            "::ffff:0:8.8.8.8",
        )
        .await;
    }

    #[tokio::test]
    async fn nat64_addresses_are_judged_by_the_ipv4_address_they_carry() {
        // The well-known prefix: a public address through NAT64 is a public address.
        judged_by_what_it_carries(
            "64:ff9b::127.0.0.1",
            "NAT64 form of 127.0.0.1, a loopback",
            "64:ff9b::8.8.8.8",
        )
        .await;
        judged_by_what_it_carries(
            "64:ff9b::169.254.169.254",
            "NAT64 form of 169.254.169.254",
            "64:ff9b::8.8.8.8",
        )
        .await;
        judged_by_what_it_carries(
            "64:ff9b::10.1.2.3",
            "NAT64 form of 10.1.2.3, a private",
            "64:ff9b::8.8.8.8",
        )
        .await;
        // The local-use prefix with a /96 translator, and with a /48 one (the address split
        // around the reserved octet: 10.0 in bits 48..64, 0.1 in bits 72..88). A public
        // address in every position it could be read from passes.
        judged_by_what_it_carries(
            "64:ff9b:1::10.0.0.1",
            "NAT64 form of 10.0.0.1, a private",
            "64:ff9b:1:808:8:808:808:808",
        )
        .await;
        judged_by_what_it_carries(
            "64:ff9b:1:a00:0:100::",
            "NAT64 form of",
            "64:ff9b:1:808:8:808:808:808",
        )
        .await;
        let at_48: Ipv6Addr = "64:ff9b:1:a9fe:a9:fe00::".parse().unwrap();
        assert!(
            embedded_v4(at_48).contains(&("NAT64", Ipv4Addr::new(169, 254, 169, 254))),
            "{:?}",
            embedded_v4(at_48)
        );
        let at_48: Ipv6Addr = "64:ff9b:1:a00:0:100::".parse().unwrap();
        assert!(embedded_v4(at_48).contains(&("NAT64", Ipv4Addr::new(10, 0, 0, 1))));
        // A site whose translator uses the local-use prefix allow-lists it.
        let site = EgressPolicy::new(&["64:ff9b:1::/96".into()], None).unwrap();
        assert!(
            site.check(&pg("postgres://u:p@[64:ff9b:1::8.8.8.8]/db"))
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn ipv4_compatible_and_mapped_addresses_are_judged_by_the_ipv4_address_they_carry() {
        judged_by_what_it_carries("::127.0.0.2", "loopback", "::8.8.8.8").await;
        judged_by_what_it_carries("::169.254.169.254", "link-local", "::8.8.8.8").await;
        judged_by_what_it_carries("::ffff:127.0.0.1", "loopback", "::ffff:8.8.8.8").await;
        judged_by_what_it_carries("::ffff:10.0.0.1", "private", "::ffff:8.8.8.8").await;
    }

    #[tokio::test]
    async fn site_local_addresses_are_refused() {
        judged_by_what_it_carries("fec0::1", "site-local", "2606:4700::1").await;
        judged_by_what_it_carries("feff:ffff::1", "site-local", "2606:4700::1").await;
    }

    /// Allowing the network an embedded address is in lets its forms through, and nothing
    /// else: allowing 127.0.0.0/8 does not allow the 6to4 form of 10.0.0.1.
    #[tokio::test]
    async fn allow_listing_judges_the_carried_address_on_its_own() {
        let p = EgressPolicy::new(&["127.0.0.0/8".into()], None).unwrap();
        for ok in ["2002:7f00:1::", "64:ff9b::127.0.0.1", "::ffff:0:127.0.0.1"] {
            p.check(&pg(&format!("postgres://u:p@[{ok}]/db")))
                .await
                .unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in [
            "2002:a00:1::",
            "64:ff9b::10.0.0.1",
            "::ffff:0:169.254.169.254",
        ] {
            assert!(
                p.check(&pg(&format!("postgres://u:p@[{bad}]/db")))
                    .await
                    .is_err(),
                "{bad}"
            );
        }
    }

    /// Each refusal of a provider URL or a network DSN's host is its own variant, so a
    /// caller can tell them apart without reading the words.
    #[tokio::test]
    async fn provider_urls_and_hosts_are_refused_by_reason() {
        let strict = EgressPolicy::default();
        let url = |u: &str| url::Url::parse(u).unwrap();
        assert_eq!(
            strict.check_url(&url("ftp://93.184.216.34/")).await,
            Err(EgressError::ProviderScheme)
        );
        assert!(matches!(
            strict.check_url(&url("http://127.0.0.1/")).await,
            Err(EgressError::Forbidden { .. })
        ));
        assert_eq!(
            strict.check_url(&url("mailto:x@example.com")).await,
            Err(EgressError::ProviderScheme)
        );
        let socket = SourceDsn::Network {
            dialect: Dialect::Postgres,
            host: "/var/run/postgresql".into(),
            port: 5432,
            user: "u".into(),
            password: None,
            database: "db".into(),
            ssl_mode: None,
        };
        assert_eq!(
            strict.check(&socket).await,
            Err(EgressError::SocketOrEncodedHost)
        );
    }

    #[test]
    fn networks_parse_and_match() {
        let n = Network::parse("10.1.0.0/16").unwrap();
        assert!(n.contains("10.1.200.3".parse().unwrap()));
        assert!(!n.contains("10.2.0.1".parse().unwrap()));
        assert!(n.contains("::ffff:10.1.0.9".parse().unwrap()));
        for bad in ["10.0.0.0/33", "nonsense", "10.0.0.0/"] {
            assert_eq!(
                Network::parse(bad),
                Err(EgressError::NotANetwork(bad.into()))
            );
        }
        assert!(
            Network::parse("10.1.2.3")
                .unwrap()
                .contains("10.1.2.3".parse().unwrap())
        );
        assert!(
            !Network::parse("10.1.2.3")
                .unwrap()
                .contains("10.1.2.4".parse().unwrap())
        );
        assert!(
            Network::parse(" fd00::/8 ")
                .unwrap()
                .contains("fd12::1".parse().unwrap())
        );
        assert!(
            Network::parse("0.0.0.0/0")
                .unwrap()
                .contains("8.8.8.8".parse().unwrap())
        );
        assert!(forbidden_reason(IpAddr::V6(Ipv6Addr::LOCALHOST)).is_some());
        assert!(forbidden_reason("8.8.8.8".parse().unwrap()).is_none());
    }
}
