//! The work reckon does, as step functions the scheduler merely triggers and tests call
//! directly: scan a source ([`scan::scan_source`]), take pushed records ([`push`]).

pub mod answer;
pub mod audit;
pub mod commands;
pub mod connect;
pub mod limit;
pub mod probe;
pub mod provider_client;
pub mod provider_input;
pub mod push;
pub mod read;
pub mod reconcile;
pub mod scan;
pub mod schedule;
pub mod schema;
// Hourly unresolved snapshots for the dashboard's chart.
pub mod snapshot;
pub mod source_input;
pub mod when;
pub mod writeback;

pub use provider_client::provider_client;
pub use scan::{ScanFailure, ScanOptions, ScanReport, scan_source};
pub use source_input::{SourceEdit, SourceInput, check_dsn_at_save, new_source, source_change};
