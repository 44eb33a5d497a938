//! reckon's own store. One trait, [`Ledger`], with two implementations chosen by URL scheme
//! at start: SQLite (the embedded default) and PostgreSQL. Every method that touches tenant
//! data takes a [`TenantId`], which only this crate can make (from a slug it looked up or a
//! token it authenticated), so no caller can build a query without a tenant.

mod accounts;
mod actions;
// ---- audit (issue 6, branch `audit`): audit storage, a supertrait of Ledger ----
mod audit;
mod crypto;
mod driver;
mod keys;
mod lease;
// Dashboard (issue 7, branch dash): the unresolved queue, counts by kind, chart snapshots.
mod dashboard;
mod files;
mod metrics;
mod model;
mod plan;
mod postgres;
mod reconcile;
mod rows;
mod scrub;
mod sources;
mod sqlite;
// write-back (issue 4 item 7)
mod writeback;

pub use accounts::{
    Accounts, Admission, NewSession, SessionGrant, ThrottlePolicy, TokenCreator, TokenInfo, User,
    UserCredentials,
};
pub use actions::{Action, NewAction};
// ---- audit (issue 6) ----
pub use audit::{
    ALL_PROVIDERS, AuditGlance, AuditMetric, AuditRun, AuditSettings, Audits, ChainBreak,
    ChainLink, NewAuditRun, SCHEDULE_AUTHOR, StoredCharge, canonical_json, run_digest,
    verify_chain, verify_content, verify_links,
};
pub use crypto::{Keyring, KeyringError};
pub use keys::RotateReport;
pub use metrics::{
    MetricsQuery, MetricsSnapshot, NeedsAttentionGroup, QuarantineGroup, SourceHealth,
    UnresolvedGroup,
};
pub use model::*;
// Dashboard (issue 7, branch dash)
pub use dashboard::{
    KindSummary, ProviderHealth, QueueQuery, QueueRow, ReplayClosing, Snapshot, hour_of,
    snapshot_of,
};
pub use plan::ingest_plan;
pub use reconcile::*;
pub use scrub::{SCRUB_ACTION, ScrubReport};
pub use writeback::{
    NewWriteback, Writeback, WritebackAction, WritebackCandidate, WritebackPolicy, WritebackStatus,
};

use async_trait::async_trait;
use reckon_domain::{Disappearance, Rejected, SourceRecord};
use secrecy::SecretString;
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

/// reckon's store. See ARCHITECTURE.md for the invariants every implementation keeps.
/// People, sessions and the token lifecycle are in the supertrait [`Accounts`].
#[async_trait]
/// The double-charge audit's storage is in the supertrait [`Audits`] (issue 6).
pub trait Ledger: Accounts + Audits + Send + Sync + 'static {
    fn backend(&self) -> Backend;

    /// Apply the embedded migrations of this backend (idempotent).
    async fn migrate(&self) -> Result<()>;

    /// Cheap liveness query for `/readyz`.
    async fn ping(&self) -> Result<()>;

    /// The connection pool as it is now (no query): what on-call checks first when the
    /// ledger is slow (every connection in use means requests queue for one).
    fn pool_status(&self) -> PoolStatus;

    /// This ledger's identity, a random value made when it was created (migration 0016,
    /// `reckon_instance`). A tenant's source connection that can see it has reached
    /// reckon's own database and is refused (`EgressPolicy::with_own_identity`).
    async fn instance_identity(&self) -> Result<String>;

    // ---- tenants and tokens ----
    async fn create_tenant(&self, slug: &str) -> Result<Tenant>;
    async fn tenant_by_slug(&self, slug: &str) -> Result<Tenant>;
    /// The tenant with this id ([`LedgerError::NotFound`] if there is none).
    async fn tenant_by_id(&self, tenant: TenantId) -> Result<Tenant>;
    async fn list_tenants(&self) -> Result<Vec<Tenant>>;
    async fn create_token(
        &self,
        tenant: TenantId,
        role: Role,
        token_hash: &str,
        label: &str,
    ) -> Result<i64>;
    /// The tenant and role of a live token with this hash, if any.
    async fn authenticate_token(&self, token_hash: &str) -> Result<Option<TokenGrant>>;

    // ---- sources ----
    async fn add_source(&self, tenant: TenantId, new: NewSource) -> Result<Source>;
    async fn list_sources(&self, tenant: TenantId) -> Result<Vec<Source>>;
    async fn source_by_name(&self, tenant: TenantId, name: &str) -> Result<Source>;
    /// Change a source's settings (`None` keeps a field). A new DSN is sealed like one
    /// added; without one the stored ciphertext is not touched. A new DSN or table drops
    /// the scan cursor. `NotFound` for a name the tenant has no source of.
    async fn update_source(
        &self,
        tenant: TenantId,
        name: &str,
        change: SourceChange,
    ) -> Result<Source>;
    /// Every scanned source of every tenant, for the scheduler (operator scope).
    async fn all_scanned_sources(&self) -> Result<Vec<(Tenant, Source)>>;
    /// The source's DSN, decrypted.
    async fn source_dsn(&self, tenant: TenantId, source: &Source) -> Result<SecretString>;
    /// Fenced by `lease` when given: a lost lease writes nothing ([`LedgerError::LeaseLost`]).
    async fn record_scan_success(
        &self,
        tenant: TenantId,
        source_id: i64,
        at: f64,
        full: bool,
        lease: Option<&Lease>,
    ) -> Result<()>;
    /// Fenced by `lease` when given, like [`Ledger::record_scan_success`].
    async fn record_scan_failure(
        &self,
        tenant: TenantId,
        source_id: i64,
        at: f64,
        error: &str,
        lease: Option<&Lease>,
    ) -> Result<()>;

    // ---- ingest ----
    /// Store a batch of records and quarantined rows, and (for scans) move the source's
    /// cursor, all in one transaction.
    async fn ingest(
        &self,
        tenant: TenantId,
        source_id: i64,
        batch: IngestBatch,
    ) -> Result<IngestOutcome>;
    /// A page of the keys of effects still present in the source (not gone), ordered by
    /// effect id, for key-set comparison. Returns (last id, keys).
    async fn present_keys(
        &self,
        tenant: TenantId,
        source_id: i64,
        after_id: i64,
        limit: i64,
    ) -> Result<Vec<(i64, String)>>;
    /// Mark effects whose rows left the source; each gets one history event. Fenced by
    /// `lease` when given.
    async fn mark_gone(
        &self,
        tenant: TenantId,
        source_id: i64,
        keys: &[String],
        at: f64,
        origin: Origin,
        lease: Option<&Lease>,
    ) -> Result<Vec<(String, Disappearance)>>;

    // ---- reading ----
    async fn list_effects(&self, tenant: TenantId, query: &EffectQuery) -> Result<Vec<Effect>>;
    async fn get_effect(
        &self,
        tenant: TenantId,
        source_name: &str,
        key: &str,
    ) -> Result<Option<EffectDetail>>;
    /// Effects whose key is `text`, or one of whose key parts is exactly `text`.
    async fn lookup(&self, tenant: TenantId, text: &str, limit: i64) -> Result<Vec<Effect>>;
    async fn quarantine_counts(&self, tenant: TenantId) -> Result<Vec<QuarantineCount>>;
    async fn list_quarantine(
        &self,
        tenant: TenantId,
        source_id: i64,
        limit: i64,
    ) -> Result<Vec<QuarantineEntry>>;
    // ---- reconciliation (issue 4): providers, routes, leases, attempts, resolutions.
    // Implemented in `sqlite/reconcile.rs` and `postgres/reconcile.rs`. ----

    async fn add_provider(&self, tenant: TenantId, new: NewProvider) -> Result<Provider>;
    async fn list_providers(&self, tenant: TenantId) -> Result<Vec<Provider>>;
    async fn provider_by_name(&self, tenant: TenantId, name: &str) -> Result<Provider>;
    /// Change a provider's settings and/or secret (`None` keeps it; the stored secret is
    /// replaced only by a new one). `NotFound` for a name the tenant has no provider of.
    async fn update_provider(
        &self,
        tenant: TenantId,
        name: &str,
        change: ProviderChange,
    ) -> Result<Provider>;
    async fn provider_by_id(&self, tenant: TenantId, id: i64) -> Result<Provider>;
    /// The provider's secret, decrypted (`None` when it has none).
    async fn provider_secret(
        &self,
        tenant: TenantId,
        provider: &Provider,
    ) -> Result<Option<SecretString>>;
    /// Route an operation pattern (a name or `*`) of a source to a provider, or to none.
    /// Setting a route again replaces it.
    async fn set_route(
        &self,
        tenant: TenantId,
        source: &str,
        operation: &str,
        provider: Option<&str>,
    ) -> Result<Route>;
    async fn list_routes(&self, tenant: TenantId) -> Result<Vec<Route>>;
    /// Lease up to `limit` unresolved, unresolution-free effects whose next attempt is due
    /// and whose lease (if any) has expired. PostgreSQL: `FOR UPDATE SKIP LOCKED`; SQLite:
    /// a conditional upsert under the write lock.
    async fn claim_due(
        &self,
        tenant: TenantId,
        owner: &str,
        now: f64,
        lease_secs: f64,
        limit: i64,
    ) -> Result<Vec<Claim>>;
    /// Lease one effect now, whatever its schedule (not if resolved or leased by another).
    async fn claim_effect(
        &self,
        tenant: TenantId,
        effect_id: i64,
        owner: &str,
        now: f64,
        lease_secs: f64,
    ) -> Result<Option<Claim>>;
    /// Release a lease without an attempt (e.g. "no provider"), noting why and when to
    /// look again.
    async fn defer(
        &self,
        tenant: TenantId,
        effect_id: i64,
        owner: &str,
        next_attempt_at: f64,
        note: &str,
    ) -> Result<()>;
    /// Append one attempt, update the schedule, release the lease, and (if asked) record
    /// the resolution, all in one transaction. A second resolution is never stored.
    async fn record_attempt(
        &self,
        tenant: TenantId,
        effect_id: i64,
        owner: &str,
        attempt: NewAttempt,
    ) -> Result<AttemptRecorded>;
    /// A person's resolution. `Conflict` when the effect is already resolved.
    async fn resolve_by_hand(
        &self,
        tenant: TenantId,
        effect_id: i64,
        new: NewResolution,
    ) -> Result<Resolution>;
    async fn reconcile_view(&self, tenant: TenantId, effect_id: i64) -> Result<ReconcileView>;
    /// Make the indeterminate effects of one provider created in `[from, to]` due now
    /// (clearing "needs attention"); returns how many.
    async fn requeue_indeterminate(
        &self,
        tenant: TenantId,
        provider_id: i64,
        from: f64,
        to: f64,
        now: f64,
    ) -> Result<u64>;

    // Write-back: `writeback.rs`.

    /// Turn write-back of a scanned source on (with its not_applied policy) or off (`None`).
    async fn set_source_writeback(
        &self,
        tenant: TenantId,
        source: &str,
        policy: Option<WritebackPolicy>,
    ) -> Result<Source>;
    /// Resolved (`applied` / `not_applied`) effects of sources with write-back on, still
    /// unresolved in the source as last seen and present, that have no write-back yet;
    /// oldest resolution first.
    async fn writeback_candidates(
        &self,
        tenant: TenantId,
        source_id: Option<i64>,
        limit: i64,
    ) -> Result<Vec<WritebackCandidate>>;
    /// Write-backs of the tenant (optionally of one source, of one status), oldest first.
    async fn list_writebacks(
        &self,
        tenant: TenantId,
        source_id: Option<i64>,
        status: Option<WritebackStatus>,
        limit: i64,
    ) -> Result<Vec<Writeback>>;
    /// Record the intent (`pending`) before the source is written, fenced by `lease`. The
    /// one write-back of that resolution is returned: this one, or the one already there
    /// (whatever its status). Refused when the source has write-back off.
    async fn begin_writeback(
        &self,
        tenant: TenantId,
        new: NewWriteback,
        lease: Option<&Lease>,
    ) -> Result<Writeback>;
    /// Settle a pending write-back as `written` or `conflict`; an already settled one is
    /// left as it is and returned.
    async fn finish_writeback(
        &self,
        tenant: TenantId,
        id: i64,
        status: WritebackStatus,
        detail: &str,
        recovered: bool,
        lease: Option<&Lease>,
    ) -> Result<Writeback>;
    // ---- end write-back ----

    // ---- leases: work that exactly one replica does at a time ----
    /// Take the lease `name` for `ttl_secs` if it is free, expired, or already held by
    /// `owner` (then it is renewed, same term). `None` when another owner holds it.
    async fn try_lease(&self, name: &str, owner: &str, ttl_secs: f64) -> Result<Option<Lease>>;
    /// Extend a lease still held; `None` when it expired or changed hands (it is lost: stop
    /// the work, its writes will be refused).
    async fn renew_lease(&self, lease: &Lease, ttl_secs: f64) -> Result<Option<Lease>>;
    /// Hand a lease back early so another replica can take the work at once.
    async fn release_lease(&self, lease: &Lease) -> Result<()>;
    /// Who holds the lease `name` now, and until when; `None` when it is free (never
    /// taken, released, or expired).
    async fn lease_holder(&self, name: &str) -> Result<Option<Lease>>;
    /// How many leases whose name starts with `prefix` are held now.
    async fn count_leases(&self, prefix: &str) -> Result<i64>;

    // ---- metrics (issue 5, branch `metrics`) ----
    /// What `/metrics` reads at scrape time, in one read transaction. `q.tenant: None` is the
    /// operator scope (every tenant); a tenant's request always passes its own `TenantId`.
    /// Costs O(unresolved effects + live claims + sources + quarantined rows), never
    /// O(effects): see `metrics.rs` and migration 0005.
    async fn metrics_snapshot(&self, q: MetricsQuery) -> Result<MetricsSnapshot>;

    // ---- the master key (issue 3) ----
    /// Refuse a master key that is not the one this ledger's secrets were sealed with
    /// ([`LedgerError::WrongMasterKey`]); on a new ledger, record the key's check value.
    async fn check_keyring(&self) -> Result<()>;
    /// Re-seal every stored secret (DSNs, provider secrets, TOTP secrets) and the check
    /// value under `new`, in one transaction; resumable. Afterwards only `new` opens the
    /// ledger: the operator must switch to it before the next start.
    async fn rotate_keyring(&self, new: &Keyring) -> Result<RotateReport>;

    // ---- the audit log of people's actions (issue 3) ----
    /// Append one action to the tenant's audit log (append-only: nothing updates or
    /// deletes it).
    async fn record_action(&self, tenant: TenantId, action: NewAction) -> Result<()>;
    /// The tenant's actions, newest first, before `before_id` (a page's last id).
    async fn list_actions(
        &self,
        tenant: TenantId,
        before_id: Option<i64>,
        limit: i64,
    ) -> Result<Vec<Action>>;
    // ---- dashboard (issue 7, branch `dash`): SQL in `dashboard.rs`, shared by both backends.
    // Each reads O(unresolved effects) through the partial index of migration 0005. ----
    /// The unresolved, not yet resolved effects with their reconcile state, oldest first,
    /// one keyset page.
    async fn unresolved_queue(&self, tenant: TenantId, q: &QueueQuery) -> Result<Vec<QueueRow>>;
    /// Unresolved, not yet resolved effects by kind; `replay_closing` counts those whose
    /// replay window is still open and closing (see [`ReplayClosing`]).
    async fn unresolved_summary(
        &self,
        tenant: TenantId,
        now: f64,
        replay: ReplayClosing,
    ) -> Result<Vec<KindSummary>>;
    /// Count the unresolved effects now and store it as the snapshot of the current hour
    /// (replacing one taken earlier in the same hour).
    async fn take_snapshot(&self, tenant: TenantId, now: f64) -> Result<Snapshot>;
    /// The hourly snapshots from `since` on, oldest first.
    async fn snapshots(&self, tenant: TenantId, since: f64) -> Result<Vec<Snapshot>>;
    /// Each of the tenant's providers with its lookups and indeterminate outcomes finished
    /// since `since`, and its newest error (of any age), by name.
    async fn provider_health(&self, tenant: TenantId, since: f64) -> Result<Vec<ProviderHealth>>;
    /// "Scan now": the scheduler of any replica scans a scanned source whose request is
    /// newer than its last scan's start. `NotFound` for a push source or another tenant's.
    async fn request_scan(&self, tenant: TenantId, name: &str, at: f64) -> Result<Source>;
}

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
            let scheme = u.split_once(':').map(|(s, _)| s).unwrap_or(u);
            Err(LedgerError::UnsupportedScheme(scheme.to_owned()))
        }
    }
}

/// Keep `SourceRecord` and `Rejected` reachable for implementors of ingest.
pub type IngestRecord = SourceRecord;
pub type IngestRejected = Rejected;
