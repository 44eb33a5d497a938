//! `reckon serve`: the HTTP server and the scheduled scans, stopped gracefully on SIGTERM
//! or Ctrl-C.

use crate::config::Settings;
use anyhow::Context;
use reckon_domain::time;
use reckon_engine::{ScanOptions, scan_source};
use reckon_ledger::Ledger;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_cron_scheduler::{Job, JobScheduler};
use tokio_util::sync::CancellationToken;

/// How often the scheduler looks for sources whose interval has passed.
const TICK: Duration = Duration::from_secs(2);

pub async fn run(
    settings: Settings,
    ledger: Arc<dyn Ledger>,
    banner: Option<String>,
) -> anyhow::Result<()> {
    // Bind first, so a taken port fails before anything else starts.
    let listener = tokio::net::TcpListener::bind(&settings.listen)
        .await
        .with_context(|| format!("cannot listen on {}", settings.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "listening");
    if let Some(b) = banner {
        println!("{}", b.replace("{addr}", &addr.to_string()));
    }

    let stop = CancellationToken::new();
    let egress = Arc::new(settings.egress_policy()?);
    let scheduler = start_scheduler(ledger.clone(), stop.clone(), egress).await?;

    let app = reckon_web::app(reckon_web::AppState {
        ledger,
        max_body_bytes: settings.max_body_bytes,
    });
    let shutdown = stop.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutting down");
        shutdown.cancel();
    });
    // The peer address feeds the per-address sign-in throttle.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .with_graceful_shutdown(stop.clone().cancelled_owned())
    .await?;
    let mut scheduler = scheduler;
    let _ = scheduler.shutdown().await;
    Ok(())
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing the SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// One repeated job looks for due sources; each due scan runs in its own task, so a slow
/// or panicking source never holds up the others, and a source is never scanned twice at
/// once by this process.
async fn start_scheduler(
    ledger: Arc<dyn Ledger>,
    stop: CancellationToken,
    egress: Arc<reckon_sources::EgressPolicy>,
) -> anyhow::Result<JobScheduler> {
    let sched = JobScheduler::new().await?;
    let running: Arc<Mutex<HashSet<i64>>> = Arc::default();
    let job = Job::new_repeated_async(TICK, move |_id, _l| {
        let ledger = ledger.clone();
        let running = running.clone();
        let stop = stop.clone();
        let egress = egress.clone();
        Box::pin(async move {
            if stop.is_cancelled() {
                return;
            }
            let sources = match ledger.all_scanned_sources().await {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(error = %e, "cannot list sources");
                    return;
                }
            };
            let now = time::now();
            for (tenant, source) in sources {
                let due = source
                    .last_scan_at
                    .is_none_or(|t| now - t >= source.scan_interval_secs as f64);
                if !due || !running.lock().expect("lock").insert(source.id) {
                    continue;
                }
                let (ledger, running) = (ledger.clone(), running.clone());
                let opts = ScanOptions {
                    egress: egress.clone(),
                    ..ScanOptions::default()
                };
                tokio::spawn(async move {
                    let id = source.id;
                    let l2 = ledger.clone();
                    let (t2, s2) = (tenant.clone(), source.clone());
                    let task =
                        tokio::spawn(async move { scan_source(&*l2, &t2, &s2, &opts).await });
                    match task.await {
                        Ok(Ok(r)) => tracing::info!(
                            tenant = %tenant.slug, source = %source.name,
                            rows = r.rows_read, created = r.created, updated = r.updated,
                            quarantined = r.quarantined, "scan done"
                        ),
                        Ok(Err(_)) => {} // recorded in the source's health by scan_source
                        Err(join) => {
                            let why = if join.is_panic() {
                                "the scanner panicked"
                            } else {
                                "the scan was cancelled"
                            };
                            tracing::error!(tenant = %tenant.slug, source = %source.name, "{why}");
                            let _ = ledger
                                .record_scan_failure(tenant.id, id, time::now(), why)
                                .await;
                        }
                    }
                    running.lock().expect("lock").remove(&id);
                });
            }
        })
    })?;
    sched.add(job).await?;
    sched.start().await?;
    Ok(sched)
}
