//! The ledger's two connection pools: the work's (reconciler, scans, write-back, audits, the
//! API) and the operator's view's (`/metrics`, `/readyz`, the dashboard, whatever runs
//! inside [`operator_view`]).
//!
//! A backlog fills the work's pool: every tenant's reconciler run keeps its lookups' ledger
//! calls queued for a connection, and a scrape queued behind hundreds of them timed out for
//! minutes, blind exactly when the backlog's series mattered. The operator's view takes its
//! connections from a small pool of its own, which no background work can reach, so the work
//! gets at most the work's pool however much of it there is. Two pools rather than permits
//! taken from one: a permit would have to live exactly as long as the transaction holding
//! the connection (sqlx's transaction cannot carry one), and every path that opens a
//! transaction would have to take it; a pool needs neither, and its bound holds by
//! construction.
//!
//! Connections that wait long are warned of, at most once a minute, with how many more did
//! since the last warning (sqlx's own warning, one per acquire, is off: a starved pool wrote
//! 91,028 of them in five minutes).

use crate::driver::{Driver, SqlLedger};
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

tokio::task_local! {
    static OPERATOR: ();
}

/// Run `work` with every ledger transaction it opens (in this task) on the operator's pool.
/// For the operator's and people's views: `/metrics`, `/readyz`, the dashboard.
pub async fn operator_view<F: Future>(work: F) -> F::Output {
    OPERATOR.scope((), work).await
}

/// Whether this task runs inside [`operator_view`].
fn in_operator_view() -> bool {
    OPERATOR.try_with(|()| ()).is_ok()
}

/// Connections the operator's view has at once: a scrape reads with four
/// (`postgres::metrics`), and the dashboard's pages are a few reads each.
pub(crate) const OPERATOR_CONNECTIONS: u32 = 4;

/// A wait for a connection this long is warned of (sqlx's own threshold).
pub(crate) const SLOW_ACQUIRE: Duration = Duration::from_secs(2);

/// At most one slow-acquire warning in this long.
const WARN_EVERY: Duration = Duration::from_secs(60);

impl<B: Driver> SqlLedger<B> {
    /// The pool this task's transactions take their connection from.
    pub(crate) fn pool_now(&self) -> &sqlx::Pool<B::DB> {
        if in_operator_view() {
            &self.operator
        } else {
            &self.pool
        }
    }
}

/// How long getting a connection (or starting a transaction) took, noted after it was got,
/// and what a long wait means: a slow one is warned of, at most once a minute for the whole
/// process.
pub(crate) fn note_acquire(started: Instant, why: &str) {
    let waited = started.elapsed();
    if waited < SLOW_ACQUIRE {
        return;
    }
    let now = Instant::now();
    let said = SLOW
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .note(now);
    if let Some(Said { more, over }) = said {
        let pool = if in_operator_view() {
            "the operator's"
        } else {
            "the work's"
        };
        let waited_ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
        if more == 0 {
            tracing::warn!(
                waited_ms,
                "a ledger transaction waited {:.1} s for {pool} pool ({why})",
                waited.as_secs_f64()
            );
        } else {
            tracing::warn!(
                waited_ms,
                more,
                "a ledger transaction waited {:.1} s for {pool} pool ({why}) \
                 ({more} more in the last {:.0} s)",
                waited.as_secs_f64(),
                over.as_secs_f64()
            );
        }
    }
}

static SLOW: Mutex<Limiter> = Mutex::new(Limiter {
    last: None,
    more: 0,
});

/// One warning now, with how many were held back since the one before and over how long.
#[derive(Debug, PartialEq)]
struct Said {
    more: u64,
    over: Duration,
}

/// At most one warning per [`WARN_EVERY`]; the rest are counted into the next.
struct Limiter {
    last: Option<Instant>,
    more: u64,
}

impl Limiter {
    fn note(&mut self, now: Instant) -> Option<Said> {
        match self.last {
            Some(at) if now.duration_since(at) < WARN_EVERY => {
                self.more += 1;
                None
            }
            last => {
                self.last = Some(now);
                let over = last.map_or(Duration::ZERO, |at| now.duration_since(at));
                Some(Said {
                    more: std::mem::take(&mut self.more),
                    over,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_warning_a_minute_with_the_count_of_the_rest() {
        let mut l = Limiter {
            last: None,
            more: 0,
        };
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(
            l.note(at(0)),
            Some(Said {
                more: 0,
                over: Duration::ZERO
            })
        );
        for s in 1..60 {
            assert_eq!(l.note(at(s)), None, "second {s}");
        }
        assert_eq!(
            l.note(at(60)),
            Some(Said {
                more: 59,
                over: Duration::from_secs(60)
            })
        );
        // A quiet spell: the next is said at once, with nothing held back.
        assert_eq!(
            l.note(at(500)),
            Some(Said {
                more: 0,
                over: Duration::from_secs(440)
            })
        );
    }

    #[tokio::test]
    async fn the_operator_view_is_known_inside_it_only() {
        assert!(!in_operator_view());
        assert!(operator_view(async { in_operator_view() }).await);
        assert!(!in_operator_view());
    }
}
