//! Scanning justonce tables written by the real library (SQLite, PostgreSQL, MariaDB) into a
//! fresh SQLite ledger. Each test runs for all three source kinds.

use crate::common;

use common::{Kind, SOURCE, SourceDb, TestLedger};
use reckon_domain::{State, UnresolvedKind};
use reckon_ledger::{EffectQuery, Ledger, TenantId};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

fn strs(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("expected a list, got {v}"))
        .iter()
        .map(|s| s.as_str().expect("string").to_owned())
        .collect()
}

/// Timestamps are compared after a round trip through JSON text (Python repr → serde_json):
/// allow a couple of ULPs for the decimal parse, nothing more.
fn same_time(a: f64, b: f64) -> bool {
    (a - b).abs() <= a.abs().max(b.abs()) * 4.0 * f64::EPSILON
}

fn decode(response: Option<&str>) -> Value {
    match response {
        None => Value::Null,
        Some(s) => serde_json::from_str(s).unwrap_or_else(|e| panic!("{s:?} is not JSON: {e}")),
    }
}

async fn all_keys(ledger: &dyn Ledger, tenant: TenantId) -> Vec<String> {
    let effects = ledger
        .list_effects(
            tenant,
            &EffectQuery {
                limit: 1000,
                now: reckon_domain::time::now(),
                ..Default::default()
            },
        )
        .await
        .expect("list effects");
    effects.into_iter().map(|e| e.key).collect()
}

/// key → number of history events.
async fn history_lens(ledger: &dyn Ledger, tenant: TenantId) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for k in all_keys(ledger, tenant).await {
        let d = ledger
            .get_effect(tenant, SOURCE, &k)
            .await
            .expect("get effect")
            .unwrap_or_else(|| panic!("effect {k:?} listed but not found"));
        out.insert(k, d.history.len());
    }
    out
}

async fn populated(kind: Kind) -> (SourceDb, TestLedger, Value) {
    let db = SourceDb::fresh(kind).await;
    let populate = db.writer(&["populate"]);
    let l = TestLedger::new().await;
    l.add_source(SOURCE, kind.as_str(), &db.source_dsn).await;
    (db, l, populate)
}

async fn first_scan_stores_every_row(kind: Kind) {
    let (db, l, populate) = populated(kind).await;
    let report = l.scan(SOURCE, false).await;
    let rows = populate["rows"].as_array().expect("rows");
    assert!(!rows.is_empty());
    for row in rows {
        let key = row["key"].as_str().expect("key");
        let detail = l
            .ledger
            .get_effect(l.tenant.id, SOURCE, key)
            .await
            .expect("get effect")
            .unwrap_or_else(|| panic!("no effect for key {key:?}"));
        let e = detail.effect;
        assert_eq!(e.key.as_bytes(), key.as_bytes(), "key bytes");
        assert_eq!(
            e.state.as_str(),
            row["state"].as_str().unwrap(),
            "{key}: state"
        );
        assert_eq!(
            e.attempts,
            row["attempts"].as_i64().unwrap(),
            "{key}: attempts"
        );
        let upd = row["updated_at"].as_f64().unwrap();
        assert!(
            same_time(e.updated_at, upd),
            "{key}: updated_at {} vs {upd}",
            e.updated_at
        );
        let want = decode(row["response"].as_str());
        let got = decode(e.response_json.as_deref());
        assert_eq!(got, want, "{key}: response");
    }
    let done = l
        .ledger
        .get_effect(l.tenant.id, SOURCE, "charge:v1:ORD-17")
        .await
        .unwrap()
        .expect("ORD-17");
    assert_eq!(
        decode(done.effect.response_json.as_deref()),
        Value::String("done".into())
    );
    assert_eq!(all_keys(&*l.ledger, l.tenant.id).await.len(), rows.len());
    assert_eq!(report.quarantined, 0, "{report:?}");
    assert_eq!(
        report.rows_read,
        report.created + report.quarantined,
        "{report:?}"
    );
    db.drop_db().await;
}

async fn second_scan_writes_nothing(kind: Kind) {
    let (db, l, _populate) = populated(kind).await;
    l.scan(SOURCE, false).await;
    let before = history_lens(&*l.ledger, l.tenant.id).await;
    let report = l.scan(SOURCE, false).await;
    assert_eq!((report.created, report.updated), (0, 0), "{report:?}");
    let after = history_lens(&*l.ledger, l.tenant.id).await;
    assert_eq!(
        after.values().sum::<usize>(),
        before.values().sum::<usize>(),
        "history events"
    );
    assert_eq!(after, before);
    db.drop_db().await;
}

async fn unresolved_matches(kind: Kind) {
    let (db, l, populate) = populated(kind).await;
    l.scan(SOURCE, false).await;
    let expect = &populate["expect"];
    let unknown: BTreeSet<String> = strs(&expect["unresolved_unknown"]).into_iter().collect();
    let abandoned: BTreeSet<String> = strs(&expect["abandoned"]).into_iter().collect();
    let leased: BTreeSet<String> = strs(&expect["leased"]).into_iter().collect();
    assert!(!unknown.is_empty() && !abandoned.is_empty() && !leased.is_empty());
    let effects = l
        .ledger
        .list_effects(
            l.tenant.id,
            &EffectQuery {
                unresolved: Some(true),
                limit: 1000,
                now: reckon_domain::time::now(),
                ..Default::default()
            },
        )
        .await
        .expect("list unresolved");
    let got: BTreeMap<String, Option<UnresolvedKind>> = effects
        .into_iter()
        .map(|e| (e.key, e.unresolved_kind))
        .collect();
    let want: BTreeMap<String, Option<UnresolvedKind>> = unknown
        .iter()
        .map(|k| (k.clone(), Some(UnresolvedKind::Unknown)))
        .chain(
            abandoned
                .iter()
                .map(|k| (k.clone(), Some(UnresolvedKind::Abandoned))),
        )
        .collect();
    assert_eq!(got, want);
    for k in &leased {
        assert!(!got.contains_key(k), "leased {k} listed as unresolved");
    }
    db.drop_db().await;
}

async fn each_change_is_one_event(kind: Kind) {
    let (db, l, _populate) = populated(kind).await;
    l.scan(SOURCE, false).await;
    let before = history_lens(&*l.ledger, l.tenant.id).await;
    let mutate = db.writer(&["mutate"]);
    l.scan(SOURCE, true).await;
    let after = history_lens(&*l.ledger, l.tenant.id).await;
    let expect = &mutate["expect"];
    let rows: BTreeMap<String, &Value> = mutate["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["key"].as_str().unwrap().to_owned(), r))
        .collect();
    let mut touched = BTreeSet::new();
    for field in ["completed", "marked_unknown", "reclaimed"] {
        for k in strs(&expect[field]) {
            let d = l
                .ledger
                .get_effect(l.tenant.id, SOURCE, &k)
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("{field} {k} missing"));
            assert_eq!(
                d.history.len(),
                before[&k] + 1,
                "{field} {k}: {:?}",
                d.history
            );
            let ev = d.history.iter().max_by_key(|e| e.id).expect("an event");
            let new_state = rows[&k]["state"].as_str().unwrap();
            assert_eq!(ev.kind, "changed", "{field} {k}: {ev:?}");
            assert_eq!(
                ev.to_state.as_deref(),
                Some(new_state),
                "{field} {k}: {ev:?}"
            );
            assert_eq!(d.effect.state.as_str(), new_state, "{field} {k}");
            touched.insert(k);
        }
    }
    let swept = strs(&expect["swept"]);
    assert!(!swept.is_empty());
    for k in swept {
        let d = l
            .ledger
            .get_effect(l.tenant.id, SOURCE, &k)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("swept {k} no longer kept"));
        assert_eq!(d.effect.gone_reason.as_deref(), Some("swept"), "{k}");
        assert_eq!(
            d.history.len(),
            before[&k] + 1,
            "swept {k}: {:?}",
            d.history
        );
        let ev = d.history.iter().max_by_key(|e| e.id).unwrap();
        assert_eq!(ev.kind, "swept", "{k}: {ev:?}");
        touched.insert(k);
    }
    for (k, n) in &after {
        if !touched.contains(k) {
            assert_eq!(Some(n), before.get(k), "{k} got a new event");
        }
    }
    db.drop_db().await;
}

/// The relaxed table with good and hostile rows, and the expected reason → count.
pub(crate) fn hostile_setup(kind: Kind) -> (Vec<String>, BTreeMap<String, i64>) {
    let (ddl, k) = match kind {
        Kind::Sqlite => (
            "CREATE TABLE justonce_keys (key TEXT, state TEXT, request_hash TEXT, response TEXT, \
             attempts INTEGER, created_at REAL, updated_at REAL, expires_at REAL)",
            "key",
        ),
        Kind::Postgres => (
            "CREATE TABLE justonce_keys (key text, state text, request_hash text, response text, \
             attempts integer, created_at double precision, updated_at double precision, \
             expires_at double precision)",
            "key",
        ),
        Kind::Mysql => (
            "CREATE TABLE justonce_keys (`key` varchar(255), state varchar(32), \
             request_hash varchar(255), response longtext, attempts int, created_at double, \
             updated_at double, expires_at double) DEFAULT CHARSET=utf8mb4",
            "`key`",
        ),
    };
    let now = reckon_domain::time::now() - 10.0;
    let ins = |key: &str, state: &str, response: &str, updated: &str| {
        format!(
            "INSERT INTO justonce_keys ({k}, state, request_hash, response, attempts, \
             created_at, updated_at, expires_at) VALUES ({key}, {state}, 'h', {response}, 1, \
             {now}, {updated}, NULL)"
        )
    };
    let ts = now.to_string();
    let mut s = vec![ddl.to_owned()];
    s.push(ins("'good-1'", "'succeeded'", "'{\"a\": 1}'", &ts));
    s.push(ins("'good-2'", "'unknown'", "NULL", &ts));
    s.push(ins("'good-3'", "'failed'", "'\"declined\"'", &ts));
    s.push(ins("'bad-state'", "'partially_refunded'", "NULL", &ts));
    s.push(ins("'bad-null-state'", "NULL", "NULL", &ts));
    s.push(ins("'bad-json'", "'succeeded'", "'{not json'", &ts));
    let big = match kind {
        Kind::Sqlite => "'\"' || replace(hex(zeroblob(1100000)), '00', 'x') || '\"'",
        Kind::Postgres => "'\"' || repeat('x', 1100000) || '\"'",
        Kind::Mysql => "CONCAT('\"', REPEAT('x', 1100000), '\"')",
    };
    s.push(ins("'bad-big'", "'succeeded'", big, &ts));
    let mut reasons: BTreeMap<String, i64> = [
        ("unknown_state", 1),
        ("null_column", 1),
        ("invalid_json", 1),
        ("response_too_large", 1),
    ]
    .into_iter()
    .map(|(r, n)| (r.to_owned(), n))
    .collect();
    match kind {
        Kind::Sqlite => {
            s.push(ins("'bad-time'", "'succeeded'", "NULL", "'yesterday'"));
            s.push(ins(
                "'k' || replace(hex(zeroblob(5000)), '00', 'k')",
                "'succeeded'",
                "NULL",
                &ts,
            ));
            s.push(ins("CAST(X'66FF' AS TEXT)", "'succeeded'", "NULL", &ts));
            reasons.insert("not_a_number".into(), 1);
            reasons.insert("key_too_long".into(), 1);
            reasons.insert("invalid_utf8".into(), 1);
        }
        Kind::Postgres => {
            s.push(ins("'bad-time'", "'succeeded'", "NULL", "'NaN'::float8"));
            s.push(ins("repeat('k', 5000)", "'succeeded'", "NULL", &ts));
            reasons.insert("out_of_range".into(), 1);
            reasons.insert("key_too_long".into(), 1);
        }
        Kind::Mysql => {}
    }
    (s, reasons)
}

async fn quarantine_map(l: &TestLedger) -> BTreeMap<String, i64> {
    l.ledger
        .quarantine_counts(l.tenant.id)
        .await
        .expect("quarantine counts")
        .into_iter()
        .map(|q| (q.reason, q.count))
        .collect()
}

async fn hostile_rows_quarantined(kind: Kind) {
    let db = SourceDb::fresh(kind).await;
    let (statements, reasons) = hostile_setup(kind);
    db.exec(&statements).await;
    let l = TestLedger::new().await;
    l.add_source(SOURCE, kind.as_str(), &db.source_dsn).await;
    let report = l.scan(SOURCE, false).await;
    let keys: BTreeSet<String> = all_keys(&*l.ledger, l.tenant.id)
        .await
        .into_iter()
        .collect();
    let good: BTreeSet<String> = ["good-1", "good-2", "good-3"].map(String::from).into();
    assert_eq!(keys, good);
    assert_eq!(quarantine_map(&l).await, reasons);
    assert_eq!(report.created, 3, "{report:?}");
    assert_eq!(
        report.rows_read,
        report.created + report.quarantined,
        "{report:?}"
    );
    assert!(report.quarantined >= reasons.len() as u64, "{report:?}");
    l.scan(SOURCE, false).await;
    l.scan(SOURCE, true).await;
    assert_eq!(
        quarantine_map(&l).await,
        reasons,
        "rescans added quarantine rows"
    );
    db.drop_db().await;
}

async fn failing_sources(kind: Kind) {
    let l = TestLedger::new().await;
    // A PostgreSQL database that has no justonce table.
    let empty = SourceDb::fresh(Kind::Postgres).await;
    l.add_source("no-table", "postgres", &empty.source_dsn)
        .await;
    let err = l
        .try_scan("no-table", false)
        .await
        .expect_err("scanning a database without the table must fail");
    let s = l.source("no-table").await;
    let msg = s.last_error.clone().expect("last_error recorded");
    assert!(
        msg.contains("justonce_keys"),
        "unclear error: {msg:?} / {err}"
    );
    assert!(s.last_success_at.is_none());
    // A MariaDB server that is not there.
    l.add_source("closed", "mysql", "mysql://root@127.0.0.1:1/x")
        .await;
    let err = l
        .try_scan("closed", false)
        .await
        .expect_err("scanning a closed port must fail");
    let s = l.source("closed").await;
    let msg = s.last_error.clone().expect("last_error recorded");
    let lower = msg.to_lowercase();
    assert!(
        lower.contains("connect") || lower.contains("refused"),
        "unclear error: {msg:?} / {err}"
    );
    assert!(s.last_success_at.is_none());
    // A healthy source in the same tenant still scans.
    let db = SourceDb::fresh(kind).await;
    let populate = db.writer(&["populate"]);
    l.add_source(SOURCE, kind.as_str(), &db.source_dsn).await;
    let report = l.scan(SOURCE, false).await;
    let n = populate["rows"].as_array().unwrap().len() as u64;
    assert_eq!(report.created, n, "{report:?}");
    assert!(l.source(SOURCE).await.last_success_at.is_some());
    assert_eq!(
        l.ledger
            .get_effect(l.tenant.id, SOURCE, "charge:v1:ORD-17")
            .await
            .unwrap()
            .map(|d| d.effect.state),
        Some(State::Succeeded)
    );
    db.drop_db().await;
    empty.drop_db().await;
}

/// A first pass killed after a few batches (here: its progress callback panics, which ends
/// the scan's task the moment a batch is committed, as a kill would) goes on from its cursor
/// when scanned again: it reads only the rest (and the overlap), expects those keys new,
/// quarantines what the first pass would have, and counts as a full scan without comparing
/// key sets.
async fn first_pass_cut_short(kind: Kind) {
    let db = SourceDb::fresh(kind).await;
    let (mut statements, mut reasons) = hostile_setup(kind);
    let k = if kind == Kind::Mysql { "`key`" } else { "key" };
    let start = reckon_domain::time::now() - 1000.0;
    let good = 60;
    for i in 0..good {
        statements.push(format!(
            "INSERT INTO justonce_keys ({k}, state, request_hash, response, attempts, \
             created_at, updated_at, expires_at) VALUES ('row-{i:03}', 'succeeded', 'h', NULL, \
             1, {start}, {}, NULL)",
            start + i as f64
        ));
    }
    // Wherever the database sorts a NULL timestamp, the pass quarantines its row once.
    statements.push(format!(
        "INSERT INTO justonce_keys ({k}, state, request_hash, response, attempts, created_at, \
         updated_at, expires_at) VALUES ('bad-null-time', 'succeeded', 'h', NULL, 1, {start}, \
         NULL, NULL)"
    ));
    *reasons.entry("null_column".into()).or_default() += 1;
    db.exec(&statements).await;
    let total = statements.len() as u64 - 1;

    let l = TestLedger::new().await;
    let new = reckon_engine::new_source(reckon_engine::SourceInput {
        name: SOURCE.into(),
        kind: kind.as_str().into(),
        dsn: Some(db.source_dsn.clone()),
        table: None,
        scan_interval: None,
        abandoned_after: Some("0s".into()),
        overlap: Some("1s".into()),
        full_scan_every: None,
        mapping: None,
    })
    .unwrap();
    l.ledger.add_source(l.tenant.id, new).await.unwrap();
    let source = l.source(SOURCE).await;
    let (ledger, tenant) = (l.ledger.clone(), l.tenant.clone());
    let killed = tokio::spawn(async move {
        let opts = reckon_engine::ScanOptions {
            batch_size: 10,
            egress: common::test_egress(),
            progress: Some(std::sync::Arc::new(|read| {
                assert!(read < 20, "killed after {read} rows");
            })),
            ..Default::default()
        };
        reckon_engine::scan_source(&*ledger, &tenant, &source, &opts).await
    })
    .await;
    assert!(killed.is_err(), "the first pass was to be cut short");
    let cut = l.source(SOURCE).await;
    assert!(
        cut.cursor.is_some() && cut.last_full_scan_at.is_none(),
        "{cut:?}"
    );
    let stored = all_keys(&*l.ledger, l.tenant.id).await.len() as u64;
    assert!(stored >= 10, "batches committed before the kill: {stored}");

    let report = l.scan(SOURCE, false).await;
    assert!(
        report.full,
        "the finished pass counts as a full scan: {report:?}"
    );
    assert_eq!(report.recovered, 0, "{report:?}");
    assert!(
        report.rows_read + stored <= total + 5,
        "it went on from the cursor: read {} of {total} after {stored} stored",
        report.rows_read
    );
    let keys = all_keys(&*l.ledger, l.tenant.id).await;
    assert_eq!(keys.len(), good + 3, "every good row once (and good-1..3)");
    assert_eq!(
        keys.iter().collect::<BTreeSet<_>>().len(),
        keys.len(),
        "no key twice"
    );
    assert_eq!(quarantine_map(&l).await, reasons);
    let lens = history_lens(&*l.ledger, l.tenant.id).await;
    assert!(
        lens.values().all(|&n| n == 1),
        "one first sight each: {lens:?}"
    );
    assert!(l.source(SOURCE).await.last_full_scan_at.is_some());
    // And it is an ordinary source from now on: a rescan reads only the overlap.
    let again = l.scan(SOURCE, false).await;
    assert_eq!(again.created + again.updated, 0, "{again:?}");
    db.drop_db().await;
}

/// A batch ends at its byte bound as well as at its row count: with a bound smaller than
/// any row, every row is a batch of its own (the progress moves one row at a time), and
/// every row is stored all the same.
async fn batches_cut_at_their_byte_bound(kind: Kind) {
    let (db, l, populate) = populated(kind).await;
    let rows = populate["rows"].as_array().expect("rows").len() as u64;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let progress = seen.clone();
    let opts = reckon_engine::ScanOptions {
        batch_bytes: 1,
        egress: common::test_egress(),
        progress: Some(std::sync::Arc::new(move |read| {
            progress.lock().unwrap().push(read);
        })),
        ..Default::default()
    };
    assert!(
        opts.batch_size as u64 > rows,
        "the row count alone would make one batch"
    );
    let source = l.source(SOURCE).await;
    let report = reckon_engine::scan_source(&*l.ledger, &l.tenant, &source, &opts)
        .await
        .unwrap();
    assert_eq!(report.rows_read, rows, "{report:?}");
    assert_eq!(report.created + report.quarantined, rows, "{report:?}");
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.windows(2).all(|w| w[1] - w[0] <= 1) && seen.first() == Some(&1),
        "batches of one row each: progress {seen:?}"
    );
    assert_eq!(all_keys(&*l.ledger, l.tenant.id).await.len() as u64, rows);
    db.drop_db().await;
}

macro_rules! for_each_kind {
    ($($name:ident => $body:ident;)*) => {
        $(
            mod $name {
                use super::*;
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() { $body(Kind::Sqlite).await }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() { $body(Kind::Postgres).await }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn mysql() { $body(Kind::Mysql).await }
            }
        )*
    };
}

for_each_kind! {
    a_first_scan_stores_every_row_once_with_identical_keys_and_decoded_responses => first_scan_stores_every_row;
    a_second_scan_with_no_change_writes_nothing => second_scan_writes_nothing;
    unresolved_is_exactly_the_unknown_rows_plus_the_abandoned_claims => unresolved_matches;
    each_change_in_the_source_appears_as_one_history_event => each_change_is_one_event;
    a_hostile_row_is_quarantined_with_its_reason_and_the_scan_goes_on => hostile_rows_quarantined;
    an_unreachable_source_or_missing_table_fails_its_own_scan_with_a_clear_message => failing_sources;
    a_first_pass_cut_short_goes_on_from_its_cursor_and_counts_as_full => first_pass_cut_short;
    a_batch_ends_at_its_byte_bound_and_every_row_is_stored => batches_cut_at_their_byte_bound;
}
