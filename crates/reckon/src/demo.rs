//! `reckon demo`: a fresh embedded ledger, a justonce SQLite store written by reckon itself in
//! the library's exact format (a realistic day of charges, refunds and receipts, with the
//! troubles reckon exists for), a tenant and a token, a first scan, then the server.

use crate::config::Settings;
use anyhow::Context;
use base64::Engine;
use rand::RngCore;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reckon_domain::time;
use reckon_engine::reconcile::{ReconcileCtx, reconcile_all};
use reckon_engine::{ScanOptions, SourceInput, new_source, scan_source};
use reckon_ledger::Role;
use reckon_providers::demo::DemoState;
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

pub struct Row {
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
    // Yesterday (UTC, the demo tenant's zone), so the morning audit has a whole day.
    let day_start = (now / 86_400.0).floor() * 86_400.0 - 86_400.0 + 600.0;
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
                    json!({"charge_id": format!("ch_demo_{i}"), "amount": amount, "currency": "usd", "status": "succeeded"}),
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
                    json!({"charge_id": format!("ch_demo_{i}"), "amount": amount, "currency": "usd", "status": "succeeded"}),
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
    // Unknowns no provider can settle: a receipt (no provider answers for receipts) and a
    // refund routed to the legacy ledger, which is down. They stay unresolved, and say why.
    // (ORD-1017's charge is itself unknown, so it has no receipt yet; the refund takes the
    // first succeeded order without one.)
    let refund = (1045..1100)
        .map(|n| format!("refund:v1:ORD-{n}"))
        .find(|k| {
            let charge = k.replace("refund:", "charge:");
            !rows.iter().any(|r| &r.key == k)
                && rows
                    .iter()
                    .any(|r| r.key == charge && r.state == "succeeded")
        })
        .expect("a succeeded order without a refund");
    for (key, at) in [
        (
            "send_receipt:v1:ORD-1017".to_owned(),
            day_start + 17.0 * 700.0 + 400.0,
        ),
        (refund, day_start + 45.0 * 700.0 + 3900.0),
    ] {
        rows.push(Row {
            payload: json!({"order": key.rsplit(':').next()}),
            key,
            state: "unknown",
            response: None,
            attempts: 1,
            created_at: at,
            updated_at: at + 30.0,
            expires_at: None,
        });
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

pub async fn write_store(path: &Path, seed: u64) -> anyhow::Result<Vec<Row>> {
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
    Ok(rows)
}

/// The demo provider's side of the day: a charge for every charge the shop recorded as
/// succeeded, plus the troubles an audit and a reconciler exist for. Returns what was
/// planted, for the banner.
fn plant_provider(rows: &[Row], provider: &DemoState) -> Planted {
    let mut planted = Planted::default();
    for r in rows {
        let Some(order) = r.key.strip_prefix("charge:v1:") else {
            continue;
        };
        let amount = r.payload["amount"].as_i64().unwrap_or(0);
        let created = r.created_at + 1.0;
        match (r.state, order) {
            // A charge recorded as succeeded that the provider never saw: "missing".
            ("succeeded", "ORD-1075") => planted.missing.push(r.key.clone()),
            ("succeeded", _) => {
                provider.charge(&r.key, amount, "usd", created);
            }
            // Unknown: the worker died after the call. One went through, one did not, one
            // went through twice (a retry after a timeout): applied, not_applied, duplicate.
            ("unknown", "ORD-1017") | ("in_progress", "ORD-1040") => {
                provider.charge(&r.key, amount, "usd", created);
            }
            ("unknown", "ORD-1101") => {
                provider.charge(&r.key, amount, "usd", created);
                provider.charge(&r.key, amount, "usd", created + 20.0);
                planted.duplicate.push(r.key.clone());
            }
            _ => {}
        }
    }
    // Money the provider took that the shop has no record of: "orphan".
    // (An hour after the day's first charge: inside the audited day.)
    if let Some(first) = rows
        .iter()
        .filter(|r| r.key.starts_with("charge:"))
        .map(|r| r.created_at)
        .reduce(f64::min)
    {
        provider.charge("charge:v1:ORD-9001", 4900, "usd", first + 3600.0);
        planted.orphan.push("charge:v1:ORD-9001".into());
    }
    planted
}

#[derive(Default)]
struct Planted {
    missing: Vec<String>,
    duplicate: Vec<String>,
    orphan: Vec<String>,
}

const DEMO_TENANT: &str = "demo";

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

    // The SQLite source directory is `dir`; each tenant's files are in its own
    // subdirectory, `dir/demo/` for the demo tenant (T12).
    let store = dir.join(DEMO_TENANT).join("shop-justonce.db");
    std::fs::create_dir_all(dir.join(DEMO_TENANT))?;
    let rows = write_store(&store, seed)
        .await
        .context("writing the demo justonce store")?;
    let n = rows.len();
    // The built-in provider, on loopback, holding the shop's charges as the "payment
    // provider" saw them. Loopback is refused by default; the demo allows its own.
    let provider_state = DemoState::new();
    let planted = plant_provider(&rows, &provider_state);
    let (provider_url, _provider) = reckon_providers::demo::serve_loopback(provider_state)
        .await
        .context("starting the demo provider")?;
    settings.egress_allow.push("127.0.0.1/32".into());
    // /metrics is off unless configured: the demo turns it on behind a token of its own.
    let metrics_token = {
        let mut b = [0u8; 18];
        rand::rng().fill_bytes(&mut b);
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
    };
    settings.metrics_token = Some(metrics_token.clone());
    let tenant = ledger.create_tenant(DEMO_TENANT).await?;
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
    // The demo's store sits in the demo tenant's directory of the SQLite source directory.
    let opts = ScanOptions {
        egress: std::sync::Arc::new(settings.egress_policy(&*ledger).await?),
        ..ScanOptions::default()
    };
    let report = scan_source(&*ledger, &tenant, &source, &opts).await?;
    // Charges go to the demo provider; receipts have no provider to ask.
    ledger
        .add_provider(
            tenant.id,
            reckon_ledger::NewProvider {
                name: "demo-pay".into(),
                kind: "demo".into(),
                secret: None,
                settings: json!({ "base_url": provider_url, "replay_window_secs": 86400.0 }),
            },
        )
        .await?;
    ledger
        .set_route(tenant.id, "shop", "charge", Some("demo-pay"))
        .await?;
    // The shop's refunds go through an in-house ledger service that is down today: its
    // lookups fail, so its effects stay unresolved (indeterminate, needing attention).
    ledger
        .add_provider(
            tenant.id,
            reckon_ledger::NewProvider {
                name: "legacy-ledger".into(),
                kind: "http".into(),
                secret: None,
                settings: json!({ "base_url": format!("{provider_url}down/") }),
            },
        )
        .await?;
    ledger
        .set_route(tenant.id, "shop", "refund", Some("legacy-ledger"))
        .await?;
    ledger
        .set_route(tenant.id, "shop", "send_receipt", None)
        .await?;
    // The nightly audit is due from midnight, so the running demo's schedule audits
    // yesterday within its first check: complete for demo-pay, and the in-house ledger's
    // part failed with its reason (it is down), shown as that provider's.
    reckon_engine::audit::set_settings(&*ledger, tenant.id, None, Some("00:00")).await?;
    let egress = std::sync::Arc::new(settings.egress_policy(&*ledger).await?);
    let instance_metrics = reckon_web::metrics::Metrics::new();
    let ctx = ReconcileCtx::new(ledger.clone())
        .with_egress(egress)
        .with_metrics(instance_metrics.clone());
    let outcomes = reconcile_all(&ctx, &tenant).await?;
    // The morning audit of yesterday against the demo provider's charges.
    let mut audit_ctx = reckon_engine::audit::AuditCtx::new(ledger.clone());
    audit_ctx.egress = std::sync::Arc::new(settings.egress_policy(&*ledger).await?);
    audit_ctx.metrics = Some(instance_metrics.clone());
    let audit = reckon_engine::audit::run_audit(
        &audit_ctx,
        tenant.id,
        &reckon_engine::audit::AuditRequest {
            date: None,
            provider: Some("demo-pay".into()),
            triggered_by: "operator".into(),
            now: time::now(),
        },
        None,
    )
    .await
    .context("auditing yesterday")?;
    let audit_summary = match audit.run.status.as_str() {
        "complete" => {
            let f = &audit.run.counts["findings"];
            format!(
                "{}: {} duplicate, {} orphan, {} missing, {} unresolved, {} risky reclaim",
                audit.run.day,
                f["duplicate"],
                f["orphan"],
                f["missing"],
                f["unresolved"],
                f["risky_reclaim"]
            )
        }
        other => format!(
            "{}: {other} ({})",
            audit.run.day,
            audit.run.reason.clone().unwrap_or_default()
        ),
    };
    let verdicts: Vec<String> = outcomes
        .iter()
        .filter(|o| o.resolved)
        .map(|o| format!("{} {}", o.key, o.outcome))
        .collect();
    // A person to sign in as.
    let password = {
        let mut b = [0u8; 12];
        rand::rng().fill_bytes(&mut b);
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
    };
    let user = ledger
        .create_user(
            "admin@demo.invalid",
            &reckon_web::password::hash_blocking(&password),
        )
        .await?;
    ledger
        .set_membership(tenant.id, user.id, Role::Admin)
        .await?;

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
         - reconciled with the demo provider: {verdicts}\n\
         - unresolved now: {u} ({unknown} unknown, {abandoned} abandoned)\n\
         - planted for the audit: duplicate {dup:?}, orphan {orphan:?}, missing {missing:?}\n\
         - audit of yesterday: {audit_summary}\n\
         - nightly audit: due at 00:00 UTC; the schedule audits every provider (legacy-ledger is down: its part fails)\n\
         - try:  curl -H 'Authorization: Bearer {token}' 'http://{{addr}}/api/v1/audits/{audit_id}?format=csv'\n\
         - tenant: demo; admin API token: {token}\n\
         - dashboard: http://{{addr}}/signin  (admin@demo.invalid / {password})\n\
         - API:  http://{{addr}}/api/v1/effects?unresolved=true\n\
         - try:  curl -H 'Authorization: Bearer {token}' 'http://{{addr}}/api/v1/lookup?q=ORD-1017'\n\
         - metrics: curl -H 'Authorization: Bearer {metrics_token}' http://{{addr}}/metrics\n\
         - health: http://{{addr}}/healthz\n\
         Ctrl-C stops it. Data: {dir}",
        store = store.display(),
        verdicts = verdicts.join(", "),
        audit_id = audit.id,
        dup = planted.duplicate,
        orphan = planted.orphan,
        missing = planted.missing,
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
    let metrics = crate::serve::metrics_state(&settings, instance_metrics);
    crate::serve::run_with(settings, ledger, Some(banner), metrics).await
}
