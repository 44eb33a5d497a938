//! `audit`: the double-charge audit of one day, import excluded, against its
//! anchor, in one run.
//!
//! Goal: a day of D effects and D provider charges in a PostgreSQL ledger of L effects is
//! audited in <= 30 s (D = 1,000,000, L = 10,000,000), and the cost grows with the day, not
//! the ledger: the same day in a ledger of L_small effects (1,000,000) takes at least 0.8x as
//! long (the anchor, measured in the same run).
//!
//! Setup bulk-loads with SQL `generate_series` (not through ingest): the day's effects (one
//! charge each, matched by the key in metadata; every 1,000th effect has none = `missing`,
//! and one extra charge per 1,000 = `orphan`), and the rest of the ledger's effects spread
//! over the year before the day. Each ledger is its own database, dropped at the end.
//! A missed goal is a measurement, not an error.

use anyhow::Context;
use clap::Parser;
use reckon_audit::DayWindow;
use reckon_ledger::{Keyring, Ledger, NewProvider, NewSource, SourceKind, TenantId};
use sqlx::{AssertSqlSafe, Connection, Executor, PgConnection};
use std::sync::Arc;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(about = "Measure the day's audit against the same day in a smaller ledger")]
struct Args {
    /// Effects (and charges) of the audited day.
    #[arg(long, default_value_t = 1_000_000)]
    day: u64,
    /// Effects in the large ledger (the day included).
    #[arg(long, default_value_t = 10_000_000)]
    ledger: u64,
    /// Effects in the anchor's ledger (the day included).
    #[arg(long, default_value_t = 1_000_000)]
    small_ledger: u64,
    /// Audits timed per ledger (the best is reported).
    #[arg(long, default_value_t = 2)]
    repeat: u32,
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/postgres")]
    admin_url: String,
    #[arg(long)]
    keep: bool,
}

const DAY: &str = "2026-11-28";

fn db_url(admin: &str, name: &str) -> String {
    let base = admin.split('?').next().unwrap_or(admin);
    let (base, _) = base.rsplit_once('/').unwrap_or((base, ""));
    format!("{base}/{name}")
}

struct Loaded {
    ledger: Arc<dyn Ledger>,
    tenant: TenantId,
    name: String,
    load_secs: f64,
}

/// A fresh database with `total` effects, `day` of them (and their charges) in the day.
async fn load(args: &Args, total: u64, label: &str) -> anyhow::Result<Loaded> {
    let name = format!("reckon_bench_audit_{label}_{}", std::process::id());
    let mut admin = PgConnection::connect(&args.admin_url).await?;
    admin
        .execute(AssertSqlSafe(format!("DROP DATABASE IF EXISTS \"{name}\"")))
        .await?;
    admin
        .execute(AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
        .await?;
    admin.close().await?;
    let url = db_url(&args.admin_url, &name);
    let keyring = Keyring::from_base64(&Keyring::generate_base64())?;
    let ledger = reckon_ledger::connect(Some(&url), std::env::temp_dir().as_path(), keyring)
        .await
        .context("opening the benchmark ledger")?;
    let tenant = ledger.create_tenant("bench").await?.id;
    let source = ledger
        .add_source(
            tenant,
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
            },
        )
        .await?;
    let provider = ledger
        .add_provider(
            tenant,
            NewProvider {
                name: "pay".into(),
                kind: "demo".into(),
                secret: None,
                // Never contacted: the benchmark measures the audit, import excluded.
                settings: serde_json::json!({"base_url": "http://127.0.0.1:9/"}),
            },
        )
        .await?;
    ledger
        .set_route(tenant, "shop", "charge", Some("pay"))
        .await?;
    let w = DayWindow::new(DAY, "UTC")?;
    let d = args.day.min(total);
    let rest = total - d;
    let t0 = Instant::now();
    // As the tables' owner, outside row-level security: a bulk load, not the application.
    let mut c = PgConnection::connect(&url).await?;
    let (tid, sid, pid) = (tenant.get(), source.id, provider.id);
    let day_span = (w.end - w.start) / d.max(1) as f64;
    c.execute(AssertSqlSafe(format!(
        "INSERT INTO effect (tenant_id, source_id, key, operation, key_version, subject, state, \
         request_hash, response, attempts, created_at, updated_at, first_seen_at, last_changed_at) \
         SELECT {tid}, {sid}, 'charge:v1:D' || g, 'charge', 'v1', 'D' || g, 'succeeded', \
                '1:bench', NULL, 1, {start} + g * {day_span}, {start} + g * {day_span} + 1, \
                {start}, {start} \
         FROM generate_series(0, {d} - 1) g",
        start = w.start
    )))
    .await?;
    // The rest of the ledger: the year before the day.
    if rest > 0 {
        let span = 365.0 * 86_400.0 / rest as f64;
        c.execute(AssertSqlSafe(format!(
            "INSERT INTO effect (tenant_id, source_id, key, operation, key_version, subject, \
             state, request_hash, response, attempts, created_at, updated_at, first_seen_at, \
             last_changed_at) \
             SELECT {tid}, {sid}, 'charge:v1:O' || g, 'charge', 'v1', 'O' || g, 'succeeded', \
                    '1:bench', NULL, 1, {from} + g * {span}, {from} + g * {span} + 1, {from}, {from} \
             FROM generate_series(0, {rest} - 1) g",
            from = w.start - 365.0 * 86_400.0 - 7200.0
        )))
        .await?;
    }
    // One charge per effect of the day but every 1,000th; one orphan per 1,000.
    c.execute(AssertSqlSafe(format!(
        "INSERT INTO provider_charge (tenant_id, provider_id, charge_id, payment_intent, amount, \
         currency, status, amount_captured, amount_refunded, refunds, metadata, idempotency_key, \
         customer, created, raw, imported_at) \
         SELECT {tid}, {pid}, 'ch_' || g, NULL, 1000 + g % 500, \
                CASE WHEN g % 3 = 0 THEN 'eur' ELSE 'usd' END, 'succeeded', 1000 + g % 500, 0, \
                '[]', '{{\"idempotency_key\":\"charge:v1:D' || g || '\"}}', NULL, NULL, \
                {start} + g * {day_span} + 0.5, '{{}}', 0 \
         FROM generate_series(0, {d} - 1) g WHERE g % 1000 <> 999",
        start = w.start
    )))
    .await?;
    c.execute(AssertSqlSafe(format!(
        "INSERT INTO provider_charge (tenant_id, provider_id, charge_id, payment_intent, amount, \
         currency, status, amount_captured, amount_refunded, refunds, metadata, idempotency_key, \
         customer, created, raw, imported_at) \
         SELECT {tid}, {pid}, 'ch_orphan_' || g, NULL, 777, 'usd', 'succeeded', 777, 0, '[]', \
                '{{}}', NULL, NULL, {start} + g * 1000 * {day_span} + 0.7, '{{}}', 0 \
         FROM generate_series(0, {d} / 1000 - 1) g",
        start = w.start
    )))
    .await?;
    c.execute("ANALYZE effect").await?;
    c.execute("ANALYZE provider_charge").await?;
    c.close().await?;
    Ok(Loaded {
        ledger,
        tenant,
        name,
        load_secs: t0.elapsed().as_secs_f64(),
    })
}

/// The best of `repeat` audits of the day: (seconds, findings, effects, charges).
async fn time_audit(l: &Loaded, repeat: u32) -> anyhow::Result<(f64, usize, usize, usize)> {
    let w = DayWindow::new(DAY, "UTC")?;
    let providers = l.ledger.list_providers(l.tenant).await?;
    let mut best = f64::INFINITY;
    let mut shape = (0, 0, 0);
    for _ in 0..repeat.max(1) {
        let t0 = Instant::now();
        let report = reckon_engine::audit::audit_day(
            l.ledger.as_ref(),
            l.tenant,
            &w,
            &providers,
            reckon_domain::time::now(),
        )
        .await?;
        best = best.min(t0.elapsed().as_secs_f64());
        shape = (
            report.findings.len(),
            report.effects_in_day,
            report.charges_in_day,
        );
    }
    Ok((best, shape.0, shape.1, shape.2))
}

async fn drop_db(args: &Args, l: Loaded) -> anyhow::Result<()> {
    let Loaded { ledger, name, .. } = l;
    drop(ledger);
    if args.keep {
        println!("kept database {name}");
        return Ok(());
    }
    let mut admin = PgConnection::connect(&args.admin_url).await?;
    admin
        .execute(AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
        )))
        .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    println!(
        "audit benchmark: day of {} effects + charges; ledgers of {} and {} effects",
        args.day, args.ledger, args.small_ledger
    );
    let big = load(&args, args.ledger, "big").await?;
    println!("loaded the large ledger in {:.1} s", big.load_secs);
    let (t_big, findings, effects, charges) = time_audit(&big, args.repeat).await?;
    drop_db(&args, big).await?;
    let small = load(&args, args.small_ledger, "small").await?;
    println!("loaded the anchor's ledger in {:.1} s", small.load_secs);
    let (t_small, f2, _, _) = time_audit(&small, args.repeat).await?;
    drop_db(&args, small).await?;
    println!(
        "day: {effects} effects, {charges} charges, {findings} findings ({f2} in the anchor's)"
    );
    println!(
        "audit, ledger of {:>11} effects: {t_big:8.2} s   (goal <= 30 s: {})",
        args.ledger,
        if t_big <= 30.0 { "met" } else { "MISSED" }
    );
    println!(
        "audit, ledger of {:>11} effects: {t_small:8.2} s   (anchor)",
        args.small_ledger
    );
    let ratio = t_small / t_big;
    println!(
        "anchor / large = {ratio:.2}   (goal >= 0.8, cost grows with the day: {})",
        if ratio >= 0.8 { "met" } else { "MISSED" }
    );
    Ok(())
}
