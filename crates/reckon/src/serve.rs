//! `reckon serve`: the HTTP server and the scheduled scans, stopped gracefully on SIGTERM
//! or Ctrl-C.

use crate::config::Settings;
use anyhow::Context;
use reckon_domain::time;
use reckon_engine::reconcile::{ReconcileCtx, ReconcileOptions, reconcile_until};
use reckon_engine::schedule::ScanScheduler;
use reckon_engine::writeback::{WritebackCtx, WritebackStep, writeback_next};
use reckon_ledger::Ledger;
use secrecy::ExposeSecret;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How often the dashboard's unresolved snapshot is taken.
const SNAPSHOT_EVERY: Duration = Duration::from_secs(600);
/// How often the scheduler looks for sources whose interval has passed.
const TICK: Duration = Duration::from_secs(2);

pub async fn run(
    settings: Settings,
    ledger: Arc<dyn Ledger>,
    banner: Option<String>,
) -> anyhow::Result<()> {
    let metrics = metrics_state(&settings, reckon_web::metrics::Metrics::new());
    run_with(settings, ledger, banner, metrics).await
}

/// [`run`] with instance metrics that may already hold counts (`reckon demo` reconciles
/// before it serves).
pub async fn run_with(
    settings: Settings,
    ledger: Arc<dyn Ledger>,
    banner: Option<String>,
    metrics: reckon_web::metrics::MetricsState,
) -> anyhow::Result<()> {
    let _single = lock_sqlite_ledger(&settings)?;
    // Bind first, so a taken port fails before anything else starts.
    let listener = tokio::net::TcpListener::bind(&settings.listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (choose another address with --listen or RECKON_LISTEN)",
                settings.listen
            )
        })?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "listening");
    // Before the banner: a Ctrl-C the moment it is printed must stop gracefully (the demo
    // removes its data directory then), not take the signal's default and end the process.
    let stop_signal = shutdown_signal()?;
    let limits = server_limits(&settings);
    if let Some(b) = banner {
        println!("{}", b.replace("{addr}", &addr.to_string()));
    }

    let stop = CancellationToken::new();
    let metrics_listener = match &settings.metrics_listen {
        Some(a) => Some(
            tokio::net::TcpListener::bind(a)
                .await
                .with_context(|| format!("cannot listen for metrics on {a}"))?,
        ),
        None => None,
    };
    let egress = Arc::new(settings.egress_policy(&*ledger).await?);
    // `work` stops the scheduler taking new work; `stop` ends the HTTP servers. In-flight
    // scans and reconcile steps run to their end (or hand their leases back) in between.
    let work = CancellationToken::new();
    let tasks = TaskTracker::new();
    let owner = Arc::new(instance_id());
    let scans = ScanScheduler::new(
        ledger.clone(),
        owner.to_string(),
        metrics.instance.clone(),
        egress.clone(),
    );
    let scanned = scans.changed.clone();
    let scheduler = start_scheduler(
        scans,
        work.clone(),
        tasks.clone(),
        settings
            .audit_check
            .clamp(Duration::from_millis(100), Duration::from_secs(3600)),
    )
    .await?;
    let reconciler = if settings.reconcile {
        let ctx = ReconcileCtx {
            options: ReconcileOptions {
                owner: owner.to_string(),
                concurrency: settings.reconcile_concurrency.max(1),
                max_concurrency: settings.reconcile_concurrency_max.max(1),
                lease_secs: settings.reconcile_lease.as_secs_f64().clamp(1.0, 3600.0),
                ..ReconcileOptions::default()
            },
            ..ReconcileCtx::new(ledger.clone())
                .with_egress(egress.clone())
                .with_metrics(metrics.instance.clone())
        };
        Some(start_reconciler(Arc::new(ctx), scanned, work.clone(), tasks.clone()).await?)
    } else {
        None
    };

    let draining = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let state = reckon_web::AppState {
        max_body_bytes: settings.max_body_bytes,
        request_timeout: settings.request_timeout,
        metrics,
        egress,
        draining: draining.clone(),
        client_address: settings.client_address()?,
        ..reckon_web::AppState::new(ledger)
    };
    if let Some(l) = metrics_listener {
        tracing::info!(addr = %l.local_addr()?, "serving /metrics");
        let ops = reckon_web::metrics::operator_app(state.clone());
        let stop = stop.clone();
        tokio::spawn(async move {
            let limits = reckon_web::server::ServerLimits {
                max_connections: METRICS_CONNECTIONS,
                ..limits
            };
            if let Err(e) = reckon_web::server::serve(l, ops, limits, stop.cancelled_owned()).await
            {
                tracing::error!(error = %e, "metrics listener failed");
            }
        });
    }
    let app = reckon_web::app(state);
    let shutdown = stop.clone();
    let drain = settings.shutdown_drain.min(Duration::from_secs(60));
    let (work2, tasks2) = (work.clone(), tasks.clone());
    tokio::spawn(async move {
        stop_signal.await;
        // Readiness first: load balancers stop sending while we still answer.
        tracing::info!("shutting down: readiness is false, no new work is taken");
        draining.store(true, std::sync::atomic::Ordering::SeqCst);
        work2.cancel();
        tasks2.close();
        // In-flight scans and reconcile steps finish and release their leases; one that
        // does not within the bound loses its leases by expiry instead (nothing is lost:
        // every write is fenced by its lease).
        // Both at once: the drain delay lets load balancers notice readiness while the
        // work winds down.
        let bound = Duration::from_secs(20);
        let wound_down = async {
            tokio::join!(tokio::time::sleep(drain), tasks2.wait());
        };
        if tokio::time::timeout(drain + bound, wound_down)
            .await
            .is_err()
        {
            tracing::warn!("in-flight work did not finish in {bound:?}; its leases will expire");
        }
        tracing::info!("draining HTTP connections");
        shutdown.cancel();
    });
    // The peer address feeds the per-address sign-in throttle (the loop adds it).
    reckon_web::server::serve(listener, app, limits, stop.clone().cancelled_owned()).await?;
    // The loops stopped taking work when `work` was cancelled; whatever a loop's step still
    // does ends with the process, as a step cut short by a crash would (leases expire).
    for h in scheduler
        .into_iter()
        .chain(reconciler.into_iter().flatten())
    {
        h.abort();
    }
    tracing::info!("stopped");
    Ok(())
}

/// Connections the metrics listener holds at most: its clients are the operator's scrapers.
const METRICS_CONNECTIONS: usize = 32;

/// The listener's limits: the connection cap below the descriptor limit (or as configured),
/// the header and idle deadline.
fn server_limits(settings: &Settings) -> reckon_web::server::ServerLimits {
    let limits = reckon_web::server::ServerLimits::from_descriptor_limit(
        reckon_web::server::descriptor_limit(),
        settings.max_connections,
        settings.header_read_timeout,
    );
    tracing::info!(
        max_connections = limits.max_connections,
        probe_reserve = limits.probe_reserve,
        header_read_timeout_secs = settings.header_read_timeout.as_secs_f64(),
        "connection limits"
    );
    limits
}

/// Ctrl-C or SIGTERM, its handlers installed when this is called (not when it is awaited).
#[cfg(unix)]
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {},
            _ = term.recv() => {},
        }
    })
}

#[cfg(not(unix))]
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}

/// Run `step` every `period` (the first time one period from now), and at once when `wake`
/// is notified, until `stop`. A step runs to its end before the next is counted: a slow one
/// delays the next instead of overlapping it (steps that start long work spawn it on the
/// `TaskTracker` themselves). Each step is a task of its own, so one that panics is logged
/// and the next tick runs again.
fn every<F, Fut>(
    period: Duration,
    stop: CancellationToken,
    wake: Option<Arc<tokio::sync::Notify>>,
    mut step: F,
) -> JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
                () = async {
                    match &wake {
                        Some(w) => w.notified().await,
                        None => std::future::pending().await,
                    }
                } => {}
            }
            if let Err(e) = tokio::spawn(step()).await
                && e.is_panic()
            {
                tracing::error!("a scheduled step panicked; the next tick runs it again");
            }
        }
    })
}

/// The repeated jobs: the nightly audit, the dashboard's snapshots, and the scan scheduler's
/// step ([`ScanScheduler::step`]: each due source scanned in its own task, never twice at
/// once).
async fn start_scheduler(
    scans: ScanScheduler,
    stop: CancellationToken,
    tasks: TaskTracker,
    audit_every: Duration,
) -> anyhow::Result<Vec<JoinHandle<()>>> {
    let mut loops = Vec::new();
    let (ledger, owner) = (scans.ledger.clone(), scans.owner.clone());
    tracing::info!(instance = %owner, "scheduler started");

    // The nightly audit of yesterday, at each tenant's local audit_time, exactly once across
    // replicas (reckon_engine::audit::run_due claims the day with a lease; the ledger stores
    // one completed scheduled run per day). The tick also refreshes the audit gauges from the
    // ledger, so every replica shows the last run.
    {
        // Before the first scrape: the gauges as the ledger has them, not absent until the
        // first tick (a restart must not resolve finance's alerts).
        if let Err(e) =
            reckon_engine::audit::publish_all(&scans.metrics, &*ledger, time::now()).await
        {
            tracing::warn!(error = %e, "audit gauges not published at start");
        }
        let mut ctx = reckon_engine::audit::AuditCtx::new(ledger.clone());
        ctx.owner = format!("{owner}-audit");
        ctx.metrics = Some(scans.metrics.clone());
        ctx.egress = scans.egress.clone();
        // A run that outlasts the interval delays the next check (`every`), so one replica
        // never runs the schedule twice at once.
        loops.push(every(audit_every, stop.clone(), None, move || {
            let ctx = ctx.clone();
            async move {
                match reckon_engine::audit::run_due(&ctx, time::now()).await {
                    Ok(runs) => {
                        for r in runs {
                            log_nightly(&r);
                        }
                    }
                    Err(e) => tracing::error!(error = %e, "nightly audit"),
                }
            }
        }));
    }

    // The dashboard chart's hourly series, every SNAPSHOT_EVERY; a later run in the same
    // hour replaces that hour's row. One at once too: a chart that waited for the first
    // period (and a fresh ledger's, for its second hour) would be empty meanwhile.
    {
        let ledger = ledger.clone();
        tokio::spawn(async move {
            if let Err(e) = reckon_engine::snapshot::snapshot_all(&*ledger, time::now()).await {
                tracing::warn!(error = %e, "dashboard snapshots failed");
            }
        });
    }
    {
        let ledger = ledger.clone();
        loops.push(every(SNAPSHOT_EVERY, stop.clone(), None, move || {
            let ledger = ledger.clone();
            async move {
                if let Err(e) = reckon_engine::snapshot::snapshot_all(&*ledger, time::now()).await {
                    tracing::warn!(error = %e, "dashboard snapshots failed");
                }
            }
        }));
    }
    loops.push(every(TICK, stop.clone(), None, move || {
        let (scans, stop, tasks) = (scans.clone(), stop.clone(), tasks.clone());
        async move {
            if stop.is_cancelled() {
                return;
            }
            if let Err(e) = scans.step(time::now(), &tasks).await {
                tracing::error!(error = %e, "cannot list sources");
            }
        }
    }));
    Ok(loops)
}

/// A stored nightly run in the log: a complete one at INFO; one that is partial or failed
/// at WARN with why (the providers whose part failed, and their reasons), since finance's
/// morning report of that day is then missing those providers' findings.
fn log_nightly(r: &reckon_engine::audit::DueRun) {
    let run = &r.run.run;
    if run.status == "complete" {
        tracing::info!(tenant = %r.tenant, day = %run.day, status = %run.status,
            "nightly audit stored");
    } else {
        let why = run.reason.as_deref().unwrap_or("no reason recorded");
        tracing::warn!(tenant = %r.tenant, day = %run.day, status = %run.status, reason = %why,
            "nightly audit stored {}: {why}", run.status);
    }
}

/// The reconciler: every tick, and as soon as a scan stored a change, each tenant without a
/// running loop gets one, which claims
/// due effects with a lease, looks them up, classifies, records and releases
/// (`reconcile_until`) until nothing is due. Replicas share the work through the claims (PostgreSQL
/// `FOR UPDATE SKIP LOCKED`): no effect is looked up by two at once, and a replica that dies
/// loses its claims when their leases expire.
async fn start_reconciler(
    ctx: Arc<ReconcileCtx>,
    scanned: Arc<tokio::sync::Notify>,
    stop: CancellationToken,
    tasks: TaskTracker,
) -> anyhow::Result<Vec<JoinHandle<()>>> {
    let running: Arc<Mutex<HashSet<i64>>> = Arc::default();
    let last_writeback: Arc<Mutex<std::collections::HashMap<i64, std::time::Instant>>> =
        Arc::default();
    let ticks = every(TICK, stop.clone(), Some(scanned), move || {
        let (ctx, running, stop, tasks) =
            (ctx.clone(), running.clone(), stop.clone(), tasks.clone());
        let last_writeback = last_writeback.clone();
        async move {
            if stop.is_cancelled() {
                return;
            }
            let tenants = match ctx.ledger.list_tenants().await {
                Ok(t) => t,
                Err(e) => {
                    tracing::error!(error = %e, "reconciler: cannot list tenants");
                    return;
                }
            };
            for tenant in tenants {
                if !running.lock().expect("lock").insert(tenant.id.get()) {
                    continue;
                }
                let (ctx, running, stop) = (ctx.clone(), running.clone(), stop.clone());
                let last_writeback = last_writeback.clone();
                tasks.spawn(async move {
                    let id = tenant.id.get();
                    // One pipelined run: each provider's limit of lookups stays in flight across
                    // batches (a loop of `reconcile_next` waits for each batch's slowest
                    // lookup); on shutdown it claims nothing more and finishes what it holds.
                    let resolved_any = match reconcile_until(&ctx, &tenant, || stop.is_cancelled()).await {
                        Ok(outcomes) => {
                            let resolved = outcomes.iter().filter(|o| o.resolved).count();
                            let lost = outcomes.iter().filter(|o| o.outcome == "lease_lost").count();
                            if lost > 0 {
                                // Answers that came after the claim's lease ran out: another
                                // replica may have asked the provider too (nothing recorded
                                // twice). Many of them mean the lease is too short for this
                                // ledger's latency.
                                tracing::warn!(tenant = %tenant.slug, lost, "lookups answered after their lease ran out");
                            }
                            if !outcomes.is_empty() {
                                tracing::info!(
                                    tenant = %tenant.slug, looked_up = outcomes.len(), resolved,
                                    "reconcile run"
                                );
                            }
                            resolved > 0
                        }
                        Err(e) => {
                            tracing::error!(tenant = %tenant.slug, error = %e, "reconcile run failed");
                            false
                        }
                    };
                    // Write-back: resolutions of opted-in sources go back to their rows,
                    // after new resolutions or at least every minute (pending intents of a
                    // crashed run are settled then). One replica at a time per tenant (the
                    // `writeback:{tenant}` lease).
                    let due = resolved_any
                        || last_writeback
                            .lock()
                            .expect("lock")
                            .get(&id)
                            .is_none_or(|t| t.elapsed() >= WRITEBACK_EVERY);
                    if due && !stop.is_cancelled() {
                        last_writeback.lock().expect("lock").insert(id, std::time::Instant::now());
                        let wb = WritebackCtx::new(ctx.ledger.clone(), ctx.egress.clone());
                        while !stop.is_cancelled() {
                            match writeback_next(&wb, tenant.id).await {
                                Ok(WritebackStep::Done(v)) => tracing::info!(
                                    tenant = %tenant.slug, rows = v.len(), "write-back step"
                                ),
                                Ok(WritebackStep::Empty | WritebackStep::Busy { .. }) => break,
                                Err(e) => {
                                    tracing::error!(tenant = %tenant.slug, error = %e, "write-back failed");
                                    break;
                                }
                            }
                        }
                    }
                    running.lock().expect("lock").remove(&id);
                });
            }
        }
    });
    Ok(vec![ticks])
}

/// Write-back runs after new resolutions, and at least this often per tenant.
const WRITEBACK_EVERY: Duration = Duration::from_secs(60);

/// This process's name in leases: unique per start, so a restarted replica never mistakes
/// its predecessor's leases for its own.
fn instance_id() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "reckon".into());
    format!(
        "{host}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

/// On SQLite, one `reckon serve` per ledger file: two would each run the scheduler with
/// their own clocks and in-process state, and SQLite's file locks would make them take
/// turns on every write. The lock is the OS's (released when the process dies, even by
/// SIGKILL), on a file beside the ledger. PostgreSQL ledgers take any number of replicas.
fn lock_sqlite_ledger(settings: &Settings) -> anyhow::Result<Option<std::fs::File>> {
    let db = match settings
        .database_url
        .as_ref()
        .map(ExposeSecret::expose_secret)
    {
        None => settings.data_dir.join("reckon.db"),
        Some(u) if u.starts_with("sqlite:") => {
            let path = u.trim_start_matches("sqlite:").trim_start_matches("//");
            std::path::PathBuf::from(path.split('?').next().unwrap_or(path))
        }
        Some(_) => return Ok(None),
    };
    let lock_path = db.with_extension("db.serve-lock");
    let mut open = std::fs::OpenOptions::new();
    open.create(true).truncate(false).write(true);
    // Private like the ledger beside it (reckon_ledger::create_private_file).
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
    let file = open
        .open(&lock_path)
        .with_context(|| format!("cannot open lock file {}", lock_path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => anyhow::bail!(
            "another `reckon serve` is already running on the SQLite ledger {} \
             (lock {} is held). Stop it first, or use a PostgreSQL ledger \
             (RECKON_DATABASE_URL=postgres://...) to run several replicas.",
            db.display(),
            lock_path.display()
        ),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("cannot lock {}", lock_path.display()))
        }
    }
}

/// `/metrics` access from the settings (see `reckon_web::metrics`).
pub fn metrics_state(
    settings: &Settings,
    instance: reckon_web::metrics::Metrics,
) -> reckon_web::metrics::MetricsState {
    let mut ms = reckon_web::metrics::MetricsSettings::default();
    if let Some(t) = &settings.metrics_token {
        ms = ms.with_operator_token(t.expose_secret());
    }
    reckon_web::metrics::MetricsState::new(instance, ms)
}
