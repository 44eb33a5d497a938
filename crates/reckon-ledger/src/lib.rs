//! reckon's own store. One trait, [`Ledger`], with two implementations chosen by URL scheme
//! at start: SQLite (the embedded default) and PostgreSQL. Every method that touches tenant
//! data takes a [`TenantId`], which only this crate can make (from a slug it looked up or a
//! token it authenticated), so no caller can build a query without a tenant.

mod accounts;
mod actions;
mod audit;
mod dashboard;
mod driver;
mod effects;
mod lease;
mod metrics;
mod model;
mod pools;
mod postgres;
mod providers;
mod reconcile;
mod rows;
mod scope;
mod scrub;
mod sources;
mod sqlite;
mod store;
mod writeback;

pub use accounts::{
    Accounts, Admission, NewSession, SessionGrant, ThrottlePolicy, TokenCreator, TokenInfo, User,
    UserCredentials,
};
pub use actions::{Action, ActionLog, NewAction};
pub use audit::{
    ALL_PROVIDERS, AuditGlance, AuditMetric, AuditRun, AuditRunHead, AuditSettings, Audits,
    ChainBreak, ChainLink, NewAuditRun, SCHEDULE_AUTHOR, StoredCharge, canonical_json,
    failing_audits, run_digest, verify_chain, verify_content, verify_links,
};
pub use dashboard::{
    Dashboard, KindSummary, OperationBacklog, ProviderHealth, QueueQuery, QueueRow, ReplayClosing,
    Snapshot, hour_of, snapshot_of,
};
pub use effects::Effects;
pub use lease::Leases;
pub use metrics::{
    MetricsQuery, MetricsSnapshot, ProviderLastLookup, QuarantineGroup, SourceHealth,
    UnresolvedGroup,
};
pub use model::*;
pub use pools::operator_view;
pub use providers::{NewProvider, Provider, ProviderChange, Providers, Route};
pub use reckon_domain::ProviderKind;
pub use reckon_domain::ingest::ingest_plan;
pub use reckon_keyring::{Keyring, KeyringError};
pub use reconcile::*;
pub use scrub::{SCRUB_ACTION, ScrubReport};
pub use sources::{Sources, Tenants};
pub use store::{RotateReport, Store};
pub use writeback::{
    NewWriteback, Writeback, WritebackAction, WritebackCandidate, WritebackPolicy, WritebackStatus,
    Writebacks,
};

use std::path::Path;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0} already exists")]
    Conflict(String),
    #[error("invalid input: {0}")]
    Invalid(String),
    #[error(
        "unsupported ledger URL scheme {0:?}: use a postgres:// URL, or leave RECKON_DATABASE_URL unset for the embedded SQLite ledger"
    )]
    UnsupportedScheme(String),
    #[error(
        "secret could not be decrypted (wrong master key, or the stored value was tampered with)"
    )]
    Decrypt,
    /// The write was fenced by a lease that expired or changed hands: nothing was written.
    #[error("lease {0:?} was lost (expired or taken over): nothing was written")]
    LeaseLost(String),
    /// The configured master key does not open this ledger's secrets.
    #[error(
        "the master key does not open this ledger's secrets: set RECKON_MASTER_KEY to the key \
         the ledger was created with (or restore the master.key file). reckon will not start \
         with another key, which would make every stored secret unreadable"
    )]
    WrongMasterKey,
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("ledger database error: {0}")]
    Database(#[source] sqlx::Error),
}

impl From<sqlx::Error> for LedgerError {
    fn from(e: sqlx::Error) -> Self {
        if let Some(db) = e.as_database_error()
            && db.is_unique_violation()
        {
            return LedgerError::Conflict("a row with the same unique key".into());
        }
        LedgerError::Database(e)
    }
}

impl LedgerError {
    /// A unique-key conflict named for what it was about (`tenant "acme"`); any other
    /// error as it is.
    pub(crate) fn named(self, what: impl FnOnce() -> String) -> LedgerError {
        match self {
            LedgerError::Conflict(_) => LedgerError::Conflict(what()),
            other => other,
        }
    }
}

pub type Result<T, E = LedgerError> = std::result::Result<T, E>;

/// The ledger's connection pool at one instant (`Ledger::pool_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStatus {
    /// Open connections waiting for a user.
    pub idle: u32,
    /// Open connections lent out now.
    pub in_use: u32,
    /// The most the pool will open.
    pub max: u32,
}

impl PoolStatus {
    /// From sqlx's own counts (`size` counts idle and lent connections together).
    pub fn of<DB: sqlx::Database>(pool: &sqlx::Pool<DB>) -> PoolStatus {
        let size = pool.size();
        let idle = u32::try_from(pool.num_idle()).unwrap_or(u32::MAX).min(size);
        PoolStatus {
            idle,
            in_use: size - idle,
            max: pool.options().get_max_connections(),
        }
    }
}

/// The aggregates, listed once for the supertrait and its blanket impl.
macro_rules! ledger {
    ($($aggregate:ident),*) => {
        /// reckon's store: one trait per aggregate, each implemented once for both databases
        /// in the module of its name. See ARCHITECTURE.md for the invariants every
        /// implementation keeps. Callers hold `Arc<dyn Ledger>`; every aggregate's methods
        /// are callable on it.
        pub trait Ledger: $($aggregate +)* Send + Sync + 'static {}

        impl<T> Ledger for T where T: $($aggregate +)* Send + Sync + 'static {}
    };
}

ledger!(
    Store,
    Tenants,
    Accounts,
    Sources,
    Effects,
    Providers,
    Reconciliation,
    Writebacks,
    Leases,
    ActionLog,
    Audits,
    Dashboard
);

/// Open the ledger named by `url`, or the embedded SQLite file in `data_dir` when `url` is
/// `None`. An unknown scheme is an error, never a fallback.
pub async fn connect(
    url: Option<&str>,
    data_dir: &Path,
    keyring: Keyring,
) -> Result<Arc<dyn Ledger>> {
    let ledger = open(url, data_dir, keyring).await?;
    ledger.check_keyring().await?;
    Ok(ledger)
}

async fn open(url: Option<&str>, data_dir: &Path, keyring: Keyring) -> Result<Arc<dyn Ledger>> {
    match url {
        None => Ok(Arc::new(
            sqlite::SqliteLedger::open_file(&data_dir.join("reckon.db"), keyring).await?,
        )),
        Some(u) if u.starts_with("sqlite:") => {
            Ok(Arc::new(sqlite::SqliteLedger::open_url(u, keyring).await?))
        }
        Some(u) if u.starts_with("postgres://") || u.starts_with("postgresql://") => {
            Ok(Arc::new(postgres::PgLedger::open(u, keyring).await?))
        }
        Some(u) => {
            let scheme = u.split_once(':').map_or(u, |(s, _)| s);
            Err(LedgerError::UnsupportedScheme(scheme.to_owned()))
        }
    }
}
