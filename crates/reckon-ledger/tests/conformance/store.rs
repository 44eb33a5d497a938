//! The store itself: migrations and URL schemes.

use super::*;

// 1. migrations and URL schemes
pub(crate) async fn story_migrate_and_schemes(ledger: Arc<dyn Ledger>) {
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
