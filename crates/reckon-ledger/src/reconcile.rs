//! Types of reconciliation as the ledger stores them: providers, routes, the per-effect
//! reconcile state (lease, schedule), attempts with their evidence, and resolutions.
//! Outcomes travel as their words (`applied`, `not_applied`, `duplicate`, `indeterminate`);
//! the meaning of each lives in `reckon-providers::classify`, not here.

use crate::model::Effect;
use serde::Serialize;

/// The author of every resolution the reconciler records on its own.
pub const RECONCILER_AUTHOR: &str = "reconciler";

/// A provider account. The secret (API key or auth header) is never part of this type.
#[derive(Debug, Clone, Serialize)]
pub struct Provider {
    pub id: i64,
    pub name: String,
    pub kind: String,
    /// Non-secret settings (base_url, account, mode, metadata_field, ...), as JSON.
    pub settings: serde_json::Value,
    pub has_secret: bool,
    pub created_at: f64,
}

/// A new provider. The secret arrives in clear and leaves only sealed.
#[derive(Debug)]
pub struct NewProvider {
    pub name: String,
    pub kind: String,
    pub secret: Option<secrecy::SecretString>,
    pub settings: serde_json::Value,
}

/// An edit of a provider: `None` keeps the stored value. The secret is replaced only
/// when a new one is given; the name and the kind never change.
#[derive(Debug, Default)]
pub struct ProviderChange {
    pub secret: Option<secrecy::SecretString>,
    pub settings: Option<serde_json::Value>,
}

/// Operation pattern of one source -> provider (or none).
#[derive(Debug, Clone, Serialize)]
pub struct Route {
    pub id: i64,
    pub source: String,
    /// An operation name, or `*` for every operation of the source.
    pub operation: String,
    /// `None`: no provider can answer for this operation.
    pub provider: Option<String>,
    #[serde(skip)]
    pub provider_id: Option<i64>,
    #[serde(skip)]
    pub source_id: i64,
}

/// Where the reconciliation of one effect stands.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ReconcileState {
    pub attempts: i64,
    pub next_attempt_at: f64,
    pub last_attempt_at: Option<f64>,
    pub last_outcome: Option<String>,
    pub last_error: Option<String>,
    pub provider_id: Option<i64>,
    pub non_final: bool,
    pub needs_attention: bool,
    pub lease_owner: Option<String>,
    pub lease_until: Option<f64>,
}

/// An effect leased to one worker until `lease_until`.
#[derive(Debug, Clone)]
pub struct Claim {
    pub effect: Effect,
    pub state: ReconcileState,
    pub owner: String,
    pub lease_until: f64,
}

/// One lookup, as recorded (append-only).
#[derive(Debug, Clone, Serialize)]
pub struct Attempt {
    pub id: i64,
    pub provider_id: Option<i64>,
    pub started_at: f64,
    pub finished_at: f64,
    pub outcome: String,
    pub method: Option<String>,
    pub error: Option<String>,
    pub evidence: serde_json::Value,
}

#[derive(Debug, Clone)]
pub struct NewAttempt {
    pub provider_id: Option<i64>,
    pub started_at: f64,
    pub finished_at: f64,
    pub outcome: String,
    pub method: Option<String>,
    pub error: Option<String>,
    pub evidence: serde_json::Value,
    /// When to look again if this attempt concluded nothing.
    pub next_attempt_at: f64,
    pub non_final: bool,
    pub needs_attention: bool,
    /// Resolve the effect with this attempt as its evidence (conclusive outcomes only).
    pub resolve: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Resolution {
    pub id: i64,
    pub outcome: String,
    pub author: String,
    pub note: Option<String>,
    pub evidence: serde_json::Value,
    pub attempt_id: Option<i64>,
    pub created_at: f64,
}

#[derive(Debug, Clone)]
pub struct NewResolution {
    pub outcome: String,
    pub author: String,
    pub note: Option<String>,
    pub evidence: serde_json::Value,
}

/// What [`crate::Ledger::record_attempt`] did.
#[derive(Debug, Clone, Serialize)]
pub struct AttemptRecorded {
    pub attempt_id: i64,
    /// The effect's resolution: the one this call recorded, or the one already there (a
    /// retry after a crash finds it and records no second).
    pub resolution: Option<Resolution>,
    /// True when this call's resolution was the one stored.
    pub resolved_now: bool,
}

/// Everything reconciliation knows about one effect.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ReconcileView {
    pub state: Option<ReconcileState>,
    pub attempts: Vec<Attempt>,
    pub resolution: Option<Resolution>,
}

pub(crate) fn provider_secret_aad(tenant_id: i64, provider_name: &str) -> String {
    format!("reckon/v1|tenant:{tenant_id}|provider:{provider_name}|secret")
}

pub(crate) fn check_outcome(o: &str) -> crate::Result<()> {
    match o {
        "applied" | "not_applied" | "duplicate" | "indeterminate" => Ok(()),
        _ => Err(crate::LedgerError::Invalid(format!(
            "outcome {o:?}: use applied, not_applied, duplicate or indeterminate"
        ))),
    }
}

// ---- row mapping shared by both backends ----

use crate::{LedgerError, Result};
use sqlx::{ColumnIndex, Database, Decode, Row, Type};

pub(crate) const PROVIDER_COLUMNS: &str =
    "id, name, kind, settings, secret_ciphertext IS NOT NULL AS has_secret, created_at";
pub(crate) const STATE_COLUMNS: &str = "attempts, next_attempt_at, last_attempt_at, \
    last_outcome, last_error, provider_id, non_final, needs_attention, lease_owner, lease_until";
pub(crate) const ATTEMPT_COLUMNS: &str =
    "id, provider_id, started_at, finished_at, outcome, method, error, evidence";
pub(crate) const RESOLUTION_COLUMNS: &str =
    "id, outcome, author, note, evidence, attempt_id, created_at";

fn json(text: &str) -> Result<serde_json::Value> {
    serde_json::from_str(text).map_err(|e| LedgerError::Invalid(format!("stored JSON: {e}")))
}

pub(crate) fn provider_row<DB: Database>(row: &DB::Row) -> Result<Provider>
where
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> f64: Decode<'r, DB> + Type<DB>,
    for<'r> bool: Decode<'r, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> &'r str: ColumnIndex<DB::Row>,
{
    Ok(Provider {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        kind: row.try_get("kind")?,
        settings: json(&row.try_get::<String, _>("settings")?)?,
        has_secret: row.try_get("has_secret")?,
        created_at: row.try_get("created_at")?,
    })
}

pub(crate) fn state_row<DB: Database>(row: &DB::Row) -> Result<ReconcileState>
where
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> f64: Decode<'r, DB> + Type<DB>,
    for<'r> bool: Decode<'r, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> &'r str: ColumnIndex<DB::Row>,
{
    Ok(ReconcileState {
        attempts: row.try_get("attempts")?,
        next_attempt_at: row.try_get("next_attempt_at")?,
        last_attempt_at: row.try_get("last_attempt_at")?,
        last_outcome: row.try_get("last_outcome")?,
        last_error: row.try_get("last_error")?,
        provider_id: row.try_get("provider_id")?,
        non_final: row.try_get("non_final")?,
        needs_attention: row.try_get("needs_attention")?,
        lease_owner: row.try_get("lease_owner")?,
        lease_until: row.try_get("lease_until")?,
    })
}

pub(crate) fn attempt_row<DB: Database>(row: &DB::Row) -> Result<Attempt>
where
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> f64: Decode<'r, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> &'r str: ColumnIndex<DB::Row>,
{
    Ok(Attempt {
        id: row.try_get("id")?,
        provider_id: row.try_get("provider_id")?,
        started_at: row.try_get("started_at")?,
        finished_at: row.try_get("finished_at")?,
        outcome: row.try_get("outcome")?,
        method: row.try_get("method")?,
        error: row.try_get("error")?,
        evidence: json(&row.try_get::<String, _>("evidence")?)?,
    })
}

pub(crate) fn resolution_row<DB: Database>(row: &DB::Row) -> Result<Resolution>
where
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> f64: Decode<'r, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> &'r str: ColumnIndex<DB::Row>,
{
    Ok(Resolution {
        id: row.try_get("id")?,
        outcome: row.try_get("outcome")?,
        author: row.try_get("author")?,
        note: row.try_get("note")?,
        evidence: json(&row.try_get::<String, _>("evidence")?)?,
        attempt_id: row.try_get("attempt_id")?,
        created_at: row.try_get("created_at")?,
    })
}

/// An operation pattern is an operation name or `*`.
pub(crate) fn check_pattern(p: &str) -> Result<()> {
    if p == "*" {
        return Ok(());
    }
    crate::rows::check_name("operation pattern", p)
}
