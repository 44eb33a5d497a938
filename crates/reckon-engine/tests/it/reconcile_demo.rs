//! The reconciler end to end on a real SQLite ledger against the demo provider served on
//! loopback (the `http` protocol): applied, duplicate, not_applied, a too-recent effect
//! left indeterminate, and an operation routed to no provider.

use reckon_domain::{SourceRecord, State, time};
use reckon_engine::reconcile::{ReconcileCtx, reconcile_all};
use reckon_ledger::{IngestBatch, Keyring, NewProvider, NewSource, Origin, SourceKind};
use reckon_providers::demo::{DemoState, serve_loopback};
use std::collections::HashMap;

fn unknown(key: &str, updated_at: f64) -> SourceRecord {
    SourceRecord {
        key: key.to_owned(),
        state: State::Unknown,
        request_hash: "1:9f86d081884c7d65".to_owned(),
        response: None,
        attempts: 1,
        created_at: updated_at - 1.0,
        updated_at,
        expires_at: None,
    }
}

#[tokio::test]
async fn effects_resolve_applied_duplicate_not_applied_and_errors_or_youth_never_conclude() {
    let dir = tempfile::tempdir().unwrap();
    let keyring = Keyring::from_base64(&Keyring::generate_base64()).unwrap();
    let ledger = reckon_ledger::connect(None, dir.path(), keyring)
        .await
        .unwrap();
    let t = ledger.create_tenant("acme").await.unwrap();
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
    let now = time::now();
    let old = now - 3600.0;
    ledger
        .ingest(
            t.id,
            source.id,
            IngestBatch {
                origin: Origin::Push,
                observed_at: now,
                records: vec![
                    unknown("charge:v1:o1", old),
                    unknown("charge:v1:o2", old),
                    unknown("charge:v1:o3", old),
                    unknown("charge:v1:o4", now),
                    unknown("send_receipt:v1:o5", old),
                ],
                rejected: vec![],
                abandoned_after_secs: 300.0,
                cursor: None,
                lease: None,
                expect_new: false,
            },
        )
        .await
        .unwrap();

    let demo = DemoState::new();
    demo.charge("charge:v1:o1", 1999, "eur", old);
    demo.charge("charge:v1:o2", 500, "eur", old);
    demo.charge("charge:v1:o2", 500, "eur", old + 2.0);
    let (base, _server) = serve_loopback(demo).await.unwrap();
    ledger
        .add_provider(
            t.id,
            NewProvider {
                name: "demo".into(),
                kind: reckon_ledger::ProviderKind::Demo,
                secret: None,
                settings: serde_json::json!({ "base_url": base, "visibility_lag_secs": 30 }),
            },
        )
        .await
        .unwrap();
    ledger
        .set_route(t.id, "shop", "charge", Some("demo"))
        .await
        .unwrap();
    ledger
        .set_route(t.id, "shop", "send_receipt", None)
        .await
        .unwrap();

    let ctx = ReconcileCtx::new(ledger.clone()).with_egress(loopback_allowed());
    let outcomes = reconcile_all(&ctx, &t).await.unwrap();
    let by_key: HashMap<&str, &reckon_engine::reconcile::EffectOutcome> =
        outcomes.iter().map(|o| (o.key.as_str(), o)).collect();
    assert_eq!(by_key.len(), 5, "{outcomes:#?}");
    assert_eq!(by_key["charge:v1:o1"].outcome, "applied");
    assert_eq!(by_key["charge:v1:o2"].outcome, "duplicate");
    assert_eq!(by_key["charge:v1:o3"].outcome, "not_applied");
    assert_eq!(
        by_key["charge:v1:o4"].outcome, "indeterminate",
        "too recent"
    );
    assert!(!by_key["charge:v1:o4"].resolved);
    assert_eq!(by_key["send_receipt:v1:o5"].outcome, "no_provider");
    assert!(by_key["send_receipt:v1:o5"].reason.contains("no provider"));
    for k in ["charge:v1:o1", "charge:v1:o2", "charge:v1:o3"] {
        assert!(by_key[k].resolved, "{k}");
        let view = ledger
            .reconcile_view(t.id, by_key[k].effect_id)
            .await
            .unwrap();
        let r = view.resolution.expect("resolved");
        assert_eq!(r.author, "reconciler");
        assert_eq!(r.outcome.as_str(), by_key[k].outcome);
        assert!(r.evidence["classification"]["outcome"].is_string());
    }
    let o3 = ledger
        .reconcile_view(t.id, by_key["charge:v1:o3"].effect_id)
        .await
        .unwrap();
    let cert = &o3.resolution.unwrap().evidence["classification"]["certificate"];
    assert_eq!(
        cert["method"], "http.lookup",
        "absence carries its certificate"
    );
    let o5 = ledger
        .reconcile_view(t.id, by_key["send_receipt:v1:o5"].effect_id)
        .await
        .unwrap();
    assert_eq!(
        o5.state.unwrap().last_error.as_deref(),
        Some("no provider: routed to none")
    );
    assert!(o5.attempts.is_empty());

    // Running again concludes nothing new and records no second resolution.
    let again = reconcile_all(&ctx, &t).await.unwrap();
    assert!(again.is_empty(), "{again:#?}");
}

#[tokio::test]
async fn a_provider_that_is_down_leaves_effects_indeterminate_with_backoff() {
    let dir = tempfile::tempdir().unwrap();
    let keyring = Keyring::from_base64(&Keyring::generate_base64()).unwrap();
    let ledger = reckon_ledger::connect(None, dir.path(), keyring)
        .await
        .unwrap();
    let t = ledger.create_tenant("acme").await.unwrap();
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
    let now = time::now();
    ledger
        .ingest(
            t.id,
            source.id,
            IngestBatch {
                origin: Origin::Push,
                observed_at: now,
                records: vec![unknown("charge:v1:o1", now - 3600.0)],
                rejected: vec![],
                abandoned_after_secs: 300.0,
                cursor: None,
                lease: None,
                expect_new: false,
            },
        )
        .await
        .unwrap();
    // A port nothing listens on: connection refused.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}/", closed.local_addr().unwrap());
    drop(closed);
    ledger
        .add_provider(
            t.id,
            NewProvider {
                name: "down".into(),
                kind: reckon_ledger::ProviderKind::Http,
                secret: None,
                settings: serde_json::json!({ "base_url": base }),
            },
        )
        .await
        .unwrap();
    ledger
        .set_route(t.id, "shop", "*", Some("down"))
        .await
        .unwrap();
    let ctx = ReconcileCtx::new(ledger.clone()).with_egress(loopback_allowed());
    let out = reconcile_all(&ctx, &t).await.unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].outcome, "indeterminate");
    assert!(!out[0].resolved);
    assert!(out[0].next_attempt_at.unwrap() > now, "backs off");
    let view = ledger.reconcile_view(t.id, out[0].effect_id).await.unwrap();
    assert!(view.resolution.is_none());
    assert_eq!(view.attempts.len(), 1);
    assert_eq!(view.attempts[0].outcome.as_str(), "indeterminate");
}

/// The demo provider listens on loopback, which the default egress policy refuses.
fn loopback_allowed() -> std::sync::Arc<reckon_sources::EgressPolicy> {
    std::sync::Arc::new(
        reckon_sources::EgressPolicy::new(&["127.0.0.0/8".to_owned()], None).expect("policy"),
    )
}

// T09: provider hosts are resolved through the egress policy at every connection.

/// A DNS server of the test's own: each lookup gets the next answer (the last one again
/// when they run out). The system resolver knows none of its names (`.invalid`).
#[derive(Debug)]
struct Dns {
    answers: Vec<std::net::IpAddr>,
    calls: std::sync::atomic::AtomicUsize,
}

impl Dns {
    fn new(answers: &[&str]) -> std::sync::Arc<Dns> {
        std::sync::Arc::new(Dns {
            answers: answers.iter().map(|a| a.parse().unwrap()).collect(),
            calls: Default::default(),
        })
    }

    fn next(&self) -> std::net::IpAddr {
        let n = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.answers[n.min(self.answers.len() - 1)]
    }
}

impl reckon_sources::Resolver for Dns {
    fn lookup<'a>(
        &'a self,
        _host: &'a str,
        _port: u16,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = std::io::Result<Vec<std::net::IpAddr>>> + Send + 'a>,
    > {
        let ip = self.next();
        Box::pin(async move { Ok(vec![ip]) })
    }
}

/// The same answers with no policy in between: what a client that resolves on its own
/// would connect to.
struct Unchecked(std::sync::Arc<Dns>);

impl reckon_providers::AddressPolicy for Unchecked {
    fn addresses(
        &self,
        _host: String,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Vec<std::net::IpAddr>, String>> + Send>,
    > {
        let ip = self.0.next();
        Box::pin(async move { Ok(vec![ip]) })
    }
}

/// A ledger with one old unknown charge routed to a demo provider at `base_url`.
async fn one_unknown_charge(
    base_url: &str,
) -> (
    tempfile::TempDir,
    std::sync::Arc<dyn reckon_ledger::Ledger>,
    reckon_ledger::Tenant,
) {
    let dir = tempfile::tempdir().unwrap();
    let keyring = Keyring::from_base64(&Keyring::generate_base64()).unwrap();
    let ledger = reckon_ledger::connect(None, dir.path(), keyring)
        .await
        .unwrap();
    let t = ledger.create_tenant("acme").await.unwrap();
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
    let now = time::now();
    ledger
        .ingest(
            t.id,
            source.id,
            IngestBatch {
                origin: Origin::Push,
                observed_at: now,
                records: vec![unknown("charge:v1:o1", now - 3600.0)],
                rejected: vec![],
                abandoned_after_secs: 300.0,
                cursor: None,
                lease: None,
                expect_new: false,
            },
        )
        .await
        .unwrap();
    ledger
        .add_provider(
            t.id,
            NewProvider {
                name: "pay".into(),
                kind: reckon_ledger::ProviderKind::Demo,
                secret: None,
                settings: serde_json::json!({ "base_url": base_url, "visibility_lag_secs": 30 }),
            },
        )
        .await
        .unwrap();
    ledger
        .set_route(t.id, "shop", "charge", Some("pay"))
        .await
        .unwrap();
    (dir, ledger, t)
}

/// T09 for providers: the base URL names `rebind.invalid`, a host only the test's resolver
/// knows. The operator allows 127.0.0.1 only; a server standing in for a forbidden target
/// (an admin port, the metadata service) listens on 127.0.0.2 at the same port.
///
/// 1. The name answers 127.0.0.1 every time: the lookup reaches the demo provider, so the
///    HTTP client resolved the name through the policy's resolver (the system's has no
///    answer for it).
/// 2. The name answers 127.0.0.1 to the check before the step and 127.0.0.2 when the
///    client connects: the connection is refused by the policy, the effect stays
///    undecided with the reason, and the forbidden server is never connected to.
/// 3. The test can fail: a client resolving the same answers without the policy connects
///    to the forbidden server.
#[tokio::test]
async fn a_provider_host_that_rebinds_is_never_connected_at_the_forbidden_address() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let demo = DemoState::new();
    demo.charge("charge:v1:o1", 1999, "eur", time::now() - 3600.0);
    let (base, _server) = serve_loopback(demo).await.unwrap();
    let port = url::Url::parse(&base).unwrap().port().unwrap();
    let forbidden = tokio::net::TcpListener::bind(("127.0.0.2", port))
        .await
        .expect("127.0.0.2 is loopback on Linux");
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = forbidden.accept().await {
            h.fetch_add(1, Ordering::SeqCst);
            drop(conn);
        }
    });
    let url = format!("http://rebind.invalid:{port}/");
    let policy = |dns: Arc<Dns>| {
        Arc::new(
            reckon_sources::EgressPolicy::new(&["127.0.0.1/32".to_owned()], None)
                .unwrap()
                .with_resolver(dns),
        )
    };

    // 1. Always 127.0.0.1.
    let (_dir, ledger, t) = one_unknown_charge(&url).await;
    let dns = Dns::new(&["127.0.0.1"]);
    let ctx = ReconcileCtx::new(ledger.clone()).with_egress(policy(dns.clone()));
    let out = reconcile_all(&ctx, &t).await.unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].outcome, "applied", "{out:#?}");
    assert!(
        dns.calls.load(Ordering::SeqCst) >= 2,
        "the check before the step, and the connection"
    );

    // 2. 127.0.0.1 to the check, 127.0.0.2 to the connection.
    let (_dir2, ledger, t) = one_unknown_charge(&url).await;
    let dns = Dns::new(&["127.0.0.1", "127.0.0.2"]);
    let ctx = ReconcileCtx::new(ledger.clone()).with_egress(policy(dns.clone()));
    let out = reconcile_all(&ctx, &t).await.unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].outcome, "indeterminate", "{out:#?}");
    assert!(!out[0].resolved);
    assert!(out[0].reason.contains("egress policy"), "{out:#?}");
    assert!(out[0].reason.contains("127.0.0.2"), "{out:#?}");
    assert_eq!(
        dns.calls.load(Ordering::SeqCst),
        2,
        "one check, one connection"
    );
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "the forbidden address was connected to"
    );

    // 2b. The settings page's "test" of the provider goes through the same confined client.
    let (_dir3, ledger, t) = one_unknown_charge(&url).await;
    let dns = Dns::new(&["127.0.0.1", "127.0.0.2"]);
    let provider = ledger.provider_by_name(t.id, "pay").await.unwrap();
    let report = reckon_engine::probe::test_provider(
        ledger.as_ref(),
        &t,
        &provider,
        &policy(dns.clone()),
        &reckon_providers::GetClient::shared(),
        time::now(),
    )
    .await;
    assert!(!report.ok, "{report:?}");
    assert!(report.message.contains("127.0.0.2"), "{report:?}");
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "the probe connected to the forbidden address"
    );

    // 3. Without the policy in between, the same answers reach the forbidden server.
    let unchecked = reckon_providers::GetClient::new(std::time::Duration::from_secs(5))
        .confined(Arc::new(Unchecked(Dns::new(&["127.0.0.2"]))));
    let _ = unchecked.get(&url::Url::parse(&url).unwrap(), &[]).await;
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}
