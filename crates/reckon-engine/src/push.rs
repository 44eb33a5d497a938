//! Push ingest: records in the shape of a justonce row, sent by clients for stores reckon
//! cannot reach. Each item is judged on its own; a malformed item gets its reason and costs
//! the others nothing.

use reckon_domain::{Limits, RawNum, RawRow, Rejected, SourceRecord, time, validate_row};
use reckon_ledger::{IngestBatch, ItemStatus, Ledger, LedgerError, Origin, Source, TenantId};
use serde::Serialize;
use serde_json::Value;

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ItemResult {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// created | updated | unchanged | stale | rejected
    #[schema(value_type = PushItemStatus)]
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The words of [`ItemResult::status`], for the API document.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PushItemStatus {
    Created,
    Updated,
    Unchanged,
    /// Older than what reckon holds: ignored.
    Stale,
    /// Not a valid record: `reason` and `error` say why.
    Rejected,
}

/// One pushed record: a justonce row as JSON (never built: it describes what
/// [`raw_from_json`] reads, for the API document). Each item is judged on its own; one that
/// is not a valid record is answered `rejected` with its reason and costs the others nothing.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code, reason = "never built: it exists only for its ToSchema")]
pub struct PushRecord {
    key: String,
    #[schema(value_type = reckon_domain::State)]
    state: String,
    request_hash: String,
    /// The call's response as stored by the application: any JSON value.
    response: Option<Value>,
    /// How many times the key was claimed; default 1.
    attempts: Option<i64>,
    /// Epoch seconds.
    created_at: f64,
    updated_at: f64,
    /// When an `in_progress` claim's lease ends.
    expires_at: Option<f64>,
}

/// Turn one pushed JSON item into a raw row, so pushed and scanned rows go through the same
/// validation. The response is the JSON value itself (not text holding JSON).
pub fn raw_from_json(item: &Value) -> Result<RawRow, String> {
    let obj = item
        .as_object()
        .ok_or_else(|| "each item must be a JSON object".to_string())?;
    const FIELDS: [&str; 8] = [
        "key",
        "state",
        "request_hash",
        "response",
        "attempts",
        "created_at",
        "updated_at",
        "expires_at",
    ];
    if let Some(extra) = obj.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(format!("unknown field {extra:?}"));
    }
    let text = |name: &str| -> Result<Option<Vec<u8>>, String> {
        match obj.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone().into_bytes())),
            Some(_) => Err(format!("{name} must be a string")),
        }
    };
    let num = |name: &str| -> RawNum {
        match obj.get(name) {
            None | Some(Value::Null) => RawNum::Null,
            Some(Value::Number(n)) => match n.as_i64() {
                Some(i) => RawNum::Int(i),
                None => RawNum::Real(n.as_f64().unwrap_or(f64::NAN)),
            },
            Some(other) => RawNum::NotNumber(format!("JSON {}", type_name(other))),
        }
    };
    Ok(RawRow {
        key: text("key")?,
        state: text("state")?,
        request_hash: text("request_hash")?,
        response: match obj.get("response") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.to_string().into_bytes()),
        },
        // justonce's column default: a pushed record may omit attempts.
        attempts: match obj.get("attempts") {
            None => RawNum::Int(1),
            Some(_) => num("attempts"),
        },
        created_at: num("created_at"),
        updated_at: num("updated_at"),
        expires_at: num("expires_at"),
    })
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Ingest pushed items (already split from a JSON array or NDJSON lines; an item that did
/// not even parse as JSON arrives as `Err(message)`).
pub async fn ingest_push(
    ledger: &dyn Ledger,
    tenant: TenantId,
    source: &Source,
    items: Vec<Result<Value, String>>,
) -> Result<Vec<ItemResult>, LedgerError> {
    let limits = Limits::default();
    let mut results: Vec<Option<ItemResult>> = vec![None; items.len()];
    let mut records: Vec<(usize, SourceRecord)> = Vec::new();
    let mut rejected: Vec<Rejected> = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let raw = item.as_ref().map_err(Clone::clone).and_then(raw_from_json);
        match raw {
            Err(e) => {
                results[index] = Some(ItemResult {
                    index,
                    key: None,
                    status: "rejected",
                    reason: Some("malformed".into()),
                    error: Some(e),
                });
            }
            Ok(raw) => match validate_row(&raw, &limits) {
                Ok(rec) => records.push((index, rec)),
                Err(rej) => {
                    results[index] = Some(ItemResult {
                        index,
                        key: Some(rej.key_excerpt.clone()),
                        status: "rejected",
                        reason: Some(rej.reason.as_str().into()),
                        error: Some(rej.detail.clone()),
                    });
                    rejected.push(rej);
                }
            },
        }
    }
    let batch = IngestBatch {
        origin: Origin::Push,
        observed_at: time::now(),
        records: records.iter().map(|(_, r)| r.clone()).collect(),
        rejected,
        abandoned_after_secs: source.abandoned_after_secs,
        cursor: None,
        lease: None,
        expect_new: false,
    };
    let outcome = ledger.ingest(tenant, source.id, batch).await?;
    for ((index, rec), status) in records.into_iter().zip(outcome.statuses) {
        results[index] = Some(ItemResult {
            index,
            key: Some(rec.key),
            status: match status {
                ItemStatus::Created => "created",
                ItemStatus::Updated => "updated",
                ItemStatus::Unchanged => "unchanged",
                ItemStatus::Stale => "stale",
            },
            reason: None,
            error: None,
        });
    }
    Ok(results
        .into_iter()
        .map(|r| r.expect("every item judged"))
        .collect())
}
