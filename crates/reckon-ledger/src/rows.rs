//! Row mapping shared by both backends: the column lists are the same, only the driver
//! differs, so one generic function per type reads them.

use crate::driver::row;
use crate::model::{Cursor, Effect, EffectEvent, Source, SourceKind, Tenant, TenantId};
use crate::{LedgerError, Result};
use macro_rules_attribute::apply;
use reckon_domain::{SourceRecord, State, StoredSnapshot};
use sqlx::{Database, QueryBuilder, Row};

pub(crate) fn state(s: &str) -> Result<State> {
    State::parse(s).ok_or_else(|| LedgerError::Invalid(format!("stored state {s:?}")))
}

pub(crate) const EFFECT_COLUMNS: &str = "e.id, s.name AS source_name, e.key, e.operation, \
    e.key_version, e.subject, e.state, e.request_hash, e.response, e.attempts, e.created_at, \
    e.updated_at, e.expires_at, e.abandoned_at, e.first_seen_at, e.last_changed_at, e.gone_at, \
    e.gone_reason";

#[apply(row!)]
pub(crate) fn effect<DB: Database>(row: &DB::Row, now: f64) -> Result<Effect> {
    let mut e = Effect {
        id: row.try_get("id")?,
        source: row.try_get("source_name")?,
        key: row.try_get("key")?,
        operation: row.try_get("operation")?,
        key_version: row.try_get("key_version")?,
        subject: row.try_get("subject")?,
        state: state(&row.try_get::<String, _>("state")?)?,
        request_hash: row.try_get("request_hash")?,
        response_json: row.try_get("response")?,
        attempts: row.try_get("attempts")?,
        reclaimed: false,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        expires_at: row.try_get("expires_at")?,
        first_seen_at: row.try_get("first_seen_at")?,
        last_changed_at: row.try_get("last_changed_at")?,
        gone_at: row.try_get("gone_at")?,
        gone_reason: row.try_get("gone_reason")?,
        unresolved_kind: None,
        unresolved_since: None,
    };
    let abandoned_at: Option<f64> = row.try_get("abandoned_at")?;
    e.derive_facts(abandoned_at, now);
    Ok(e)
}

pub(crate) const SNAPSHOT_COLUMNS: &str = "id, key, state, request_hash, response, attempts, \
    created_at, updated_at, expires_at, gone_at";

#[apply(row!)]
pub(crate) fn snapshot<DB: Database>(row: &DB::Row) -> Result<(i64, StoredSnapshot)> {
    let gone_at: Option<f64> = row.try_get("gone_at")?;
    Ok((
        row.try_get("id")?,
        StoredSnapshot {
            record: SourceRecord {
                key: row.try_get("key")?,
                state: state(&row.try_get::<String, _>("state")?)?,
                request_hash: row.try_get("request_hash")?,
                response: row.try_get("response")?,
                attempts: row.try_get("attempts")?,
                created_at: row.try_get("created_at")?,
                updated_at: row.try_get("updated_at")?,
                expires_at: row.try_get("expires_at")?,
            },
            gone: gone_at.is_some(),
        },
    ))
}

/// The ledger's copies of a batch's keys, from rows of [`SNAPSHOT_COLUMNS`].
#[apply(row!)]
pub(crate) fn existing<DB: Database>(found: &[DB::Row]) -> Result<crate::driver::Existing> {
    let entry = |r| {
        let (id, snap) = snapshot::<DB>(r)?;
        Ok((snap.record.key.clone(), (id, snap)))
    };
    found.iter().map(entry).collect()
}

pub(crate) const SOURCE_COLUMNS: &str = "id, name, kind, dsn_display, table_name, \
    scan_interval_secs, abandoned_after_secs, overlap_secs, full_scan_every_secs, \
    cursor_updated_at, cursor_key, last_scan_at, last_success_at, last_full_scan_at, \
    last_error, last_error_at, consecutive_failures, created_at, writeback, scan_requested_at, \
    mapping";

/// `Ledger::update_source` for both backends: $1 tenant, $2 name, $3 sealed DSN, $4 its
/// display, $5 table, $6 scan interval, $7 abandoned after, $8 overlap, $9 full scan every
/// (each NULL: keep), $10 drop the cursor.
pub(crate) fn update_source_sql() -> String {
    format!(
        "UPDATE source SET dsn_ciphertext = COALESCE($3, dsn_ciphertext), \
         dsn_display = COALESCE($4, dsn_display), table_name = COALESCE($5, table_name), \
         scan_interval_secs = COALESCE($6, scan_interval_secs), \
         abandoned_after_secs = COALESCE($7, abandoned_after_secs), \
         overlap_secs = COALESCE($8, overlap_secs), \
         full_scan_every_secs = COALESCE($9, full_scan_every_secs), \
         cursor_updated_at = CASE WHEN $10 THEN NULL ELSE cursor_updated_at END, \
         cursor_key = CASE WHEN $10 THEN NULL ELSE cursor_key END, \
         last_full_scan_at = CASE WHEN $10 THEN NULL ELSE last_full_scan_at END \
         WHERE tenant_id = $1 AND name = $2 RETURNING {SOURCE_COLUMNS}"
    )
}

#[apply(row!)]
pub(crate) fn source<DB: Database>(row: &DB::Row) -> Result<Source> {
    let kind: String = row.try_get("kind")?;
    let cursor_updated_at: Option<f64> = row.try_get("cursor_updated_at")?;
    let cursor_key: Option<Vec<u8>> = row.try_get("cursor_key")?;
    Ok(Source {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        kind: SourceKind::parse(&kind)
            .ok_or_else(|| LedgerError::Invalid(format!("stored source kind {kind:?}")))?,
        dsn_display: row.try_get("dsn_display")?,
        table_name: row.try_get("table_name")?,
        scan_interval_secs: row.try_get("scan_interval_secs")?,
        abandoned_after_secs: row.try_get("abandoned_after_secs")?,
        overlap_secs: row.try_get("overlap_secs")?,
        full_scan_every_secs: row.try_get("full_scan_every_secs")?,
        cursor: match (cursor_updated_at, cursor_key) {
            (Some(updated_at), Some(key)) => Some(Cursor { updated_at, key }),
            _ => None,
        },
        last_scan_at: row.try_get("last_scan_at")?,
        last_success_at: row.try_get("last_success_at")?,
        last_full_scan_at: row.try_get("last_full_scan_at")?,
        last_error: row.try_get("last_error")?,
        last_error_at: row.try_get("last_error_at")?,
        consecutive_failures: row.try_get("consecutive_failures")?,
        created_at: row.try_get("created_at")?,
        scan_requested_at: row.try_get("scan_requested_at")?,
        mapping: row.try_get("mapping")?,
        writeback: match row.try_get::<Option<String>, _>("writeback")? {
            None => None,
            Some(w) => {
                Some(crate::WritebackPolicy::parse(&w).ok_or_else(|| {
                    LedgerError::Invalid(format!("stored write-back policy {w:?}"))
                })?)
            }
        },
    })
}

#[apply(row!)]
pub(crate) fn tenant<DB: Database>(row: &DB::Row) -> Result<Tenant> {
    Ok(Tenant {
        id: TenantId(row.try_get("id")?),
        slug: row.try_get("slug")?,
        created_at: row.try_get("created_at")?,
    })
}

pub(crate) const EVENT_COLUMNS: &str = "id, observed_at, origin, kind, from_state, to_state, \
    attempts, source_updated_at, detail";

#[apply(row!)]
pub(crate) fn event<DB: Database>(row: &DB::Row) -> Result<EffectEvent> {
    Ok(EffectEvent {
        id: row.try_get("id")?,
        observed_at: row.try_get("observed_at")?,
        origin: row.try_get("origin")?,
        kind: row.try_get("kind")?,
        from_state: row.try_get("from_state")?,
        to_state: row.try_get("to_state")?,
        attempts: row.try_get("attempts")?,
        source_updated_at: row.try_get("source_updated_at")?,
        detail: row.try_get("detail")?,
    })
}

pub(crate) const QUARANTINE_COLUMNS: &str =
    "id, reason, detail, key_excerpt, excerpt, origin, first_seen_at";

/// Every row as a `T` (a `#[derive(sqlx::FromRow)]` type).
pub(crate) fn all<T, R>(rows: &[R]) -> Result<Vec<T>>
where
    R: Row,
    T: for<'r> sqlx::FromRow<'r, R>,
{
    Ok(rows.iter().map(T::from_row).collect::<Result<_, _>>()?)
}

/// `(a, b, c)`, each item bound: the list of an `IN`.
pub(crate) fn push_in<DB: Database, T>(
    qb: &mut QueryBuilder<DB>,
    items: impl IntoIterator<Item = T>,
) where
    for<'t> T: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
{
    qb.push("(");
    let mut list = qb.separated(", ");
    for item in items {
        list.push_bind(item);
    }
    qb.push(")");
}

/// Validate a source name or tenant slug: short, plain, safe in URLs and labels.
pub(crate) fn check_name(what: &str, s: &str) -> Result<()> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(LedgerError::Invalid(format!(
            "{what} {s:?} must be 1-63 characters of a-z, 0-9, '-' and '_', starting with a letter or digit"
        )))
    }
}

pub(crate) fn cursor_parts(c: &Option<Cursor>) -> (Option<f64>, Option<Vec<u8>>) {
    match c {
        Some(c) => (Some(c.updated_at), Some(c.key.clone())),
        None => (None, None),
    }
}

/// A lease lasts between a moment and a day: longer would let a dead replica hold work
/// hostage; zero, negative or NaN is a caller's bug.
pub(crate) fn check_lease_ttl(ttl_secs: f64) -> Result<()> {
    if ttl_secs.is_finite() && ttl_secs > 0.0 && ttl_secs <= 86_400.0 {
        Ok(())
    } else {
        Err(LedgerError::Invalid(format!(
            "lease duration must be between 0 and 86400 seconds, got {ttl_secs}"
        )))
    }
}

/// A column of JSON text, parsed.
pub(crate) fn json<R: Row>(row: &R, column: &str) -> Result<serde_json::Value>
where
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    for<'a> String: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
{
    let text: String = row.try_get(column)?;
    serde_json::from_str(&text)
        .map_err(|e| LedgerError::Invalid(format!("stored {column} is not JSON: {e}")))
}

/// A stored role: a word reckon never writes is an error, never a default.
#[apply(row!)]
pub(crate) fn role<DB: Database>(row: &DB::Row) -> Result<crate::Role> {
    let role: String = row.try_get("role")?;
    crate::Role::parse(&role)
        .ok_or_else(|| crate::LedgerError::Invalid(format!("stored role {role:?}")))
}
