//! From a raw source row to an effect record, or to a quarantine reason.
//!
//! Scanners hand over each column as the bytes or number the source actually held (see
//! [`RawRow`]); this module alone decides whether that is a valid justonce record. Nothing is
//! defaulted or guessed: a row that is not exactly a record goes to quarantine with a reason,
//! and the scan goes on (rule 7).

#![allow(
    clippy::result_large_err,
    reason = "A rejected row carries its excerpt and fingerprint by value: rejection is the rare, cold path, and boxing it would only add an allocation to every caller"
)]

use crate::state::State;
use serde::Serialize;

/// A numeric column as the source stored it. SQLite's flexible typing means a REAL column
/// can hold text, so "what was there" is kept rather than coerced.
#[derive(Debug, Clone, PartialEq)]
pub enum RawNum {
    Null,
    Int(i64),
    Real(f64),
    /// Anything that is not a number (text, blob), with a short description for the reason.
    NotNumber(String),
}

/// One row of `justonce_keys`, undecoded.
#[derive(Debug, Clone)]
pub struct RawRow {
    pub key: Option<Vec<u8>>,
    pub state: Option<Vec<u8>>,
    pub request_hash: Option<Vec<u8>>,
    /// The JSON text of the response, or `None` for SQL NULL (JSON null by convention).
    pub response: Option<Vec<u8>>,
    pub attempts: RawNum,
    pub created_at: RawNum,
    pub updated_at: RawNum,
    pub expires_at: RawNum,
}

/// A valid justonce record, as the ledger stores it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SourceRecord {
    pub key: String,
    pub state: State,
    pub request_hash: String,
    /// Canonical JSON text of the response (decoded once, re-encoded compactly), `None` when
    /// the source held SQL NULL.
    pub response: Option<String>,
    pub attempts: i64,
    pub created_at: f64,
    pub updated_at: f64,
    pub expires_at: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QuarantineReason {
    NullColumn,
    InvalidUtf8,
    UnknownState,
    InvalidJson,
    KeyTooLong,
    RequestHashTooLong,
    ResponseTooLarge,
    NotANumber,
    OutOfRange,
    NulByte,
}

impl QuarantineReason {
    pub fn as_str(self) -> &'static str {
        match self {
            QuarantineReason::NullColumn => "null_column",
            QuarantineReason::InvalidUtf8 => "invalid_utf8",
            QuarantineReason::UnknownState => "unknown_state",
            QuarantineReason::InvalidJson => "invalid_json",
            QuarantineReason::KeyTooLong => "key_too_long",
            QuarantineReason::RequestHashTooLong => "request_hash_too_long",
            QuarantineReason::ResponseTooLarge => "response_too_large",
            QuarantineReason::NotANumber => "not_a_number",
            QuarantineReason::OutOfRange => "out_of_range",
            QuarantineReason::NulByte => "nul_byte",
        }
    }
}

/// A row refused, with what a person needs to find it again.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rejected {
    pub reason: QuarantineReason,
    /// Which column, and what was wrong with it, in a sentence.
    pub detail: String,
    /// The key as far as it could be read (lossy UTF-8, truncated), for display.
    pub key_excerpt: String,
    /// The exact key bytes when the key column itself was readable (used to de-duplicate
    /// quarantine entries and to find the row in the source).
    pub key_bytes: Option<Vec<u8>>,
    /// A bounded excerpt of the row for the quarantine browser.
    pub excerpt: String,
    /// SHA-256 of the whole raw row: the same hostile row read twice is one entry.
    pub fingerprint: String,
}

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_key_bytes: usize,
    /// justonce writes a SHA-256 hex digest (64 bytes); anything far longer is not one.
    pub max_request_hash_bytes: usize,
    pub max_response_bytes: usize,
    pub max_excerpt_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_key_bytes: 4 * 1024,
            max_request_hash_bytes: 1024,
            max_response_bytes: 1024 * 1024,
            max_excerpt_bytes: 512,
        }
    }
}

/// Timestamps outside [1970, 3000) are not something `time.time()` wrote.
const MAX_EPOCH: f64 = 32_503_680_000.0;

/// Excerpts are stored as text, which on PostgreSQL cannot hold U+0000: a NUL is shown as
/// U+FFFD, like bytes that are not UTF-8 (the raw key is kept in `key_bytes`).
fn lossy_excerpt(bytes: &[u8], max: usize) -> String {
    let cut = &bytes[..bytes.len().min(max)];
    let mut s = String::from_utf8_lossy(cut).replace('\0', "\u{FFFD}");
    if bytes.len() > max {
        s.push('…');
    }
    s
}

fn describe_num(n: &RawNum) -> String {
    match n {
        RawNum::Null => "NULL".into(),
        RawNum::Int(i) => i.to_string(),
        RawNum::Real(f) => f.to_string(),
        RawNum::NotNumber(d) => d.clone(),
    }
}

fn fingerprint(row: &RawRow) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for b in [&row.key, &row.state, &row.request_hash, &row.response] {
        match b {
            None => h.update([0u8]),
            Some(b) => {
                h.update([1u8]);
                h.update((b.len() as u64).to_le_bytes());
                h.update(b);
            }
        }
    }
    for n in [
        &row.attempts,
        &row.created_at,
        &row.updated_at,
        &row.expires_at,
    ] {
        h.update(describe_num(n).as_bytes());
        h.update([0u8]);
    }
    hex::encode(h.finalize())
}

fn row_excerpt(row: &RawRow, max: usize) -> String {
    let field = |b: &Option<Vec<u8>>| match b {
        None => "NULL".to_string(),
        Some(b) => lossy_excerpt(b, 96),
    };
    let s = format!(
        "key={} state={} request_hash={} response={} attempts={} created_at={} updated_at={} expires_at={}",
        field(&row.key),
        field(&row.state),
        field(&row.request_hash),
        field(&row.response),
        describe_num(&row.attempts),
        describe_num(&row.created_at),
        describe_num(&row.updated_at),
        describe_num(&row.expires_at),
    );
    lossy_excerpt(s.as_bytes(), max)
}

/// Validate one raw row. Every column is checked; the first problem found is the reason.
pub fn validate_row(row: &RawRow, limits: &Limits) -> Result<SourceRecord, Rejected> {
    let reject = |reason: QuarantineReason, detail: String| Rejected {
        reason,
        detail,
        key_excerpt: row
            .key
            .as_deref()
            .map_or_else(|| "NULL".into(), |k| lossy_excerpt(k, 200)),
        key_bytes: row
            .key
            .as_ref()
            .filter(|k| k.len() <= limits.max_key_bytes)
            .cloned(),
        excerpt: row_excerpt(row, limits.max_excerpt_bytes),
        fingerprint: fingerprint(row),
    };

    let text = |col: &str, v: &Option<Vec<u8>>| -> Result<String, Rejected> {
        let bytes = v
            .as_ref()
            .ok_or_else(|| reject(QuarantineReason::NullColumn, format!("{col} is NULL")))?;
        let s = std::str::from_utf8(bytes).map_err(|e| {
            reject(
                QuarantineReason::InvalidUtf8,
                format!("{col} is not valid UTF-8 ({e})"),
            )
        })?;
        if s.contains('\0') {
            return Err(reject(
                QuarantineReason::NulByte,
                format!("{col} contains a NUL character"),
            ));
        }
        Ok(s.to_owned())
    };

    let key_raw = row
        .key
        .as_ref()
        .ok_or_else(|| reject(QuarantineReason::NullColumn, "key is NULL".into()))?;
    if key_raw.len() > limits.max_key_bytes {
        return Err(reject(
            QuarantineReason::KeyTooLong,
            // A scan reads at most one byte past the limit (scan.rs), so the length read
            // is a lower bound.
            format!(
                "key is over the limit of {} bytes ({} bytes read)",
                limits.max_key_bytes,
                key_raw.len()
            ),
        ));
    }
    let key = text("key", &row.key)?;
    if key.is_empty() {
        return Err(reject(QuarantineReason::NullColumn, "key is empty".into()));
    }
    let state_text = text("state", &row.state)?;
    let state = State::parse(&state_text).ok_or_else(|| {
        reject(
            QuarantineReason::UnknownState,
            format!(
                "state {:?} is not one of in_progress, succeeded, failed, unknown",
                lossy_excerpt(state_text.as_bytes(), 64)
            ),
        )
    })?;
    if let Some(h) = &row.request_hash
        && h.len() > limits.max_request_hash_bytes
    {
        return Err(reject(
            QuarantineReason::RequestHashTooLong,
            format!(
                "request_hash is over the limit of {} bytes",
                limits.max_request_hash_bytes
            ),
        ));
    }
    let request_hash = text("request_hash", &row.request_hash)?;

    let response = match &row.response {
        None => None,
        Some(bytes) => {
            if bytes.len() > limits.max_response_bytes {
                return Err(reject(
                    QuarantineReason::ResponseTooLarge,
                    format!(
                        "response is over the limit of {} bytes ({} bytes read)",
                        limits.max_response_bytes,
                        bytes.len()
                    ),
                ));
            }
            let s = std::str::from_utf8(bytes).map_err(|e| {
                reject(
                    QuarantineReason::InvalidUtf8,
                    format!("response is not valid UTF-8 ({e})"),
                )
            })?;
            let value: serde_json::Value = serde_json::from_str(s).map_err(|e| {
                reject(
                    QuarantineReason::InvalidJson,
                    format!("response is not JSON ({e})"),
                )
            })?;
            // PostgreSQL ledgers cannot hold \u0000 in text; refuse it everywhere so both
            // backends store the same thing.
            let canonical = value.to_string();
            if canonical.contains("\\u0000") {
                return Err(reject(
                    QuarantineReason::NulByte,
                    "response contains a NUL character".into(),
                ));
            }
            // A JSON `null` text is the same answer as SQL NULL.
            if value.is_null() {
                None
            } else {
                Some(canonical)
            }
        }
    };

    let attempts = match &row.attempts {
        RawNum::Int(i) if *i >= 1 => *i,
        RawNum::Int(i) => {
            return Err(reject(
                QuarantineReason::OutOfRange,
                format!("attempts is {i}, below 1"),
            ));
        }
        RawNum::Null => {
            return Err(reject(
                QuarantineReason::NullColumn,
                "attempts is NULL".into(),
            ));
        }
        other => {
            return Err(reject(
                QuarantineReason::NotANumber,
                format!("attempts is not an integer ({})", describe_num(other)),
            ));
        }
    };

    let instant = |col: &str, n: &RawNum, nullable: bool| -> Result<Option<f64>, Rejected> {
        let v = match n {
            RawNum::Null if nullable => return Ok(None),
            RawNum::Null => {
                return Err(reject(
                    QuarantineReason::NullColumn,
                    format!("{col} is NULL"),
                ));
            }
            RawNum::Int(i) => *i as f64,
            RawNum::Real(f) => *f,
            RawNum::NotNumber(d) => {
                return Err(reject(
                    QuarantineReason::NotANumber,
                    format!("{col} is not a number ({d})"),
                ));
            }
        };
        if !v.is_finite() || !(0.0..MAX_EPOCH).contains(&v) {
            return Err(reject(
                QuarantineReason::OutOfRange,
                format!("{col} = {v} is not a plausible epoch time"),
            ));
        }
        Ok(Some(v))
    };
    let created_at = instant("created_at", &row.created_at, false)?.unwrap_or_default();
    let updated_at = instant("updated_at", &row.updated_at, false)?.unwrap_or_default();
    let expires_at = instant("expires_at", &row.expires_at, true)?;

    Ok(SourceRecord {
        key,
        state,
        request_hash,
        response,
        attempts,
        created_at,
        updated_at,
        expires_at,
    })
}

/// What the ledger holds for an effect, for comparison with a newly read record.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredSnapshot {
    pub record: SourceRecord,
    /// Set when the row was noticed missing from its source.
    pub gone: bool,
}

/// What to do with an incoming record given the ledger's copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Never seen: store it, with a `first_seen` event.
    Create,
    /// Seen, and the source now says something else (or the row came back after it had
    /// gone): update the copy, with one `changed` (or `reappeared`) event.
    Update,
    /// Exactly what the ledger holds: write nothing.
    Unchanged,
    /// Older than the ledger's copy (`updated_at` earlier): a newer observation must never be
    /// overwritten by an older one.
    Stale,
}

pub fn decide(existing: Option<&StoredSnapshot>, incoming: &SourceRecord) -> Decision {
    match existing {
        None => Decision::Create,
        Some(s) if incoming.updated_at < s.record.updated_at => Decision::Stale,
        Some(s) if s.gone || s.record != *incoming => Decision::Update,
        Some(_) => Decision::Unchanged,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> RawRow {
        RawRow {
            key: Some(b"charge:v1:ORD-1".to_vec()),
            state: Some(b"succeeded".to_vec()),
            request_hash: Some(b"1:abc".to_vec()),
            response: Some(br#"{"id": "ch_1", "amount": 2000}"#.to_vec()),
            attempts: RawNum::Int(1),
            created_at: RawNum::Real(1_700_000_000.25),
            updated_at: RawNum::Real(1_700_000_001.5),
            expires_at: RawNum::Null,
        }
    }

    fn reason(row: RawRow) -> QuarantineReason {
        validate_row(&row, &Limits::default()).unwrap_err().reason
    }

    #[test]
    fn a_good_row_is_decoded_once() {
        let r = validate_row(&good(), &Limits::default()).unwrap();
        assert_eq!(
            r.response.as_deref(),
            Some(r#"{"amount":2000,"id":"ch_1"}"#)
        );
        assert_eq!(r.updated_at, 1_700_000_001.5);
        let mut row = good();
        row.response = Some(br#""done""#.to_vec());
        let r = validate_row(&row, &Limits::default()).unwrap();
        assert_eq!(
            r.response.as_deref(),
            Some(r#""done""#),
            "a JSON string stays one string"
        );
    }

    #[test]
    fn json_null_and_sql_null_are_the_same_answer() {
        let mut row = good();
        row.response = Some(b"null".to_vec());
        assert_eq!(
            validate_row(&row, &Limits::default()).unwrap().response,
            None
        );
        row.response = None;
        assert_eq!(
            validate_row(&row, &Limits::default()).unwrap().response,
            None
        );
    }

    #[test]
    fn hostile_rows_get_their_reason() {
        let mut r = good();
        r.state = Some(b"partially_refunded".to_vec());
        assert_eq!(reason(r), QuarantineReason::UnknownState);
        let mut r = good();
        r.state = None;
        assert_eq!(reason(r), QuarantineReason::NullColumn);
        let mut r = good();
        r.key = Some(vec![b'a', 0xff, 0xfe]);
        assert_eq!(reason(r), QuarantineReason::InvalidUtf8);
        let mut r = good();
        r.response = Some(b"{not json".to_vec());
        assert_eq!(reason(r), QuarantineReason::InvalidJson);
        let mut r = good();
        r.key = Some(vec![b'k'; 4097]);
        assert_eq!(reason(r), QuarantineReason::KeyTooLong);
        let mut r = good();
        r.response = Some(format!("\"{}\"", "x".repeat(1024 * 1024)).into_bytes());
        assert_eq!(reason(r), QuarantineReason::ResponseTooLarge);
        let mut r = good();
        r.updated_at = RawNum::NotNumber("text 'yesterday'".into());
        assert_eq!(reason(r), QuarantineReason::NotANumber);
        let mut r = good();
        r.created_at = RawNum::Real(f64::NAN);
        assert_eq!(reason(r), QuarantineReason::OutOfRange);
        let mut r = good();
        r.attempts = RawNum::Real(1.5);
        assert_eq!(reason(r), QuarantineReason::NotANumber);
        let mut r = good();
        r.key = Some(b"a\0b".to_vec());
        assert_eq!(reason(r), QuarantineReason::NulByte);
    }

    /// Excerpts are stored as text, which PostgreSQL refuses with a NUL in it.
    #[test]
    fn excerpts_of_a_row_with_a_nul_hold_none() {
        let mut r = good();
        r.key = Some(b"charge:v1:a\0b".to_vec());
        let rej = validate_row(&r, &Limits::default()).unwrap_err();
        assert_eq!(rej.reason, QuarantineReason::NulByte);
        for text in [&rej.key_excerpt, &rej.excerpt, &rej.detail] {
            assert!(!text.contains('\0'), "{text:?}");
        }
        assert_eq!(rej.key_excerpt, "charge:v1:a\u{FFFD}b");
        assert_eq!(rej.key_bytes.as_deref(), Some(&b"charge:v1:a\0b"[..]));
    }

    #[test]
    fn excerpts_are_bounded() {
        let mut r = good();
        r.state = Some(vec![b'x'; 100_000]);
        let rej = validate_row(&r, &Limits::default()).unwrap_err();
        assert!(rej.excerpt.len() <= 512 + 3, "{}", rej.excerpt.len());
        assert!(rej.detail.len() < 300);
    }

    #[test]
    fn an_older_observation_never_overwrites_a_newer_one() {
        let rec = validate_row(&good(), &Limits::default()).unwrap();
        let stored = StoredSnapshot {
            record: rec.clone(),
            gone: false,
        };
        assert_eq!(decide(None, &rec), Decision::Create);
        assert_eq!(decide(Some(&stored), &rec), Decision::Unchanged);
        let mut older = rec.clone();
        older.updated_at -= 1.0;
        older.state = State::Unknown;
        assert_eq!(decide(Some(&stored), &older), Decision::Stale);
        let mut newer = rec.clone();
        newer.updated_at += 1.0;
        assert_eq!(decide(Some(&stored), &newer), Decision::Update);
        let gone = StoredSnapshot {
            record: rec.clone(),
            gone: true,
        };
        assert_eq!(
            decide(Some(&gone), &rec),
            Decision::Update,
            "a row that came back"
        );
    }
}
