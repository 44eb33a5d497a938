//! Leases: work one replica does at a time.

use super::*;

pub(crate) async fn story_leases(ledger: Arc<dyn Ledger>) {
    let (t, src) = tenant_and_source(&*ledger, "acme", "shop").await;
    let ttl = 1.0;

    let a = ledger
        .try_lease("scan:1", "A", ttl)
        .await
        .unwrap()
        .expect("free: A takes it");
    assert!(
        ledger
            .try_lease("scan:1", "B", ttl)
            .await
            .unwrap()
            .is_none(),
        "held by A: B cannot take it"
    );
    let again = ledger
        .try_lease("scan:1", "A", ttl)
        .await
        .unwrap()
        .expect("A renews");
    assert_eq!(
        again.term, a.term,
        "the holder re-taking its lease keeps the term"
    );
    assert!(
        ledger
            .try_lease("scan:2", "B", ttl)
            .await
            .unwrap()
            .is_some(),
        "leases are per name"
    );
    assert!(ledger.renew_lease(&a, ttl).await.unwrap().is_some());

    // Held: A's fenced writes go through.
    let kept = rec("charge:v1:kept", State::Succeeded, 1_700_000_000.0);
    let first = Cursor {
        updated_at: 1_700_000_000.0,
        key: kept.key.as_bytes().to_vec(),
    };
    ledger
        .ingest(
            t.id,
            src.id,
            IngestBatch {
                cursor: Some(first.clone()),
                lease: Some(a.clone()),
                ..batch(vec![kept.clone()])
            },
        )
        .await
        .expect("a held lease lets the batch through");

    // A stalls past its lease; B takes over with the next term.
    tokio::time::sleep(std::time::Duration::from_secs_f64(ttl + 0.3)).await;
    let b = ledger
        .try_lease("scan:1", "B", ttl)
        .await
        .unwrap()
        .expect("expired: B takes it");
    assert_eq!(b.term, a.term + 1, "a change of hands is a new term");
    assert!(
        ledger.renew_lease(&a, ttl).await.unwrap().is_none(),
        "A's lease is lost"
    );

    // A resumes: every write it attempts is refused, and nothing of it lands.
    let late = IngestBatch {
        cursor: Some(Cursor {
            updated_at: 1_800_000_000.0,
            key: b"z".to_vec(),
        }),
        lease: Some(a.clone()),
        ..batch(vec![rec(
            "charge:v1:late",
            State::Succeeded,
            1_800_000_000.0,
        )])
    };
    assert!(matches!(
        ledger.ingest(t.id, src.id, late).await,
        Err(LedgerError::LeaseLost(_))
    ));
    assert!(matches!(
        ledger
            .mark_gone(
                t.id,
                src.id,
                std::slice::from_ref(&kept.key),
                1_800_000_000.0,
                Origin::FullScan,
                Some(&a)
            )
            .await,
        Err(LedgerError::LeaseLost(_))
    ));
    assert!(matches!(
        ledger
            .record_scan_success(t.id, src.id, 1_800_000_000.0, true, Some(&a))
            .await,
        Err(LedgerError::LeaseLost(_))
    ));
    assert!(matches!(
        ledger
            .record_scan_failure(t.id, src.id, 1_800_000_000.0, "late", Some(&a))
            .await,
        Err(LedgerError::LeaseLost(_))
    ));
    let s = ledger.source_by_name(t.id, "shop").await.unwrap();
    assert_eq!(
        s.cursor,
        Some(first),
        "the late batch did not move the cursor"
    );
    assert_eq!(s.last_success_at, None, "nor the source's health");
    assert_eq!(s.last_error, None);
    assert_eq!(
        keys(&list(&*ledger, t.id, everything()).await),
        set(&["charge:v1:kept"])
    );
    assert_eq!(
        effect(&*ledger, t.id, "shop", "charge:v1:kept")
            .await
            .gone_at,
        None
    );

    // A's stale release does not free B's lease; B's release does, and the term grows.
    ledger.release_lease(&a).await.unwrap();
    assert!(
        ledger
            .try_lease("scan:1", "C", ttl)
            .await
            .unwrap()
            .is_none()
    );
    ledger.release_lease(&b).await.unwrap();
    let c = ledger
        .try_lease("scan:1", "C", ttl)
        .await
        .unwrap()
        .expect("released: C takes it");
    assert_eq!(c.term, b.term + 1);

    // Nonsense durations are the caller's bug, refused by name.
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1.0e9] {
        assert!(matches!(
            ledger.try_lease("scan:9", "A", bad).await,
            Err(LedgerError::Invalid(_))
        ));
    }
}

/// A lease taken with a mark of presence is the next taker's as soon as its holder's
/// process is gone (here: its ledger dropped without a release, as a killed process leaves
/// it), long before its term ends; while the holder is there, or when it marked nothing,
/// the lease is its own for the whole term.
pub(crate) async fn story_lease_presence(ledger: Arc<dyn Ledger>, raw: RawDb) {
    let ttl = 600.0;
    let other = raw.reopen().await;
    let held = other
        .try_lease_present("scan:7", "A", ttl)
        .await
        .unwrap()
        .expect("free: A takes it");
    for present in [true, false] {
        let taken = if present {
            ledger.try_lease_present("scan:7", "B", ttl).await
        } else {
            ledger.try_lease("scan:7", "B", ttl).await
        };
        assert!(taken.unwrap().is_none(), "A is there: B cannot take it");
    }
    let plain = ledger
        .try_lease("plain:1", "C", ttl)
        .await
        .unwrap()
        .expect("free: C takes it");
    assert!(
        other
            .try_lease_present("plain:1", "D", ttl)
            .await
            .unwrap()
            .is_none(),
        "a holder that marked no presence keeps its lease for its term"
    );

    // A's process dies: B takes the lease over at once, in the next term, and A's term
    // writes nothing more.
    drop(other);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let b = loop {
        if let Some(b) = ledger.try_lease_present("scan:7", "B", ttl).await.unwrap() {
            break b;
        }
        assert!(
            std::time::Instant::now() < until,
            "10 s after A went, its lease (a term of {ttl} s) was still not free"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(b.term, held.term + 1, "a take-over starts the next term");
    assert!(ledger.renew_lease(&held, ttl).await.unwrap().is_none());
    assert!(ledger.renew_lease(&plain, ttl).await.unwrap().is_some());

    // B is there now: another process waits; once B hands the lease back, it takes it.
    let third = raw.reopen().await;
    assert!(
        third
            .try_lease_present("scan:7", "E", ttl)
            .await
            .unwrap()
            .is_none(),
        "B is there: E cannot take it"
    );
    ledger.release_lease(&b).await.unwrap();
    let e = third
        .try_lease_present("scan:7", "E", ttl)
        .await
        .unwrap()
        .expect("handed back: E takes it");
    assert!(
        ledger
            .try_lease_present("scan:7", "B", ttl)
            .await
            .unwrap()
            .is_none(),
        "B's mark went with its release, and E's stands"
    );
    assert_eq!(e.term, b.term + 1);
}
