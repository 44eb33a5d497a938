//! Write-back: the per-source setting and the log.

use super::*;

pub(crate) async fn story_writeback(ledger: Arc<dyn Ledger>) {
    use reckon_ledger::{NewWriteback, WritebackAction, WritebackPolicy, WritebackStatus};
    let t = ledger.create_tenant("acme").await.unwrap();
    let other = ledger.create_tenant("other").await.unwrap();
    let s = ledger
        .add_source(
            t.id,
            NewSource {
                kind: SourceKind::Sqlite,
                dsn: Some(SecretString::from("/data/shop.db".to_owned())),
                dsn_display: Some("sqlite:///data/shop.db".into()),
                ..push_source("shop")
            },
        )
        .await
        .unwrap();
    assert_eq!(s.writeback(), None, "off by default");
    ledger
        .add_source(t.id, push_source("pushed"))
        .await
        .unwrap();
    let e = ledger
        .set_source_writeback(t.id, "pushed", Some(WritebackPolicy::Release))
        .await
        .unwrap_err();
    assert!(matches!(e, LedgerError::Invalid(_)), "{e}");
    assert_eq!(
        ledger
            .source_by_name(t.id, "pushed")
            .await
            .unwrap()
            .writeback(),
        None
    );

    let now = time::now();
    ledger
        .ingest(
            t.id,
            s.id,
            batch(vec![
                rec("charge:v1:o1", State::Unknown, now - 100.0),
                rec("charge:v1:o2", State::Unknown, now - 90.0),
                rec("charge:v1:o3", State::Unknown, now - 80.0),
            ]),
        )
        .await
        .unwrap();
    let claims = ledger.claim_due(t.id, "w1", now, 30.0, 10).await.unwrap();
    let id_of = |k: &str| claims.iter().find(|c| c.effect.key == k).unwrap().effect.id;
    for (k, outcome) in [
        ("charge:v1:o1", "applied"),
        ("charge:v1:o2", "not_applied"),
        ("charge:v1:o3", "duplicate"),
    ] {
        ledger
            .record_attempt(
                t.id,
                id_of(k),
                "w1",
                attempt(outcome, now, now + 60.0, true),
            )
            .await
            .unwrap();
    }
    assert!(
        ledger
            .writeback_candidates(t.id, None, 10)
            .await
            .unwrap()
            .is_empty(),
        "write-back off: no candidates"
    );
    let on = ledger
        .set_source_writeback(t.id, "shop", Some(WritebackPolicy::Release))
        .await
        .unwrap();
    assert_eq!(on.writeback(), Some(WritebackPolicy::Release));
    let c = ledger.writeback_candidates(t.id, None, 10).await.unwrap();
    let keys: Vec<&str> = c.iter().map(|c| c.key.as_str()).collect();
    assert_eq!(
        keys,
        ["charge:v1:o1", "charge:v1:o2"],
        "a duplicate is left to a person"
    );
    assert_eq!(c[0].state, "unknown");
    assert_eq!(c[0].updated_at, now - 100.0, "the exact value seen");
    assert_eq!(c[0].resolution.outcome.as_str(), "applied");
    assert_eq!(c[0].source, "shop");
    assert!(
        ledger
            .writeback_candidates(other.id, None, 10)
            .await
            .unwrap()
            .is_empty()
    );

    let new = |c: &reckon_ledger::WritebackCandidate| NewWriteback {
        source_id: c.source_id,
        effect_id: c.effect_id,
        resolution_id: c.resolution.id,
        key: c.key.clone(),
        action: WritebackAction::Succeed,
        seen_state: c.state.clone(),
        seen_updated_at: c.updated_at,
        new_response: Some(r#"{"id":"ch_1"}"#.into()),
        new_updated_at: now,
    };
    // Another tenant cannot record an intent on these ids.
    assert!(
        ledger
            .begin_writeback(other.id, new(&c[0]), None)
            .await
            .is_err()
    );
    let w1 = ledger
        .begin_writeback(t.id, new(&c[0]), None)
        .await
        .unwrap();
    assert_eq!(w1.status, WritebackStatus::Pending);
    assert_eq!(w1.new_response.as_deref(), Some(r#"{"id":"ch_1"}"#));
    let again = ledger
        .begin_writeback(t.id, new(&c[0]), None)
        .await
        .unwrap();
    assert_eq!(again.id, w1.id, "one write-back per resolution");
    assert_eq!(
        ledger
            .list_writebacks(t.id, Some(s.id), Some(WritebackStatus::Pending), 10)
            .await
            .unwrap()
            .len(),
        1
    );
    assert!(
        ledger
            .list_writebacks(other.id, None, None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        ledger
            .finish_writeback(other.id, w1.id, WritebackStatus::Written, "x", false, None)
            .await
            .is_err(),
        "another tenant cannot settle it"
    );
    let done = ledger
        .finish_writeback(t.id, w1.id, WritebackStatus::Written, "written", true, None)
        .await
        .unwrap();
    assert_eq!(done.status, WritebackStatus::Written);
    assert!(done.recovered && done.settled_at.is_some());
    let late = ledger
        .finish_writeback(t.id, w1.id, WritebackStatus::Conflict, "late", false, None)
        .await
        .unwrap();
    assert_eq!(
        late.status,
        WritebackStatus::Written,
        "the first outcome stands"
    );
    assert_eq!(late.detail.as_deref(), Some("written"));
    let keys: Vec<String> = ledger
        .writeback_candidates(t.id, Some(s.id), 10)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.key)
        .collect();
    assert_eq!(keys, ["charge:v1:o2"]);

    // Turned off: no candidates, and no intent is recorded.
    ledger
        .set_source_writeback(t.id, "shop", None)
        .await
        .unwrap();
    assert!(
        ledger
            .writeback_candidates(t.id, None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        ledger
            .begin_writeback(t.id, new(&c[1]), None)
            .await
            .is_err(),
        "write-back off: refused"
    );
    assert_eq!(
        ledger
            .list_writebacks(t.id, None, None, 10)
            .await
            .unwrap()
            .len(),
        1
    );
}

/// A source read through a column mapping keeps its settings as given; reckon never
/// writes back to it (write-back's statement is justonce's).
pub(crate) async fn story_mapped_source(ledger: Arc<dyn Ledger>) {
    use reckon_ledger::WritebackPolicy;
    let t = ledger.create_tenant("acme").await.unwrap();
    let settings = r#"{"preset": "brandur", "table": "billing.idempotency_keys"}"#;
    let s = ledger
        .add_source(
            t.id,
            NewSource {
                kind: SourceKind::Postgres,
                dsn: Some(SecretString::from(
                    "postgres://app@db.internal/rides".to_owned(),
                )),
                dsn_display: Some("postgres://app@db.internal:5432/rides".into()),
                table_name: "billing.idempotency_keys".into(),
                mapping: Some(settings.into()),
                ..push_source("rides")
            },
        )
        .await
        .unwrap();
    assert_eq!(s.mapping.as_deref(), Some(settings));
    let read = ledger.source_by_name(t.id, "rides").await.unwrap();
    assert_eq!(read.mapping.as_deref(), Some(settings));
    let e = ledger
        .set_source_writeback(t.id, "rides", Some(WritebackPolicy::Release))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, LedgerError::Invalid(m) if m.contains("column mapping")),
        "{e}"
    );
    assert_eq!(
        ledger
            .source_by_name(t.id, "rides")
            .await
            .unwrap()
            .writeback(),
        None
    );
    // A justonce source has none.
    let plain = ledger
        .add_source(t.id, push_source("pushed"))
        .await
        .unwrap();
    assert_eq!(plain.mapping, None);
}
