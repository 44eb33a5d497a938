//! The crate's integration tests, one module per subject, linked as one test binary
//! (`cargo test -p reckon-engine --test it -- MODULE::`): a binary per file made the suite
//! spend most of its time linking.

mod audit_day;
mod audit_localstripe;
mod common;
mod echoed_secrets;
mod mapped_sources;
mod own_database;
mod reconcile_demo;
mod reconcile_limit;
mod reconcile_localstripe;
mod reconcile_sim;
mod scan_column_caps;
mod scan_sources;
mod schedule;
mod source_locks;
mod writeback;
