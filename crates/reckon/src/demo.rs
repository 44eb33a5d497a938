//! `reckon demo`: a fresh embedded ledger, a justonce SQLite store written by reckon itself in
//! the library's exact format (a realistic day of charges, refunds and receipts, with the
//! troubles reckon exists for), a tenant and a token, a first scan, then the server.

use crate::config::Settings;
use anyhow::{Context, bail};
use base64::Engine;
use rand::RngCore;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reckon_domain::time;
use reckon_engine::reconcile::{ReconcileCtx, reconcile_all};
use reckon_engine::{ScanOptions, SourceInput, new_source, scan_source};
use reckon_ledger::Role;
use reckon_providers::demo::DemoState;
use secrecy::{ExposeSecret, SecretString};
use serde_json::json;
use sha2::{Digest, Sha256};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection, Executor};
use std::path::{Path, PathBuf};

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
                // The mail service's message id, as a shop records it.
                response: Some(json!({"message_id": format!("msg_demo_{i}")})),
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
        .bind(r.response.as_ref().map(std::string::ToString::to_string))
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
        // The provider knows each payer as its customer, as Stripe does.
        let customer = demo_customer(order);
        let charge = |created: f64| {
            provider.charge_of(&r.key, amount, "usd", created, Some(&customer));
        };
        match (r.state, order) {
            // A charge recorded as succeeded that the provider never saw: "missing".
            ("succeeded", "ORD-1075") => planted.missing.push(r.key.clone()),
            ("succeeded", _) => charge(created),
            // Unknown: the worker died after the call. One went through, one did not, one
            // went through twice (a retry after a timeout): applied, not_applied, duplicate.
            ("unknown", "ORD-1017") | ("in_progress", "ORD-1040") => charge(created),
            ("unknown", "ORD-1101") => {
                charge(created);
                charge(created + 20.0);
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
        provider.charge_of(
            "charge:v1:ORD-9001",
            4900,
            "usd",
            first + 3600.0,
            Some(&demo_customer("ORD-9001")),
        );
        planted.orphan.push("charge:v1:ORD-9001".into());
    }
    planted
}

/// The demo provider's customer of an order: `cus_demo_1101` for `ORD-1101`.
fn demo_customer(order: &str) -> String {
    format!("cus_demo_{}", order.trim_start_matches("ORD-"))
}

#[derive(Default)]
struct Planted {
    missing: Vec<String>,
    duplicate: Vec<String>,
    orphan: Vec<String>,
}

const DEMO_TENANT: &str = "demo";
/// The demo's settings, in its data directory.
const CONFIG_FILE: &str = "reckon.toml";

/// The settings the demo chose for itself, as a `reckon.toml` the CLI can load: its data
/// directory, the SQLite source directory, the egress allowance for its loopback provider
/// and its metrics token. 0600, as it holds that token.
fn write_config(path: &Path, settings: &Settings) -> anyhow::Result<()> {
    // TOML basic strings take JSON's escapes, and a JSON array of strings is a TOML array.
    let text = |p: &Path| -> anyhow::Result<String> {
        let s = p
            .to_str()
            .with_context(|| format!("{} is not UTF-8", p.display()))?;
        Ok(serde_json::to_string(s)?)
    };
    let mut toml = format!(
        "# Written by `reckon demo`: the settings its own process used, so that\n\
         # `reckon --data-dir DIR --config DIR/reckon.toml ...` works on its ledger.\n\
         data_dir = {}\n\
         egress_allow = {}\n",
        text(&settings.data_dir)?,
        serde_json::to_string(&settings.egress_allow)?,
    );
    if let Some(d) = &settings.sqlite_source_dir {
        toml.push_str(&format!("sqlite_source_dir = {}\n", text(d)?));
    }
    if let Some(t) = &settings.metrics_token {
        let t = serde_json::to_string(t.expose_secret())?;
        toml.push_str(&format!("metrics_token = {t}\n"));
    }
    let mut open = std::fs::OpenOptions::new();
    open.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
    std::io::Write::write_all(&mut open.open(path)?, toml.as_bytes())?;
    Ok(())
}

/// The command prefix that points the CLI at the demo's ledger: this binary, the data
/// directory and the demo's reckon.toml. RECKON_* variables in the environment would win
/// over the file, so the ones that would lead elsewhere are unset in the prefix.
fn cli_prefix(dir: &Path) -> String {
    let mut words = Vec::new();
    let overriding: Vec<&str> = [
        "RECKON_DATABASE_URL",
        "RECKON_MASTER_KEY",
        "RECKON_EGRESS_ALLOW",
        "RECKON_SQLITE_SOURCE_DIR",
    ]
    .into_iter()
    .filter(|v| std::env::var_os(v).is_some())
    .collect();
    if !overriding.is_empty() {
        words.push("env".to_owned());
        for v in overriding {
            words.push("-u".to_owned());
            words.push(v.to_owned());
        }
    }
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("reckon"));
    words.push(shell_word(&exe.display().to_string()));
    words.push("--data-dir".to_owned());
    words.push(shell_word(&dir.display().to_string()));
    words.push("--config".to_owned());
    words.push(shell_word(&dir.join(CONFIG_FILE).display().to_string()));
    words.join(" ")
}

/// `s` as one POSIX shell word: bare when it is plainly safe, else single-quoted.
fn shell_word(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+:,=@%".contains(c));
    if plain {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Run the demo. Its ledger, key file, store and `reckon.toml` go to `data_dir` when the
/// operator chose one (it must not hold a ledger yet: the demo plants its own day), else to
/// a new temporary directory, which is removed when the demo stops (Ctrl-C, SIGTERM, or a
/// failure) unless `keep`: a demo run each day would otherwise leave a ledger, a key file
/// and a store behind each time. A directory the operator chose is theirs, and kept.
pub async fn run(
    settings: Settings,
    seed: u64,
    data_dir: Option<PathBuf>,
    keep: bool,
) -> anyhow::Result<()> {
    let temporary = data_dir.is_none();
    let dir = match data_dir {
        Some(d) => d,
        None => std::env::temp_dir().join(format!("reckon-demo-{}", std::process::id())),
    };
    let remove = temporary && !keep;
    let kept = if !temporary {
        "it is yours (--data-dir), so it stays when the demo stops"
    } else if keep {
        "kept when the demo stops (--keep)"
    } else {
        "removed when the demo stops; `reckon demo --keep` keeps it (or give `--data-dir DIR`)"
    };
    let ran = demo(settings, seed, dir.clone(), temporary, kept).await;
    if remove {
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => eprintln!("removed the demo's data directory {}", dir.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => eprintln!(
                "could not remove the demo's data directory {}: {e}",
                dir.display()
            ),
        }
    } else if dir.exists() {
        eprintln!("the demo's data is kept in {}", dir.display());
    }
    ran
}

async fn demo(
    mut settings: Settings,
    seed: u64,
    dir: PathBuf,
    temporary: bool,
    kept: &str,
) -> anyhow::Result<()> {
    if temporary {
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
    } else {
        for name in ["reckon.db", crate::keys::KEY_FILE, CONFIG_FILE] {
            let f = dir.join(name);
            if f.exists() {
                bail!(
                    "{} exists: the demo builds a new ledger, so give it a new or empty \
                     data directory (or none, for a temporary one)",
                    f.display()
                );
            }
        }
    }
    // The ledger is the demo's own SQLite file whatever the environment names, so the CLI
    // prefix in the banner (and reckon.toml) describe it completely.
    settings.database_url = None;
    settings.master_key = None;
    settings.data_dir = dir.clone();
    // The SQLite source directory; each tenant's files are in its own subdirectory,
    // `sources/demo/` for the demo tenant (T12).
    let sources = dir.join("sources");
    settings.sqlite_source_dir = Some(sources.clone());
    let ledger = crate::open_ledger(&settings, crate::Access::Create).await?;

    let store = sources.join(DEMO_TENANT).join("shop-justonce.db");
    std::fs::create_dir_all(sources.join(DEMO_TENANT))?;
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
    settings.metrics_token = Some(SecretString::from(metrics_token.clone()));
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
                mapping: None,
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
                kind: reckon_ledger::ProviderKind::Demo,
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
                kind: reckon_ledger::ProviderKind::Http,
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
    // The overview's chart from the first page view: this hour's unresolved count, after
    // the first reconcile (the server takes the next ones on its schedule).
    reckon_engine::snapshot::snapshot_all(&*ledger, time::now()).await?;
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
         - CLI prefix for this ledger: {cli}\n\
         - try:  {cli} audit list --tenant demo\n\
         - data directory: {kept}\n\
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
        cli = cli_prefix(&dir),
    );
    // What the demo set for itself only, written down so the CLI (the banner's prefix)
    // sees the same ledger, loopback provider and source directory.
    write_config(&dir.join(CONFIG_FILE), &settings).context("writing the demo's reckon.toml")?;
    let metrics = crate::serve::metrics_state(&settings, instance_metrics);
    crate::serve::run_with(settings, ledger, Some(banner), metrics).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_config_loads_back_as_the_settings_it_was_written_from() {
        let dir = tempfile::tempdir().unwrap();
        // A path with the characters TOML and shells care about.
        let data = dir.path().join("a \"quoted\" \\ 'dir'");
        std::fs::create_dir_all(&data).unwrap();
        let settings = Settings {
            data_dir: data.clone(),
            egress_allow: vec!["127.0.0.1/32".into()],
            sqlite_source_dir: Some(data.join("sources")),
            metrics_token: Some("tok".into()),
            ..Settings::default()
        };
        let file = data.join(CONFIG_FILE);
        write_config(&file, &settings).unwrap();
        let back = Settings::load(&file, crate::config::Overrides::default()).unwrap();
        assert_eq!(back.data_dir, data);
        assert_eq!(back.egress_allow, ["127.0.0.1/32"]);
        assert_eq!(back.sqlite_source_dir, Some(data.join("sources")));
        assert_eq!(
            back.metrics_token.as_ref().map(ExposeSecret::expose_secret),
            Some("tok")
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
        }
    }

    #[test]
    fn a_shell_word_survives_quotes_and_spaces() {
        assert_eq!(shell_word("/tmp/x-1/reckon.toml"), "/tmp/x-1/reckon.toml");
        assert_eq!(shell_word("/tmp/a b"), "'/tmp/a b'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
    }
}
