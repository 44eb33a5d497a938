//! `reckon demo`: a fresh embedded ledger, a justonce SQLite store written by reckon itself in
//! the library's exact format (a realistic day of charges, refunds and receipts, with the
//! troubles reckon exists for), a tenant and a token, a first scan, then the server.

use crate::config::Settings;
use anyhow::Context;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reckon_domain::time;
use reckon_engine::{ScanOptions, SourceInput, new_source, scan_source};
use reckon_ledger::Role;
use serde_json::json;
use sha2::{Digest, Sha256};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection, Executor};
use std::path::Path;

/// The DDL justonce 0.2.0's SqliteStore runs (see testdata/README.md).
const JUSTONCE_DDL: &str = "CREATE TABLE IF NOT EXISTS justonce_keys (
    key TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    response TEXT,
    attempts INTEGER NOT NULL DEFAULT 1,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    expires_at REAL
);
CREATE INDEX IF NOT EXISTS justonce_keys_state_updated ON justonce_keys (state, updated_at);";

/// justonce's fingerprint: "1:" + sha256 of the payload as compact JSON with sorted keys.
fn request_hash(payload: &serde_json::Value) -> String {
    // serde_json's map is ordered by key, so to_string() is the sorted, compact form.
    format!("1:{}", hex::encode(Sha256::digest(payload.to_string())))
}

struct Row {
    key: String,
    state: &'static str,
    payload: serde_json::Value,
    response: Option<serde_json::Value>,
    attempts: i64,
    created_at: f64,
    updated_at: f64,
    expires_at: Option<f64>,
}

/// A day of a small shop: charges, refunds, receipts; some unknown, two abandoned claims,
/// one reclaim, one claim still running.
fn generate(seed: u64, now: f64) -> Vec<Row> {
    let mut rng = StdRng::seed_from_u64(seed);
    let day_start = now - 24.0 * 3600.0;
    let retention = 30.0 * 86400.0;
    let mut rows = Vec::new();
    for i in 0..120 {
        let order = format!("ORD-{}", 1000 + i);
        let amount = rng.random_range(5..200) * 100;
        let t = day_start + f64::from(i) * 700.0 + rng.random_range(0.0..300.0);
        let payload = json!({"order": order, "amount": amount, "currency": "usd"});
        let (state, response, expires, updated, attempts) = match i {
            17 | 63 | 101 => ("unknown", None, None, t + 30.0, 1),
            // Killed mid-charge: the lease ran out and nobody came back.
            40 | 88 => ("in_progress", None, Some(t + 30.0), t, 1),
            // Reclaimed after the first worker's lease ran out.
            52 => (
                "succeeded",
                Some(
                    json!({"charge_id": format!("ch_demo_{i}"), "amount": amount, "status": "succeeded"}),
                ),
                Some(t + 90.0 + retention),
                t + 90.0,
                2,
            ),
            _ if rng.random_bool(0.05) => (
                "failed",
                Some(json!({"error": "card_declined"})),
                Some(t + 2.0 + retention),
                t + 2.0,
                1,
            ),
            _ => (
                "succeeded",
                Some(
                    json!({"charge_id": format!("ch_demo_{i}"), "amount": amount, "status": "succeeded"}),
                ),
                Some(t + 2.0 + retention),
                t + 2.0,
                1,
            ),
        };
        rows.push(Row {
            key: format!("charge:v1:{order}"),
            state,
            payload: payload.clone(),
            response,
            attempts,
            created_at: t,
            updated_at: updated,
            expires_at: expires,
        });
        if state == "succeeded" {
            rows.push(Row {
                key: format!("send_receipt:v1:{order}"),
                state: "succeeded",
                payload: json!({"order": order}),
                response: Some(json!("done")),
                attempts: 1,
                created_at: updated + 1.0,
                updated_at: updated + 1.5,
                expires_at: Some(updated + 1.5 + retention),
            });
            if rng.random_bool(0.1) {
                rows.push(Row {
                    key: format!("refund:v1:{order}"),
                    state: "succeeded",
                    payload: json!({"order": order, "amount": amount}),
                    response: Some(json!({"refund_id": format!("re_demo_{i}"), "amount": amount})),
                    attempts: 1,
                    created_at: updated + 3600.0,
                    updated_at: updated + 3602.0,
                    expires_at: Some(updated + 3602.0 + retention),
                });
            }
        }
    }
    // A charge in flight right now, with a valid lease: not unresolved.
    rows.push(Row {
        key: "charge:v1:ORD-2000".into(),
        state: "in_progress",
        payload: json!({"order": "ORD-2000", "amount": 4200, "currency": "usd"}),
        response: None,
        attempts: 1,
        created_at: now - 5.0,
        updated_at: now - 5.0,
        expires_at: Some(now + 25.0),
    });
    rows
}

pub async fn write_store(path: &Path, seed: u64) -> anyhow::Result<usize> {
    let mut conn = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .connect()
        .await?;
    conn.execute(JUSTONCE_DDL).await?;
    let rows = generate(seed, time::now());
    let mut tx = conn.begin().await?;
    for r in &rows {
        sqlx::query(
            "INSERT INTO justonce_keys (key, state, request_hash, response, attempts, \
             created_at, updated_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&r.key)
        .bind(r.state)
        .bind(request_hash(&r.payload))
        .bind(r.response.as_ref().map(|v| v.to_string()))
        .bind(r.attempts)
        .bind(r.created_at)
        .bind(r.updated_at)
        .bind(r.expires_at)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(rows.len())
}

pub async fn run(mut settings: Settings, seed: u64) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("reckon-demo-{}", std::process::id()));
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    settings.database_url = None;
    settings.master_key = None;
    settings.data_dir = dir.join("data");
    settings.sqlite_source_dir = Some(dir.clone());
    let ledger = crate::open_ledger(&settings).await?;

    let store = dir.join("shop-justonce.db");
    let n = write_store(&store, seed)
        .await
        .context("writing the demo justonce store")?;
    let tenant = ledger.create_tenant("demo").await?;
    let (token, hash) = reckon_web::mint_token();
    ledger
        .create_token(tenant.id, Role::Admin, &hash, "demo")
        .await?;
    let source = ledger
        .add_source(
            tenant.id,
            new_source(SourceInput {
                name: "shop".into(),
                kind: "sqlite".into(),
                dsn: Some(store.display().to_string()),
                table: None,
                scan_interval: Some("10s".into()),
                abandoned_after: None,
                overlap: None,
                full_scan_every: None,
            })
            .map_err(anyhow::Error::msg)?,
        )
        .await?;
    // The demo's store sits in its own directory, which is the SQLite source directory.
    let opts = ScanOptions {
        egress: std::sync::Arc::new(settings.egress_policy()?),
        ..ScanOptions::default()
    };
    let report = scan_source(&*ledger, &tenant, &source, &opts).await?;
    let unresolved = ledger
        .list_effects(
            tenant.id,
            &reckon_ledger::EffectQuery {
                unresolved: Some(true),
                limit: 1000,
                now: time::now(),
                ..Default::default()
            },
        )
        .await?;
    let banner = format!(
        "reckon demo\n\
         - justonce store: {store} ({n} rows written)\n\
         - first scan: {created} effects stored, {q} quarantined\n\
         - unresolved now: {u} ({unknown} unknown, {abandoned} abandoned)\n\
         - tenant: demo; admin API token: {token}\n\
         - API:  http://{{addr}}/api/v1/effects?unresolved=true\n\
         - try:  curl -H 'Authorization: Bearer {token}' 'http://{{addr}}/api/v1/lookup?q=ORD-1017'\n\
         - health: http://{{addr}}/healthz\n\
         Ctrl-C stops it. Data: {dir}",
        store = store.display(),
        created = report.created,
        q = report.quarantined,
        u = unresolved.len(),
        unknown = unresolved
            .iter()
            .filter(|e| e.unresolved_kind == Some(reckon_domain::UnresolvedKind::Unknown))
            .count(),
        abandoned = unresolved
            .iter()
            .filter(|e| e.unresolved_kind == Some(reckon_domain::UnresolvedKind::Abandoned))
            .count(),
        dir = dir.display(),
    );
    crate::serve::run(settings, ledger, Some(banner)).await
}
