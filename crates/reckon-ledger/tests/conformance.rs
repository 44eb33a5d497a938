//! The ledger conformance suite: one set of behaviours, each written once as a story over
//! `Arc<dyn Ledger>`, run against both backends (`sqlite::<name>` and `postgres::<name>`).
//!
//! Run: `cargo test -p reckon-ledger --test conformance` (PostgreSQL at 127.0.0.1:5432 with
//! trust auth, or `RECKON_TEST_PG_URL=postgres://user@host:port/postgres`; an unreachable
//! server fails the PostgreSQL half, it is never skipped).

mod support;

use reckon_domain::{
    Disappearance, Limits, QuarantineReason, RawNum, RawRow, Rejected, SourceRecord, State,
    UnresolvedKind, time, validate_row,
};
use reckon_ledger::{
    Cursor, Effect, EffectEvent, EffectQuery, IngestBatch, ItemStatus, Ledger, LedgerError,
    NewSource, Origin, Role, Source, SourceKind, Tenant, TenantId,
};
use secrecy::{ExposeSecret, SecretString};
use std::collections::BTreeSet;
use std::sync::Arc;
use support::RawDb;

/// Generates `sqlite::$name` and `postgres::$name` from each story. A story marked
/// `with raw` also gets the backend's database for direct queries.
macro_rules! conformance {
    ($($name:ident => $story:ident $($with:ident $raw:ident)?;)*) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    let db = $crate::support::TestDb::sqlite().await;
                    conformance!(@run db, $story $(, $raw)?);
                    db.finish().await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    let db = $crate::support::TestDb::postgres().await;
                    conformance!(@run db, $story $(, $raw)?);
                    db.finish().await;
                }
            )*
        }
    };
    (@run $db:ident, $story:ident) => {
        $crate::$story($db.ledger()).await
    };
    (@run $db:ident, $story:ident, raw) => {
        $crate::$story($db.ledger(), $db.raw.clone()).await
    };
}

conformance! {
    migrating_twice_keeps_everything_and_unknown_url_schemes_are_refused_by_name => story_migrate_and_schemes;
    tenant_slugs_are_unique_plain_and_looked_up_exactly => story_tenants;
    a_token_is_found_by_its_hash_with_its_tenant_and_role => story_tokens;
    sources_belong_to_their_tenant_and_their_dsn_is_stored_only_sealed => story_sources with raw;
    every_record_is_stored_byte_for_byte_with_a_first_seen_event => story_ingest_exact;
    reading_the_same_records_again_writes_nothing => story_ingest_again;
    a_changed_record_updates_the_effect_with_one_changed_event => story_ingest_changed;
    a_first_scan_hint_that_is_wrong_stores_what_an_ordinary_batch_would => story_ingest_expect_new;
    an_older_observation_never_overwrites_a_newer_one => story_ingest_stale;
    a_hostile_row_is_quarantined_once_and_every_input_row_is_accounted_for => story_quarantine;
    the_scan_cursor_moves_only_when_a_batch_carries_one => story_cursor;
    unknown_rows_and_abandoned_claims_are_unresolved_and_nothing_else_is => story_unresolved;
    a_row_that_leaves_its_source_is_kept_marked_gone_and_can_reappear => story_mark_gone;
    lookup_finds_an_order_in_any_key_part_but_never_a_prefix_or_another_tenant => story_lookup;
    no_read_of_one_tenant_ever_returns_anything_of_another => story_isolation_reads;
    a_tenant_cannot_write_into_another_tenants_source => story_isolation_writes;
    effect_listings_filter_by_source_state_operation_and_time_and_page_by_id => story_list_filters;
    a_lease_has_one_holder_and_a_lost_lease_writes_nothing => story_leases;
    // metrics (issue 5)
    the_metrics_snapshot_groups_every_tenants_unresolved_and_a_tenant_sees_its_own => story_metrics_snapshot;
    the_metrics_snapshot_routes_as_the_reconciler_and_counts_replay_windows_of_routed_effects_only => story_metrics_routes;
    // reconciliation (issue 4)
    a_leased_effect_is_claimed_by_one_worker_until_its_lease_or_schedule_expires => story_rc_claims;
    an_upgrade_retracts_applied_verdicts_of_the_old_rule_and_makes_them_due => story_rc_upgrade_verdicts with raw;
    an_effect_is_resolved_at_most_once_even_when_a_retry_records_again => story_rc_resolution_unique;
    providers_keep_their_secret_sealed_and_routes_and_requeue_stay_in_their_tenant => story_rc_providers with raw;
    // audit (issue 6)
    provider_charges_are_upserted_read_by_day_and_stay_in_their_tenant => story_audit_charges;
    audit_runs_chain_per_tenant_and_a_scheduled_day_completes_once => story_audit_runs;
    // write-back (issue 4 item 7)
    writeback_is_off_by_default_one_per_resolution_first_outcome_stands_and_tenant_bound => story_writeback;
    // dashboard (issue 7, branch `dash`)
    the_queue_lists_unresolved_unresolved_effects_oldest_first_with_filters_and_keyset_pages => story_dash_queue;
    snapshots_count_the_unresolved_once_per_hour_per_tenant => story_dash_snapshots;
    a_charge_is_found_by_its_id_or_its_idempotency_key_in_its_tenant_only => story_dash_charge_lookup;
    charges_stored_before_search_terms_get_them_at_the_next_migrate => story_charge_terms_backfill with raw;
    credentials_stored_from_providers_before_the_redactor_are_scrubbed_and_the_audit_chain_relinked => story_scrub_stored_answers with raw;
    a_tenants_members_are_listed_with_their_role_there_and_no_one_else => story_dash_members;
    provider_health_counts_the_window_and_keeps_the_newest_error_per_tenant => story_dash_provider_health;
    a_scan_request_makes_a_scanned_source_due_until_a_scan_starts_after_it => story_dash_scan_request;
    the_audit_glance_is_the_newest_run_of_the_day_without_its_findings => story_dash_audit_glance;
}

// ---------------------------------------------------------------------------------------
// helpers

const UUID_KEY: &str = "3f2b8c1e-9a4d-4c1b-8e7f-0a1b2c3d4e5f";

fn new_source(name: &str) -> NewSource {
    NewSource {
        name: name.to_owned(),
        kind: SourceKind::Push,
        dsn: None,
        dsn_display: None,
        table_name: "justonce_keys".to_owned(),
        scan_interval_secs: 60,
        abandoned_after_secs: 300.0,
        overlap_secs: 5.0,
        full_scan_every_secs: 3600,
    }
}

async fn tenant_and_source(ledger: &dyn Ledger, slug: &str, source: &str) -> (Tenant, Source) {
    let t = ledger.create_tenant(slug).await.expect("create tenant");
    let s = ledger
        .add_source(t.id, new_source(source))
        .await
        .expect("add source");
    (t, s)
}

/// A valid record; `succeeded` rows carry a response, the others none.
fn rec(key: &str, state: State, updated_at: f64) -> SourceRecord {
    SourceRecord {
        key: key.to_owned(),
        state,
        request_hash: "1:9f86d081884c7d65".to_owned(),
        response: (state == State::Succeeded).then(|| r#"{"id":"ch_1"}"#.to_owned()),
        attempts: 1,
        created_at: updated_at - 1.0,
        updated_at,
        expires_at: None,
    }
}

fn claim(key: &str, updated_at: f64, expires_at: f64) -> SourceRecord {
    SourceRecord {
        expires_at: Some(expires_at),
        ..rec(key, State::InProgress, updated_at)
    }
}

fn batch(records: Vec<SourceRecord>) -> IngestBatch {
    IngestBatch {
        origin: Origin::Scan,
        observed_at: time::now(),
        records,
        rejected: Vec::new(),
        abandoned_after_secs: 300.0,
        cursor: None,
        lease: None,
        expect_new: false,
    }
}

fn raw_row(key: &[u8], state: &[u8], response: Option<&[u8]>, updated_at: f64) -> RawRow {
    RawRow {
        key: Some(key.to_vec()),
        state: Some(state.to_vec()),
        request_hash: Some(b"1:9f86d081884c7d65".to_vec()),
        response: response.map(<[u8]>::to_vec),
        attempts: RawNum::Int(1),
        created_at: RawNum::Real(updated_at - 0.5),
        updated_at: RawNum::Real(updated_at),
        expires_at: RawNum::Null,
    }
}

fn valid(row: &RawRow) -> SourceRecord {
    validate_row(row, &Limits::default()).expect("a valid row")
}

fn refused(row: &RawRow) -> Rejected {
    validate_row(row, &Limits::default()).expect_err("a hostile row")
}

fn everything() -> EffectQuery {
    EffectQuery {
        limit: 1000,
        now: time::now(),
        ..Default::default()
    }
}

async fn list(ledger: &dyn Ledger, t: TenantId, q: EffectQuery) -> Vec<Effect> {
    ledger.list_effects(t, &q).await.expect("list effects")
}

fn keys(effects: &[Effect]) -> BTreeSet<String> {
    effects.iter().map(|e| e.key.clone()).collect()
}

fn set(keys: &[&str]) -> BTreeSet<String> {
    keys.iter().map(|k| (*k).to_owned()).collect()
}

async fn effect(ledger: &dyn Ledger, t: TenantId, source: &str, key: &str) -> Effect {
    ledger
        .get_effect(t, source, key)
        .await
        .expect("get effect")
        .unwrap_or_else(|| panic!("effect {key:?} of {source} not found"))
        .effect
}

async fn history(ledger: &dyn Ledger, t: TenantId, source: &str, key: &str) -> Vec<EffectEvent> {
    ledger
        .get_effect(t, source, key)
        .await
        .expect("get effect")
        .unwrap_or_else(|| panic!("effect {key:?} of {source} not found"))
        .history
}

fn kinds(history: &[EffectEvent]) -> Vec<&str> {
    history.iter().map(|e| e.kind.as_str()).collect()
}

// ---------------------------------------------------------------------------------------
// 1. migrations and URL schemes

async fn story_migrate_and_schemes(ledger: Arc<dyn Ledger>) {
    let t = ledger.create_tenant("before-migrate").await.unwrap();
    ledger.migrate().await.expect("first extra migrate");
    ledger.migrate().await.expect("second extra migrate");
    ledger.ping().await.expect("ping after migrating");
    let again = ledger.tenant_by_slug("before-migrate").await.unwrap();
    assert_eq!(again.id, t.id, "migrating again must keep the data");
    ledger.create_tenant("after-migrate").await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    for (url, scheme) in [("mysql://x", "mysql"), ("redis://x", "redis")] {
        match reckon_ledger::connect(Some(url), dir.path(), support::keyring()).await {
            Ok(_) => panic!("{url} must be refused, not opened"),
            Err(LedgerError::UnsupportedScheme(s)) => {
                assert_eq!(s, scheme);
                let msg = LedgerError::UnsupportedScheme(s).to_string();
                assert!(msg.contains(scheme), "message {msg:?} must name {scheme}");
            }
            Err(other) => panic!("{url}: expected UnsupportedScheme, got {other}"),
        }
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "a refused URL must not fall back to creating an embedded ledger"
    );
}

// ---------------------------------------------------------------------------------------
// 2. tenants

async fn story_tenants(ledger: Arc<dyn Ledger>) {
    let acme = ledger.create_tenant("acme").await.expect("create acme");
    assert_eq!(acme.slug, "acme");
    let found = ledger.tenant_by_slug("acme").await.unwrap();
    assert_eq!((found.id, found.slug.as_str()), (acme.id, "acme"));
    let beta = ledger.create_tenant("beta").await.unwrap();
    let by_id = ledger.tenant_by_id(beta.id).await.unwrap();
    assert_eq!((by_id.id, by_id.slug.as_str()), (beta.id, "beta"));
    assert_eq!(ledger.tenant_by_id(acme.id).await.unwrap().slug, "acme");
    assert!(
        ledger
            .list_tenants()
            .await
            .unwrap()
            .iter()
            .any(|t| t.id == acme.id)
    );

    match ledger.create_tenant("acme").await {
        Err(LedgerError::Conflict(_)) => {}
        other => panic!("a duplicate slug must be a Conflict, got {other:?}"),
    }

    let longest = "a".repeat(63);
    ledger
        .create_tenant(&longest)
        .await
        .expect("63 characters is allowed");
    for bad in [
        "Acme".to_owned(),
        "ac me".to_owned(),
        String::new(),
        "a".repeat(64),
        "-acme".to_owned(),
        "acme/evil".to_owned(),
    ] {
        match ledger.create_tenant(&bad).await {
            Err(LedgerError::Invalid(_)) => {}
            other => panic!("slug {bad:?} must be Invalid, got {other:?}"),
        }
    }
    assert_eq!(
        ledger.list_tenants().await.unwrap().len(),
        3,
        "refused slugs must create nothing"
    );

    match ledger.tenant_by_slug("nobody").await {
        Err(LedgerError::NotFound(_)) => {}
        other => panic!("an unknown slug must be NotFound, got {other:?}"),
    }
    match ledger.tenant_by_slug("ACME").await {
        Err(LedgerError::NotFound(_)) => {}
        other => panic!("slugs are looked up exactly, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// 3. tokens

async fn story_tokens(ledger: Arc<dyn Ledger>) {
    let acme = ledger.create_tenant("acme").await.unwrap();
    let globex = ledger.create_tenant("globex").await.unwrap();
    let hash_a = format!("{:032x}{:032x}", rand::random::<u128>(), 1u8);
    let hash_g = format!("{:032x}{:032x}", rand::random::<u128>(), 2u8);
    let id_a = ledger
        .create_token(acme.id, Role::Finance, &hash_a, "finance laptop")
        .await
        .unwrap();
    let id_g = ledger
        .create_token(globex.id, Role::Admin, &hash_g, "ci")
        .await
        .unwrap();
    assert_ne!(id_a, id_g);

    for _ in 0..2 {
        let grant = ledger
            .authenticate_token(&hash_a)
            .await
            .unwrap()
            .expect("a stored hash authenticates (also a second time)");
        assert_eq!(grant.tenant.id, acme.id);
        assert_eq!(grant.tenant.slug, "acme");
        assert_eq!(grant.role, Role::Finance);
        assert_eq!(grant.token_id, id_a);
    }
    let grant = ledger.authenticate_token(&hash_g).await.unwrap().unwrap();
    assert_eq!(
        (grant.tenant.id, grant.role, grant.token_id),
        (globex.id, Role::Admin, id_g)
    );

    assert!(ledger.authenticate_token("f00d").await.unwrap().is_none());
    assert!(ledger.authenticate_token("").await.unwrap().is_none());
    assert!(
        ledger
            .authenticate_token(&hash_a.to_uppercase())
            .await
            .unwrap()
            .is_none(),
        "hashes are compared exactly"
    );
}

// ---------------------------------------------------------------------------------------
// 4. sources

async fn story_sources(ledger: Arc<dyn Ledger>, raw: RawDb) {
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
                ..new_source("shop")
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
                ..new_source("shop")
            },
        )
        .await
        .expect("the same name in another tenant is allowed");
    let push_g = ledger
        .add_source(globex.id, new_source("billing"))
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

    match ledger.add_source(acme.id, new_source("shop")).await {
        Err(LedgerError::Conflict(_)) => {}
        other => panic!("the same name twice in one tenant must be a Conflict, got {other:?}"),
    }
    match ledger.add_source(acme.id, new_source("Shop Floor")).await {
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

fn hex_lower(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

// ---------------------------------------------------------------------------------------
// 5. ingest

/// Keys and responses that a careless backend would mangle, as validated source rows.
fn tricky_records() -> Vec<SourceRecord> {
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

async fn story_ingest_exact(ledger: Arc<dyn Ledger>) {
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

async fn story_ingest_again(ledger: Arc<dyn Ledger>) {
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

async fn story_ingest_changed(ledger: Arc<dyn Ledger>) {
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
async fn story_ingest_expect_new(ledger: Arc<dyn Ledger>) {
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

/// What `/metrics` reads: the operator's view of every tenant (PostgreSQL reads it tenant
/// by tenant, in batches) equals the union of the tenants' own views, with the values the
/// ingested records imply.
async fn story_metrics_snapshot(ledger: Arc<dyn Ledger>) {
    use reckon_ledger::{MetricsQuery, MetricsSnapshot, QuarantineGroup, UnresolvedGroup};
    let now = time::now();
    let mut tenants = Vec::new();
    // Five tenants, so the operator's read spans several batches; "t2" has no source.
    for i in 0..5 {
        let t = ledger.create_tenant(&format!("t{i}")).await.unwrap();
        if i != 2 {
            let s = ledger.add_source(t.id, new_source("shop")).await.unwrap();
            let unknown = rec(
                &format!("charge:v1:ORD-{i}"),
                State::Unknown,
                1_700_000_000.0 + i as f64,
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
        union.needs_attention.extend(one.needs_attention);
    }
    assert_eq!(sorted(union), all);
}

/// Which unresolved effects are routed, as the reconciler decides it: the route on the
/// effect's exact operation wins, even one to no provider; without one, the source's `*`
/// route; a key with no operation has only `*`. Replay windows (closing: created at or
/// before the closing cutoff and after the closed one; closed: at or before the closed
/// cutoff) count routed effects only.
async fn story_metrics_routes(ledger: Arc<dyn Ledger>) {
    use reckon_ledger::{MetricsQuery, NewProvider};
    let now = time::now();
    let (closing_cut, closed_cut) = (now - 20.0 * 3600.0, now - 24.0 * 3600.0);
    let hours_ago = |h: f64| now - h * 3600.0;
    let t = ledger.create_tenant("routes").await.unwrap();
    let mut sources = Vec::new();
    for name in ["shop", "app", "bare"] {
        sources.push(ledger.add_source(t.id, new_source(name)).await.unwrap());
    }
    ledger
        .add_provider(
            t.id,
            NewProvider {
                name: "pay".into(),
                kind: "demo".into(),
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

async fn story_ingest_stale(ledger: Arc<dyn Ledger>) {
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

async fn story_quarantine(ledger: Arc<dyn Ledger>) {
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

// ---------------------------------------------------------------------------------------
// 6. cursor

async fn story_cursor(ledger: Arc<dyn Ledger>) {
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

// ---------------------------------------------------------------------------------------
// 7. unresolved

async fn story_unresolved(ledger: Arc<dyn Ledger>) {
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

// ---------------------------------------------------------------------------------------
// 8. mark_gone

async fn story_mark_gone(ledger: Arc<dyn Ledger>) {
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
    let before: Vec<String> = ledger
        .present_keys(t.id, src.id, 0, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|(_, k)| k)
        .collect();
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

// ---------------------------------------------------------------------------------------
// 9. lookup

async fn story_lookup(ledger: Arc<dyn Ledger>) {
    let (a, shop_a) = tenant_and_source(&*ledger, "acme", "shop").await;
    let billing_a = ledger
        .add_source(a.id, new_source("billing"))
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

// ---------------------------------------------------------------------------------------
// 10. tenant isolation

async fn story_isolation_reads(ledger: Arc<dyn Ledger>) {
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

async fn story_isolation_writes(ledger: Arc<dyn Ledger>) {
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

// ---------------------------------------------------------------------------------------
// 11. listing filters and pages

async fn story_list_filters(ledger: Arc<dyn Ledger>) {
    let (t, shop) = tenant_and_source(&*ledger, "acme", "shop").await;
    let billing = ledger
        .add_source(t.id, new_source("billing"))
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

// ---------------------------------------------------------------------------------------
// leases

async fn story_leases(ledger: Arc<dyn Ledger>) {
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

// ---------------------------------------------------------------------------------------
// reconciliation (issue 4)

fn attempt(outcome: &str, at: f64, next: f64, resolve: bool) -> reckon_ledger::NewAttempt {
    reckon_ledger::NewAttempt {
        provider_id: None,
        started_at: at,
        finished_at: at,
        outcome: outcome.to_owned(),
        method: Some("test".to_owned()),
        error: None,
        evidence: serde_json::json!({ "outcome": outcome, "at": at }),
        next_attempt_at: next,
        non_final: false,
        needs_attention: false,
        resolve,
    }
}

/// A ledger whose reconciler concluded `applied` under the rule before verdicts were
/// decided on money (no certificate: no complete check for a second payment) is upgraded:
/// those verdicts are retracted into `resolution_retracted`, the effects are due for a
/// re-check at once and marked provisional; verdicts of the current rule, `not_applied`
/// and people's resolutions stay.
async fn story_rc_upgrade_verdicts(ledger: Arc<dyn Ledger>, raw: RawDb) {
    let (t, s) = tenant_and_source(&*ledger, "acme", "shop").await;
    let now = time::now();
    let keys = [
        "charge:v1:old",
        "charge:v1:new",
        "charge:v1:none",
        "charge:v1:hand",
    ];
    ledger
        .ingest(
            t.id,
            s.id,
            batch(
                keys.iter()
                    .map(|k| rec(k, State::Unknown, now - 100.0))
                    .collect(),
            ),
        )
        .await
        .unwrap();
    let claims = ledger.claim_due(t.id, "w", now, 60.0, 10).await.unwrap();
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
                outcome: "applied".into(),
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

async fn story_rc_claims(ledger: Arc<dyn Ledger>) {
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
    assert_eq!(st.last_outcome.as_deref(), Some("indeterminate"));
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

async fn story_rc_resolution_unique(ledger: Arc<dyn Ledger>) {
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
    assert_eq!(view.resolution.unwrap().outcome, "applied");
    // a resolved effect is never claimed again
    let later = ledger
        .claim_due(t.id, "w3", now + 1e4, 30.0, 10)
        .await
        .unwrap();
    assert!(later.iter().all(|c| c.effect.id != id));
    // by hand: a note is required, and a resolved effect refuses a second one
    let by_hand = |note: Option<&str>| reckon_ledger::NewResolution {
        outcome: "not_applied".into(),
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
    assert!(matches!(
        ledger
            .record_attempt(t.id, id2, "w1", attempt("maybe", now, now, false))
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

async fn story_rc_providers(ledger: Arc<dyn Ledger>, raw: RawDb) {
    let (t, s) = tenant_and_source(&*ledger, "acme", "shop").await;
    let p = ledger
        .add_provider(
            t.id,
            reckon_ledger::NewProvider {
                name: "stripe-live".into(),
                kind: "stripe".into(),
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
                    kind: "stripe".into(),
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
}

// ---------------------------------------------------------------------------------------
// audit (issue 6, branch `audit`)

fn stored_charge(
    provider_id: i64,
    id: &str,
    created: f64,
    amount: i64,
) -> reckon_ledger::StoredCharge {
    reckon_ledger::StoredCharge {
        provider_id,
        charge_id: id.into(),
        payment_intent: Some(format!("pi_{id}")),
        amount,
        currency: "usd".into(),
        status: "succeeded".into(),
        amount_captured: amount,
        amount_refunded: 0,
        refunds: serde_json::json!([]),
        metadata: serde_json::json!({"idempotency_key": format!("k-{id}")}),
        idempotency_key: None,
        customer: None,
        created,
        raw: serde_json::json!({"id": id, "object": "charge", "amount": amount}),
        imported_at: 1.0,
    }
}

async fn story_audit_charges(ledger: Arc<dyn Ledger>) {
    let (a, _) = tenant_and_source(&*ledger, "acme", "shop").await;
    let (b, _) = tenant_and_source(&*ledger, "globex", "shop").await;
    let pa = ledger
        .add_provider(
            a.id,
            reckon_ledger::NewProvider {
                name: "pay".into(),
                kind: "demo".into(),
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
                stored_charge(pa.id, "ch_1", 100.0, 500),
                stored_charge(pa.id, "ch_2", 200.0, 700),
                stored_charge(pa.id, "ch_3", 300.0, 900),
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
    assert_eq!(
        ledger
            .provider_charges(a.id, None, 0.0, 1e10)
            .await
            .unwrap()
            .len(),
        3
    );
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
            batch(vec![
                rec("charge:v1:early", State::Succeeded, 50.0),
                rec("charge:v1:in", State::Succeeded, 150.0),
            ]),
        )
        .await
        .unwrap();
    let created: Vec<f64> = ledger
        .effects_created_between(a.id, 0.0, 1e10, 1e10)
        .await
        .unwrap()
        .iter()
        .map(|e| e.created_at)
        .collect();
    assert_eq!(created.len(), 2);
    let some = ledger
        .effects_created_between(a.id, created[1], 1e10, 1e10)
        .await
        .unwrap();
    assert_eq!(some.len(), 1);
    assert!(
        ledger
            .effects_created_between(b.id, 0.0, 1e10, 1e10)
            .await
            .unwrap()
            .is_empty()
    );
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

fn new_run(day: &str, by: &str, status: &str) -> reckon_ledger::NewAuditRun {
    reckon_ledger::NewAuditRun {
        day: day.into(),
        time_zone: "UTC".into(),
        window_start: 0.0,
        window_end: 86_400.0,
        provider: "*".into(),
        triggered_by: by.into(),
        status: status.into(),
        reason: (status == "failed").then(|| "provider pay: page 3: server error".into()),
        started_at: 10.5,
        finished_at: 11.25,
        counts: serde_json::json!({"findings": {"duplicate": 1, "orphan": 0}}),
        findings: serde_json::json!([{"kind": "duplicate", "amount": 4200, "b": {"z": 1, "a": [1.5, null]}}]),
        totals: serde_json::json!([]),
        evidence: serde_json::json!({"pages": [{"page": 1}]}),
    }
}

async fn story_audit_runs(ledger: Arc<dyn Ledger>) {
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
    assert!(reckon_ledger::verify_chain(a.id, &chain).is_empty());
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

// ---- write-back (issue 4 item 7) ------------------------------------------------------

async fn story_writeback(ledger: Arc<dyn Ledger>) {
    use reckon_ledger::{NewWriteback, WritebackAction, WritebackPolicy, WritebackStatus};
    let t = ledger.create_tenant("acme").await.unwrap();
    let other = ledger.create_tenant("other").await.unwrap();
    let s = ledger
        .add_source(
            t.id,
            NewSource {
                kind: SourceKind::Sqlite,
                dsn: Some(SecretString::from("/data/shop.db".to_owned())),
                dsn_display: Some("sqlite:///data/shop.db".into()),
                ..new_source("shop")
            },
        )
        .await
        .unwrap();
    assert_eq!(s.writeback(), None, "off by default");
    ledger.add_source(t.id, new_source("pushed")).await.unwrap();
    let e = ledger
        .set_source_writeback(t.id, "pushed", Some(WritebackPolicy::Release))
        .await
        .unwrap_err();
    assert!(matches!(e, LedgerError::Invalid(_)), "{e}");
    assert_eq!(
        ledger
            .source_by_name(t.id, "pushed")
            .await
            .unwrap()
            .writeback(),
        None
    );

    let now = time::now();
    ledger
        .ingest(
            t.id,
            s.id,
            batch(vec![
                rec("charge:v1:o1", State::Unknown, now - 100.0),
                rec("charge:v1:o2", State::Unknown, now - 90.0),
                rec("charge:v1:o3", State::Unknown, now - 80.0),
            ]),
        )
        .await
        .unwrap();
    let claims = ledger.claim_due(t.id, "w1", now, 30.0, 10).await.unwrap();
    let id_of = |k: &str| claims.iter().find(|c| c.effect.key == k).unwrap().effect.id;
    for (k, outcome) in [
        ("charge:v1:o1", "applied"),
        ("charge:v1:o2", "not_applied"),
        ("charge:v1:o3", "duplicate"),
    ] {
        ledger
            .record_attempt(
                t.id,
                id_of(k),
                "w1",
                attempt(outcome, now, now + 60.0, true),
            )
            .await
            .unwrap();
    }
    assert!(
        ledger
            .writeback_candidates(t.id, None, 10)
            .await
            .unwrap()
            .is_empty(),
        "write-back off: no candidates"
    );
    let on = ledger
        .set_source_writeback(t.id, "shop", Some(WritebackPolicy::Release))
        .await
        .unwrap();
    assert_eq!(on.writeback(), Some(WritebackPolicy::Release));
    let c = ledger.writeback_candidates(t.id, None, 10).await.unwrap();
    let keys: Vec<&str> = c.iter().map(|c| c.key.as_str()).collect();
    assert_eq!(
        keys,
        ["charge:v1:o1", "charge:v1:o2"],
        "a duplicate is left to a person"
    );
    assert_eq!(c[0].state, "unknown");
    assert_eq!(c[0].updated_at, now - 100.0, "the exact value seen");
    assert_eq!(c[0].resolution.outcome, "applied");
    assert_eq!(c[0].source, "shop");
    assert!(
        ledger
            .writeback_candidates(other.id, None, 10)
            .await
            .unwrap()
            .is_empty()
    );

    let new = |c: &reckon_ledger::WritebackCandidate| NewWriteback {
        source_id: c.source_id,
        effect_id: c.effect_id,
        resolution_id: c.resolution.id,
        key: c.key.clone(),
        action: WritebackAction::Succeed,
        seen_state: c.state.clone(),
        seen_updated_at: c.updated_at,
        new_response: Some(r#"{"id":"ch_1"}"#.into()),
        new_updated_at: now,
    };
    // Another tenant cannot record an intent on these ids.
    assert!(
        ledger
            .begin_writeback(other.id, new(&c[0]), None)
            .await
            .is_err()
    );
    let w1 = ledger
        .begin_writeback(t.id, new(&c[0]), None)
        .await
        .unwrap();
    assert_eq!(w1.status, WritebackStatus::Pending);
    assert_eq!(w1.new_response.as_deref(), Some(r#"{"id":"ch_1"}"#));
    let again = ledger
        .begin_writeback(t.id, new(&c[0]), None)
        .await
        .unwrap();
    assert_eq!(again.id, w1.id, "one write-back per resolution");
    assert_eq!(
        ledger
            .list_writebacks(t.id, Some(s.id), Some(WritebackStatus::Pending), 10)
            .await
            .unwrap()
            .len(),
        1
    );
    assert!(
        ledger
            .list_writebacks(other.id, None, None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        ledger
            .finish_writeback(other.id, w1.id, WritebackStatus::Written, "x", false, None)
            .await
            .is_err(),
        "another tenant cannot settle it"
    );
    let done = ledger
        .finish_writeback(t.id, w1.id, WritebackStatus::Written, "written", true, None)
        .await
        .unwrap();
    assert_eq!(done.status, WritebackStatus::Written);
    assert!(done.recovered && done.settled_at.is_some());
    let late = ledger
        .finish_writeback(t.id, w1.id, WritebackStatus::Conflict, "late", false, None)
        .await
        .unwrap();
    assert_eq!(
        late.status,
        WritebackStatus::Written,
        "the first outcome stands"
    );
    assert_eq!(late.detail.as_deref(), Some("written"));
    let keys: Vec<String> = ledger
        .writeback_candidates(t.id, Some(s.id), 10)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.key)
        .collect();
    assert_eq!(keys, ["charge:v1:o2"]);

    // Turned off: no candidates, and no intent is recorded.
    ledger
        .set_source_writeback(t.id, "shop", None)
        .await
        .unwrap();
    assert!(
        ledger
            .writeback_candidates(t.id, None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        ledger
            .begin_writeback(t.id, new(&c[1]), None)
            .await
            .is_err(),
        "write-back off: refused"
    );
    assert_eq!(
        ledger
            .list_writebacks(t.id, None, None, 10)
            .await
            .unwrap()
            .len(),
        1
    );
}

// ---- dashboard (issue 7, branch `dash`) -------------------------------------------------

async fn story_dash_queue(ledger: Arc<dyn Ledger>) {
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
                outcome: "applied".into(),
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

async fn story_dash_snapshots(ledger: Arc<dyn Ledger>) {
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

/// The support lookup's charges (dashboard, issue 7): by the charge's id or by the key it
/// was made with, from any provider of the tenant, never another tenant's.
async fn story_dash_charge_lookup(ledger: Arc<dyn Ledger>) {
    let (a, _) = tenant_and_source(&*ledger, "acme", "shop").await;
    let (b, _) = tenant_and_source(&*ledger, "globex", "shop").await;
    let mut ids = Vec::new();
    for t in [&a, &b] {
        let p = ledger
            .add_provider(
                t.id,
                reckon_ledger::NewProvider {
                    name: "pay".into(),
                    kind: "demo".into(),
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
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
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
async fn story_charge_terms_backfill(ledger: Arc<dyn Ledger>, raw: RawDb) {
    let mut ids = Vec::new();
    for slug in ["acme", "globex"] {
        let (t, _) = tenant_and_source(&*ledger, slug, "shop").await;
        let p = ledger
            .add_provider(
                t.id,
                reckon_ledger::NewProvider {
                    name: "pay".into(),
                    kind: "demo".into(),
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
async fn story_scrub_stored_answers(ledger: Arc<dyn Ledger>, raw: RawDb) {
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
                kind: "http".into(),
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
        reckon_ledger::verify_chain(t.id, &after).is_empty(),
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

/// The settings page's people (dashboard, issue 7): a tenant's members with their role
/// in it, never another tenant's.
async fn story_dash_members(ledger: Arc<dyn Ledger>) {
    let a = ledger.create_tenant("acme").await.unwrap();
    let b = ledger.create_tenant("globex").await.unwrap();
    let ann = ledger.create_user("ann@acme.test", "x").await.unwrap();
    let bo = ledger.create_user("bo@both.test", "x").await.unwrap();
    let cy = ledger.create_user("cy@globex.test", "x").await.unwrap();
    ledger
        .set_membership(a.id, ann.id, Role::Admin)
        .await
        .unwrap();
    ledger
        .set_membership(a.id, bo.id, Role::Support)
        .await
        .unwrap();
    ledger
        .set_membership(b.id, bo.id, Role::Viewer)
        .await
        .unwrap();
    ledger
        .set_membership(b.id, cy.id, Role::Finance)
        .await
        .unwrap();
    ledger.set_user_disabled(bo.id, true).await.unwrap();
    let got: Vec<(String, Role, bool)> = ledger
        .members(a.id)
        .await
        .unwrap()
        .into_iter()
        .map(|(u, r)| (u.email, r, u.disabled))
        .collect();
    assert_eq!(
        got,
        vec![
            ("ann@acme.test".to_owned(), Role::Admin, false),
            ("bo@both.test".to_owned(), Role::Support, true),
        ]
    );
    let got: Vec<(String, Role)> = ledger
        .members(b.id)
        .await
        .unwrap()
        .into_iter()
        .map(|(u, r)| (u.email, r))
        .collect();
    assert_eq!(
        got,
        vec![
            ("bo@both.test".to_owned(), Role::Viewer),
            ("cy@globex.test".to_owned(), Role::Finance),
        ]
    );
}

/// The overview's provider health: lookups and indeterminate outcomes finished in the
/// window, the newest error of any age, zeros for a provider never asked, nothing of
/// another tenant's.
async fn story_dash_provider_health(ledger: Arc<dyn Ledger>) {
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
                        kind: "demo".into(),
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
    // The other tenant has none of it.
    add(other.id, "pay").await;
    let theirs = ledger.provider_health(other.id, 0.0).await.unwrap();
    assert_eq!(theirs.len(), 1);
    assert_eq!((theirs[0].lookups, theirs[0].last_error.clone()), (0, None));
}

/// "Scan now": a scanned source is due from the request until a scan that started after
/// it; a push source, a name the tenant does not have and another tenant's source are
/// `NotFound`.
async fn story_dash_scan_request(ledger: Arc<dyn Ledger>) {
    let (t, _push) = tenant_and_source(&*ledger, "acme", "shop").await;
    let (other, _) = tenant_and_source(&*ledger, "globex", "shop").await;
    let mut new = new_source("orders");
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

/// The overview's glance at a day's audit: the newest run of that day (failed or not),
/// its finding counts, nothing of another day or tenant.
async fn story_dash_audit_glance(ledger: Arc<dyn Ledger>) {
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
