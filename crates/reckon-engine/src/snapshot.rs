//! The dashboard's hourly snapshots: for every tenant, how many effects are
//! unresolved and since when the oldest, stored as that hour's row. The serve scheduler
//! calls [`snapshot_all`] a few times an hour; a later call in the same hour replaces the
//! hour's row, so replicas that both run it agree and nothing piles up.

use reckon_ledger::{Ledger, LedgerError, Snapshot};

/// Take the current hour's snapshot of every tenant. One tenant's failure is logged and
/// does not stop the others; returns the snapshots taken.
pub async fn snapshot_all(ledger: &dyn Ledger, now: f64) -> Result<Vec<Snapshot>, LedgerError> {
    let mut taken = Vec::new();
    for tenant in ledger.list_tenants().await? {
        match ledger.take_snapshot(tenant.id, now).await {
            Ok(s) => taken.push(s),
            Err(e) => tracing::warn!(tenant = %tenant.slug, error = %e, "snapshot failed"),
        }
    }
    Ok(taken)
}
