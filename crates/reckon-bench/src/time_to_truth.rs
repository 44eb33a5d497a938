//! `time-to-truth`: how long after an application's rows turn `unknown` reckon holds each
//! one's final verdict, against the earliest moment its settings allow.
//!
//! A real `reckon serve` (the binary next to this one) with its defaults watches a SQLite
//! justonce store holding `--rows` claims in progress (their leases alive) among
//! `--background` succeeded rows; reckon's demo provider answers on loopback in
//! `--latency-ms`, holding a charge for every other key. Once the first scan has stored
//! them, all the claims turn `unknown` in one transaction (a crash of the application's
//! payment path), just after a scan: the worst phase, as the next scan is a whole interval
//! away. Each effect's first answer and final verdict are timed from the ledger's own
//! records of them (`reconcile_attempt.finished_at`, `resolution.created_at`), against the
//! floors the settings allow:
//!
//! - a first answer (a provisional `applied`, or "not yet"): the next scan, one
//!   `--scan-interval-secs` after the crash;
//! - a final verdict, charged or not: that, or the end of the window in which the provider
//!   could still show a (second) payment, whichever is later: the row's `updated_at` + the
//!   provider's `max_call_secs` + `visibility_lag_secs` (the demo's defaults, 60 s + 1 s).
//!   A charge found earlier is only a provisional `applied` until then (a second payment
//!   could still appear).
//!
//! Goal: p99 of (verdict time - floor) <= 5 s, on both ledgers (SQLite by default;
//! `--ledger-url postgres://...` makes a fresh database there and drops it). A missed goal
//! is a measurement, not an error; a verdict that is not the world's is an error.

use anyhow::{Context, bail};
use clap::Parser;
use reckon_ledger::{Keyring, NewProvider, NewSource, SourceKind};
use reckon_providers::demo::{DemoState, serve_loopback};
use sqlx::{AssertSqlSafe, Connection, PgConnection, SqliteConnection};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MASTER_KEY: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const GOAL_SECS: f64 = 5.0;
/// The demo provider's defaults (`reckon_providers::settings`), which the floor is made of.
const MAX_CALL_SECS: f64 = 60.0;
const VISIBILITY_LAG_SECS: f64 = 1.0;

#[derive(Parser, Debug)]
#[command(about = "Time from rows turned unknown to reckon's final verdicts, against the floor")]
struct Args {
    /// Claims turned `unknown` at once.
    #[arg(long, default_value_t = 1_000)]
    rows: usize,
    /// Succeeded rows beside them in the store.
    #[arg(long, default_value_t = 10_000)]
    background: usize,
    /// The source's scan interval.
    #[arg(long, default_value_t = 10)]
    scan_interval_secs: i64,
    /// The provider's answer time.
    #[arg(long, default_value_t = 50)]
    latency_ms: u64,
    /// `postgres://user@host:port/postgres` to run on a PostgreSQL ledger; default: the
    /// embedded SQLite ledger.
    #[arg(long)]
    ledger_url: Option<String>,
    /// The `reckon` binary; default: the one next to this benchmark.
    #[arg(long)]
    reckon: Option<PathBuf>,
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The ledger, read directly: the bench times what reckon recorded, not what it said.
enum LedgerDb {
    Sqlite(SqliteConnection),
    Postgres(PgConnection),
}

/// Per target effect: when reckon's ledger last saw its state change, its first answer
/// from the provider and its verdict.
struct Seen {
    key: String,
    changed_at: f64,
    first_answer: Option<f64>,
    verdict: Option<(String, f64)>,
}

const SEEN_SQL: &str = "SELECT e.key, e.state, e.last_changed_at, \
     (SELECT MIN(a.finished_at) FROM reconcile_attempt a WHERE a.effect_id = e.id) AS answered, \
     r.outcome, r.created_at AS decided \
     FROM effect e LEFT JOIN resolution r ON r.effect_id = e.id WHERE e.key LIKE 'charge:v1:TT-%'";

type SeenRow = (
    String,
    String,
    f64,
    Option<f64>,
    Option<String>,
    Option<f64>,
);

impl LedgerDb {
    async fn seen(&mut self) -> anyhow::Result<Vec<Seen>> {
        let rows: Vec<SeenRow> = match self {
            LedgerDb::Sqlite(c) => sqlx::query_as(SEEN_SQL).fetch_all(&mut *c).await?,
            LedgerDb::Postgres(c) => sqlx::query_as(SEEN_SQL).fetch_all(&mut *c).await?,
        };
        Ok(rows
            .into_iter()
            .map(
                |(key, state, changed_at, first_answer, outcome, decided)| Seen {
                    key,
                    changed_at: if state == "unknown" {
                        changed_at
                    } else {
                        f64::NAN
                    },
                    first_answer,
                    verdict: outcome.zip(decided),
                },
            )
            .collect())
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
            "{} not found: build it first (cargo build --release -p reckon)",
            reckon.display()
        );
    }
    let dir = tempfile::tempdir()?;
    match &args.ledger_url {
        None => measure(&args, &reckon, None, dir.path()).await,
        Some(server) => {
            let name = format!("reckon_bench_ttt_{}", std::process::id());
            let mut admin = PgConnection::connect(server).await?;
            let drop_db = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
            sqlx::query(AssertSqlSafe(drop_db.clone()))
                .execute(&mut admin)
                .await?;
            sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {name}")))
                .execute(&mut admin)
                .await?;
            let mut url = url::Url::parse(server)?;
            url.set_path(&name);
            let result = measure(&args, &reckon, Some(url.as_str()), dir.path()).await;
            sqlx::query(AssertSqlSafe(drop_db))
                .execute(&mut admin)
                .await?;
            result
        }
    }
}

async fn measure(
    args: &Args,
    reckon: &Path,
    ledger_url: Option<&str>,
    dir: &Path,
) -> anyhow::Result<()> {
    let n = args.rows;
    let data = dir.join("data");
    let store_dir = dir.join("sources");
    std::fs::create_dir_all(store_dir.join("acme"))?;
    std::fs::create_dir_all(&data)?;
    let store = store_dir.join("acme/shop.db");
    let now = reckon_domain::time::now();
    let created = now - 5.0;
    let mut src =
        SqliteConnection::connect(&format!("sqlite://{}?mode=rwc", store.display())).await?;
    seed_store(&mut src, n, args.background, created).await?;

    let demo = DemoState::with_delay(Duration::from_millis(args.latency_ms));
    for i in (0..n).step_by(2) {
        demo.charge(&key(i), 1000, "eur", created + 0.5);
    }
    let (provider_url, provider) = serve_loopback(demo.clone()).await?;
    {
        let ledger =
            reckon_ledger::connect(ledger_url, &data, Keyring::from_base64(MASTER_KEY)?).await?;
        let t = ledger.create_tenant("acme").await?;
        ledger
            .add_source(
                t.id,
                NewSource {
                    name: "shop".into(),
                    kind: SourceKind::Sqlite,
                    dsn: Some(store.display().to_string().into()),
                    dsn_display: Some(store.display().to_string()),
                    table_name: "justonce_keys".into(),
                    scan_interval_secs: args.scan_interval_secs,
                    abandoned_after_secs: 300.0,
                    overlap_secs: 5.0,
                    full_scan_every_secs: 3600,
                    mapping: None,
                },
            )
            .await?;
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
    let mut db = match ledger_url {
        None => LedgerDb::Sqlite(
            SqliteConnection::connect(&format!(
                "sqlite://{}?mode=ro",
                data.join("reckon.db").display()
            ))
            .await?,
        ),
        Some(u) => LedgerDb::Postgres(PgConnection::connect(u).await?),
    };

    let mut cmd = Command::new(reckon);
    cmd.arg("--data-dir")
        .arg(&data)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("RECKON_LOG", "warn")
        .env("RECKON_MASTER_KEY", MASTER_KEY)
        .env("RECKON_EGRESS_ALLOW", r#"["127.0.0.1/32"]"#)
        .env("RECKON_SQLITE_SOURCE_DIR", &store_dir)
        .env_remove("RECKON_RECONCILE_CONCURRENCY")
        .env_remove("RECKON_RECONCILE_CONCURRENCY_MAX")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    match ledger_url {
        Some(u) => cmd.env("RECKON_DATABASE_URL", u),
        None => cmd.env_remove("RECKON_DATABASE_URL"),
    };
    let mut server = Server(cmd.spawn().context("start reckon serve")?);

    // The first scan stores the claims (in progress, nothing to reconcile).
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if db.seen().await?.len() == n {
            break;
        }
        if let Some(st) = server.0.try_wait()? {
            bail!("reckon serve exited: {st}");
        }
        if Instant::now() > deadline {
            bail!("the first scan did not store the {n} claims in 2 minutes");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The crash: every claim turns unknown at once.
    let t0 = reckon_domain::time::now();
    sqlx::query(
        "UPDATE justonce_keys SET state = 'unknown', updated_at = ?1, expires_at = NULL \
         WHERE key LIKE 'charge:v1:TT-%'",
    )
    .bind(t0)
    .execute(&mut src)
    .await?;
    let interval = args.scan_interval_secs as f64;
    let floor = interval.max(MAX_CALL_SECS + VISIBILITY_LAG_SECS);
    let deadline = Instant::now() + Duration::from_secs_f64(floor + 180.0);
    let seen = loop {
        let seen = db.seen().await?;
        if seen.iter().all(|s| s.verdict.is_some()) {
            break seen;
        }
        if let Some(st) = server.0.try_wait()? {
            bail!("reckon serve exited: {st}");
        }
        if Instant::now() > deadline {
            let done = seen.iter().filter(|s| s.verdict.is_some()).count();
            bail!(
                "{done} of {n} verdicts {:.0} s after the crash",
                floor + 180.0
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    drop(server);
    provider.abort();

    let (mut noticed, mut answered) = (Vec::new(), Vec::new());
    let (mut charged, mut missing, mut over) = (Vec::new(), Vec::new(), Vec::new());
    for s in &seen {
        let i: usize = s.key.trim_start_matches("charge:v1:TT-").parse()?;
        let (outcome, at) = s.verdict.clone().context("verdict")?;
        let want = if i.is_multiple_of(2) {
            "applied"
        } else {
            "not_applied"
        };
        if outcome != want {
            bail!("{}: the verdict is {outcome}, the world's is {want}", s.key);
        }
        if s.changed_at.is_finite() {
            noticed.push(s.changed_at - t0);
        }
        if let Some(a) = s.first_answer {
            answered.push(a - t0);
        }
        over.push(at - t0 - floor);
        if i.is_multiple_of(2) {
            charged.push(at - t0);
        } else {
            missing.push(at - t0);
        }
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "time to truth: {n} claims turned unknown at once among {} rows, ledger {}, scan every \
         {interval:.0} s, provider {} ms, serve's defaults; load {}",
        args.background,
        if ledger_url.is_some() {
            "PostgreSQL"
        } else {
            "SQLite"
        },
        args.latency_ms,
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "  noticed by a scan (state unknown in the ledger): {}",
        stats(&mut noticed)
    );
    println!(
        "  first answer from the provider: {}; floor {interval:.0} s (the next scan)",
        stats(&mut answered)
    );
    println!(
        "  final verdict, charged ({}): {}",
        charged.len(),
        stats(&mut charged)
    );
    println!(
        "  final verdict, not charged ({}): {}",
        missing.len(),
        stats(&mut missing)
    );
    println!(
        "  floor of a final verdict {floor:.0} s: the provider's window closes after \
         max_call_secs {MAX_CALL_SECS:.0} + visibility_lag_secs {VISIBILITY_LAG_SECS:.0}"
    );
    let p99 = quantile(&mut over, 0.99);
    println!(
        "  final verdict over the floor: {}; goal p99 <= {GOAL_SECS:.0} s: {}",
        stats(&mut over),
        if p99 <= GOAL_SECS { "met" } else { "MISSED" }
    );
    Ok(())
}

fn key(i: usize) -> String {
    format!("charge:v1:TT-{i}")
}

fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1]
}

fn stats(v: &mut [f64]) -> String {
    format!(
        "p50 {:.2} s, p99 {:.2} s, max {:.2} s",
        quantile(v, 0.5),
        quantile(v, 0.99),
        quantile(v, 1.0)
    )
}

/// justonce 0.2.0's `SqliteStore` table with `n` claims in progress (leases an hour long)
/// and `background` succeeded rows.
async fn seed_store(
    c: &mut SqliteConnection,
    n: usize,
    background: usize,
    created: f64,
) -> anyhow::Result<()> {
    sqlx::query(
        "CREATE TABLE justonce_keys (key TEXT PRIMARY KEY, state TEXT NOT NULL, \
         request_hash TEXT NOT NULL, response TEXT, attempts INTEGER NOT NULL DEFAULT 1, \
         created_at REAL NOT NULL, updated_at REAL NOT NULL, expires_at REAL)",
    )
    .execute(&mut *c)
    .await?;
    sqlx::query("CREATE INDEX justonce_keys_state_updated ON justonce_keys (state, updated_at)")
        .execute(&mut *c)
        .await?;
    let mut tx = c.begin().await?;
    for i in 0..background {
        sqlx::query(
            "INSERT INTO justonce_keys VALUES (?1, 'succeeded', '1:9f86d081884c7d65', ?2, 1, ?3, \
             ?4, ?5)",
        )
        .bind(format!("charge:v1:BG-{i}"))
        .bind(format!(r#"{{"charge_id":"ch_{i}"}}"#))
        .bind(created - 60.0)
        .bind(created - 59.0)
        .bind(created + 86400.0)
        .execute(&mut *tx)
        .await?;
    }
    for i in 0..n {
        sqlx::query(
            "INSERT INTO justonce_keys VALUES (?1, 'in_progress', '1:9f86d081884c7d65', NULL, 1, \
             ?2, ?2, ?3)",
        )
        .bind(key(i))
        .bind(created)
        .bind(created + 3600.0)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}
