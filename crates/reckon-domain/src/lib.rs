//! reckon's vocabulary. Everything here is pure: no database, no HTTP, no async runtime
//! (an invariant written down in ARCHITECTURE.md), so the rules that decide what a row
//! means can be unit-tested on their own.

pub mod charge;
pub mod effect;
pub mod ingest;
pub mod key;
pub mod outcome;
pub mod provider;
pub mod reconcile;
pub mod record;
pub mod recorded;
pub mod redact;
pub mod role;
pub mod source;
pub mod state;
pub mod time;
pub mod writeback;

pub use charge::ChargeStatus;
pub use key::OperationKey;
pub use outcome::Outcome;
pub use provider::{ProviderKind, UnknownProviderKind};
pub use record::{
    Decision, Limits, QuarantineReason, RawNum, RawRow, Rejected, SourceRecord, StoredSnapshot,
    decide, validate_row,
};
pub use redact::Redactor;
pub use role::Role;
pub use source::{Dialect, SourceKind};
pub use state::{Disappearance, State, UnresolvedKind};

/// A stored or typed word that is none of a domain enum's: what was read, the word, and
/// the words there are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {word:?} is not one of {}", .words.join(", "))]
pub struct UnknownWord {
    pub what: &'static str,
    pub word: String,
    pub words: Vec<&'static str>,
}

/// One of `all` spelled exactly `s`, or an [`UnknownWord`] naming `what` and listing the
/// words: how every stored or typed word of the domain is read back.
pub(crate) fn word<T: Copy>(
    what: &'static str,
    all: &[T],
    as_str: fn(T) -> &'static str,
    s: &str,
) -> Result<T, UnknownWord> {
    all.iter()
        .copied()
        .find(|w| as_str(*w) == s)
        .ok_or_else(|| UnknownWord {
            what,
            word: s.to_owned(),
            words: all.iter().map(|w| as_str(*w)).collect(),
        })
}
