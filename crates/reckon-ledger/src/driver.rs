//! What differs between the two databases behind one ledger implementation.
//!
//! [`SqlLedger`] is generic over a [`Driver`]: SQLite ([`Lite`]) or PostgreSQL ([`Pg`]).
//! Every aggregate trait of [`crate::Ledger`] is implemented once, as
//! `impl<B: Driver> Trait for SqlLedger<B>`; a driver says how a transaction opens
//! (PostgreSQL names the row-level-security scope in it, SQLite takes its write lock up
//! front), the few lock clauses and clocks that differ, and the paths where PostgreSQL has
//! a faster statement of its own (ingest, the scrape).
//!
//! Generic code never executes on `&self.pool`: always inside a transaction, through
//! `&mut *tx` (sqlx's pool executor is what makes a generic future "not general enough").
//! The sqlx bounds generic code needs are stated once, by [`sql!`].

use crate::metrics::{MetricsQuery, MetricsSnapshot};
use crate::model::{IngestBatch, Lease, TenantId};
use crate::scope::Scope;
use crate::{Keyring, LedgerError, Result};
use reckon_domain::StoredSnapshot;
use reckon_domain::ingest::IngestPlan;
use sqlx::postgres::PgConnectOptions;
use sqlx::{AssertSqlSafe, Database, Decode, Encode, Type};
use std::collections::{HashMap, HashSet};
use std::future::Future;

/// The ledger's copies of a batch's keys: key -> (effect id, snapshot).
pub(crate) type Existing = HashMap<String, (i64, StoredSnapshot)>;

/// One of the two databases.
pub(crate) trait Driver: Send + Sync + Sized + 'static {
    type DB: Database<QueryResult = Self::Done> + sqlx::database::HasStatementCache;
    /// What a statement reports (each driver has its own type, with no trait for it).
    type Done: RowsAffected + Send;

    /// How a claim's candidate read locks its effect rows: PostgreSQL skips rows another
    /// replica is claiming (`NO KEY UPDATE`, so recording an attempt, whose foreign key
    /// takes `KEY SHARE` on the effect, does not deadlock with a claim); SQLite's one
    /// writer at a time needs nothing.
    const LOCK_CLAIM: &'static str;

    /// The database's clock as f64 seconds since the epoch, in SQL: every replica reads the
    /// same clock (SQLite's `julianday` works on every version; `unixepoch('subsec')` needs
    /// 3.42).
    const NOW: &'static str;

    /// How recording an attempt, which may update its effect's row through a trigger on
    /// `reconcile_state` (parking) or `resolution` (a verdict), takes the effect's lock
    /// first, as a claim does (effect, then state): taken after the state's, a claim that
    /// had locked the effect and waited for its state made the two a deadlock.
    const LOCK_EFFECT: &'static str;

    /// An audit run's `evidence.providers` (each provider's part) as JSON text, NULL when
    /// the run has none, cut out by the database so the rest of the evidence (every page
    /// read) is not sent.
    const EVIDENCE_PROVIDERS: &'static str;

    /// How a lease fence holds the lease row until its transaction ends (SQLite: its one
    /// writer at a time already does).
    const LOCK_FENCE: &'static str;

    /// How ingest holds the source row it writes under, so the source (and, through its
    /// foreign key, the tenant) is not deleted or re-keyed before the batch commits.
    const LOCK_SOURCE: &'static str;

    /// Plan each execution of the statements whose best plan depends on the table's size.
    /// PostgreSQL switches a prepared statement to a generic plan after five executions,
    /// made while the ledger may still be empty and kept however large it grows.
    const PLAN_EACH_TIME: bool;

    /// Insert a first scan's keys without looking them up first (when the statement that
    /// inserts a batch fails whole on a key already there, and cheaply).
    const INSERT_FIRST: bool;

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

    /// Apply this database's embedded migrations.
    fn migrate_schema(l: &SqlLedger<Self>) -> impl Future<Output = Result<()>> + Send;

    /// The ledger's copies of `keys` in one source.
    fn existing(
        conn: &mut <Self::DB as Database>::Connection,
        tenant: TenantId,
        source_id: i64,
        keys: &[&str],
    ) -> impl Future<Output = Result<Existing>> + Send;

    /// Write a planned batch: its new effects, changed effects and history events.
    /// `insert_first`: the plan treats every key as new; `false` (the transaction is
    /// spoiled, nothing must be committed) when one was already there.
    fn write_plan(
        conn: &mut <Self::DB as Database>::Connection,
        tenant: TenantId,
        source_id: i64,
        batch: &IngestBatch,
        plan: &IngestPlan,
        insert_first: bool,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// What `/metrics` reads, in the fewest round trips this database allows.
    fn metrics_snapshot(
        l: &SqlLedger<Self>,
        q: MetricsQuery,
    ) -> impl Future<Output = Result<MetricsSnapshot>> + Send;

    /// Mark this ledger present as the holder of lease `name`, with a mark that ends with
    /// the process (see `Leases::try_lease_present`): false when another's mark stands, or
    /// when no mark can be made.
    fn mark(&self, name: &str) -> impl Future<Output = bool> + Send;

    /// Take back the mark of lease `name`, if this ledger holds it.
    fn unmark(&self, name: &str) -> impl Future<Output = ()> + Send;
}

/// Helpers every aggregate uses.
#[macro_rules_attribute::apply(sql!)]
impl<B: Driver> SqlLedger<B> {
    /// One statement in a write transaction of its own, in `scope`: the rows it changed.
    pub(crate) async fn exec(
        &self,
        scope: Scope<'_>,
        q: sqlx::query::Query<'_, B::DB, <B::DB as Database>::Arguments>,
    ) -> Result<u64> {
        let mut tx = B::begin(self, scope, true).await?;
        let n = q.execute(&mut *tx).await?.rows_affected();
        tx.commit().await?;
        Ok(n)
    }

    /// One statement in a write transaction of its own, in `scope`, fenced by `lease` when
    /// given (a lost lease writes nothing: [`crate::LedgerError::LeaseLost`]).
    pub(crate) async fn exec_fenced(
        &self,
        scope: Scope<'_>,
        lease: Option<&Lease>,
        q: sqlx::query::Query<'_, B::DB, <B::DB as Database>::Arguments>,
    ) -> Result<()> {
        let mut tx = B::begin(self, scope, true).await?;
        fence::<B>(&mut tx, lease).await?;
        q.execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// One statement in a write transaction of its own, in `scope`: the row it returned
    /// (`RETURNING`), if any.
    pub(crate) async fn write_opt(
        &self,
        scope: Scope<'_>,
        q: sqlx::query::Query<'_, B::DB, <B::DB as Database>::Arguments>,
    ) -> Result<Option<<B::DB as Database>::Row>> {
        let mut tx = B::begin(self, scope, true).await?;
        let row = q.fetch_optional(&mut *tx).await?;
        tx.commit().await?;
        Ok(row)
    }

    /// One read in a transaction of its own, in `scope`: every row.
    pub(crate) async fn read_all(
        &self,
        scope: Scope<'_>,
        q: sqlx::query::Query<'_, B::DB, <B::DB as Database>::Arguments>,
    ) -> Result<Vec<<B::DB as Database>::Row>> {
        let mut tx = B::begin(self, scope, false).await?;
        let rows = q.fetch_all(&mut *tx).await?;
        tx.commit().await?;
        Ok(rows)
    }

    /// One read in a transaction of its own, in `scope`: each row made into a `T` as it
    /// arrives, so the server reads on while this process decodes. For the long reads (a
    /// day's audit is a million rows): collecting the rows first put the server's time and
    /// the decoding end to end, and held every row twice.
    pub(crate) async fn read_each<T>(
        &self,
        scope: Scope<'_>,
        q: sqlx::query::Query<'_, B::DB, <B::DB as Database>::Arguments>,
        mut each: impl FnMut(&<B::DB as Database>::Row) -> Result<T> + Send,
    ) -> Result<Vec<T>> {
        use futures::TryStreamExt;
        let mut tx = B::begin(self, scope, false).await?;
        let mut out = Vec::new();
        {
            let mut rows = q.fetch(&mut *tx);
            while let Some(row) = rows.try_next().await? {
                out.push(each(&row)?);
            }
        }
        tx.commit().await?;
        Ok(out)
    }

    /// One read in a transaction of its own, in `scope`: the row, if there is one.
    pub(crate) async fn read_opt(
        &self,
        scope: Scope<'_>,
        q: sqlx::query::Query<'_, B::DB, <B::DB as Database>::Arguments>,
    ) -> Result<Option<<B::DB as Database>::Row>> {
        let mut tx = B::begin(self, scope, false).await?;
        let row = q.fetch_optional(&mut *tx).await?;
        tx.commit().await?;
        Ok(row)
    }
}

/// Inside a write transaction: refuse to go on unless `lease` (when given) is still held,
/// and keep it from changing hands until this transaction ends.
pub(crate) async fn fence<B: Driver>(
    conn: &mut <B::DB as Database>::Connection,
    lease: Option<&Lease>,
) -> Result<()>
where
    for<'c> &'c mut <B::DB as Database>::Connection: sqlx::Executor<'c, Database = B::DB>,
    <B::DB as Database>::Arguments: sqlx::IntoArguments<B::DB>,
    for<'q> i64: Encode<'q, B::DB> + Type<B::DB> + Decode<'q, B::DB>,
    for<'q> String: Encode<'q, B::DB> + Type<B::DB>,
    (i64,): for<'r> sqlx::FromRow<'r, <B::DB as Database>::Row>,
{
    let Some(lease) = lease else { return Ok(()) };
    let (now, lock) = (B::NOW, B::LOCK_FENCE);
    let held: Option<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT CAST(1 AS BIGINT) FROM work_lease \
         WHERE name = $1 AND owner = $2 AND term = $3 AND expires_at > {now}{lock}"
    )))
    .bind(lease.name.clone())
    .bind(lease.owner.clone())
    .bind(lease.term)
    .fetch_optional(&mut *conn)
    .await?;
    match held {
        Some(_) => Ok(()),
        None => Err(LedgerError::LeaseLost(lease.name.clone())),
    }
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
    /// The operator's view's own connections (`pools.rs`).
    pub(crate) operator: sqlx::Pool<B::DB>,
    pub(crate) keyring: Keyring,
    pub(crate) driver: B,
}

/// SQLite: the marks of presence, as locked files in a folder beside the ledger's file
/// (`None` for a ledger in memory, which no other process can open).
pub struct Lite {
    pub(crate) marks: Option<std::path::PathBuf>,
    pub(crate) held: std::sync::Mutex<HashMap<String, std::fs::File>>,
}

/// PostgreSQL.
pub struct Pg {
    /// The login user's options: migrations run as it (the tables' owner), on their own
    /// connection; the pool's connections drop to `reckon_app`.
    pub(crate) owner_opts: PgConnectOptions,
    /// The session whose advisory locks are this ledger's marks of presence, and their names.
    pub(crate) marks: tokio::sync::Mutex<(Option<sqlx::PgConnection>, HashSet<String>)>,
}

/// The sqlx bounds of every generic block, written once: `#[apply(sql!)]` on an
/// `impl<B: Driver> Aggregate for SqlLedger<B>` or an `impl<B: Driver> SqlLedger<B>` of
/// helpers. Higher-ranked bounds on other types are not implied by a trait, so each impl
/// must state them; this macro holds no SQL, only them.
///
/// An aggregate is written once, as its impl: the macro declares the trait from it
/// (`pub trait Aggregate: Send + Sync`, each method's docs and signature as written, both
/// through `async_trait`), and gives every `async fn` its span (`debug`, arguments
/// skipped), which is how the bench times ledger calls and the tests count them. A method
/// whose span records fields names its own `#[instrument(...)]`, after its docs.
macro_rules! sql {
    ($(#[$m:meta])* impl<B: Driver> $tr:ident for SqlLedger<B> { $($body:tt)* }) => {
        $crate::driver::sql! {
            @spans [$(#[$m])*] $tr [] [] $($body)*
        }
    };
    (@spans $docs:tt $tr:ident [$($decl:tt)*] [$($done:tt)*]
        $(#[doc = $doc:literal])* #[instrument $args:tt] $(#[$fm:meta])*
        async fn $name:ident $params:tt -> $ret:ty $body:block $($rest:tt)*) => {
        $crate::driver::sql! {
            @spans $docs $tr [$($decl)* $(#[doc = $doc])* $(#[$fm])* async fn $name $params -> $ret;] [$($done)*
                #[::tracing::instrument $args] async fn $name $params -> $ret $body
            ] $($rest)*
        }
    };
    (@spans $docs:tt $tr:ident [$($decl:tt)*] [$($done:tt)*]
        $(#[$fm:meta])* async fn $name:ident $params:tt -> $ret:ty $body:block $($rest:tt)*) => {
        $crate::driver::sql! {
            @spans $docs $tr [$($decl)* $(#[$fm])* async fn $name $params -> $ret;] [$($done)*
                #[::tracing::instrument(level = "debug", skip_all)]
                async fn $name $params -> $ret $body
            ] $($rest)*
        }
    };
    (@spans $docs:tt $tr:ident [$($decl:tt)*] [$($done:tt)*]
        $(#[$fm:meta])* fn $name:ident $params:tt -> $ret:ty $body:block $($rest:tt)*) => {
        $crate::driver::sql! {
            @spans $docs $tr [$($decl)* $(#[$fm])* fn $name $params -> $ret;]
                [$($done)* fn $name $params -> $ret $body] $($rest)*
        }
    };
    (@spans [$(#[$m:meta])*] $tr:ident [$($decl:tt)*] [$($done:tt)*]) => {
        $(#[$m])*
        #[::async_trait::async_trait]
        pub trait $tr: Send + Sync {
            $($decl)*
        }

        $crate::driver::sql! {
            @where [#[::async_trait::async_trait] impl<B: Driver> $tr for SqlLedger<B>] $($done)*
        }
    };
    ($(#[$m:meta])* impl<B: Driver> SqlLedger<B> { $($body:tt)* }) => {
        $crate::driver::sql! { @where [$(#[$m])* impl<B: Driver> SqlLedger<B>] $($body)* }
    };
    (@where [$($head:tt)*] $($body:tt)*) => {
        $($head)*
        where
        for<'c> &'c mut <B::DB as sqlx::Database>::Connection: sqlx::Executor<'c, Database = B::DB>,
        <B::DB as sqlx::Database>::Arguments: sqlx::IntoArguments<B::DB>,
        for<'q> i64: sqlx::Encode<'q, B::DB> + sqlx::Type<B::DB> + sqlx::Decode<'q, B::DB>,
        for<'q> f64: sqlx::Encode<'q, B::DB> + sqlx::Type<B::DB> + sqlx::Decode<'q, B::DB>,
        for<'q> bool: sqlx::Encode<'q, B::DB> + sqlx::Type<B::DB> + sqlx::Decode<'q, B::DB>,
        for<'q> String: sqlx::Encode<'q, B::DB> + sqlx::Type<B::DB> + sqlx::Decode<'q, B::DB>,
        for<'q> &'q str: sqlx::Encode<'q, B::DB> + sqlx::Type<B::DB>,
        for<'q> Vec<u8>: sqlx::Encode<'q, B::DB> + sqlx::Type<B::DB> + sqlx::Decode<'q, B::DB>,
        for<'q> Option<i64>: sqlx::Encode<'q, B::DB>,
        for<'q> Option<f64>: sqlx::Encode<'q, B::DB>,
        for<'q> Option<bool>: sqlx::Encode<'q, B::DB>,
        for<'q> Option<String>: sqlx::Encode<'q, B::DB>,
        for<'q> Option<&'q str>: sqlx::Encode<'q, B::DB>,
        for<'q> Option<Vec<u8>>: sqlx::Encode<'q, B::DB>,
        for<'r> &'r str: sqlx::ColumnIndex<<B::DB as sqlx::Database>::Row>,
        usize: sqlx::ColumnIndex<<B::DB as sqlx::Database>::Row>,
        {
            $($body)*
        }
    };
}
pub(crate) use sql;

/// The decode bounds of a row-mapping function, written once: `#[apply(row!)]` on a
/// `fn name<DB: Database>(row: &DB::Row, ...) -> T`.
macro_rules! row {
    ($(#[$m:meta])* $v:vis fn $name:ident<DB: Database>($($args:tt)*) -> $ret:ty { $($body:tt)* }) => {
        $(#[$m])*
        $v fn $name<DB: sqlx::Database>($($args)*) -> $ret
        where
            for<'r> i64: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
            for<'r> f64: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
            for<'r> bool: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
            for<'r> String: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
            for<'r> Vec<u8>: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
            for<'r> &'r str: sqlx::ColumnIndex<DB::Row>,
        {
            $($body)*
        }
    };
}
pub(crate) use row;
