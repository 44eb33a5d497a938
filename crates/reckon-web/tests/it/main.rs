//! The crate's integration tests, one module per subject, linked as one test binary
//! (`cargo test -p reckon-web --test it -- MODULE::`): a binary per file made the suite
//! spend most of its time linking.

mod api;
mod audit_log;
mod audits;
mod browser;
mod common;
mod counting;
mod dashboard;
mod dsn_errors;
mod edit;
mod generated_cases;
mod isolation;
mod lookup_answers;
mod nul;
mod openapi;
mod operator_pool;
mod reconcile_api;
mod roles;
mod secret_moves;
mod signin;
mod signin_locks;
mod signin_same_steps;
mod source_secrets;
mod sweep;
mod throttle;
mod timeout;
mod viewer;
