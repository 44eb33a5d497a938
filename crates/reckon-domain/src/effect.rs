//! An effect as reckon keeps it: the source's record, when reckon saw it, and the facts
//! derived from it when it is read.

use crate::{State, UnresolvedKind};
use serde::Serialize;

/// One record of a source as reckon keeps it (the ledger's copy, kept after the source
/// deletes the row).
#[derive(Debug, Clone, Serialize)]
pub struct Effect {
    pub id: i64,
    pub source: String,
    pub key: String,
    pub operation: Option<String>,
    pub key_version: Option<String>,
    pub subject: Option<String>,
    pub state: State,
    pub request_hash: String,
    /// The response as canonical JSON text (`None` = null).
    #[serde(skip)]
    pub response_json: Option<String>,
    pub attempts: i64,
    pub reclaimed: bool,
    pub created_at: f64,
    pub updated_at: f64,
    pub expires_at: Option<f64>,
    pub first_seen_at: f64,
    pub last_changed_at: f64,
    pub gone_at: Option<f64>,
    pub gone_reason: Option<String>,
    pub unresolved_kind: Option<UnresolvedKind>,
    pub unresolved_since: Option<f64>,
}

/// One change reckon observed in an effect's row, or its disappearance (append-only).
#[derive(Debug, Clone, Serialize)]
pub struct EffectEvent {
    pub id: i64,
    pub observed_at: f64,
    pub origin: String,
    pub kind: String,
    pub from_state: Option<String>,
    pub to_state: Option<String>,
    pub attempts: Option<i64>,
    pub source_updated_at: Option<f64>,
    pub detail: Option<String>,
}

/// An effect with its history, oldest change first.
#[derive(Debug, Clone, Serialize)]
pub struct EffectDetail {
    pub effect: Effect,
    pub history: Vec<EffectEvent>,
}

impl Effect {
    /// The facts derived when an effect is read: whether it was claimed more than once, and
    /// whether (and since when) nobody knows its outcome. `abandoned_at` is when its claim
    /// counts as abandoned, the source's grace period included.
    pub fn derive_facts(&mut self, abandoned_at: Option<f64>, now: f64) {
        self.reclaimed = self.attempts > 1;
        // The grace period is already in `abandoned_at`, hence a grace of zero here: the
        // rule itself lives in one place, `UnresolvedKind::derive`.
        self.unresolved_kind =
            UnresolvedKind::derive(self.state, abandoned_at, self.gone_at.is_some(), 0.0, now);
        self.unresolved_since = match self.unresolved_kind {
            Some(UnresolvedKind::Unknown) => Some(self.updated_at),
            // The claim's lease ended at expires_at: from then on nobody held it.
            Some(UnresolvedKind::Abandoned) => self.expires_at,
            None => None,
        };
    }
}
