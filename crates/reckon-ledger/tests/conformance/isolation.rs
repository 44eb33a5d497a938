//! No tenant reads or writes another tenant's rows, whatever the aggregate.

use super::*;

// 10. tenant isolation
pub(crate) async fn story_isolation_reads(ledger: Arc<dyn Ledger>) {
    let (a, src_a) = tenant_and_source(&*ledger, "acme", "shop").await;
    // The same source name in B: a filter on the name alone would leak.
    let (b, src_b) = tenant_and_source(&*ledger, "globex", "shop").await;
    let now = time::now();
    ledger
        .ingest(
            a.id,
            src_a.id,
            IngestBatch {
                rejected: vec![refused(&raw_row(b"charge:v1:Q", b"bogus", None, 1.0e9))],
                cursor: Some(Cursor {
                    updated_at: now,
                    key: b"charge:v1:ORD-17".to_vec(),
                }),
                ..batch(vec![
                    rec("charge:v1:ORD-17", State::Unknown, now - 100.0),
                    rec("refund:v1:cus_9:ORD-17", State::Succeeded, now - 90.0),
                    claim("charge:v1:ORD-18", now - 20_000.0, now - 10_000.0),
                    rec(UUID_KEY, State::Succeeded, now - 80.0),
                ])
            },
        )
        .await
        .unwrap();
    // Sanity: A sees its own data, so emptiness below means isolation, not absence.
    assert_eq!(list(&*ledger, a.id, everything()).await.len(), 4);
    assert_eq!(ledger.quarantine_counts(a.id).await.unwrap().len(), 1);

    for unresolved in [None, Some(true), Some(false)] {
        let q = EffectQuery {
            unresolved,
            ..everything()
        };
        assert!(list(&*ledger, b.id, q.clone()).await.is_empty());
        let q = EffectQuery {
            source: Some("shop".into()),
            ..q
        };
        assert!(list(&*ledger, b.id, q).await.is_empty());
    }
    for key in ["charge:v1:ORD-17", "refund:v1:cus_9:ORD-17", UUID_KEY] {
        assert!(
            ledger
                .get_effect(b.id, "shop", key)
                .await
                .unwrap()
                .is_none()
        );
    }
    for text in ["ORD-17", "cus_9", "charge:v1:ORD-18", UUID_KEY] {
        assert!(
            ledger.lookup(b.id, text, 100).await.unwrap().is_empty(),
            "{text}"
        );
    }
    assert!(ledger.quarantine_counts(b.id).await.unwrap().is_empty());
    assert!(
        ledger
            .list_quarantine(b.id, src_a.id, 100)
            .await
            .unwrap()
            .is_empty()
    );
    let b_sources = ledger.list_sources(b.id).await.unwrap();
    assert_eq!(b_sources.len(), 1);
    assert_eq!(b_sources[0].id, src_b.id);
    assert_eq!(b_sources[0].cursor, None, "A's cursor is not B's");
    assert!(
        ledger
            .present_keys(b.id, src_a.id, 0, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        ledger
            .present_keys(b.id, src_b.id, 0, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(ledger.source_dsn(b.id, &src_a).await.is_err());
}

pub(crate) async fn story_isolation_writes(ledger: Arc<dyn Ledger>) {
    let (a, src_a) = tenant_and_source(&*ledger, "acme", "shop").await;
    let (b, _src_b) = tenant_and_source(&*ledger, "globex", "shop").await;
    let key = "charge:v1:ORD-17";
    ledger
        .ingest(
            a.id,
            src_a.id,
            batch(vec![rec(key, State::Succeeded, 1_700_000_000.0)]),
        )
        .await
        .unwrap();

    // B names A's source id: refused, and nothing of A moves.
    let intrusion = IngestBatch {
        rejected: vec![refused(&raw_row(b"charge:v1:Q", b"bogus", None, 1.0e9))],
        cursor: Some(Cursor {
            updated_at: 1.0,
            key: b"x".to_vec(),
        }),
        ..batch(vec![
            rec(key, State::Failed, 1_700_000_500.0),
            rec("charge:v1:planted", State::Succeeded, 1_700_000_500.0),
        ])
    };
    match ledger.ingest(b.id, src_a.id, intrusion).await {
        Err(LedgerError::NotFound(_)) => {}
        other => panic!("ingest into another tenant's source must be NotFound, got {other:?}"),
    }
    assert!(list(&*ledger, b.id, everything()).await.is_empty());
    assert!(ledger.quarantine_counts(b.id).await.unwrap().is_empty());
    assert!(ledger.quarantine_counts(a.id).await.unwrap().is_empty());
    assert_eq!(keys(&list(&*ledger, a.id, everything()).await), set(&[key]));
    assert_eq!(
        effect(&*ledger, a.id, "shop", key).await.state,
        State::Succeeded
    );
    assert_eq!(
        ledger.source_by_name(a.id, "shop").await.unwrap().cursor,
        None
    );

    let gone = ledger
        .mark_gone(
            b.id,
            src_a.id,
            &[key.to_owned()],
            1_700_000_600.0,
            Origin::Scan,
            None,
        )
        .await
        .unwrap();
    assert!(gone.is_empty());
    assert_eq!(effect(&*ledger, a.id, "shop", key).await.gone_at, None);

    ledger
        .record_scan_failure(b.id, src_a.id, 1_700_000_700.0, "planted", None)
        .await
        .unwrap();
    ledger
        .record_scan_success(b.id, src_a.id, 1_700_000_700.0, true, None)
        .await
        .unwrap();
    let s = ledger.source_by_name(a.id, "shop").await.unwrap();
    assert_eq!(
        (
            s.last_error,
            s.last_scan_at,
            s.last_full_scan_at,
            s.consecutive_failures
        ),
        (None, None, None, 0)
    );
}
