//! A tenant's justonce table with huge values (a 12 MB response, a 2 MB request hash, a
//! 1 MB key): each column is read only up to one byte past its limit, the row is
//! quarantined with its reason, and the scan goes on with the other rows. For all three
//! source kinds.

use crate::common;

use common::{Kind, SOURCE, SourceDb, TestLedger};
use std::collections::{BTreeMap, BTreeSet};

fn setup(kind: Kind) -> Vec<String> {
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
            "CREATE TABLE justonce_keys (`key` longtext, state longtext, \
             request_hash longtext, response longtext, attempts int, created_at double, \
             updated_at double, expires_at double) DEFAULT CHARSET=utf8mb4",
            "`key`",
        ),
    };
    let repeat = |what: &str, n: usize| match kind {
        Kind::Sqlite => format!("replace(hex(zeroblob({n})), '00', '{what}')"),
        Kind::Postgres => format!("repeat('{what}', {n})"),
        Kind::Mysql => format!("REPEAT('{what}', {n})"),
    };
    let quoted = |inner: String| match kind {
        Kind::Mysql => format!("CONCAT('\"', {inner}, '\"')"),
        _ => format!("'\"' || {inner} || '\"'"),
    };
    let now = reckon_domain::time::now() - 10.0;
    let ins = |key: &str, hash: &str, response: &str| {
        format!(
            "INSERT INTO justonce_keys ({k}, state, request_hash, response, attempts, \
             created_at, updated_at, expires_at) VALUES ({key}, 'succeeded', {hash}, \
             {response}, 1, {now}, {now}, NULL)"
        )
    };
    vec![
        ddl.to_owned(),
        ins("'good-1'", "'h'", "'{\"a\": 1}'"),
        ins("'huge-response'", "'h'", &quoted(repeat("x", 12_000_000))),
        ins("'huge-hash'", &repeat("h", 2_000_000), "NULL"),
        ins(&repeat("k", 1_000_000), "'h'", "NULL"),
        ins("'good-2'", "'h'", "NULL"),
    ]
}

async fn over_the_limit_read_no_further(kind: Kind) {
    let db = SourceDb::fresh(kind).await;
    db.exec(&setup(kind)).await;
    let l = TestLedger::new().await;
    let source = l.add_source(SOURCE, kind.as_str(), &db.source_dsn).await;
    let report = l.scan(SOURCE, false).await;
    assert_eq!(report.created, 2, "the scan went on: {report:?}");
    let entries = l
        .ledger
        .list_quarantine(l.tenant.id, source.id, 100)
        .await
        .expect("quarantine");
    let by_reason: BTreeMap<String, String> = entries
        .iter()
        .map(|e| (e.reason.clone(), e.detail.clone()))
        .collect();
    let reasons: BTreeSet<&str> = by_reason.keys().map(String::as_str).collect();
    assert_eq!(
        reasons,
        BTreeSet::from([
            "key_too_long",
            "request_hash_too_long",
            "response_too_large"
        ]),
        "{entries:?}"
    );
    // What was read of each value: one byte (or, for PostgreSQL, one character) past the
    // limit, never the value whole.
    assert!(
        by_reason["response_too_large"].contains("(1048577 bytes read)"),
        "{by_reason:?}"
    );
    assert!(
        by_reason["key_too_long"].contains("(4097 bytes read)"),
        "{by_reason:?}"
    );
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
    a_hostile_value_is_read_only_past_its_limit_and_its_row_quarantined => over_the_limit_read_no_further;
}
