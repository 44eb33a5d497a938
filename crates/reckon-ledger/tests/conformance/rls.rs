//! PostgreSQL row-level security, the backstop under the tenant-scoped types (T04, T05, T06):
//!
//! - every table with a `tenant_id` column has RLS enabled AND forced and at least one
//!   policy (a table a later migration adds without policies fails here);
//! - the application role is not a superuser, has no BYPASSRLS, owns no table;
//! - a raw query as the application role that forgets to set the tenant sees nothing, one
//!   that sets tenant B sees nothing of tenant A, and cannot write rows for tenant A;
//! - a transaction abandoned mid-way never leaves its tenant on the pooled connection;
//! - (T07) weakening any seeded table's protection (RLS off, or a permissive policy) makes
//!   the raw-query check see another tenant's rows, so that check catches the regression.
//!
//! Run: `cargo test -p reckon-ledger --test conformance -- rls::` (PostgreSQL at 127.0.0.1:5432, trust).

use crate::support;

use reckon_domain::{SourceRecord, State, time};
use reckon_ledger::{Admission, IngestBatch, Origin, Role, TokenCreator};
use sqlx::postgres::{PgConnection, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, Row};
use support::{RawDb, TestDb, push_source};

fn record(key: &str) -> SourceRecord {
    SourceRecord {
        key: key.to_owned(),
        state: State::Unknown,
        request_hash: "1:abc".to_owned(),
        response: None,
        attempts: 1,
        created_at: 1_700_000_000.0,
        updated_at: 1_700_000_001.0,
        expires_at: None,
    }
}

/// Two tenants with a source, an effect with history, a key part, a quarantine-free batch,
/// a token, a person and a session each.
async fn two_tenants(db: &TestDb) -> (i64, i64) {
    let l = db.ledger();
    let mut ids = Vec::new();
    for slug in ["tenant-a", "tenant-b"] {
        let t = l.create_tenant(slug).await.unwrap();
        let s = l.add_source(t.id, push_source("shop")).await.unwrap();
        // First seen (kept in the effect's own row), then changed (a history row).
        let key = format!("charge:v1:cus_{slug}:ORD-1");
        let changed = SourceRecord {
            attempts: 2,
            updated_at: 1_700_000_002.0,
            ..record(&key)
        };
        for r in [record(&key), changed] {
            l.ingest(
                t.id,
                s.id,
                IngestBatch {
                    origin: Origin::Push,
                    observed_at: time::now(),
                    records: vec![r],
                    rejected: Vec::new(),
                    abandoned_after_secs: 300.0,
                    cursor: None,
                    lease: None,
                    expect_new: false,
                },
            )
            .await
            .unwrap();
        }
        l.create_token_by(
            t.id,
            Role::Admin,
            &format!("hash-{slug}"),
            "t",
            TokenCreator::Operator,
        )
        .await
        .unwrap();
        let u = l
            .create_user(&format!("someone@{slug}.test"), "$argon2id$x")
            .await
            .unwrap();
        l.set_membership(t.id, u.id, Role::Admin).await.unwrap();
        l.record_action(
            t.id,
            reckon_ledger::NewAction {
                actor: format!("user:{}", u.id),
                action: "signin".into(),
                target: None,
                detail: serde_json::json!({}),
                address: None,
            },
        )
        .await
        .unwrap();
        l.create_session(
            t.id,
            reckon_ledger::NewSession {
                id_hash: format!("session-{slug}"),
                user_id: u.id,
                generation: 0,
                csrf_token: "c".into(),
                now: time::now(),
                expires_at: time::now() + 60.0,
            },
        )
        .await
        .unwrap();
        // The dashboard's chart: one hourly snapshot per tenant.
        l.take_snapshot(t.id, time::now()).await.unwrap();
        // A provider charge, with the search terms that name it.
        let p = l
            .add_provider(
                t.id,
                reckon_ledger::NewProvider {
                    name: "pay".into(),
                    kind: reckon_ledger::ProviderKind::Demo,
                    secret: None,
                    settings: serde_json::json!({"base_url": "http://127.0.0.1:9/"}),
                },
            )
            .await
            .unwrap();
        l.store_provider_charges(
            t.id,
            &[reckon_ledger::StoredCharge {
                provider_id: p.id,
                charge_id: format!("ch_{slug}"),
                payment_intent: None,
                amount: 100,
                currency: "usd".into(),
                status: "succeeded".into(),
                amount_captured: 100,
                amount_refunded: 0,
                refunds: serde_json::json!([]),
                metadata: serde_json::json!({"order_id": "ORD-1"}),
                idempotency_key: Some(format!("charge:v1:cus_{slug}:ORD-1")),
                customer: None,
                created: 1_700_000_000.0,
                raw: serde_json::json!({}),
                imported_at: 1_700_000_000.0,
            }],
        )
        .await
        .unwrap();
        ids.push(t.id.get());
    }
    (ids[0], ids[1])
}

/// The tenant tables `two_tenants()` leaves empty: the raw-query checks still look for
/// another tenant's rows there, but cannot ask to see B's own, and the mutation check
/// knows why none of A's are there.
const UNSEEDED: &[&str] = &[
    "effect_key_part",
    "quarantine",
    "provider",
    "provider_route",
    "reconcile_state",
    "reconcile_attempt",
    "provider_lookups",
    "resolution",
    "resolution_retracted",
    "provider_charge",
    "audit_run",
    "writeback",
];

/// The tables with a `tenant_id` column, and with `views`, the views that have one too (a
/// view holds no rows of its own: what it shows is its tables' rows, through their policies).
async fn tenant_tables(conn: &mut PgConnection, views: bool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_class c \
         JOIN pg_namespace n ON n.oid = c.relnamespace \
         JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'tenant_id' AND NOT a.attisdropped \
         WHERE n.nspname = 'public' AND (c.relkind IN ('r', 'p') OR ($1 AND c.relkind = 'v')) \
         ORDER BY 1",
    )
    .bind(views)
    .fetch_all(conn)
    .await
    .unwrap()
}

/// The partitions among them (of `effect` and `provider_charge`): each holds only the
/// tenants its hash sends there, so one may hold none of a given tenant's rows.
async fn partitions(conn: &mut PgConnection) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = 'public' AND c.relispartition AND c.relkind = 'r' ORDER BY 1",
    )
    .fetch_all(conn)
    .await
    .unwrap()
}

#[tokio::test]
async fn every_tenant_table_has_forced_row_level_security_and_the_app_role_bypasses_nothing() {
    let db = TestDb::postgres().await;
    let mut conn = PgConnection::connect(&db.pg_url()).await.unwrap();
    let tables = tenant_tables(&mut conn, false).await;
    for t in [
        "api_token",
        "effect",
        "effect_event",
        "effect_key_part",
        "membership",
        "quarantine",
        "source",
        "web_session",
    ] {
        assert!(tables.iter().any(|x| x == t), "{t} has no tenant_id?");
    }
    for t in &tables {
        let row = sqlx::query(
            "SELECT c.relrowsecurity, c.relforcerowsecurity, \
             (SELECT count(*) FROM pg_policy p WHERE p.polrelid = c.oid) AS policies \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = 'public' AND c.relname = $1",
        )
        .bind(t)
        .fetch_one(&mut conn)
        .await
        .unwrap();
        assert!(row.get::<bool, _>(0), "RLS is not enabled on {t}");
        assert!(row.get::<bool, _>(1), "RLS is not forced on {t}");
        assert!(row.get::<i64, _>(2) >= 1, "{t} has no policy");
    }
    let role =
        sqlx::query("SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = 'reckon_app'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert!(!role.get::<bool, _>(0), "reckon_app is a superuser");
    assert!(!role.get::<bool, _>(1), "reckon_app has BYPASSRLS");
    // Its connections' temporary staging tables excepted: each is private to the session
    // that made it and holds only what that session put there.
    let owned: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner \
         WHERE r.rolname = 'reckon_app' AND c.relpersistence <> 't'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(owned, 0, "reckon_app owns tables");
    conn.close().await.ok();
    db.finish().await;
}

#[tokio::test]
async fn a_raw_query_as_the_app_role_sees_and_writes_nothing_of_another_tenant() {
    let db = TestDb::postgres().await;
    let (a, b) = two_tenants(&db).await;
    let mut conn = PgConnection::connect(&db.pg_url()).await.unwrap();
    let tables = tenant_tables(&mut conn, true).await;
    assert!(tables.iter().any(|t| t == "effect_history"), "{tables:?}");
    let partitions = partitions(&mut conn).await;
    assert!(
        partitions.iter().any(|t| t == "effect_00"),
        "{partitions:?}"
    );
    sqlx::raw_sql("SET ROLE reckon_app")
        .execute(&mut conn)
        .await
        .unwrap();
    let who: String = sqlx::query_scalar("SELECT current_user::text")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(who, "reckon_app");

    // No tenant named: every tenant table is empty.
    for t in &tables {
        let n: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM \"{t}\"")))
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(n, 0, "{t} shows rows with no tenant set");
    }

    // Tenant B named: B's rows only, whatever the query asks for.
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("SELECT set_config('reckon.tenant', $1, true)")
        .bind(b.to_string())
        .execute(&mut *tx)
        .await
        .unwrap();
    for t in &tables {
        let (mine, theirs): (i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT count(*) FILTER (WHERE tenant_id = $1), count(*) FILTER (WHERE tenant_id <> $1) \
             FROM \"{t}\""
        )))
        .bind(b)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        assert_eq!(theirs, 0, "{t} shows another tenant's rows");
        // Tables two_tenants() fills (no quarantined rows or key parts are seeded, nor
        // reconciliation rows: those tables are still checked for "theirs" above).
        if !partitions.contains(t) && !UNSEEDED.contains(&t.as_str()) {
            assert!(mine > 0, "{t} shows none of B's own rows");
        }
    }
    // Updates of A's rows touch nothing; inserting a row for A is refused (WITH CHECK).
    let n = sqlx::query("UPDATE effect SET state = 'succeeded' WHERE tenant_id = $1")
        .bind(a)
        .execute(&mut *tx)
        .await
        .unwrap()
        .rows_affected();
    assert_eq!(n, 0);
    let n = sqlx::query("DELETE FROM source WHERE tenant_id = $1")
        .bind(a)
        .execute(&mut *tx)
        .await
        .unwrap()
        .rows_affected();
    assert_eq!(n, 0);
    let err = sqlx::query(
        "INSERT INTO source (tenant_id, name, kind, table_name, scan_interval_secs, \
         abandoned_after_secs, overlap_secs, full_scan_every_secs, created_at) \
         VALUES ($1, 'planted', 'push', 't', 60, 1, 1, 1, 0)",
    )
    .bind(a)
    .execute(&mut *tx)
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains("row-level security"),
        "unexpected error: {err}"
    );
    drop(tx);
    conn.close().await.ok();

    // Through the ledger, A still has exactly its own effect.
    let l = db.ledger();
    let ta = l.tenant_by_slug("tenant-a").await.unwrap();
    let found = l.lookup(ta.id, "ORD-1", 10).await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].key, "charge:v1:cus_tenant-a:ORD-1");
    assert_eq!(found[0].state, State::Unknown);
    db.finish().await;
}

/// What the raw-query check above (T05) sees as tenant B through `conn` (the owner's
/// connection, inside a transaction): (rows of another tenant with B named, rows with no
/// tenant named), as the application role.
async fn t05_sees(conn: &mut PgConnection, table: &str, b: i64) -> (i64, i64) {
    sqlx::raw_sql("SET LOCAL ROLE reckon_app")
        .execute(&mut *conn)
        .await
        .unwrap();
    let none: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM \"{table}\"")))
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    sqlx::query("SELECT set_config('reckon.tenant', $1, true)")
        .bind(b.to_string())
        .execute(&mut *conn)
        .await
        .unwrap();
    let theirs: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{table}\" WHERE tenant_id <> $1"
    )))
    .bind(b)
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    (theirs, none)
}

/// T07, the row-level-security half: each tenant table's protection is weakened in turn,
/// inside a transaction rolled back afterwards (DDL is transactional in PostgreSQL), in two
/// ways: RLS disabled, and every policy replaced by a permissive `USING (true)` one. For
/// every table that holds tenant A's rows, the raw-query check of T05 (as the application
/// role, tenant B named, and no tenant named) then sees A's rows, so a regression of that
/// kind fails T05. The tables `two_tenants` leaves empty are listed: a mutation there is
/// caught only by T04's catalog check (RLS disabled, not forced, no policy), not a
/// permissive policy.
#[tokio::test]
async fn weakening_any_tenant_tables_row_level_security_is_caught_by_the_raw_query_check() {
    let db = TestDb::postgres().await;
    let (a, b) = two_tenants(&db).await;
    let mut conn = PgConnection::connect(&db.pg_url()).await.unwrap();
    let tables = tenant_tables(&mut conn, false).await;
    let partitions = partitions(&mut conn).await;
    let mut unseeded = Vec::new();
    let mut killed = 0;
    for t in &tables {
        // The test's connection is the owner (a superuser): it sees every row.
        let of_a: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM \"{t}\" WHERE tenant_id = $1"
        )))
        .bind(a)
        .fetch_one(&mut conn)
        .await
        .unwrap();
        if of_a == 0 {
            unseeded.push(t.clone());
            continue;
        }
        // Unmutated: T05 sees nothing of A.
        let mut tx = conn.begin().await.unwrap();
        assert_eq!(t05_sees(&mut tx, t, b).await, (0, 0), "{t}");
        tx.rollback().await.unwrap();
        // Mutation 1: RLS off.
        let mut tx = conn.begin().await.unwrap();
        sqlx::raw_sql(AssertSqlSafe(format!(
            "ALTER TABLE \"{t}\" NO FORCE ROW LEVEL SECURITY; \
             ALTER TABLE \"{t}\" DISABLE ROW LEVEL SECURITY"
        )))
        .execute(&mut *tx)
        .await
        .unwrap();
        let (theirs, none) = t05_sees(&mut tx, t, b).await;
        assert!(theirs > 0 && none > 0, "RLS off on {t} went unseen");
        tx.rollback().await.unwrap();
        // Mutation 2: the policies replaced by one that lets every row through.
        let mut tx = conn.begin().await.unwrap();
        let policies: Vec<String> = sqlx::query_scalar(
            "SELECT policyname::text FROM pg_policies WHERE schemaname = 'public' AND tablename = $1",
        )
        .bind(t)
        .fetch_all(&mut *tx)
        .await
        .unwrap();
        assert!(!policies.is_empty(), "{t}");
        for p in &policies {
            sqlx::raw_sql(AssertSqlSafe(format!("DROP POLICY \"{p}\" ON \"{t}\"")))
                .execute(&mut *tx)
                .await
                .unwrap();
        }
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE POLICY mutant ON \"{t}\" USING (true) WITH CHECK (true)"
        )))
        .execute(&mut *tx)
        .await
        .unwrap();
        let (theirs, none) = t05_sees(&mut tx, t, b).await;
        assert!(
            theirs > 0 && none > 0,
            "a permissive policy on {t} went unseen"
        );
        tx.rollback().await.unwrap();
        killed += 2;
    }
    // Rolled back: the protection is whole again.
    for t in &tables {
        let mut tx = conn.begin().await.unwrap();
        assert_eq!(
            t05_sees(&mut tx, t, b).await,
            (0, 0),
            "{t} after the mutations"
        );
        tx.rollback().await.unwrap();
    }
    assert!(killed >= 16, "{killed} mutations");
    // Known: the tables two_tenants() does not fill (T05 lists them too).
    // The partitions that hold no row of A are those its hash does not send there; the
    // one that holds its effects was mutated above like any table.
    assert!(
        unseeded.iter().filter(|t| partitions.contains(t)).count() < partitions.len(),
        "{unseeded:?}"
    );
    for t in unseeded.iter().filter(|t| !partitions.contains(t)) {
        assert!(
            UNSEEDED.contains(&t.as_str()),
            "{t} holds no row of tenant A: seed it in two_tenants()"
        );
    }
    conn.close().await.ok();
    db.finish().await;
}

#[tokio::test]
async fn an_abandoned_transaction_leaves_no_tenant_on_the_pooled_connection() {
    let db = TestDb::postgres().await;
    let (_a, b) = two_tenants(&db).await;
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::raw_sql("SET ROLE reckon_app").execute(conn).await?;
                Ok(())
            })
        })
        .connect(&db.pg_url())
        .await
        .unwrap();
    for i in 0..200 {
        let mut tx = pool.begin().await.unwrap();
        sqlx::query("SELECT set_config('reckon.tenant', $1, true)")
            .bind(b.to_string())
            .execute(&mut *tx)
            .await
            .unwrap();
        if i % 2 == 0 {
            // Cancelled mid-flight: the future is dropped before it finishes.
            let q = sqlx::query_scalar::<_, i64>("SELECT count(*) FROM effect, pg_sleep(0.01)")
                .fetch_one(&mut *tx);
            let _ = tokio::time::timeout(std::time::Duration::from_micros(50), q).await;
        }
        drop(tx);
        let mut conn = pool.acquire().await.unwrap();
        let (tenant, effects): (Option<String>, i64) = sqlx::query_as(
            "SELECT NULLIF(current_setting('reckon.tenant', true), ''), \
             (SELECT count(*) FROM effect)",
        )
        .fetch_one(&mut *conn)
        .await
        .unwrap();
        assert_eq!(
            tenant, None,
            "round {i}: a tenant survived on the connection"
        );
        assert_eq!(effects, 0, "round {i}");
    }
    pool.close().await;
    db.finish().await;
}

#[tokio::test]
async fn sqlite_and_postgres_agree_on_accounts() {
    // The same account behaviour on both ledgers (the Accounts impl is one macro body).
    for db in [TestDb::sqlite().await, TestDb::postgres().await] {
        let l = db.ledger();
        let t = l.create_tenant("acme").await.unwrap();
        let u = l
            .create_user(" Alice@Acme.TEST ", "$argon2id$h")
            .await
            .unwrap();
        assert_eq!(u.email, "alice@acme.test");
        assert!(
            l.create_user("alice@acme.test", "$argon2id$h")
                .await
                .is_err()
        );
        assert!(l.create_user("not an email", "$argon2id$h").await.is_err());
        l.set_membership(t.id, u.id, Role::Support).await.unwrap();
        let m = l.memberships(u.id).await.unwrap();
        assert_eq!(m.len(), 1);
        assert_eq!((m[0].0.slug.as_str(), m[0].1), ("acme", Role::Support));
        let creds = l.user_by_email("ALICE@acme.test").await.unwrap().unwrap();
        assert_eq!(creds.generation, 0);
        assert!(creds.totp_secret.is_none());
        l.set_totp_secret(u.id, Some(b"0123456789abcdef"))
            .await
            .unwrap();
        let creds = l.user_by_email("alice@acme.test").await.unwrap().unwrap();
        use secrecy::ExposeSecret;
        assert_eq!(
            creds.totp_secret.unwrap().expose_secret().as_slice(),
            b"0123456789abcdef"
        );
        // The stored secret is ciphertext.
        let cells = db.raw.cells("app_user").await;
        assert!(
            !cells
                .iter()
                .any(|(_, v)| v.windows(16).any(|w| w == b"0123456789abcdef"))
        );
        // The sign-in throttle: an account with three free attempts is locked after them,
        // until a sign-in succeeds.
        let now = time::now();
        let policy = reckon_ledger::ThrottlePolicy {
            account_free: 3,
            account_wide_free: 50,
            lock_secs: 60.0,
            max_lock_secs: 3600.0,
            forget_after_secs: 900.0,
            address_limit: 100,
            address_window_secs: 60.0,
        };
        let admit = || l.throttle_admit("alice@acme.test", "192.0.2.1", None, now, &policy);
        for _ in 0..3 {
            assert_eq!(admit().await.unwrap(), Admission::Admitted);
        }
        assert_eq!(admit().await.unwrap(), Admission::AccountLocked(now + 60.0));
        l.throttle_succeeded("alice@acme.test", "192.0.2.1", None)
            .await
            .unwrap();
        assert_eq!(admit().await.unwrap(), Admission::Admitted);
        // A session dies with its user's generation.
        l.create_session(
            t.id,
            reckon_ledger::NewSession {
                id_hash: "h1".into(),
                user_id: u.id,
                generation: 0,
                csrf_token: "c".into(),
                now,
                expires_at: now + 3600.0,
            },
        )
        .await
        .unwrap();
        assert!(l.session("h1", now, 1800.0).await.unwrap().is_some());
        assert!(
            l.session("h1", now + 1801.0, 1800.0)
                .await
                .unwrap()
                .is_none(),
            "idle"
        );
        db.finish().await;
    }
}

/// The audit log is append-only below the application too: the application role may add
/// and read rows, never change or remove them (PostgreSQL: no UPDATE/DELETE privilege;
/// SQLite: triggers).
#[tokio::test]
async fn the_audit_log_refuses_updates_and_deletes_from_the_application() {
    let db = TestDb::postgres().await;
    let (a, _b) = two_tenants(&db).await;
    let mut conn = PgConnection::connect(&db.pg_url()).await.unwrap();
    sqlx::raw_sql("SET ROLE reckon_app")
        .execute(&mut conn)
        .await
        .unwrap();
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("SELECT set_config('reckon.tenant', $1, true)")
        .bind(a.to_string())
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO audit_log (tenant_id, at, actor, action) VALUES ($1, 1, 'x', 'signin')",
    )
    .bind(a)
    .execute(&mut *tx)
    .await
    .expect("the application may append");
    tx.commit().await.unwrap();
    for sql in [
        "UPDATE audit_log SET actor = 'y'",
        "DELETE FROM audit_log",
        "TRUNCATE audit_log",
    ] {
        let mut tx = conn.begin().await.unwrap();
        sqlx::query("SELECT set_config('reckon.tenant', $1, true)")
            .bind(a.to_string())
            .execute(&mut *tx)
            .await
            .unwrap();
        let r = sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
            .execute(&mut *tx)
            .await;
        let err = r.expect_err(sql).to_string();
        assert!(err.contains("permission denied"), "{sql}: {err}");
    }
    drop(conn);
    db.finish().await;

    let db = TestDb::sqlite().await;
    let t = db.ledger.create_tenant("acme").await.unwrap();
    db.ledger
        .record_action(
            t.id,
            reckon_ledger::NewAction {
                actor: "x".into(),
                action: "signin".into(),
                target: None,
                detail: serde_json::json!({}),
                address: None,
            },
        )
        .await
        .unwrap();
    let RawDb::Sqlite(path) = &db.raw else {
        unreachable!()
    };
    let mut c = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    for sql in ["UPDATE audit_log SET actor = 'y'", "DELETE FROM audit_log"] {
        let err = sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
            .execute(&mut c)
            .await
            .expect_err(sql)
            .to_string();
        assert!(err.contains("append-only"), "{sql}: {err}");
    }
    db.finish().await;
}

/// A transaction's scope is written into its `BEGIN` only when each value is letters and
/// digits; anything else (here a token hash shaped to close the literal and name another
/// tenant) is bound as a parameter and matched as the string it is.
#[tokio::test]
async fn a_scope_value_that_is_not_letters_and_digits_is_bound_not_written_into_the_statement() {
    let db = TestDb::postgres().await;
    let (a, b) = two_tenants(&db).await;
    let l = db.ledger();
    let hostile =
        format!("x', true), set_config('reckon.tenant', '{a}', true), set_config('reckon.x', '");
    let plain = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    let a_id = l.tenant_by_slug("tenant-a").await.unwrap().id;
    let b_id = l.tenant_by_slug("tenant-b").await.unwrap().id;
    l.create_token_by(b_id, Role::Viewer, &hostile, "odd", TokenCreator::Operator)
        .await
        .unwrap();
    l.create_token_by(a_id, Role::Viewer, plain, "hex", TokenCreator::Operator)
        .await
        .unwrap();
    let odd = l
        .authenticate_token(&hostile)
        .await
        .unwrap()
        .expect("the odd token");
    assert_eq!(odd.tenant.id.get(), b, "the odd hash names its own tenant");
    let hex = l
        .authenticate_token(plain)
        .await
        .unwrap()
        .expect("the hex token");
    assert_eq!(hex.tenant.id.get(), a);
    // A hash of neither finds nothing, whatever it says.
    let probe = format!("{plain}', true), set_config('reckon.tenant', '{a}");
    assert!(l.authenticate_token(&probe).await.unwrap().is_none());
    db.finish().await;
}

/// New effects are staged in a temporary table each pooled connection makes as the app
/// role: a database whose PUBLIC may not make temporary tables still takes a first scan's
/// batch, because the migrations granted that to the app role itself.
#[tokio::test]
async fn new_effects_are_staged_where_public_may_not_make_temporary_tables() {
    let db = TestDb::postgres().await;
    db.raw
        .exec(
            "DO $$ BEGIN EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', \
             current_database()); END $$",
        )
        .await;
    let l = db.raw.reopen().await;
    let t = l.create_tenant("acme").await.unwrap();
    let s = l.add_source(t.id, push_source("shop")).await.unwrap();
    let outcome = l
        .ingest(
            t.id,
            s.id,
            IngestBatch {
                origin: Origin::Scan,
                observed_at: time::now(),
                records: vec![record("charge:v1:ORD-1"), record("charge:v1:ORD-2")],
                rejected: Vec::new(),
                abandoned_after_secs: 300.0,
                cursor: None,
                lease: None,
                expect_new: true,
            },
        )
        .await
        .unwrap();
    assert_eq!(outcome.created, 2);
    drop(l);
    db.finish().await;
}
