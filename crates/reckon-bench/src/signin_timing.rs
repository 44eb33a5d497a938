//! `signin-timing`: how long a failed sign-in takes for a known email (wrong password)
//! and for an unknown one, on a SQLite and on a PostgreSQL ledger, over real HTTP on a
//! loopback port. Goal: the medians differ by under 1 ms on both ledgers (a larger
//! difference tells an attacker which emails have accounts).
//!
//! Each round sends one of each, in alternating order, from a loopback address of its own
//! (127.0.x.y, so the throttle's per-address count never refuses one), each for an email of
//! its own (a person made for the round, and one nobody has), so every attempt timed is
//! checked (none is a fast 429) and each meets the throttle's rows as a first attempt does.
//! A pause after each attempt lets the work a known person's failure does after the
//! answer (their audit log) finish, as it would between an attacker's attempts.
//!
//! Run: `cargo run --release -p reckon-bench --bin signin-timing -- --rounds 300`.

use anyhow::Context;
use clap::Parser;
use reckon_ledger::{Keyring, Ledger, Role};
use sqlx::{AssertSqlSafe, Connection, PgConnection};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Parser, Debug)]
#[command(about = "Failed sign-in time, known vs unknown email, on both ledgers")]
struct Args {
    /// Attempts of each kind per ledger.
    #[arg(long, default_value_t = 300)]
    rounds: usize,
    /// Pause after each attempt, in milliseconds (longer than the delay before a failure's
    /// audit-log lines are written).
    #[arg(long, default_value_t = 250)]
    pause_ms: u64,
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/postgres")]
    admin_url: String,
}

/// The allocator `reckon` runs with (its main.rs says why).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const KEY: &str = "cmVja29uLWJlbmNoLWRhc2hib2FyZC1sZWRnZXJzISE=";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let tmp = tempfile::tempdir()?;
    let sqlite = reckon_ledger::connect(None, tmp.path(), Keyring::from_base64(KEY)?).await?;
    measure("sqlite", &args, sqlite).await?;

    let db = format!("reckon_bench_signin_{}", std::process::id());
    let mut admin = PgConnection::connect(&args.admin_url)
        .await
        .context("PostgreSQL admin")?;
    sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE \"{db}\"")))
        .execute(&mut admin)
        .await?;
    let base = args.admin_url.rsplit_once('/').context("admin URL")?.0;
    let pg_dir = tempfile::tempdir()?;
    let result = async {
        let pg = reckon_ledger::connect(
            Some(&format!("{base}/{db}")),
            pg_dir.path(),
            Keyring::from_base64(KEY)?,
        )
        .await?;
        measure("postgres", &args, pg).await
    }
    .await;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS \"{db}\" WITH (FORCE)"
    )))
    .execute(&mut admin)
    .await?;
    result
}

async fn measure(name: &str, args: &Args, ledger: Arc<dyn Ledger>) -> anyhow::Result<()> {
    let tenant = ledger.create_tenant("bench").await?;
    let hash = reckon_web::password::hash_blocking("the admin's real password");
    let known = |round: usize| format!("admin{round}@bench.test");
    for round in 0..args.rounds + 5 {
        let user = ledger.create_user(&known(round), &hash).await?;
        ledger
            .set_membership(tenant.id, user.id, Role::Admin)
            .await?;
    }
    let app = reckon_web::app(reckon_web::AppState::new(ledger.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let server = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await;
    });
    let pause = Duration::from_millis(args.pause_ms);
    let mut known_ms = Vec::with_capacity(args.rounds);
    let mut unknown_ms = Vec::with_capacity(args.rounds);
    // A few of each first, not counted: connections, caches, the dummy hash.
    for round in 0..args.rounds + 5 {
        let local = format!(
            "127.{}.{}.{}",
            10 + round / 62500,
            round / 250 % 250,
            round % 250 + 1
        );
        let person = known(round);
        let other = format!("nobody{round}@bench.test");
        let order = if round % 2 == 0 {
            [(true, person.as_str()), (false, other.as_str())]
        } else {
            [(false, other.as_str()), (true, person.as_str())]
        };
        for (is_known, email) in order {
            let (status, took) = attempt(server, &local, email).await?;
            anyhow::ensure!(
                status == 401,
                "{email}: HTTP {status}, not a checked failure"
            );
            if round >= 5 {
                if is_known {
                    known_ms.push(took);
                } else {
                    unknown_ms.push(took);
                }
            }
            tokio::time::sleep(pause).await;
        }
    }
    let (k, u) = (median(&mut known_ms), median(&mut unknown_ms));
    println!(
        "{name}: {} rounds; known email median {:.2} ms, unknown email median {:.2} ms, \
         difference {:+.2} ms (goal: under 1 ms either way)",
        args.rounds,
        k,
        u,
        k - u
    );
    Ok(())
}

/// One failed sign-in from `local`: its status and the time from the request's first byte
/// to the answer's last.
async fn attempt(server: SocketAddr, local: &str, email: &str) -> anyhow::Result<(u16, f64)> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(format!("{local}:0").parse()?)?;
    let mut stream = socket.connect(server).await?;
    let body = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs([("email", email), ("password", "a wrong password, surely")])
        .finish();
    let request = format!(
        "POST /signin HTTP/1.1\r\nHost: reckon.test\r\nOrigin: https://reckon.test\r\n\
         Sec-Fetch-Site: same-origin\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let started = Instant::now();
    stream.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    let took = started.elapsed().as_secs_f64() * 1000.0;
    let head = String::from_utf8_lossy(&answer);
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("not an HTTP answer")?;
    Ok((status, took))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}
