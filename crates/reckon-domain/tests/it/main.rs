//! The crate's integration tests, one module per subject, linked as one test binary
//! (`cargo test -p reckon-domain --test it -- MODULE::`): a binary per file made the suite
//! spend most of its time linking.

mod ingest_plan;
mod words;
