//! The scan scheduler's step, called with the clock the test chooses: a due source is scanned
//! once, not again while its scan runs nor before its interval has passed, and not at all
//! while another replica holds its lease.

// The shared fixtures serve every test binary; this one needs only the SQLite source.
#[allow(
    dead_code,
    reason = "a module shared by several test modules; not each uses all of it"
)]
use crate::common;

use common::{Kind, SOURCE, SourceDb, TestLedger, test_egress};
use reckon_engine::schedule::{Claimed, ScanScheduler};
use reckon_metrics::Metrics;
use tokio_util::task::TaskTracker;

async fn setup() -> (SourceDb, TestLedger, ScanScheduler) {
    let db = SourceDb::fresh(Kind::Sqlite).await;
    db.writer(&["populate"]);
    let l = TestLedger::new().await;
    l.add_source(SOURCE, Kind::Sqlite.as_str(), &db.source_dsn)
        .await;
    let s = ScanScheduler::new(
        l.ledger.clone(),
        "test-a".into(),
        Metrics::new(),
        test_egress(),
    );
    (db, l, s)
}

async fn wait(tasks: &TaskTracker) {
    tasks.close();
    tasks.wait().await;
    tasks.reopen();
}

#[tokio::test]
async fn a_due_source_is_scanned_once_and_again_only_after_its_interval() {
    let (_db, l, s) = setup().await;
    let tasks = TaskTracker::new();
    let source = l.ledger.source_by_name(l.tenant.id, SOURCE).await.unwrap();
    assert_eq!(source.last_scan_at, None);
    let now = reckon_domain::time::now();

    let started = s.step(now, &tasks).await.unwrap();
    assert_eq!(started, vec![source.id], "never scanned: due");
    let again = s.step(now, &tasks).await.unwrap();
    assert!(
        again.is_empty(),
        "its scan is still running here: {again:?}"
    );
    wait(&tasks).await;

    let scanned = l.ledger.source_by_name(l.tenant.id, SOURCE).await.unwrap();
    let at = scanned.last_scan_at.expect("the step's scan is recorded");
    let effects = l
        .ledger
        .list_effects(
            l.tenant.id,
            &reckon_ledger::EffectQuery {
                limit: 10,
                now,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(!effects.is_empty(), "the scan stored the source's rows");

    let interval = scanned.scan_interval_secs as f64;
    let early = s.step(at + interval / 2.0, &tasks).await.unwrap();
    assert!(early.is_empty(), "within its interval: {early:?}");
    let late = s.step(at + interval + 1.0, &tasks).await.unwrap();
    assert_eq!(late, vec![source.id], "its interval passed");
    wait(&tasks).await;
    let rescanned = l.ledger.source_by_name(l.tenant.id, SOURCE).await.unwrap();
    assert!(rescanned.last_scan_at.unwrap() > at);
}

#[tokio::test]
async fn a_source_whose_lease_another_replica_holds_is_left_to_it() {
    let (_db, l, s) = setup().await;
    let source = l.ledger.source_by_name(l.tenant.id, SOURCE).await.unwrap();
    let theirs = l
        .ledger
        .try_lease(&format!("scan:{}", source.id), "test-b", 30.0)
        .await
        .unwrap()
        .expect("the other replica takes the lease first");
    let now = reckon_domain::time::now();
    let claimed = s.scan_claimed(l.tenant.clone(), source.clone(), now).await;
    assert!(matches!(claimed, Claimed::NotOurs), "{claimed:?}");
    let after = l.ledger.source_by_name(l.tenant.id, SOURCE).await.unwrap();
    assert_eq!(
        after.last_scan_at, None,
        "nothing scanned under their lease"
    );

    l.ledger.release_lease(&theirs).await.unwrap();
    let claimed = s.scan_claimed(l.tenant.clone(), source, now).await;
    assert!(matches!(claimed, Claimed::Scanned(_)), "{claimed:?}");
}

/// The reconciler is woken by a scan that stored a change, not by one that found nothing
/// new (it would otherwise wait for its next tick to ask about new `unknown` effects).
#[tokio::test]
async fn a_scan_that_stored_a_change_wakes_the_reconciler_and_a_quiet_one_does_not() {
    let (_db, l, s) = setup().await;
    let tasks = TaskTracker::new();
    let woken = |n: &std::sync::Arc<tokio::sync::Notify>| {
        let n = n.clone();
        async move {
            tokio::time::timeout(std::time::Duration::from_millis(200), n.notified())
                .await
                .is_ok()
        }
    };
    let now = reckon_domain::time::now();
    s.step(now, &tasks).await.unwrap();
    wait(&tasks).await;
    assert!(woken(&s.changed).await, "the first scan stored the rows");

    let at = l
        .ledger
        .source_by_name(l.tenant.id, SOURCE)
        .await
        .unwrap()
        .last_scan_at
        .unwrap();
    let interval = l
        .ledger
        .source_by_name(l.tenant.id, SOURCE)
        .await
        .unwrap()
        .scan_interval_secs as f64;
    let started = s.step(at + interval + 1.0, &tasks).await.unwrap();
    assert_eq!(started.len(), 1, "the rescan ran");
    wait(&tasks).await;
    assert!(
        !woken(&s.changed).await,
        "a rescan that changed nothing wakes nobody"
    );
}
