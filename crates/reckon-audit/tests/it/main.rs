//! The crate's integration tests, one module per subject, linked as one test binary
//! (`cargo test -p reckon-audit --test it -- MODULE::`): a binary per file made the suite
//! spend most of its time linking.

mod chain;
mod planted_day;
