//! The crate's integration tests, one module per subject, linked as one test binary
//! (`cargo test -p reckon-providers --test it -- MODULE::`): a binary per file made the suite
//! spend most of its time linking.

mod answer_cap;
mod fault_matrix;
mod verdicts;
mod world_property;
