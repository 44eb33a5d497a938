//! The ingest plan: one write per key whatever a batch repeats, the abandonment deadline
//! of a claim, and the lookup parts of a multi-part subject.

use reckon_domain::ingest::{IngestPlan, ItemStatus, ingest_plan};
use reckon_domain::{SourceRecord, State};
use std::collections::HashMap;

fn rec(key: &str, state: State, updated_at: f64) -> SourceRecord {
    SourceRecord {
        key: key.into(),
        state,
        request_hash: "1:x".into(),
        response: None,
        attempts: 1,
        created_at: 1.0,
        updated_at,
        expires_at: Some(updated_at + 30.0),
    }
}

fn plan(records: Vec<SourceRecord>) -> IngestPlan {
    ingest_plan(&records, 300.0, &HashMap::new())
}

#[test]
fn a_key_repeated_in_one_batch_is_created_once_with_one_event_per_change() {
    let plan = plan(vec![
        rec("charge:v1:a", State::InProgress, 10.0),
        rec("charge:v1:a", State::InProgress, 10.0),
        rec("charge:v1:a", State::Succeeded, 11.0),
        rec("charge:v1:a", State::InProgress, 9.0),
    ]);
    assert_eq!(plan.creates.len(), 1);
    assert_eq!(plan.creates[0].record.state, State::Succeeded);
    assert_eq!(plan.events.len(), 2);
    assert_eq!(
        plan.statuses,
        vec![
            ItemStatus::Created,
            ItemStatus::Unchanged,
            ItemStatus::Updated,
            ItemStatus::Stale
        ]
    );
}

#[test]
fn abandoned_at_is_lease_end_plus_grace_for_claims_only() {
    let plan = plan(vec![
        rec("charge:v1:a", State::InProgress, 10.0),
        rec("charge:v1:b", State::Succeeded, 10.0),
    ]);
    assert_eq!(plan.creates[0].abandoned_at, Some(10.0 + 30.0 + 300.0));
    assert_eq!(plan.creates[1].abandoned_at, None);
}

#[test]
fn multi_part_subjects_get_lookup_parts() {
    let plan = plan(vec![
        rec("refund:v1:cus_9:ORD-17", State::Succeeded, 1.0),
        rec("charge:v1:ORD-17", State::Succeeded, 1.0),
    ]);
    assert_eq!(plan.creates[0].extra_parts, vec!["cus_9", "ORD-17"]);
    assert!(plan.creates[1].extra_parts.is_empty());
    assert_eq!(plan.creates[1].subject.as_deref(), Some("ORD-17"));
}
