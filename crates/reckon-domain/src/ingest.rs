//! The store-independent half of ingest: given what the ledger holds for a batch's keys,
//! decide every write (the effect rows, their history events, each record's status). A
//! ledger only executes the plan, inside one transaction.

use crate::record::{Decision, Rejected, SourceRecord, StoredSnapshot, decide};
use crate::{OperationKey, State};
use serde::Serialize;
use std::collections::HashMap;

/// What ingest did with one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemStatus {
    Created,
    Updated,
    Unchanged,
    /// Older than what the ledger holds: ignored.
    Stale,
}

/// Where a record came from: the history's `origin` word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    Scan,
    FullScan,
    Push,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Scan => "scan",
            Origin::FullScan => "full_scan",
            Origin::Push => "push",
        }
    }
}

/// Where a scan stands: the (updated_at, key) of the last row stored or quarantined.
#[derive(Debug, Clone, PartialEq)]
pub struct Cursor {
    pub updated_at: f64,
    pub key: Vec<u8>,
}

/// One batch for the ledger's ingest.
#[derive(Debug, Clone)]
pub struct IngestBatch {
    pub origin: Origin,
    pub observed_at: f64,
    /// In source order for scans; request order for pushes.
    pub records: Vec<SourceRecord>,
    pub rejected: Vec<Rejected>,
    /// The source's grace period after a lease ends before a claim counts as abandoned.
    pub abandoned_after_secs: f64,
    /// Where the scan stands after this batch; `None` leaves the cursor alone (pushes).
    pub cursor: Option<Cursor>,
    /// The scan's lease: when given, the batch is written only while it is still held.
    pub lease: Option<Lease>,
    /// A hint, not a promise: the ledger is expected to hold none of these keys (a
    /// source's first scan). A backend may then insert first and look keys up only if one
    /// conflicts; what is stored is the same either way.
    pub expect_new: bool,
}

/// A claim on a piece of work that exactly one replica may do at a time (a source's scan, a
/// day's audit, a scheduled job), held until `expires_at` unless renewed.
///
/// `term` grows every time the work changes hands (or the same owner re-takes it after it
/// expired), so a write fenced with an old lease can never pass for a current one.
#[derive(Debug, Clone, PartialEq)]
pub struct Lease {
    pub name: String,
    pub owner: String,
    pub term: i64,
    /// Epoch seconds on the ledger's clock (PostgreSQL's, shared by every replica).
    pub expires_at: f64,
}

/// What ingest did with one batch.
#[derive(Debug, Clone, Default, Serialize)]
pub struct IngestOutcome {
    pub created: u64,
    pub updated: u64,
    pub unchanged: u64,
    pub stale: u64,
    /// Rows refused into quarantine (new entries and ones already there).
    pub quarantined: u64,
    /// One status per record, in batch order.
    #[serde(skip)]
    pub statuses: Vec<ItemStatus>,
}

impl IngestOutcome {
    /// What a batch's plan did, and how many of its rows were refused into quarantine.
    pub fn of(plan: &IngestPlan, rejected: usize) -> IngestOutcome {
        let mut o = IngestOutcome {
            quarantined: rejected as u64,
            statuses: plan.statuses.clone(),
            ..Default::default()
        };
        for s in &plan.statuses {
            match s {
                ItemStatus::Created => o.created += 1,
                ItemStatus::Updated => o.updated += 1,
                ItemStatus::Unchanged => o.unchanged += 1,
                ItemStatus::Stale => o.stale += 1,
            }
        }
        o
    }

    pub fn stored(&self) -> u64 {
        self.created + self.updated + self.unchanged + self.stale
    }
}

/// An effect row to insert or update.
#[derive(Debug, Clone)]
pub struct EffectWrite {
    pub record: SourceRecord,
    pub operation: Option<String>,
    pub key_version: Option<String>,
    pub subject: Option<String>,
    /// Lookup parts beyond the subject itself (only for multi-part subjects).
    pub extra_parts: Vec<String>,
    /// The ids the row's recorded result names ([`crate::recorded::recorded_ids`]): lookup
    /// parts too, written whenever the row is (a result appears when a claim completes).
    pub recorded_ids: Vec<String>,
    pub abandoned_at: Option<f64>,
}

impl EffectWrite {
    fn new(record: SourceRecord, abandoned_after_secs: f64) -> EffectWrite {
        let parsed = OperationKey::parse(&record.key);
        let abandoned_at = match record.state {
            State::InProgress => record.expires_at.map(|e| e + abandoned_after_secs),
            _ => None,
        };
        let (operation, key_version, subject, extra_parts) = match parsed {
            Some(k) => {
                let extra = if k.parts.len() > 1 {
                    k.parts
                } else {
                    Vec::new()
                };
                (Some(k.operation), Some(k.version), Some(k.subject), extra)
            }
            None => (None, None, None, Vec::new()),
        };
        let recorded_ids = record
            .response
            .as_deref()
            .map(crate::recorded::recorded_ids)
            .unwrap_or_default();
        EffectWrite {
            recorded_ids,
            record,
            operation,
            key_version,
            subject,
            extra_parts,
            abandoned_at,
        }
    }
}

/// A history event to append, addressed by key until the effect's id is known.
#[derive(Debug, Clone)]
pub struct PlannedEvent {
    pub key: String,
    pub kind: &'static str,
    pub from_state: Option<&'static str>,
    pub to_state: Option<&'static str>,
    pub attempts: Option<i64>,
    pub source_updated_at: Option<f64>,
    pub detail: Option<String>,
}

#[derive(Debug, Default)]
pub struct IngestPlan {
    pub creates: Vec<EffectWrite>,
    /// (effect id, new row)
    pub updates: Vec<(i64, EffectWrite)>,
    pub events: Vec<PlannedEvent>,
    pub statuses: Vec<ItemStatus>,
}

/// Plan a batch against the ledger's current copies (`existing`: key -> (id, snapshot)).
///
/// A key may appear several times in one batch (a push that repeats itself): each
/// occurrence is compared with the result of the previous ones, so the outcome is the
/// same as ingesting the items one by one.
/// `abandoned_after_secs` is the source's grace after a lease ends before a claim counts as
/// abandoned.
pub fn ingest_plan(
    records: &[SourceRecord],
    abandoned_after_secs: f64,
    existing: &HashMap<String, (i64, StoredSnapshot)>,
) -> IngestPlan {
    let mut plan = IngestPlan::default();
    // key -> (index into creates, or effect id in updates) and the snapshot as planned.
    enum Slot {
        Create(usize),
        Update(usize),
        Existing,
    }
    let mut current: HashMap<&str, (Slot, StoredSnapshot)> = HashMap::new();

    for rec in records {
        let key = rec.key.as_str();
        let snapshot = current
            .get(key)
            .map(|(_, s)| s.clone())
            .or_else(|| existing.get(key).map(|(_, s)| s.clone()));
        let decision = decide(snapshot.as_ref(), rec);
        let status = match decision {
            Decision::Create => ItemStatus::Created,
            Decision::Update => ItemStatus::Updated,
            Decision::Unchanged => ItemStatus::Unchanged,
            Decision::Stale => ItemStatus::Stale,
        };
        plan.statuses.push(status);
        match decision {
            Decision::Unchanged | Decision::Stale => {}
            Decision::Create => {
                plan.events.push(PlannedEvent {
                    key: rec.key.clone(),
                    kind: "first_seen",
                    from_state: None,
                    to_state: Some(rec.state.as_str()),
                    attempts: Some(rec.attempts),
                    source_updated_at: Some(rec.updated_at),
                    detail: None,
                });
                plan.creates
                    .push(EffectWrite::new(rec.clone(), abandoned_after_secs));
                let snap = StoredSnapshot {
                    record: rec.clone(),
                    gone: false,
                };
                current.insert(key, (Slot::Create(plan.creates.len() - 1), snap));
            }
            Decision::Update => {
                let prev = snapshot.expect("update implies a snapshot");
                plan.events.push(PlannedEvent {
                    key: rec.key.clone(),
                    kind: if prev.gone { "reappeared" } else { "changed" },
                    from_state: Some(prev.record.state.as_str()),
                    to_state: Some(rec.state.as_str()),
                    attempts: Some(rec.attempts),
                    source_updated_at: Some(rec.updated_at),
                    detail: change_detail(&prev.record, rec),
                });
                let write = EffectWrite::new(rec.clone(), abandoned_after_secs);
                let snap = StoredSnapshot {
                    record: rec.clone(),
                    gone: false,
                };
                let slot = match current.get(key).map(|(s, _)| s) {
                    Some(Slot::Create(i)) => {
                        plan.creates[*i] = write;
                        Slot::Create(*i)
                    }
                    Some(Slot::Update(i)) => {
                        plan.updates[*i].1 = write;
                        Slot::Update(*i)
                    }
                    Some(Slot::Existing) | None => {
                        let id = existing.get(key).map(|(id, _)| *id).expect("existing id");
                        plan.updates.push((id, write));
                        Slot::Update(plan.updates.len() - 1)
                    }
                };
                current.insert(key, (slot, snap));
            }
        }
        if let Some((_, snap)) = existing.get(key)
            && !current.contains_key(key)
        {
            current.insert(key, (Slot::Existing, snap.clone()));
        }
    }
    plan
}

/// Which fields changed, as a small JSON object for the history ("attempts 1 -> 2").
fn change_detail(old: &SourceRecord, new: &SourceRecord) -> Option<String> {
    let mut changed = serde_json::Map::new();
    if old.attempts != new.attempts {
        changed.insert(
            "attempts".into(),
            serde_json::json!([old.attempts, new.attempts]),
        );
    }
    if old.request_hash != new.request_hash {
        changed.insert("request_hash".into(), serde_json::json!(true));
    }
    if old.response != new.response {
        changed.insert("response".into(), serde_json::json!(true));
    }
    if old.expires_at != new.expires_at {
        changed.insert(
            "expires_at".into(),
            serde_json::json!([old.expires_at, new.expires_at]),
        );
    }
    if changed.is_empty() {
        None
    } else {
        Some(serde_json::Value::Object(changed).to_string())
    }
}
