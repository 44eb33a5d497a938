//! Counts the ledger calls a test makes, by method, from the ledger's own tracing spans
//! (each ledger method opens one at debug level, named for the method).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tracing::Subscriber;
use tracing::span::{Attributes, Id};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// How many times the ledger method `method` was called while [`Calls::install`]'s guard
/// lived, on this thread (a current-thread runtime runs the whole test there).
#[derive(Clone)]
pub struct Calls {
    method: &'static str,
    n: Arc<AtomicUsize>,
}

impl Calls {
    pub fn of(method: &'static str) -> Calls {
        Calls {
            method,
            n: Arc::new(AtomicUsize::new(0)),
        }
    }

    pub fn install(&self) -> tracing::subscriber::DefaultGuard {
        tracing::subscriber::set_default(tracing_subscriber::registry().with(self.clone()))
    }

    pub fn count(&self) -> usize {
        self.n.load(Ordering::SeqCst)
    }
}

impl<S: Subscriber> Layer<S> for Calls {
    fn on_new_span(&self, attrs: &Attributes<'_>, _id: &Id, _ctx: Context<'_, S>) {
        let m = attrs.metadata();
        if m.target().starts_with("reckon_ledger") && m.name() == self.method {
            self.n.fetch_add(1, Ordering::SeqCst);
        }
    }
}
