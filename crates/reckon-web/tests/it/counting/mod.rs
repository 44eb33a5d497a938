//! Counts the ledger calls a test makes, by method, from the ledger's own tracing spans
//! (each ledger method opens one at debug level, named for the method).
//!
//! One global subscriber counts for every test of the binary, into the counters installed
//! on the thread that opened the span (a current-thread runtime runs a whole test there).
//! A subscriber per test (`set_default`) raced with the other tests' threads: tracing's
//! global cache of which spans are enabled could be rebuilt without it, and a call went
//! uncounted.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Once};
use tracing::Subscriber;
use tracing::span::{Attributes, Id};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

thread_local! {
    static INSTALLED: RefCell<Vec<Calls>> = const { RefCell::new(Vec::new()) };
}

/// How many times the ledger method `method` was called on this thread while
/// [`Calls::install`]'s guard lived.
#[derive(Clone)]
pub struct Calls {
    method: &'static str,
    n: Arc<AtomicUsize>,
}

/// Counting stops when it is dropped.
pub struct Installed(Arc<AtomicUsize>);

impl Drop for Installed {
    fn drop(&mut self) {
        INSTALLED.with(|i| i.borrow_mut().retain(|c| !Arc::ptr_eq(&c.n, &self.0)));
    }
}

impl Calls {
    pub fn of(method: &'static str) -> Calls {
        Calls {
            method,
            n: Arc::new(AtomicUsize::new(0)),
        }
    }

    pub fn install(&self) -> Installed {
        static GLOBAL: Once = Once::new();
        GLOBAL.call_once(|| {
            tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Counter))
                .expect("no other global subscriber in this test binary");
        });
        INSTALLED.with(|i| i.borrow_mut().push(self.clone()));
        Installed(self.n.clone())
    }

    pub fn count(&self) -> usize {
        self.n.load(Ordering::SeqCst)
    }
}

struct Counter;

impl<S: Subscriber> Layer<S> for Counter {
    fn on_new_span(&self, attrs: &Attributes<'_>, _id: &Id, _ctx: Context<'_, S>) {
        let m = attrs.metadata();
        if !m.target().starts_with("reckon_ledger") {
            return;
        }
        INSTALLED.with(|i| {
            for c in i.borrow().iter().filter(|c| c.method == m.name()) {
                c.n.fetch_add(1, Ordering::SeqCst);
            }
        });
    }
}
