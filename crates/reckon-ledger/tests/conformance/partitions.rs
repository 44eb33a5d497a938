//! PostgreSQL: `effect` and `provider_charge` are partitioned by hash of `tenant_id`
//! (migration 0027), so that a tenant's reads and writes cost its partition, not the
//! ledger:
//!
//! - every tenant-scoped call of the ledger touches only its tenant's partitions (counted
//!   by PostgreSQL's own per-table statistics), while the operator's scrape, which reads
//!   every tenant, is seen touching the others: the count can tell;
//! - and names its tenant in SQL, so that PostgreSQL prunes the other partitions when it
//!   plans the statement: every other partition is locked away from the ledger while those
//!   calls run, and a statement naming its tenant only through row-level security (pruned
//!   only when it starts, after it has planned and locked all 16) waits and fails;
//! - a ledger written before the migration comes through it whole: every effect with its
//!   id, first sight, history, verdict and parked flag, every charge, the id sequence
//!   continuing, and the foreign keys now also holding the tenant.
//!
//! Run: `cargo test -p reckon-ledger --test conformance -- partitions::` (PostgreSQL at 127.0.0.1:5432).

use crate::support;

use reckon_domain::{SourceRecord, State, time};
use reckon_ledger::{
    EffectQuery, Ledger, MetricsQuery, NewAttempt, NewProvider, NewResolution, NewSource,
    NewWriteback, Origin, Outcome, QueueQuery, ReplayClosing, SourceKind, StoredCharge, TenantId,
    WritebackAction, WritebackPolicy,
};
use secrecy::SecretString;
use sqlx::postgres::{PgConnection, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, Row};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use support::{TestDb, batch, push_source};

fn record(key: &str, state: State, at: f64) -> SourceRecord {
    SourceRecord {
        key: key.to_owned(),
        state,
        request_hash: "1:abc".to_owned(),
        response: (state == State::Succeeded).then(|| r#"{"id":"ch_1"}"#.to_owned()),
        attempts: 1,
        created_at: at - 1.0,
        updated_at: at,
        expires_at: None,
    }
}

fn charge(provider_id: i64, id: &str, created: f64) -> StoredCharge {
    StoredCharge {
        provider_id,
        charge_id: id.into(),
        payment_intent: None,
        amount: 1200,
        currency: "usd".into(),
        status: "succeeded".into(),
        amount_captured: 1200,
        amount_refunded: 0,
        refunds: serde_json::json!([]),
        metadata: serde_json::json!({"idempotency_key": format!("charge:v1:{id}")}),
        idempotency_key: Some(format!("charge:v1:{id}")),
        customer: None,
        created,
        raw: serde_json::json!({"id": id}),
        imported_at: 1.0,
    }
}

fn attempt(outcome: &str, at: f64, resolve: bool) -> NewAttempt {
    NewAttempt {
        provider_id: None,
        started_at: at,
        finished_at: at,
        outcome: Outcome::parse(outcome).expect("an outcome word"),
        method: Some("test".to_owned()),
        error: None,
        evidence: serde_json::json!({ "outcome": outcome }),
        next_attempt_at: at + 60.0,
        non_final: false,
        needs_attention: false,
        resolve,
    }
}

/// A tenant with a source, a provider routed for `charge`, effects of every kind and
/// charges beside them.
async fn tenant_with_rows(l: &dyn Ledger, slug: &str, now: f64) -> (TenantId, i64, i64) {
    let t = l.create_tenant(slug).await.unwrap().id;
    let s = l.add_source(t, push_source("shop")).await.unwrap();
    let p = l
        .add_provider(
            t,
            NewProvider {
                name: "pay".into(),
                kind: reckon_ledger::ProviderKind::Demo,
                secret: None,
                settings: serde_json::json!({}),
            },
        )
        .await
        .unwrap();
    l.set_route(t, "shop", "charge", Some("pay")).await.unwrap();
    let mut recs: Vec<SourceRecord> = (0..20)
        .map(|i| {
            record(
                &format!("charge:v1:{slug}-{i}"),
                State::Succeeded,
                now - 500.0,
            )
        })
        .collect();
    recs.extend((0..5).map(|i| {
        record(
            &format!("charge:v1:{slug}-u{i}"),
            State::Unknown,
            now - 400.0,
        )
    }));
    l.ingest(t, s.id, batch(recs)).await.unwrap();
    let charges: Vec<StoredCharge> = (0..20)
        .map(|i| charge(p.id, &format!("{slug}-{i}"), now - 499.0))
        .collect();
    l.store_provider_charges(t, &charges).await.unwrap();
    (t, s.id, p.id)
}

/// Reads, index and sequential, and rows written, of each partition of `effect` and
/// `provider_charge`, as PostgreSQL's statistics count them.
async fn partition_activity(conn: &mut PgConnection) -> BTreeMap<String, i64> {
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query(
        "SELECT relname::text, seq_scan + COALESCE(idx_scan, 0) + n_tup_ins + n_tup_upd \
         + n_tup_del FROM pg_stat_user_tables \
         WHERE relname ~ '^(effect|provider_charge)_[0-9]+$'",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap()
    .into_iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// The partition of `table` holding `tenant`'s rows. Asked on a session of its own that
/// ends before returning: a session flushes its table statistics at most once a second
/// while it lives, so a read of the other tenant's partition on the test's long-lived
/// session could reach the counters after the "before" snapshot and look like a touch.
async fn partition_of(url: &str, table: &str, tenant: TenantId) -> String {
    let mut conn = PgConnection::connect(url).await.unwrap();
    let name = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT DISTINCT tableoid::regclass::text FROM {table} WHERE tenant_id = $1"
    )))
    .bind(tenant.get())
    .fetch_one(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
    name
}

/// A backend's statistics reach the shared counters when it ends: drop the ledger, end
/// whatever sessions its pool still keeps (a session flushes its counts as it exits) and
/// wait until none is left.
async fn close_and_settle(ledger: Arc<dyn Ledger>, conn: &mut PgConnection) {
    drop(ledger);
    for _ in 0..200 {
        let others: i64 = sqlx::query_scalar(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_one(&mut *conn)
        .await
        .unwrap();
        if others == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the ledger's sessions did not end");
}

/// Every partition of `effect` and `provider_charge` but `keep`, locked until the
/// returned connection's transaction ends.
async fn lock_partitions_but(url: &str, keep: &[String]) -> PgConnection {
    let mut holder = PgConnection::connect(url).await.unwrap();
    let others: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
         WHERE i.inhparent IN ('effect'::regclass, 'provider_charge'::regclass) \
         AND c.relkind = 'r' ORDER BY 1",
    )
    .fetch_all(&mut holder)
    .await
    .unwrap()
    .into_iter()
    .filter(|name| !keep.contains(name))
    .collect();
    assert_eq!(
        others.len(),
        30,
        "16 partitions of each table, less the tenant's"
    );
    sqlx::raw_sql(AssertSqlSafe(format!(
        "BEGIN; LOCK TABLE {} IN ACCESS EXCLUSIVE MODE",
        others.join(", ")
    )))
    .execute(&mut holder)
    .await
    .unwrap();
    holder
}

#[tokio::test]
async fn a_tenants_calls_lock_and_touch_only_its_partitions_and_the_fleet_scrape_is_seen_touching_the_others()
 {
    let db = TestDb::postgres().await;
    let mut conn = PgConnection::connect(&db.pg_url()).await.unwrap();
    let now = time::now();
    let l = db.ledger();
    let (a, a_source, a_provider) = tenant_with_rows(&*l, "tenant-a", now).await;
    let (b, _, _) = tenant_with_rows(&*l, "tenant-b", now).await;
    let b_parts = [
        partition_of(&db.pg_url(), "effect", b).await,
        partition_of(&db.pg_url(), "provider_charge", b).await,
    ];
    assert_ne!(
        partition_of(&db.pg_url(), "effect", a).await,
        b_parts[0],
        "the two tenants share a partition: the test could not tell them apart"
    );
    // A scanned source, for the write-back path (the ledger never connects to it).
    let scanned = NewSource {
        kind: SourceKind::Sqlite,
        dsn: Some(SecretString::from("/data/shop.db".to_owned())),
        dsn_display: Some("sqlite:///data/shop.db".into()),
        ..push_source("db")
    };
    let a_scanned = l.add_source(a, scanned).await.unwrap().id;
    let a_parts = [
        partition_of(&db.pg_url(), "effect", a).await,
        partition_of(&db.pg_url(), "provider_charge", a).await,
    ];
    // The ledger's next sessions plan each statement for its parameters (a cached generic
    // plan locks every partition by design, whatever the statement names), and give up on
    // a lock after a while instead of waiting for the holder below.
    let database: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    sqlx::raw_sql(AssertSqlSafe(format!(
        "ALTER DATABASE \"{database}\" SET plan_cache_mode = force_custom_plan; \
         ALTER DATABASE \"{database}\" SET lock_timeout = '5s'"
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    close_and_settle(l, &mut conn).await;
    let before = partition_activity(&mut conn).await;

    // Tenant A's day: every tenant-scoped path that reads or writes effects or charges,
    // while no other partition can be locked (a call that would fails on its lock).
    let l = db.raw.reopen().await;
    let mut holder = lock_partitions_but(&db.pg_url(), &a_parts).await;
    let more: Vec<SourceRecord> = (0..3)
        .map(|i| {
            record(
                &format!("charge:v1:tenant-a-n{i}"),
                State::Unknown,
                now - 300.0,
            )
        })
        .collect();
    l.ingest(a, a_source, batch(more)).await.unwrap();
    l.present_keys(a, a_source, 0, 100).await.unwrap();
    let q = EffectQuery {
        source: None,
        state: None,
        unresolved: Some(true),
        operation: None,
        updated_since: None,
        after_id: None,
        limit: 50,
        now,
    };
    assert_eq!(l.list_effects(a, &q).await.unwrap().len(), 8);
    l.get_effect(a, "shop", "charge:v1:tenant-a-3")
        .await
        .unwrap()
        .unwrap();
    assert!(!l.lookup(a, "tenant-a-4", 10).await.unwrap().is_empty());
    let claims = l.claim_due(a, "w", now, 60.0, 10).await.unwrap();
    assert_eq!(claims.len(), 8);
    l.record_attempt(
        a,
        claims[0].effect.id,
        "w",
        attempt("not_applied", now, true),
    )
    .await
    .unwrap();
    let mut looked_again = attempt("indeterminate", now, false);
    looked_again.provider_id = Some(a_provider);
    l.record_attempt(a, claims[1].effect.id, "w", looked_again)
        .await
        .unwrap();
    let by_hand = NewResolution {
        outcome: Outcome::NotApplied,
        author: "user:finance@a.test".into(),
        note: Some("refunded by hand".into()),
        evidence: serde_json::json!({}),
    };
    l.resolve_by_hand(a, claims[2].effect.id, by_hand)
        .await
        .unwrap();
    let ids: Vec<i64> = claims.iter().map(|c| c.effect.id).collect();
    assert_eq!(l.resolved_among(a, &ids).await.unwrap().len(), 2);
    let queue = QueueQuery {
        now,
        limit: 50,
        ..Default::default()
    };
    assert_eq!(l.unresolved_queue(a, &queue).await.unwrap().len(), 6);
    l.unresolved_summary(a, now, ReplayClosing::NONE)
        .await
        .unwrap();
    let scrape = |tenant| MetricsQuery {
        tenant,
        now,
        replay_closing_created_before: 0.0,
        replay_closed_created_before: 0.0,
    };
    let mut effects = 0;
    l.each_effect_created_between(a, now - 1000.0, now, now, &mut |_| effects += 1)
        .await
        .unwrap();
    assert_eq!(effects, 28);
    let mut charges = 0;
    l.each_charge_to_match(a, Some(a_provider), now - 1000.0, now, &mut |_| {
        charges += 1;
    })
    .await
    .unwrap();
    assert_eq!(charges, 20);
    let found = l
        .charges_by_ids_or_keys(
            a,
            &["tenant-a-1".into()],
            &["charge:v1:tenant-a-2".into()],
            10,
        )
        .await
        .unwrap();
    assert_eq!(found.len(), 2);
    l.store_provider_charges(a, &[charge(a_provider, "tenant-a-late", now)])
        .await
        .unwrap();
    // A source row that changed since it was seen: the ingest's update of an effect.
    let changed = record("charge:v1:tenant-a-5", State::Succeeded, now - 100.0);
    l.ingest(a, a_source, batch(vec![changed])).await.unwrap();
    // A person's "look again" over a provider's indeterminate answers, and a lookup
    // asked for one effect now.
    let requeued = l
        .requeue_indeterminate(a, a_provider, now - 1000.0, now, now)
        .await
        .unwrap();
    assert_eq!(requeued, 1);
    let one = l
        .claim_effect(a, claims[1].effect.id, "w2", now, 60.0)
        .await
        .unwrap();
    assert!(one.is_some());
    // Write-back: a verdict on a scanned source's effect becomes a candidate and an intent.
    let key = "charge:v1:tenant-a-db1";
    let seen = record(key, State::Unknown, now - 200.0);
    l.ingest(a, a_scanned, batch(vec![seen])).await.unwrap();
    let id = l.get_effect(a, "db", key).await.unwrap().unwrap().effect.id;
    l.claim_effect(a, id, "w3", now, 60.0)
        .await
        .unwrap()
        .unwrap();
    l.record_attempt(a, id, "w3", attempt("applied", now, true))
        .await
        .unwrap();
    l.set_source_writeback(a, "db", Some(WritebackPolicy::Release))
        .await
        .unwrap();
    let candidates = l.writeback_candidates(a, None, 10).await.unwrap();
    assert_eq!(candidates.len(), 1);
    let c = &candidates[0];
    let intent = NewWriteback {
        source_id: c.source_id,
        effect_id: c.effect_id,
        resolution_id: c.resolution.id,
        key: c.key.clone(),
        action: WritebackAction::Succeed,
        seen_state: c.state.clone(),
        seen_updated_at: c.updated_at,
        new_response: Some(r#"{"id":"ch_db1"}"#.into()),
        new_updated_at: now,
    };
    l.begin_writeback(a, intent, None).await.unwrap();
    let gone = l
        .mark_gone(
            a,
            a_source,
            &["charge:v1:tenant-a-7".into()],
            now,
            Origin::Scan,
            None,
        )
        .await
        .unwrap();
    assert_eq!(gone.len(), 1);
    sqlx::raw_sql("COMMIT").execute(&mut holder).await.unwrap();
    holder.close().await.ok();
    // The scrape runs one generic plan for every tenant on purpose (planning it for each
    // took four times its execution), which locks every partition whatever it names; row-
    // level security prunes when it starts, so it still reads only the tenant's.
    l.metrics_snapshot(scrape(Some(a))).await.unwrap();
    close_and_settle(l, &mut conn).await;
    let after_a = partition_activity(&mut conn).await;
    let moved = |from: &BTreeMap<String, i64>, to: &BTreeMap<String, i64>| -> Vec<String> {
        to.iter()
            .filter(|(k, v)| from.get(*k) != Some(*v))
            .map(|(k, _)| k.clone())
            .collect()
    };
    let touched = moved(&before, &after_a);
    assert_eq!(
        touched,
        a_parts.to_vec(),
        "tenant A's calls touched other partitions"
    );

    // The operator's scrape reads every tenant: the counters see it reach B's partition.
    let l = db.raw.reopen().await;
    let fleet = l.metrics_snapshot(scrape(None)).await.unwrap();
    assert_eq!(
        fleet.unresolved.iter().map(|g| g.unknown).sum::<i64>(),
        5 + 6
    );
    close_and_settle(l, &mut conn).await;
    let after_fleet = partition_activity(&mut conn).await;
    assert!(
        moved(&after_a, &after_fleet).contains(&b_parts[0]),
        "the fleet scrape was not seen reading tenant B's effects"
    );
    conn.close().await.ok();
    db.finish().await;
}

/// The migrations before 0027, copied where a runtime migrator can read them.
fn migrations_before_partitioning() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations/postgres");
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let version: u32 = name.get(..4).and_then(|v| v.parse().ok()).unwrap();
        if version < 27 {
            std::fs::copy(&path, dir.path().join(&name)).unwrap();
        }
    }
    dir
}

#[tokio::test]
async fn a_ledger_written_before_the_partitioning_comes_through_it_whole() {
    let db = TestDb::postgres().await;
    let url = db.pg_url();
    let admin_url = url.rsplit_once('/').unwrap().0.to_owned() + "/postgres";
    let name = format!("reckon_t_{:016x}", rand::random::<u64>());
    let mut admin = PgConnection::connect(&admin_url).await.unwrap();
    sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
        .execute(&mut admin)
        .await
        .unwrap();
    let old_url = url.rsplit_once('/').unwrap().0.to_owned() + "/" + &name;
    let dir = migrations_before_partitioning();
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&old_url)
        .await
        .unwrap();
    sqlx::migrate::Migrator::new(dir.path())
        .await
        .unwrap()
        .run(&pool)
        .await
        .unwrap();

    // As 0026 left a ledger: two tenants, effects (one resolved, one parked, one with a
    // history row past its first sight), charges. Written as the tables' owner.
    sqlx::raw_sql(
        "INSERT INTO tenant (slug, created_at) VALUES ('tenant-a', 1), ('tenant-b', 1); \
         INSERT INTO source (tenant_id, name, kind, table_name, scan_interval_secs, \
             abandoned_after_secs, overlap_secs, full_scan_every_secs, created_at) \
         VALUES (1, 'shop', 'push', 'justonce_keys', 60, 300, 5, 3600, 1), \
                (2, 'shop', 'push', 'justonce_keys', 60, 300, 5, 3600, 1); \
         INSERT INTO provider (tenant_id, name, kind, settings, created_at) \
         VALUES (1, 'pay', 'demo', '{}', 1), (2, 'pay', 'demo', '{}', 1); \
         INSERT INTO effect (tenant_id, source_id, key, operation, key_version, subject, \
             state, request_hash, attempts, created_at, updated_at, first_seen_at, \
             last_changed_at, first_event_id, first_origin, first_state, first_attempts, \
             first_updated_at) \
         SELECT t, t, 'charge:v1:o' || g, 'charge', 'v1', 'o' || g, \
             CASE WHEN g % 4 = 0 THEN 'succeeded' ELSE 'unknown' END, '1:abc', 1, \
             1000 + g, 1001 + g, 2000, 2000, nextval('effect_event_id_seq'), 'scan', \
             'unknown', 1, 1001 + g \
         FROM generate_series(1, 40) g, (VALUES (1), (2)) v(t); \
         INSERT INTO effect_event (tenant_id, effect_id, observed_at, origin, kind, \
             from_state, to_state, attempts, source_updated_at) \
         SELECT tenant_id, id, 3000, 'scan', 'changed', 'unknown', 'succeeded', 1, 2500 \
         FROM effect WHERE state = 'succeeded'; \
         INSERT INTO resolution (tenant_id, effect_id, outcome, author, evidence, created_at) \
         SELECT tenant_id, id, 'not_applied', 'user:f@x.test', '{}', 3000 \
         FROM effect WHERE key = 'charge:v1:o1'; \
         INSERT INTO reconcile_state (effect_id, tenant_id, attempts, next_attempt_at, \
             needs_attention) \
         SELECT id, tenant_id, 5, 9e9, TRUE FROM effect WHERE key = 'charge:v1:o2'; \
         INSERT INTO provider_charge (tenant_id, provider_id, charge_id, amount, currency, \
             status, amount_captured, amount_refunded, refunds, metadata, created, raw, \
             imported_at) \
         SELECT t, t, 'ch_' || g, 500, 'usd', 'succeeded', 500, 0, '[]', '{}', 1000 + g, \
             '{}', 1 FROM generate_series(1, 30) g, (VALUES (1), (2)) v(t);",
    )
    .execute(&pool)
    .await
    .unwrap();
    let snapshot = "SELECT string_agg(concat_ws('|', id, tenant_id, source_id, key, state, \
        created_at, updated_at, first_event_id, first_state, resolved, parked), ',' \
        ORDER BY id) FROM effect";
    let charges = "SELECT string_agg(concat_ws('|', tenant_id, provider_id, charge_id, \
        created), ',' ORDER BY tenant_id, charge_id) FROM provider_charge";
    let old_effects: String = sqlx::query_scalar(snapshot).fetch_one(&pool).await.unwrap();
    let old_charges: String = sqlx::query_scalar(charges).fetch_one(&pool).await.unwrap();
    let flags: (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE resolved), count(*) FILTER (WHERE parked) FROM effect",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(flags, (2, 2), "the old ledger's triggers kept its flags");
    let last_id: i64 = sqlx::query_scalar("SELECT max(id) FROM effect")
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;

    // The upgrade: reckon opens the old ledger and runs what it has not.
    let ledger = reckon_ledger::connect(
        Some(&old_url),
        std::env::temp_dir().as_path(),
        support::keyring(),
    )
    .await
    .unwrap();
    let mut conn = PgConnection::connect(&old_url).await.unwrap();
    let kinds: Vec<(String, String)> = sqlx::query_as(
        "SELECT c.relname::text, c.relkind::text FROM pg_class c \
         WHERE c.relname IN ('effect', 'provider_charge') ORDER BY 1",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        kinds,
        vec![
            ("effect".to_owned(), "p".to_owned()),
            ("provider_charge".to_owned(), "p".to_owned())
        ]
    );
    let parts: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_inherits WHERE inhparent = 'effect'::regclass")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(parts, 16);
    let new_effects: String = sqlx::query_scalar(snapshot)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let new_charges: String = sqlx::query_scalar(charges)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(new_effects, old_effects, "the effects changed in the move");
    assert_eq!(new_charges, old_charges, "the charges changed in the move");

    // Through the ledger: history with its first sight, the verdict kept out of the
    // backlog, the parked effect still counted, the charges read, new ids after the old.
    let a = ledger.tenant_by_slug("tenant-a").await.unwrap().id;
    let d = ledger
        .get_effect(a, "shop", "charge:v1:o4")
        .await
        .unwrap()
        .unwrap();
    let kinds: Vec<&str> = d.history.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["first_seen", "changed"]);
    let now = time::now();
    let summary = ledger
        .unresolved_summary(a, now, ReplayClosing::NONE)
        .await
        .unwrap();
    // 30 unknown, one of them resolved by a person.
    assert_eq!(summary.iter().map(|k| k.count).sum::<i64>(), 29);
    let scrape = MetricsQuery {
        tenant: Some(a),
        now,
        replay_closing_created_before: 0.0,
        replay_closed_created_before: 0.0,
    };
    let m = ledger.metrics_snapshot(scrape).await.unwrap();
    assert_eq!(
        m.unresolved.iter().map(|g| g.needs_attention).sum::<i64>(),
        1
    );
    let stored = ledger.provider_charges(a, None, 0.0, 1e10).await.unwrap();
    assert_eq!(stored.len(), 30);
    let s = ledger.source_by_name(a, "shop").await.unwrap();
    ledger
        .ingest(
            a,
            s.id,
            batch(vec![record("charge:v1:new", State::Unknown, now)]),
        )
        .await
        .unwrap();
    let new = ledger
        .get_effect(a, "shop", "charge:v1:new")
        .await
        .unwrap()
        .unwrap();
    assert!(new.effect.id > last_id, "{} after {last_id}", new.effect.id);

    // The foreign keys name the tenant too: a state row can no longer point at another
    // tenant's effect, even written by the tables' owner.
    let b = ledger.tenant_by_slug("tenant-b").await.unwrap().id;
    let wrong = sqlx::query(
        "INSERT INTO reconcile_state (effect_id, tenant_id, next_attempt_at) VALUES ($1, $2, 0)",
    )
    .bind(new.effect.id)
    .bind(b.get())
    .execute(&mut conn)
    .await;
    assert!(wrong.is_err(), "a state row named another tenant's effect");
    drop(ledger);
    conn.close().await.ok();
    let _ = sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
    )))
    .execute(&mut admin)
    .await;
    admin.close().await.ok();
    db.finish().await;
}
