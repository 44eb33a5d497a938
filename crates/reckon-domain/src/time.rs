//! Times in reckon are UTC instants held as Unix epoch seconds in an `f64`: the
//! representation justonce itself writes (`time.time()`), so a source's timestamps
//! round-trip through the ledger bit for bit and a cursor built from them compares
//! exactly with the source's own values.

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch, now.
pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
