//! One tenant holding every case support's lookup must answer, planted the way they arise:
//! effects ingested as a push source sends them, verdicts from the real reconciler asking the
//! demo provider on loopback, findings from a real audit of yesterday over that provider
//! (beside a second provider that is down, so the day is partial), and a resolution by hand.
//! Shared by the API, dashboard, browser and CLI tests, so every surface answers the same
//! cases.

use reckon_domain::{SourceRecord, State, time};
use reckon_engine::audit::{AuditCtx, AuditRequest, run_audit};
use reckon_engine::reconcile::{ReconcileCtx, reconcile_all};
use reckon_ledger::{
    IngestBatch, Ledger, NewProvider, NewResolution, NewSource, Origin, SourceKind, Tenant,
};
use reckon_providers::demo::{DemoCharge, DemoState, serve_loopback};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Where each case lives.
pub struct Cases {
    /// The demo provider's charge id of the order reckon reconciled as applied.
    pub applied_charge: String,
    /// The refund id of the duplicate order's second charge.
    pub duplicate_refund: String,
    /// Yesterday, as the audit names it.
    pub day: String,
    /// Keeps the demo provider serving.
    _server: Box<dyn std::any::Any + Send + Sync>,
}

/// The orders, by case.
pub const APPLIED: &str = "ORD-A1";
pub const NOT_APPLIED: &str = "ORD-N1";
pub const DUPLICATE_RECONCILED: &str = "ORD-D1";
pub const PROVISIONAL: &str = "ORD-P1";
pub const MISSING: &str = "ORD-M1";
pub const ORPHAN: &str = "ORD-O1";
pub const DUPLICATE_AUDIT: &str = "ORD-W1";
pub const ABANDONED: &str = "ORD-B1";
pub const UNROUTED: &str = "ORD-R1";
pub const BY_HAND: &str = "ORD-H1";
/// Reconciled as not charged; the provider's list of the day, read later, has its charge.
pub const CONTRADICTED: &str = "ORD-C1";
/// Recorded failed by the application; the provider charged it.
pub const CHARGED_NOT_RECORDED: &str = "ORD-F1";
/// A claim the application released (deleted) after a transient failure; the provider
/// charged it.
pub const RELEASED: &str = "ORD-L1";
pub const NOBODY_HAS: &str = "ORD-ZZZ9";
/// An order of three effects: its charge (recorded succeeded, charged once to a customer
/// the provider names), its receipt email (sent, with the message id the application
/// recorded) and a refund nobody answers for.
pub const MULTI: &str = "ORD-1017";
pub const MULTI_CUSTOMER: &str = "cus_K1017";
pub const MULTI_CHARGE: &str = "demo_ch_k1017";
/// The receipt email's id, as the application recorded it in its row.
pub const MULTI_RECEIPT: &str = "msg_K1017_0001";
/// Words of reckon's own workings that support cannot read to a customer: none may be in a
/// sentence (they belong in an answer's details).
pub const DEVELOPER_WORDS: &[&str] = &[
    "still says",
    "says unknown",
    "as unknown",
    "times without",
    "1 times",
    "NotFound",
    "HTTP ",
    "http.",
    ": failed",
    "(last:",
    "indeterminate",
    "not_applied",
    "classification",
    "certificate",
    "witness",
    "evidence",
    ":v1:",
    "send_receipt",
    " effect",
    "Err(",
    "error:",
];

/// The developer words `sentence` holds.
pub fn developer_words(sentence: &str) -> Vec<&'static str> {
    DEVELOPER_WORDS
        .iter()
        .copied()
        .filter(|w| sentence.contains(w))
        .collect()
}

pub const HAND_AUTHOR: &str = "sam@acme.test";
pub const HAND_NOTE: &str = "Customer sent the bank statement: paid once.";

fn rec(key: &str, state: State, created_at: f64, updated_at: f64) -> SourceRecord {
    SourceRecord {
        key: key.to_owned(),
        state,
        request_hash: "1:9f86d081884c7d65".to_owned(),
        response: None,
        attempts: 1,
        created_at,
        updated_at,
        expires_at: None,
    }
}

async fn ingest(ledger: &dyn Ledger, t: &Tenant, source: i64, records: Vec<SourceRecord>) {
    ledger
        .ingest(
            t.id,
            source,
            IngestBatch {
                origin: Origin::Push,
                observed_at: time::now(),
                records,
                rejected: vec![],
                abandoned_after_secs: 300.0,
                cursor: None,
                lease: None,
                expect_new: false,
            },
        )
        .await
        .unwrap();
}

fn loopback() -> Arc<reckon_sources::EgressPolicy> {
    Arc::new(reckon_sources::EgressPolicy::new(&["127.0.0.0/8".to_owned()], None).unwrap())
}

/// Plant every case in `t` (whose time zone is UTC) and return where they are.
pub async fn plant(ledger: Arc<dyn Ledger>, t: &Tenant) -> Cases {
    let now = time::now();
    let day = reckon_audit::DayWindow::yesterday(now, "UTC").unwrap();
    let y = |hours: f64| day.start + hours * 3600.0;
    let source = ledger
        .add_source(
            t.id,
            NewSource {
                name: "shop".into(),
                kind: SourceKind::Push,
                dsn: None,
                dsn_display: None,
                table_name: "justonce_keys".into(),
                scan_interval_secs: 60,
                abandoned_after_secs: 300.0,
                overlap_secs: 5.0,
                full_scan_every_secs: 3600,
                mapping: None,
            },
        )
        .await
        .unwrap();

    // What the provider holds.
    let demo = DemoState::new();
    let applied_charge = demo.charge(&format!("charge:v1:{APPLIED}"), 2000, "usd", y(1.0));
    demo.charge(
        &format!("charge:v1:{DUPLICATE_RECONCILED}"),
        1500,
        "usd",
        y(2.0),
    );
    demo.charge(
        &format!("charge:v1:{DUPLICATE_RECONCILED}"),
        1500,
        "usd",
        y(2.0) + 30.0,
    );
    demo.charge(&format!("charge:v1:{PROVISIONAL}"), 990, "usd", now - 5.0);
    demo.charge(
        &format!("charge:v1:{CHARGED_NOT_RECORDED}"),
        3100,
        "usd",
        y(10.0) + 2.0,
    );
    demo.charge(&format!("charge:v1:{RELEASED}"), 4200, "usd", y(11.0) + 2.0);
    // Charged twice, one refunded since: the audit's duplicate, with amounts.
    demo.charge(
        &format!("charge:v1:{DUPLICATE_AUDIT}"),
        123_400,
        "usd",
        y(5.0),
    );
    let duplicate_refund = "re_demo_w1".to_owned();
    demo.add(DemoCharge {
        id: "demo_ch_w1b".into(),
        key: format!("charge:v1:{DUPLICATE_AUDIT}"),
        status: "succeeded".into(),
        amount: 123_400,
        currency: "usd".into(),
        created: y(5.0) + 40.0,
        refunds: vec![(duplicate_refund.clone(), 123_400, Some("duplicate".into()))],
        metadata: BTreeMap::new(),
        customer: None,
    });
    // Money taken with no effect behind it, named only by the order id in its metadata.
    demo.add(DemoCharge {
        id: "demo_ch_orphan".into(),
        key: String::new(),
        status: "succeeded".into(),
        amount: 4900,
        currency: "usd".into(),
        created: y(6.0),
        refunds: vec![],
        metadata: BTreeMap::from([("order_id".to_owned(), ORPHAN.to_owned())]),
        customer: None,
    });
    demo.add(DemoCharge {
        id: MULTI_CHARGE.into(),
        key: format!("charge:v1:{MULTI}"),
        status: "succeeded".into(),
        amount: 2500,
        currency: "usd".into(),
        created: y(12.0) + 1.0,
        refunds: vec![],
        metadata: BTreeMap::new(),
        customer: Some(MULTI_CUSTOMER.into()),
    });
    let later = demo.clone();
    let (base, server) = serve_loopback(demo).await.unwrap();
    ledger
        .add_provider(
            t.id,
            NewProvider {
                name: "pay".into(),
                kind: reckon_ledger::ProviderKind::Demo,
                secret: None,
                settings: serde_json::json!({ "base_url": base, "visibility_lag_secs": 30 }),
            },
        )
        .await
        .unwrap();
    // An in-house ledger that is down: its part of every audit fails.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down = format!("http://{}/", closed.local_addr().unwrap());
    drop(closed);
    ledger
        .add_provider(
            t.id,
            NewProvider {
                name: "legacy".into(),
                kind: reckon_ledger::ProviderKind::Demo,
                secret: None,
                settings: serde_json::json!({ "base_url": down }),
            },
        )
        .await
        .unwrap();
    ledger
        .set_route(t.id, "shop", "charge", Some("pay"))
        .await
        .unwrap();
    ledger
        .set_route(t.id, "shop", "send_receipt", None)
        .await
        .unwrap();

    let charge = |o: &str| format!("charge:v1:{o}");
    let succeeded = |o: &str, at: f64| {
        let mut r = rec(&charge(o), State::Succeeded, at, at + 2.0);
        r.response = Some(format!(r#"{{"id": "ch_app_{o}"}}"#));
        r
    };
    let mut first = vec![
        rec(
            &charge(APPLIED),
            State::Unknown,
            y(1.0) - 1.0,
            y(1.0) + 30.0,
        ),
        rec(&charge(NOT_APPLIED), State::Unknown, y(1.5), y(1.5) + 30.0),
        rec(
            &charge(DUPLICATE_RECONCILED),
            State::Unknown,
            y(2.0) - 1.0,
            y(2.0) + 60.0,
        ),
        rec(&charge(PROVISIONAL), State::Unknown, now - 6.0, now - 4.0),
        succeeded(MISSING, y(4.0)),
        succeeded(DUPLICATE_AUDIT, y(5.0) - 1.0),
        rec(
            &format!("send_receipt:v1:{UNROUTED}"),
            State::Unknown,
            y(7.0),
            y(7.0) + 5.0,
        ),
        rec(
            &format!("send_receipt:v1:{BY_HAND}"),
            State::Unknown,
            y(8.0),
            y(8.0) + 5.0,
        ),
    ];
    // The missing order's application record names a charge the provider never had.
    first[4].response = Some(r#"{"id": "ch_never_seen"}"#.into());
    let mut released = rec(&charge(RELEASED), State::InProgress, y(11.0), y(11.0));
    released.expires_at = Some(y(11.0) + 30.0);
    first.extend([
        rec(&charge(CONTRADICTED), State::Unknown, y(9.0), y(9.0) + 30.0),
        rec(
            &charge(CHARGED_NOT_RECORDED),
            State::Failed,
            y(10.0),
            y(10.0) + 5.0,
        ),
        released,
    ]);
    let mut receipt = rec(
        &format!("send_receipt:v1:{MULTI}"),
        State::Succeeded,
        y(12.0) + 3.0,
        y(12.0) + 4.0,
    );
    receipt.response = Some(format!(r#"{{"message_id": "{MULTI_RECEIPT}"}}"#));
    first.extend([
        {
            let mut r = succeeded(MULTI, y(12.0));
            r.response = Some(format!(
                r#"{{"id": "{MULTI_CHARGE}", "amount": 2500, "currency": "usd"}}"#
            ));
            r
        },
        receipt,
        rec(
            &format!("refund:v1:{MULTI}"),
            State::Unknown,
            y(13.0),
            y(13.0) + 5.0,
        ),
    ]);
    ingest(ledger.as_ref(), t, source.id, first).await;
    // The application released the claim (its row deleted): a scan sees it gone.
    let gone = ledger
        .mark_gone(
            t.id,
            source.id,
            &[charge(RELEASED)],
            time::now(),
            reckon_ledger::Origin::Scan,
            None,
        )
        .await
        .unwrap();
    assert_eq!(gone[0].1.as_str(), "released", "{gone:?}");

    let ctx = ReconcileCtx::new(ledger.clone()).with_egress(loopback());
    reconcile_all(&ctx, t).await.unwrap();
    // After the verdict, the provider shows a charge carrying the key (its answer then was
    // wrong, or a retry paid later): the audit of the day imports it.
    later.charge(&charge(CONTRADICTED), 2500, "usd", y(9.0) + 10.0);

    // A worker died mid-charge after the reconciler's run: an abandoned claim, not asked yet.
    let mut claim = rec(
        &charge(ABANDONED),
        State::InProgress,
        now - 7200.0,
        now - 7200.0,
    );
    claim.expires_at = Some(now - 7170.0);
    ingest(ledger.as_ref(), t, source.id, vec![claim]).await;

    let by_hand = ledger
        .get_effect(t.id, "shop", &format!("send_receipt:v1:{BY_HAND}"))
        .await
        .unwrap()
        .unwrap();
    ledger
        .resolve_by_hand(
            t.id,
            by_hand.effect.id,
            NewResolution {
                outcome: reckon_ledger::Outcome::Applied,
                author: HAND_AUTHOR.into(),
                note: Some(HAND_NOTE.into()),
                evidence: serde_json::json!({}),
            },
        )
        .await
        .unwrap();

    let mut audit = AuditCtx::new(ledger.clone());
    audit.egress = loopback();
    let run = run_audit(
        &audit,
        t.id,
        &AuditRequest {
            date: Some(day.date.clone()),
            provider: None,
            triggered_by: "operator".into(),
            now,
        },
        None,
    )
    .await
    .unwrap();
    assert_eq!(run.run.status, "partial", "{:?}", run.run.reason);

    Cases {
        applied_charge,
        duplicate_refund,
        day: day.date,
        _server: Box::new(server),
    }
}
