//! The scan scheduler as one step: which sources are due now, and a scan started for each on
//! the caller's task tracker. `reckon serve` calls [`ScanScheduler::step`] every tick; tests
//! call it with the clock they choose.
//!
//! A source is never scanned twice at once: not by this process (the scheduler's `running`
//! set) and not by another replica on the same ledger (the scan's lease, see
//! [`scan_claimed`]).

use crate::{ScanFailure, ScanOptions, ScanReport, scan_source};
use reckon_domain::time;
use reckon_ledger::{Ledger, LedgerError, Source, Tenant};
use reckon_metrics::Metrics;
use reckon_sources::EgressPolicy;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long a scan's lease lasts without renewal: a replica that is paused, or cut off from
/// the ledger, gives its scans up to another this long after its last renewal. One that
/// dies gives them up at once (the lease carries its presence: `Leases::try_lease_present`).
pub const SCAN_LEASE_SECS: f64 = 30.0;

/// What became of one scan the scheduler started.
#[derive(Debug)]
pub enum Claimed {
    Scanned(ScanReport),
    /// Another replica holds the source's lease, or scanned it since the step looked.
    NotOurs,
    /// The scan failed; the source's health says why.
    Failed(String),
}

#[derive(Clone)]
pub struct ScanScheduler {
    pub ledger: Arc<dyn Ledger>,
    /// This process's name in the scans' leases.
    pub owner: String,
    pub metrics: Metrics,
    pub egress: Arc<EgressPolicy>,
    running: Arc<Mutex<HashSet<i64>>>,
    /// Notified after each scan that stored a change, so the reconciler asks about new
    /// `unknown` effects at once instead of at its next tick.
    pub changed: Arc<tokio::sync::Notify>,
}

impl ScanScheduler {
    pub fn new(
        ledger: Arc<dyn Ledger>,
        owner: String,
        metrics: Metrics,
        egress: Arc<EgressPolicy>,
    ) -> ScanScheduler {
        ScanScheduler {
            ledger,
            owner,
            metrics,
            egress,
            running: Arc::default(),
            changed: Arc::default(),
        }
    }

    /// One look at every scanned source: each whose interval passed by `now`, or that a
    /// person asked to scan, and that this process is not scanning yet, gets a scan on
    /// `tasks` (a slow or panicking source never holds up the others). Returns the ids of
    /// the sources whose scans started.
    pub async fn step(&self, now: f64, tasks: &TaskTracker) -> Result<Vec<i64>, LedgerError> {
        let mut started = Vec::new();
        for (tenant, source) in self.ledger.all_scanned_sources().await? {
            if !source.scan_due(now) || !self.running.lock().expect("lock").insert(source.id) {
                continue;
            }
            started.push(source.id);
            let me = self.clone();
            tasks.spawn(async move {
                let id = source.id;
                me.scan_claimed(tenant, source, now).await;
                me.running.lock().expect("lock").remove(&id);
            });
        }
        Ok(started)
    }

    /// Scan `source` if this replica can take its lease; renew the lease while the scan
    /// runs. Every write of the scan is fenced by the lease, so if this process stalls past
    /// it (a GC pause, SIGSTOP, a network partition) and another replica takes over, the
    /// stalled scan's late writes are refused instead of interleaving with the new owner's.
    ///
    /// `now` is the step's clock: the source is re-read once the lease is held, and scanned
    /// only if it is still due then.
    pub async fn scan_claimed(&self, tenant: Tenant, source: Source, now: f64) -> Claimed {
        let ledger = &self.ledger;
        let name = format!("scan:{}", source.id);
        let lease = match ledger
            .try_lease_present(&name, &self.owner, SCAN_LEASE_SECS)
            .await
        {
            Ok(Some(l)) => l,
            Ok(None) => return Claimed::NotOurs,
            Err(e) => {
                tracing::error!(error = %e, source = %source.name, "cannot claim scan lease");
                return Claimed::Failed(e.to_string());
            }
        };
        // The step's list of due sources may predate another replica's scan that just
        // finished.
        let fresh = match ledger.source_by_name(tenant.id, &source.name).await {
            Ok(s) if s.scan_due(now) => s,
            Ok(_) => {
                let _ = ledger.release_lease(&lease).await;
                return Claimed::NotOurs;
            }
            Err(e) => {
                tracing::error!(error = %e, source = %source.name, "cannot re-read source");
                let _ = ledger.release_lease(&lease).await;
                return Claimed::Failed(e.to_string());
            }
        };

        self.run_leased(tenant, fresh, lease, ScanOptions::default())
            .await
    }

    /// Scan `source` now, whatever its interval (`reckon source scan`), under the same
    /// lease as the scheduler's scans: a source another process is scanning is left to it
    /// (`NotOurs`) instead of two scans racing over the same keys.
    pub async fn scan_now(&self, tenant: Tenant, source: Source, opts: ScanOptions) -> Claimed {
        let name = format!("scan:{}", source.id);
        match self
            .ledger
            .try_lease_present(&name, &self.owner, SCAN_LEASE_SECS)
            .await
        {
            Ok(Some(lease)) => self.run_leased(tenant, source, lease, opts).await,
            Ok(None) => Claimed::NotOurs,
            Err(e) => Claimed::Failed(e.to_string()),
        }
    }

    /// The scan itself, with `lease` held: renewed while it runs, released at its end.
    async fn run_leased(
        &self,
        tenant: Tenant,
        fresh: Source,
        lease: reckon_ledger::Lease,
        opts: ScanOptions,
    ) -> Claimed {
        let ledger = &self.ledger;
        let source = fresh.clone();
        let renewing = CancellationToken::new();
        let renewer = {
            let (ledger, lease, renewing) = (ledger.clone(), lease.clone(), renewing.clone());
            tokio::spawn(async move {
                let every = Duration::from_secs_f64(SCAN_LEASE_SECS / 3.0);
                loop {
                    tokio::select! {
                        () = renewing.cancelled() => return,
                        () = tokio::time::sleep(every) => {}
                    }
                    match ledger.renew_lease(&lease, SCAN_LEASE_SECS).await {
                        Ok(Some(_)) => {}
                        Ok(None) => {
                            // The scan's next write will be refused; nothing to do but say so.
                            tracing::warn!(lease = %lease.name, "scan lease lost");
                            return;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, lease = %lease.name, "cannot renew lease");
                        }
                    }
                }
            })
        };

        let opts = ScanOptions {
            lease: Some(lease.clone()),
            egress: self.egress.clone(),
            ..opts
        };
        let (l2, t2, s2) = (ledger.clone(), tenant.clone(), fresh.clone());
        // Its own task, so a scanner that panics is a failure of this source only.
        let outcome = tokio::spawn(async move { scan_source(&*l2, &t2, &s2, &opts).await }).await;
        let (slug, src) = (tenant.slug.as_str(), source.name.as_str());
        let claimed = match outcome {
            Ok(Ok(r)) => {
                self.metrics
                    .record_scan_success(slug, src, r.created + r.updated);
                // A scan that changed something is news; the routine one every few seconds
                // is not.
                if r.created + r.updated + r.quarantined > 0 {
                    tracing::info!(tenant = %slug, source = %src, rows = r.rows_read,
                        created = r.created, updated = r.updated,
                        quarantined = r.quarantined, "scan done");
                } else {
                    tracing::debug!(tenant = %slug, source = %src, rows = r.rows_read,
                        "scan done, nothing changed");
                }
                if r.created + r.updated > 0 {
                    self.changed.notify_one();
                }
                Claimed::Scanned(r)
            }
            // Another replica took the scan over: not an error of the source.
            Ok(Err(ScanFailure::Ledger(LedgerError::LeaseLost(_)))) => Claimed::NotOurs,
            // Recorded in the source's health by scan_source.
            Ok(Err(e)) => {
                self.metrics.record_scan_error(slug, src);
                Claimed::Failed(e.to_string())
            }
            Err(join) => {
                self.metrics.record_scan_error(slug, src);
                let why = if join.is_panic() {
                    "the scanner panicked"
                } else {
                    "the scan was cancelled"
                };
                tracing::error!(tenant = %slug, source = %src, "{why}");
                let _ = ledger
                    .record_scan_failure(tenant.id, source.id, time::now(), why, Some(&lease))
                    .await;
                Claimed::Failed(why.into())
            }
        };
        renewing.cancel();
        let _ = renewer.await;
        if let Err(e) = ledger.release_lease(&lease).await {
            tracing::warn!(error = %e, lease = %lease.name, "cannot release lease");
        }
        claimed
    }
}
