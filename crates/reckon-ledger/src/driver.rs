//! What differs between the two databases behind one ledger implementation.
//!
//! [`SqlLedger`] is generic over a [`Driver`]: SQLite ([`Lite`]) or PostgreSQL ([`Pg`]).
//! The SQL both run is written once, in `impl<B: Driver> SqlLedger<B>` blocks; a driver says
//! only how a transaction opens (PostgreSQL names the row-level-security scope in it, SQLite
//! takes its write lock up front) and how a tenant's audit chain is locked.
//!
//! Generic code never executes on `&self.pool`: always inside a transaction, through
//! `&mut *tx` (sqlx's pool executor is what makes a generic future "not general enough").
//! Every generic block names the sqlx bounds it needs in its where-clause: higher-ranked
//! bounds are not implied by a trait, so they cannot live on [`Driver`].

use crate::accounts::Scope;
use crate::model::TenantId;
use crate::{Keyring, Result};
use sqlx::postgres::PgConnectOptions;
use std::future::Future;

/// One of the two databases.
pub(crate) trait Driver: Send + Sync + Sized + 'static {
    type DB: sqlx::Database<QueryResult = Self::Done>;
    /// What a statement reports (each driver has its own type, with no trait for it).
    type Done: RowsAffected;

    /// How a claim's candidate read locks its effect rows: PostgreSQL skips rows another
    /// replica is claiming (`NO KEY UPDATE`, so recording an attempt, whose foreign key
    /// takes `KEY SHARE` on the effect, does not deadlock with a claim); SQLite's one
    /// writer at a time needs nothing.
    const LOCK_CLAIM: &'static str;

    /// The database's clock as f64 seconds since the epoch, in SQL: every replica reads the
    /// same clock (SQLite's `julianday` works on every version; `unixepoch('subsec')` needs
    /// 3.42).
    const NOW: &'static str;

    /// How a lease fence holds the lease row until its transaction ends (SQLite: its one
    /// writer at a time already does).
    const LOCK_FENCE: &'static str;

    /// A transaction in `scope`; `write` when it may write (SQLite's `BEGIN IMMEDIATE`: a
    /// deferred transaction that upgrades to a write fails at once when another writes).
    fn begin(
        l: &SqlLedger<Self>,
        scope: Scope<'_>,
        write: bool,
    ) -> impl Future<Output = Result<sqlx::Transaction<'static, Self::DB>>> + Send;

    /// Name the scope of the rest of this transaction.
    fn rescope(
        tx: &mut sqlx::Transaction<'static, Self::DB>,
        scope: Scope<'_>,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Hold the tenant's audit chain until the transaction ends: a run appended on top of
    /// a head being rewritten would name a digest that no longer exists.
    fn lock_audit_chain(
        tx: &mut sqlx::Transaction<'static, Self::DB>,
        tenant: TenantId,
    ) -> impl Future<Output = Result<()>> + Send;
}

/// How many rows a statement changed.
pub(crate) trait RowsAffected {
    fn rows_affected(&self) -> u64;
}

impl RowsAffected for sqlx::sqlite::SqliteQueryResult {
    fn rows_affected(&self) -> u64 {
        sqlx::sqlite::SqliteQueryResult::rows_affected(self)
    }
}

impl RowsAffected for sqlx::postgres::PgQueryResult {
    fn rows_affected(&self) -> u64 {
        sqlx::postgres::PgQueryResult::rows_affected(self)
    }
}

/// The ledger over one database.
pub struct SqlLedger<B: Driver> {
    pub(crate) pool: sqlx::Pool<B::DB>,
    pub(crate) keyring: Keyring,
    pub(crate) driver: B,
}

/// SQLite: nothing to keep besides the pool.
pub struct Lite;

/// PostgreSQL.
pub struct Pg {
    /// The login user's options: migrations run as it (the tables' owner), on their own
    /// connection; the pool's connections drop to `reckon_app`.
    pub(crate) owner_opts: PgConnectOptions,
}
