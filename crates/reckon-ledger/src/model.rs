//! The ledger's types: what callers pass in and get back.

use reckon_domain::State;
pub use reckon_domain::effect::{Effect, EffectDetail, EffectEvent};
pub use reckon_domain::ingest::{Cursor, IngestBatch, IngestOutcome, ItemStatus, Lease, Origin};
use serde::Serialize;

/// A tenant's id. Only the ledger makes these (from a slug it looked up or a token it
/// authenticated): every query of tenant data needs one, so none can forget its tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TenantId(pub(crate) i64);

impl TenantId {
    pub fn get(self) -> i64 {
        self.0
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Tenant {
    #[serde(skip)]
    pub id: TenantId,
    pub slug: String,
    pub created_at: f64,
}

pub use reckon_domain::Role;

#[derive(Debug, Clone)]
pub struct TokenGrant {
    pub tenant: Tenant,
    /// The role the token acts with now: its own, capped by its creator's current role.
    pub role: Role,
    pub token_id: i64,
    /// The person who made it; `None` for the operator (CLI).
    pub created_by: Option<i64>,
}

pub use reckon_domain::SourceKind;

/// A new source. The DSN arrives in clear and leaves only sealed.
#[derive(Debug)]
pub struct NewSource {
    pub name: String,
    pub kind: SourceKind,
    pub dsn: Option<secrecy::SecretString>,
    /// Redacted DSN for display (no password).
    pub dsn_display: Option<String>,
    pub table_name: String,
    pub scan_interval_secs: i64,
    pub abandoned_after_secs: f64,
    pub overlap_secs: f64,
    pub full_scan_every_secs: i64,
    /// The column mapping the table is read through (`reckon_sources::Mapping::parse`);
    /// `None` for justonce's own table.
    pub mapping: Option<String>,
}

/// An edit of a source's settings: `None` keeps the stored value. The name and the kind
/// never change (the name is part of the DSN ciphertext's binding; the kind is the dialect).
#[derive(Debug, Default)]
pub struct SourceChange {
    /// A new DSN, sealed again; `None` keeps the stored (sealed) one untouched.
    pub dsn: Option<secrecy::SecretString>,
    /// The new DSN's redacted form; set together with `dsn`.
    pub dsn_display: Option<String>,
    pub table_name: Option<String>,
    pub scan_interval_secs: Option<i64>,
    pub abandoned_after_secs: Option<f64>,
    pub overlap_secs: Option<f64>,
    pub full_scan_every_secs: Option<i64>,
}

impl SourceChange {
    /// A new DSN or table is another place: the scan cursor (a position in the old one)
    /// is dropped, so the next scan reads everything and compares key sets.
    pub fn moves_the_source(&self) -> bool {
        self.dsn.is_some() || self.table_name.is_some()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Source {
    #[serde(skip)]
    pub id: i64,
    pub name: String,
    pub kind: SourceKind,
    pub dsn_display: Option<String>,
    pub table_name: String,
    pub scan_interval_secs: i64,
    pub abandoned_after_secs: f64,
    pub overlap_secs: f64,
    pub full_scan_every_secs: i64,
    #[serde(skip)]
    pub cursor: Option<Cursor>,
    pub last_scan_at: Option<f64>,
    pub last_success_at: Option<f64>,
    pub last_full_scan_at: Option<f64>,
    pub last_error: Option<String>,
    pub last_error_at: Option<f64>,
    pub consecutive_failures: i64,
    pub created_at: f64,
    /// When a person last asked for a scan now ("scan now"; see [`Source::scan_due`]).
    pub scan_requested_at: Option<f64>,
    /// The column mapping its table is read through, as given (a preset's name or JSON
    /// settings); `None` for justonce's own table.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mapping: Option<String>,
    /// Off (`None`, the default) or on with this not_applied policy. Not `pub`: only the
    /// ledger's stored setting can turn write-back on, so a `Source` value cannot be made to
    /// claim it (`reckon_sources::SourceWriter` is opened from a `Source` and refuses one
    /// with write-back off). Read it with [`Source::writeback`].
    pub(crate) writeback: Option<crate::WritebackPolicy>,
}

impl Source {
    /// Whether the scheduler should scan it at `now`: never scanned, its interval passed,
    /// or a person asked after the last scan started.
    pub fn scan_due(&self, now: f64) -> bool {
        match self.last_scan_at {
            None => true,
            Some(t) => {
                now - t >= self.scan_interval_secs as f64
                    || self.scan_requested_at.is_some_and(|r| r > t)
            }
        }
    }

    /// A request for a scan that no scan has answered yet.
    pub fn scan_pending(&self) -> bool {
        self.scan_requested_at
            .is_some_and(|r| self.last_scan_at.is_none_or(|t| r > t))
    }

    /// The source's write-back setting: `None` means reckon never writes to it.
    pub fn writeback(&self) -> Option<crate::WritebackPolicy> {
        self.writeback
    }
}

/// Filters and page for [`crate::Ledger::list_effects`]. Pages are keyed by effect id.
#[derive(Debug, Clone, Default)]
pub struct EffectQuery {
    pub source: Option<String>,
    pub state: Option<State>,
    pub unresolved: Option<bool>,
    pub operation: Option<String>,
    pub updated_since: Option<f64>,
    pub after_id: Option<i64>,
    pub limit: i64,
    /// "Now" for deciding which claims are abandoned.
    pub now: f64,
}

#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct QuarantineCount {
    pub source: String,
    pub reason: String,
    pub count: i64,
}

#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct QuarantineEntry {
    pub id: i64,
    pub reason: String,
    pub detail: String,
    pub key_excerpt: String,
    pub excerpt: String,
    pub origin: String,
    pub first_seen_at: f64,
}
