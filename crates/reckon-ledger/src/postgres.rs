//! The PostgreSQL ledger, for production and several replicas: every transaction names its
//! row-level-security scope; new effects arrive by binary COPY, the rest of ingest and the
//! scrape by array-bound statements.

mod metrics;

use crate::driver::{Driver, Existing, Pg, SqlLedger};
use crate::metrics::{MetricsQuery, MetricsSnapshot};
use crate::model::{IngestBatch, TenantId};
use crate::scope::Scope;
use crate::{LedgerError, Result, pools, rows};
use log::LevelFilter;
use reckon_domain::ingest::IngestPlan;
use reckon_keyring::Keyring;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, PgConnection, Postgres};
use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::time::{Duration, Instant};

pub type PgLedger = SqlLedger<Pg>;

impl Driver for Pg {
    type DB = Postgres;
    type Done = sqlx::postgres::PgQueryResult;
    const LOCK_CLAIM: &'static str = " FOR NO KEY UPDATE OF e SKIP LOCKED";
    const NOW: &'static str = "EXTRACT(EPOCH FROM clock_timestamp())::float8";
    const LOCK_EFFECT: &'static str = " FOR NO KEY UPDATE";
    const LOCK_FENCE: &'static str = " FOR SHARE";
    const EVIDENCE_PROVIDERS: &'static str = "(evidence::json -> 'providers')::text";
    // FOR KEY SHARE is the lock effect's foreign keys used to take once per inserted row
    // (migration 0002 dropped them): taken once per batch instead.
    const LOCK_SOURCE: &'static str = " FOR KEY SHARE";
    const PLAN_EACH_TIME: bool = true;
    const INSERT_FIRST: bool = true;

    /// Every transaction names its scope: the setting is transaction-local
    /// (`set_config(..., true)`), so it ends with the transaction and never follows a
    /// pooled connection to its next user.
    ///
    /// The scope travels with the `BEGIN`, in one round trip instead of two (a lookup's
    /// ledger work is a handful of short transactions, so this is a sizeable share of it).
    /// Only values made of ASCII letters and digits (ids, hex digests) are written into
    /// that statement: nothing else can close the quoted literal. Any other value takes
    /// the bound-parameter path.
    async fn begin(
        l: &PgLedger,
        scope: Scope<'_>,
        _write: bool,
    ) -> Result<sqlx::Transaction<'static, Postgres>> {
        let (tenant, token, session, user) = scope.settings();
        let plain = |v: &str| v.bytes().all(|b| b.is_ascii_alphanumeric());
        if [&tenant, &token, &session, &user].iter().all(|v| plain(v)) {
            let begin = format!(
                "BEGIN; SELECT set_config('reckon.tenant', '{tenant}', true), \
                 set_config('reckon.token', '{token}', true), \
                 set_config('reckon.session', '{session}', true), \
                 set_config('reckon.user', '{user}', true)"
            );
            let started = Instant::now();
            let tx = l.pool_now().begin_with(AssertSqlSafe(begin)).await?;
            pools::note_acquire(started, POOL_FULL);
            return Ok(tx);
        }
        let started = Instant::now();
        let mut tx = l.pool_now().begin().await?;
        pools::note_acquire(started, POOL_FULL);
        Self::rescope(&mut tx, scope).await?;
        Ok(tx)
    }

    async fn rescope(
        tx: &mut sqlx::Transaction<'static, Postgres>,
        scope: Scope<'_>,
    ) -> Result<()> {
        let (tenant, token, session, user) = scope.settings();
        sqlx::query(
            "SELECT set_config('reckon.tenant', $1, true), set_config('reckon.token', $2, true), \
             set_config('reckon.session', $3, true), set_config('reckon.user', $4, true)",
        )
        .bind(tenant)
        .bind(token)
        .bind(session)
        .bind(user)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    async fn lock_audit_chain(
        tx: &mut sqlx::Transaction<'static, Postgres>,
        tenant: TenantId,
    ) -> Result<()> {
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('reckon audit chain', $1))")
            .bind(tenant.0)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    async fn migrate_schema(l: &PgLedger) -> Result<()> {
        PgLedger::migrate_with(&l.driver.owner_opts).await
    }

    /// One index probe per key (the lateral subquery, kept apart by OFFSET 0), never
    /// `key = ANY($3)`: without statistics (a new ledger, autovacuum off) the planner reads
    /// `tenant_id = $1` as selective and scans every effect of the tenant through a prefix
    /// index, once per batch: a quadratic initial scan. Per-key equality on all three
    /// columns of the unique index has no cheaper rival once the table holds more than a
    /// few pages, whatever the statistics say. Planned at each execution with the table's
    /// current size ([`Driver::PLAN_EACH_TIME`]).
    async fn existing(
        conn: &mut PgConnection,
        tenant: TenantId,
        source_id: i64,
        keys: &[&str],
    ) -> Result<Existing> {
        let found = sqlx::query(AssertSqlSafe(format!(
            "SELECT e.* FROM UNNEST($3::text[]) AS k(key) CROSS JOIN LATERAL \
             (SELECT {} FROM effect WHERE tenant_id = $1 AND source_id = $2 \
             AND key = k.key OFFSET 0) AS e",
            rows::SNAPSHOT_COLUMNS
        )))
        .bind(tenant.0)
        .bind(source_id)
        .bind(keys)
        .persistent(false)
        .fetch_all(&mut *conn)
        .await?;
        rows::existing::<Postgres>(&found)
    }

    /// A COPY and a handful of array-bound statements (`UNNEST`) per batch instead of one
    /// round trip per row: a million-row initial scan is dominated by these.
    async fn write_plan(
        tx: &mut PgConnection,
        tenant: TenantId,
        source_id: i64,
        batch: &IngestBatch,
        plan: &IngestPlan,
        optimistic: bool,
    ) -> Result<bool> {
        // A batch with nothing new (a rescan's unchanged rows) sends nothing.
        if !plan.creates.is_empty()
            && plan.updates.is_empty()
            && plan.events.len() == plan.creates.len()
            && plan.events.iter().all(|e| e.kind == "first_seen")
        {
            let done = insert_staged(tx, tenant, source_id, batch, plan, optimistic, true).await?;
            return Ok(done.is_some());
        }
        let mut ids: HashMap<String, i64> = HashMap::new();
        if !plan.creates.is_empty() {
            match insert_staged(tx, tenant, source_id, batch, plan, optimistic, false).await? {
                Some(inserted) => ids.extend(inserted),
                None => return Ok(false),
            }
        }
        if !plan.updates.is_empty() {
            // One statement for the whole batch: a rescan's cost follows the rows that
            // changed, not one round trip each.
            let u = &plan.updates;
            sqlx::query(
                "UPDATE effect AS e SET state = u.state, request_hash = u.request_hash, \
                 response = u.response, attempts = u.attempts, created_at = u.created_at, \
                 updated_at = u.updated_at, expires_at = u.expires_at, \
                 abandoned_at = u.abandoned_at, last_changed_at = $1, gone_at = NULL, \
                 gone_reason = NULL \
                 FROM UNNEST($3::int8[], $4::text[], $5::text[], $6::text[], $7::int8[], \
                 $8::float8[], $9::float8[], $10::float8[], $11::float8[]) \
                 AS u(id, state, request_hash, response, attempts, created_at, updated_at, \
                 expires_at, abandoned_at) \
                 WHERE e.id = u.id AND e.tenant_id = $2",
            )
            .bind(batch.observed_at)
            .bind(tenant.0)
            .bind(col(u, |(id, _)| *id))
            .bind(col(u, |(_, w)| w.record.state.as_str()))
            .bind(col(u, |(_, w)| w.record.request_hash.as_str()))
            .bind(col(u, |(_, w)| w.record.response.as_deref()))
            .bind(col(u, |(_, w)| w.record.attempts))
            .bind(col(u, |(_, w)| w.record.created_at))
            .bind(col(u, |(_, w)| w.record.updated_at))
            .bind(col(u, |(_, w)| w.record.expires_at))
            .bind(col(u, |(_, w)| w.abandoned_at))
            // Planned per execution (see the existing-keys lookup): a generic plan from an
            // empty ledger would join by scanning the whole effect table.
            .persistent(false)
            .execute(&mut *tx)
            .await?;
            for (id, w) in u {
                ids.insert(w.record.key.clone(), *id);
            }
            // The ids of a result recorded since (a claim completed): lookup parts too.
            let (part_ids, parts): (Vec<i64>, Vec<&str>) = u
                .iter()
                .flat_map(|(id, w)| w.recorded_ids.iter().map(move |p| (*id, p.as_str())))
                .unzip();
            if !parts.is_empty() {
                sqlx::query(
                    "INSERT INTO effect_key_part (effect_id, tenant_id, part) \
                     SELECT u.id, $1, u.part FROM UNNEST($2::int8[], $3::text[]) AS u(id, part) \
                     ON CONFLICT DO NOTHING",
                )
                .bind(tenant.0)
                .bind(part_ids)
                .bind(parts)
                .execute(&mut *tx)
                .await?;
            }
        }
        if !plan.events.is_empty() {
            let e = &plan.events;
            sqlx::query(
                "INSERT INTO effect_event (tenant_id, effect_id, observed_at, origin, kind, \
                 from_state, to_state, attempts, source_updated_at, detail) \
                 SELECT $1, u.effect_id, $2, $3, u.kind, u.from_state, u.to_state, u.attempts, \
                 u.source_updated_at, u.detail FROM UNNEST($4::int8[], $5::text[], $6::text[], \
                 $7::text[], $8::int8[], $9::float8[], $10::text[]) \
                 AS u(effect_id, kind, from_state, to_state, attempts, source_updated_at, detail)",
            )
            .bind(tenant.0)
            .bind(batch.observed_at)
            .bind(batch.origin.as_str())
            .bind(col(e, |ev| ids[&ev.key]))
            .bind(col(e, |ev| ev.kind))
            .bind(col(e, |ev| ev.from_state))
            .bind(col(e, |ev| ev.to_state))
            .bind(col(e, |ev| ev.attempts))
            .bind(col(e, |ev| ev.source_updated_at))
            .bind(col(e, |ev| ev.detail.as_deref()))
            .execute(&mut *tx)
            .await?;
        }
        Ok(true)
    }

    async fn metrics_snapshot(l: &PgLedger, q: MetricsQuery) -> Result<MetricsSnapshot> {
        l.metrics_snapshot_pg(q).await
    }

    /// An advisory lock of a session of this ledger's own, which the server lets go the
    /// moment that session ends (a process killed closes its sockets). Locks that share a
    /// hash make a taker wait for the term, never take a lease from a holder still present.
    async fn mark(&self, name: &str) -> bool {
        let mut marks = self.marks.lock().await;
        let (conn, held) = &mut *marks;
        if held.contains(name) {
            return true;
        }
        if conn.is_none() {
            match sqlx::ConnectOptions::connect(&self.owner_opts).await {
                Ok(c) => *conn = Some(c),
                // Not an error of the lease: without a mark it is held for its term, as
                // before marks existed; said, so a slow resume after a crash has a reason.
                Err(e) => tracing::warn!(error = %e, "no session for lease marks: a scan \
                    whose process dies keeps its lease until the lease's term ends"),
            }
        }
        let Some(c) = conn.as_mut() else { return false };
        let sql = "SELECT pg_try_advisory_lock(hashtextextended($1, 0))";
        match sqlx::query_scalar(sql).bind(name).fetch_one(c).await {
            Ok(got) => got && held.insert(name.to_owned()),
            Err(_) => {
                // The session is gone, and every mark with it: the next mark starts anew.
                (*conn, *held) = (None, HashSet::new());
                false
            }
        }
    }

    async fn unmark(&self, name: &str) {
        let mut marks = self.marks.lock().await;
        let (conn, held) = &mut *marks;
        if let (Some(c), true) = (conn.as_mut(), held.remove(name)) {
            let sql = "SELECT pg_advisory_unlock(hashtextextended($1, 0))";
            if sqlx::query(sql).bind(name).execute(c).await.is_err() {
                (*conn, *held) = (None, HashSet::new());
            }
        }
    }
}

impl PgLedger {
    pub async fn open(url: &str, keyring: Keyring) -> Result<PgLedger> {
        let owner_opts = PgConnectOptions::from_str(url).map_err(LedgerError::Database)?;
        // Migrate before the pool exists: its connections need the role migration 0004 makes.
        // Every pooled connection then acts as reckon_app: not the tables' owner, not a
        // superuser, no BYPASSRLS, so row-level security applies to all of its queries.
        Self::migrate_with(&owner_opts).await?;
        let pool = Self::pool_of(10).connect_with(owner_opts.clone()).await?;
        // Opened as the operator's view first asks for a connection (most processes that
        // open a ledger never do).
        let operator =
            Self::pool_of(pools::OPERATOR_CONNECTIONS).connect_lazy_with(owner_opts.clone());
        let ledger = SqlLedger {
            pool,
            operator,
            keyring,
            driver: Pg {
                owner_opts,
                marks: tokio::sync::Mutex::default(),
            },
        };
        ledger.backfill_charge_terms().await?;
        ledger.backfill_recorded_ids().await?;
        ledger.scrub_pending().await?;
        Ok(ledger)
    }

    /// A pool of `max` connections, each acting as reckon_app, with its staging table.
    fn pool_of(max: u32) -> PgPoolOptions {
        PgPoolOptions::new()
            .max_connections(max)
            .acquire_timeout(Duration::from_secs(30))
            // Slow acquires are warned of by `pools::note_acquire`, at most once a minute.
            .acquire_slow_level(LevelFilter::Off)
            .after_connect(|conn, _meta| {
                Box::pin(async move {
                    sqlx::raw_sql(AssertSqlSafe(format!("SET ROLE reckon_app; {STAGE_TABLE}")))
                        .execute(conn)
                        .await?;
                    Ok(())
                })
            })
    }

    /// Migrations run as the login user (the tables' owner), on a one-connection pool of
    /// their own: the application pool's connections have dropped to reckon_app.
    async fn migrate_with(opts: &PgConnectOptions) -> Result<()> {
        let owner = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(opts.clone())
            .await?;
        let result = sqlx::migrate!("../../migrations/postgres")
            .run(&owner)
            .await;
        owner.close().await;
        result?;
        Ok(())
    }
}

/// One column of a batch, as the array that binds it.
fn col<'a, T, U>(rows: &'a [T], f: impl Fn(&'a T) -> U) -> Vec<U> {
    rows.iter().map(f).collect()
}

/// A new effect's insert refused because the ledger already holds its key.
fn already_held(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .is_some_and(sqlx::error::DatabaseError::is_unique_violation)
}

/// Where new effects wait, in each pooled connection, between the COPY that sends them and
/// the statement that inserts them. Temporary, so it needs no tenant policy (no other
/// session sees it); emptied by every commit or rollback, so a batch never meets another's
/// rows.
/// What a long wait for a connection of this database's pools means.
pub(crate) const POOL_FULL: &str = "every connection of the pool in use";

const STAGE_TABLE: &str = "CREATE TEMP TABLE effect_stage (n int8, key text, operation text, \
     key_version text, subject text, state text, request_hash text, response text, \
     attempts int8, created_at float8, updated_at float8, expires_at float8, \
     abandoned_at float8) ON COMMIT DELETE ROWS";

/// Insert a batch's new effects: a binary COPY into the staging table, then one statement
/// that moves them into `effect` in source order (ids follow it). COPY is PostgreSQL's
/// cheapest way in: twelve bound arrays cost about twice as much per row, mostly in
/// unpacking them.
///
/// `first_seen` (a batch of new effects with nothing but their first-seen events, every
/// batch of a first scan): each new row keeps its own first sight (its state, attempts and
/// `updated_at` as inserted) instead of a history row, and only the effects with extra
/// lookup parts come back. Otherwise every new key comes back with its id, for the events
/// the caller writes.
///
/// `None`: under the first-scan hint (`optimistic`), a key the ledger already held failed
/// the statement and the transaction with it; the caller plans the batch again against
/// the stored keys. (A plain INSERT, not ON CONFLICT DO NOTHING, whose speculative
/// insertion cost 18 % more per row.)
async fn insert_staged(
    tx: &mut PgConnection,
    tenant: TenantId,
    source_id: i64,
    batch: &IngestBatch,
    plan: &IngestPlan,
    optimistic: bool,
    first_seen: bool,
) -> Result<Option<HashMap<String, i64>>> {
    let c = &plan.creates;
    let mut copy = CopyBinary::new();
    for (n, w) in c.iter().enumerate() {
        let r = &w.record;
        copy.row(13);
        copy.eight(Some((n as i64).to_be_bytes()));
        for text in [
            Some(r.key.as_str()),
            w.operation.as_deref(),
            w.key_version.as_deref(),
            w.subject.as_deref(),
            Some(r.state.as_str()),
            Some(r.request_hash.as_str()),
            r.response.as_deref(),
        ] {
            copy.text(text)?;
        }
        copy.eight(Some(r.attempts.to_be_bytes()));
        for number in [
            Some(r.created_at),
            Some(r.updated_at),
            r.expires_at,
            w.abandoned_at,
        ] {
            copy.eight(number.map(f64::to_be_bytes));
        }
    }
    let mut stage = tx
        .copy_in_raw("COPY pg_temp.effect_stage FROM STDIN (FORMAT binary)")
        .await?;
    stage.send(copy.finish()).await?;
    stage.finish().await?;

    let has_parts = c
        .iter()
        .any(|w| !w.extra_parts.is_empty() || !w.recorded_ids.is_empty());
    // A first sight is kept in the new row itself (migration 0024 says why); otherwise the
    // caller writes it as a history row.
    let (first, first_values, returned) = if first_seen {
        (
            ", first_event_id, first_origin, first_state, first_attempts, first_updated_at",
            ", nextval('effect_event_id_seq'), $4, state, attempts, updated_at",
            // The insert runs in full whatever the final SELECT reads.
            if has_parts { "" } else { " WHERE false" },
        )
    } else {
        ("", "", "")
    };
    let sql = format!(
        "WITH ins AS (INSERT INTO effect (tenant_id, source_id, key, operation, key_version, \
         subject, state, request_hash, response, attempts, created_at, updated_at, expires_at, \
         abandoned_at, first_seen_at, last_changed_at{first}) \
         SELECT $1, $2, key, operation, key_version, subject, state, request_hash, response, \
         attempts, created_at, updated_at, expires_at, abandoned_at, $3, $3{first_values} \
         FROM pg_temp.effect_stage ORDER BY n \
         RETURNING id, key) SELECT id, key FROM ins{returned}"
    );
    let inserted: Vec<(i64, String)> = match sqlx::query_as(AssertSqlSafe(sql))
        .bind(tenant.0)
        .bind(source_id)
        .bind(batch.observed_at)
        .bind(batch.origin.as_str())
        .fetch_all(&mut *tx)
        .await
    {
        Err(e) if optimistic && already_held(&e) => return Ok(None),
        other => other?,
    };
    let ids: HashMap<String, i64> = inserted.into_iter().map(|(id, key)| (key, id)).collect();
    let (part_ids, parts): (Vec<i64>, Vec<&str>) = c
        .iter()
        .flat_map(|w| {
            w.extra_parts
                .iter()
                .chain(w.recorded_ids.iter())
                .map(|p| (ids[&w.record.key], p.as_str()))
        })
        .unzip();
    if !parts.is_empty() {
        sqlx::query(
            "INSERT INTO effect_key_part (effect_id, tenant_id, part) \
             SELECT u.id, $1, u.part FROM UNNEST($2::int8[], $3::text[]) AS u(id, part) \
             ON CONFLICT DO NOTHING",
        )
        .bind(tenant.0)
        .bind(part_ids)
        .bind(parts)
        .execute(&mut *tx)
        .await?;
    }
    Ok(Some(ids))
}

/// Rows in PostgreSQL's binary COPY format: no escaping to get wrong, numbers as their
/// bytes.
struct CopyBinary(Vec<u8>);

impl CopyBinary {
    fn new() -> CopyBinary {
        let mut buf = b"PGCOPY\n\xff\r\n\0".to_vec();
        // Flags, then the length of the header extension: none of either.
        buf.extend([0u8; 8]);
        CopyBinary(buf)
    }

    fn row(&mut self, fields: i16) {
        self.0.extend(fields.to_be_bytes());
    }

    fn text(&mut self, v: Option<&str>) -> Result<()> {
        let Some(v) = v else {
            self.0.extend((-1i32).to_be_bytes());
            return Ok(());
        };
        let len = i32::try_from(v.len())
            .map_err(|_| LedgerError::Invalid(format!("a value of {} bytes", v.len())))?;
        self.0.extend(len.to_be_bytes());
        self.0.extend(v.as_bytes());
        Ok(())
    }

    /// An `int8` or a `float8`: eight bytes, big-endian.
    fn eight(&mut self, v: Option<[u8; 8]>) {
        match v {
            Some(v) => {
                self.0.extend(8i32.to_be_bytes());
                self.0.extend(v);
            }
            None => self.0.extend((-1i32).to_be_bytes()),
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.0.extend((-1i16).to_be_bytes());
        self.0
    }
}
