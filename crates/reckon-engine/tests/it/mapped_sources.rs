//! Sources read through a column mapping. Brandur Leach's `idempotency_keys`
//! (testdata/brandur_idempotency_keys.sql) on PostgreSQL, its rows driven through their
//! states the way its application writes them, scanned with the `brandur` preset: the
//! "503 after a timeout" row is ingested as unknown under the key its application sent
//! Stripe (derived from the row), and reconciled against the simulated Stripe with it. A
//! wrong mapping is refused at `source add`, naming the column, and nothing is stored. And
//! the justonce reader as a mapping reads the same rows as the justonce reader, hostile
//! ones included, in every dialect.

use crate::common;
use crate::scan_sources::hostile_setup;

use common::{Kind, SOURCE, SourceDb, TestLedger, test_egress};
use futures::StreamExt;
use reckon_domain::{State, UnresolvedKind};
use reckon_engine::SourceInput;
use reckon_engine::commands::{self, Ctx, Via};
use reckon_engine::reconcile::{ReconcileCtx, reconcile_all};
use reckon_sim::{EffectSpec, Life, PaymentSpec, Sim, WorldConfig};
use reckon_sources::{Mapping, SourceConn, SourceDsn};
use sqlx::Connection;
use std::sync::Arc;

const FIXTURE: &str = include_str!("../../../../testdata/brandur_idempotency_keys.sql");
const USER: i64 = 7;

/// One atomic phase of rocket-rides-atomic's `POST /rides`, as the statement it commits.
#[derive(Clone, Copy)]
enum Phase {
    /// The key is inserted, locked, at `started`.
    Create,
    /// The ride is created: `ride_created`.
    RideCreated,
    /// The Stripe charge succeeded: `charge_created`.
    ChargeCreated,
    /// A `Response`: finished with this code, the lock released.
    Finish(i32, &'static str),
    /// An error left the phase: the lock released, the recovery point kept.
    Unlock,
    /// The last run was this many seconds ago (a request nobody retried).
    RanAgo(i64),
}

fn statement(key: &str, p: Phase) -> String {
    let row = format!("user_id = {USER} AND idempotency_key = '{key}'");
    match p {
        Phase::Create => format!(
            "INSERT INTO idempotency_keys (idempotency_key, locked_at, recovery_point, \
             request_method, request_params, request_path, user_id) VALUES ('{key}', now(), \
             'started', 'POST', '{{\"origin_lat\": 0.0, \"origin_lon\": 0.0, \
             \"target_lat\": 1.0, \"target_lon\": 1.0}}', '/rides', {USER})"
        ),
        Phase::RideCreated => {
            format!("UPDATE idempotency_keys SET recovery_point = 'ride_created' WHERE {row}")
        }
        Phase::ChargeCreated => {
            format!("UPDATE idempotency_keys SET recovery_point = 'charge_created' WHERE {row}")
        }
        Phase::Finish(code, body) => format!(
            "UPDATE idempotency_keys SET locked_at = NULL, recovery_point = 'finished', \
             response_code = {code}, response_body = '{body}' WHERE {row}"
        ),
        Phase::Unlock => format!("UPDATE idempotency_keys SET locked_at = NULL WHERE {row}"),
        // Created two seconds before its last run began.
        Phase::RanAgo(secs) => format!(
            "UPDATE idempotency_keys SET last_run_at = now() - interval '{secs} seconds', \
             created_at = now() - interval '{} seconds' WHERE {row}",
            secs + 2
        ),
    }
}

const PAID: &str = "ride-paid-000000000000001";
const DECLINED: &str = "ride-declined-0000000001";
const TIMED_OUT: &str = "ride-timed-out-000000001";
const RUNNING: &str = "ride-running-00000000001";
const ABANDONED: &str = "ride-abandoned-000000001";
const ODD: &str = "ride-odd-recovery-point-1";

/// The effect's key of the row with the client's key `k`: what the application sent Stripe.
async fn derived_key(db: &SourceDb, k: &str) -> String {
    format!("rocket-rides-atomic-{}", row_id(db, k).await)
}

/// A Brandur table with one request of each story.
async fn brandur_store() -> SourceDb {
    let db = SourceDb::fresh(Kind::Postgres).await;
    let ok = r#"{"message": "Payment accepted. Your pilot is on their way!"}"#;
    let declined = r#"{"error": "Error from payment processor: Your card was declined."}"#;
    let generic = r#"{"error": "Error from payment processor. Please contact support."}"#;
    let stories: [(&str, Vec<Phase>); 6] = [
        (
            PAID,
            vec![
                Phase::Create,
                Phase::RideCreated,
                Phase::ChargeCreated,
                Phase::Finish(201, ok),
            ],
        ),
        (
            DECLINED,
            vec![
                Phase::Create,
                Phase::RideCreated,
                Phase::Finish(402, declined),
            ],
        ),
        // Stripe::Charge.create raised a connection error or timed out: the charge may
        // exist, and the row says finished.
        (
            TIMED_OUT,
            vec![
                Phase::Create,
                Phase::RideCreated,
                Phase::Finish(503, generic),
                Phase::RanAgo(7200),
            ],
        ),
        (RUNNING, vec![Phase::Create, Phase::RideCreated]),
        (
            ABANDONED,
            vec![
                Phase::Create,
                Phase::RideCreated,
                Phase::Unlock,
                Phase::RanAgo(600),
            ],
        ),
        (ODD, vec![Phase::Create]),
    ];
    let mut statements = vec![FIXTURE.to_owned()];
    for (key, phases) in &stories {
        statements.extend(phases.iter().map(|p| statement(key, *p)));
    }
    statements.push(format!(
        "UPDATE idempotency_keys SET recovery_point = 'paused' WHERE idempotency_key = '{ODD}'"
    ));
    db.exec(&statements).await;
    db
}

async fn row_id(db: &SourceDb, key: &str) -> i64 {
    let mut c = sqlx::PgConnection::connect(&db.source_dsn).await.unwrap();
    let id = sqlx::query_scalar("SELECT id FROM idempotency_keys WHERE idempotency_key = $1")
        .bind(key)
        .fetch_one(&mut c)
        .await
        .unwrap();
    c.close().await.ok();
    id
}

fn mapped(dsn: &str, mapping: &str) -> SourceInput {
    SourceInput {
        name: SOURCE.into(),
        kind: "mapped".into(),
        dsn: Some(dsn.into()),
        table: None,
        mapping: Some(mapping.into()),
        scan_interval: None,
        abandoned_after: Some("0s".into()),
        overlap: None,
        full_scan_every: None,
    }
}

#[tokio::test]
async fn a_brandur_store_is_checked_at_add_and_its_503_after_a_timeout_is_ingested_as_unknown() {
    let db = brandur_store().await;
    let l = TestLedger::new().await;
    let egress = test_egress();
    let ctx = Ctx {
        ledger: &*l.ledger,
        egress: &egress,
        tenant: &l.tenant,
        actor: "operator".into(),
        via: Via::Cli,
    };
    let (source, checked) = commands::add_source_checked(&ctx, mapped(&db.source_dsn, "brandur"))
        .await
        .expect("the brandur mapping fits the table");
    let checked = checked.expect("a mapped source is checked");
    assert_eq!(
        checked.to_string(),
        "idempotency_keys: 6 rows, unknown 1, in_progress 2, failed 1, succeeded 1, matched by \
         no condition 1"
    );
    assert_eq!(source.kind.as_str(), "postgres");
    assert_eq!(source.table_name, "idempotency_keys");

    let report = l.scan(SOURCE, false).await;
    assert_eq!((report.created, report.quarantined), (5, 1), "{report:?}");
    let mut keys = std::collections::HashMap::new();
    for k in [PAID, DECLINED, TIMED_OUT, RUNNING, ABANDONED] {
        keys.insert(k, derived_key(&db, k).await);
    }
    let effect = |k: &str| {
        let ledger = l.ledger.clone();
        let tenant = l.tenant.id;
        let key = keys[k].clone();
        async move {
            ledger
                .get_effect(tenant, SOURCE, &key)
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("no effect {key}"))
                .effect
        }
    };
    let timed_out = effect(TIMED_OUT).await;
    assert_eq!(timed_out.state, State::Unknown);
    assert_eq!(timed_out.unresolved_kind, Some(UnresolvedKind::Unknown));
    assert!(
        timed_out
            .response_json
            .as_deref()
            .is_some_and(|r| r.contains("contact support")),
        "{:?}",
        timed_out.response_json
    );
    assert!(timed_out.request_hash.starts_with("sha256:"));
    let paid = effect(PAID).await;
    assert_eq!((paid.state, paid.unresolved_kind), (State::Succeeded, None));
    let declined = effect(DECLINED).await;
    assert_eq!(
        (declined.state, declined.unresolved_kind),
        (State::Failed, None)
    );
    let running = effect(RUNNING).await;
    assert_eq!(
        (running.state, running.unresolved_kind),
        (State::InProgress, None)
    );
    let abandoned = effect(ABANDONED).await;
    assert_eq!(
        (abandoned.state, abandoned.unresolved_kind),
        (State::InProgress, Some(UnresolvedKind::Abandoned))
    );
    // Its lease: the last run plus Brandur's 90 s lock timeout.
    let lease = abandoned.expires_at.expect("a lease");
    assert!(
        (lease - (abandoned.updated_at + 90.0)).abs() < 1e-3,
        "{lease}"
    );

    // A second scan reads the same rows and writes nothing.
    let again = l.scan(SOURCE, true).await;
    assert_eq!((again.created, again.updated), (0, 0), "{again:?}");
    db.drop_db().await;
}

#[tokio::test]
async fn a_wrong_mapping_is_refused_at_add_with_a_sentence_naming_the_column() {
    let db = brandur_store().await;
    let l = TestLedger::new().await;
    let egress = test_egress();
    let ctx = Ctx {
        ledger: &*l.ledger,
        egress: &egress,
        tenant: &l.tenant,
        actor: "operator".into(),
        via: Via::Cli,
    };
    let conditions = |unknown: &str| {
        format!(
            r#"{{"preset": "brandur", "state": {{
                "succeeded": "recovery_point = 'finished' AND response_code = 201",
                "failed": "recovery_point = 'finished' AND response_code = 402",
                "unknown": "{unknown}",
                "in_progress": "recovery_point <> 'finished'"}}}}"#
        )
    };
    let cases = [
        (
            r#"{"preset": "brandur", "updated_at": {"column": "last_run", "unit": "timestamp"}}"#
                .to_owned(),
            "the mapping's updated_at names the column \"last_run\", which the table \
             idempotency_keys does not have (its columns: id, created_at, idempotency_key, \
             last_run_at, locked_at, request_method, request_params, request_path, \
             response_code, response_body, recovery_point, user_id)",
        ),
        (
            conditions("recovery_point = 'finished' AND response_code = '503'"),
            "the unknown condition compares the column \"response_code\" (integer) with the \
             text '503', which it cannot hold",
        ),
        (
            r#"{"preset": "brandur", "created_at": {"column": "created_at", "unit": "epoch"}}"#
                .to_owned(),
            "the mapping's created_at reads the column \"created_at\" as epoch seconds, but it \
             is timestamp with time zone (say \"unit\": \"timestamp\")",
        ),
        (
            conditions(
                "recovery_point = 'finished' AND response_code >= 500 OR response_code IS NULL",
            ),
            // Rows still running (and the paused one) have no response code either.
            "3 rows of idempotency_keys match both the unknown and the in_progress \
             conditions: each row must have one state",
        ),
        (
            r#"{"preset": "brandur", "key": "{user_id}"}"#.to_owned(),
            "the mapping's key {user_id} does not identify a row of idempotency_keys: 5 rows \
             share a key with another (or build no key, a column of it being NULL)",
        ),
    ];
    for (mapping, says) in cases {
        let got = commands::add_source_checked(&ctx, mapped(&db.source_dsn, &mapping)).await;
        match got {
            Err(e) => assert_eq!(e.to_string(), says, "{mapping}"),
            Ok(_) => panic!("{mapping} was accepted; expected: {says}"),
        }
    }
    assert!(
        l.ledger.list_sources(l.tenant.id).await.unwrap().is_empty(),
        "a refused mapping stores nothing"
    );
    db.drop_db().await;
}

/// Every read of the scan, through the justonce reader and through the `justonce` preset,
/// row for row.
async fn same_reads(kind: Kind, dsn: &str) {
    let dialect = match kind {
        Kind::Sqlite => reckon_sources::Dialect::Sqlite,
        Kind::Postgres => reckon_sources::Dialect::Postgres,
        Kind::Mysql => reckon_sources::Dialect::Mysql,
    };
    let egress = test_egress();
    let dsn = SourceDsn::parse(dialect, dsn).unwrap();
    let dsn = egress.for_tenant(common::TENANT).pin(&dsn).await.unwrap();
    let preset = Mapping::preset("justonce").unwrap();
    let mut old = SourceConn::open(&dsn, "justonce_keys", &egress)
        .await
        .unwrap();
    let mut new = SourceConn::open_mapped(&dsn, &preset, &egress)
        .await
        .unwrap();
    let since = reckon_domain::time::now() - 3600.0;
    let mut total = 0;
    for (since, every) in [(None, false), (Some(since), false), (Some(since), true)] {
        let a: Vec<String> = old
            .rows(since, every)
            .map(|r| format!("{:?}", r.unwrap()))
            .collect()
            .await;
        let b: Vec<String> = new
            .rows(since, every)
            .map(|r| format!("{:?}", r.unwrap()))
            .collect()
            .await;
        assert_eq!(a, b, "{kind:?} since {since:?} every_state {every}");
        total += a.len();
    }
    assert!(total > 0, "{kind:?}: nothing was read");
    let mut keys_a: Vec<Vec<u8>> = old.keys().map(Result::unwrap).collect().await;
    let mut keys_b: Vec<Vec<u8>> = new.keys().map(Result::unwrap).collect().await;
    keys_a.sort();
    keys_b.sort();
    assert_eq!(keys_a, keys_b, "{kind:?}: keys");
    let a = old.rows_by_key(&keys_a).await.unwrap();
    let b = new.rows_by_key(&keys_a).await.unwrap();
    assert_eq!(format!("{a:?}"), format!("{b:?}"), "{kind:?}: rows by key");
    old.close().await;
    new.close().await;
}

async fn the_justonce_preset_reads_what_the_justonce_reader_reads(kind: Kind) {
    let populated = SourceDb::fresh(kind).await;
    populated.writer(&["populate"]);
    same_reads(kind, &populated.source_dsn).await;
    populated.drop_db().await;
    let hostile = SourceDb::fresh(kind).await;
    let (statements, _) = hostile_setup(kind);
    hostile.exec(&statements).await;
    same_reads(kind, &hostile.source_dsn).await;
    hostile.drop_db().await;
}

#[tokio::test]
async fn the_justonce_preset_reads_what_the_justonce_reader_reads_sqlite() {
    the_justonce_preset_reads_what_the_justonce_reader_reads(Kind::Sqlite).await;
}

#[tokio::test]
async fn the_justonce_preset_reads_what_the_justonce_reader_reads_postgres() {
    the_justonce_preset_reads_what_the_justonce_reader_reads(Kind::Postgres).await;
}

#[tokio::test]
async fn the_justonce_preset_reads_what_the_justonce_reader_reads_mysql() {
    the_justonce_preset_reads_what_the_justonce_reader_reads(Kind::Mysql).await;
}

/// The trap of Brandur's design, end to end: Stripe took the charge, the application saw a
/// timeout and finished the request with 503. reckon reads the row as unknown, asks the
/// simulated Stripe with the key the application sent it (`rocket-rides-atomic-{id}`, not
/// the client's key), and finds the money moved.
#[tokio::test]
async fn the_503_after_a_timeout_is_reconciled_against_stripe_with_the_derived_key() {
    let db = brandur_store().await;
    let l = TestLedger::new().await;
    let egress = test_egress();
    let ctx = Ctx {
        ledger: &*l.ledger,
        egress: &egress,
        tenant: &l.tenant,
        actor: "operator".into(),
        via: Via::Cli,
    };
    commands::add_source_checked(&ctx, mapped(&db.source_dsn, "brandur"))
        .await
        .expect("the brandur mapping fits the table");
    l.scan(SOURCE, false).await;
    let key = derived_key(&db, TIMED_OUT).await;
    let e = l
        .ledger
        .get_effect(l.tenant.id, SOURCE, &key)
        .await
        .unwrap()
        .expect("the timed-out request's effect")
        .effect;
    assert_eq!(e.state, State::Unknown);

    // Stripe's side: the charge went through under the derived key.
    let sim = Sim::start(
        &[EffectSpec {
            key: key.clone(),
            created_at: e.created_at,
            updated_at: e.updated_at,
            recorded: reckon_sim::Recorded::Nothing,
            payments: vec![PaymentSpec {
                life: Life::Succeeded,
                amount: 20_00,
                offset: 0.5,
                indexed: true,
            }],
        }],
        WorldConfig::default(),
    )
    .await
    .unwrap();
    l.ledger
        .add_provider(
            l.tenant.id,
            reckon_ledger::NewProvider {
                name: "stripe".into(),
                kind: reckon_ledger::ProviderKind::Stripe,
                secret: Some(secrecy::SecretString::from("rk_test_sim".to_owned())),
                settings: serde_json::json!({
                    "base_url": sim.base_url, "mode": "test", "rate_per_sec": 0,
                    "event_types": ["payment_intent.created"], "use_search": false,
                }),
            },
        )
        .await
        .unwrap();
    l.ledger
        .set_route(l.tenant.id, SOURCE, "*", Some("stripe"))
        .await
        .unwrap();
    let loopback =
        reckon_sources::EgressPolicy::new(&["127.0.0.0/8".to_owned()], None).expect("policy");
    let rctx = ReconcileCtx::new(l.ledger.clone()).with_egress(Arc::new(loopback));
    let outcomes = reconcile_all(&rctx, &l.tenant).await.unwrap();
    let o = outcomes
        .iter()
        .find(|o| o.key == key)
        .unwrap_or_else(|| panic!("{key} was not reconciled: {outcomes:#?}"));
    assert_eq!(o.outcome, "applied", "{o:#?}");
    assert_eq!(sim.non_get(), 0);
    db.drop_db().await;
}

/// docs/mapped-sources.md's Rails-style mapping, as the document gives it.
const RAILS: &str = r#"{
  "table": "idempotency_keys",
  "key": "{user_id}-{key}",
  "state": {
    "succeeded": "completed_at IS NOT NULL AND response_code >= 200 AND response_code < 300",
    "failed": "completed_at IS NOT NULL AND response_code >= 400 AND response_code < 500",
    "unknown": "completed_at IS NOT NULL AND (response_code IS NULL OR response_code >= 500)",
    "in_progress": "completed_at IS NULL"
  },
  "created_at": {"column": "created_at", "unit": "timestamp"},
  "updated_at": {"column": "updated_at", "unit": "timestamp"},
  "lease_expires": {"column": ["locked_at", "updated_at"], "unit": "timestamp", "plus_secs": 60},
  "request_hash": "request_fingerprint",
  "response": "response_body"
}"#;

/// A Rails-style table in each dialect (zoneless timestamps holding UTC, as Rails writes
/// them), read through the documented mapping.
async fn a_rails_style_table_is_read_through_the_documented_mapping(kind: Kind) {
    let db = SourceDb::fresh(kind).await;
    let (ddl, ago, now) = match kind {
        Kind::Sqlite => (
            "CREATE TABLE idempotency_keys (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL, \
             key varchar NOT NULL, request_path varchar NOT NULL, \
             request_fingerprint varchar NOT NULL, response_code integer, response_body text, \
             locked_at datetime(6), completed_at datetime(6), created_at datetime(6) NOT NULL, \
             updated_at datetime(6) NOT NULL)",
            "strftime('%Y-%m-%d %H:%M:%f', 'now', '-3600 seconds')",
            "strftime('%Y-%m-%d %H:%M:%f', 'now')",
        ),
        Kind::Postgres => (
            "CREATE TABLE idempotency_keys (id bigserial PRIMARY KEY, user_id bigint NOT NULL, \
             key character varying NOT NULL, request_path character varying NOT NULL, \
             request_fingerprint character varying NOT NULL, response_code integer, \
             response_body json, locked_at timestamp(6) without time zone, \
             completed_at timestamp(6) without time zone, \
             created_at timestamp(6) without time zone NOT NULL, \
             updated_at timestamp(6) without time zone NOT NULL)",
            "(now() AT TIME ZONE 'utc') - interval '3600 seconds'",
            "(now() AT TIME ZONE 'utc')",
        ),
        Kind::Mysql => (
            "CREATE TABLE idempotency_keys (id bigint AUTO_INCREMENT PRIMARY KEY, \
             user_id bigint NOT NULL, `key` varchar(255) NOT NULL, \
             request_path varchar(255) NOT NULL, request_fingerprint varchar(255) NOT NULL, \
             response_code int, response_body json, locked_at datetime(6), \
             completed_at datetime(6), created_at datetime(6) NOT NULL, \
             updated_at datetime(6) NOT NULL) DEFAULT CHARSET=utf8mb4",
            "UTC_TIMESTAMP(6) - INTERVAL 3600 SECOND",
            "UTC_TIMESTAMP(6)",
        ),
    };
    let key = if kind == Kind::Mysql { "`key`" } else { "key" };
    let row = |k: &str, code: &str, body: &str, locked: &str, completed: &str, at: &str| {
        format!(
            "INSERT INTO idempotency_keys (user_id, {key}, request_path, request_fingerprint, \
             response_code, response_body, locked_at, completed_at, created_at, updated_at) \
             VALUES (3, '{k}', '/charges', 'fp-{k}', {code}, {body}, {locked}, {completed}, \
             {at}, {at})"
        )
    };
    db.exec(&[
        ddl.to_owned(),
        row("done", "200", r#"'{"id": "pi_1"}'"#, "NULL", ago, ago),
        row("boom", "502", "NULL", "NULL", ago, ago),
        row("declined", "402", "NULL", "NULL", ago, ago),
        row("stuck", "NULL", "NULL", ago, "NULL", ago),
        row("fresh", "NULL", "NULL", now, "NULL", now),
    ])
    .await;
    let l = TestLedger::new().await;
    let egress = test_egress();
    let ctx = Ctx {
        ledger: &*l.ledger,
        egress: &egress,
        tenant: &l.tenant,
        actor: "operator".into(),
        via: Via::Cli,
    };
    let (_, checked) = commands::add_source_checked(&ctx, mapped(&db.source_dsn, RAILS))
        .await
        .unwrap_or_else(|e| panic!("{kind:?}: {e}"));
    assert_eq!(
        checked.unwrap().to_string(),
        "idempotency_keys: 5 rows, unknown 1, in_progress 2, failed 1, succeeded 1, matched by \
         no condition 0",
        "{kind:?}"
    );
    let report = l.scan(SOURCE, false).await;
    assert_eq!(
        (report.created, report.quarantined),
        (5, 0),
        "{kind:?}: {report:?}"
    );
    let hour_ago = reckon_domain::time::now() - 3600.0;
    let expect = [
        ("3-done", State::Succeeded, None),
        ("3-boom", State::Unknown, Some(UnresolvedKind::Unknown)),
        ("3-declined", State::Failed, None),
        (
            "3-stuck",
            State::InProgress,
            Some(UnresolvedKind::Abandoned),
        ),
        ("3-fresh", State::InProgress, None),
    ];
    for (k, state, unresolved) in expect {
        let e = l
            .ledger
            .get_effect(l.tenant.id, SOURCE, k)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{kind:?}: no effect {k}"))
            .effect;
        assert_eq!(
            (e.state, e.unresolved_kind),
            (state, unresolved),
            "{kind:?} {k}"
        );
        assert_eq!(
            e.request_hash,
            format!("fp-{}", k.trim_start_matches("3-")),
            "{kind:?} {k}"
        );
        if k != "3-fresh" {
            // Zoneless timestamps are read as UTC: an hour ago is an hour ago.
            assert!(
                (e.created_at - hour_ago).abs() < 30.0,
                "{kind:?} {k}: {}",
                e.created_at
            );
        }
    }
    db.drop_db().await;
}

#[tokio::test]
async fn a_rails_style_table_is_read_through_the_documented_mapping_sqlite() {
    a_rails_style_table_is_read_through_the_documented_mapping(Kind::Sqlite).await;
}

#[tokio::test]
async fn a_rails_style_table_is_read_through_the_documented_mapping_postgres() {
    a_rails_style_table_is_read_through_the_documented_mapping(Kind::Postgres).await;
}

#[tokio::test]
async fn a_rails_style_table_is_read_through_the_documented_mapping_mysql() {
    a_rails_style_table_is_read_through_the_documented_mapping(Kind::Mysql).await;
}
