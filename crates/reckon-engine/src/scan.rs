//! One scan of one source: the step the scheduler triggers, `reckon source scan` runs, and
//! tests call directly.
//!
//! Incremental part: rows are streamed in `(updated_at, key)` order from
//! `cursor.updated_at - overlap` on, in batches; each batch is stored (or quarantined) in one
//! ledger transaction that also moves the cursor to the batch's last row. A crash between
//! batches loses nothing: the next scan starts again before the cursor, and the idempotent
//! ingest absorbs the rows read twice. Why no row can be missed is written down in
//! ARCHITECTURE.md.
//!
//! Full part (the first scan, every `full_scan_every`, or on demand): the key sets of the
//! source and the ledger are compared. Keys gone from the source are marked swept / released
//! (reckon never deletes an effect because the source did); keys in the source the ledger
//! never stored (a row whose state or timestamp kept it out of the incremental query) are
//! fetched and ingested. Memory stays bounded: the sets hold 64-bit hashes, and every
//! candidate is confirmed against the source by exact key before anything is concluded.

use futures::StreamExt;
use reckon_domain::{Disappearance, Limits, RawNum, RawRow, time, validate_row};
use reckon_ledger::{
    Cursor, IngestBatch, IngestOutcome, Lease, Ledger, LedgerError, Origin, Source, Tenant,
};
use reckon_sources::{EgressPolicy, Mapping, ScanError, SourceConn, SourceDsn};
use secrecy::ExposeSecret;
use serde::Serialize;
use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

pub type Progress = Arc<dyn Fn(u64) + Send + Sync>;

/// A batch being stored while the next one is read.
type IngestFuture<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<IngestOutcome, LedgerError>> + Send + 'a>,
>;

#[derive(Clone)]
pub struct ScanOptions {
    /// Compare key sets even if the source's full-scan interval has not passed.
    pub full: bool,
    /// The most rows in one batch (one ledger transaction)...
    pub batch_size: usize,
    /// ...and the most bytes of their keys, request hashes and responses: a batch ends at
    /// whichever bound comes first, so rows with large responses cannot make a batch (and
    /// the two a scan holds at once) as large as the row count allows.
    pub batch_bytes: usize,
    /// Called with the number of rows read so far.
    pub progress: Option<Progress>,
    /// The scan's lease when several replicas share the ledger: every write of the scan is
    /// fenced by it, so a replica paused past its lease writes nothing when it resumes.
    pub lease: Option<Lease>,
    /// Where sources may connect. The default refuses every non-public address and every
    /// SQLite source: the operator's configuration (and each test) says what to allow.
    pub egress: Arc<EgressPolicy>,
}

impl Default for ScanOptions {
    fn default() -> Self {
        ScanOptions {
            full: false,
            // Per transaction, PostgreSQL's fixed costs (commit, the source's lock, the
            // cursor, the round trips) were a tenth of a first scan at 2,000 rows.
            batch_size: 10_000,
            batch_bytes: 8 << 20,
            progress: None,
            lease: None,
            egress: Arc::new(EgressPolicy::default()),
        }
    }
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct ScanReport {
    pub source: String,
    pub rows_read: u64,
    pub created: u64,
    pub updated: u64,
    pub unchanged: u64,
    pub stale: u64,
    pub quarantined: u64,
    pub full: bool,
    /// Keys noticed missing from the source in this scan, with what that means.
    pub gone: Vec<(String, Disappearance)>,
    /// Rows found by the key-set comparison that the incremental read had not stored.
    pub recovered: u64,
}

impl ScanReport {
    fn add(&mut self, o: &IngestOutcome) {
        self.created += o.created;
        self.updated += o.updated;
        self.unchanged += o.unchanged;
        self.stale += o.stale;
        self.quarantined += o.quarantined;
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ScanFailure {
    #[error("{0}")]
    Source(#[from] ScanError),
    #[error("ledger: {0}")]
    Ledger(#[from] LedgerError),
}

/// Scan one source and record the result in its health (last success or last error).
pub async fn scan_source(
    ledger: &dyn Ledger,
    tenant: &Tenant,
    source: &Source,
    opts: &ScanOptions,
) -> Result<ScanReport, ScanFailure> {
    let started = time::now();
    match scan_inner(ledger, tenant, source, opts, started).await {
        Ok(report) => {
            ledger
                .record_scan_success(
                    tenant.id,
                    source.id,
                    started,
                    report.full,
                    opts.lease.as_ref(),
                )
                .await?;
            Ok(report)
        }
        Err(e @ ScanFailure::Ledger(LedgerError::LeaseLost(_))) => {
            // Another replica owns this scan now; its health is that replica's to record.
            tracing::info!(tenant = %tenant.slug, source = %source.name, "scan stopped: {e}");
            Err(e)
        }
        Err(e) => {
            let msg = e.to_string();
            tracing::warn!(tenant = %tenant.slug, source = %source.name, error = %msg, "scan failed");
            // A failure to record the failure is logged, and the original error returned.
            if let Err(le) = ledger
                .record_scan_failure(tenant.id, source.id, time::now(), &msg, opts.lease.as_ref())
                .await
            {
                tracing::error!(error = %le, "could not record scan failure");
            }
            Err(e)
        }
    }
}

/// Open a read-only connection to a scanned source the way every scan does: its sealed
/// DSN, checked by the egress policy and pinned to the checked address (T09).
pub async fn open_source(
    ledger: &dyn Ledger,
    tenant: &Tenant,
    source: &Source,
    egress: &EgressPolicy,
) -> Result<SourceConn, ScanFailure> {
    let dialect = source
        .kind
        .dialect()
        .ok_or_else(|| ScanError::Invalid(format!("source {:?} is a push source", source.name)))?;
    let dsn = ledger.source_dsn(tenant.id, source).await?;
    let dsn = SourceDsn::parse(dialect, dsn.expose_secret())
        .map_err(|e| ScanError::Invalid(e.to_string()))?;
    // Resolved once and checked; the connection goes to the checked address (T09). A
    // SQLite file must be in this tenant's own directory (T12).
    let dsn = egress
        .for_tenant(&tenant.slug)
        .pin(&dsn)
        .await
        .map_err(|e| ScanError::Invalid(format!("refused by the egress policy: {e}")))?;
    // Connected, it is refused if it can see reckon's own ledger identity.
    match &source.mapping {
        None => Ok(SourceConn::open(&dsn, &source.table_name, egress).await?),
        Some(settings) => {
            let mut mapping = Mapping::parse(settings)
                .map_err(|e| ScanError::Invalid(format!("the source's mapping: {e}")))?;
            // The source's table is the mapping's unless a person changed it since.
            mapping.table = source.table_name.clone();
            Ok(SourceConn::open_mapped(&dsn, &mapping, egress).await?)
        }
    }
}

fn cursor_of(raw: &RawRow) -> Option<Cursor> {
    let updated_at = match raw.updated_at {
        RawNum::Real(f) if f.is_finite() => f,
        RawNum::Int(i) => i as f64,
        _ => return None,
    };
    Some(Cursor {
        updated_at,
        key: raw.key.clone()?,
    })
}

fn hash_key(key: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

async fn scan_inner(
    ledger: &dyn Ledger,
    tenant: &Tenant,
    source: &Source,
    opts: &ScanOptions,
    started: f64,
) -> Result<ScanReport, ScanFailure> {
    let mut conn = open_source(ledger, tenant, source, &opts.egress).await?;
    let result = scan_with(ledger, tenant, source, opts, started, &mut conn).await;
    conn.close().await;
    result
}

async fn scan_with(
    ledger: &dyn Ledger,
    tenant: &Tenant,
    source: &Source,
    opts: &ScanOptions,
    started: f64,
    conn: &mut SourceConn,
) -> Result<ScanReport, ScanFailure> {
    let limits = Limits::default();
    let mut report = ScanReport {
        source: source.name.clone(),
        ..Default::default()
    };
    let since = source
        .cursor
        .as_ref()
        .map(|c| c.updated_at - source.overlap_secs);
    // A first scan: no cursor, and no effect of this source in the ledger. Its read below
    // is unfiltered (every row of the table, whatever it holds) and runs in one read-only
    // snapshot, so every source key is stored or quarantined by the read itself and the
    // ledger holds no key it did not just read: a key-set comparison could find nothing,
    // and is skipped (on a 1M-row table it read 2M keys for that).
    let first_scan = since.is_none()
        && ledger
            .present_keys(tenant.id, source.id, 0, 1)
            .await?
            .is_empty();
    // A first pass that was cut short (a kill, a failure) has a cursor, its last committed
    // batch, and no full scan on record. It goes on from there the way it began: every row
    // from `cursor - overlap` on, whatever its state, its keys expected new, no comparison.
    // Together the two reads saw every row but those backdated behind the cursor or deleted
    // while the pass was stopped; those are the incremental scan's own blind spots, and the
    // comparison at `full_scan_every` finds them as it finds them after any scan.
    let resumed_pass = source.cursor.is_some() && source.last_full_scan_at.is_none();
    let first_pass = first_scan || resumed_pass;
    let batch_of = |records, rejected, cursor| IngestBatch {
        origin: Origin::Scan,
        observed_at: time::now(),
        records,
        rejected,
        abandoned_after_secs: source.abandoned_after_secs,
        cursor,
        lease: opts.lease.clone(),
        // The overlap's rows of a resumed pass are in the ledger: their batch falls back to
        // looking its keys up; the batches after it are new.
        expect_new: first_pass,
    };

    {
        // Reading the next batch overlaps storing the last one: the source server streams
        // rows while the ledger writes (on a 1M-row first scan the read alone is a few
        // seconds). At most one batch is in flight, so batches still commit in order and
        // each moves the cursor past rows all stored before it; memory holds two batches.
        let mut rows = conn.rows(since, first_pass);
        let mut cursor: Option<Cursor> = None;
        let mut in_flight: Option<IngestFuture<'_>> = None;
        loop {
            let (mut records, mut rejected) = (Vec::new(), Vec::new());
            let read = async {
                let mut done = true;
                let mut bytes = 0;
                while let Some(raw) = rows.next().await {
                    let raw = raw?;
                    if let Some(c) = cursor_of(&raw) {
                        cursor = Some(c);
                    }
                    match validate_row(&raw, &limits) {
                        Ok(r) => {
                            bytes += r.key.len()
                                + r.request_hash.len()
                                + r.response.as_ref().map_or(0, String::len);
                            records.push(r);
                        }
                        Err(r) => {
                            bytes += r.key_bytes.as_ref().map_or(0, Vec::len) + r.excerpt.len();
                            rejected.push(r);
                        }
                    }
                    if records.len() + rejected.len() >= opts.batch_size
                        || bytes >= opts.batch_bytes
                    {
                        done = false;
                        break;
                    }
                }
                Ok::<_, ScanFailure>(done)
            };
            let done = match in_flight.take() {
                Some(stored) => {
                    let (stored, read) = futures::join!(stored, read);
                    // Both finish before either error is returned: a read that fails while a
                    // batch is being stored never abandons that transaction half-way. What was
                    // not committed is read again by the next scan, from the cursor.
                    report.add(&stored?);
                    if let Some(p) = &opts.progress {
                        p(report.rows_read);
                    }
                    read?
                }
                None => read.await?,
            };
            report.rows_read += (records.len() + rejected.len()) as u64;
            if !records.is_empty() || !rejected.is_empty() {
                in_flight = Some(ledger.ingest(
                    tenant.id,
                    source.id,
                    batch_of(records, rejected, cursor.clone()),
                ));
            }
            if done {
                break;
            }
        }
        if let Some(stored) = in_flight {
            report.add(&stored.await?);
        }
        if let Some(p) = &opts.progress {
            p(report.rows_read);
        }
    }

    let full_due = source.cursor.is_none()
        || source
            .last_full_scan_at
            .is_none_or(|t| started - t >= source.full_scan_every_secs as f64);
    if first_pass && !opts.full {
        // Equivalent to a comparison (see `first_scan` and `resumed_pass`), so it counts as
        // one.
        report.full = true;
    } else if opts.full || full_due {
        report.full = true;
        compare_key_sets(
            ledger,
            tenant,
            source,
            conn,
            &limits,
            opts.lease.as_ref(),
            &mut report,
        )
        .await?;
    }
    Ok(report)
}

async fn compare_key_sets(
    ledger: &dyn Ledger,
    tenant: &Tenant,
    source: &Source,
    conn: &mut SourceConn,
    limits: &Limits,
    lease: Option<&Lease>,
    report: &mut ScanReport,
) -> Result<(), ScanFailure> {
    // The ledger's present keys, as hashes.
    let mut in_ledger: HashSet<u64> = HashSet::new();
    let mut after = 0;
    loop {
        let page = ledger
            .present_keys(tenant.id, source.id, after, 10_000)
            .await?;
        let Some((last, _)) = page.last() else { break };
        after = *last;
        in_ledger.extend(page.iter().map(|(_, k)| hash_key(k.as_bytes())));
    }

    // The source's keys, as hashes; keys the ledger lacks are kept to be fetched.
    let mut in_source: HashSet<u64> = HashSet::new();
    let mut not_in_ledger: Vec<Vec<u8>> = Vec::new();
    {
        let mut keys = conn.keys();
        while let Some(k) = keys.next().await {
            let k = k?;
            let h = hash_key(&k);
            in_source.insert(h);
            if !in_ledger.contains(&h) {
                not_in_ledger.push(k);
            }
        }
    }
    drop(in_ledger);

    // Rows the incremental read did not store: ingest (or quarantine) them now.
    for chunk in not_in_ledger.chunks(500) {
        let raws = conn.rows_by_key(chunk).await?;
        let (mut records, mut rejected) = (Vec::new(), Vec::new());
        for raw in &raws {
            match validate_row(raw, limits) {
                Ok(r) => records.push(r),
                Err(r) => rejected.push(r),
            }
        }
        let o = ledger
            .ingest(
                tenant.id,
                source.id,
                IngestBatch {
                    origin: Origin::FullScan,
                    observed_at: time::now(),
                    records,
                    rejected,
                    abandoned_after_secs: source.abandoned_after_secs,
                    cursor: None,
                    lease: lease.cloned(),
                    expect_new: false,
                },
            )
            .await?;
        report.recovered += o.created + o.updated;
        report.rows_read += raws.len() as u64;
        report.add(&o);
    }

    // Keys the ledger holds that the source no longer has: confirm each by exact key, then
    // mark it gone.
    let mut after = 0;
    loop {
        let page = ledger
            .present_keys(tenant.id, source.id, after, 10_000)
            .await?;
        let Some((last, _)) = page.last() else { break };
        after = *last;
        let candidates: Vec<Vec<u8>> = page
            .iter()
            .filter(|(_, k)| !in_source.contains(&hash_key(k.as_bytes())))
            .map(|(_, k)| k.clone().into_bytes())
            .collect();
        if candidates.is_empty() {
            continue;
        }
        let still_there: HashSet<Vec<u8>> = conn
            .rows_by_key(&candidates)
            .await?
            .into_iter()
            .filter_map(|r| r.key)
            .collect();
        let gone: Vec<String> = candidates
            .into_iter()
            .filter(|k| !still_there.contains(k))
            .map(|k| String::from_utf8(k).expect("ledger keys are UTF-8"))
            .collect();
        if !gone.is_empty() {
            let marked = ledger
                .mark_gone(
                    tenant.id,
                    source.id,
                    &gone,
                    time::now(),
                    Origin::FullScan,
                    lease,
                )
                .await?;
            report.gone.extend(marked);
        }
    }
    Ok(())
}
