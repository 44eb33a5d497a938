//! Reconciliation as reckon records it: where one effect's reconciliation stands, each
//! lookup with its evidence (append-only), and the resolution. The meaning of each outcome
//! is `reckon-providers::classify`'s to decide, not here.

use crate::Outcome;
use crate::effect::Effect;
use serde::Serialize;

/// The author of every resolution the reconciler records on its own.
pub const RECONCILER_AUTHOR: &str = "reconciler";

/// Where the reconciliation of one effect stands.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ReconcileState {
    pub attempts: i64,
    pub next_attempt_at: f64,
    pub last_attempt_at: Option<f64>,
    pub last_outcome: Option<Outcome>,
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
    pub outcome: Outcome,
    pub method: Option<String>,
    pub error: Option<String>,
    pub evidence: serde_json::Value,
}

#[derive(Debug, Clone)]
pub struct NewAttempt {
    pub provider_id: Option<i64>,
    pub started_at: f64,
    pub finished_at: f64,
    pub outcome: Outcome,
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
    pub outcome: Outcome,
    pub author: String,
    pub note: Option<String>,
    pub evidence: serde_json::Value,
    pub attempt_id: Option<i64>,
    pub created_at: f64,
}

#[derive(Debug, Clone)]
pub struct NewResolution {
    pub outcome: Outcome,
    pub author: String,
    pub note: Option<String>,
    pub evidence: serde_json::Value,
}

/// What recording an attempt did.
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
