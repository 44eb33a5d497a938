//! Where a scan's time goes, measured without touching the engine or the ledger:
//! [`CallLayer`] times every ledger call from its tracing span (each ledger method opens
//! one, at debug level, with the sizes it was given and what it stored), and
//! [`StatementLayer`] collects the `elapsed` that sqlx reports for every statement it runs
//! (target `sqlx::query`), on the source connection and on the ledger pool alike.

use reckon_ledger::Origin;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

/// One ledger call made during a scan.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: &'static str,
    pub origin: Option<Origin>,
    pub start: Instant,
    pub dur: Duration,
    /// Records + rejected rows of an ingest batch, keys of a page or a mark_gone call.
    pub items: usize,
    /// For a successful ingest: (created, updated, unchanged, quarantined).
    pub outcome: Option<(u64, u64, u64, u64)>,
}

/// The calls [`CallLayer`] saw, shared with the bench.
#[derive(Debug, Clone, Default)]
pub struct CallLog(Arc<Mutex<Vec<Call>>>);

impl CallLog {
    pub fn layer(&self) -> CallLayer {
        CallLayer(self.clone())
    }

    /// Totals of the successful ingests that started at or after `since`:
    /// (rows, created, updated, unchanged, quarantined). A scan that fails returns no
    /// report, so this is how its stored batches are counted.
    pub fn ingested_since(&self, since: Instant) -> (u64, u64, u64, u64, u64) {
        let calls = self.0.lock().expect("calls lock");
        calls
            .iter()
            .filter(|c| c.method == "ingest" && c.start >= since)
            .filter_map(|c| c.outcome.map(|o| (c.items as u64, o)))
            .fold((0, 0, 0, 0, 0), |a, (n, o)| {
                (a.0 + n, a.1 + o.0, a.2 + o.1, a.3 + o.2, a.4 + o.3)
            })
    }

    /// The calls recorded since the last `take`.
    pub fn take(&self) -> Vec<Call> {
        std::mem::take(&mut *self.0.lock().expect("calls lock"))
    }
}

/// Times the ledger's method spans (target `reckon_ledger::…`), from open to close: the
/// span is entered on every poll of the call's future and closed when the call returns.
pub struct CallLayer(CallLog);

/// A span's fields as the ledger recorded them, kept in the span until it closes.
#[derive(Default)]
struct Open {
    start: Option<Instant>,
    origin: Option<Origin>,
    items: usize,
    outcome: [Option<u64>; 4],
}

impl Visit for Open {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "origin" {
            self.origin = [Origin::Scan, Origin::FullScan, Origin::Push]
                .into_iter()
                .find(|o| o.as_str() == value);
        }
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        let slot = match field.name() {
            "items" => {
                self.items = value as usize;
                return;
            }
            "created" => 0,
            "updated" => 1,
            "unchanged" => 2,
            "quarantined" => 3,
            _ => return,
        };
        self.outcome[slot] = Some(value);
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.record_u64(field, value.max(0) as u64);
    }
    fn record_debug(&mut self, _field: &Field, _value: &dyn std::fmt::Debug) {}
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for CallLayer {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if !attrs.metadata().target().starts_with("reckon_ledger") {
            return;
        }
        let mut open = Open {
            start: Some(Instant::now()),
            ..Open::default()
        };
        attrs.record(&mut open);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(open);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(open) = span.extensions_mut().get_mut::<Open>()
        {
            values.record(open);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(open) = span.extensions_mut().remove::<Open>() else {
            return;
        };
        let start = open.start.expect("set when opened");
        let [c, u, n, q] = open.outcome;
        self.0.0.lock().expect("calls lock").push(Call {
            method: span.metadata().name(),
            origin: open.origin,
            start,
            dur: start.elapsed(),
            items: open.items,
            outcome: c.zip(u).zip(n).zip(q).map(|(((c, u), n), q)| (c, u, n, q)),
        });
    }
}

/// Totals for one statement text.
#[derive(Debug, Default, Clone)]
pub struct StatementStat {
    pub count: u64,
    pub total: f64,
    pub max: f64,
    pub rows_returned: u64,
    pub rows_affected: u64,
}

pub type StatementStats = Arc<Mutex<HashMap<String, StatementStat>>>;

/// Collects sqlx's per-statement log events (`sqlx::query`, emitted when a statement
/// finishes; for a streamed query that is when the stream is dropped, so its `elapsed`
/// includes the time the consumer spent between rows).
pub struct StatementLayer {
    pub stats: StatementStats,
}

#[derive(Default)]
struct Fields {
    summary: String,
    statement: String,
    elapsed: f64,
    rows_returned: u64,
    rows_affected: u64,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "summary" => self.summary = value.to_owned(),
            "db.statement" => self.statement = value.to_owned(),
            _ => {}
        }
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        if field.name() == "elapsed_secs" {
            self.elapsed = value;
        }
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        match field.name() {
            "rows_returned" => self.rows_returned = value,
            "rows_affected" => self.rows_affected = value,
            _ => {}
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        // `summary` and `db.statement` may arrive as Debug if recorded without a str hint.
        match field.name() {
            "summary" if self.summary.is_empty() => {
                self.summary = format!("{value:?}").trim_matches('"').to_owned();
            }
            "db.statement" if self.statement.is_empty() => {
                self.statement = format!("{value:?}").trim_matches('"').replace("\\n", " ");
            }
            _ => {}
        }
    }
}

/// A short, distinguishing label: the head and the tail of the statement.
fn label(sql: &str) -> String {
    let flat = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    let chars: Vec<char> = flat.chars().collect();
    if chars.len() <= 96 {
        flat
    } else {
        let head: String = chars[..56].iter().collect();
        let tail: String = chars[chars.len() - 36..].iter().collect();
        format!("{head} … {tail}")
    }
}

impl<S: Subscriber> Layer<S> for StatementLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if event.metadata().target() != "sqlx::query" {
            return;
        }
        let mut f = Fields::default();
        event.record(&mut f);
        let sql = if f.statement.trim().is_empty() {
            f.summary.trim_end_matches(" …").to_owned()
        } else {
            f.statement
        };
        let mut stats = self.stats.lock().expect("stats lock");
        let s = stats.entry(label(&sql)).or_default();
        s.count += 1;
        s.total += f.elapsed;
        s.max = s.max.max(f.elapsed);
        s.rows_returned += f.rows_returned;
        s.rows_affected += f.rows_affected;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::field::Empty;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn a_ledger_span_becomes_one_call_with_the_fields_recorded_before_it_closed() {
        let log = CallLog::default();
        let _guard =
            tracing::subscriber::set_default(tracing_subscriber::registry().with(log.layer()));
        let span = tracing::debug_span!(target: "reckon_ledger::effects", "ingest",
            origin = "scan", items = 7_usize,
            created = Empty, updated = Empty, unchanged = Empty, quarantined = Empty);
        span.in_scope(|| {
            let s = tracing::Span::current();
            s.record("created", 4_u64);
            s.record("updated", 1_u64);
            s.record("unchanged", 2_u64);
            s.record("quarantined", 0_u64);
        });
        drop(span);
        let other = tracing::debug_span!(target: "reckon_web::api", "not_a_ledger_call");
        drop(other);
        let keys =
            tracing::debug_span!(target: "reckon_ledger::effects", "present_keys", items = Empty);
        keys.record("items", 3_usize);
        drop(keys);

        let calls = log.take();
        assert_eq!(calls.len(), 2, "{calls:?}");
        assert_eq!(calls[0].method, "ingest");
        assert_eq!(calls[0].origin, Some(Origin::Scan));
        assert_eq!(calls[0].items, 7);
        assert_eq!(calls[0].outcome, Some((4, 1, 2, 0)));
        assert_eq!(
            (calls[1].method, calls[1].items, calls[1].outcome),
            ("present_keys", 3, None)
        );
    }
}
