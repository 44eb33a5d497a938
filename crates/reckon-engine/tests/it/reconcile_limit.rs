//! The reconciler's concurrency limit per provider, against the demo provider on loopback
//! behind a layer that answers slowly, counts the requests in flight at the server, and
//! refuses (429) above a capacity, as an overloaded provider does.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use reckon_domain::{SourceRecord, State, time};
use reckon_engine::reconcile::{ReconcileCtx, ReconcileOptions, reconcile_all};
use reckon_ledger::{
    IngestBatch, Keyring, Ledger, NewProvider, NewSource, Origin, SourceKind, Tenant,
};
use reckon_providers::demo::{DemoState, router};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// What the server saw.
#[derive(Default)]
struct Seen {
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    answered: AtomicUsize,
    refused: AtomicUsize,
}

/// The demo provider answering in `latency`, refusing with 429 any request that would make
/// more than `capacity` in flight.
async fn provider(demo: DemoState, latency: Duration, capacity: usize) -> (String, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let layer_seen = seen.clone();
    let app = router(demo).layer(axum::middleware::from_fn(
        move |req: Request, next: Next| {
            let seen = layer_seen.clone();
            async move {
                let now = seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                let answer: Response = if now > capacity {
                    seen.refused.fetch_add(1, Ordering::SeqCst);
                    (axum::http::StatusCode::TOO_MANY_REQUESTS, "slow down").into_response()
                } else {
                    seen.most_in_flight.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(latency).await;
                    seen.answered.fetch_add(1, Ordering::SeqCst);
                    next.run(req).await
                };
                seen.in_flight.fetch_sub(1, Ordering::SeqCst);
                answer
            }
        },
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/"), seen)
}

/// A SQLite ledger with `n` hour-old unknown charges routed to the demo provider at `base`,
/// every one of them charged there.
async fn ledger_with(
    n: usize,
    demo: &DemoState,
    base: &str,
) -> (tempfile::TempDir, Arc<dyn Ledger>, Tenant) {
    let dir = tempfile::tempdir().unwrap();
    let keyring = Keyring::from_base64(&Keyring::generate_base64()).unwrap();
    let ledger = reckon_ledger::connect(None, dir.path(), keyring)
        .await
        .unwrap();
    let t = fill(&ledger, n, demo, base).await;
    (dir, ledger, t)
}

/// A tenant in `ledger` with `n` hour-old unknown charges routed to the demo provider at
/// `base`, every one of them charged there.
async fn fill(ledger: &Arc<dyn Ledger>, n: usize, demo: &DemoState, base: &str) -> Tenant {
    let t = ledger.create_tenant("acme").await.unwrap();
    let s = ledger
        .add_source(
            t.id,
            NewSource {
                name: "shop".into(),
                kind: SourceKind::Push,
                dsn: None,
                dsn_display: None,
                table_name: "justonce_keys".into(),
                scan_interval_secs: 60,
                abandoned_after_secs: 300.0,
                overlap_secs: 5.0,
                full_scan_every_secs: 3600,
                mapping: None,
            },
        )
        .await
        .unwrap();
    let old = time::now() - 3600.0;
    let records: Vec<SourceRecord> = (0..n)
        .map(|i| {
            let key = format!("charge:v1:o{i}");
            demo.charge(&key, 1000 + i as i64, "eur", old);
            SourceRecord {
                key,
                state: State::Unknown,
                request_hash: "1:9f86d081884c7d65".to_owned(),
                response: None,
                attempts: 1,
                created_at: old - 1.0,
                updated_at: old,
                expires_at: None,
            }
        })
        .collect();
    ledger
        .ingest(
            t.id,
            s.id,
            IngestBatch {
                origin: Origin::Push,
                observed_at: time::now(),
                records,
                rejected: vec![],
                abandoned_after_secs: 300.0,
                cursor: None,
                lease: None,
                expect_new: false,
            },
        )
        .await
        .unwrap();
    ledger
        .add_provider(
            t.id,
            NewProvider {
                name: "demo".into(),
                kind: reckon_ledger::ProviderKind::Demo,
                secret: None,
                settings: serde_json::json!({
                    "base_url": base,
                    "rate_per_sec": 0,
                    "visibility_lag_secs": 0,
                }),
            },
        )
        .await
        .unwrap();
    ledger
        .set_route(t.id, "shop", "charge", Some("demo"))
        .await
        .unwrap();
    t
}

fn ctx(ledger: &Arc<dyn Ledger>, options: ReconcileOptions) -> ReconcileCtx {
    let loopback =
        reckon_sources::EgressPolicy::new(&["127.0.0.0/8".to_owned()], None).expect("policy");
    ReconcileCtx {
        options,
        ..ReconcileCtx::new(ledger.clone()).with_egress(Arc::new(loopback))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_keeps_up_is_given_more_lookups_than_the_starting_limit() {
    let demo = DemoState::new();
    let (base, seen) = provider(demo.clone(), Duration::from_millis(40), usize::MAX).await;
    let (_dir, ledger, t) = ledger_with(600, &demo, &base).await;
    let defaults = ReconcileOptions::default();
    let c = ctx(&ledger, defaults.clone());
    let outcomes = reconcile_all(&c, &t).await.unwrap();
    assert_eq!(outcomes.iter().filter(|o| o.resolved).count(), 600);
    let most = seen.most_in_flight.load(Ordering::SeqCst);
    assert!(
        most >= 2 * defaults.concurrency,
        "the limit grew past its start ({}): at most {most} in flight at the server",
        defaults.concurrency
    );
    assert!(most <= defaults.max_concurrency, "{most} in flight");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_refuses_above_its_capacity_is_asked_about_as_much_as_it_can_take() {
    let demo = DemoState::new();
    let capacity = 12;
    let (base, seen) = provider(demo.clone(), Duration::from_millis(30), capacity).await;
    let (_dir, ledger, t) = ledger_with(600, &demo, &base).await;
    let defaults = ReconcileOptions::default();
    let c = ctx(&ledger, defaults.clone());
    let outcomes = reconcile_all(&c, &t).await.unwrap();
    let (answered, refused) = (
        seen.answered.load(Ordering::SeqCst),
        seen.refused.load(Ordering::SeqCst),
    );
    // A refused lookup is indeterminate (asked again later), never a verdict.
    assert_eq!(outcomes.len(), 600);
    let waiting = outcomes.iter().filter(|o| !o.resolved).count();
    assert!(
        outcomes
            .iter()
            .all(|o| o.resolved || o.outcome == "indeterminate"),
        "{outcomes:?}"
    );
    assert!(
        waiting <= refused,
        "{waiting} unresolved, {refused} refused"
    );
    // At a fixed limit of 64, about four in five requests would be refused.
    assert!(
        refused * 10 <= answered,
        "the limit came down to the provider's capacity: {refused} refused, {answered} answered"
    );
    let provider = ledger.list_providers(t.id).await.unwrap()[0].id;
    let learnt = c.limits.limit(provider, defaults.bounds());
    assert!(
        (1..=capacity + 4).contains(&learnt),
        "the limit settled near the capacity ({capacity}): {learnt}"
    );
}

/// A lookup's place is the provider's: while the ledger is slow to take one answer, the
/// next lookups go on. Here the ledger's attempt table is locked by another session, so
/// the first answer's write waits; the provider, one lookup at a time, is still asked
/// about every claimed effect, and every answer is written once the lock goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_lookup_starts_while_the_last_answer_waits_for_the_ledger() {
    use sqlx::{AssertSqlSafe, Connection, Executor};
    let admin = std::env::var("RECKON_TEST_PG_URL")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let name = format!("reckon_slots_{:016x}", rand::random::<u64>());
    let mut c = sqlx::PgConnection::connect(&admin)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {admin}: {e}"));
    c.execute(AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
        .await
        .unwrap();
    let (base_url, _) = admin.split('?').next().unwrap().rsplit_once('/').unwrap();
    let url = format!("{base_url}/{name}");

    let demo = DemoState::new();
    let (base, seen) = provider(demo.clone(), Duration::ZERO, usize::MAX).await;
    let keyring = Keyring::from_base64(&Keyring::generate_base64()).unwrap();
    let ledger = reckon_ledger::connect(Some(&url), &std::env::temp_dir(), keyring)
        .await
        .unwrap();
    let t = fill(&ledger, 3, &demo, &base).await;

    let mut blocker = sqlx::PgConnection::connect(&url).await.unwrap();
    blocker
        .execute("BEGIN; LOCK TABLE reconcile_attempt IN EXCLUSIVE MODE")
        .await
        .unwrap();
    let one_at_a_time = ReconcileOptions {
        concurrency: 1,
        max_concurrency: 1,
        ..ReconcileOptions::default()
    };
    let c_run = ctx(&ledger, one_at_a_time);
    let t_run = t.clone();
    let run = tokio::spawn(async move { reconcile_all(&c_run, &t_run).await });
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while seen.answered.load(Ordering::SeqCst) < 3 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let answered = seen.answered.load(Ordering::SeqCst);
    blocker.execute("ROLLBACK").await.unwrap();
    assert_eq!(
        answered, 3,
        "with the first answer's write held by the ledger, the provider was asked {answered} \
         time(s) of 3"
    );
    let outcomes = run.await.unwrap().unwrap();
    assert_eq!(
        outcomes.iter().filter(|o| o.resolved).count(),
        3,
        "{outcomes:?}"
    );
    assert_eq!(
        seen.answered.load(Ordering::SeqCst),
        3,
        "one lookup per effect"
    );
    drop(ledger);
    blocker.close().await.ok();
    c.execute(AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
    )))
    .await
    .unwrap();
}
