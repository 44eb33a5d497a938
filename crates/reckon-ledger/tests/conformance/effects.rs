//! Ingest, history and the effect reads.

use super::*;

pub(crate) const UUID_KEY: &str = "3f2b8c1e-9a4d-4c1b-8e7f-0a1b2c3d4e5f";

pub(crate) fn hex_lower(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

// 5. ingest
/// Keys and responses that a careless backend would mangle, as validated source rows.
pub(crate) fn tricky_records() -> Vec<SourceRecord> {
    let long = format!("charge:v1:{}", "x".repeat(890));
    assert_eq!(long.chars().count(), 900);
    vec![
        valid(&raw_row(
            "charge:v1:ORD-ü-日本-🦀".as_bytes(),
            b"succeeded",
            Some(br#""done""#),
            1_700_000_000.123_456_7,
        )),
        valid(&raw_row(
            br#"charge:v1:o'r";DROP TABLE effect;--"#,
            b"succeeded",
            Some(br#"{"id": "ch_1", "amount": 2000, "note": "it's \"quoted\"; ok"}"#),
            1_700_000_001.000_001,
        )),
        valid(&raw_row(
            long.as_bytes(),
            b"failed",
            Some("[1, \"ü\", null]".as_bytes()),
            1_700_000_002.5,
        )),
        valid(&raw_row(
            UUID_KEY.as_bytes(),
            b"unknown",
            None,
            1_700_000_003.75,
        )),
        SourceRecord {
            expires_at: Some(1_700_000_034.062_5),
            ..valid(&raw_row(
                b"Idempotency-Key: 'a' \"b\" ; c \\ d %_",
                b"in_progress",
                Some(b"null"),
                1_700_000_004.062_5,
            ))
        },
    ]
}

pub(crate) async fn story_ingest_exact(ledger: Arc<dyn Ledger>) {
    let (t, src) = tenant_and_source(&*ledger, "acme", "shop").await;
    let records = tricky_records();
    assert_eq!(records[0].response.as_deref(), Some(r#""done""#));
    let out = ledger
        .ingest(t.id, src.id, batch(records.clone()))
        .await
        .expect("ingest");
    assert_eq!(out.created, records.len() as u64);
    assert_eq!(out.statuses, vec![ItemStatus::Created; records.len()]);
    assert_eq!(
        (out.updated, out.unchanged, out.stale, out.quarantined),
        (0, 0, 0, 0)
    );

    let listed = list(&*ledger, t.id, everything()).await;
    assert_eq!(listed.len(), records.len());
    assert_eq!(
        keys(&listed),
        records
            .iter()
            .map(|r| r.key.clone())
            .collect::<BTreeSet<_>>()
    );

    for r in &records {
        let detail = ledger
            .get_effect(t.id, "shop", &r.key)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("key {:?} must be found by its exact bytes", r.key));
        let e = &detail.effect;
        assert_eq!(e.key.as_bytes(), r.key.as_bytes());
        assert_eq!(e.source, "shop");
        assert_eq!(e.state, r.state);
        assert_eq!(e.request_hash, r.request_hash);
        assert_eq!(e.response_json, r.response, "response of {:?}", r.key);
        assert_eq!(e.attempts, r.attempts);
        assert_eq!(e.created_at.to_bits(), r.created_at.to_bits());
        assert_eq!(e.updated_at.to_bits(), r.updated_at.to_bits());
        assert_eq!(
            e.expires_at.map(f64::to_bits),
            r.expires_at.map(f64::to_bits)
        );
        assert!(e.gone_at.is_none() && e.gone_reason.is_none());

        assert_eq!(
            kinds(&detail.history),
            ["first_seen"],
            "history of {:?}",
            r.key
        );
        let ev = &detail.history[0];
        assert_eq!(ev.origin, "scan");
        assert_eq!(ev.from_state, None);
        assert_eq!(ev.to_state.as_deref(), Some(r.state.as_str()));
        assert_eq!(ev.attempts, Some(r.attempts));
        assert_eq!(ev.source_updated_at, Some(r.updated_at));
    }

    let done = effect(&*ledger, t.id, "shop", "charge:v1:ORD-ü-日本-🦀").await;
    assert_eq!(
        done.response_json.as_deref(),
        Some(r#""done""#),
        "a JSON string response stays the JSON text \"done\""
    );
    let parsed = effect(
        &*ledger,
        t.id,
        "shop",
        r#"charge:v1:o'r";DROP TABLE effect;--"#,
    )
    .await;
    assert_eq!(parsed.operation.as_deref(), Some("charge"));
    assert_eq!(parsed.key_version.as_deref(), Some("v1"));
    assert_eq!(
        parsed.subject.as_deref(),
        Some(r#"o'r";DROP TABLE effect;--"#)
    );
    let uuid = effect(&*ledger, t.id, "shop", UUID_KEY).await;
    assert_eq!(
        (uuid.operation, uuid.subject, uuid.response_json),
        (None, None, None)
    );
    assert!(
        ledger
            .get_effect(t.id, "shop", "charge:v1:ORD-ü-日本")
            .await
            .unwrap()
            .is_none(),
        "a prefix of a key is another key"
    );
}

pub(crate) async fn story_ingest_again(ledger: Arc<dyn Ledger>) {
    let (t, src) = tenant_and_source(&*ledger, "acme", "shop").await;
    let records = tricky_records();
    ledger
        .ingest(t.id, src.id, batch(records.clone()))
        .await
        .unwrap();
    let before = list(&*ledger, t.id, everything()).await;

    let out = ledger
        .ingest(t.id, src.id, batch(records.clone()))
        .await
        .unwrap();
    assert_eq!(out.unchanged, records.len() as u64);
    assert_eq!(out.statuses, vec![ItemStatus::Unchanged; records.len()]);
    assert_eq!((out.created, out.updated, out.stale), (0, 0, 0));

    let after = list(&*ledger, t.id, everything()).await;
    assert_eq!(after.len(), records.len(), "re-reading never duplicates");
    for (b, a) in before.iter().zip(&after) {
        assert_eq!((b.id, &b.key), (a.id, &a.key));
        assert_eq!(
            b.last_changed_at, a.last_changed_at,
            "nothing changed for {:?}",
            a.key
        );
    }
    for r in &records {
        assert_eq!(
            history(&*ledger, t.id, "shop", &r.key).await.len(),
            1,
            "no new event for {:?}",
            r.key
        );
    }

    // A push that repeats itself within one batch stores one effect with one event.
    let twice = rec("charge:v1:ORD-2", State::Succeeded, 1_700_000_100.0);
    let out = ledger
        .ingest(t.id, src.id, batch(vec![twice.clone(), twice.clone()]))
        .await
        .unwrap();
    assert_eq!(out.statuses, [ItemStatus::Created, ItemStatus::Unchanged]);
    assert_eq!(history(&*ledger, t.id, "shop", &twice.key).await.len(), 1);
    assert_eq!(
        list(&*ledger, t.id, everything()).await.len(),
        records.len() + 1
    );
}

pub(crate) async fn story_ingest_changed(ledger: Arc<dyn Ledger>) {
    let (t, src) = tenant_and_source(&*ledger, "acme", "shop").await;
    let key = "charge:v1:ORD-17";
    let first = claim(key, 1_700_000_100.0, 1_700_000_130.0);
    ledger
        .ingest(t.id, src.id, batch(vec![first.clone()]))
        .await
        .unwrap();
    let seen = effect(&*ledger, t.id, "shop", key).await;

    let done = SourceRecord {
        state: State::Succeeded,
        response: Some(r#"{"amount":2000,"id":"ch_9"}"#.into()),
        attempts: 2,
        updated_at: 1_700_000_150.25,
        expires_at: None,
        ..first.clone()
    };
    let out = ledger
        .ingest(t.id, src.id, batch(vec![done.clone()]))
        .await
        .unwrap();
    assert_eq!(out.statuses, [ItemStatus::Updated]);
    assert_eq!(
        (out.created, out.updated, out.unchanged, out.stale),
        (0, 1, 0, 0)
    );

    let e = effect(&*ledger, t.id, "shop", key).await;
    assert_eq!(e.id, seen.id, "an update keeps the effect");
    assert_eq!(e.state, State::Succeeded);
    assert_eq!(e.response_json, done.response);
    assert_eq!(e.attempts, 2);
    assert!(e.reclaimed, "attempts > 1 is a reclaim");
    assert_eq!(e.updated_at, done.updated_at);
    assert_eq!(e.expires_at, None);
    assert_eq!(e.first_seen_at, seen.first_seen_at);
    assert!(e.last_changed_at >= seen.last_changed_at);

    let h = history(&*ledger, t.id, "shop", key).await;
    assert_eq!(kinds(&h), ["first_seen", "changed"]);
    assert_eq!(h[1].from_state.as_deref(), Some("in_progress"));
    assert_eq!(h[1].to_state.as_deref(), Some("succeeded"));
    assert_eq!(h[1].attempts, Some(2));
    assert_eq!(h[1].source_updated_at, Some(done.updated_at));
    assert_eq!(list(&*ledger, t.id, everything()).await.len(), 1);
}

/// `expect_new` lets a backend insert first (PostgreSQL does): all-new keys are stored with
/// their first-seen events; a batch with a key already there, or a key twice, comes out
/// exactly as without the hint (nothing doubled, the change recorded once).
pub(crate) async fn story_ingest_expect_new(ledger: Arc<dyn Ledger>) {
    let (t, src) = tenant_and_source(&*ledger, "acme", "shop").await;
    let hinted = |records| IngestBatch {
        expect_new: true,
        ..batch(records)
    };
    let a = rec("charge:v1:ORD-1", State::Unknown, 1_700_000_100.0);
    let b = claim("charge:v1:ORD-2:line-3", 1_700_000_100.0, 1_700_000_130.0);
    let out = ledger
        .ingest(t.id, src.id, hinted(vec![a.clone(), b.clone()]))
        .await
        .unwrap();
    assert_eq!(out.statuses, [ItemStatus::Created, ItemStatus::Created]);
    assert_eq!(
        kinds(&history(&*ledger, t.id, "shop", &b.key).await),
        ["first_seen"]
    );
    // The extra key part of a multi-part subject is indexed on the fast path too.
    let found = ledger.lookup(t.id, "line-3", 10).await.unwrap();
    assert_eq!(keys(&found), set(&[&b.key]));

    // Wrong hint: `a` is there already (and changed), `c` is new and comes twice.
    let a2 = SourceRecord {
        state: State::Succeeded,
        response: Some(r#"{"id":"ch_1"}"#.into()),
        updated_at: 1_700_000_200.0,
        ..a.clone()
    };
    let c = rec("refund:v1:ORD-1", State::Failed, 1_700_000_150.0);
    let out = ledger
        .ingest(
            t.id,
            src.id,
            hinted(vec![c.clone(), a2.clone(), c.clone(), b.clone()]),
        )
        .await
        .unwrap();
    assert_eq!(
        out.statuses,
        [
            ItemStatus::Created,
            ItemStatus::Updated,
            ItemStatus::Unchanged,
            ItemStatus::Unchanged
        ]
    );
    let all = list(&*ledger, t.id, everything()).await;
    assert_eq!(
        keys(&all),
        set(&[&a.key, &b.key, &c.key]),
        "nothing doubled"
    );
    assert_eq!(
        effect(&*ledger, t.id, "shop", &a.key).await.state,
        State::Succeeded
    );
    assert_eq!(
        kinds(&history(&*ledger, t.id, "shop", &a.key).await),
        ["first_seen", "changed"]
    );
    assert_eq!(
        kinds(&history(&*ledger, t.id, "shop", &c.key).await),
        ["first_seen"]
    );
    assert_eq!(
        kinds(&history(&*ledger, t.id, "shop", &b.key).await),
        ["first_seen"]
    );
}

pub(crate) async fn story_ingest_stale(ledger: Arc<dyn Ledger>) {
    let (t, src) = tenant_and_source(&*ledger, "acme", "shop").await;
    let key = "charge:v1:ORD-17";
    let newer = rec(key, State::Succeeded, 1_700_000_200.0);
    ledger
        .ingest(t.id, src.id, batch(vec![newer.clone()]))
        .await
        .unwrap();
    let stored = effect(&*ledger, t.id, "shop", key).await;

    for older in [
        claim(key, 1_700_000_100.0, 1_700_000_130.0),
        rec(key, State::Unknown, 1_700_000_199.999),
    ] {
        let out = ledger
            .ingest(t.id, src.id, batch(vec![older]))
            .await
            .unwrap();
        assert_eq!(out.statuses, [ItemStatus::Stale]);
        assert_eq!((out.stale, out.updated, out.created), (1, 0, 0));
    }
    let e = effect(&*ledger, t.id, "shop", key).await;
    assert_eq!(e.state, State::Succeeded);
    assert_eq!(e.updated_at, newer.updated_at);
    assert_eq!(e.response_json, newer.response);
    assert_eq!(e.expires_at, None);
    assert_eq!(e.last_changed_at, stored.last_changed_at);
    assert_eq!(
        kinds(&history(&*ledger, t.id, "shop", key).await),
        ["first_seen"]
    );
    let unresolved = list(
        &*ledger,
        t.id,
        EffectQuery {
            unresolved: Some(true),
            ..everything()
        },
    )
    .await;
    assert!(unresolved.is_empty(), "a stale `unknown` must not count");
}

pub(crate) async fn story_quarantine(ledger: Arc<dyn Ledger>) {
    let (t, src) = tenant_and_source(&*ledger, "acme", "shop").await;
    let good = vec![
        rec("charge:v1:A", State::Succeeded, 1_700_000_001.0),
        rec("charge:v1:B", State::Failed, 1_700_000_002.0),
        rec("charge:v1:C", State::Unknown, 1_700_000_003.0),
    ];
    let bad_state_1 = refused(&raw_row(b"charge:v1:D", b"partially_refunded", None, 1.0e9));
    let bad_state_2 = refused(&raw_row(b"charge:v1:E", b"SUCCEEDED", None, 1.0e9));
    let bad_json = refused(&raw_row(
        b"charge:v1:F",
        b"succeeded",
        Some(b"{not json"),
        1.0e9,
    ));
    assert_eq!(bad_state_1.reason, QuarantineReason::UnknownState);
    assert_eq!(bad_json.reason, QuarantineReason::InvalidJson);
    let rejected = vec![
        bad_state_1.clone(),
        bad_state_2,
        bad_json,
        bad_state_1, // the same hostile row twice in one read
    ];
    let input = good.len() + rejected.len();

    let mut expected = vec![
        ("shop".to_owned(), "invalid_json".to_owned(), 1),
        ("shop".to_owned(), "unknown_state".to_owned(), 2),
    ];
    expected.sort();
    for round in 0..2 {
        let out = ledger
            .ingest(
                t.id,
                src.id,
                IngestBatch {
                    rejected: rejected.clone(),
                    ..batch(good.clone())
                },
            )
            .await
            .unwrap();
        assert_eq!(
            out.stored() + out.quarantined,
            input as u64,
            "round {round}: every input row is stored or quarantined"
        );
        assert_eq!(out.stored(), good.len() as u64);
        let mut counts: Vec<(String, String, i64)> = ledger
            .quarantine_counts(t.id)
            .await
            .unwrap()
            .into_iter()
            .map(|c| (c.source, c.reason, c.count))
            .collect();
        counts.sort();
        assert_eq!(counts, expected, "round {round}: one entry per hostile row");
    }
    let entries = ledger.list_quarantine(t.id, src.id, 100).await.unwrap();
    assert_eq!(entries.len(), 3);
    let mut excerpts: Vec<&str> = entries.iter().map(|e| e.key_excerpt.as_str()).collect();
    excerpts.sort();
    assert_eq!(excerpts, ["charge:v1:D", "charge:v1:E", "charge:v1:F"]);
    assert!(
        entries
            .iter()
            .all(|e| !e.detail.is_empty() && e.origin == "scan")
    );
    assert_eq!(list(&*ledger, t.id, everything()).await.len(), good.len());
}

// 7. unresolved
pub(crate) async fn story_unresolved(ledger: Arc<dyn Ledger>) {
    let (t, src) = tenant_and_source(&*ledger, "acme", "shop").await;
    let now = time::now();
    let grace = 60.0;
    let records = vec![
        rec("charge:v1:unknown", State::Unknown, now - 1000.0),
        claim("charge:v1:abandoned", now - 20_000.0, now - 10_000.0),
        claim("charge:v1:leased", now - 5.0, now + 3600.0),
        claim("charge:v1:in-grace", now - 60.0, now - 30.0),
        SourceRecord {
            expires_at: None,
            ..rec("charge:v1:no-lease", State::InProgress, now - 20_000.0)
        },
        SourceRecord {
            expires_at: Some(now - 10_000.0),
            ..rec("charge:v1:succeeded", State::Succeeded, now - 20_000.0)
        },
        SourceRecord {
            expires_at: Some(now - 10_000.0),
            ..rec("charge:v1:failed", State::Failed, now - 20_000.0)
        },
    ];
    ledger
        .ingest(
            t.id,
            src.id,
            IngestBatch {
                abandoned_after_secs: grace,
                ..batch(records.clone())
            },
        )
        .await
        .unwrap();

    let at = |now: f64, unresolved: Option<bool>| EffectQuery {
        unresolved,
        now,
        ..everything()
    };
    let yes = list(&*ledger, t.id, at(now, Some(true))).await;
    assert_eq!(
        keys(&yes),
        set(&["charge:v1:unknown", "charge:v1:abandoned"])
    );
    for e in &yes {
        match e.key.as_str() {
            "charge:v1:unknown" => {
                assert_eq!(e.unresolved_kind, Some(UnresolvedKind::Unknown));
                assert_eq!(e.unresolved_since, Some(records[0].updated_at));
            }
            _ => {
                assert_eq!(e.unresolved_kind, Some(UnresolvedKind::Abandoned));
                assert_eq!(
                    e.unresolved_since, records[1].expires_at,
                    "since the lease ended"
                );
            }
        }
    }

    let no = list(&*ledger, t.id, at(now, Some(false))).await;
    assert_eq!(
        keys(&no),
        set(&[
            "charge:v1:leased",
            "charge:v1:in-grace",
            "charge:v1:no-lease",
            "charge:v1:succeeded",
            "charge:v1:failed",
        ]),
        "unresolved=false is the complement"
    );
    assert!(
        no.iter()
            .all(|e| e.unresolved_kind.is_none() && e.unresolved_since.is_none())
    );

    let all = list(&*ledger, t.id, at(now, None)).await;
    assert_eq!(all.len(), records.len());
    for e in &all {
        assert_eq!(
            e.unresolved_kind.is_some(),
            yes.iter().any(|y| y.id == e.id),
            "an unfiltered listing derives the same kind for {}",
            e.key
        );
    }
    let detail = effect(&*ledger, t.id, "shop", "charge:v1:abandoned").await;
    assert_eq!(detail.unresolved_kind, Some(UnresolvedKind::Abandoned));
    let detail = effect(&*ledger, t.id, "shop", "charge:v1:leased").await;
    assert_eq!(detail.unresolved_kind, None);

    // A day later every expired lease is abandoned; terminal states still never are.
    let later = now + 86_400.0;
    let yes = list(&*ledger, t.id, at(later, Some(true))).await;
    assert_eq!(
        keys(&yes),
        set(&[
            "charge:v1:unknown",
            "charge:v1:abandoned",
            "charge:v1:leased",
            "charge:v1:in-grace",
        ])
    );
    let no = list(&*ledger, t.id, at(later, Some(false))).await;
    assert_eq!(
        keys(&no),
        set(&[
            "charge:v1:no-lease",
            "charge:v1:succeeded",
            "charge:v1:failed"
        ])
    );
}

// 8. mark_gone
pub(crate) async fn story_mark_gone(ledger: Arc<dyn Ledger>) {
    let (t, src) = tenant_and_source(&*ledger, "acme", "shop").await;
    let now = time::now();
    let done = rec("charge:v1:done", State::Succeeded, now - 500.0);
    let held = claim("charge:v1:held", now - 20_000.0, now - 10_000.0);
    let lost = rec("charge:v1:lost", State::Unknown, now - 400.0);
    let stays = rec("charge:v1:stays", State::Failed, now - 300.0);
    ledger
        .ingest(
            t.id,
            src.id,
            batch(vec![
                done.clone(),
                held.clone(),
                lost.clone(),
                stays.clone(),
            ]),
        )
        .await
        .unwrap();
    let before = ledger.present_keys(t.id, src.id, 0, 100).await.unwrap();
    assert_eq!(before.len(), 4);

    let at = now - 10.0;
    let gone = ledger
        .mark_gone(
            t.id,
            src.id,
            &[
                done.key.clone(),
                held.key.clone(),
                lost.key.clone(),
                "charge:v1:never-seen".to_owned(),
            ],
            at,
            Origin::FullScan,
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        gone,
        [
            (done.key.clone(), Disappearance::Swept),
            (held.key.clone(), Disappearance::Released),
            (lost.key.clone(), Disappearance::Vanished),
        ]
    );

    for (key, reason, from) in [
        (&done.key, "swept", "succeeded"),
        (&held.key, "released", "in_progress"),
        (&lost.key, "vanished", "unknown"),
    ] {
        let d = ledger
            .get_effect(t.id, "shop", key)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{key} must be kept after it left the source"));
        assert_eq!(d.effect.gone_at, Some(at));
        assert_eq!(d.effect.gone_reason.as_deref(), Some(reason));
        assert_eq!(kinds(&d.history), ["first_seen", reason]);
        let ev = &d.history[1];
        assert_eq!(ev.origin, "full_scan");
        assert_eq!(ev.from_state.as_deref(), Some(from));
        assert_eq!(ev.observed_at, at);
    }
    let present: Vec<String> = ledger
        .present_keys(t.id, src.id, 0, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|(_, k)| k)
        .collect();
    assert_eq!(present, [stays.key.as_str()]);

    // A released claim is not abandoned; a vanished `unknown` is still unresolved.
    let unresolved = list(
        &*ledger,
        t.id,
        EffectQuery {
            unresolved: Some(true),
            ..everything()
        },
    )
    .await;
    assert_eq!(keys(&unresolved), set(&["charge:v1:lost"]));
    let resolved = list(
        &*ledger,
        t.id,
        EffectQuery {
            unresolved: Some(false),
            ..everything()
        },
    )
    .await;
    assert_eq!(
        keys(&resolved),
        set(&["charge:v1:done", "charge:v1:held", "charge:v1:stays"])
    );
    let released = effect(&*ledger, t.id, "shop", &held.key).await;
    assert_eq!(released.unresolved_kind, None);

    // Marking again finds nothing still present and writes nothing.
    let again = ledger
        .mark_gone(
            t.id,
            src.id,
            std::slice::from_ref(&done.key),
            at + 1.0,
            Origin::FullScan,
            None,
        )
        .await
        .unwrap();
    assert!(again.is_empty());
    assert_eq!(history(&*ledger, t.id, "shop", &done.key).await.len(), 2);

    // The same row read again: it came back.
    let out = ledger
        .ingest(t.id, src.id, batch(vec![done.clone()]))
        .await
        .unwrap();
    assert_eq!(out.statuses, [ItemStatus::Updated]);
    let d = ledger
        .get_effect(t.id, "shop", &done.key)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.effect.gone_at, None);
    assert_eq!(d.effect.gone_reason, None);
    assert_eq!(kinds(&d.history), ["first_seen", "swept", "reappeared"]);
    let mut present: Vec<String> = ledger
        .present_keys(t.id, src.id, 0, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|(_, k)| k)
        .collect();
    present.sort();
    assert_eq!(present, [done.key.clone(), stays.key.clone()]);

    // present_keys pages by id.
    let page1 = ledger.present_keys(t.id, src.id, 0, 1).await.unwrap();
    assert_eq!(page1.len(), 1);
    let page2 = ledger
        .present_keys(t.id, src.id, page1[0].0, 1)
        .await
        .unwrap();
    assert_eq!(page2.len(), 1);
    assert!(page2[0].0 > page1[0].0);
    let page3 = ledger
        .present_keys(t.id, src.id, page2[0].0, 1)
        .await
        .unwrap();
    assert!(page3.is_empty());
}

// 9. lookup
pub(crate) async fn story_lookup(ledger: Arc<dyn Ledger>) {
    let (a, shop_a) = tenant_and_source(&*ledger, "acme", "shop").await;
    let billing_a = ledger
        .add_source(a.id, push_source("billing"))
        .await
        .unwrap();
    let (b, shop_b) = tenant_and_source(&*ledger, "globex", "shop").await;
    let t0 = 1_700_000_000.0;
    ledger
        .ingest(
            a.id,
            shop_a.id,
            batch(vec![
                rec("charge:v1:ORD-17", State::Succeeded, t0),
                rec("charge:v1:ORD-170", State::Succeeded, t0),
                rec("charge:v1:XORD-17", State::Succeeded, t0),
                rec("charge:v1:ord-17", State::Succeeded, t0),
                rec("refund:v1:cus_9:ORD-17", State::Succeeded, t0),
                rec(UUID_KEY, State::Unknown, t0),
            ]),
        )
        .await
        .unwrap();
    ledger
        .ingest(
            a.id,
            billing_a.id,
            batch(vec![rec("refund:v1:ORD-17", State::Failed, t0)]),
        )
        .await
        .unwrap();
    ledger
        .ingest(
            b.id,
            shop_b.id,
            batch(vec![
                rec("charge:v1:ORD-17", State::Succeeded, t0),
                rec("refund:v1:ORD-17", State::Succeeded, t0),
                rec("note:v1:cus_9:ORD-17", State::Succeeded, t0),
                rec("3f2b8c1e-9a4d-4c1b-8e7f-0a1b2c3d4e5f", State::Succeeded, t0),
            ]),
        )
        .await
        .unwrap();

    let found = ledger.lookup(a.id, "ORD-17", 100).await.unwrap();
    assert_eq!(
        keys(&found),
        set(&[
            "charge:v1:ORD-17",
            "refund:v1:ORD-17",
            "refund:v1:cus_9:ORD-17"
        ]),
        "a key part matches exactly: not ORD-170, XORD-17 or ord-17"
    );
    assert_eq!(found.len(), 3, "each effect once");
    let mine: BTreeSet<(String, String)> = list(&*ledger, a.id, everything())
        .await
        .into_iter()
        .map(|e| (e.source, e.key))
        .collect();
    for e in &found {
        assert!(
            mine.contains(&(e.source.clone(), e.key.clone())),
            "{} / {} is not acme's",
            e.source,
            e.key
        );
    }
    let sources: BTreeSet<&str> = found.iter().map(|e| e.source.as_str()).collect();
    assert_eq!(sources, BTreeSet::from(["billing", "shop"]));

    let uuid = ledger.lookup(a.id, UUID_KEY, 100).await.unwrap();
    assert_eq!(keys(&uuid), set(&[UUID_KEY]));
    assert_eq!(uuid.len(), 1, "acme's UUID only, not globex's");
    assert_eq!(uuid[0].state, State::Unknown);

    let exact = ledger.lookup(a.id, "charge:v1:ORD-17", 100).await.unwrap();
    assert_eq!(keys(&exact), set(&["charge:v1:ORD-17"]));
    assert_eq!(exact.len(), 1);
    let cus = ledger.lookup(a.id, "cus_9", 100).await.unwrap();
    assert_eq!(keys(&cus), set(&["refund:v1:cus_9:ORD-17"]));
    assert!(ledger.lookup(a.id, "ORD-1", 100).await.unwrap().is_empty());
    assert!(ledger.lookup(a.id, "ORD", 100).await.unwrap().is_empty());
    assert!(ledger.lookup(a.id, "%", 100).await.unwrap().is_empty());
    assert_eq!(ledger.lookup(a.id, "ORD-17", 2).await.unwrap().len(), 2);

    let theirs = ledger.lookup(b.id, "ORD-17", 100).await.unwrap();
    assert_eq!(
        keys(&theirs),
        set(&[
            "charge:v1:ORD-17",
            "refund:v1:ORD-17",
            "note:v1:cus_9:ORD-17"
        ])
    );
    assert!(theirs.iter().all(|e| e.source == "shop"));
    assert!(
        ledger
            .lookup(b.id, "XORD-17", 100)
            .await
            .unwrap()
            .is_empty(),
        "another tenant's effects are never found"
    );
}

// 11. listing filters and pages
pub(crate) async fn story_list_filters(ledger: Arc<dyn Ledger>) {
    let (t, shop) = tenant_and_source(&*ledger, "acme", "shop").await;
    let billing = ledger
        .add_source(t.id, push_source("billing"))
        .await
        .unwrap();
    let now = time::now();
    ledger
        .ingest(
            t.id,
            shop.id,
            batch(vec![
                rec("charge:v1:1", State::Succeeded, 1_700_000_100.0),
                rec("charge:v1:2", State::Failed, 1_700_000_200.0),
                rec("refund:v1:3", State::Succeeded, 1_700_000_300.0),
                rec("send_receipt:v1:4", State::Unknown, 1_700_000_400.0),
                claim("charge:v1:5", 1_700_000_500.0, now + 3600.0),
            ]),
        )
        .await
        .unwrap();
    ledger
        .ingest(
            t.id,
            billing.id,
            batch(vec![
                rec("charge:v1:6", State::Succeeded, 1_700_000_600.0),
                rec(UUID_KEY, State::Succeeded, 1_700_000_700.0),
            ]),
        )
        .await
        .unwrap();

    let q = |f: fn(&mut EffectQuery)| {
        let mut q = everything();
        f(&mut q);
        q
    };
    let cases: Vec<(EffectQuery, Vec<&str>)> = vec![
        (
            q(|q| q.source = Some("shop".into())),
            vec![
                "charge:v1:1",
                "charge:v1:2",
                "refund:v1:3",
                "send_receipt:v1:4",
                "charge:v1:5",
            ],
        ),
        (
            q(|q| q.source = Some("billing".into())),
            vec!["charge:v1:6", UUID_KEY],
        ),
        (q(|q| q.source = Some("nope".into())), vec![]),
        (
            q(|q| q.state = Some(State::Succeeded)),
            vec!["charge:v1:1", "refund:v1:3", "charge:v1:6", UUID_KEY],
        ),
        (
            q(|q| q.state = Some(State::InProgress)),
            vec!["charge:v1:5"],
        ),
        (
            q(|q| q.operation = Some("charge".into())),
            vec!["charge:v1:1", "charge:v1:2", "charge:v1:5", "charge:v1:6"],
        ),
        (
            q(|q| q.operation = Some("send_receipt".into())),
            vec!["send_receipt:v1:4"],
        ),
        (
            q(|q| q.updated_since = Some(1_700_000_350.0)),
            vec!["send_receipt:v1:4", "charge:v1:5", "charge:v1:6", UUID_KEY],
        ),
        (q(|q| q.updated_since = Some(1_800_000_000.0)), vec![]),
        (
            q(|q| {
                q.source = Some("shop".into());
                q.operation = Some("charge".into());
                q.state = Some(State::Succeeded);
            }),
            vec!["charge:v1:1"],
        ),
    ];
    for (query, want) in cases {
        let got = list(&*ledger, t.id, query.clone()).await;
        assert_eq!(keys(&got), set(&want), "{query:?}");
        assert_eq!(got.len(), want.len(), "{query:?}");
        assert!(
            got.windows(2).all(|w| w[0].id < w[1].id),
            "ordered by id: {query:?}"
        );
    }

    // Pages of 2 over the 5 shop rows: 2 + 2 + 1, then nothing; no overlap, no gap.
    let mut seen: Vec<Effect> = Vec::new();
    let mut after = None;
    let mut sizes = Vec::new();
    loop {
        let page = list(
            &*ledger,
            t.id,
            EffectQuery {
                source: Some("shop".into()),
                after_id: after,
                limit: 2,
                ..everything()
            },
        )
        .await;
        if page.is_empty() {
            break;
        }
        assert!(sizes.len() < 5, "paging must end");
        sizes.push(page.len());
        after = Some(page.last().unwrap().id);
        seen.extend(page);
    }
    assert_eq!(sizes, [2, 2, 1]);
    let ids: BTreeSet<i64> = seen.iter().map(|e| e.id).collect();
    assert_eq!(ids.len(), 5, "no effect on two pages");
    assert!(seen.windows(2).all(|w| w[0].id < w[1].id));
    assert_eq!(
        keys(&seen),
        keys(&list(&*ledger, t.id, q(|q| q.source = Some("shop".into()))).await)
    );
}

/// A first scan's batch as large as a scanner sends (PostgreSQL inserts these and derives
/// their history in one statement): every byte and number comes back as given, whatever a
/// text encoding would have to escape (backslashes, `\N`, tabs, newlines, carriage
/// returns, quotes), with NULLs kept NULL, the first-seen history of each effect, and the
/// extra key parts indexed; a wrong hint in a batch of that size still comes out as an
/// ordinary batch would.
pub(crate) async fn story_ingest_expect_new_large(ledger: Arc<dyn Ledger>) {
    let (t, src) = tenant_and_source(&*ledger, "acme", "shop").await;
    let hinted = |records| IngestBatch {
        expect_new: true,
        ..batch(records)
    };
    let n = 700usize;
    let records: Vec<SourceRecord> = (0..n)
        .map(|i| {
            let key = match i % 4 {
                0 => format!("charge:v1:ORD-{i}"),
                1 => format!("charge:v1:cus_{i}:line-{i}"),
                2 => format!("refund:v2:back\\slash-\\N-'{i}'"),
                _ => format!("opaque key {i} \u{e9}\u{1F4B3}"),
            };
            let state = [
                State::Succeeded,
                State::Unknown,
                State::InProgress,
                State::Failed,
            ][i % 4];
            SourceRecord {
                key,
                state,
                request_hash: format!("1:{i:064x}"),
                response: (i % 3 != 0).then(|| {
                    format!("{{\"note\":\"a\\tb \\\\N \\\\\\\\ {i}\",\n\t\"id\":\"ch_{i}\"}}\r\n")
                }),
                attempts: 1 + (i % 5) as i64,
                created_at: 1_700_000_000.123_456_7 + i as f64,
                updated_at: 1_700_000_000.987_654_3 + i as f64 * 1.5,
                expires_at: (state == State::InProgress).then(|| 1_800_000_000.5 + i as f64 / 7.0),
            }
        })
        .collect();
    let out = ledger
        .ingest(t.id, src.id, hinted(records.clone()))
        .await
        .unwrap();
    assert_eq!(out.created, n as u64, "{out:?}");
    // Each first sight is an event of its own, whichever way the ledger keeps it.
    let mut first_ids = BTreeSet::new();
    for (i, r) in records.iter().enumerate() {
        let e = effect(&*ledger, t.id, "shop", &r.key).await;
        assert_eq!(e.key, r.key);
        assert_eq!(e.state, r.state, "{}", r.key);
        assert_eq!(e.request_hash, r.request_hash);
        assert_eq!(e.response_json, r.response, "{}", r.key);
        assert_eq!(e.attempts, r.attempts);
        assert_eq!(e.created_at.to_bits(), r.created_at.to_bits(), "{}", r.key);
        assert_eq!(e.updated_at.to_bits(), r.updated_at.to_bits(), "{}", r.key);
        assert_eq!(
            e.expires_at.map(f64::to_bits),
            r.expires_at.map(f64::to_bits)
        );
        if i % 4 == 1 {
            assert_eq!(e.operation.as_deref(), Some("charge"));
            assert_eq!(
                e.subject.as_deref(),
                Some(format!("cus_{i}:line-{i}").as_str())
            );
        }
        if i % 4 == 3 {
            assert_eq!(e.operation, None, "an opaque key has no operation");
        }
        let h = history(&*ledger, t.id, "shop", &r.key).await;
        assert_eq!(kinds(&h), ["first_seen"], "{}", r.key);
        assert!(first_ids.insert(h[0].id), "event id {} twice", h[0].id);
        assert_eq!(h[0].origin, "scan");
        assert_eq!(h[0].attempts, Some(r.attempts));
        assert_eq!(h[0].to_state.as_deref(), Some(r.state.as_str()));
        assert_eq!(
            h[0].source_updated_at.map(f64::to_bits),
            Some(r.updated_at.to_bits())
        );
    }
    let found = ledger.lookup(t.id, "line-5", 10).await.unwrap();
    assert_eq!(keys(&found), set(&["charge:v1:cus_5:line-5"]));

    // Wrong hint at the same size: one key is there already and changed.
    let mut again: Vec<SourceRecord> = (n..2 * n)
        .map(|i| {
            rec(
                &format!("charge:v1:ORD-{i}"),
                State::Unknown,
                1_700_000_500.0,
            )
        })
        .collect();
    again.push(SourceRecord {
        state: State::Succeeded,
        response: Some(r#"{"id":"ch_1"}"#.into()),
        updated_at: 1_700_009_999.0,
        ..records[1].clone()
    });
    let out = ledger.ingest(t.id, src.id, hinted(again)).await.unwrap();
    assert_eq!((out.created, out.updated), (n as u64, 1), "{out:?}");
    let h = history(&*ledger, t.id, "shop", &records[1].key).await;
    assert_eq!(kinds(&h), ["first_seen", "changed"]);
    assert_eq!(h[0].to_state.as_deref(), Some(records[1].state.as_str()));
    assert_eq!(
        h[0].source_updated_at.map(f64::to_bits),
        Some(records[1].updated_at.to_bits()),
        "the first sight is as it was, not as the row is now"
    );
    assert!(
        !first_ids.contains(&h[1].id),
        "the change has an id of its own"
    );
    let all = ledger.present_keys(t.id, src.id, 0, 10_000).await.unwrap();
    assert_eq!(all.len(), 2 * n, "nothing doubled");
}

/// The ids a row's recorded result names are found by the lookup like an order id: written
/// when the row is first stored, and when a later ingest brings its result (a claim that
/// completed); in the row's tenant only.
pub(crate) async fn story_lookup_by_recorded_id(ledger: Arc<dyn Ledger>) {
    let (a, src) = tenant_and_source(&*ledger, "acme", "shop").await;
    let (b, b_src) = tenant_and_source(&*ledger, "globex", "shop").await;
    let mut done = rec("charge:v1:ORD-1", State::Succeeded, 100.0);
    done.response = Some(r#"{"charge_id": "ch_rec_1", "amount": 2000}"#.into());
    let claim = rec("charge:v1:ORD-2", State::Unknown, 100.0);
    ledger
        .ingest(a.id, src.id, batch(vec![done, claim]))
        .await
        .unwrap();
    let keys = |found: Vec<reckon_ledger::Effect>| -> Vec<String> {
        found.into_iter().map(|e| e.key).collect()
    };
    assert_eq!(
        keys(ledger.lookup(a.id, "ch_rec_1", 10).await.unwrap()),
        ["charge:v1:ORD-1"]
    );
    assert!(
        ledger
            .lookup(a.id, "pi_rec_2", 10)
            .await
            .unwrap()
            .is_empty()
    );
    let mut later = rec("charge:v1:ORD-2", State::Succeeded, 200.0);
    later.response = Some(r#"{"id": "pi_rec_2", "latest_charge": "ch_rec_2"}"#.into());
    ledger
        .ingest(a.id, src.id, batch(vec![later]))
        .await
        .unwrap();
    for id in ["pi_rec_2", "ch_rec_2"] {
        assert_eq!(
            keys(ledger.lookup(a.id, id, 10).await.unwrap()),
            ["charge:v1:ORD-2"],
            "{id}"
        );
    }
    // The same ingest again writes nothing twice.
    let mut again = rec("charge:v1:ORD-2", State::Succeeded, 300.0);
    again.response = Some(r#"{"id": "pi_rec_2", "latest_charge": "ch_rec_2"}"#.into());
    ledger
        .ingest(a.id, src.id, batch(vec![again]))
        .await
        .unwrap();
    assert_eq!(ledger.lookup(a.id, "pi_rec_2", 10).await.unwrap().len(), 1);
    assert!(
        ledger
            .lookup(b.id, "ch_rec_1", 10)
            .await
            .unwrap()
            .is_empty()
    );
    let _ = b_src;
}

/// Rows stored before ingest kept their recorded ids get them once, at the next migrate,
/// per tenant; the job is then struck off.
pub(crate) async fn story_recorded_ids_backfill(ledger: Arc<dyn Ledger>, raw: RawDb) {
    let mut ids = Vec::new();
    for slug in ["acme", "globex"] {
        let (t, s) = tenant_and_source(&*ledger, slug, "shop").await;
        let mut r = rec(&format!("charge:v1:ORD-{slug}"), State::Succeeded, 100.0);
        r.response = Some(format!(r#"{{"charge_id": "ch_old_{slug}"}}"#));
        ledger.ingest(t.id, s.id, batch(vec![r])).await.unwrap();
        ids.push(t.id);
    }
    // As an older version left them: effects, no recorded ids as parts, the job pending.
    raw.exec(
        "DELETE FROM effect_key_part WHERE part LIKE 'ch_old_%'; \
         INSERT INTO pending_backfill (name) VALUES ('recorded_ids')",
    )
    .await;
    assert!(
        ledger
            .lookup(ids[0], "ch_old_acme", 10)
            .await
            .unwrap()
            .is_empty()
    );
    ledger.migrate().await.unwrap();
    assert_eq!(
        ledger
            .lookup(ids[0], "ch_old_acme", 10)
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        ledger
            .lookup(ids[1], "ch_old_globex", 10)
            .await
            .unwrap()
            .len(),
        1
    );
    assert!(
        ledger
            .lookup(ids[1], "ch_old_acme", 10)
            .await
            .unwrap()
            .is_empty(),
        "per tenant"
    );
    // Struck off: parts removed now stay removed by a later migrate.
    raw.exec("DELETE FROM effect_key_part WHERE part LIKE 'ch_old_%'")
        .await;
    ledger.migrate().await.unwrap();
    assert!(
        ledger
            .lookup(ids[0], "ch_old_acme", 10)
            .await
            .unwrap()
            .is_empty()
    );
}
