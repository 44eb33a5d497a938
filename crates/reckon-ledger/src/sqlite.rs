//! The embedded ledger: one SQLite file in WAL mode. Writes take the write lock up front
//! (`BEGIN IMMEDIATE`) so two writers queue on the busy timeout instead of failing on a
//! lock upgrade. There is no row-level security: a transaction's scope is PostgreSQL's
//! business.

use crate::driver::{Driver, Existing, Lite, SqlLedger};
use crate::metrics::{
    MetricsQuery, MetricsSnapshot, PROVIDERS_SQL, QUARANTINE_SQL, SOURCES_SQL, UNRESOLVED_SQL,
    tenant_param,
};
use crate::model::{IngestBatch, TenantId};
use crate::scope::Scope;
use crate::{LedgerError, Result, Store, pools, rows};
use log::LevelFilter;
use reckon_domain::ingest::IngestPlan;
use reckon_keyring::{Keyring, files};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{AssertSqlSafe, Sqlite, SqliteConnection};
use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

pub type SqliteLedger = SqlLedger<Lite>;

impl Driver for Lite {
    type DB = Sqlite;
    type Done = sqlx::sqlite::SqliteQueryResult;
    const LOCK_CLAIM: &'static str = "";
    const NOW: &'static str = "((julianday('now') - 2440587.5) * 86400.0)";
    const LOCK_EFFECT: &'static str = "";
    const LOCK_FENCE: &'static str = "";
    const EVIDENCE_PROVIDERS: &'static str = "json_extract(evidence, '$.providers')";
    const LOCK_SOURCE: &'static str = "";
    const PLAN_EACH_TIME: bool = false;
    const INSERT_FIRST: bool = false;

    async fn begin(
        l: &SqliteLedger,
        _scope: Scope<'_>,
        write: bool,
    ) -> Result<sqlx::Transaction<'static, Sqlite>> {
        let started = Instant::now();
        let tx = if write {
            l.pool_now().begin_with("BEGIN IMMEDIATE").await?
        } else {
            l.pool_now().begin().await?
        };
        pools::note_acquire(
            started,
            "every connection in use, or another writer's lock held",
        );
        Ok(tx)
    }

    async fn rescope(
        _tx: &mut sqlx::Transaction<'static, Sqlite>,
        _scope: Scope<'_>,
    ) -> Result<()> {
        Ok(())
    }

    /// Appends to a tenant's audit chain, and the scrub that re-links it, are serialised
    /// by the write transaction itself (`BEGIN IMMEDIATE`).
    async fn lock_audit_chain(
        _tx: &mut sqlx::Transaction<'static, Sqlite>,
        _tenant: TenantId,
    ) -> Result<()> {
        Ok(())
    }

    async fn migrate_schema(l: &SqliteLedger) -> Result<()> {
        sqlx::migrate!("../../migrations/sqlite")
            .run(&l.pool)
            .await?;
        Ok(())
    }

    async fn existing(
        conn: &mut SqliteConnection,
        tenant: TenantId,
        source_id: i64,
        keys: &[&str],
    ) -> Result<Existing> {
        let keys_json = serde_json::to_string(keys).expect("strings serialize");
        let found = sqlx::query(AssertSqlSafe(format!(
            "SELECT {} FROM effect WHERE tenant_id = $1 AND source_id = $2 \
             AND key IN (SELECT value FROM json_each($3))",
            rows::SNAPSHOT_COLUMNS
        )))
        .bind(tenant.0)
        .bind(source_id)
        .bind(keys_json)
        .fetch_all(&mut *conn)
        .await?;
        rows::existing::<Sqlite>(&found)
    }

    /// Row by row: SQLite runs in-process, so a statement per row costs no round trip.
    async fn write_plan(
        tx: &mut SqliteConnection,
        tenant: TenantId,
        source_id: i64,
        batch: &IngestBatch,
        plan: &IngestPlan,
        _insert_first: bool,
    ) -> Result<bool> {
        let now = batch.observed_at;
        let mut ids: HashMap<&str, i64> = HashMap::new();
        let creates = plan.creates.iter().map(|w| (w, true));
        for (w, new) in creates.chain(plan.updates.iter().map(|(_, w)| (w, false))) {
            let r = &w.record;
            // A new key is inserted; a changed one (its key already held) is updated in
            // place, keeping when it was first seen.
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO effect (tenant_id, source_id, key, operation, key_version, subject, \
                 state, request_hash, response, attempts, created_at, updated_at, expires_at, \
                 abandoned_at, first_seen_at, last_changed_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $15) \
                 ON CONFLICT (tenant_id, source_id, key) DO UPDATE SET state = excluded.state, \
                 request_hash = excluded.request_hash, response = excluded.response, \
                 attempts = excluded.attempts, created_at = excluded.created_at, \
                 updated_at = excluded.updated_at, expires_at = excluded.expires_at, \
                 abandoned_at = excluded.abandoned_at, last_changed_at = excluded.last_changed_at, \
                 gone_at = NULL, gone_reason = NULL RETURNING id",
            )
            .bind(tenant.0)
            .bind(source_id)
            .bind(&r.key)
            .bind(&w.operation)
            .bind(&w.key_version)
            .bind(&w.subject)
            .bind(r.state.as_str())
            .bind(&r.request_hash)
            .bind(&r.response)
            .bind(r.attempts)
            .bind(r.created_at)
            .bind(r.updated_at)
            .bind(r.expires_at)
            .bind(w.abandoned_at)
            .bind(now)
            .fetch_one(&mut *tx)
            .await?;
            // A key's parts never change; the ids of its recorded result come with the
            // result, so they are written whenever the row is (a stale one stays: the
            // application once showed it).
            let parts = w.extra_parts.iter().filter(|_| new);
            for part in parts.chain(w.recorded_ids.iter()) {
                sqlx::query(
                    "INSERT OR IGNORE INTO effect_key_part (effect_id, tenant_id, part) \
                     VALUES ($1, $2, $3)",
                )
                .bind(id)
                .bind(tenant.0)
                .bind(part)
                .execute(&mut *tx)
                .await?;
            }
            ids.insert(r.key.as_str(), id);
        }
        for ev in &plan.events {
            let id = ids[ev.key.as_str()];
            sqlx::query(
                "INSERT INTO effect_event (tenant_id, effect_id, observed_at, origin, kind, \
                 from_state, to_state, attempts, source_updated_at, detail) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            )
            .bind(tenant.0)
            .bind(id)
            .bind(now)
            .bind(batch.origin.as_str())
            .bind(ev.kind)
            .bind(ev.from_state)
            .bind(ev.to_state)
            .bind(ev.attempts)
            .bind(ev.source_updated_at)
            .bind(&ev.detail)
            .execute(&mut *tx)
            .await?;
        }
        Ok(true)
    }

    async fn metrics_snapshot(l: &SqliteLedger, q: MetricsQuery) -> Result<MetricsSnapshot> {
        let tenant = tenant_param(&q);
        // One read transaction, so the answers describe the same moment.
        let mut tx = Self::begin(l, Scope::Global, false).await?;
        let unresolved = sqlx::query(UNRESOLVED_SQL)
            .bind(q.now)
            .bind(q.replay_closing_created_before)
            .bind(tenant)
            .bind(q.replay_closed_created_before)
            .fetch_all(&mut *tx)
            .await?;
        let mut by_tenant = Vec::new();
        for sql in [SOURCES_SQL, QUARANTINE_SQL, PROVIDERS_SQL] {
            by_tenant.push(sqlx::query(sql).bind(tenant).fetch_all(&mut *tx).await?);
        }
        tx.commit().await?;
        Ok(MetricsSnapshot {
            unresolved: rows::all(&unresolved)?,
            sources: rows::all(&by_tenant[0])?,
            quarantine: rows::all(&by_tenant[1])?,
            providers: rows::all(&by_tenant[2])?,
        })
    }

    async fn mark(&self, name: &str) -> bool {
        let Some(dir) = &self.marks else { return false };
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.contains_key(name) {
            return true;
        }
        // One file per lease; names that meet in one file make a taker wait for the term,
        // never take a lease from a holder still present.
        let file: String = (name.chars().take(100))
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let (dir, path) = (dir.as_path(), dir.join(file));
        let open = files::create_private_dir(dir).and_then(|()| files::create_private_file(&path));
        match open.and_then(|()| std::fs::OpenOptions::new().write(true).open(&path)) {
            Ok(f) if f.try_lock().is_ok() => held.insert(name.to_owned(), f).is_none(),
            _ => false,
        }
    }

    async fn unmark(&self, name: &str) {
        // Closing the file lets its lock go.
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name);
    }
}

impl SqliteLedger {
    pub async fn open_file(path: &Path, keyring: Keyring) -> Result<SqliteLedger> {
        if let Some(dir) = path.parent() {
            files::create_private_dir(dir).map_err(|e| {
                LedgerError::Invalid(format!("cannot create data directory {dir:?}: {e}"))
            })?;
        }
        Self::open_options(SqliteConnectOptions::new().filename(path), keyring).await
    }

    pub async fn open_url(url: &str, keyring: Keyring) -> Result<SqliteLedger> {
        let opts = SqliteConnectOptions::from_str(url).map_err(LedgerError::Database)?;
        Self::open_options(opts, keyring).await
    }

    async fn open_options(opts: SqliteConnectOptions, keyring: Keyring) -> Result<SqliteLedger> {
        // Made 0600 before SQLite creates it 0644 (see files.rs); its -wal and -shm follow.
        let file = opts.get_filename();
        let name = file.to_string_lossy();
        let on_disk = !name.is_empty() && !name.contains(":memory:") && !name.starts_with("file:");
        if on_disk {
            files::create_private_file(file).map_err(|e| {
                LedgerError::Invalid(format!("cannot create the ledger file {file:?}: {e}"))
            })?;
        }
        let marks = on_disk.then(|| {
            let mut dir = file.as_os_str().to_owned();
            dir.push(".leases");
            dir.into()
        });
        let opts = opts
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(30))
            .foreign_keys(true);
        let pool_of = |max| {
            SqlitePoolOptions::new()
                .max_connections(max)
                // Slow acquires are warned of by `pools::note_acquire`, at most once a minute.
                .acquire_slow_level(LevelFilter::Off)
        };
        let pool = pool_of(4).connect_with(opts.clone()).await?;
        // The operator's view reads a file of its own connections; a database in memory
        // lives in its connections, so it has one pool only.
        let operator = if on_disk {
            pool_of(pools::OPERATOR_CONNECTIONS).connect_lazy_with(opts)
        } else {
            pool.clone()
        };
        let ledger = SqlLedger {
            pool,
            operator,
            keyring,
            driver: Lite {
                marks,
                held: Mutex::default(),
            },
        };
        ledger.migrate().await?;
        Ok(ledger)
    }
}
