//! Claims, attempts and resolutions.

use super::*;

/// Tenant `acme` with `keys` ingested as unknown (`now - 100`) and all claimed by `w`.
async fn claimed_unknowns(
    ledger: &dyn Ledger,
    keys: &[&str],
    now: f64,
) -> (reckon_ledger::Tenant, Vec<reckon_ledger::Claim>) {
    let (t, s) = tenant_and_source(ledger, "acme", "shop").await;
    let recs = keys.iter().map(|k| rec(k, State::Unknown, now - 100.0));
    ledger
        .ingest(t.id, s.id, batch(recs.collect()))
        .await
        .unwrap();
    let claims = ledger.claim_due(t.id, "w", now, 60.0, 10).await.unwrap();
    (t, claims)
}

/// A ledger whose reconciler concluded `applied` under the rule before verdicts were
/// decided on money (no certificate: no complete check for a second payment) is upgraded:
/// those verdicts are retracted into `resolution_retracted`, the effects are due for a
/// re-check at once and marked provisional; verdicts of the current rule, `not_applied`
/// and people's resolutions stay.
pub(crate) async fn story_rc_upgrade_verdicts(ledger: Arc<dyn Ledger>, raw: RawDb) {
    let now = time::now();
    let keys = [
        "charge:v1:old",
        "charge:v1:new",
        "charge:v1:none",
        "charge:v1:hand",
    ];
    let (t, claims) = claimed_unknowns(&*ledger, &keys, now).await;
    let id = |k: &str| claims.iter().find(|c| c.effect.key == k).unwrap().effect.id;
    let record = |key: &str, outcome: &str, evidence: serde_json::Value| {
        let mut a = attempt(outcome, now, now + 3600.0, true);
        a.evidence = evidence;
        let ledger = ledger.clone();
        let eid = id(key);
        async move { ledger.record_attempt(t.id, eid, "w", a).await.unwrap() }
    };
    record(
        keys[0],
        "applied",
        serde_json::json!({"classification": {"outcome": "applied", "certificate": null,
            "objects": [{"id": "pi_1", "status": "requires_payment_method", "money_moved": false}]}}),
    )
    .await;
    record(
        keys[1],
        "applied",
        serde_json::json!({"classification": {"outcome": "applied",
            "certificate": {"method": "stripe.list.payment_intents"}}}),
    )
    .await;
    record(
        keys[2],
        "not_applied",
        serde_json::json!({"classification": {"outcome": "not_applied", "certificate": null}}),
    )
    .await;
    ledger
        .resolve_by_hand(
            t.id,
            id(keys[3]),
            reckon_ledger::NewResolution {
                outcome: reckon_ledger::Outcome::Applied,
                author: "user:finance@acme.test".into(),
                note: Some("seen in the Stripe dashboard".into()),
                evidence: serde_json::json!({}),
            },
        )
        .await
        .unwrap();
    drop(ledger);

    // The upgrade: the migration runs as it does on a ledger written by the old rule.
    raw.exec("DELETE FROM _sqlx_migrations WHERE version = 18; DROP TABLE resolution_retracted;")
        .await;
    let ledger = raw.reopen().await;
    let view = |key: &str| {
        let ledger = ledger.clone();
        let eid = id(key);
        async move { ledger.reconcile_view(t.id, eid).await.unwrap() }
    };
    let old = view(keys[0]).await;
    assert!(old.resolution.is_none(), "{old:?}");
    let st = old.state.expect("a reconcile state");
    assert!(st.non_final, "shown as provisional until re-checked");
    assert!(st.next_attempt_at <= time::now(), "due at once: {st:?}");
    assert_eq!(old.attempts.len(), 1, "the attempt stays in the history");
    for k in &keys[1..] {
        assert!(
            view(k).await.resolution.is_some(),
            "{k} keeps its resolution"
        );
    }
    let due = ledger
        .claim_due(t.id, "w2", time::now(), 60.0, 10)
        .await
        .unwrap();
    assert_eq!(
        due.iter()
            .map(|c| c.effect.key.as_str())
            .collect::<Vec<_>>(),
        vec![keys[0]],
        "only the retracted verdict is looked up again"
    );
    let kept: Vec<String> = raw
        .cells("resolution_retracted")
        .await
        .into_iter()
        .filter(|(c, _)| c == "outcome" || c == "reason")
        .map(|(_, v)| String::from_utf8(v).unwrap())
        .collect();
    assert_eq!(kept.len(), 2, "{kept:?}");
    assert!(kept.contains(&"applied".to_owned()));
}

/// A ledger whose reconciler concluded `not_applied` from Stripe's window lists alone (a
/// certificate without a witness) is upgraded: those verdicts are retracted into
/// `resolution_retracted` and the effects are due for a lookup at once, shown as "not found
/// so far"; a witnessed one, a lookup by key (the http protocol), one already written back
/// and people's resolutions stay.
pub(crate) async fn story_rc_upgrade_absence(ledger: Arc<dyn Ledger>, raw: RawDb) {
    let now = time::now();
    let keys = [
        "charge:v1:lists-only",
        "charge:v1:witnessed",
        "charge:v1:by-key",
        "charge:v1:hand",
    ];
    let (t, claims) = claimed_unknowns(&*ledger, &keys, now).await;
    let id = |k: &str| claims.iter().find(|c| c.effect.key == k).unwrap().effect.id;
    let record = |key: &str, certificate: serde_json::Value| {
        let mut a = attempt("not_applied", now, now + 3600.0, true);
        a.evidence = serde_json::json!({"classification": {"outcome": "not_applied",
            "certificate": certificate}});
        let ledger = ledger.clone();
        let eid = id(key);
        async move { ledger.record_attempt(t.id, eid, "w", a).await.unwrap() }
    };
    record(
        keys[0],
        serde_json::json!({"method": "stripe.list.payment_intents+charges", "pages": 0,
            "request_ids": []}),
    )
    .await;
    record(
        keys[1],
        serde_json::json!({"method": "stripe.list.payment_intents+charges",
            "witness": "stripe.events read whole"}),
    )
    .await;
    record(keys[2], serde_json::json!({"method": "http.lookup"})).await;
    ledger
        .resolve_by_hand(
            t.id,
            id(keys[3]),
            reckon_ledger::NewResolution {
                outcome: reckon_ledger::Outcome::NotApplied,
                author: "user:finance@acme.test".into(),
                note: Some("checked in the Stripe dashboard".into()),
                evidence: serde_json::json!({}),
            },
        )
        .await
        .unwrap();
    drop(ledger);

    // The upgrade: the migration runs as it does on a ledger written by the old rule.
    raw.exec("DELETE FROM _sqlx_migrations WHERE version = 28;")
        .await;
    let ledger = raw.reopen().await;
    let view = |key: &str| {
        let ledger = ledger.clone();
        let eid = id(key);
        async move { ledger.reconcile_view(t.id, eid).await.unwrap() }
    };
    let old = view(keys[0]).await;
    assert!(old.resolution.is_none(), "{old:?}");
    let st = old.state.expect("a reconcile state");
    assert!(st.non_final, "shown as not proven until looked up again");
    assert_eq!(st.last_outcome, Some(reckon_ledger::Outcome::NotApplied));
    assert!(st.next_attempt_at <= time::now(), "due at once: {st:?}");
    assert_eq!(old.attempts.len(), 1, "the attempt stays in the history");
    for k in &keys[1..] {
        assert!(
            view(k).await.resolution.is_some(),
            "{k} keeps its resolution"
        );
    }
    let due = ledger
        .claim_due(t.id, "w2", time::now(), 60.0, 10)
        .await
        .unwrap();
    assert_eq!(
        due.iter()
            .map(|c| c.effect.key.as_str())
            .collect::<Vec<_>>(),
        vec![keys[0]],
        "only the retracted verdict is looked up again"
    );
    let reasons: Vec<String> = raw
        .cells("resolution_retracted")
        .await
        .into_iter()
        .filter(|(c, _)| c == "reason")
        .map(|(_, v)| String::from_utf8(v).unwrap())
        .collect();
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert!(reasons[0].contains("no witness"), "{reasons:?}");
}

/// A ledger that resolved effects before the backlog was flagged on the effect row is
/// upgraded: its resolved effects leave the queue, the counts, the metrics and the claims
/// at once, the open one stays, and a resolution recorded afterwards takes its effect out.
pub(crate) async fn story_rc_upgrade_backlog(ledger: Arc<dyn Ledger>, raw: RawDb) {
    let (t, s) = tenant_and_source(&*ledger, "acme", "shop").await;
    let now = time::now();
    let keys = [
        "charge:v1:open",
        "charge:v1:hand",
        "charge:v1:rc",
        "charge:v1:later",
    ];
    let recs = keys.iter().map(|k| rec(k, State::Unknown, now - 100.0));
    ledger
        .ingest(t.id, s.id, batch(recs.collect()))
        .await
        .unwrap();
    let claims = ledger.claim_due(t.id, "w", now, 60.0, 10).await.unwrap();
    let id = |k: &str| claims.iter().find(|c| c.effect.key == k).unwrap().effect.id;
    let by_hand = reckon_ledger::NewResolution {
        outcome: reckon_ledger::Outcome::NotApplied,
        author: "user:finance@acme.test".into(),
        note: Some("refunded by hand".into()),
        evidence: serde_json::json!({}),
    };
    ledger
        .resolve_by_hand(t.id, id(keys[1]), by_hand.clone())
        .await
        .unwrap();
    let a = attempt("not_applied", now, now + 3600.0, true);
    ledger
        .record_attempt(t.id, id(keys[2]), "w", a)
        .await
        .unwrap();
    for k in [keys[0], keys[3]] {
        let a = attempt("indeterminate", now, now - 1.0, false);
        ledger.record_attempt(t.id, id(k), "w", a).await.unwrap();
    }
    drop(ledger);

    // The ledger as it was before: no flag, no trigger, indexes of the same names, and no
    // reconciler's queue (0033, whose triggers read the flag; made again after 0023).
    let queue = crate::queue::without_the_queue(&raw);
    let (triggers, function) = match raw {
        RawDb::Sqlite(_) => (
            "DROP TRIGGER resolution_marks_effect; DROP TRIGGER resolution_unmarks_effect;",
            "",
        ),
        RawDb::Postgres(_) => (
            "DROP TRIGGER resolution_marks_effect ON resolution;",
            "DROP FUNCTION reckon_mark_resolved();",
        ),
    };
    raw.exec(&format!(
        "{queue} {triggers} {function} DROP INDEX effect_metrics_unresolved; \
         DROP INDEX effect_unresolved_since; ALTER TABLE effect DROP COLUMN resolved; \
         CREATE INDEX effect_metrics_unresolved ON effect (tenant_id); \
         CREATE INDEX effect_unresolved_since ON effect (tenant_id); \
         DELETE FROM _sqlx_migrations WHERE version IN (23, 33);"
    ))
    .await;
    let ledger = raw.reopen().await;
    let open = |keys: &[&str]| {
        let mut keys: Vec<String> = keys.iter().map(ToString::to_string).collect();
        keys.sort();
        keys
    };
    let backlog = |ledger: Arc<dyn Ledger>| async move {
        let q = reckon_ledger::QueueQuery {
            now: time::now(),
            limit: 50,
            ..Default::default()
        };
        let queue = ledger.unresolved_queue(t.id, &q).await.unwrap();
        let summary = ledger
            .unresolved_summary(t.id, time::now(), reckon_ledger::ReplayClosing::NONE)
            .await
            .unwrap();
        let m = reckon_ledger::MetricsQuery {
            tenant: Some(t.id),
            now: time::now(),
            replay_closing_created_before: 0.0,
            replay_closed_created_before: 0.0,
        };
        let metrics = ledger.metrics_snapshot(m).await.unwrap();
        let mut keys: Vec<String> = queue.into_iter().map(|r| r.effect.key).collect();
        keys.sort();
        let count: i64 = summary.iter().map(|k| k.count).sum();
        let unknown: i64 = metrics.unresolved.iter().map(|u| u.unknown).sum();
        (keys, count, unknown)
    };
    assert_eq!(
        backlog(ledger.clone()).await,
        (open(&[keys[0], keys[3]]), 2, 2),
        "the effects resolved before the upgrade left the backlog"
    );
    let due = ledger
        .claim_due(t.id, "w2", time::now(), 60.0, 10)
        .await
        .unwrap();
    let mut due: Vec<String> = due.into_iter().map(|c| c.effect.key).collect();
    due.sort();
    assert_eq!(due, open(&[keys[0], keys[3]]));
    ledger
        .resolve_by_hand(t.id, id(keys[3]), by_hand)
        .await
        .unwrap();
    assert_eq!(backlog(ledger).await, (open(&[keys[0]]), 1, 1));
}

pub(crate) async fn story_rc_claims(ledger: Arc<dyn Ledger>) {
    let (t, _) = tenant_and_source(&*ledger, "acme", "shop").await;
    let now = time::now();
    let s = ledger.source_by_name(t.id, "shop").await.unwrap();
    ledger
        .ingest(
            t.id,
            s.id,
            batch(vec![
                rec("charge:v1:o1", State::Unknown, now - 100.0),
                rec("charge:v1:o2", State::Succeeded, now - 100.0),
            ]),
        )
        .await
        .unwrap();

    let a = ledger
        .claim_due(t.id, "worker-a", now, 30.0, 10)
        .await
        .unwrap();
    assert_eq!(a.len(), 1, "only the unresolved effect is due");
    assert_eq!(a[0].effect.key, "charge:v1:o1");
    assert_eq!(a[0].owner, "worker-a");
    let id = a[0].effect.id;
    assert!(
        ledger
            .claim_due(t.id, "worker-b", now + 1.0, 30.0, 10)
            .await
            .unwrap()
            .is_empty(),
        "a leased effect is not claimed by another worker"
    );
    assert!(
        ledger
            .claim_effect(t.id, id, "worker-b", now + 1.0, 30.0)
            .await
            .unwrap()
            .is_none(),
        "nor claimed one by one"
    );
    // worker-a dies; once its lease expires worker-b takes the effect over
    let b = ledger
        .claim_due(t.id, "worker-b", now + 31.0, 30.0, 10)
        .await
        .unwrap();
    assert_eq!(b.len(), 1);
    // worker-a comes back late (paused past its lease): it writes nothing at all
    let late = ledger
        .record_attempt(
            t.id,
            id,
            "worker-a",
            attempt("applied", now + 32.0, now + 32.0, true),
        )
        .await;
    assert!(
        matches!(late, Err(LedgerError::LeaseLost(_))),
        "a late worker's write was not refused: {late:?}"
    );
    let view = ledger.reconcile_view(t.id, id).await.unwrap();
    assert!(view.attempts.is_empty(), "the late worker left an attempt");
    assert!(
        view.resolution.is_none(),
        "the late worker resolved the effect"
    );
    let st = view.state.unwrap();
    assert_eq!(st.attempts, 0, "the stale worker did not count");
    assert_eq!(st.lease_owner.as_deref(), Some("worker-b"));
    // worker-b records an indeterminate outcome and schedules the next look in 100 s
    ledger
        .record_attempt(
            t.id,
            id,
            "worker-b",
            attempt("indeterminate", now + 33.0, now + 133.0, false),
        )
        .await
        .unwrap();
    let st = ledger
        .reconcile_view(t.id, id)
        .await
        .unwrap()
        .state
        .unwrap();
    assert_eq!(st.attempts, 1);
    assert_eq!(st.lease_owner, None, "recording releases the lease");
    assert_eq!(
        st.last_outcome.map(reckon_ledger::Outcome::as_str),
        Some("indeterminate")
    );
    assert!(
        ledger
            .claim_due(t.id, "worker-c", now + 100.0, 30.0, 10)
            .await
            .unwrap()
            .is_empty(),
        "not due before its next attempt time"
    );
    assert!(
        ledger
            .claim_effect(t.id, id, "worker-c", now + 100.0, 30.0)
            .await
            .unwrap()
            .is_some(),
        "but a one-off reconcile may take it early"
    );
    ledger
        .defer(t.id, id, "worker-c", now + 133.0, "no provider")
        .await
        .unwrap();
    let st = ledger
        .reconcile_view(t.id, id)
        .await
        .unwrap()
        .state
        .unwrap();
    assert_eq!(st.last_error.as_deref(), Some("no provider"));
    assert_eq!(st.attempts, 1, "a deferral is not an attempt");
    let c = ledger
        .claim_due(t.id, "worker-c", now + 134.0, 30.0, 10)
        .await
        .unwrap();
    assert_eq!(c.len(), 1, "due again after its next attempt time");
    // another tenant never sees it
    let other = ledger.create_tenant("other").await.unwrap();
    assert!(
        ledger
            .claim_due(other.id, "w", now + 1e6, 30.0, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        ledger
            .claim_effect(other.id, id, "w", now + 1e6, 30.0)
            .await
            .unwrap()
            .is_none()
    );
}

pub(crate) async fn story_rc_resolution_unique(ledger: Arc<dyn Ledger>) {
    let (t, s) = tenant_and_source(&*ledger, "acme", "shop").await;
    let now = time::now();
    ledger
        .ingest(
            t.id,
            s.id,
            batch(vec![
                rec("charge:v1:o1", State::Unknown, now - 100.0),
                rec("charge:v1:o2", State::Unknown, now - 100.0),
            ]),
        )
        .await
        .unwrap();
    let claims = ledger.claim_due(t.id, "w1", now, 30.0, 10).await.unwrap();
    assert_eq!(claims.len(), 2);
    let id = claims
        .iter()
        .find(|c| c.effect.key == "charge:v1:o1")
        .unwrap()
        .effect
        .id;
    let id2 = claims
        .iter()
        .find(|c| c.effect.key == "charge:v1:o2")
        .unwrap()
        .effect
        .id;
    let first = ledger
        .record_attempt(t.id, id, "w1", attempt("applied", now, now + 60.0, true))
        .await
        .unwrap();
    assert!(first.resolved_now);
    let r1 = first.resolution.unwrap();
    assert_eq!(
        (r1.outcome.as_str(), r1.author.as_str()),
        ("applied", "reconciler")
    );
    assert_eq!(r1.attempt_id, Some(first.attempt_id));
    // a worker without the lease (a stale retry after a crash) writes nothing
    let again = ledger
        .record_attempt(
            t.id,
            id,
            "w2",
            attempt("duplicate", now + 1.0, now + 60.0, true),
        )
        .await;
    assert!(matches!(again, Err(LedgerError::LeaseLost(_))), "{again:?}");
    let view = ledger.reconcile_view(t.id, id).await.unwrap();
    assert_eq!(view.attempts.len(), 1, "the refused write left nothing");
    assert_eq!(view.resolution.unwrap().outcome.as_str(), "applied");
    // a resolved effect is never claimed again
    let later = ledger
        .claim_due(t.id, "w3", now + 1e4, 30.0, 10)
        .await
        .unwrap();
    assert!(later.iter().all(|c| c.effect.id != id));
    // by hand: a note is required, and a resolved effect refuses a second one
    let by_hand = |note: Option<&str>| reckon_ledger::NewResolution {
        outcome: reckon_ledger::Outcome::NotApplied,
        author: "alice".into(),
        note: note.map(str::to_owned),
        evidence: serde_json::json!({ "seen": [] }),
    };
    assert!(matches!(
        ledger.resolve_by_hand(t.id, id2, by_hand(None)).await,
        Err(LedgerError::Invalid(_))
    ));
    assert!(matches!(
        ledger.resolve_by_hand(t.id, id2, by_hand(Some("  "))).await,
        Err(LedgerError::Invalid(_))
    ));
    assert!(matches!(
        ledger
            .resolve_by_hand(t.id, id, by_hand(Some("checked")))
            .await,
        Err(LedgerError::Conflict(_))
    ));
    let r2 = ledger
        .resolve_by_hand(t.id, id2, by_hand(Some("refunded in the dashboard")))
        .await
        .unwrap();
    assert_eq!(r2.author, "alice");
    assert_eq!(r2.note.as_deref(), Some("refunded in the dashboard"));
    assert_eq!(r2.evidence, serde_json::json!({ "seen": [] }));
    // w1 had claimed id2, but its lease expired and w3 took id2 over (the claim 1e4 s
    // later, above); w1 comes back late with a conclusive answer, after the person
    // resolved it: it writes nothing (no attempt, never a second resolution)
    let raced = ledger
        .record_attempt(
            t.id,
            id2,
            "w1",
            attempt("applied", now + 2.0, now + 60.0, true),
        )
        .await;
    assert!(matches!(raced, Err(LedgerError::LeaseLost(_))), "{raced:?}");
    let view2 = ledger.reconcile_view(t.id, id2).await.unwrap();
    assert_eq!(view2.resolution.unwrap().id, r2.id);
    assert!(view2.attempts.is_empty());
    // indeterminate never resolves, unknown words are refused
    assert!(matches!(
        ledger
            .record_attempt(t.id, id2, "w1", attempt("indeterminate", now, now, true))
            .await,
        Err(LedgerError::Invalid(_))
    ));
    // another tenant cannot resolve it
    let other = ledger.create_tenant("other").await.unwrap();
    assert!(matches!(
        ledger
            .resolve_by_hand(other.id, id2, by_hand(Some("x")))
            .await,
        Err(LedgerError::NotFound(_) | LedgerError::Conflict(_))
    ));
}

pub(crate) async fn story_rc_resolved_among(ledger: Arc<dyn Ledger>) {
    let (t, s) = tenant_and_source(&*ledger, "acme", "shop").await;
    let (other, _) = tenant_and_source(&*ledger, "globex", "shop").await;
    let now = time::now();
    ledger
        .ingest(
            t.id,
            s.id,
            batch(vec![
                rec("charge:v1:o1", State::Unknown, now - 100.0),
                rec("charge:v1:o2", State::Unknown, now - 100.0),
                rec("charge:v1:o3", State::Unknown, now - 100.0),
            ]),
        )
        .await
        .unwrap();
    let id = |key: &str| {
        let ledger = ledger.clone();
        let key = key.to_owned();
        async move { effect(&*ledger, t.id, "shop", &key).await.id }
    };
    let (o1, o2, o3) = (
        id("charge:v1:o1").await,
        id("charge:v1:o2").await,
        id("charge:v1:o3").await,
    );
    // One resolved by the reconciler, one by hand, one not at all.
    ledger.claim_due(t.id, "w1", now, 30.0, 10).await.unwrap();
    ledger
        .record_attempt(t.id, o3, "w1", attempt("applied", now, now + 60.0, true))
        .await
        .unwrap();
    ledger
        .resolve_by_hand(
            t.id,
            o1,
            reckon_ledger::NewResolution {
                outcome: reckon_ledger::Outcome::NotApplied,
                author: "alice".into(),
                note: Some("refunded in the dashboard".into()),
                evidence: serde_json::json!({}),
            },
        )
        .await
        .unwrap();
    assert_eq!(
        ledger.resolved_among(t.id, &[o3, o2, o1]).await.unwrap(),
        vec![
            (o1, reckon_ledger::Outcome::NotApplied),
            (o3, reckon_ledger::Outcome::Applied)
        ],
        "the resolved ones with their verdicts, in id order"
    );
    assert!(ledger.resolved_among(t.id, &[]).await.unwrap().is_empty());
    assert!(
        ledger
            .resolved_among(other.id, &[o1, o2, o3])
            .await
            .unwrap()
            .is_empty(),
        "another tenant's resolutions are not found"
    );
    // More ids than one statement binds: every chunk is read.
    let mut many: Vec<i64> = (1..=reckon_ledger::IDS_PER_STATEMENT as i64 + 5)
        .map(|n| o3 + 1000 + n)
        .collect();
    many.push(o3);
    assert_eq!(
        ledger.resolved_among(t.id, &many).await.unwrap(),
        vec![(o3, reckon_ledger::Outcome::Applied)]
    );
}

/// A reconciler's `not_applied` that a charge imported later contradicts (succeeded, moved
/// money, carrying the effect's key in its metadata) is taken back: kept in
/// `resolution_retracted` naming the charge, its effect unresolved again and parked for a
/// person. A failed charge, another tenant's charge, a person's resolution and an
/// `applied` verdict are left alone.
pub(crate) async fn story_rc_retract_contradicted(ledger: Arc<dyn Ledger>, raw: RawDb) {
    let now = time::now();
    let keys = [
        "charge:v1:paid-later",
        "charge:v1:declined",
        "charge:v1:other-tenant",
        "charge:v1:applied",
    ];
    let (t, claims) = claimed_unknowns(&*ledger, &keys, now).await;
    let (b, _) = tenant_and_source(&*ledger, "beta", "shop").await;
    let id = |k: &str| claims.iter().find(|c| c.effect.key == k).unwrap().effect.id;
    for k in &keys {
        let outcome = if *k == keys[3] {
            "applied"
        } else {
            "not_applied"
        };
        let a = attempt(outcome, now, now + 3600.0, true);
        ledger.record_attempt(t.id, id(k), "w", a).await.unwrap();
    }
    let provider = |tenant: reckon_ledger::TenantId| {
        let ledger = ledger.clone();
        async move {
            ledger
                .add_provider(
                    tenant,
                    reckon_ledger::NewProvider {
                        name: "stripe".into(),
                        kind: reckon_ledger::ProviderKind::Stripe,
                        secret: None,
                        settings: serde_json::json!({}),
                    },
                )
                .await
                .unwrap()
                .id
        }
    };
    let (pa, pb) = (provider(t.id).await, provider(b.id).await);
    let charge =
        |provider_id: i64, id: &str, key: &str, status: &str| reckon_ledger::StoredCharge {
            provider_id,
            charge_id: id.into(),
            payment_intent: None,
            amount: 1000,
            currency: "usd".into(),
            status: status.into(),
            amount_captured: if status == "succeeded" { 1000 } else { 0 },
            amount_refunded: 0,
            refunds: serde_json::json!([]),
            metadata: serde_json::json!({ "idempotency_key": key }),
            idempotency_key: None,
            customer: None,
            created: now,
            raw: serde_json::json!({}),
            imported_at: now,
        };
    ledger
        .store_provider_charges(
            t.id,
            &[
                charge(pa, "ch_paid", keys[0], "succeeded"),
                charge(pa, "ch_declined", keys[1], "failed"),
                charge(pa, "ch_applied", keys[3], "succeeded"),
            ],
        )
        .await
        .unwrap();
    ledger
        .store_provider_charges(b.id, &[charge(pb, "ch_beta", keys[2], "succeeded")])
        .await
        .unwrap();
    let retracted = ledger
        .retract_contradicted_absence(t.id, time::now())
        .await
        .unwrap();
    assert_eq!(retracted, vec![(id(keys[0]), "ch_paid".to_owned())]);
    let view = ledger.reconcile_view(t.id, id(keys[0])).await.unwrap();
    assert!(view.resolution.is_none(), "{view:?}");
    let st = view.state.expect("its state");
    assert!(st.needs_attention && !st.non_final, "{st:?}");
    assert!(
        st.last_error
            .as_deref()
            .is_some_and(|e| e.contains("ch_paid")),
        "{st:?}"
    );
    for k in &keys[1..] {
        assert!(
            ledger
                .reconcile_view(t.id, id(k))
                .await
                .unwrap()
                .resolution
                .is_some(),
            "{k} keeps its verdict"
        );
    }
    let reasons: Vec<String> = raw
        .cells("resolution_retracted")
        .await
        .into_iter()
        .filter(|(c, _)| c == "reason")
        .map(|(_, v)| String::from_utf8(v).unwrap())
        .collect();
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert!(reasons[0].contains("ch_paid"), "{reasons:?}");
    // Done once: nothing more to take back.
    assert!(
        ledger
            .retract_contradicted_absence(t.id, time::now())
            .await
            .unwrap()
            .is_empty()
    );
}
