//! `audit`: the double-charge audit of one day, import excluded, against its
//! anchor, in one run.
//!
//! Goal: a day of D effects of one tenant in a PostgreSQL ledger of L effects is audited in
//! <= 30 s (D = 1,000,000, L = 10,000,000), and the cost grows with the day, not the ledger:
//! the same day in a ledger of only that day (the anchor, measured in the same run) takes at
//! least 0.8x as long.
//!
//! The large ledger looks like a real one: `--tenants` tenants, each with its source,
//! provider and route, share the table; the audited day's rows are interleaved with the
//! other days' and the other tenants' (one row in L / D is the day's), so the day is spread
//! over the whole heap as backfills and many tenants leave it; one effect in
//! `--unknown-every` is `unknown` (half of them charged at the provider, half not), and
//! every other effect of every day has its provider charge but every 1,000th (`missing`),
//! with one orphan charge per 1,000 effects. Rows are bulk-loaded with SQL
//! `generate_series` (not through ingest). Each ledger is its own database, dropped at the
//! end. Both are loaded and checkpointed before either is audited; then the two are audited
//! in turns and the best of each compared. A missed goal is a measurement, not an error.

use anyhow::Context;
use clap::Parser;
use reckon_audit::{AuditReport, DayWindow, FindingKind};
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
    /// Tenants sharing the large ledger (the audited one among them).
    #[arg(long, default_value_t = 100)]
    tenants: u64,
    /// One effect in this many is `unknown`.
    #[arg(long, default_value_t = 100)]
    unknown_every: u64,
    /// Audits timed per ledger, taking turns with the other ledger's (the best of each is
    /// reported).
    #[arg(long, default_value_t = 2)]
    repeat: u32,
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/postgres")]
    admin_url: String,
    #[arg(long)]
    keep: bool,
    /// Audit the ledgers an earlier `--keep` run left (`reckon_bench_audit_{big,small}_PID`)
    /// instead of loading new ones: the load takes minutes, the audit seconds.
    #[arg(long, value_name = "PID")]
    reuse: Option<u32>,
}

const DAY: &str = "2026-11-28";

/// One master key for every ledger this bench makes, so `--reuse` can open what `--keep`
/// left. The ledgers hold no secret (the providers are never contacted).
const BENCH_KEY: &str = "cmVja29uLWJlbmNoLWF1ZGl0LWxlZGdlcnMta2V5ISE=";

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

/// A fresh database with `total` effects, `day` of them the audited tenant's day.
async fn load(args: &Args, total: u64, label: &str) -> anyhow::Result<Loaded> {
    if let Some(pid) = args.reuse {
        return reuse(args, &format!("reckon_bench_audit_{label}_{pid}")).await;
    }
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
    let keyring = Keyring::from_base64(BENCH_KEY)?;
    let ledger = reckon_ledger::connect(Some(&url), std::env::temp_dir().as_path(), keyring)
        .await
        .context("opening the benchmark ledger")?;
    // Tenant ids 1..=tenants, each with source and provider of the same id (a fresh
    // database numbers them in creation order); the first is the audited one.
    let tenants = if total > args.day {
        args.tenants.max(1)
    } else {
        1
    };
    let mut audited = None;
    for n in 1..=tenants {
        let tenant = ledger.create_tenant(&format!("bench{n}")).await?.id;
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
                    mapping: None,
                },
            )
            .await?;
        let provider = ledger
            .add_provider(
                tenant,
                NewProvider {
                    name: "pay".into(),
                    kind: reckon_ledger::ProviderKind::Demo,
                    secret: None,
                    // Never contacted: the benchmark measures the audit, import excluded.
                    settings: serde_json::json!({"base_url": "http://127.0.0.1:9/"}),
                },
            )
            .await?;
        anyhow::ensure!(
            tenant.get() == n as i64 && source.id == n as i64 && provider.id == n as i64,
            "the fresh database numbered tenant {n} differently"
        );
        ledger
            .set_route(tenant, "shop", "charge", Some("pay"))
            .await?;
        audited.get_or_insert(tenant);
    }
    let tenant = audited.context("no tenant")?;
    let w = DayWindow::new(DAY, "UTC")?;
    let d = args.day.min(total);
    let t0 = Instant::now();
    // As the tables' owner, outside row-level security: a bulk load, not the application.
    let mut c = PgConnection::connect(&url).await?;
    // Row g is the day's when g % stride = 0 (its n-th row, n = g / stride, created in
    // order through the day); any other row is of a pseudo-random tenant, created at a
    // pseudo-random moment of the 60 days before the day (the audited tenant's) or of those
    // days and the day itself (the others'). Each pseudo-random choice is a multiplicative
    // hash of g modulo a prime, so neighbouring rows differ in tenant and day.
    let stride = (total / d.max(1)).max(1);
    let day_span = (w.end - w.start) / d.max(1) as f64;
    let before = 60.0 * 86_400.0;
    c.execute(AssertSqlSafe(format!(
        "INSERT INTO effect (tenant_id, source_id, key, operation, key_version, subject, state, \
         request_hash, response, attempts, created_at, updated_at, first_seen_at, last_changed_at) \
         SELECT t, t, 'charge:v1:' || t || '-' || g, 'charge', 'v1', t || '-' || g, \
                CASE WHEN u % {unknown} = 0 THEN 'unknown' ELSE 'succeeded' END, \
                '1:bench', NULL, 1, at, at + 1, at, at \
         FROM (SELECT g, t, u, CASE \
                 WHEN g % {stride} = 0 THEN {start} + (g / {stride}) * {day_span} \
                 WHEN t = 1 THEN {start} - {margin} - h * ({before} - {margin}) \
                 ELSE {start} - {before} + h * ({before} + 86400) END AS at \
               FROM (SELECT g, \
                       CASE WHEN g % {stride} = 0 THEN 1 \
                            ELSE 1 + ((g * 40503) % 999983) % {tenants} END AS t, \
                       ((g * 2654435761) % 1000003) / 1000003.0 AS h, \
                       (g * 48271) % 1000033 AS u \
                     FROM generate_series(0::bigint, {last}) g) x) y \
         ORDER BY g",
        unknown = args.unknown_every.max(1),
        start = w.start,
        margin = reckon_audit::MARGIN_SECS,
        last = total - 1,
    )))
    .await?;
    // Every effect's charge at its tenant's provider, half a second after it, but one in
    // 1,000 (missing) and half of the unknown ones (the provider never saw them); one in
    // 1,000 effects has an orphan charge beside it (a charge no effect explains). `m` is a
    // hash of the effect's id, as above.
    c.execute(AssertSqlSafe(
        "INSERT INTO provider_charge (tenant_id, provider_id, charge_id, payment_intent, amount, \
         currency, status, amount_captured, amount_refunded, refunds, metadata, idempotency_key, \
         customer, created, raw, imported_at) \
         SELECT tenant_id, tenant_id, 'ch_' || id, NULL, 1000 + id % 500, \
                CASE WHEN id % 3 = 0 THEN 'eur' ELSE 'usd' END, 'succeeded', 1000 + id % 500, 0, \
                '[]', '{\"idempotency_key\":\"' || key || '\"}', NULL, NULL, \
                created_at + 0.5, '{}', 0 \
         FROM (SELECT *, ((id * 69621) % 1000037) % 1000 AS m FROM effect) e \
         WHERE m <> 999 AND (state <> 'unknown' OR m < 500) ORDER BY id"
            .to_owned(),
    ))
    .await?;
    c.execute(AssertSqlSafe(
        "INSERT INTO provider_charge (tenant_id, provider_id, charge_id, payment_intent, amount, \
         currency, status, amount_captured, amount_refunded, refunds, metadata, idempotency_key, \
         customer, created, raw, imported_at) \
         SELECT tenant_id, tenant_id, 'ch_orphan_' || id, NULL, 777, 'usd', 'succeeded', 777, 0, \
                '[]', '{}', NULL, NULL, created_at + 0.7, '{}', 0 \
         FROM (SELECT *, ((id * 69621) % 1000037) % 1000 AS m FROM effect) e \
         WHERE m = 500 ORDER BY id"
            .to_owned(),
    ))
    .await?;
    // As autovacuum would (it is off on the test server): statistics and the visibility map.
    c.execute("VACUUM ANALYZE effect").await?;
    c.execute("VACUUM ANALYZE provider_charge").await?;
    c.execute("CHECKPOINT").await?;
    c.close().await?;
    Ok(Loaded {
        ledger,
        tenant,
        name,
        load_secs: t0.elapsed().as_secs_f64(),
    })
}

/// A ledger an earlier run kept: its first tenant is the audited one.
async fn reuse(args: &Args, name: &str) -> anyhow::Result<Loaded> {
    let url = db_url(&args.admin_url, name);
    let keyring = Keyring::from_base64(BENCH_KEY)?;
    let ledger = reckon_ledger::connect(Some(&url), std::env::temp_dir().as_path(), keyring)
        .await
        .with_context(|| format!("opening the kept ledger {name}"))?;
    let tenant = ledger.tenant_by_slug("bench1").await?.id;
    Ok(Loaded {
        ledger,
        tenant,
        name: name.to_owned(),
        load_secs: 0.0,
    })
}

/// The two day reads on their own, timed (where the time goes), once per ledger.
async fn time_reads(l: &Loaded) -> anyhow::Result<()> {
    let w = DayWindow::new(DAY, "UTC")?;
    let (from, to) = (
        w.start - reckon_audit::MARGIN_SECS,
        w.end + reckon_audit::MARGIN_SECS,
    );
    let now = reckon_domain::time::now();
    let t0 = Instant::now();
    let mut effects = 0;
    l.ledger
        .each_effect_created_between(l.tenant, from, to, now, &mut |_| effects += 1)
        .await?;
    let t_effects = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let mut charges = 0;
    l.ledger
        .each_charge_to_match(l.tenant, None, from, to, &mut |_| charges += 1)
        .await?;
    println!(
        "  {} reads: {effects} effects {t_effects:.2} s, {charges} charges {:.2} s",
        l.name,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// One audit of the day, timed.
async fn time_audit(l: &Loaded) -> anyhow::Result<(f64, AuditReport)> {
    let w = DayWindow::new(DAY, "UTC")?;
    let providers = l.ledger.list_providers(l.tenant).await?;
    let t0 = Instant::now();
    let report = reckon_engine::audit::audit_day(
        l.ledger.as_ref(),
        l.tenant,
        &w,
        &providers,
        reckon_domain::time::now(),
    )
    .await?;
    Ok((t0.elapsed().as_secs_f64(), report))
}

/// Peak resident memory of this process so far (MB).
fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The report stored as the nightly run stores it, then read back as the dashboard's audit
/// page reads a tenant's history: the newest `HISTORY` runs, each verified against its
/// digest. What a month of nightly runs of days like this one costs beyond the audits.
async fn time_store(args: &Args, l: &Loaded, report: &AuditReport) -> anyhow::Result<()> {
    const HISTORY: i64 = reckon_web::dash::audit::HISTORY;
    let w = DayWindow::new(DAY, "UTC")?;
    // A kept ledger's runs from an earlier run of the bench go first: what is read back is
    // what this run stored.
    let mut c = PgConnection::connect(&db_url(&args.admin_url, &l.name)).await?;
    sqlx::query("DELETE FROM audit_run WHERE tenant_id = $1")
        .bind(l.tenant.get())
        .execute(&mut c)
        .await?;
    let before = peak_rss_mb();
    let mut t_store = f64::INFINITY;
    let mut last = None;
    for _ in 0..HISTORY {
        let now = reckon_domain::time::now();
        let t0 = Instant::now();
        let mut run = reckon_ledger::NewAuditRun {
            day: w.date.clone(),
            time_zone: w.time_zone.clone(),
            window_start: w.start,
            window_end: w.end,
            provider: reckon_ledger::ALL_PROVIDERS.into(),
            triggered_by: "operator".into(),
            status: "complete".into(),
            reason: None,
            started_at: now,
            finished_at: now,
            counts: serde_json::json!({}),
            findings: serde_json::json!([]),
            totals: serde_json::json!([]),
            evidence: serde_json::json!({"pages": [], "providers": []}),
        };
        reckon_engine::audit::store_report(&mut run, Some(report), 0);
        last = Some(l.ledger.record_audit_run(l.tenant, run, None).await?);
        t_store = t_store.min(t0.elapsed().as_secs_f64());
    }
    let stored = last.context("no run stored")?;
    let t0 = Instant::now();
    let runs = l.ledger.list_audit_runs(l.tenant, None, HISTORY).await?;
    let t_read = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let edited = runs
        .iter()
        .filter_map(|r| reckon_ledger::verify_content(l.tenant.get(), r))
        .count();
    let t_verify = t0.elapsed().as_secs_f64();
    anyhow::ensure!(
        edited == 0,
        "{edited} stored runs do not match their digests"
    );
    let (findings, evidence): (i32, i32) = sqlx::query_as(
        "SELECT octet_length(findings), octet_length(evidence) FROM audit_run WHERE id = $1",
    )
    .bind(stored.id)
    .fetch_one(&mut c)
    .await?;
    c.close().await?;
    println!(
        "  stored as a run in {t_store:.2} s (best of {HISTORY}; findings {:.1} MB, evidence \
         {:.2} MB; peak memory {before:.0} -> {:.0} MB)",
        f64::from(findings) / 1e6,
        f64::from(evidence) / 1e6,
        peak_rss_mb(),
    );
    println!(
        "  the audit page's history ({} such runs): read {t_read:.2} s, verified {t_verify:.2} s",
        runs.len(),
    );
    Ok(())
}

/// The report's shape: effects and charges of the day, and findings by kind.
fn shape(r: &AuditReport) -> String {
    let kinds = FindingKind::ALL
        .iter()
        .map(|k| format!("{} {:?}", r.count(*k), k).to_lowercase())
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "{} effects, {} charges; findings: {kinds}",
        r.effects_in_day, r.charges_in_day
    )
}

async fn drop_db(args: &Args, l: Loaded) -> anyhow::Result<()> {
    let Loaded { ledger, name, .. } = l;
    drop(ledger);
    if args.keep || args.reuse.is_some() {
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

/// The allocator `reckon` runs with (its main.rs says why), for the code this runs in-process.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // The large ledger's day is spread over ten times the pages of the anchor's: how many
    // of them the server's buffer cache holds is part of the figure.
    let mut admin = PgConnection::connect(&args.admin_url).await?;
    let shared_buffers: String = sqlx::query_scalar("SELECT current_setting('shared_buffers')")
        .fetch_one(&mut admin)
        .await?;
    admin.close().await?;
    println!(
        "audit benchmark: day of {} effects + charges; ledgers of {} and {} effects; \
         server shared_buffers {shared_buffers}",
        args.day, args.ledger, args.small_ledger
    );
    // A reused ledger was loaded by the run that kept it: its shape is that run's.
    let loaded = |what: &str, l: &Loaded| match args.reuse {
        Some(_) => println!("reused {what}: {}", l.name),
        None => println!("loaded {what} in {:.1} s", l.load_secs),
    };
    // Both ledgers first, then their audits in turns: what the machine does meanwhile
    // (the checkpointer writing out a load, another tenant of the VM) falls on both alike,
    // not on whichever ledger happened to be timed first.
    let big = load(&args, args.ledger, "big").await?;
    loaded(
        &format!("the large ledger ({} tenants)", args.tenants),
        &big,
    );
    let small = load(&args, args.small_ledger, "small").await?;
    loaded("the anchor's ledger", &small);
    // The loads' dirty pages written out now, not during the audits. CHECKPOINT needs a
    // superuser or pg_checkpoint: an admin role without it is told so, and the audits run
    // anyway (in turns, the checkpointer's work still falls on both ledgers).
    let mut admin = PgConnection::connect(&args.admin_url).await?;
    let t0 = Instant::now();
    match admin.execute("CHECKPOINT").await {
        Ok(_) => println!(
            "checkpoint after the loads: {:.1} s",
            t0.elapsed().as_secs_f64()
        ),
        Err(e) => println!("no checkpoint after the loads ({e}): the audits run without it"),
    }
    admin.close().await?;
    time_reads(&big).await?;
    time_reads(&small).await?;
    let (mut t_big, mut t_small) = (f64::INFINITY, f64::INFINITY);
    let (mut report, mut anchor) = (None, None);
    for round in 1..=args.repeat.max(1) {
        let (b, r) = time_audit(&big).await?;
        let (s, a) = time_audit(&small).await?;
        println!(
            "  audit {round}: large {b:.2} s, anchor's {s:.2} s (ratio {:.2})",
            s / b
        );
        (t_big, t_small) = (t_big.min(b), t_small.min(s));
        (report, anchor) = (Some(r), Some(a));
    }
    let (report, anchor) = (
        report.context("no audit ran")?,
        anchor.context("no audit ran")?,
    );
    time_store(&args, &big, &report).await?;
    drop_db(&args, big).await?;
    drop_db(&args, small).await?;
    println!("the day, large ledger: {}", shape(&report));
    println!("the day, anchor's:     {}", shape(&anchor));
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
        "load average: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    println!(
        "anchor / large = {ratio:.2}   (goal >= 0.8, cost grows with the day: {})",
        if ratio >= 0.8 { "met" } else { "MISSED" }
    );
    Ok(())
}
