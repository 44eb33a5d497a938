//! What `/metrics` and the dashboard read.

use super::*;

/// What `/metrics` reads: the operator's view of every tenant (PostgreSQL reads it tenant
/// by tenant, in batches) equals the union of the tenants' own views, with the values the
/// ingested records imply.
pub(crate) async fn story_metrics_snapshot(ledger: Arc<dyn Ledger>) {
    use reckon_ledger::{MetricsQuery, MetricsSnapshot, QuarantineGroup, UnresolvedGroup};
    let now = time::now();
    let mut tenants = Vec::new();
    // Five tenants, so the operator's read spans several batches; "t2" has no source.
    for i in 0..5 {
        let t = ledger.create_tenant(&format!("t{i}")).await.unwrap();
        if i != 2 {
            let s = ledger.add_source(t.id, push_source("shop")).await.unwrap();
            let unknown = rec(
                &format!("charge:v1:ORD-{i}"),
                State::Unknown,
                1_700_000_000.0 + f64::from(i),
            );
            let abandoned = claim("charge:v1:ORD-X", 1_700_000_000.0, 1_700_000_050.0);
            let live = claim("refund:v1:ORD-Y", now, now + 3600.0);
            let done = rec("email:v1:ORD-Z", State::Succeeded, 1_700_000_000.0);
            let hostile = refused(&raw_row(b"charge:v1:Q", b"bogus", None, 1.0e9));
            let records = if i == 4 {
                vec![done.clone()]
            } else {
                vec![unknown, abandoned, live, done]
            };
            ledger
                .ingest(
                    t.id,
                    s.id,
                    IngestBatch {
                        rejected: vec![hostile],
                        ..batch(records)
                    },
                )
                .await
                .unwrap();
            ledger
                .record_scan_success(t.id, s.id, now - 10.0, false, None)
                .await
                .unwrap();
        }
        tenants.push(t);
    }
    let q = |tenant| MetricsQuery {
        tenant,
        now,
        replay_closing_created_before: 1_700_000_001.5,
        replay_closed_created_before: 1_600_000_000.0,
    };
    let sorted = |mut m: MetricsSnapshot| {
        m.unresolved
            .sort_by(|a, b| (&a.tenant, &a.operation).cmp(&(&b.tenant, &b.operation)));
        m.sources.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        m.quarantine.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        m
    };
    let all = sorted(ledger.metrics_snapshot(q(None)).await.unwrap());
    let expect: Vec<UnresolvedGroup> = [0, 1, 3]
        .iter()
        .map(|i| UnresolvedGroup {
            tenant: format!("t{i}"),
            source: "shop".into(),
            operation: Some("charge".into()),
            unknown: 1,
            abandoned: 1,
            // The abandoned claim's lease ended at ...050; the unknown row is older.
            oldest_since: 1_700_000_000.0 + f64::from(*i),
            // No route anywhere: no provider holds these keys, so no replay window counts
            // them, however old (story_metrics_routes has the routed ones).
            routed: false,
            replay_window_closing: 0,
            replay_window_closed: 0,
            needs_attention: 0,
        })
        .collect();
    assert_eq!(
        all.unresolved, expect,
        "one group per tenant, the live claim not counted"
    );
    assert_eq!(
        all.sources
            .iter()
            .map(|h| (h.tenant.as_str(), h.up()))
            .collect::<Vec<_>>(),
        [("t0", true), ("t1", true), ("t3", true), ("t4", true)]
    );
    assert_eq!(
        all.quarantine,
        ["t0", "t1", "t3", "t4"]
            .iter()
            .map(|t| QuarantineGroup {
                tenant: (*t).into(),
                source: "shop".into(),
                reason: "unknown_state".into(),
                count: 1,
            })
            .collect::<Vec<_>>()
    );
    let mut union = MetricsSnapshot::default();
    for t in &tenants {
        let one = ledger.metrics_snapshot(q(Some(t.id))).await.unwrap();
        assert!(
            one.sources.iter().all(|h| h.tenant == t.slug)
                && one.unresolved.iter().all(|u| u.tenant == t.slug),
            "{}'s view holds only its own series",
            t.slug
        );
        union.unresolved.extend(one.unresolved);
        union.sources.extend(one.sources);
        union.quarantine.extend(one.quarantine);
    }
    assert_eq!(sorted(union), all);
}

/// Which unresolved effects are routed, as the reconciler decides it: the route on the
/// effect's exact operation wins, even one to no provider; without one, the source's `*`
/// route; a key with no operation has only `*`. Replay windows (closing: created at or
/// before the closing cutoff and after the closed one; closed: at or before the closed
/// cutoff) count routed effects only.
pub(crate) async fn story_metrics_routes(ledger: Arc<dyn Ledger>) {
    use reckon_ledger::{MetricsQuery, NewProvider};
    let now = time::now();
    let (closing_cut, closed_cut) = (now - 20.0 * 3600.0, now - 24.0 * 3600.0);
    let hours_ago = |h: f64| now - h * 3600.0;
    let t = ledger.create_tenant("routes").await.unwrap();
    let mut sources = Vec::new();
    for name in ["shop", "app", "bare"] {
        sources.push(ledger.add_source(t.id, push_source(name)).await.unwrap());
    }
    ledger
        .add_provider(
            t.id,
            NewProvider {
                name: "pay".into(),
                kind: reckon_ledger::ProviderKind::Demo,
                secret: None,
                settings: serde_json::json!({ "base_url": "http://127.0.0.1:9/" }),
            },
        )
        .await
        .unwrap();
    // shop: every operation to pay, but refunds to none. app: nothing, but charges to pay.
    // bare: no route at all.
    for (source, op, provider) in [
        ("shop", "*", Some("pay")),
        ("shop", "refund", None),
        ("app", "*", None),
        ("app", "charge", Some("pay")),
    ] {
        ledger.set_route(t.id, source, op, provider).await.unwrap();
    }
    let created = |key: &str, created_at: f64| SourceRecord {
        created_at,
        ..rec(key, State::Unknown, created_at + 1.0)
    };
    let abandoned = SourceRecord {
        created_at: hours_ago(30.0),
        ..claim("charge:v1:D", hours_ago(30.0), hours_ago(29.0))
    };
    let batches = [
        vec![
            created("charge:v1:A", hours_ago(25.0)),
            created("charge:v1:B", hours_ago(21.0)),
            created("charge:v1:C", hours_ago(1.0)),
            // Exactly at the cutoff: closed.
            created("charge:v1:H", closed_cut),
            abandoned,
            created("refund:v1:R", hours_ago(25.0)),
            created("legacy-17", hours_ago(21.0)),
        ],
        vec![
            created("charge:v1:E", hours_ago(25.0)),
            created("email:v1:F", hours_ago(25.0)),
        ],
        vec![created("charge:v1:G", hours_ago(21.0))],
    ];
    for (s, records) in sources.iter().zip(batches) {
        ledger.ingest(t.id, s.id, batch(records)).await.unwrap();
    }
    let q = |tenant| MetricsQuery {
        tenant,
        now,
        replay_closing_created_before: closing_cut,
        replay_closed_created_before: closed_cut,
    };
    // (group, (unresolved, routed, closing, closed, unrouted)), by source and operation.
    type View = Vec<(String, (i64, bool, i64, i64, i64))>;
    async fn view(ledger: &dyn Ledger, q: MetricsQuery) -> View {
        let mut u = ledger.metrics_snapshot(q).await.unwrap().unresolved;
        u.retain(|g| g.tenant == "routes");
        u.sort_by(|a, b| (&a.source, &a.operation).cmp(&(&b.source, &b.operation)));
        u.into_iter()
            .map(|g| {
                (
                    format!("{}/{}", g.source, g.operation.as_deref().unwrap_or("-")),
                    (
                        g.unknown + g.abandoned,
                        g.routed,
                        g.replay_window_closing,
                        g.replay_window_closed,
                        g.unrouted(),
                    ),
                )
            })
            .collect()
    }
    let group = |name: &str, v| (name.to_owned(), v);
    let expect = vec![
        group("app/charge", (1, true, 0, 1, 0)),
        group("app/email", (1, false, 0, 0, 1)),
        group("bare/charge", (1, false, 0, 0, 1)),
        group("shop/-", (1, true, 1, 0, 0)),
        group("shop/charge", (5, true, 1, 3, 0)),
        group("shop/refund", (1, false, 0, 0, 1)),
    ];
    assert_eq!(view(&*ledger, q(None)).await, expect, "the operator's view");
    assert_eq!(
        view(&*ledger, q(Some(t.id))).await,
        expect,
        "the tenant's own view"
    );

    // A route changes what the next scrape says: refunds to pay now, bare's charges to none.
    ledger
        .set_route(t.id, "shop", "refund", Some("pay"))
        .await
        .unwrap();
    ledger.set_route(t.id, "bare", "*", None).await.unwrap();
    let after = view(&*ledger, q(Some(t.id))).await;
    assert_eq!(after[5], group("shop/refund", (1, true, 0, 1, 0)));
    assert_eq!(after[2], group("bare/charge", (1, false, 0, 0, 1)));
}

pub(crate) async fn story_dash_queue(ledger: Arc<dyn Ledger>) {
    let (t, s) = tenant_and_source(&*ledger, "acme", "shop").await;
    let (other, os) = tenant_and_source(&*ledger, "globex", "shop").await;
    let now = time::now();
    ledger
        .ingest(
            t.id,
            s.id,
            batch(vec![
                rec("charge:v1:o1", State::Unknown, now - 300.0),
                rec("charge:v1:o2", State::Unknown, now - 100.0),
                rec("refund:v1:o3", State::Unknown, now - 200.0),
                rec("charge:v1:o4", State::Succeeded, now - 500.0),
                // A claim whose lease ended 1000 s ago: abandoned (grace 300 s), the oldest.
                claim("charge:v1:o5", now - 2000.0, now - 1000.0),
                // A live claim: not unresolved.
                claim("charge:v1:o6", now - 10.0, now + 600.0),
            ]),
        )
        .await
        .unwrap();
    ledger
        .ingest(
            other.id,
            os.id,
            batch(vec![rec("charge:v1:x1", State::Unknown, now - 900.0)]),
        )
        .await
        .unwrap();
    let q = |f: fn(&mut reckon_ledger::QueueQuery)| {
        let mut q = reckon_ledger::QueueQuery {
            limit: 10,
            now,
            ..Default::default()
        };
        f(&mut q);
        q
    };
    let keys_of = |rows: &[reckon_ledger::QueueRow]| {
        rows.iter()
            .map(|r| r.effect.key.clone())
            .collect::<Vec<_>>()
    };
    let all = ledger.unresolved_queue(t.id, &q(|_| {})).await.unwrap();
    assert_eq!(
        keys_of(&all),
        [
            "charge:v1:o5",
            "charge:v1:o1",
            "refund:v1:o3",
            "charge:v1:o2"
        ],
        "oldest first, only this tenant's unresolved effects"
    );
    assert_eq!(
        all[0].since,
        now - 1000.0,
        "an abandoned claim is unresolved from its lease end"
    );
    assert_eq!(all[1].since, now - 300.0);
    assert_eq!(all[1].lookups, 0);
    assert!(all[1].last_outcome.is_none() && !all[1].needs_attention);

    // Keyset pages: two at a time, nothing repeated or skipped.
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let mut page_q = q(|q| q.limit = 2);
        page_q.after = after;
        let page = ledger.unresolved_queue(t.id, &page_q).await.unwrap();
        if page.is_empty() {
            break;
        }
        after = page.last().map(|r| (r.since, r.effect.id));
        seen.extend(keys_of(&page));
    }
    assert_eq!(seen, keys_of(&all));

    let refunds = ledger
        .unresolved_queue(t.id, &q(|q| q.operation = Some("refund".into())))
        .await
        .unwrap();
    assert_eq!(keys_of(&refunds), ["refund:v1:o3"]);
    let abandoned = ledger
        .unresolved_queue(t.id, &q(|q| q.kind = Some("abandoned".into())))
        .await
        .unwrap();
    assert_eq!(keys_of(&abandoned), ["charge:v1:o5"]);
    let none = ledger
        .unresolved_queue(t.id, &q(|q| q.source = Some("nope".into())))
        .await
        .unwrap();
    assert!(none.is_empty());

    // A lookup that concluded nothing and parked the effect: outcome and attention filters.
    let o2 = all
        .iter()
        .find(|r| r.effect.key == "charge:v1:o2")
        .unwrap()
        .effect
        .id;
    assert!(
        ledger
            .claim_effect(t.id, o2, "w", now, 30.0)
            .await
            .unwrap()
            .is_some()
    );
    let mut parked = attempt("indeterminate", now, now + 900.0, false);
    parked.needs_attention = true;
    parked.error = Some("provider timed out".into());
    ledger.record_attempt(t.id, o2, "w", parked).await.unwrap();
    let attention = ledger
        .unresolved_queue(t.id, &q(|q| q.needs_attention = true))
        .await
        .unwrap();
    assert_eq!(keys_of(&attention), ["charge:v1:o2"]);
    assert_eq!(attention[0].lookups, 1);
    assert_eq!(attention[0].last_outcome.as_deref(), Some("indeterminate"));
    assert_eq!(
        attention[0].last_error.as_deref(),
        Some("provider timed out")
    );
    assert_eq!(attention[0].next_attempt_at, Some(now + 900.0));
    let indeterminate = ledger
        .unresolved_queue(t.id, &q(|q| q.outcome = Some("indeterminate".into())))
        .await
        .unwrap();
    assert_eq!(keys_of(&indeterminate), ["charge:v1:o2"]);

    // Counts by kind, then a resolution by hand takes the effect out of queue and counts.
    let summary = ledger
        .unresolved_summary(
            t.id,
            now,
            reckon_ledger::ReplayClosing {
                open_after: now - 1000.0,
                closing_before: now - 250.0,
            },
        )
        .await
        .unwrap();
    let unknown = summary.iter().find(|k| k.kind == "unknown").unwrap();
    assert_eq!((unknown.count, unknown.oldest_since), (3, now - 300.0));
    assert_eq!(unknown.needs_attention, 1);
    assert_eq!(
        unknown.replay_closing, 1,
        "only o1 was created before the cutoff"
    );
    let abandoned = summary.iter().find(|k| k.kind == "abandoned").unwrap();
    assert_eq!(abandoned.count, 1);
    // A window that closed already is not closing.
    let closed = ledger
        .unresolved_summary(
            t.id,
            now,
            reckon_ledger::ReplayClosing {
                open_after: now - 290.0,
                closing_before: now - 250.0,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        closed
            .iter()
            .find(|k| k.kind == "unknown")
            .unwrap()
            .replay_closing,
        0,
        "o1's window closed before now - 290"
    );
    ledger
        .resolve_by_hand(
            t.id,
            o2,
            reckon_ledger::NewResolution {
                outcome: reckon_ledger::Outcome::Applied,
                author: "alice@acme.test".into(),
                note: Some("seen in the provider's dashboard".into()),
                evidence: serde_json::json!({}),
            },
        )
        .await
        .unwrap();
    let after_resolve = ledger.unresolved_queue(t.id, &q(|_| {})).await.unwrap();
    assert!(!keys_of(&after_resolve).contains(&"charge:v1:o2".to_owned()));
    let summary = ledger
        .unresolved_summary(
            t.id,
            now,
            reckon_ledger::ReplayClosing {
                open_after: now - 1000.0,
                closing_before: now - 250.0,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        summary.iter().find(|k| k.kind == "unknown").unwrap().count,
        2
    );

    // The other tenant sees only its own.
    let theirs = ledger.unresolved_queue(other.id, &q(|_| {})).await.unwrap();
    assert_eq!(keys_of(&theirs), ["charge:v1:x1"]);
}

/// Parked effects are counted from the effect's own flag, which the database keeps in step
/// with the reconcile state: parking counts one, a requeue uncounts it, and an effect that
/// leaves the backlog (a verdict, or its source finishing it) is not counted, in the
/// overview's counts and in the scrape alike.
pub(crate) async fn story_dash_parked(ledger: Arc<dyn Ledger>) {
    use reckon_ledger::MetricsQuery;
    let (t, s) = tenant_and_source(&*ledger, "acme", "shop").await;
    let now = time::now();
    let p = ledger
        .add_provider(
            t.id,
            reckon_ledger::NewProvider {
                name: "pay".into(),
                kind: reckon_ledger::ProviderKind::Demo,
                secret: None,
                settings: serde_json::json!({}),
            },
        )
        .await
        .unwrap();
    ledger
        .ingest(
            t.id,
            s.id,
            batch(vec![
                rec("charge:v1:o1", State::Unknown, now - 300.0),
                rec("charge:v1:o2", State::Unknown, now - 200.0),
                // Abandoned: its lease ended 1000 s ago (grace 300 s).
                claim("charge:v1:o5", now - 2000.0, now - 1000.0),
            ]),
        )
        .await
        .unwrap();
    let id = |key: &'static str| {
        let ledger = ledger.clone();
        async move {
            let all = ledger
                .unresolved_queue(
                    t.id,
                    &reckon_ledger::QueueQuery {
                        limit: 10,
                        now,
                        ..Default::default()
                    },
                )
                .await
                .unwrap();
            all.iter().find(|r| r.effect.key == key).unwrap().effect.id
        }
    };
    let (o2, o5) = (id("charge:v1:o2").await, id("charge:v1:o5").await);
    let park = |effect: i64| {
        let ledger = ledger.clone();
        async move {
            assert!(
                ledger
                    .claim_effect(t.id, effect, "w", now, 30.0)
                    .await
                    .unwrap()
                    .is_some()
            );
            let mut a = attempt("indeterminate", now, now + 9999.0, false);
            a.provider_id = Some(p.id);
            a.needs_attention = true;
            ledger.record_attempt(t.id, effect, "w", a).await.unwrap();
        }
    };
    // (unknown parked, abandoned parked) from the overview's counts, and the scrape's
    // parked count of the charge group.
    let counts = || {
        let ledger = ledger.clone();
        async move {
            let kinds = ledger
                .unresolved_summary(
                    t.id,
                    now,
                    reckon_ledger::ReplayClosing {
                        open_after: now - 1000.0,
                        closing_before: now - 250.0,
                    },
                )
                .await
                .unwrap();
            let parked = |kind: &str| {
                kinds
                    .iter()
                    .find(|k| k.kind == kind)
                    .map_or(0, |k| k.needs_attention)
            };
            let scrape = ledger
                .metrics_snapshot(MetricsQuery {
                    tenant: Some(t.id),
                    now,
                    replay_closing_created_before: now - 20.0 * 3600.0,
                    replay_closed_created_before: now - 24.0 * 3600.0,
                })
                .await
                .unwrap();
            let scraped: i64 = scrape.unresolved.iter().map(|u| u.needs_attention).sum();
            (parked("unknown"), parked("abandoned"), scraped)
        }
    };
    assert_eq!(counts().await, (0, 0, 0));
    park(o2).await;
    assert_eq!(counts().await, (1, 0, 1), "o2 parked");
    park(o5).await;
    assert_eq!(counts().await, (1, 1, 2), "o5 parked too");
    assert_eq!(
        ledger
            .requeue_indeterminate(t.id, p.id, 0.0, now, now)
            .await
            .unwrap(),
        2
    );
    assert_eq!(counts().await, (0, 0, 0), "a requeue unparks both");
    park(o2).await;
    park(o5).await;
    assert_eq!(counts().await, (1, 1, 2));
    ledger
        .resolve_by_hand(
            t.id,
            o2,
            reckon_ledger::NewResolution {
                outcome: reckon_ledger::Outcome::Applied,
                author: "alice@acme.test".into(),
                note: Some("seen in the provider's dashboard".into()),
                evidence: serde_json::json!({}),
            },
        )
        .await
        .unwrap();
    assert_eq!(counts().await, (0, 1, 1), "a verdict takes o2 out");
    // The application finished o5 itself: its source says succeeded, so nobody needs to
    // decide it, though its reconcile state still says parked.
    ledger
        .ingest(
            t.id,
            s.id,
            batch(vec![rec("charge:v1:o5", State::Succeeded, now - 5.0)]),
        )
        .await
        .unwrap();
    assert_eq!(counts().await, (0, 0, 0), "o5 left the backlog");
}

pub(crate) async fn story_dash_snapshots(ledger: Arc<dyn Ledger>) {
    let (t, s) = tenant_and_source(&*ledger, "acme", "shop").await;
    let (other, _) = tenant_and_source(&*ledger, "globex", "shop").await;
    let now = time::now();
    let empty = ledger.take_snapshot(t.id, now).await.unwrap();
    assert_eq!((empty.unresolved, empty.oldest_since), (0, None));
    ledger
        .ingest(
            t.id,
            s.id,
            batch(vec![
                rec("charge:v1:o1", State::Unknown, now - 300.0),
                rec("charge:v1:o2", State::Unknown, now - 100.0),
            ]),
        )
        .await
        .unwrap();
    // Again in the same hour: replaces the hour's row.
    let snap = ledger.take_snapshot(t.id, now).await.unwrap();
    assert_eq!(snap.hour, reckon_ledger::hour_of(now));
    assert_eq!((snap.unresolved, snap.oldest_since), (2, Some(now - 300.0)));
    // An hour later: a second row.
    ledger.take_snapshot(t.id, now + 3600.0).await.unwrap();
    let rows = ledger.snapshots(t.id, now - 86400.0).await.unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0], snap);
    assert!(rows[1].hour > rows[0].hour);
    assert!(
        ledger
            .snapshots(t.id, now + 7200.0)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        ledger.snapshots(other.id, 0.0).await.unwrap().is_empty(),
        "no other tenant's rows"
    );
}

/// The overview's provider health: lookups and indeterminate outcomes finished in the
/// window, the newest error of any age, zeros for a provider never asked, nothing of
/// another tenant's.
pub(crate) async fn story_dash_provider_health(ledger: Arc<dyn Ledger>) {
    let (t, s) = tenant_and_source(&*ledger, "acme", "shop").await;
    let (other, _) = tenant_and_source(&*ledger, "globex", "shop").await;
    let now = time::now();
    let keys: Vec<String> = (0..4).map(|i| format!("charge:v1:h{i}")).collect();
    ledger
        .ingest(
            t.id,
            s.id,
            batch(
                keys.iter()
                    .map(|k| rec(k, State::Unknown, now - 1000.0))
                    .collect(),
            ),
        )
        .await
        .unwrap();
    let add = |tenant: reckon_ledger::TenantId, name: &'static str| {
        let ledger = ledger.clone();
        async move {
            ledger
                .add_provider(
                    tenant,
                    reckon_ledger::NewProvider {
                        name: name.into(),
                        kind: reckon_ledger::ProviderKind::Demo,
                        secret: None,
                        settings: serde_json::json!({"base_url": "https://pay.example/"}),
                    },
                )
                .await
                .unwrap()
        }
    };
    let pay = add(t.id, "pay").await;
    add(t.id, "idle").await;
    // (key, finished, outcome, error): an old error, then three lookups in the window.
    let plan = [
        (0, now - 90_000.0, "indeterminate", Some("old: timed out")),
        (
            1,
            now - 600.0,
            "indeterminate",
            Some("new: 503 from the provider"),
        ),
        (2, now - 500.0, "indeterminate", None),
        (3, now - 400.0, "applied", None),
    ];
    for (i, at, outcome, error) in plan {
        let e = ledger
            .get_effect(t.id, "shop", &keys[i])
            .await
            .unwrap()
            .unwrap()
            .effect;
        ledger
            .claim_effect(t.id, e.id, "w", at, 30.0)
            .await
            .unwrap()
            .expect("claimed");
        let mut a = attempt(outcome, at, at + 900.0, outcome == "applied");
        a.provider_id = Some(pay.id);
        a.error = error.map(str::to_owned);
        ledger.record_attempt(t.id, e.id, "w", a).await.unwrap();
    }
    let health = ledger.provider_health(t.id, now - 86_400.0).await.unwrap();
    assert_eq!(
        health,
        [
            reckon_ledger::ProviderHealth {
                provider: "idle".into(),
                lookups: 0,
                indeterminate: 0,
                last_error: None,
                last_error_at: None,
            },
            reckon_ledger::ProviderHealth {
                provider: "pay".into(),
                lookups: 3,
                indeterminate: 2,
                last_error: Some("new: 503 from the provider".into()),
                last_error_at: Some(now - 600.0),
            },
        ]
    );
    // A wider window counts the old lookup too.
    let all = ledger.provider_health(t.id, 0.0).await.unwrap();
    assert_eq!((all[1].lookups, all[1].indeterminate), (4, 3));
    // Counts are kept in ten-minute buckets: a window starting on, just before or just
    // after any lookup or any bucket's edge counts exactly the lookups finished at or after
    // its start.
    let mut starts = Vec::new();
    for (_, at, _, _) in plan {
        let edge = (at / 600.0).floor() * 600.0;
        starts.extend([at - 0.5, at, at + 0.5, edge - 0.25, edge, edge + 600.0]);
    }
    for since in starts {
        let health = ledger.provider_health(t.id, since).await.unwrap();
        let got = health.iter().find(|h| h.provider == "pay").unwrap();
        let after: Vec<_> = plan.iter().filter(|p| p.1 >= since).collect();
        let indeterminate = after.iter().filter(|p| p.2 == "indeterminate").count();
        assert_eq!(
            (got.lookups, got.indeterminate),
            (after.len() as i64, indeterminate as i64),
            "the window from {since} (now {now})"
        );
    }
    // The other tenant has none of it.
    add(other.id, "pay").await;
    let theirs = ledger.provider_health(other.id, 0.0).await.unwrap();
    assert_eq!(theirs.len(), 1);
    assert_eq!((theirs[0].lookups, theirs[0].last_error.clone()), (0, None));
}

/// Provider health in the scrape is the ledger's record of each provider's latest lookup,
/// whoever made it: a process that never asked (one just restarted, another replica) reads
/// a down provider as down. Never asked is neither up nor down, and a tenant sees only its
/// own providers.
pub(crate) async fn story_metrics_provider_health(ledger: Arc<dyn Ledger>) {
    use reckon_ledger::{MetricsQuery, ProviderLastLookup};
    let (t, s) = tenant_and_source(&*ledger, "acme", "shop").await;
    let (other, os) = tenant_and_source(&*ledger, "globex", "shop").await;
    let now = time::now();
    let keys: Vec<String> = (0..4).map(|i| format!("charge:v1:p{i}")).collect();
    for (tenant, source) in [(t.id, s.id), (other.id, os.id)] {
        let records = keys
            .iter()
            .map(|k| rec(k, State::Unknown, now - 1000.0))
            .collect();
        ledger.ingest(tenant, source, batch(records)).await.unwrap();
    }
    let add = |tenant: TenantId, name: &'static str| {
        let ledger = ledger.clone();
        async move {
            ledger
                .add_provider(
                    tenant,
                    reckon_ledger::NewProvider {
                        name: name.into(),
                        kind: reckon_ledger::ProviderKind::Demo,
                        secret: None,
                        settings: serde_json::json!({"base_url": "https://pay.example/"}),
                    },
                )
                .await
                .unwrap()
        }
    };
    let down = add(t.id, "down").await;
    let fine = add(t.id, "fine").await;
    add(t.id, "never").await;
    let theirs = add(other.id, "down").await;
    // (tenant, provider, key, finished, outcome): each provider's lookups in the order they
    // finished, by another "process" than the one that reads.
    let plan = [
        (t.id, down.id, 0, now - 500.0, "applied"),
        (t.id, down.id, 1, now - 100.0, "indeterminate"),
        (t.id, fine.id, 2, now - 500.0, "indeterminate"),
        (t.id, fine.id, 3, now - 100.0, "not_applied"),
        (other.id, theirs.id, 0, now - 50.0, "applied"),
    ];
    for (tenant, provider, i, at, outcome) in plan {
        let e = ledger
            .get_effect(tenant, "shop", &keys[i])
            .await
            .unwrap()
            .unwrap()
            .effect;
        ledger
            .claim_effect(tenant, e.id, "w", at, 30.0)
            .await
            .unwrap()
            .expect("claimed");
        let mut a = attempt(outcome, at, at + 900.0, false);
        a.provider_id = Some(provider);
        ledger.record_attempt(tenant, e.id, "w", a).await.unwrap();
    }
    let q = |tenant| MetricsQuery {
        tenant,
        now,
        replay_closing_created_before: 0.0,
        replay_closed_created_before: 0.0,
    };
    let health = |tenant| {
        let ledger = ledger.clone();
        async move {
            let mut p = ledger.metrics_snapshot(q(tenant)).await.unwrap().providers;
            p.sort_by(|a, b| (&a.tenant, &a.provider).cmp(&(&b.tenant, &b.provider)));
            p
        }
    };
    let row =
        |tenant: &str, provider: &str, at: Option<f64>, outcome: Option<&str>| ProviderLastLookup {
            tenant: tenant.into(),
            provider: provider.into(),
            kind: "demo".into(),
            last_lookup_at: at,
            last_outcome: outcome.map(str::to_owned),
        };
    let all = health(None).await;
    assert_eq!(
        all,
        [
            row("acme", "down", Some(now - 100.0), Some("indeterminate")),
            row("acme", "fine", Some(now - 100.0), Some("not_applied")),
            row("acme", "never", None, None),
            row("globex", "down", Some(now - 50.0), Some("applied")),
        ]
    );
    assert_eq!(
        all.iter().map(ProviderLastLookup::up).collect::<Vec<_>>(),
        [Some(false), Some(true), None, Some(true)]
    );
    assert_eq!(health(Some(t.id)).await, all[..3]);
    assert_eq!(health(Some(other.id)).await, all[3..]);
}

/// The open effects by source and operation (what the connect checks and `reckon
/// reconcile` count), and a route set for effects the reconciler put off for want of one
/// makes exactly those due again.
pub(crate) async fn story_backlog_by_operation(ledger: Arc<dyn Ledger>) {
    use reckon_ledger::{NewProvider, OperationBacklog};
    let now = time::now();
    let (t, s) = tenant_and_source(&*ledger, "acme", "shop").await;
    let recs = ["charge:v1:A", "charge:v1:B", "refund:v1:R", "legacy-17"]
        .iter()
        .map(|k| rec(k, State::Unknown, now - 100.0))
        .collect();
    ledger.ingest(t.id, s.id, batch(recs)).await.unwrap();
    // The reconciler found no route for any of them: put off for ten minutes.
    for c in ledger.claim_due(t.id, "w", now, 60.0, 10).await.unwrap() {
        ledger
            .defer(t.id, c.effect.id, "w", now + 600.0, "no provider: no route")
            .await
            .unwrap();
    }
    let row = |operation: Option<&str>, open: i64| OperationBacklog {
        source: "shop".into(),
        operation: operation.map(str::to_owned),
        open,
        unknown: open,
        needs_attention: 0,
        provisional: 0,
        looked_up: 0,
    };
    let mut got = ledger.unresolved_by_operation(t.id, now).await.unwrap();
    got.sort_by(|a, b| a.operation.cmp(&b.operation));
    assert_eq!(
        got,
        vec![row(None, 1), row(Some("charge"), 2), row(Some("refund"), 1)]
    );
    let other = ledger.create_tenant("globex").await.unwrap();
    assert!(
        ledger
            .unresolved_by_operation(other.id, now)
            .await
            .unwrap()
            .is_empty(),
        "another tenant's"
    );
    assert!(
        ledger
            .claim_due(t.id, "w", now + 1.0, 60.0, 10)
            .await
            .unwrap()
            .is_empty(),
        "put off"
    );
    ledger
        .add_provider(
            t.id,
            NewProvider {
                name: "pay".into(),
                kind: reckon_ledger::ProviderKind::Demo,
                secret: None,
                settings: serde_json::json!({ "base_url": "http://127.0.0.1:9/" }),
            },
        )
        .await
        .unwrap();
    ledger
        .set_route(t.id, "shop", "charge", Some("pay"))
        .await
        .unwrap();
    let n = ledger
        .due_unrouted(t.id, "shop", "charge", now + 1.0)
        .await
        .unwrap();
    assert_eq!(n, 2);
    let mut due: Vec<String> = ledger
        .claim_due(t.id, "w", now + 2.0, 60.0, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.effect.key)
        .collect();
    due.sort();
    assert_eq!(due, ["charge:v1:A", "charge:v1:B"], "the charges only");
    // `*` reaches every operation of the source, the key with none included.
    let n = ledger
        .due_unrouted(t.id, "shop", "*", now + 3.0)
        .await
        .unwrap();
    assert_eq!(n, 2);
}
