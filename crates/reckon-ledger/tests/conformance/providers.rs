//! Provider accounts, routes and requeues.

use super::*;

pub(crate) async fn story_rc_providers(ledger: Arc<dyn Ledger>, raw: RawDb) {
    let (t, s) = tenant_and_source(&*ledger, "acme", "shop").await;
    let p = ledger
        .add_provider(
            t.id,
            reckon_ledger::NewProvider {
                name: "stripe-live".into(),
                kind: reckon_ledger::ProviderKind::Stripe,
                secret: Some(SecretString::from("rk_live_canary123".to_owned())),
                settings: serde_json::json!({ "mode": "live" }),
            },
        )
        .await
        .unwrap();
    assert!(p.has_secret);
    assert_eq!(p.settings["mode"], "live");
    let cells = raw.cells("provider").await;
    assert!(
        cells
            .iter()
            .all(|(_, v)| !String::from_utf8_lossy(v).contains("canary123")),
        "the secret is stored only sealed"
    );
    assert_eq!(
        ledger
            .provider_secret(t.id, &p)
            .await
            .unwrap()
            .unwrap()
            .expose_secret(),
        "rk_live_canary123"
    );
    assert!(matches!(
        ledger
            .add_provider(
                t.id,
                reckon_ledger::NewProvider {
                    name: "stripe-live".into(),
                    kind: reckon_ledger::ProviderKind::Stripe,
                    secret: None,
                    settings: serde_json::json!({}),
                },
            )
            .await,
        Err(LedgerError::Conflict(_))
    ));
    let r = ledger
        .set_route(t.id, "shop", "charge", Some("stripe-live"))
        .await
        .unwrap();
    assert_eq!(r.provider_id, Some(p.id));
    ledger
        .set_route(t.id, "shop", "send_receipt", None)
        .await
        .unwrap();
    ledger
        .set_route(t.id, "shop", "charge", Some("stripe-live"))
        .await
        .unwrap();
    let routes = ledger.list_routes(t.id).await.unwrap();
    assert_eq!(routes.len(), 2, "setting a route again replaces it");
    assert!(
        ledger
            .set_route(t.id, "shop", "Bad Op", None)
            .await
            .is_err()
    );
    assert!(
        ledger
            .set_route(t.id, "nope", "charge", None)
            .await
            .is_err()
    );

    let other = ledger.create_tenant("other").await.unwrap();
    assert!(ledger.list_providers(other.id).await.unwrap().is_empty());
    assert!(
        ledger
            .provider_by_name(other.id, "stripe-live")
            .await
            .is_err()
    );
    assert!(ledger.provider_by_id(other.id, p.id).await.is_err());
    assert!(ledger.list_routes(other.id).await.unwrap().is_empty());
    assert!(
        ledger
            .set_route(other.id, "shop", "charge", None)
            .await
            .is_err()
    );

    // bulk re-lookup: indeterminate effects of the provider in a time range become due now
    let now = time::now();
    ledger
        .ingest(
            t.id,
            s.id,
            batch(vec![rec("charge:v1:o9", State::Unknown, now - 100.0)]),
        )
        .await
        .unwrap();
    let c = ledger.claim_due(t.id, "w", now, 30.0, 10).await.unwrap();
    let id = c[0].effect.id;
    let mut a = attempt("indeterminate", now, now + 9999.0, false);
    a.provider_id = Some(p.id);
    a.needs_attention = true;
    ledger.record_attempt(t.id, id, "w", a).await.unwrap();
    assert!(
        ledger
            .claim_due(t.id, "w", now + 1.0, 30.0, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        ledger
            .requeue_indeterminate(other.id, p.id, 0.0, now, now)
            .await
            .unwrap(),
        0,
        "not another tenant's"
    );
    assert_eq!(
        ledger
            .requeue_indeterminate(t.id, p.id, now + 10.0, now + 20.0, now)
            .await
            .unwrap(),
        0,
        "outside the range"
    );
    assert_eq!(
        ledger
            .requeue_indeterminate(t.id, p.id, 0.0, now, now)
            .await
            .unwrap(),
        1
    );
    let st = ledger
        .reconcile_view(t.id, id)
        .await
        .unwrap()
        .state
        .unwrap();
    assert!(!st.needs_attention);
    assert_eq!(
        ledger
            .claim_due(t.id, "w", now + 1.0, 30.0, 10)
            .await
            .unwrap()
            .len(),
        1
    );
    // A kind stored by hand that reckon does not know is read as an error naming the kinds
    // there are, never passed on as a word to guess from.
    raw.exec("UPDATE provider SET kind = 'adyen' WHERE name = 'stripe-live'")
        .await;
    let e = ledger.list_providers(t.id).await.unwrap_err();
    assert!(
        matches!(&e, LedgerError::Invalid(m) if m.contains("\"adyen\" is unknown: use stripe, http or demo")),
        "{e}"
    );
}

/// A provider's calibration is kept for the settings it was measured with: written only
/// while the provider has them, cleared when they change (a secret alone does not), and
/// never written or read across tenants.
pub(crate) async fn story_rc_calibration(ledger: Arc<dyn Ledger>) {
    let (a, _) = tenant_and_source(&*ledger, "acme", "shop").await;
    let (b, _) = tenant_and_source(&*ledger, "beta", "shop").await;
    let settings = serde_json::json!({ "mode": "test", "metadata_field": "order_key" });
    let add = |t: reckon_ledger::TenantId| {
        let ledger = ledger.clone();
        let settings = settings.clone();
        async move {
            ledger
                .add_provider(
                    t,
                    reckon_ledger::NewProvider {
                        name: "stripe".into(),
                        kind: reckon_ledger::ProviderKind::Stripe,
                        secret: Some(SecretString::from("rk_test_cal".to_owned())),
                        settings,
                    },
                )
                .await
                .unwrap()
        }
    };
    let pa = add(a.id).await;
    let pb = add(b.id).await;
    assert!(pa.calibration.is_none(), "not measured yet");
    let cal = serde_json::json!({"status": "uncalibrated", "samples": 24, "found": 0,
        "reason": "found 0 of 24"});
    assert!(
        ledger
            .record_calibration(a.id, pa.id, &pa.settings, &cal)
            .await
            .unwrap()
    );
    let read = ledger.provider_by_name(a.id, "stripe").await.unwrap();
    assert_eq!(read.calibration.as_ref(), Some(&cal));
    assert_eq!(
        ledger.list_providers(a.id).await.unwrap()[0].calibration,
        Some(cal.clone())
    );
    // Another tenant's provider id, from this tenant: nothing written, nothing seen.
    assert!(
        !ledger
            .record_calibration(a.id, pb.id, &pb.settings, &cal)
            .await
            .unwrap()
    );
    assert!(
        ledger
            .provider_by_name(b.id, "stripe")
            .await
            .unwrap()
            .calibration
            .is_none()
    );
    // Measured for settings the provider no longer has: not written.
    let other = serde_json::json!({ "mode": "test" });
    assert!(
        !ledger
            .record_calibration(a.id, pa.id, &other, &cal)
            .await
            .unwrap()
    );
    // A new secret keeps it; new settings clear it.
    let change =
        |secret: Option<&str>, settings: Option<serde_json::Value>| reckon_ledger::ProviderChange {
            secret: secret.map(|s| SecretString::from(s.to_owned())),
            settings,
        };
    let p = ledger
        .update_provider(a.id, "stripe", change(Some("rk_test_new"), None))
        .await
        .unwrap();
    assert_eq!(p.calibration, Some(cal));
    let p = ledger
        .update_provider(a.id, "stripe", change(None, Some(settings.clone())))
        .await
        .unwrap();
    assert!(p.calibration.is_some(), "the same settings again keep it");
    let p = ledger
        .update_provider(a.id, "stripe", change(None, Some(other)))
        .await
        .unwrap();
    assert!(p.calibration.is_none(), "changed settings clear it");
}
