//! The only crate that opens tenants' databases. It reads `justonce_keys` read-only (a
//! read-only transaction, never DDL, never a write) in the three dialects of the justonce
//! reference, and hands every row over undecoded ([`reckon_domain::RawRow`]) so the domain's
//! rules alone decide what is a record and what goes to quarantine.
//!
//! The one exception is write-back ([`write`]): for a source that opted in,
//! and only then, one conditional statement per resolved row.

pub mod dsn;
pub mod egress;
mod limits;
pub mod mapping;
mod own;
mod scan;
pub mod write;

pub use dsn::{Dialect, DsnError, SourceDsn, Transport, validate_table_name};
pub use egress::{EgressError, EgressPolicy, OwnDatabase, Resolver};
pub use mapping::{Mapping, MappingCheck, MappingError};
pub use own::REFUSED as OWN_DATABASE_REFUSED;
pub use scan::{ScanError, SourceConn};
pub use write::{Change, RowNow, SourceWriter, WriteError};
