//! The listener loop of `reckon serve`: one server is shared by every tenant, so no client
//! may hold what the others need.
//!
//! - **Connection cap.** At most [`ServerLimits::max_connections`] connections are open at
//!   once, below the process's descriptor limit with room kept for the ledger's pool,
//!   tenants' sources, provider lookups and files ([`ServerLimits::from_descriptor_limit`]).
//!   A connection over the cap waits in the kernel's backlog (it takes no descriptor) until
//!   one closes; accepting it anyway would fail once descriptors run out, for everyone, the
//!   ledger included.
//! - **A reserve for probes.** [`ServerLimits::probe_reserve`] more connections are accepted
//!   while the cap is reached; they answer `/healthz`, `/readyz` and `/metrics` only (503
//!   for anything else), one request each with a short header deadline, so an orchestrator
//!   still sees a live process and the operator still sees its metrics while clients fill
//!   the table.
//! - **Header and idle deadline.** A connection must send a request's headers within
//!   [`ServerLimits::header_read_timeout`], and a keep-alive connection that sends nothing
//!   for as long is closed (hyper starts the same deadline when it waits for the next
//!   request's head), so idle connections cannot pile up until the cap.
//!
//! HTTP/1.1 only, as `axum::serve` was built here (the workspace enables axum's `http1`).

use axum::Router;
use axum::extract::ConnectInfo;
use axum::http::{Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt;

/// How long a client has to send a request's headers, and how long an idle keep-alive
/// connection is kept, unless configured otherwise.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections accepted beyond the cap for the probe paths.
pub const PROBE_RESERVE: usize = 64;
/// Probe connections get this long (at most) to send their one request's headers. Short:
/// while the cap holds, every connection waiting in the backlog (a flood's included) passes
/// through the reserve in turn, and a probe sends its request as soon as it connects.
const PROBE_HEADER_TIMEOUT: Duration = Duration::from_millis(250);
/// The paths a probe connection answers.
const PROBE_PATHS: [&str; 3] = ["/healthz", "/readyz", "/metrics"];
/// Descriptors kept out of the connection cap for everything else the process opens: the
/// ledger's pool, tenants' source connections (one per running scan, probe or write-back,
/// and their cancel connections), provider lookups' connection pools, the SQLite files,
/// the metrics listener. A quarter of the limit, and never less than this.
const MIN_DESCRIPTORS_KEPT: u64 = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// Open connections at most (probe connections not counted).
    pub max_connections: usize,
    /// Connections accepted beyond the cap, for the probe paths only.
    pub probe_reserve: usize,
    /// Deadline for a request's headers, and for an idle keep-alive connection.
    pub header_read_timeout: Duration,
}

impl ServerLimits {
    /// The limits for a process allowed `nofile` descriptors: a quarter (at least 256) kept
    /// for everything but clients' connections, the probe reserve out of the rest.
    /// `configured` (the `max_connections` setting) is used as it is, but never above what
    /// the descriptor limit leaves.
    pub fn from_descriptor_limit(
        nofile: Option<u64>,
        configured: Option<usize>,
        header_read_timeout: Duration,
    ) -> ServerLimits {
        // Without a known limit (not Linux-like), the traditional default soft limit.
        let nofile = nofile.unwrap_or(1024);
        let kept = (nofile / 4).max(MIN_DESCRIPTORS_KEPT);
        let room = nofile
            .saturating_sub(kept)
            .saturating_sub(PROBE_RESERVE as u64);
        let room = usize::try_from(room).unwrap_or(usize::MAX).max(1);
        ServerLimits {
            max_connections: configured.map_or(room, |c| c.clamp(1, room)),
            probe_reserve: PROBE_RESERVE,
            header_read_timeout,
        }
    }
}

/// The process's soft descriptor limit (`RLIMIT_NOFILE`), if it has one.
pub fn descriptor_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// Serve `app` on `listener` within `limits` until `shutdown` completes, then let open
/// connections finish their requests. Each request carries [`ConnectInfo<SocketAddr>`]
/// (`std::net::SocketAddr`; the sign-in throttle reads the peer). No upgrades (nothing
/// here speaks WebSocket).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ServerLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let general = Arc::new(Semaphore::new(limits.max_connections));
    let reserve = Arc::new(Semaphore::new(limits.probe_reserve));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        // A slot before the accept: with none free the connection stays in the backlog.
        let slot = match general.clone().try_acquire_owned() {
            Ok(p) => Slot::General(p),
            Err(_) => tokio::select! {
                biased;
                () = &mut shutdown => break,
                p = general.clone().acquire_owned() => Slot::General(p.expect("never closed")),
                p = reserve.clone().acquire_owned() => Slot::Probe(p.expect("never closed")),
            },
        };
        let (stream, peer) = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors (EMFILE/ENFILE) or a connection reset before it
                    // was accepted: wait a moment rather than spin, as axum::serve does.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let probe_only = matches!(slot, Slot::Probe(_));
        let router = app.clone();
        let service = tower::service_fn(move |mut req: Request<Incoming>| {
            req.extensions_mut().insert(ConnectInfo(peer));
            let router = router.clone();
            async move {
                if probe_only && !PROBE_PATHS.contains(&req.uri().path()) {
                    return Ok::<_, Infallible>(busy());
                }
                router.oneshot(req).await
            }
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(if probe_only {
                limits.header_read_timeout.min(PROBE_HEADER_TIMEOUT)
            } else {
                limits.header_read_timeout
            })
            .keep_alive(!probe_only);
        let conn = builder.serve_connection(
            TokioIo::new(stream),
            hyper_util::service::TowerToHyperService::new(service),
        );
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// A connection's place: under the cap, or in the probe reserve.
enum Slot {
    General(#[expect(dead_code, reason = "held for the connection's life")] OwnedSemaphorePermit),
    Probe(#[expect(dead_code, reason = "held for the connection's life")] OwnedSemaphorePermit),
}

fn busy() -> axum::response::Response {
    let mut r = Response::new(axum::body::Body::from(
        "the server is at its connection limit; try again shortly\n",
    ));
    *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let h = r.headers_mut();
    h.insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    h.insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_keeps_room_below_the_descriptor_limit() {
        let l = ServerLimits::from_descriptor_limit(Some(1024), None, DEFAULT_HEADER_READ_TIMEOUT);
        assert_eq!(l.max_connections, 1024 - 256 - PROBE_RESERVE);
        let l =
            ServerLimits::from_descriptor_limit(Some(20_000), None, DEFAULT_HEADER_READ_TIMEOUT);
        assert_eq!(l.max_connections, 20_000 - 5_000 - PROBE_RESERVE);
        assert!(l.max_connections + l.probe_reserve < 20_000);
        // A configured cap above what the limit leaves is lowered to it.
        let l = ServerLimits::from_descriptor_limit(
            Some(1024),
            Some(5_000),
            DEFAULT_HEADER_READ_TIMEOUT,
        );
        assert_eq!(l.max_connections, 1024 - 256 - PROBE_RESERVE);
        let l =
            ServerLimits::from_descriptor_limit(Some(1024), Some(100), DEFAULT_HEADER_READ_TIMEOUT);
        assert_eq!(l.max_connections, 100);
    }
}
