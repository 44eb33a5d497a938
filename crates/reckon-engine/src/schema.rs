//! How the ledger's types look on the wire, for the API document.
//!
//! The ledger's types (`reckon_ledger::Source`, `Effect`, ...) are what the API serializes,
//! but that crate carries no schema derive, so each is described here, field for field, as
//! its `Serialize` writes it: same names, same optionality, serde-skipped fields left out.
//! Every struct here denies unknown fields, which the document states as
//! `additionalProperties: false`: a field added to a ledger type and not here makes every
//! answer that carries it fail the schema (the generated-case run in reckon-web's tests
//! checks every answer against the document), so this copy cannot silently fall behind.
//! The words (a source's kind, a role, write-back's policy and action) are the domain's
//! own types, which carry their schema.
//!
//! These types are never built: they exist only for their `ToSchema`.
#![allow(
    dead_code,
    reason = "these types are never built: they exist only for their ToSchema"
)]

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

pub use reckon_domain::writeback::{WritebackAction, WritebackPolicy};
pub use reckon_domain::{Role, SourceKind};

/// A source of one tenant. Its DSN is never shown, only `dsn_display` (no password).
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Source {
    #[schema(max_length = 63, pattern = "^[a-z0-9][a-z0-9_-]*$")]
    name: String,
    kind: SourceKind,
    #[schema(required = true)]
    dsn_display: Option<String>,
    table_name: String,
    scan_interval_secs: i64,
    abandoned_after_secs: f64,
    overlap_secs: f64,
    full_scan_every_secs: i64,
    #[schema(required = true)]
    last_scan_at: Option<f64>,
    #[schema(required = true)]
    last_success_at: Option<f64>,
    #[schema(required = true)]
    last_full_scan_at: Option<f64>,
    #[schema(required = true)]
    last_error: Option<String>,
    #[schema(required = true)]
    last_error_at: Option<f64>,
    consecutive_failures: i64,
    created_at: f64,
    /// When a person last asked for a scan now.
    #[schema(required = true)]
    scan_requested_at: Option<f64>,
    /// Write-back: off (null) or on with this policy for `not_applied`.
    #[schema(required = true)]
    writeback: Option<WritebackPolicy>,
}

/// An effect: the application's row as reckon keeps it, with derived facts.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Effect {
    id: i64,
    source: String,
    key: String,
    #[schema(required = true)]
    operation: Option<String>,
    #[schema(required = true)]
    key_version: Option<String>,
    #[schema(required = true)]
    subject: Option<String>,
    #[schema(value_type = reckon_domain::State)]
    state: String,
    request_hash: String,
    /// The stored response, decoded (any JSON value, or null).
    response: Value,
    attempts: i64,
    /// Claimed more than once (`attempts > 1`).
    reclaimed: bool,
    created_at: f64,
    updated_at: f64,
    #[schema(required = true)]
    expires_at: Option<f64>,
    first_seen_at: f64,
    last_changed_at: f64,
    /// When the source row disappeared (reckon keeps its copy).
    #[schema(required = true)]
    gone_at: Option<f64>,
    #[schema(required = true)]
    gone_reason: Option<String>,
    /// Set while nobody knows the outcome.
    #[schema(required = true, value_type = Option<reckon_domain::UnresolvedKind>)]
    unresolved_kind: Option<String>,
    #[schema(required = true)]
    unresolved_since: Option<f64>,
}

/// One change reckon observed in an effect's row.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EffectEvent {
    id: i64,
    observed_at: f64,
    origin: String,
    kind: String,
    #[schema(required = true)]
    from_state: Option<String>,
    #[schema(required = true)]
    to_state: Option<String>,
    #[schema(required = true)]
    attempts: Option<i64>,
    #[schema(required = true)]
    source_updated_at: Option<f64>,
    #[schema(required = true)]
    detail: Option<String>,
}

/// Where the reconciliation of one effect stands.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReconcileState {
    attempts: i64,
    next_attempt_at: f64,
    #[schema(required = true)]
    last_attempt_at: Option<f64>,
    #[schema(required = true, value_type = Option<reckon_providers::Outcome>)]
    last_outcome: Option<String>,
    #[schema(required = true)]
    last_error: Option<String>,
    #[schema(required = true)]
    provider_id: Option<i64>,
    non_final: bool,
    needs_attention: bool,
    #[schema(required = true)]
    lease_owner: Option<String>,
    #[schema(required = true)]
    lease_until: Option<f64>,
}

/// One lookup at the provider, as recorded, with its evidence.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Attempt {
    id: i64,
    #[schema(required = true)]
    provider_id: Option<i64>,
    started_at: f64,
    finished_at: f64,
    #[schema(value_type = reckon_providers::Outcome)]
    outcome: String,
    #[schema(required = true)]
    method: Option<String>,
    #[schema(required = true)]
    error: Option<String>,
    evidence: Value,
}

/// A resolution: by the reconciler (`author` `reconciler`) or by a person, with a note.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Resolution {
    id: i64,
    #[schema(value_type = reckon_providers::Outcome)]
    outcome: String,
    author: String,
    #[schema(required = true)]
    note: Option<String>,
    evidence: Value,
    #[schema(required = true)]
    attempt_id: Option<i64>,
    created_at: f64,
}

/// Everything reconciliation knows about one effect.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReconcileView {
    #[schema(required = true)]
    state: Option<ReconcileState>,
    attempts: Vec<Attempt>,
    #[schema(required = true)]
    resolution: Option<Resolution>,
}

/// Quarantined rows of a source by reason.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuarantineCount {
    source: String,
    reason: String,
    count: i64,
}

/// A row refused into quarantine, with excerpts of it.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuarantineEntry {
    id: i64,
    reason: String,
    detail: String,
    key_excerpt: String,
    excerpt: String,
    origin: String,
    first_seen_at: f64,
}

/// A provider account. Its secret never comes back: `has_secret` says whether one is set.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Provider {
    id: i64,
    #[schema(max_length = 63, pattern = "^[a-z0-9][a-z0-9_-]*$")]
    name: String,
    #[schema(value_type = ProviderKind)]
    kind: String,
    /// Non-secret settings (base_url, account, mode, metadata_field, key_template, ...).
    #[schema(value_type = Object)]
    settings: Value,
    has_secret: bool,
    created_at: f64,
    /// The reconciler's last calibration of the provider's lookup against the effects the
    /// application recorded as succeeded, for its current settings; null until measured.
    #[schema(required = true)]
    calibration: Option<reckon_providers::Calibration>,
}

/// The kinds of provider reckon can ask: the domain's own enum, not a copy.
pub use reckon_ledger::ProviderKind;

/// An operation pattern of one source routed to a provider (or to none).
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Route {
    id: i64,
    source: String,
    /// An operation name, or `*` for every operation of the source.
    operation: String,
    /// null: no provider can answer for this operation.
    #[schema(required = true)]
    provider: Option<String>,
}

/// An API token (never its secret, which is shown once when made).
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenInfo {
    id: i64,
    role: Role,
    label: String,
    #[schema(required = true)]
    created_by: Option<String>,
    created_at: f64,
    #[schema(required = true)]
    last_used_at: Option<f64>,
    #[schema(required = true)]
    revoked_at: Option<f64>,
}

/// One action of a person or token, from the tenant's audit log.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Action {
    id: i64,
    at: f64,
    /// `user:<id> via token:<id>`, `token:<id>`, or `operator` (the CLI).
    actor: String,
    /// e.g. `source.add`, `provider.add`, `route.set`, `effect.resolve`, `token.create`.
    action: String,
    #[schema(required = true)]
    target: Option<String>,
    detail: Value,
    #[schema(required = true)]
    address: Option<String>,
}

/// How an audit run ended: `complete`; `partial` (some providers could not be read
/// whole: only the others are audited, `reason` names the failed ones); `failed` (nothing
/// was read whole: no findings, `reason` says why).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AuditStatus {
    Complete,
    Partial,
    Failed,
}

/// A stored audit run of one day, with its findings and evidence.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditRun {
    id: i64,
    seq: i64,
    /// The tenant-local day, `YYYY-MM-DD`.
    day: String,
    time_zone: String,
    window_start: f64,
    window_end: f64,
    /// A provider name, or `*` for all of them.
    provider: String,
    triggered_by: String,
    #[schema(value_type = AuditStatus)]
    status: String,
    #[schema(required = true)]
    reason: Option<String>,
    started_at: f64,
    finished_at: f64,
    counts: Value,
    findings: Value,
    totals: Value,
    evidence: Value,
    prev_digest: String,
    digest: String,
}

/// An audit run without its findings and evidence (the list view).
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditRunSummary {
    id: i64,
    seq: i64,
    day: String,
    time_zone: String,
    provider: String,
    triggered_by: String,
    #[schema(value_type = AuditStatus)]
    status: String,
    #[schema(required = true)]
    reason: Option<String>,
    started_at: f64,
    finished_at: f64,
    counts: Value,
    totals: Value,
    digest: String,
}
