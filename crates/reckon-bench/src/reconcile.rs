//! `reconcile`: reconciliation throughput against a provider on loopback, with its
//! anchor measured in the same run.
//!
//! The provider is reckon's demo provider (the documented `http` lookup protocol) served
//! on loopback with a 50 ms answer time, behind a layer that records the arrival time of
//! every request: the per-second counts below are counted AT THE SERVER.
//!
//! - Anchor: justonce's README loop, `for record in engine.unresolved():
//!   payments.lookup(...)`: the same adapter, one lookup after another (a sample of
//!   `--anchor-lookups` effects; its rate is what matters).
//! - Phase 1: `--effects` unresolved effects, provider budget `rate_per_sec = --budget`,
//!   `reckon serve`'s defaults. Goal: sustained >= 95 % of the budget, and no one-second
//!   window at the server above the budget.
//! - Phase 2: as many fresh effects, no budget, `reckon serve`'s defaults (the adaptive
//!   limit from `ReconcileOptions::default()`). Goal: >= 25x the anchor.
//! - Phase 3, printed beside it: the same with a fixed, tuned limit (`--concurrency`
//!   lookups in flight, `--batch` per claim).
//!
//! The ledger is SQLite (a file in a temporary directory) unless `--ledger-url
//! postgres://...` names a PostgreSQL server, on which a fresh database is made and dropped.
//! A missed goal is a measurement, not an error.

use anyhow::Context;
use clap::Parser;
use reckon_domain::{SourceRecord, State};
use reckon_engine::reconcile::{ReconcileCtx, ReconcileOptions, reconcile_all};
use reckon_ledger::{
    EffectQuery, IngestBatch, Keyring, Ledger, NewProvider, NewSource, Origin, SourceKind, Tenant,
};
use reckon_providers::demo::{DemoState, router};
use reckon_providers::{GetClient, LookupQuery, build_provider};
use sqlx::{AssertSqlSafe, Connection};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(
    about = "Reconciliation throughput against a 50 ms provider on loopback, with its anchor"
)]
struct Args {
    /// Unresolved effects per phase.
    #[arg(long, default_value_t = 10_000)]
    effects: usize,
    /// The provider's answer time.
    #[arg(long, default_value_t = 50)]
    latency_ms: u64,
    /// Phase 1's request budget (the provider's `rate_per_sec`).
    #[arg(long, default_value_t = 100.0)]
    budget: f64,
    /// Phase 3's fixed limit of lookups in flight.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Phase 3's `ReconcileOptions.batch` (effects claimed per claim); 0 = the engine's
    /// default (32).
    /// `reconcile_all` claims the next batch while the current one is still answering; on
    /// SQLite a claim holds the write lock, so a batch of several times the concurrency
    /// means fewer stalls of the lookups' records.
    #[arg(long, default_value_t = 1024)]
    batch: i64,
    /// Lookups in the one-after-another anchor.
    #[arg(long, default_value_t = 200)]
    anchor_lookups: usize,
    /// `postgres://user@host:port/postgres` to run on a PostgreSQL ledger (a fresh database
    /// is created there and dropped); default: an embedded SQLite ledger.
    #[arg(long)]
    ledger_url: Option<String>,
}

/// Arrival times of the requests the provider received.
#[derive(Clone, Default)]
struct Arrivals(Arc<Mutex<Vec<Instant>>>);

impl Arrivals {
    fn take(&self) -> Vec<Instant> {
        std::mem::take(
            &mut *self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

struct Rates {
    requests: usize,
    secs: f64,
    /// Requests over the span from the first to the last request.
    sustained: f64,
    /// Per whole second from the first request: min and max (the last, partial second is
    /// left out of the min).
    min_second: usize,
    max_second: usize,
    /// The most requests in any window [t, t + 1 s) starting at a request.
    max_sliding: usize,
}

fn rates(mut t: Vec<Instant>) -> Rates {
    t.sort();
    let n = t.len();
    if n < 2 {
        return Rates {
            requests: n,
            secs: 0.0,
            sustained: 0.0,
            min_second: n,
            max_second: n,
            max_sliding: n,
        };
    }
    let first = t[0];
    let secs = (t[n - 1] - first).as_secs_f64();
    let whole = secs.floor() as usize;
    let mut buckets = vec![0usize; whole + 1];
    for x in &t {
        buckets[((*x - first).as_secs_f64().floor() as usize).min(whole)] += 1;
    }
    let full = if whole >= 1 {
        &buckets[..whole]
    } else {
        &buckets[..]
    };
    let mut max_sliding = 0;
    let mut j = 0;
    for i in 0..n {
        while j < n && t[j] - t[i] < Duration::from_secs(1) {
            j += 1;
        }
        max_sliding = max_sliding.max(j - i);
    }
    Rates {
        requests: n,
        secs,
        sustained: (n - 1) as f64 / secs,
        min_second: full.iter().copied().min().unwrap_or(0),
        max_second: buckets.iter().copied().max().unwrap_or(0),
        max_sliding,
    }
}

fn unknown(key: String, updated_at: f64) -> SourceRecord {
    SourceRecord {
        key,
        state: State::Unknown,
        request_hash: "1:9f86d081884c7d65a9".to_owned(),
        response: None,
        attempts: 1,
        created_at: updated_at - 1.0,
        updated_at,
        expires_at: None,
    }
}

/// A tenant with one push source holding `n` unknown effects (an hour old, so past any
/// visibility lag), every other one charged at the demo provider, routed to a provider
/// with `rate_per_sec`.
async fn seed(
    ledger: &Arc<dyn Ledger>,
    slug: &str,
    n: usize,
    demo: &DemoState,
    base: &str,
    rate_per_sec: f64,
) -> anyhow::Result<Tenant> {
    let t = ledger.create_tenant(slug).await?;
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
                overlap_secs: 60.0,
                full_scan_every_secs: 3600,
                mapping: None,
            },
        )
        .await?;
    let old = reckon_domain::time::now() - 3600.0;
    let keys: Vec<String> = (0..n).map(|i| format!("charge:v1:{slug}-{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        if i % 2 == 0 {
            demo.charge(k, 1000 + i as i64, "eur", old);
        }
    }
    for chunk in keys.chunks(2000) {
        ledger
            .ingest(
                t.id,
                s.id,
                IngestBatch {
                    origin: Origin::Push,
                    observed_at: reckon_domain::time::now(),
                    records: chunk.iter().map(|k| unknown(k.clone(), old)).collect(),
                    rejected: Vec::new(),
                    abandoned_after_secs: 300.0,
                    cursor: None,
                    lease: None,
                    expect_new: false,
                },
            )
            .await?;
    }
    ledger
        .add_provider(
            t.id,
            NewProvider {
                name: "demo".into(),
                kind: reckon_ledger::ProviderKind::Demo,
                secret: None,
                settings: serde_json::json!({
                    "base_url": base,
                    "rate_per_sec": rate_per_sec,
                    "visibility_lag_secs": 0,
                }),
            },
        )
        .await?;
    ledger
        .set_route(t.id, "shop", "charge", Some("demo"))
        .await?;
    Ok(t)
}

/// The README loop: one lookup after another, nothing else.
async fn anchor(
    ledger: &Arc<dyn Ledger>,
    tenant: &Tenant,
    base: &str,
    lookups: usize,
) -> anyhow::Result<(usize, f64)> {
    let effects = ledger
        .list_effects(
            tenant.id,
            &EffectQuery {
                unresolved: Some(true),
                limit: lookups as i64,
                now: reckon_domain::time::now(),
                ..Default::default()
            },
        )
        .await?;
    let provider = build_provider(
        reckon_providers::ProviderKind::Demo,
        &serde_json::json!({ "base_url": base, "rate_per_sec": 0, "visibility_lag_secs": 0 }),
        None,
        GetClient::shared(),
    )?;
    let started = Instant::now();
    for e in &effects {
        let report = provider
            .lookup(&LookupQuery {
                key: e.key.clone(),
                created_at: e.created_at,
                updated_at: e.updated_at,
                expires_at: e.expires_at,
                response_json: e.response_json.clone(),
                now: reckon_domain::time::now(),
                observed_at: None,
            })
            .await;
        anyhow::ensure!(
            report.steps.iter().all(|s| s.fault.is_none()),
            "anchor lookup failed: {report:?}"
        );
    }
    Ok((effects.len(), started.elapsed().as_secs_f64()))
}

async fn phase(
    ledger: &Arc<dyn Ledger>,
    tenant: &Tenant,
    options: ReconcileOptions,
    arrivals: &Arrivals,
) -> anyhow::Result<(Rates, f64, usize)> {
    arrivals.take();
    // The demo provider listens on loopback, which the default egress policy refuses.
    let loopback = reckon_sources::EgressPolicy::new(&["127.0.0.0/8".to_owned()], None)?;
    let ctx = ReconcileCtx {
        client: GetClient::shared(),
        options,
        ..ReconcileCtx::new(ledger.clone()).with_egress(Arc::new(loopback))
    };
    let started = Instant::now();
    let outcomes = reconcile_all(&ctx, tenant).await?;
    let wall = started.elapsed().as_secs_f64();
    let resolved = outcomes.iter().filter(|o| o.resolved).count();
    Ok((rates(arrivals.take()), wall, resolved))
}

fn verdict(ok: bool) -> &'static str {
    if ok { "MET" } else { "MISSED" }
}

/// The allocator `reckon` runs with (its main.rs says why), for the code this runs in-process.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();

    // The provider, counting arrivals at the server.
    let arrivals = Arrivals::default();
    let demo = DemoState::with_delay(Duration::from_millis(args.latency_ms));
    let counted = arrivals.clone();
    let app = router(demo.clone()).layer(axum::middleware::from_fn(
        move |req: axum::extract::Request, next: axum::middleware::Next| {
            counted
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(Instant::now());
            next.run(req)
        },
    ));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let base = format!("http://{}/", listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });

    // The ledger.
    let dir = tempfile::tempdir()?;
    let keyring = Keyring::from_base64(&Keyring::generate_base64())?;
    let mut pg_db: Option<(String, String)> = None;
    let ledger = match &args.ledger_url {
        None => reckon_ledger::connect(None, dir.path(), keyring).await?,
        Some(admin) => {
            let db = format!("reckon_bench_rc_{:08x}", rand_u32());
            let mut conn = sqlx::PgConnection::connect(admin)
                .await
                .context("connect to --ledger-url")?;
            sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE \"{db}\"")))
                .execute(&mut conn)
                .await?;
            conn.close().await.ok();
            let (base_url, _) = admin
                .rsplit_once('/')
                .context("--ledger-url has no database")?;
            let url = format!("{base_url}/{db}");
            pg_db = Some((admin.clone(), db));
            reckon_ledger::connect(Some(&url), dir.path(), keyring).await?
        }
    };
    let backend = if pg_db.is_some() {
        "PostgreSQL"
    } else {
        "SQLite"
    };
    let defaults = ReconcileOptions::default();
    let tuned = {
        let mut o = ReconcileOptions {
            concurrency: args.concurrency,
            max_concurrency: args.concurrency,
            ..ReconcileOptions::default()
        };
        if args.batch > 0 {
            o.batch = args.batch;
        }
        o
    };
    println!(
        "reconcile bench: {} effects per phase, provider on loopback answering in {} ms, \
         {backend} ledger; defaults: limit {} to {} per provider, batch {}; tuned: fixed \
         limit {}, batch {}",
        args.effects,
        args.latency_ms,
        defaults.concurrency,
        defaults.max_concurrency,
        defaults.batch,
        tuned.concurrency,
        tuned.batch
    );

    let budgeted = seed(&ledger, "budgeted", args.effects, &demo, &base, args.budget).await?;

    // Anchor: the README loop on the same effects, same adapter, same server.
    let (n, secs) = anchor(&ledger, &budgeted, &base, args.anchor_lookups).await?;
    let anchor_rate = n as f64 / secs;
    println!(
        "anchor (justonce README loop, one lookup after another): {n} lookups in {secs:.2} s \
         = {anchor_rate:.1} lookups/s"
    );
    arrivals.take();

    // Phase 1: budget.
    let (r, wall, resolved) = phase(&ledger, &budgeted, defaults.clone(), &arrivals).await?;
    println!(
        "phase 1 (budget {} req/s, defaults): {} requests at the server in {:.1} s \
         ({wall:.1} s wall, {resolved} resolved, {:.2} requests per verdict); sustained \
         {:.1} req/s; per second min {} max {}; any 1 s window max {}; ratio to anchor {:.1}x",
        args.budget,
        r.requests,
        r.secs,
        r.requests as f64 / resolved.max(1) as f64,
        r.sustained,
        r.min_second,
        r.max_second,
        r.max_sliding,
        r.sustained / anchor_rate
    );
    let floor = 0.95 * args.budget;
    println!(
        "goal sustained >= {floor:.0} req/s: {:.1} -> {}",
        r.sustained,
        verdict(r.sustained >= floor)
    );
    println!(
        "goal never above the budget ({} req/s) in any second at the server: per-second max \
         {}, sliding-window max {} -> {}",
        args.budget,
        r.max_second,
        r.max_sliding,
        verdict(r.max_second as f64 <= args.budget && r.max_sliding as f64 <= args.budget)
    );

    // Phase 2: no budget, serve's defaults; phase 3: the same, tuned by hand.
    let free = seed(&ledger, "unbudgeted", args.effects, &demo, &base, 0.0).await?;
    let (r2, wall2, resolved2) = phase(&ledger, &free, defaults, &arrivals).await?;
    let ratio = r2.sustained / anchor_rate;
    println!(
        "phase 2 (no budget, defaults): {} requests in {:.1} s ({wall2:.1} s wall, \
         {resolved2} resolved); sustained {:.1} req/s; per second max {}",
        r2.requests, r2.secs, r2.sustained, r2.max_second
    );
    let again = seed(&ledger, "tuned", args.effects, &demo, &base, 0.0).await?;
    let (r3, wall3, resolved3) = phase(&ledger, &again, tuned, &arrivals).await?;
    println!(
        "phase 3 (no budget, fixed limit {}): {} requests in {:.1} s ({wall3:.1} s wall, \
         {resolved3} resolved); sustained {:.1} req/s = {:.1}x the anchor",
        args.concurrency,
        r3.requests,
        r3.secs,
        r3.sustained,
        r3.sustained / anchor_rate
    );
    println!(
        "goal with the defaults >= 25x the one-after-another loop: {:.1} / {anchor_rate:.1} \
         = {ratio:.1}x -> {} (tuned: {:.1}x)",
        r2.sustained,
        verdict(ratio >= 25.0),
        r3.sustained / anchor_rate
    );

    if let Some((admin, db)) = pg_db {
        drop(ledger);
        let mut conn = sqlx::PgConnection::connect(&admin).await?;
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS \"{db}\" WITH (FORCE)"
        )))
        .execute(&mut conn)
        .await?;
    }
    Ok(())
}

fn rand_u32() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() ^ std::process::id())
}
