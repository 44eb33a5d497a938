//! Opening the ledger visibly. Opening it applies its pending migrations, and on
//! PostgreSQL first waits for any other process that holds the migration lock (a
//! `reckon migrate` step, another replica starting): that can take minutes on a large
//! ledger. Meanwhile the process says so in its log, and `reckon serve` already answers on
//! its port: `/healthz` 200 "migrating" (alive: a probe must not restart a process that is
//! waiting its turn, or an upgrade crash-loops), `/readyz` and everything else 503
//! "migrating" (no traffic yet).

use anyhow::Context;
use axum::http::StatusCode;
use std::future::Future;
use std::time::{Duration, Instant};

/// How often a wait that goes on is logged again.
const REMIND_EVERY: Duration = Duration::from_secs(10);

/// Run `opening` (the ledger's open, which migrates), logging that it may wait and, every
/// [`REMIND_EVERY`], that it still does.
pub async fn logged<T>(opening: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tracing::info!(
        "opening the ledger: applying pending migrations, waiting first if another process \
         holds the migration lock"
    );
    let started = Instant::now();
    let mut remind =
        tokio::time::interval_at(tokio::time::Instant::now() + REMIND_EVERY, REMIND_EVERY);
    tokio::pin!(opening);
    let opened = loop {
        tokio::select! {
            r = &mut opening => break r,
            _ = remind.tick() => tracing::warn!(
                waited_secs = started.elapsed().as_secs(),
                "still waiting for the ledger's migrations (or for the process that holds \
                 the migration lock)"
            ),
        }
    };
    if opened.is_ok() {
        tracing::info!(took_secs = started.elapsed().as_secs_f64(), "ledger open");
    }
    opened
}

/// [`logged`], answering probes on `listen` while it runs. The port is let go before this
/// returns, for the server to bind it again (a probe in between finds it closed once). A
/// port chosen by the system (`:0`) gets no stand-in: nothing could know where to probe.
pub async fn answering<T>(
    listen: &str,
    opening: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    if listen.ends_with(":0") {
        return logged(opening).await;
    }
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {listen} (choose another address with --listen or RECKON_LISTEN)"
            )
        })?;
    let app = axum::Router::new()
        .route(
            "/healthz",
            axum::routing::get(|| async { (StatusCode::OK, "migrating\n") }),
        )
        .fallback(|| async { (StatusCode::SERVICE_UNAVAILABLE, "migrating\n") });
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let opened = logged(opening).await;
    // Not a graceful stop: a probe's connection held open must not delay the real server.
    server.abort();
    let _ = server.await;
    opened
}
