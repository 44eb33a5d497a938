//! reckon's vocabulary. Everything here is pure: no database, no HTTP, no async runtime
//! (an invariant written down in ARCHITECTURE.md), so the rules that decide what a row
//! means can be unit-tested on their own.

pub mod ingest;
pub mod key;
pub mod outcome;
pub mod record;
pub mod redact;
pub mod role;
pub mod source;
pub mod state;
pub mod time;
pub mod writeback;

pub use key::OperationKey;
pub use outcome::Outcome;
pub use record::{
    Decision, Limits, QuarantineReason, RawNum, RawRow, Rejected, SourceRecord, StoredSnapshot,
    decide, validate_row,
};
pub use redact::Redactor;
pub use role::Role;
pub use source::{Dialect, SourceKind};
pub use state::{Disappearance, State, UnresolvedKind};
