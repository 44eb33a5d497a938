//! The crate's integration tests, one module per subject, linked as one test binary
//! (`cargo test -p reckon --test it -- MODULE::`): a binary per file made the suite
//! spend most of its time linking.

mod audit_cli;
mod cli;
mod connect_cli;
mod crash;
mod demo;
mod demo_cli;
mod demo_first_hour;
mod deploy_smoke;
mod egress_cli;
mod file_modes;
mod keys;
mod listen_taken;
mod lookup_cli;
mod lookup_demo;
mod metric_names;
mod metrics_e2e;
mod migrate_wait;
mod prometheus_alerts;
mod readme;
mod reconcile_crash;
mod replicas;
mod replicas_reconcile;
mod runbooks;
mod shared_server;
mod source_edit_cli;
mod support;
