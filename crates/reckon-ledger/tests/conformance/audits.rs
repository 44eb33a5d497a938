//! Provider charges, audit runs and their chain, the support lookup's charges, and the scrub of stored answers.

use super::*;

pub(crate) async fn story_audit_charges(ledger: Arc<dyn Ledger>) {
    let (a, _) = tenant_and_source(&*ledger, "acme", "shop").await;
    let (b, _) = tenant_and_source(&*ledger, "globex", "shop").await;
    let pa = ledger
        .add_provider(
            a.id,
            reckon_ledger::NewProvider {
                name: "pay".into(),
                kind: reckon_ledger::ProviderKind::Demo,
                secret: None,
                settings: serde_json::json!({"base_url": "http://127.0.0.1:9/"}),
            },
        )
        .await
        .unwrap();
    let n = ledger
        .store_provider_charges(
            a.id,
            &[
                // Stored out of time order: reads come back by (created, charge id).
                stored_charge(pa.id, "ch_3", 300.0, 900),
                stored_charge(pa.id, "ch_1", 100.0, 500),
                stored_charge(pa.id, "ch_2", 200.0, 700),
            ],
        )
        .await
        .unwrap();
    assert_eq!(n, 3);
    // A re-import replaces (a refund arrived later).
    let mut again = stored_charge(pa.id, "ch_2", 200.0, 700);
    again.amount_refunded = 700;
    again.refunds = serde_json::json!([{"id": "re_1", "amount": 700, "reason": "duplicate"}]);
    ledger
        .store_provider_charges(a.id, &[again.clone()])
        .await
        .unwrap();
    // [from, to): 100 and 200, not 300.
    let got = ledger
        .provider_charges(a.id, Some(pa.id), 100.0, 300.0)
        .await
        .unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(got[1], again, "stored and read back field for field");
    assert_eq!(got[0].raw["object"], "charge");
    // The audit's read: the same charges, every field but the provider's object.
    let to_match = async |t: TenantId, provider: Option<i64>, from: f64, to: f64| {
        let mut got = Vec::new();
        ledger
            .each_charge_to_match(t, provider, from, to, &mut |c| got.push(c))
            .await
            .unwrap();
        got.sort_by(|x, y| x.created.total_cmp(&y.created));
        got
    };
    let without_raw: Vec<_> = got
        .iter()
        .cloned()
        .map(|c| reckon_ledger::StoredCharge {
            raw: serde_json::Value::Null,
            ..c
        })
        .collect();
    assert_eq!(to_match(a.id, Some(pa.id), 100.0, 300.0).await, without_raw);
    assert!(
        to_match(b.id, None, 0.0, 1e10).await.is_empty(),
        "tenant B matches none of A's charges"
    );
    let all: Vec<String> = ledger
        .provider_charges(a.id, None, 0.0, 1e10)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.charge_id)
        .collect();
    assert_eq!(all, ["ch_1", "ch_2", "ch_3"]);
    assert_eq!(
        ledger
            .provider_charges(a.id, Some(pa.id + 1000), 0.0, 1e10)
            .await
            .unwrap()
            .len(),
        0
    );
    // Tenant B sees none of A's charges.
    assert!(
        ledger
            .provider_charges(b.id, None, 0.0, 1e10)
            .await
            .unwrap()
            .is_empty()
    );
    // Effects by creation time: [from, to), this tenant's only.
    let (_, src) = (
        a.clone(),
        ledger.source_by_name(a.id, "shop").await.unwrap(),
    );
    ledger
        .ingest(
            a.id,
            src.id,
            // Stored (and numbered) late first: the read hands them over in no order.
            batch(vec![
                rec("charge:v1:in", State::Succeeded, 150.0),
                rec("charge:v1:early", State::Succeeded, 50.0),
            ]),
        )
        .await
        .unwrap();
    let created_between = async |t: TenantId, from: f64| {
        let mut got = Vec::new();
        ledger
            .each_effect_created_between(t, from, 1e10, 1e10, &mut |e| got.push(e))
            .await
            .unwrap();
        got.sort_by(|x, y| x.created_at.total_cmp(&y.created_at));
        got
    };
    let all = created_between(a.id, 0.0).await;
    let created: Vec<f64> = all.iter().map(|e| e.created_at).collect();
    assert_eq!(created, [49.0, 149.0]);
    assert_eq!(all[0].key, "charge:v1:early");
    let some = created_between(a.id, created[1]).await;
    assert_eq!(some.len(), 1);
    assert_eq!(some[0].key, "charge:v1:in");
    assert!(created_between(b.id, 0.0).await.is_empty());
    // The tenant's calendar: UTC at 06:00 by default; bad times are refused.
    let s = ledger.audit_settings(a.id).await.unwrap();
    assert_eq!(
        (s.time_zone.as_str(), s.audit_time.as_str()),
        ("UTC", "06:00")
    );
    let paris = reckon_ledger::AuditSettings {
        time_zone: "Europe/Paris".into(),
        audit_time: "07:30".into(),
    };
    ledger.set_audit_settings(a.id, &paris).await.unwrap();
    assert_eq!(ledger.audit_settings(a.id).await.unwrap(), paris);
    assert_eq!(ledger.audit_settings(b.id).await.unwrap().time_zone, "UTC");
    let bad = reckon_ledger::AuditSettings {
        time_zone: "UTC".into(),
        audit_time: "7:30".into(),
    };
    assert!(matches!(
        ledger.set_audit_settings(a.id, &bad).await,
        Err(LedgerError::Invalid(_))
    ));
}

pub(crate) async fn story_audit_runs(ledger: Arc<dyn Ledger>) {
    let (a, _) = tenant_and_source(&*ledger, "acme", "shop").await;
    let (b, _) = tenant_and_source(&*ledger, "globex", "shop").await;
    let r1 = ledger
        .record_audit_run(a.id, new_run("2026-11-27", "schedule", "failed"), None)
        .await
        .unwrap();
    let r2 = ledger
        .record_audit_run(a.id, new_run("2026-11-27", "schedule", "complete"), None)
        .await
        .unwrap();
    let r3 = ledger
        .record_audit_run(a.id, new_run("2026-11-28", "operator", "complete"), None)
        .await
        .unwrap();
    assert_eq!((r1.seq, r2.seq, r3.seq), (1, 2, 3));
    assert_eq!(r1.prev_digest, "");
    assert_eq!(r2.prev_digest, r1.digest);
    assert_eq!(r3.prev_digest, r2.digest);
    assert_eq!(
        r2.run,
        new_run("2026-11-27", "schedule", "complete"),
        "stored as given"
    );
    // Tenant B's chain starts at 1 and sees none of A's runs.
    let rb = ledger
        .record_audit_run(b.id, new_run("2026-11-27", "schedule", "complete"), None)
        .await
        .unwrap();
    assert_eq!((rb.seq, rb.prev_digest.as_str()), (1, ""));
    assert!(ledger.get_audit_run(b.id, r1.id).await.unwrap().is_none());
    assert_eq!(
        ledger.list_audit_runs(b.id, None, 10).await.unwrap().len(),
        1
    );
    // Reads: newest first, by day, by id, the chain in order.
    let all = ledger.list_audit_runs(a.id, None, 10).await.unwrap();
    assert_eq!(all.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![3, 2, 1]);
    let day = ledger
        .list_audit_runs(a.id, Some("2026-11-27"), 10)
        .await
        .unwrap();
    assert_eq!(day.len(), 2);
    assert_eq!(
        ledger.get_audit_run(a.id, r3.id).await.unwrap().unwrap(),
        r3
    );
    let chain = ledger.audit_chain(a.id, 0, 10).await.unwrap();
    assert_eq!(chain, vec![r1.clone(), r2.clone(), r3.clone()]);
    assert_eq!(
        ledger.audit_chain(a.id, 2, 10).await.unwrap(),
        vec![r3.clone()]
    );
    assert!(reckon_ledger::verify_chain(a.id.get(), &chain).is_empty());
    // The scheduled day is complete once: a second completed scheduled run is refused; a
    // person's run of the same day is not.
    assert!(
        ledger
            .scheduled_audit_done(a.id, "2026-11-27", "*")
            .await
            .unwrap()
    );
    assert!(
        !ledger
            .scheduled_audit_done(a.id, "2026-11-28", "*")
            .await
            .unwrap()
    );
    assert!(
        !ledger
            .scheduled_audit_done(b.id, "2026-11-28", "*")
            .await
            .unwrap()
    );
    assert!(matches!(
        ledger
            .record_audit_run(a.id, new_run("2026-11-27", "schedule", "complete"), None)
            .await,
        Err(LedgerError::Conflict(_))
    ));
    ledger
        .record_audit_run(a.id, new_run("2026-11-27", "operator", "complete"), None)
        .await
        .unwrap();
    // A lost lease writes nothing.
    let lease = ledger
        .try_lease("audit:x", "me", 30.0)
        .await
        .unwrap()
        .unwrap();
    ledger.try_lease("audit:x", "me", 30.0).await.unwrap();
    ledger.release_lease(&lease).await.unwrap();
    ledger
        .try_lease("audit:x", "other", 30.0)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(
        ledger
            .record_audit_run(
                a.id,
                new_run("2026-11-29", "schedule", "complete"),
                Some(&lease)
            )
            .await,
        Err(LedgerError::LeaseLost(_))
    ));
    assert_eq!(ledger.audit_chain(a.id, 0, 100).await.unwrap().len(), 4);
    // Metrics read the newest complete run.
    let m = ledger.audit_metric(a.id).await.unwrap().unwrap();
    assert_eq!(m.finished_at, 11.25);
    assert!(m.findings.contains(&("duplicate".to_owned(), 1)));
}

/// What the failing-audit gauge reads: the newest runs first, each provider's part of a run
/// that did not complete (none of a complete run's, whose evidence is not read), in the
/// tenant's own chain only.
pub(crate) async fn story_audit_run_heads(ledger: Arc<dyn Ledger>) {
    let (a, _) = tenant_and_source(&*ledger, "acme", "shop").await;
    let (b, _) = tenant_and_source(&*ledger, "globex", "shop").await;
    let parts =
        |ps: serde_json::Value| serde_json::json!({"pages": [{"page": 1}], "providers": ps});
    let mut failed = new_run("2026-11-27", "schedule", "failed");
    failed.evidence = serde_json::json!({"pages": []});
    let mut partial = new_run("2026-11-28", "schedule", "partial");
    partial.evidence = parts(serde_json::json!([
        {"name": "pay", "kind": "stripe", "status": "failed", "reason": "page 3: 503"},
        {"name": "ledger", "kind": "http", "status": "complete", "reason": null},
    ]));
    let mut complete = new_run("2026-11-29", "operator", "complete");
    complete.provider = "ledger".into();
    complete.evidence = parts(serde_json::json!([{"name": "ledger", "status": "complete"}]));
    for r in [failed, partial, complete] {
        ledger.record_audit_run(a.id, r, None).await.unwrap();
    }
    ledger
        .record_audit_run(b.id, new_run("2026-11-29", "schedule", "failed"), None)
        .await
        .unwrap();
    let heads = ledger.audit_run_heads(a.id, 10).await.unwrap();
    let pair = |n: &str, s: &str| (n.to_owned(), s.to_owned());
    assert_eq!(
        heads,
        vec![
            reckon_ledger::AuditRunHead {
                provider: "ledger".into(),
                status: "complete".into(),
                parts: None,
            },
            reckon_ledger::AuditRunHead {
                provider: "*".into(),
                status: "partial".into(),
                parts: Some(vec![pair("pay", "failed"), pair("ledger", "complete")]),
            },
            reckon_ledger::AuditRunHead {
                provider: "*".into(),
                status: "failed".into(),
                parts: Some(vec![]),
            },
        ]
    );
    assert_eq!(ledger.audit_run_heads(a.id, 1).await.unwrap().len(), 1);
    assert_eq!(ledger.audit_run_heads(b.id, 10).await.unwrap().len(), 1);
}

/// The support lookup's charges: by the charge's id or by the key it
/// was made with, from any provider of the tenant, never another tenant's.
pub(crate) async fn story_dash_charge_lookup(ledger: Arc<dyn Ledger>) {
    let (a, _) = tenant_and_source(&*ledger, "acme", "shop").await;
    let (b, _) = tenant_and_source(&*ledger, "globex", "shop").await;
    let mut ids = Vec::new();
    for t in [&a, &b] {
        let p = ledger
            .add_provider(
                t.id,
                reckon_ledger::NewProvider {
                    name: "pay".into(),
                    kind: reckon_ledger::ProviderKind::Demo,
                    secret: None,
                    settings: serde_json::json!({"base_url": "http://127.0.0.1:9/"}),
                },
            )
            .await
            .unwrap();
        ids.push(p.id);
    }
    let mut keyed = stored_charge(ids[0], "ch_keyed", 200.0, 700);
    keyed.idempotency_key = Some("charge:v1:ORD-9".into());
    ledger
        .store_provider_charges(
            a.id,
            &[stored_charge(ids[0], "ch_1", 100.0, 500), keyed.clone()],
        )
        .await
        .unwrap();
    let mut b_keyed = stored_charge(ids[1], "ch_1", 100.0, 500);
    b_keyed.idempotency_key = Some("charge:v1:ORD-9".into());
    ledger
        .store_provider_charges(b.id, &[b_keyed])
        .await
        .unwrap();
    let s = |v: &[&str]| {
        v.iter()
            .map(std::string::ToString::to_string)
            .collect::<Vec<_>>()
    };
    let got = ledger
        .charges_by_ids_or_keys(a.id, &s(&["ch_1"]), &s(&["charge:v1:ORD-9"]), 50)
        .await
        .unwrap();
    assert_eq!(
        got.iter().map(|c| c.charge_id.as_str()).collect::<Vec<_>>(),
        vec!["ch_1", "ch_keyed"],
        "oldest first, one of each"
    );
    assert!(got.iter().all(|c| c.provider_id == ids[0]), "A's only");
    assert_eq!(got[1], keyed);
    let by_key = ledger
        .charges_by_ids_or_keys(a.id, &[], &s(&["charge:v1:ORD-9"]), 50)
        .await
        .unwrap();
    assert_eq!(by_key.len(), 1);
    assert!(
        ledger
            .charges_by_ids_or_keys(a.id, &s(&["ch_nope"]), &[], 50)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        ledger
            .charges_by_ids_or_keys(a.id, &[], &[], 50)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        ledger
            .charges_by_ids_or_keys(b.id, &s(&["ch_keyed"]), &[], 50)
            .await
            .unwrap()
            .len(),
        0,
        "B never sees A's charge"
    );

    // By what names a charge besides its id: the order id in its key, its PaymentIntent, a
    // refund, a metadata value. A re-import that changes the metadata forgets the old value.
    let mut named = stored_charge(ids[0], "ch_named", 300.0, 900);
    named.idempotency_key = Some("charge:v1:ORD-77:line-2".into());
    named.refunds = serde_json::json!([{"id": "re_1", "amount": 100}]);
    named.metadata = serde_json::json!({"order_id": "ORD-78", "n": 3});
    ledger
        .store_provider_charges(a.id, std::slice::from_ref(&named))
        .await
        .unwrap();
    for term in [
        "ORD-77",
        "line-2",
        "ORD-77:line-2",
        "charge:v1:ORD-77:line-2",
        "pi_ch_named",
        "re_1",
        "ORD-78",
    ] {
        let got = ledger
            .charges_by_ids_or_keys(a.id, &s(&[term]), &[], 50)
            .await
            .unwrap();
        assert_eq!(
            got.iter().map(|c| c.charge_id.as_str()).collect::<Vec<_>>(),
            vec!["ch_named"],
            "{term}"
        );
    }
    assert!(
        ledger
            .charges_by_ids_or_keys(b.id, &s(&["ORD-78"]), &[], 50)
            .await
            .unwrap()
            .is_empty(),
        "B never finds A's charge by a term"
    );
    named.metadata = serde_json::json!({"order_id": "ORD-79"});
    ledger
        .store_provider_charges(a.id, std::slice::from_ref(&named))
        .await
        .unwrap();
    let find = |t: &'static str| {
        let ledger = ledger.clone();
        async move {
            ledger
                .charges_by_ids_or_keys(a.id, &[t.to_owned()], &[], 50)
                .await
                .unwrap()
                .len()
        }
    };
    assert_eq!(
        find("ORD-78").await,
        0,
        "the old metadata value is forgotten"
    );
    assert_eq!(find("ORD-79").await, 1);
}

/// Charges imported before the ledger kept their search terms get them once, at the next
/// migrate, inside each tenant's scope; the job is then struck off.
pub(crate) async fn story_charge_terms_backfill(ledger: Arc<dyn Ledger>, raw: RawDb) {
    let mut ids = Vec::new();
    for slug in ["acme", "globex"] {
        let (t, _) = tenant_and_source(&*ledger, slug, "shop").await;
        let p = ledger
            .add_provider(
                t.id,
                reckon_ledger::NewProvider {
                    name: "pay".into(),
                    kind: reckon_ledger::ProviderKind::Demo,
                    secret: None,
                    settings: serde_json::json!({"base_url": "http://127.0.0.1:9/"}),
                },
            )
            .await
            .unwrap();
        let mut c = stored_charge(p.id, &format!("ch_{slug}"), 100.0, 500);
        c.metadata = serde_json::json!({"order_id": format!("ORD-{slug}")});
        ledger.store_provider_charges(t.id, &[c]).await.unwrap();
        ids.push(t.id);
    }
    // As an older version left them: charges, no terms, and the job pending.
    raw.exec(
        "DELETE FROM provider_charge_term; \
         INSERT INTO pending_backfill (name) VALUES ('charge_terms')",
    )
    .await;
    let find = |ledger: Arc<dyn Ledger>, t, term: &'static str| async move {
        ledger
            .charges_by_ids_or_keys(t, &[term.to_owned()], &[], 50)
            .await
            .unwrap()
            .len()
    };
    assert_eq!(find(ledger.clone(), ids[0], "ORD-acme").await, 0);
    ledger.migrate().await.unwrap();
    assert_eq!(find(ledger.clone(), ids[0], "ORD-acme").await, 1);
    assert_eq!(find(ledger.clone(), ids[1], "ORD-globex").await, 1);
    assert_eq!(
        find(ledger.clone(), ids[1], "ORD-acme").await,
        0,
        "per tenant"
    );
    // Struck off: terms removed now stay removed by a later migrate.
    raw.exec("DELETE FROM provider_charge_term").await;
    ledger.migrate().await.unwrap();
    assert_eq!(find(ledger.clone(), ids[0], "ORD-acme").await, 0);
}

/// Provider answers stored before every answer passed the redactor: the next migrate with
/// the job pending scrubs the tenant's own secrets and the common key shapes from every
/// table that holds them, re-links the audit chain it changed (the runs before the first
/// change keep their digests), writes one audit log line with both heads, and leaves other
/// tenants and clean rows alone.
pub(crate) async fn story_scrub_stored_answers(ledger: Arc<dyn Ledger>, raw: RawDb) {
    // The tenant's own secret has no well-known shape: only knowing it finds it.
    const OWN: &str = "tok-Secret-9f8e7d6c";
    const SHAPED: &str = "sk_live_4eC39HqLyjWDarjtT1zdp7dc";
    let (t, s) = tenant_and_source(&*ledger, "acme", "shop").await;
    let (other, other_src) = tenant_and_source(&*ledger, "globex", "shop").await;
    let p = ledger
        .add_provider(
            t.id,
            reckon_ledger::NewProvider {
                name: "pay".into(),
                kind: reckon_ledger::ProviderKind::Http,
                secret: Some(secrecy::SecretString::from(OWN)),
                settings: serde_json::json!({"base_url": "https://pay.example/"}),
            },
        )
        .await
        .unwrap();
    let now = time::now();
    for (tenant, source) in [(t.id, s.id), (other.id, other_src.id)] {
        ledger
            .ingest(
                tenant,
                source,
                batch(vec![
                    rec("charge:v1:a", State::Unknown, now - 100.0),
                    rec("charge:v1:b", State::Unknown, now - 100.0),
                ]),
            )
            .await
            .unwrap();
    }
    let claims = ledger.claim_due(t.id, "w", now, 60.0, 10).await.unwrap();
    let echo = format!("401: Invalid API key provided: {OWN}");
    for (i, c) in claims.iter().enumerate() {
        let mut a = attempt(
            if i == 0 { "applied" } else { "indeterminate" },
            now,
            now + 60.0,
            i == 0,
        );
        a.provider_id = Some(p.id);
        a.error = (i == 1).then(|| echo.clone());
        a.evidence = serde_json::json!({"classification": {"certificate": {"method": "x"}},
            "steps": [{"body": {"error": {"message": echo}}, "headers": {"authorization": format!("Bearer {OWN}")}}],
            "clean": "page 2 of 3"});
        ledger
            .record_attempt(t.id, c.effect.id, "w", a)
            .await
            .unwrap();
    }
    // The other tenant's row holds the first tenant's secret as plain text: it is not the
    // other tenant's secret, so it stays (each tenant is scrubbed with its own).
    let oc = ledger
        .claim_due(other.id, "w", now, 60.0, 10)
        .await
        .unwrap();
    let mut a = attempt("indeterminate", now, now + 60.0, false);
    a.error = Some(format!("globex saw {OWN}"));
    ledger
        .record_attempt(other.id, oc[0].effect.id, "w", a)
        .await
        .unwrap();

    let mut c = stored_charge(p.id, "ch_1", now, 500);
    c.metadata = serde_json::json!({"order_id": "ORD-1", "api_key": SHAPED});
    c.raw = serde_json::json!({"id": "ch_1", "description": format!("made with {OWN}")});
    let clean = stored_charge(p.id, "ch_2", now, 700);
    ledger
        .store_provider_charges(t.id, &[c, clean.clone()])
        .await
        .unwrap();
    assert_eq!(
        ledger
            .charges_by_ids_or_keys(t.id, &[SHAPED.to_owned()], &[], 10)
            .await
            .unwrap()
            .len(),
        1,
        "before: the key is even a search term"
    );

    let mut r1 = new_run("2026-11-26", "operator", "complete");
    r1.evidence = serde_json::json!({"pages": [{"page": 1}]});
    let mut r2 = new_run("2026-11-27", "schedule", "failed");
    r2.reason = Some(format!("provider pay: {echo}"));
    let mut r3 = new_run("2026-11-28", "schedule", "complete");
    r3.evidence = serde_json::json!({"providers": [{"name": "pay", "reason": SHAPED}]});
    let r4 = new_run("2026-11-29", "schedule", "complete");
    let mut before = Vec::new();
    for r in [r1, r2, r3, r4] {
        before.push(ledger.record_audit_run(t.id, r, None).await.unwrap());
    }
    let other_run = ledger
        .record_audit_run(
            other.id,
            new_run("2026-11-27", "operator", "complete"),
            None,
        )
        .await
        .unwrap();

    // As a version without the redactor left it: the secrets stored, the job pending.
    let has = |cells: &[(String, Vec<u8>)], needle: &str| {
        cells
            .iter()
            .any(|(_, v)| String::from_utf8_lossy(v).contains(needle))
    };
    assert!(has(&raw.cells("reconcile_attempt").await, OWN));
    raw.exec("INSERT INTO pending_backfill (name) VALUES ('scrub_provider_answers') ON CONFLICT DO NOTHING")
        .await;
    ledger.migrate().await.unwrap();

    for table in [
        "reconcile_attempt",
        "reconcile_state",
        "resolution",
        "provider_charge",
        "provider_charge_term",
        "audit_run",
    ] {
        let cells = raw.cells(table).await;
        let own_tenant: Vec<_> = cells
            .iter()
            .filter(|(_, v)| !String::from_utf8_lossy(v).contains("globex saw"))
            .cloned()
            .collect();
        assert!(
            !has(&own_tenant, OWN),
            "{table} still holds the tenant's secret"
        );
        assert!(!has(&cells, SHAPED), "{table} still holds a live key");
    }
    assert!(has(&raw.cells("resolution").await, "[redacted]"));
    assert!(
        has(
            &raw.cells("reconcile_attempt").await,
            &format!("globex saw {OWN}")
        ),
        "another tenant's rows are judged by that tenant's secrets"
    );
    // What was clean is as it was; the charge is still found by its order id.
    let view = ledger
        .reconcile_view(t.id, claims[1].effect.id)
        .await
        .unwrap();
    assert_eq!(view.attempts[0].evidence["clean"], "page 2 of 3");
    assert_eq!(
        view.attempts[0].error.as_deref(),
        Some("401: Invalid API key provided: [redacted]")
    );
    let found = ledger
        .charges_by_ids_or_keys(t.id, &["ORD-1".to_owned()], &[], 10)
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].metadata["api_key"], "[redacted]");
    assert!(
        ledger
            .charges_by_ids_or_keys(t.id, &[SHAPED.to_owned()], &[], 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        ledger
            .provider_charges(t.id, None, now - 10.0, now + 10.0)
            .await
            .unwrap()
            .iter()
            .find(|c| c.charge_id == "ch_2")
            .unwrap()
            .raw,
        clean.raw
    );

    // The chain: intact, the first run untouched, re-linked from the first scrubbed one.
    let after = ledger.audit_chain(t.id, 0, 100).await.unwrap();
    assert!(
        reckon_ledger::verify_chain(t.id.get(), &after).is_empty(),
        "{after:?}"
    );
    assert_eq!(after[0].digest, before[0].digest);
    for i in 1..4 {
        assert_ne!(after[i].digest, before[i].digest, "run {} re-linked", i + 1);
    }
    assert_eq!(
        after[3].run, before[3].run,
        "a clean later run keeps its content"
    );
    assert_eq!(
        after[1].run.reason.as_deref(),
        Some("provider pay: 401: Invalid API key provided: [redacted]")
    );
    assert_eq!(
        ledger.audit_chain(other.id, 0, 100).await.unwrap()[0].digest,
        other_run.digest,
        "another tenant's chain is not touched"
    );
    // A new run goes on top of the new head.
    let r5 = ledger
        .record_audit_run(t.id, new_run("2026-11-30", "operator", "complete"), None)
        .await
        .unwrap();
    assert_eq!(r5.prev_digest, after[3].digest);

    // One line in the tenant's audit log names what changed and both heads.
    let log = ledger.list_actions(t.id, None, 50).await.unwrap();
    let line = log
        .iter()
        .find(|a| a.action == reckon_ledger::SCRUB_ACTION)
        .expect("the scrub is in the audit log");
    assert_eq!(line.actor, "reckon");
    assert_eq!(line.detail["previous_head"], before[3].digest.as_str());
    assert_eq!(line.detail["new_head"], after[3].digest.as_str());
    assert_eq!(line.detail["rechained_from_seq"], 2);
    assert_eq!(line.detail["rows"]["reconcile_attempt"], 2);
    assert_eq!(line.detail["rows"]["provider_charge"], 1);
    assert!(
        ledger
            .list_actions(other.id, None, 50)
            .await
            .unwrap()
            .iter()
            .all(|a| a.action != reckon_ledger::SCRUB_ACTION),
        "nothing changed there, nothing logged"
    );

    // Struck off: the next start does not walk the ledger again.
    raw.exec(&format!(
        "UPDATE reconcile_attempt SET error = 'again {OWN}'"
    ))
    .await;
    ledger.migrate().await.unwrap();
    assert!(has(
        &raw.cells("reconcile_attempt").await,
        &format!("again {OWN}")
    ));
}

/// The overview's glance at a day's audit: the newest run of that day (failed or not),
/// its finding counts, nothing of another day or tenant.
pub(crate) async fn story_dash_audit_glance(ledger: Arc<dyn Ledger>) {
    let (t, _) = tenant_and_source(&*ledger, "acme", "shop").await;
    let (other, _) = tenant_and_source(&*ledger, "globex", "shop").await;
    assert_eq!(ledger.audit_glance(t.id, "2026-11-28").await.unwrap(), None);
    let run = |status: &str, finished: f64, counts: serde_json::Value| reckon_ledger::NewAuditRun {
        day: "2026-11-28".into(),
        time_zone: "UTC".into(),
        window_start: 1_764_288_000.0,
        window_end: 1_764_374_400.0,
        provider: "*".into(),
        triggered_by: "operator".into(),
        status: status.into(),
        reason: (status == "failed").then(|| "provider pay page 3: server error".into()),
        started_at: finished - 1.0,
        finished_at: finished,
        counts,
        findings: serde_json::json!([]),
        totals: serde_json::json!([]),
        evidence: serde_json::json!({"pages": []}),
    };
    ledger
        .record_audit_run(
            t.id,
            run(
                "complete",
                1_764_400_000.0,
                serde_json::json!({"findings": {"duplicate": 2, "orphan": 0}}),
            ),
            None,
        )
        .await
        .unwrap();
    let glance = ledger
        .audit_glance(t.id, "2026-11-28")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(glance.status, "complete");
    let mut findings = glance.findings.clone();
    findings.sort();
    assert_eq!(
        findings,
        [("duplicate".to_owned(), 2), ("orphan".to_owned(), 0)]
    );
    let failed = ledger
        .record_audit_run(
            t.id,
            run("failed", 1_764_401_000.0, serde_json::json!({})),
            None,
        )
        .await
        .unwrap();
    let glance = ledger
        .audit_glance(t.id, "2026-11-28")
        .await
        .unwrap()
        .unwrap();
    // The newest run with findings stays the glance; the newer failure is beside it.
    assert_eq!(glance.status, "complete", "the newest run with findings");
    assert_eq!(glance.findings.len(), 2);
    assert_eq!(
        glance.failure.as_ref().map(|(why, _)| why.as_str()),
        Some("provider pay page 3: server error")
    );
    // The chain's links, in seq order, each naming the digest before it.
    let links = ledger.audit_links(t.id).await.unwrap();
    assert_eq!(
        links.iter().map(|l| l.seq).collect::<Vec<_>>(),
        [1, 2],
        "{links:?}"
    );
    assert_eq!(links[1].id, failed.id);
    assert_eq!(links[1].prev_digest, links[0].digest);
    assert!(reckon_ledger::verify_links(&links).is_empty());
    assert!(ledger.audit_links(other.id).await.unwrap().is_empty());
    assert_eq!(ledger.audit_glance(t.id, "2026-11-27").await.unwrap(), None);
    assert_eq!(
        ledger.audit_glance(other.id, "2026-11-28").await.unwrap(),
        None
    );
}
