//! `dashboard`: the dashboard's pages under load with a large ledger.
//!
//! A fresh PostgreSQL ledger gets `--effects` effects of one tenant (one in
//! `--unresolved-every` unknown, the rest succeeded; every effect has its order id as subject
//! and key part), written by PostgreSQL itself (`generate_series`). reckon's router then
//! serves on a loopback port and `wrk` (Debian package `wrk`) loads each page with
//! `--connections` connections for `--seconds`, signed in with a real session cookie. The
//! anchor, measured the same way in the same run, is `/healthz` (the router's fixed cost:
//! the same middleware, no ledger query); the ratio page p99 / anchor p99 is printed
//! beside each page's p99. Goal: each page p99 <= 50 ms at 1,000,000 effects.
//! Also printed: a lookup by order id timed at the ledger (server time, no HTTP).
//!
//! Run: `cargo run --release -p reckon-bench --bin dashboard -- --effects 1000000`
//! (`--busy-core`: with one core kept busy for the whole run).

mod machine;

use anyhow::{Context, bail};
use clap::Parser;
use machine::{busy_core, load_average};
use reckon_engine::{SourceInput, new_source};
use reckon_ledger::{Keyring, Ledger, NewSession, Role};
use sqlx::{AssertSqlSafe, Connection, PgConnection};
use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(about = "Dashboard pages under wrk load with N effects in the ledger")]
struct Args {
    #[arg(long, default_value_t = 1_000_000)]
    effects: i64,
    /// One effect in this many is unknown (unresolved).
    #[arg(long, default_value_t = 100)]
    unresolved_every: i64,
    #[arg(long, default_value_t = 16)]
    connections: u32,
    #[arg(long, default_value_t = 10)]
    seconds: u32,
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/postgres")]
    admin_url: String,
    #[arg(long)]
    keep: bool,
    /// Measure the ledger an earlier `--keep` run left (the database it names,
    /// `reckon_bench_dash_PID`) instead of writing a new one: the write takes minutes at
    /// 10,000,000 effects, the measurements one. Kept afterwards.
    #[arg(long, value_name = "DATABASE")]
    reuse: Option<String>,
    /// Keep one core busy for the whole run (a thread of this process spinning), as another
    /// process on a shared machine does.
    #[arg(long)]
    busy_core: bool,
    /// The ledger's reads only (the claim among them), without the pages under `wrk`.
    #[arg(long)]
    reads_only: bool,
}

/// The allocator `reckon` runs with (its main.rs says why), for the code this runs in-process.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !args.reads_only && Command::new("wrk").arg("--version").output().is_err() {
        bail!("wrk is not installed: apt-get install wrk");
    }
    println!("load average at start: {}", load_average());
    if args.busy_core {
        busy_core();
        println!("one core kept busy for the whole run");
    }
    let db = match &args.reuse {
        Some(db) => db.clone(),
        None => format!("reckon_bench_dash_{}", std::process::id()),
    };
    let mut admin = PgConnection::connect(&args.admin_url)
        .await
        .context("PostgreSQL admin")?;
    if args.reuse.is_none() {
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE \"{db}\"")))
            .execute(&mut admin)
            .await?;
    }
    let base = args.admin_url.rsplit_once('/').context("admin URL")?.0;
    let url = format!("{base}/{db}");
    let result = run(&args, &url).await;
    println!("load average at end: {}", load_average());
    if !args.keep && args.reuse.is_none() {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS \"{db}\" WITH (FORCE)"
        )))
        .execute(&mut admin)
        .await?;
    }
    result
}

/// One master key for every ledger this bench writes, so `--reuse` can open what `--keep`
/// left. The ledgers hold no secret.
const BENCH_KEY: &str = "cmVja29uLWJlbmNoLWRhc2hib2FyZC1sZWRnZXJzISE=";

async fn run(args: &Args, url: &str) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let keyring = Keyring::from_base64(BENCH_KEY)?;
    let ledger: Arc<dyn Ledger> = reckon_ledger::connect(Some(url), tmp.path(), keyring).await?;
    let now = reckon_domain::time::now();
    let attempts = args.effects / 10;
    let tenant = match &args.reuse {
        Some(db) => {
            let tenant = ledger.tenant_by_slug("bench").await?;
            println!("ledger: {db} as an earlier run wrote it (--effects must say its size)");
            tenant
        }
        None => write(args, &ledger, url, now).await?,
    };
    measure(args, &ledger, &tenant, now, attempts, tmp.path()).await
}

/// A fresh ledger's effects, reconcile states, a day of lookups and yesterday's audit run.
async fn write(
    args: &Args,
    ledger: &Arc<dyn Ledger>,
    url: &str,
    now: f64,
) -> anyhow::Result<reckon_ledger::Tenant> {
    let tenant = ledger.create_tenant("bench").await?;
    let source = ledger
        .add_source(
            tenant.id,
            new_source(SourceInput {
                name: "shop".into(),
                kind: "push".into(),
                dsn: None,
                table: None,
                scan_interval: None,
                abandoned_after: None,
                overlap: None,
                full_scan_every: None,
                mapping: None,
            })
            .map_err(anyhow::Error::msg)?,
        )
        .await?;
    let t0 = Instant::now();
    // As the login user (superuser here): generation bypasses row-level security.
    let mut raw = PgConnection::connect(url).await?;
    sqlx::query(
        "INSERT INTO effect (tenant_id, source_id, key, operation, key_version, subject, state, \
           request_hash, response, attempts, created_at, updated_at, first_seen_at, last_changed_at) \
         SELECT $1, $2, 'charge:v1:ORD-' || g, 'charge', 'v1', 'ORD-' || g, \
           CASE WHEN g % $4 = 0 THEN 'unknown' ELSE 'succeeded' END, '1:abc', \
           CASE WHEN g % $4 = 0 THEN NULL ELSE '{\"id\":\"ch_' || g || '\"}' END, 1, \
           $5 - g * 0.5, $5 - g * 0.5 + 1, $5, $5 \
         FROM generate_series(1, $3) g",
    )
    .bind(tenant.id.get())
    .bind(source.id)
    .bind(args.effects)
    .bind(args.unresolved_every)
    .bind(now)
    .execute(&mut raw)
    .await?;
    sqlx::query(
        "INSERT INTO effect_key_part (effect_id, tenant_id, part) \
         SELECT id, tenant_id, subject FROM effect WHERE tenant_id = $1",
    )
    .bind(tenant.id.get())
    .execute(&mut raw)
    .await?;
    // A provider with a day of lookups (one per 10 effects, one in 20 of them failing),
    // so the overview's provider health has a real day to count, and yesterday's audit.
    let provider = ledger
        .add_provider(
            tenant.id,
            reckon_ledger::NewProvider {
                name: "pay".into(),
                kind: reckon_ledger::ProviderKind::Demo,
                secret: None,
                settings: serde_json::json!({"base_url": "https://pay.example/"}),
            },
        )
        .await?;
    let attempts = args.effects / 10;
    sqlx::query(
        "INSERT INTO reconcile_attempt (tenant_id, effect_id, provider_id, started_at, \
           finished_at, outcome, method, error, evidence) \
         SELECT tenant_id, id, $2, $3 - (id % 86000), $3 - (id % 86000), \
           CASE WHEN id % 20 = 0 THEN 'indeterminate' ELSE 'applied' END, 'bench', \
           CASE WHEN id % 20 = 0 THEN 'provider answered 503' END, '{}' \
         FROM effect WHERE tenant_id = $1 ORDER BY id LIMIT $4",
    )
    .bind(tenant.id.get())
    .bind(provider.id)
    .bind(now)
    .bind(attempts)
    .execute(&mut raw)
    .await?;
    // As a running reconciler leaves them: every unresolved effect looked up once, a
    // quarter of them due again now and the rest within the hour, one in 20 parked for a
    // person.
    sqlx::query(
        "INSERT INTO reconcile_state (tenant_id, effect_id, attempts, next_attempt_at, \
           last_attempt_at, last_outcome, provider_id, needs_attention) \
         SELECT tenant_id, id, 1, $3 - 900 + (id % 3600), $3 - 60, 'indeterminate', $2, (id * 48271) % 1000003 % 20 = 0 \
         FROM effect WHERE tenant_id = $1 AND state = 'unknown'",
    )
    .bind(tenant.id.get())
    .bind(provider.id)
    .bind(now)
    .execute(&mut raw)
    .await?;
    let yesterday = reckon_audit::DayWindow::yesterday(now, "UTC").map_err(anyhow::Error::msg)?;
    ledger
        .record_audit_run(
            tenant.id,
            reckon_ledger::NewAuditRun {
                day: yesterday.date.clone(),
                time_zone: "UTC".into(),
                window_start: yesterday.start,
                window_end: yesterday.end,
                provider: "*".into(),
                triggered_by: "schedule".into(),
                status: "complete".into(),
                reason: None,
                started_at: now - 60.0,
                finished_at: now - 30.0,
                counts: serde_json::json!({"findings": {"duplicate": 3, "orphan": 2}}),
                findings: serde_json::json!([]),
                totals: serde_json::json!([]),
                evidence: serde_json::json!({"pages": []}),
            },
            None,
        )
        .await?;
    // As autovacuum would (it is off on the test server): statistics, and the visibility
    // map that lets counts over an index skip the table.
    sqlx::raw_sql("VACUUM ANALYZE").execute(&mut raw).await?;
    // And flush what the load dirtied, so that the first page measured does not pay for the
    // load's checkpoint.
    sqlx::raw_sql("CHECKPOINT").execute(&mut raw).await?;
    for h in 0..(24 * 30) {
        ledger
            .take_snapshot(tenant.id, now - f64::from(h) * 3600.0)
            .await?;
    }
    println!(
        "ledger: {} effects ({} unresolved) written in {:.1} s",
        args.effects,
        args.effects / args.unresolved_every,
        t0.elapsed().as_secs_f64()
    );
    Ok(tenant)
}

/// Each page under `wrk`, and the ledger's reads on their own.
async fn measure(
    args: &Args,
    ledger: &Arc<dyn Ledger>,
    tenant: &reckon_ledger::Tenant,
    now: f64,
    attempts: i64,
    tmp: &std::path::Path,
) -> anyhow::Result<()> {
    // A person and a live session (the cookie a browser would hold after signing in), new
    // to each run: a reused ledger holds the earlier runs'.
    let pid = std::process::id();
    let user = ledger
        .create_user(
            &format!("bench{pid}@example.test"),
            &reckon_web::password::hash_blocking("bench password for the dashboard"),
        )
        .await?;
    ledger
        .set_membership(tenant.id, user.id, Role::Admin)
        .await?;
    let session_id = format!("b{pid:042}");
    ledger
        .create_session(
            tenant.id,
            NewSession {
                id_hash: sha256_hex(&session_id),
                user_id: user.id,
                generation: 0,
                csrf_token: "c".repeat(43),
                now,
                expires_at: now + 3600.0,
            },
        )
        .await?;

    let app = reckon_web::app(reckon_web::AppState::new(ledger.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await;
    });
    let base = format!("http://{addr}");
    let cookie = format!("Cookie: __Host-reckon_session={session_id}");

    // Server time of a lookup by order id, at the ledger.
    let mut times = Vec::new();
    for i in 0..200 {
        let q = format!("ORD-{}", 1 + (i * 4999) % args.effects);
        let t = Instant::now();
        let found = ledger.lookup(tenant.id, &q, 51).await?;
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(found.len() == 1, "lookup {q} found {}", found.len());
    }
    times.sort_by(f64::total_cmp);
    println!(
        "lookup by order id at the ledger (server time, 200 ids): p50 {:.2} ms, p99 {:.2} ms (goal <= 10 ms)",
        times[100], times[198]
    );

    // The overview's reading without its 2 s cache: what one request in every 2 s per
    // tenant pays (the seven reads at once), and what every request would pay uncached.
    let state = reckon_web::AppState::new(ledger.clone());
    let mut times = Vec::new();
    for _ in 0..50 {
        let fresh = reckon_web::dash::DashState::default();
        let t = Instant::now();
        fresh
            .overview(
                &state,
                tenant.id,
                now,
                reckon_ledger::ReplayClosing {
                    open_after: now - 86_400.0,
                    closing_before: now - 72_000.0,
                },
            )
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "overview reading, uncached ({attempts} lookups in the last day): p50 {:.2} ms, max {:.2} ms (50 readings; goal p50 <= 50 ms at 10,000,000 effects: {})",
        times[25],
        times[49],
        if times[25] <= 50.0 { "met" } else { "MISSED" }
    );

    // Each read of the overview (and the queue's and the scrape's) on its own, so that a
    // slow reading names its part.
    let replay = reckon_ledger::ReplayClosing {
        open_after: now - 86_400.0,
        closing_before: now - 72_000.0,
    };
    let day = reckon_audit::DayWindow::yesterday(now, "UTC")
        .map_err(anyhow::Error::msg)?
        .date;
    let queue = reckon_ledger::QueueQuery {
        now,
        limit: 51,
        ..Default::default()
    };
    let l = ledger.as_ref();
    let t = tenant.id;
    println!("reads, p50 of 20 (ms):");
    macro_rules! read {
        ($name:expr, $call:expr) => {{
            let mut times = Vec::new();
            for _ in 0..20 {
                let started = Instant::now();
                $call.await?;
                times.push(started.elapsed().as_secs_f64() * 1000.0);
            }
            times.sort_by(f64::total_cmp);
            println!("  {:<28} {:>8.2}", $name, times[10]);
        }};
    }
    read!("audit_settings", l.audit_settings(t));
    read!("unresolved_summary", l.unresolved_summary(t, now, replay));
    read!("snapshots (31 days)", l.snapshots(t, now - 31.0 * 86_400.0));
    read!("list_sources", l.list_sources(t));
    read!("quarantine_counts", l.quarantine_counts(t));
    read!("list_providers", l.list_providers(t));
    read!(
        "provider_health (1 day)",
        l.provider_health(t, now - reckon_web::dash::HEALTH_SECS)
    );
    read!("audit_glance", l.audit_glance(t, &day));
    read!("unresolved_queue (page)", l.unresolved_queue(t, &queue));
    read!(
        "metrics_snapshot (tenant)",
        l.metrics_snapshot(reckon_ledger::MetricsQuery {
            tenant: Some(t),
            now,
            replay_closing_created_before: now - 20.0 * 3600.0,
            replay_closed_created_before: now - 24.0 * 3600.0,
        })
    );

    // The reconciler's claim of its next 32 due effects (each claims 32 not yet claimed).
    read!("claim_due (32)", l.claim_due(t, "bench", now, 30.0, 32));
    println!("  load average: {}", load_average());
    if args.reads_only {
        return Ok(());
    }

    // The lookup page asks for a different order id at each request (a fixed one would
    // measure one cached row), stepping through the ledger as the ledger-side timing does.
    let script = tmp.join("lookup.lua");
    std::fs::write(
        &script,
        format!(
            "local n = 0\n\
             request = function()\n\
               n = n + 1\n\
               return wrk.format(nil, \"/t/bench/lookup?q=ORD-\" .. (1 + (n * 4999) % {}))\n\
             end\n",
            args.effects
        ),
    )?;
    let pages = [
        ("anchor /healthz", "/healthz".to_owned()),
        ("overview", "/t/bench".to_owned()),
        ("queue", "/t/bench/queue".to_owned()),
        ("lookup (varied)", "/t/bench/lookup".to_owned()),
    ];
    // Warm-up, not recorded: a freshly loaded database answers its first seconds of load
    // with stalls of a few hundred ms (first reads after the bulk load), which would land
    // on whichever page is measured first.
    for (name, path) in &pages {
        let mut wrk = Command::new("wrk");
        wrk.args([
            "-t2",
            &format!("-c{}", args.connections),
            "-d3s",
            "-H",
            &cookie,
        ]);
        if name.starts_with("lookup") {
            wrk.arg("-s").arg(&script);
        }
        wrk.arg(format!("{base}{path}")).output()?;
    }
    println!(
        "\nwrk -t2 -c{} -d{}s, {} effects:",
        args.connections, args.seconds, args.effects
    );
    println!(
        "{:<16} {:>10} {:>10} {:>10} {:>12} {:>8}",
        "page", "req/s", "p50 ms", "p99 ms", "p99/anchor", "goal"
    );
    let mut anchor = None;
    for (name, path) in pages {
        let mut wrk = Command::new("wrk");
        wrk.args([
            "-t2",
            &format!("-c{}", args.connections),
            &format!("-d{}s", args.seconds),
            "--latency",
            "-H",
            &cookie,
        ]);
        if name.starts_with("lookup") {
            wrk.arg("-s").arg(&script);
        }
        let out = wrk.arg(format!("{base}{path}")).output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let p50 = percentile(&text, "50%").context("wrk p50")?;
        let p99 = percentile(&text, "99%").context("wrk p99")?;
        let rps = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("Requests/sec:"))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        if text.contains("Non-2xx") {
            bail!("{name}: wrk saw non-2xx answers:\n{text}");
        }
        let a = *anchor.get_or_insert(p99);
        let goal = if name.starts_with("anchor") {
            "-"
        } else if p99 <= 50.0 {
            "met"
        } else {
            "MISSED"
        };
        println!(
            "{name:<16} {rps:>10.0} {p50:>10.2} {p99:>10.2} {:>12.1} {goal:>8}",
            p99 / a
        );
    }
    Ok(())
}

/// A latency percentile from wrk's `--latency` table, in milliseconds.
fn percentile(wrk: &str, which: &str) -> Option<f64> {
    let line = wrk
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with(which) && !l.contains("Thread"))?;
    let v = line.split_whitespace().nth(1)?;
    let (num, unit) = v.split_at(v.find(|c: char| c.is_ascii_alphabetic())?);
    let n: f64 = num.parse().ok()?;
    Some(match unit {
        "us" => n / 1000.0,
        "ms" => n,
        "s" => n * 1000.0,
        "m" => n * 60_000.0,
        _ => return None,
    })
}

fn sha256_hex(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}
