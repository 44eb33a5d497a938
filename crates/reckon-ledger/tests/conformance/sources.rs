//! Sources, their sealed DSNs, scan cursors and scan requests.

use super::*;

// 4. sources
pub(crate) async fn story_sources(ledger: Arc<dyn Ledger>, raw: RawDb) {
    let canary = format!("canary-{:016x}", rand::random::<u64>());
    let dsn_a = format!("postgres://reckon:{canary}@db.internal:5432/shop");
    let dsn_g = format!("mysql://app:{canary}-g@10.0.0.9/globex");
    let acme = ledger.create_tenant("acme").await.unwrap();
    let globex = ledger.create_tenant("globex").await.unwrap();

    let shop_a = ledger
        .add_source(
            acme.id,
            NewSource {
                kind: SourceKind::Postgres,
                dsn: Some(SecretString::from(dsn_a.clone())),
                dsn_display: Some("postgres://reckon:***@db.internal:5432/shop".into()),
                table_name: "public.justonce_keys".into(),
                scan_interval_secs: 30,
                abandoned_after_secs: 120.5,
                overlap_secs: 2.25,
                full_scan_every_secs: 7200,
                ..push_source("shop")
            },
        )
        .await
        .expect("add acme/shop");
    assert_eq!(shop_a.name, "shop");
    assert_eq!(shop_a.kind, SourceKind::Postgres);
    assert_eq!(shop_a.table_name, "public.justonce_keys");
    assert_eq!(
        (
            shop_a.scan_interval_secs,
            shop_a.abandoned_after_secs,
            shop_a.overlap_secs,
            shop_a.full_scan_every_secs
        ),
        (30, 120.5, 2.25, 7200)
    );
    assert!(shop_a.cursor.is_none());
    assert_eq!(shop_a.consecutive_failures, 0);

    let shop_g = ledger
        .add_source(
            globex.id,
            NewSource {
                kind: SourceKind::Mysql,
                dsn: Some(SecretString::from(dsn_g.clone())),
                dsn_display: Some("mysql://app:***@10.0.0.9/globex".into()),
                ..push_source("shop")
            },
        )
        .await
        .expect("the same name in another tenant is allowed");
    let push_g = ledger
        .add_source(globex.id, push_source("billing"))
        .await
        .unwrap();

    let names = |v: Vec<Source>| v.into_iter().map(|s| s.name).collect::<Vec<_>>();
    assert_eq!(names(ledger.list_sources(acme.id).await.unwrap()), ["shop"]);
    assert_eq!(
        names(ledger.list_sources(globex.id).await.unwrap()),
        ["billing", "shop"]
    );
    assert_eq!(
        ledger.source_by_name(acme.id, "shop").await.unwrap().id,
        shop_a.id
    );
    assert_eq!(
        ledger.source_by_name(globex.id, "shop").await.unwrap().id,
        shop_g.id
    );
    match ledger.source_by_name(acme.id, "billing").await {
        Err(LedgerError::NotFound(_)) => {}
        other => panic!("another tenant's source must be NotFound, got {other:?}"),
    }

    let dsn = ledger.source_dsn(acme.id, &shop_a).await.unwrap();
    assert_eq!(dsn.expose_secret(), dsn_a);
    let dsn = ledger.source_dsn(globex.id, &shop_g).await.unwrap();
    assert_eq!(dsn.expose_secret(), dsn_g);
    assert!(
        ledger.source_dsn(globex.id, &shop_a).await.is_err(),
        "another tenant's DSN must never be opened"
    );
    assert!(
        ledger.source_dsn(globex.id, &push_g).await.is_err(),
        "a push source has no DSN"
    );

    match ledger.add_source(acme.id, push_source("shop")).await {
        Err(LedgerError::Conflict(_)) => {}
        other => panic!("the same name twice in one tenant must be a Conflict, got {other:?}"),
    }
    match ledger.add_source(acme.id, push_source("Shop Floor")).await {
        Err(LedgerError::Invalid(_)) => {}
        other => panic!("a bad source name must be Invalid, got {other:?}"),
    }

    let all = ledger.all_scanned_sources().await.unwrap();
    let mut scanned: Vec<(String, String)> =
        all.into_iter().map(|(t, s)| (t.slug, s.name)).collect();
    scanned.sort();
    assert_eq!(
        scanned,
        [
            ("acme".into(), "shop".into()),
            ("globex".into(), "shop".into())
        ],
        "push sources are not scanned"
    );

    // The stored table: the secret appears nowhere, in clear or hex.
    let cells = raw.cells("source").await;
    assert!(
        cells.iter().any(|(_, v)| v == b"shop"),
        "the raw dump must see the source rows: {cells:?}"
    );
    assert!(
        cells
            .iter()
            .any(|(c, v)| c == "dsn_ciphertext" && v.len() > dsn_a.len()),
        "the DSN must be stored sealed"
    );
    let hex_canary = hex_lower(canary.as_bytes());
    for (col, v) in &cells {
        let text = String::from_utf8_lossy(v).to_lowercase();
        assert!(
            !text.contains(&canary) && !text.contains(&hex_canary),
            "column {col} of table source holds the DSN password"
        );
    }
}

// 6. cursor
pub(crate) async fn story_cursor(ledger: Arc<dyn Ledger>) {
    let (t, src) = tenant_and_source(&*ledger, "acme", "shop").await;
    assert_eq!(src.cursor, None);
    let first = Cursor {
        updated_at: 1_700_000_000.987_654_3,
        key: vec![b'k', 0xff, 0x00, b'\'', 0xc3],
    };
    ledger
        .ingest(
            t.id,
            src.id,
            IngestBatch {
                cursor: Some(first.clone()),
                ..batch(vec![rec("charge:v1:A", State::Succeeded, 1_700_000_000.5)])
            },
        )
        .await
        .unwrap();
    let s = ledger.source_by_name(t.id, "shop").await.unwrap();
    assert_eq!(
        s.cursor,
        Some(first.clone()),
        "the cursor is stored exactly"
    );

    ledger
        .ingest(
            t.id,
            src.id,
            batch(vec![rec("charge:v1:B", State::Succeeded, 1_700_000_009.0)]),
        )
        .await
        .unwrap();
    let s = ledger.source_by_name(t.id, "shop").await.unwrap();
    assert_eq!(s.cursor, Some(first), "a batch without a cursor leaves it");

    let second = Cursor {
        updated_at: 1_700_000_010.0,
        key: b"charge:v1:B".to_vec(),
    };
    ledger
        .ingest(
            t.id,
            src.id,
            IngestBatch {
                cursor: Some(second.clone()),
                ..batch(Vec::new())
            },
        )
        .await
        .unwrap();
    let s = ledger.source_by_name(t.id, "shop").await.unwrap();
    assert_eq!(
        s.cursor,
        Some(second),
        "an empty page still moves the cursor"
    );
    assert_eq!(
        ledger.list_sources(t.id).await.unwrap()[0].cursor,
        s.cursor,
        "list_sources shows the same cursor"
    );
}

/// "Scan now": a scanned source is due from the request until a scan that started after
/// it; a push source, a name the tenant does not have and another tenant's source are
/// `NotFound`.
pub(crate) async fn story_dash_scan_request(ledger: Arc<dyn Ledger>) {
    let (t, _push) = tenant_and_source(&*ledger, "acme", "shop").await;
    let (other, _) = tenant_and_source(&*ledger, "globex", "shop").await;
    let mut new = push_source("orders");
    new.kind = SourceKind::Postgres;
    new.dsn = Some(secrecy::SecretString::from(
        "postgres://reader@db.example/orders".to_owned(),
    ));
    new.dsn_display = Some("postgres://reader@db.example/orders".into());
    let orders = ledger.add_source(t.id, new).await.unwrap();
    assert_eq!(orders.scan_requested_at, None);
    let now = time::now();
    ledger
        .record_scan_success(t.id, orders.id, now - 10.0, false, None)
        .await
        .unwrap();
    let scanned = ledger.source_by_name(t.id, "orders").await.unwrap();
    assert!(!scanned.scan_due(now), "scanned 10 s ago, every 60 s");
    assert!(!scanned.scan_pending());
    let asked = ledger.request_scan(t.id, "orders", now).await.unwrap();
    assert_eq!(asked.scan_requested_at, Some(now));
    assert!(asked.scan_pending() && asked.scan_due(now));
    // A scan that started before the request does not answer it; one after does.
    ledger
        .record_scan_success(t.id, orders.id, now - 1.0, false, None)
        .await
        .unwrap();
    let s = ledger.source_by_name(t.id, "orders").await.unwrap();
    assert!(s.scan_pending() && s.scan_due(now));
    ledger
        .record_scan_success(t.id, orders.id, now + 1.0, false, None)
        .await
        .unwrap();
    let s = ledger.source_by_name(t.id, "orders").await.unwrap();
    assert!(!s.scan_pending() && !s.scan_due(now + 2.0));
    for (tenant, name) in [(t.id, "shop"), (t.id, "nope"), (other.id, "orders")] {
        assert!(
            matches!(
                ledger.request_scan(tenant, name, now).await,
                Err(LedgerError::NotFound(_))
            ),
            "{name}"
        );
    }
}
