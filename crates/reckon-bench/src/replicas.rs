//! `replicas`: reconciliation throughput of several `reckon serve` replicas on one
//! PostgreSQL ledger against one replica, measured in the same run.
//!
//! For 1 and then `--replicas` processes: a fresh PostgreSQL database with `--effects`
//! unknown charges (half of them charged at the provider), reckon's demo provider on
//! loopback answering in `--latency-ms` with no request budget, and the replicas started
//! together (`reckon serve`, the binary next to this one). The rate is counted at the
//! provider: lookups answered, from the first to the one that completes the set. Every run
//! then checks the work was done once: one resolution per effect, and no more lookups than
//! effects.
//!
//! Build both binaries first: `cargo build --release --workspace`, then
//! `target/release/replicas`.

use anyhow::{Context, bail};
use clap::Parser;
use reckon_domain::{SourceRecord, State};
use reckon_ledger::{IngestBatch, Keyring, Ledger, NewProvider, NewSource, Origin, SourceKind};
use reckon_providers::demo::{DemoState, serve_loopback};
use sqlx::{AssertSqlSafe, Connection};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MASTER_KEY: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

#[derive(Parser, Debug)]
#[command(about = "Reconciliation throughput: N reckon serve replicas on one PostgreSQL vs one")]
struct Args {
    /// Unresolved effects per run.
    #[arg(long, default_value_t = 10_000)]
    effects: usize,
    /// The provider's answer time.
    #[arg(long, default_value_t = 50)]
    latency_ms: u64,
    /// Replicas in the second run.
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Lookups in flight per replica, fixed (`RECKON_RECONCILE_CONCURRENCY` and
    /// `RECKON_RECONCILE_CONCURRENCY_MAX`).
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// A PostgreSQL server (a fresh database is created there per run and dropped).
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/postgres")]
    ledger_url: String,
    /// The `reckon` binary; default: the one next to this benchmark.
    #[arg(long)]
    reckon: Option<PathBuf>,
}

struct Run {
    replicas: usize,
    lookups: u64,
    secs: f64,
    rate: f64,
    resolutions: i64,
    /// Where the time went: the machine's CPU busy share over the run (of all cores)...
    busy: f64,
    /// ...the replicas' own CPU seconds...
    reckon_cpu: f64,
    /// ...and the ledger's transactions (commits and rollbacks in the run's database).
    transactions: i64,
}

/// Busy and total jiffies of all cores, from /proc/stat (zeros where there is none).
fn cpu_jiffies() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().next() else {
        return (0, 0);
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// A process's user + system CPU seconds so far (Linux; 0 elsewhere).
fn process_cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|i| f.get(*i).and_then(|x| x.parse::<f64>().ok()))
        .sum();
    ticks / 100.0
}

async fn transactions(db: &mut sqlx::PgConnection) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT (xact_commit + xact_rollback)::int8 FROM pg_stat_database \
         WHERE datname = current_database()",
    )
    .fetch_one(db)
    .await?)
}

struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let reckon = match &args.reckon {
        Some(p) => p.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("benchmark path")?
            .join("reckon"),
    };
    if !reckon.exists() {
        bail!(
            "{} not found: build it first (cargo build --release --workspace)",
            reckon.display()
        );
    }
    println!(
        "replicas: {} effects, provider at {} ms, no budget, concurrency {} per replica",
        args.effects, args.latency_ms, args.concurrency
    );
    let one = run(&args, &reckon, 1).await?;
    report(&one);
    let many = run(&args, &reckon, args.replicas).await?;
    report(&many);
    println!(
        "ratio: {} replicas / 1 = {:.2}x ({:.1} vs {:.1} lookups/s)",
        many.replicas,
        many.rate / one.rate,
        many.rate,
        one.rate
    );
    Ok(())
}

fn report(r: &Run) {
    println!(
        "{} replica(s): {} lookups in {:.2} s = {:.1} lookups/s; {} resolutions; machine CPU \
         {:.0} % busy; reckon {:.2} ms CPU and {:.2} ledger transactions per lookup",
        r.replicas,
        r.lookups,
        r.secs,
        r.rate,
        r.resolutions,
        r.busy * 100.0,
        r.reckon_cpu * 1000.0 / r.lookups as f64,
        r.transactions as f64 / r.lookups as f64,
    );
}

async fn run(args: &Args, reckon: &std::path::Path, replicas: usize) -> anyhow::Result<Run> {
    let name = format!("reckon_bench_replicas_{}", std::process::id());
    let mut admin = sqlx::PgConnection::connect(&args.ledger_url).await?;
    sqlx::query(AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(&mut admin)
    .await?;
    sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await?;
    let mut url = url::Url::parse(&args.ledger_url)?;
    url.set_path(&name);
    let url = url.to_string();
    let dir = tempfile::tempdir()?;
    let result = measure(args, reckon, replicas, &url, dir.path()).await;
    sqlx::query(AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(&mut admin)
    .await?;
    result
}

async fn measure(
    args: &Args,
    reckon: &std::path::Path,
    replicas: usize,
    url: &str,
    dir: &std::path::Path,
) -> anyhow::Result<Run> {
    let n = args.effects;
    let demo = DemoState::with_delay(Duration::from_millis(args.latency_ms));
    {
        let ledger =
            reckon_ledger::connect(Some(url), dir, Keyring::from_base64(MASTER_KEY)?).await?;
        seed(ledger.as_ref(), &demo, n).await?;
    }
    let (provider_url, server) = serve_loopback(demo.clone()).await?;
    {
        let ledger =
            reckon_ledger::connect(Some(url), dir, Keyring::from_base64(MASTER_KEY)?).await?;
        let t = ledger.tenant_by_slug("acme").await?;
        ledger
            .add_provider(
                t.id,
                NewProvider {
                    name: "pay".into(),
                    kind: reckon_ledger::ProviderKind::Demo,
                    secret: None,
                    settings: serde_json::json!({ "base_url": provider_url }),
                },
            )
            .await?;
        ledger
            .set_route(t.id, "shop", "charge", Some("pay"))
            .await?;
    }

    let mut db = sqlx::PgConnection::connect(url).await?;
    let xacts_before = transactions(&mut db).await?;
    let mut children = Children(Vec::new());
    for i in 0..replicas {
        children.0.push(
            Command::new(reckon)
                .arg("--data-dir")
                .arg(dir.join(format!("r{i}")))
                .args(["serve", "--listen", "127.0.0.1:0"])
                .env("RECKON_LOG", "warn")
                .env("RECKON_DATABASE_URL", url)
                .env("RECKON_MASTER_KEY", MASTER_KEY)
                .env("RECKON_EGRESS_ALLOW", r#"["127.0.0.1/32"]"#)
                .env("RECKON_RECONCILE_CONCURRENCY", args.concurrency.to_string())
                // A fixed limit per replica: the question is whether replicas add up, not
                // how far one replica's adaptive limit climbs.
                .env(
                    "RECKON_RECONCILE_CONCURRENCY_MAX",
                    args.concurrency.to_string(),
                )
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .context("start reckon serve")?,
        );
    }
    // The provider's count, polled: the clock starts at the first lookup answered and
    // stops at the one that completes the set.
    let deadline = Instant::now() + Duration::from_secs(1800);
    let (mut first, mut first_count, mut cpu_first) = (None, 0, (0, 0));
    let done = loop {
        let c = demo.lookups();
        if c > 0 && first.is_none() {
            first = Some(Instant::now());
            first_count = c;
            cpu_first = cpu_jiffies();
        }
        if c >= n as u64 {
            break Instant::now();
        }
        for ch in &mut children.0 {
            if let Some(st) = ch.try_wait()? {
                bail!("a replica exited: {st}");
            }
        }
        if Instant::now() > deadline {
            bail!("{c} of {n} lookups after 30 minutes");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let cpu_done = cpu_jiffies();
    let busy = (cpu_done.0 - cpu_first.0) as f64 / (cpu_done.1 - cpu_first.1).max(1) as f64;
    let reckon_cpu: f64 = children.0.iter().map(|c| process_cpu_secs(c.id())).sum();
    let first = first.context("no lookup")?;
    let secs = (done - first).as_secs_f64();
    let rate = (n as u64 - first_count) as f64 / secs;

    // Done once: every effect resolved exactly once (the last records land just after the
    // last lookup), and no effect looked up twice.
    let deadline = Instant::now() + Duration::from_secs(60);
    let resolutions: i64 = loop {
        let r: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM resolution")
            .fetch_one(&mut db)
            .await?;
        if r >= n as i64 || Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    drop(children);
    server.abort();
    // The server publishes its statistics within a second of a transaction's end.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let transactions = transactions(&mut db).await? - xacts_before;
    db.close().await?;
    let lookups = demo.lookups();
    if resolutions != n as i64 || lookups != n as u64 {
        bail!(
            "{replicas} replica(s): {resolutions} resolutions and {lookups} lookups for {n} effects"
        );
    }
    Ok(Run {
        replicas,
        lookups,
        secs,
        rate,
        resolutions,
        busy,
        reckon_cpu,
        transactions,
    })
}

/// `n` unknown charges in a push source, the even ones charged at the provider.
async fn seed(ledger: &dyn Ledger, demo: &DemoState, n: usize) -> anyhow::Result<()> {
    let t = ledger.create_tenant("acme").await?;
    let source = ledger
        .add_source(
            t.id,
            NewSource {
                name: "shop".into(),
                kind: SourceKind::Push,
                dsn: None,
                dsn_display: None,
                table_name: "justonce_keys".into(),
                scan_interval_secs: 3600,
                abandoned_after_secs: 300.0,
                overlap_secs: 5.0,
                full_scan_every_secs: 3600,
                mapping: None,
            },
        )
        .await?;
    let created = reckon_domain::time::now() - 3600.0;
    let records: Vec<SourceRecord> = (0..n)
        .map(|i| {
            let key = format!("charge:v1:ORD-{i}");
            if i % 2 == 0 {
                demo.charge(&key, 100, "eur", created + 1.0);
            }
            SourceRecord {
                key,
                state: State::Unknown,
                request_hash: "1:9f86d081884c7d65".into(),
                response: None,
                attempts: 1,
                created_at: created,
                updated_at: created + 1.0,
                expires_at: None,
            }
        })
        .collect();
    for chunk in records.chunks(2000) {
        ledger
            .ingest(
                t.id,
                source.id,
                IngestBatch {
                    origin: Origin::Push,
                    observed_at: reckon_domain::time::now(),
                    records: chunk.to_vec(),
                    rejected: vec![],
                    abandoned_after_secs: 300.0,
                    cursor: None,
                    lease: None,
                    expect_new: false,
                },
            )
            .await?;
    }
    Ok(())
}
