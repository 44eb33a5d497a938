//! The reconciler's queue (what `claim_due` takes, read from `reconcile_due`) and the
//! operator's pool (what `/metrics` and the dashboard read through while background work
//! holds every connection of the work's pool).

use crate::support::RawDb;
use crate::{attempt, batch, claim, rec, tenant_and_source};
use reckon_domain::{State, time};
use reckon_ledger::{Ledger, LedgerError, MetricsQuery, TenantId};
use sqlx::Connection;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

async fn keys_claimed(ledger: &dyn Ledger, t: TenantId, owner: &str, at: f64) -> BTreeSet<String> {
    ledger
        .claim_due(t, owner, at, 30.0, 50)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.effect.key)
        .collect()
}

fn keys(k: &[&str]) -> BTreeSet<String> {
    k.iter().map(|s| (*s).to_owned()).collect()
}

/// An effect is in the queue while it is open: unknown at once, a claim in progress once it
/// is abandoned (by time, with no write), put off again when its application renews the
/// claim, taken out by a verdict or by its source's own answer; and never before its next
/// attempt or while another holds its lease.
pub(crate) async fn story_rc_queue(ledger: Arc<dyn Ledger>) {
    let (t, s) = tenant_and_source(&*ledger, "acme", "shop").await;
    let now = time::now();
    // The batch abandons a claim 300 s after its lease (`expires_at`) ends.
    ledger
        .ingest(
            t.id,
            s.id,
            batch(vec![
                rec("charge:v1:u1", State::Unknown, now - 100.0),
                rec("charge:v1:s1", State::Succeeded, now - 100.0),
                claim("charge:v1:p1", now - 500.0, now - 400.0),
                claim("charge:v1:p2", now - 100.0, now + 100.0),
            ]),
        )
        .await
        .unwrap();
    let first = ledger.claim_due(t.id, "w", now, 30.0, 50).await.unwrap();
    let got: BTreeSet<String> = first.iter().map(|c| c.effect.key.clone()).collect();
    assert_eq!(
        got,
        keys(&["charge:v1:p1", "charge:v1:u1"]),
        "the unknown effect and the claim abandoned by now, nothing else"
    );
    let id = |k: &str| first.iter().find(|c| c.effect.key == k).unwrap().effect.id;
    let (u1, p1) = (id("charge:v1:u1"), id("charge:v1:p1"));
    ledger
        .record_attempt(
            t.id,
            u1,
            "w",
            attempt("indeterminate", now, now + 50.0, false),
        )
        .await
        .unwrap();
    ledger
        .record_attempt(t.id, p1, "w", attempt("applied", now, now + 50.0, true))
        .await
        .unwrap();
    assert!(
        keys_claimed(&*ledger, t.id, "w", now + 10.0)
            .await
            .is_empty(),
        "u1 waits for its next attempt, p1 is resolved, p2 is not abandoned yet"
    );

    // p2's application renews its claim: abandoned 300 s after the new end, not the old.
    ledger
        .ingest(
            t.id,
            s.id,
            batch(vec![claim("charge:v1:p2", now + 1.0, now + 1000.0)]),
        )
        .await
        .unwrap();
    let at = now + 500.0;
    let c = ledger.claim_due(t.id, "w", at, 30.0, 50).await.unwrap();
    assert_eq!(
        c.iter().map(|c| c.effect.key.as_str()).collect::<Vec<_>>(),
        ["charge:v1:u1"],
        "p2 was renewed until {}",
        now + 1300.0
    );
    ledger
        .record_attempt(
            t.id,
            u1,
            "w",
            attempt("indeterminate", at, now + 2000.0, false),
        )
        .await
        .unwrap();
    assert_eq!(
        keys_claimed(&*ledger, t.id, "w", now + 1400.0).await,
        keys(&["charge:v1:p2"]),
        "abandoned once its renewed claim ran out"
    );

    // u1's source learns the outcome itself: out of the queue, whatever its schedule.
    ledger
        .ingest(
            t.id,
            s.id,
            batch(vec![rec("charge:v1:u1", State::Succeeded, now + 2.0)]),
        )
        .await
        .unwrap();
    // p2's lease (taken at now + 1400 for 30 s) runs out with nobody recording: due again.
    assert_eq!(
        keys_claimed(&*ledger, t.id, "w2", now + 3000.0).await,
        keys(&["charge:v1:p2"]),
        "a lease that ran out frees its effect, and u1 is closed by its source"
    );
    // p2's application finishes it: gone from the queue, even with its lease run out.
    ledger
        .ingest(
            t.id,
            s.id,
            batch(vec![rec("charge:v1:p2", State::Succeeded, now + 3.0)]),
        )
        .await
        .unwrap();
    assert!(
        keys_claimed(&*ledger, t.id, "w3", now + 9000.0)
            .await
            .is_empty(),
        "nothing open is left"
    );
    // A new unknown effect joins at once; another tenant's never shows.
    let (o, os) = tenant_and_source(&*ledger, "other", "shop").await;
    ledger
        .ingest(
            o.id,
            os.id,
            batch(vec![rec("charge:v1:x1", State::Unknown, now)]),
        )
        .await
        .unwrap();
    ledger
        .ingest(
            t.id,
            s.id,
            batch(vec![rec("charge:v1:u2", State::Unknown, now + 4.0)]),
        )
        .await
        .unwrap();
    assert_eq!(
        keys_claimed(&*ledger, t.id, "w4", now + 9000.0).await,
        keys(&["charge:v1:u2"])
    );
}

/// The statements that take the reconciler's queue (0033) out of a ledger, to make one as
/// it stood before (the migration's row in `_sqlx_migrations` is the caller's to remove).
pub(crate) fn without_the_queue(raw: &RawDb) -> &'static str {
    match raw {
        RawDb::Postgres(_) => {
            "DROP TABLE reconcile_due; DROP FUNCTION reckon_keep_due() CASCADE; \
             DROP FUNCTION reckon_schedule_due() CASCADE;"
        }
        RawDb::Sqlite(_) => {
            "DROP TABLE reconcile_due; DROP TRIGGER effect_enters_due; \
             DROP TRIGGER effect_stays_due; DROP TRIGGER effect_leaves_due; \
             DROP TRIGGER reconcile_state_schedules_due; \
             DROP TRIGGER reconcile_state_reschedules_due;"
        }
    }
}

/// A ledger migrated before the queue existed: its open effects (and their schedules and
/// leases) are in the queue after the next migrate, its closed and resolved ones are not.
pub(crate) async fn story_rc_queue_backfill(ledger: Arc<dyn Ledger>, raw: RawDb) {
    let (t, s) = tenant_and_source(&*ledger, "acme", "shop").await;
    let now = time::now();
    // As the ledger stood before: no queue, nothing keeping it.
    raw.exec(&format!(
        "{} DELETE FROM _sqlx_migrations WHERE version = 33",
        without_the_queue(&raw)
    ))
    .await;
    ledger
        .ingest(
            t.id,
            s.id,
            batch(vec![
                rec("charge:v1:u1", State::Unknown, now - 100.0),
                rec("charge:v1:u2", State::Unknown, now - 100.0),
                rec("charge:v1:u3", State::Unknown, now - 100.0),
                rec("charge:v1:s1", State::Succeeded, now - 100.0),
                claim("charge:v1:p1", now - 500.0, now - 400.0),
                claim("charge:v1:p2", now - 100.0, now + 100.0),
            ]),
        )
        .await
        .unwrap();
    let effects = ledger
        .list_effects(t.id, &crate::everything())
        .await
        .unwrap();
    let id = |k: &str| effects.iter().find(|e| e.key == k).unwrap().id;
    // u2 leased (as a claim would have left it), u3 resolved by hand.
    let leased = ledger
        .claim_effect(t.id, id("charge:v1:u2"), "w", now, 600.0)
        .await
        .unwrap();
    assert!(leased.is_some());
    ledger
        .resolve_by_hand(
            t.id,
            id("charge:v1:u3"),
            reckon_ledger::NewResolution {
                outcome: reckon_ledger::Outcome::Applied,
                author: "someone@example.test".into(),
                note: Some("checked by hand".into()),
                evidence: serde_json::json!({}),
            },
        )
        .await
        .unwrap();

    let ledger = raw.reopen().await;
    assert_eq!(
        keys_claimed(&*ledger, t.id, "w2", now).await,
        keys(&["charge:v1:p1", "charge:v1:u1"]),
        "open and free now: not the leased, the resolved, the closed or the renewed"
    );
    assert_eq!(
        keys_claimed(&*ledger, t.id, "w3", now + 700.0).await,
        keys(&[
            "charge:v1:p1",
            "charge:v1:p2",
            "charge:v1:u1",
            "charge:v1:u2"
        ]),
        "with the leases run out, and the claim abandoned since"
    );
}

/// Background work holds every connection of the work's pool, each waiting for a lock it
/// cannot get; the operator's view (the scrape's read, the readiness ping) still answers at
/// once, from its own connections.
pub(crate) async fn story_operator_view_has_its_own_connections(
    ledger: Arc<dyn Ledger>,
    raw: RawDb,
) {
    let (t, s) = tenant_and_source(&*ledger, "acme", "shop").await;
    let now = time::now();
    ledger
        .ingest(
            t.id,
            s.id,
            batch(vec![rec("charge:v1:u1", State::Unknown, now - 100.0)]),
        )
        .await
        .unwrap();
    let c = ledger.claim_due(t.id, "w", now, 600.0, 1).await.unwrap();
    let effect = c[0].effect.id;

    // Held outside the ledger: PostgreSQL, the effect's row (recording an attempt locks it
    // first); SQLite, the write lock (recording begins a write).
    let holder: Box<dyn std::any::Any + Send> = match &raw {
        RawDb::Postgres(url) => {
            let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "BEGIN; SELECT id FROM effect WHERE id = {effect} FOR UPDATE"
            )))
            .execute(&mut conn)
            .await
            .unwrap();
            Box::new(conn)
        }
        RawDb::Sqlite(path) => {
            let opts = sqlx::sqlite::SqliteConnectOptions::new().filename(path);
            let mut conn = sqlx::SqliteConnection::connect_with(&opts).await.unwrap();
            sqlx::raw_sql("BEGIN IMMEDIATE")
                .execute(&mut conn)
                .await
                .unwrap();
            Box::new(conn)
        }
    };
    let max = ledger.pool_status().max;
    let mut work = tokio::task::JoinSet::new();
    for _ in 0..(3 * max) {
        let ledger = ledger.clone();
        work.spawn(async move {
            ledger
                .record_attempt(t.id, effect, "w", attempt("indeterminate", now, now, false))
                .await
        });
    }
    let full = async {
        while ledger.pool_status().in_use < max {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), full)
        .await
        .expect("the work fills its pool");
    let q = MetricsQuery {
        tenant: None,
        now,
        replay_closing_created_before: now,
        replay_closed_created_before: now,
    };
    assert!(
        tokio::time::timeout(Duration::from_millis(500), ledger.metrics_snapshot(q))
            .await
            .is_err(),
        "outside the operator's view the read waits for the work's pool"
    );
    let snapshot = tokio::time::timeout(
        Duration::from_secs(2),
        reckon_ledger::operator_view(ledger.metrics_snapshot(q)),
    )
    .await
    .expect("the operator's view answers while the work's pool is full")
    .unwrap();
    assert_eq!(
        snapshot.unresolved.iter().map(|g| g.unknown).sum::<i64>(),
        1,
        "with the backlog as it is"
    );
    tokio::time::timeout(
        Duration::from_secs(2),
        reckon_ledger::operator_view(ledger.ping()),
    )
    .await
    .expect("readiness answers too")
    .unwrap();

    drop(holder);
    let mut recorded = 0;
    while let Some(done) = work.join_next().await {
        match done.unwrap() {
            Ok(_) => recorded += 1,
            Err(LedgerError::LeaseLost(_)) => {}
            Err(e) => panic!("a held-up write failed: {e}"),
        }
    }
    assert_eq!(recorded, 1, "the lease holder's attempt, once");
}
