//! Scrape-time metrics queries on PostgreSQL (SQL shared with SQLite in `crate::metrics`).

use super::PgLedger;
use crate::metrics::{
    MetricsQuery, MetricsSnapshot, NEEDS_ATTENTION_SQL, QUARANTINE_SQL, SOURCES_SQL,
    UNRESOLVED_SQL, map_rows,
};
use crate::model::TenantId;
use crate::{Ledger, Result};
use futures::{StreamExt, TryStreamExt};
use sqlx::AssertSqlSafe;
use sqlx::postgres::PgRow;

/// Connections the operator's scrape uses at once (the pool holds 10; PostgreSQL and
/// reckon share 2 cores here, so more would only queue).
const SCRAPE_CONCURRENCY: usize = 2;
/// Statements of a batch before its first tenant: the isolation level and the timeout.
const BATCH_HEADER: usize = 2;
/// Statements per tenant in a batch: its scope, then the four reads.
const PER_TENANT: usize = 5;

impl PgLedger {
    /// Row-level security shows a statement only the tenant its transaction names, so the
    /// operator's view is one scoped read per tenant. Round trips, not the reads, were most
    /// of its cost (each read is O(the tenant's unresolved effects and sources)): a batch of
    /// tenants goes to the server as one simple-protocol message, one round trip for all
    /// its statements. `SCRAPE_CONCURRENCY` batches run at once.
    pub(crate) async fn metrics_snapshot_pg(&self, q: MetricsQuery) -> Result<MetricsSnapshot> {
        let tenants: Vec<TenantId> = match q.tenant {
            Some(t) => vec![t],
            None => self
                .list_tenants()
                .await?
                .into_iter()
                .map(|t| t.id)
                .collect(),
        };
        let per_batch = tenants.len().div_ceil(SCRAPE_CONCURRENCY).max(1);
        // In tenant order, so the exposition is stable.
        // Owned batches: a future borrowing from `tenants` would not be `Send` for every
        // lifetime, which the trait's boxed future needs.
        let batches: Vec<Vec<TenantId>> = tenants.chunks(per_batch).map(<[_]>::to_vec).collect();
        let snapshots: Vec<MetricsSnapshot> = futures::stream::iter(batches)
            .map(|batch| self.metrics_batch(q, batch))
            .buffered(SCRAPE_CONCURRENCY)
            .try_collect()
            .await?;
        let mut all = MetricsSnapshot::default();
        for one in snapshots {
            all.unresolved.extend(one.unresolved);
            all.sources.extend(one.sources);
            all.quarantine.extend(one.quarantine);
            all.needs_attention.extend(one.needs_attention);
        }
        Ok(all)
    }

    /// The four reads of every tenant of `batch`, in one message and one implicit
    /// transaction: one snapshot for the batch, and on any error PostgreSQL rolls it back,
    /// so the pooled connection goes back clean.
    async fn metrics_batch(
        &self,
        q: MetricsQuery,
        batch: Vec<TenantId>,
    ) -> Result<MetricsSnapshot> {
        let sql = batch_sql(&q, &batch);
        let mut conn = self.pool.acquire().await?;
        let mut results: Vec<Vec<PgRow>> = vec![Vec::new()];
        let mut stream = sqlx::raw_sql(AssertSqlSafe(sql)).fetch_many(&mut *conn);
        // Each statement's rows come first, then its completion.
        while let Some(item) = stream.try_next().await? {
            match item {
                sqlx::Either::Right(row) => results.last_mut().expect("one open").push(row),
                sqlx::Either::Left(_) => results.push(Vec::new()),
            }
        }
        drop(stream);
        results.pop(); // the one opened after the last completion
        if results.len() != BATCH_HEADER + PER_TENANT * batch.len() {
            return Err(crate::LedgerError::Database(sqlx::Error::Protocol(
                format!(
                    "metrics batch: {} statement results for {} tenants",
                    results.len(),
                    batch.len()
                ),
            )));
        }
        let mut all = MetricsSnapshot::default();
        for r in results[BATCH_HEADER..].chunks(PER_TENANT) {
            let one = map_rows(&r[1], &r[2], &r[3], &r[4])?;
            all.unresolved.extend(one.unresolved);
            all.sources.extend(one.sources);
            all.quarantine.extend(one.quarantine);
            all.needs_attention.extend(one.needs_attention);
        }
        Ok(all)
    }
}

/// The batch's statements. The simple protocol has no parameters, so the query's values
/// are written into the text: only numbers, formatted here from `i64` and finite `f64`
/// (never text from a tenant), each cast to the type its placeholder had.
fn batch_sql(q: &MetricsQuery, batch: &[TenantId]) -> String {
    let now = float_literal(q.now);
    let cutoff = float_literal(q.replay_closing_created_before);
    // The isolation level must come before any read; the web side gives up after its own
    // timeout, and the statement timeout stops the server's work too. The other scopes
    // are cleared, as every scoped transaction does.
    let mut sql = String::from(
        "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY;\n\
         SELECT set_config('statement_timeout', '10s', true), set_config('reckon.token', '', true), \
         set_config('reckon.session', '', true), set_config('reckon.user', '', true);\n",
    );
    for t in batch {
        let id = t.get();
        let tenant = format!("({id}::int8)");
        // Bound by the statement: the same text the extended protocol would have run.
        let bind = |s: &str, params: &[&str]| {
            let mut s = s.to_owned();
            // Highest first, so `$1` never matches the start of `$10`.
            for (i, p) in params.iter().enumerate().rev() {
                s = s.replace(&format!("${}", i + 1), p);
            }
            s
        };
        sql.push_str(&format!(
            "SELECT set_config('reckon.tenant', '{id}', true);\n{};\n{};\n{};\n{};\n",
            bind(UNRESOLVED_SQL, &[&now, &cutoff, &tenant]),
            bind(SOURCES_SQL, &[&tenant]),
            bind(QUARANTINE_SQL, &[&tenant]),
            bind(NEEDS_ATTENTION_SQL, &[&tenant]),
        ));
    }
    sql
}

/// A finite `f64` as a PostgreSQL literal. Rust's `Display` never writes an exponent and
/// round-trips exactly; NaN and infinities (never a clock reading) become NULL, which
/// matches nothing.
fn float_literal(v: f64) -> String {
    if v.is_finite() {
        format!("({v}::float8)")
    } else {
        "(NULL::float8)".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_batch_holds_only_numbers_and_every_placeholder_is_bound() {
        let q = MetricsQuery {
            tenant: None,
            now: 1_764_512_345.125,
            replay_closing_created_before: 1_764_440_345.5,
        };
        let sql = batch_sql(&q, &[TenantId(7), TenantId(12)]);
        assert!(!sql.contains('$'), "unbound placeholder in {sql}");
        assert!(sql.contains("(1764512345.125::float8)"));
        assert!(sql.contains("(1764440345.5::float8)"));
        assert!(sql.contains("set_config('reckon.tenant', '12', true)"));
        assert_eq!(
            sql.matches(';').count(),
            BATCH_HEADER + PER_TENANT * 2,
            "one statement per expected result"
        );
        assert_eq!(float_literal(f64::NAN), "(NULL::float8)");
        assert_eq!(float_literal(1e21), "(1000000000000000000000::float8)");
    }
}
