//! `reckon serve` with real justonce stores (SQLite and PostgreSQL, written by the real
//! library through testdata/justonce_writer.py), scraped over HTTP on loopback:
//! every series has the value the planted effects imply, the exposition passes
//! `promtool check metrics`, `/metrics` is closed without its token, `/api/v1/metrics`
//! shows a tenant only its own series, and when a source's database goes away its
//! last-success timestamp stops moving and `reckon_source_up` drops to 0.
#![allow(
    clippy::string_slice,
    reason = "the texts sliced here are the tests' own ASCII: URLs, templates, tokens, HTTP heads"
)]

use sqlx::{AssertSqlSafe, Connection, Row};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn reckon(data: &Path) -> Command {
    // RECKON_TEST_BIN: a copy of this branch's binary, for a target directory shared with
    // other checkouts (whose builds overwrite target/debug/reckon).
    let bin =
        std::env::var("RECKON_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_reckon").into());
    let mut c = Command::new(bin);
    c.arg("--data-dir").arg(data).env("RECKON_LOG", "warn");
    // The operator's egress policy: the data directory's parent is the SQLite source
    // directory (each tenant's stores in its own subdirectory), and the PostgreSQL source is
    // on loopback (both refused by default).
    c.env(
        "RECKON_SQLITE_SOURCE_DIR",
        data.parent().expect("the data directory has a parent"),
    )
    .env("RECKON_EGRESS_ALLOW", r#"["127.0.0.1/32"]"#);
    c
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run reckon");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn python() -> String {
    let out = Command::new(root().join("scripts/test-env.sh"))
        .output()
        .expect("scripts/test-env.sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn writer(py: &str, backend: &str, dsn: &str, args: &[&str]) {
    let out = Command::new(py)
        .arg(root().join("testdata/justonce_writer.py"))
        .args(["--backend", backend, "--dsn", dsn])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Server(Child);
impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Resp {
    status: u16,
    headers: String,
    body: String,
}

/// One HTTP/1.1 GET over a fresh loopback connection.
async fn get(port: u16, path: &str, bearer: Option<&str>) -> Resp {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let auth = bearer.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head[9..12].parse().unwrap();
    Resp {
        status,
        headers: head.to_ascii_lowercase(),
        body: body.to_owned(),
    }
}

type Series = BTreeMap<(String, BTreeMap<String, String>), f64>;

/// The samples of a text exposition (our label values hold no `"`, `,` or `\`).
fn parse(text: &str) -> Series {
    let mut out = Series::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').unwrap();
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => {
                let inner = rest.strip_suffix('}').unwrap();
                let labels = inner
                    .split("\",")
                    .filter(|p| !p.is_empty())
                    .map(|p| {
                        let (k, v) = p.split_once("=\"").unwrap();
                        (k.to_owned(), v.trim_end_matches('"').to_owned())
                    })
                    .collect();
                (n.to_owned(), labels)
            }
            None => (series.to_owned(), BTreeMap::new()),
        };
        out.insert((name, labels), value.parse().unwrap());
    }
    out
}

fn value(s: &Series, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let want: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    s.get(&(name.to_owned(), want)).copied()
}

fn names(s: &Series) -> BTreeSet<String> {
    s.keys().map(|(n, _)| n.clone()).collect()
}

/// What a justonce store implies: unresolved counts, oldest unresolved-since, and how many
/// would be in the last 4 h of a 24 h replay window if they were routed.
#[derive(Debug, Default, PartialEq)]
struct Expect {
    unknown: i64,
    abandoned: i64,
    oldest: Option<f64>,
    replay_closing: i64,
}

/// Computed from the rows the library wrote, by the definition in PRODUCT.md (an
/// abandoned claim: in_progress whose lease ended; the sources use a 0 s grace).
fn expect_from(rows: &[(String, String, f64, f64, Option<f64>)], now: f64) -> Expect {
    let mut e = Expect::default();
    for (key, state, created, updated, expires) in rows {
        let since = match state.as_str() {
            "unknown" => {
                e.unknown += 1;
                *updated
            }
            "in_progress" if expires.is_some_and(|x| x <= now) => {
                e.abandoned += 1;
                expires.unwrap()
            }
            _ => continue,
        };
        assert!(
            key.starts_with("charge:v1:"),
            "planted unresolved {key} is not a charge"
        );
        e.oldest = Some(e.oldest.map_or(since, |o: f64| o.min(since)));
        if *created <= now - 20.0 * 3600.0 {
            e.replay_closing += 1;
        }
    }
    e
}

const ROWS_SQL: &str = "SELECT key, state, created_at, updated_at, expires_at FROM justonce_keys \
     WHERE state IN ('succeeded', 'failed', 'in_progress', 'unknown')";

async fn sqlite_rows(path: &Path) -> Vec<(String, String, f64, f64, Option<f64>)> {
    let mut c = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlx::query(ROWS_SQL)
        .fetch_all(&mut c)
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect()
}

async fn pg_rows(url: &str) -> Vec<(String, String, f64, f64, Option<f64>)> {
    let mut c = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::query(ROWS_SQL)
        .fetch_all(&mut c)
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect()
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn assert_unresolved(s: &Series, tenant: &str, source: &str, e: &Expect, scraped_at: f64) {
    let tso = [
        ("operation", "charge"),
        ("source", source),
        ("tenant", tenant),
    ];
    let with_kind = |k| {
        let mut l = tso.to_vec();
        l.insert(0, ("kind", k));
        value(s, "reckon_unresolved_effects", &l)
    };
    assert_eq!(
        with_kind("unknown"),
        Some(e.unknown as f64),
        "{source} unknown"
    );
    assert_eq!(
        with_kind("abandoned"),
        Some(e.abandoned as f64),
        "{source} abandoned"
    );
    let ts = value(s, "reckon_oldest_unresolved_timestamp_seconds", &tso);
    assert_eq!(ts, e.oldest, "{source} oldest unresolved timestamp");
    let age = value(s, "reckon_oldest_unresolved_age_seconds", &tso).unwrap();
    let want_age = scraped_at - e.oldest.unwrap();
    assert!(
        (age - want_age).abs() < 5.0,
        "{source} age {age} vs {want_age}"
    );
    // No source of this test has a route: every unresolved effect is unrouted, and none has
    // a replay window (no provider holds its key), however old.
    assert_eq!(
        value(s, "reckon_unrouted_effects", &tso),
        Some((e.unknown + e.abandoned) as f64),
        "{source} unrouted"
    );
    for family in [
        "reckon_replay_window_closing_effects",
        "reckon_replay_window_closed_effects",
    ] {
        assert_eq!(value(s, family, &tso), Some(0.0), "{source} {family}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_of_a_running_reckon_match_the_planted_effects() {
    let py = python();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");

    // acme/shop: the library's populate scenario on SQLite (unknown and abandoned effects),
    // plus two hostile rows that must be quarantined.
    // acme's SQLite source sits in acme's own directory of the SQLite source
    // directory (T12: `{sqlite_source_dir}/{tenant-slug}/`).
    let shop = dir.path().join("acme").join("shop.db");
    std::fs::create_dir_all(shop.parent().unwrap()).unwrap();
    writer(&py, "sqlite", shop.to_str().unwrap(), &["populate"]);
    {
        let mut c = sqlx::SqliteConnection::connect(&format!("sqlite://{}", shop.display()))
            .await
            .unwrap();
        let t = now() - 10.0;
        for (key, state, response) in [
            ("charge:v1:BAD-STATE", "'partially_refunded'", "NULL"),
            ("charge:v1:BAD-JSON", "'succeeded'", "'{not json'"),
        ] {
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO justonce_keys (key, state, request_hash, response, attempts, \
                 created_at, updated_at, expires_at) VALUES ('{key}', {state}, 'h', {response}, \
                 1, {t}, {t}, NULL)"
            )))
            .execute(&mut c)
            .await
            .unwrap();
        }
    }
    // acme/pgshop: bulk rows on PostgreSQL (every 100th unknown); two unknown effects
    // backdated 21 h, inside the last 4 h of Stripe's 24 h replay window.
    let admin = "postgres://postgres@127.0.0.1:5432/postgres";
    let db = format!("reckon_metrics_{:016x}", rand::random::<u64>());
    let mut adm = sqlx::PgConnection::connect(admin)
        .await
        .expect("PostgreSQL at 127.0.0.1:5432 is required");
    sqlx::query(AssertSqlSafe(format!("CREATE DATABASE \"{db}\"")))
        .execute(&mut adm)
        .await
        .unwrap();
    let pg_url = format!("postgres://postgres@127.0.0.1:5432/{db}");
    writer(
        &py,
        "postgres",
        &pg_url.replacen("postgres://", "postgresql://", 1),
        &["bulk", "--count", "1000"],
    );
    {
        let mut c = sqlx::PgConnection::connect(&pg_url).await.unwrap();
        sqlx::query(
            "UPDATE justonce_keys SET created_at = created_at - 75600 \
             WHERE key IN ('charge:v1:BULK-100', 'charge:v1:BULK-200')",
        )
        .execute(&mut c)
        .await
        .unwrap();
    }
    // beta/other: another tenant, for isolation.
    // beta's SQLite source sits in beta's own directory of the SQLite source
    // directory (T12: `{sqlite_source_dir}/{tenant-slug}/`).
    let other = dir.path().join("beta").join("other.db");
    std::fs::create_dir_all(other.parent().unwrap()).unwrap();
    writer(
        &py,
        "sqlite",
        other.to_str().unwrap(),
        &["bulk", "--count", "300"],
    );

    run_ok(reckon(&data).args(["tenant", "create", "acme"]));
    run_ok(reckon(&data).args(["tenant", "create", "beta"]));
    let common = ["--scan-interval", "1s", "--abandoned-after", "0s"];
    run_ok(
        reckon(&data)
            .args([
                "source", "add", "--tenant", "acme", "--name", "shop", "--kind", "sqlite",
            ])
            .args(common)
            .arg("--dsn")
            .arg(&shop),
    );
    run_ok(
        reckon(&data)
            .args([
                "source", "add", "--tenant", "acme", "--name", "pgshop", "--kind", "postgres",
            ])
            .args(common)
            .args(["--dsn", &pg_url]),
    );
    run_ok(
        reckon(&data)
            .args([
                "source", "add", "--tenant", "beta", "--name", "other", "--kind", "sqlite",
            ])
            .args(common)
            .arg("--dsn")
            .arg(&other),
    );
    let beta_token =
        run_ok(reckon(&data).args(["token", "create", "--tenant", "beta", "--role", "viewer"]))
            .trim()
            .to_owned();

    let (port, mport) = (free_port(), free_port());
    let operator_token = "operator-secret-for-the-test";
    let _server = Server(
        reckon(&data)
            .arg("serve")
            .env("RECKON_LISTEN", format!("127.0.0.1:{port}"))
            .env("RECKON_METRICS_LISTEN", format!("127.0.0.1:{mport}"))
            .env("RECKON_METRICS_TOKEN", operator_token)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );

    // Wait until every source has been scanned successfully.
    let deadline = Instant::now() + Duration::from_secs(90);
    let _first_full_scrape = loop {
        if let Ok(r) = tokio::time::timeout(Duration::from_secs(10), async {
            if tokio::net::TcpStream::connect(("127.0.0.1", mport))
                .await
                .is_err()
            {
                return None;
            }
            Some(get(mport, "/metrics", None).await)
        })
        .await
            && let Some(r) = r
        {
            let s = parse(&r.body);
            let ups = ["shop", "pgshop", "other"]
                .iter()
                .filter(|src| {
                    s.iter().any(|((n, l), v)| {
                        n == "reckon_source_up"
                            && l.get("source").map(String::as_str) == Some(src)
                            && *v == 1.0
                    })
                })
                .count();
            if ups == 3 {
                break r;
            }
        }
        assert!(
            Instant::now() < deadline,
            "sources were not all scanned in time"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    // Let the cache expire so the next scrape is a fresh query after all scans settled.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let scraped_at = now();
    let r = get(mport, "/metrics", None).await;
    assert_eq!(r.status, 200);
    assert!(
        r.headers
            .contains("content-type: text/plain; version=0.0.4"),
        "{}",
        r.headers
    );
    let s = parse(&r.body);

    // promtool's lint on the real exposition.
    let mut p = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool is required (Debian package prometheus)");
    p.stdin
        .take()
        .unwrap()
        .write_all(r.body.as_bytes())
        .unwrap();
    let out = p.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // Unresolved effects, oldest timestamps and ages, replay window: as the stores imply.
    let t = now();
    let shop_rows: Vec<_> = sqlite_rows(&shop)
        .await
        .into_iter()
        .filter(|r| !r.0.starts_with("charge:v1:BAD-"))
        .collect();
    let shop_expect = expect_from(&shop_rows, t);
    assert!(shop_expect.unknown > 0 && shop_expect.abandoned > 0);
    assert_unresolved(&s, "acme", "shop", &shop_expect, scraped_at);
    let pg_expect = expect_from(&pg_rows(&pg_url).await, t);
    assert_eq!((pg_expect.unknown, pg_expect.replay_closing), (10, 2));
    assert_unresolved(&s, "acme", "pgshop", &pg_expect, scraped_at);
    let other_expect = expect_from(&sqlite_rows(&other).await, t);
    assert_unresolved(&s, "beta", "other", &other_expect, scraped_at);

    // Quarantine, by reason.
    for reason in ["unknown_state", "invalid_json"] {
        assert_eq!(
            value(
                &s,
                "reckon_records_quarantined_total",
                &[("reason", reason), ("source", "shop"), ("tenant", "acme")]
            ),
            Some(1.0),
            "{reason}"
        );
    }
    // Records ingested: every valid row of each store, stored once (rescans store nothing).
    for (tenant, src, n) in [
        ("acme", "shop", shop_rows.len()),
        ("acme", "pgshop", 1000),
        ("beta", "other", 300),
    ] {
        let l = [("source", src), ("tenant", tenant)];
        assert_eq!(
            value(&s, "reckon_records_ingested_total", &l),
            Some(n as f64),
            "{src}"
        );
        assert_eq!(
            value(&s, "reckon_source_scan_errors_total", &l),
            Some(0.0),
            "{src}"
        );
        assert_eq!(value(&s, "reckon_source_up", &l), Some(1.0), "{src}");
        let last = value(&s, "reckon_source_last_scan_success_timestamp_seconds", &l).unwrap();
        assert!(
            last <= scraped_at && last > scraped_at - 10.0,
            "{src} last success {last}"
        );
    }
    // Collector health.
    assert_eq!(value(&s, "reckon_metrics_collector_up", &[]), Some(1.0));
    let ls = value(
        &s,
        "reckon_metrics_collector_last_success_timestamp_seconds",
        &[],
    )
    .unwrap();
    assert!((ls - scraped_at).abs() < 5.0);
    assert!(value(&s, "reckon_metrics_collector_duration_seconds", &[]).is_some());
    // The process and its ledger pool (this ledger is SQLite: a pool of at most 4).
    let pool = |state| value(&s, "reckon_ledger_pool_connections", &[("state", state)]);
    assert_eq!(pool("max"), Some(4.0));
    let (idle, in_use) = (pool("idle").unwrap(), pool("in_use").unwrap());
    assert!(
        idle + in_use >= 1.0 && idle + in_use <= 4.0,
        "idle {idle} in_use {in_use}"
    );
    let rss = value(&s, "process_resident_memory_bytes", &[]).unwrap();
    assert!(rss > 1e6, "resident memory {rss}");
    let started = value(&s, "process_start_time_seconds", &[]).unwrap();
    assert!(
        started <= scraped_at && started > scraped_at - 600.0,
        "the server started at {started}, scraped at {scraped_at}"
    );
    assert!(value(&s, "process_open_fds", &[]).unwrap() > 3.0);
    // Every series family a running reckon without a reconciler or audit can show.
    let have = names(&s);
    for n in [
        "reckon_unresolved_effects",
        "reckon_oldest_unresolved_timestamp_seconds",
        "reckon_oldest_unresolved_age_seconds",
        "reckon_replay_window_closing_effects",
        "reckon_replay_window_closed_effects",
        "reckon_unrouted_effects",
        "reckon_ledger_pool_connections",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "reckon_records_quarantined_total",
        "reckon_records_ingested_total",
        "reckon_source_scan_errors_total",
        "reckon_source_last_scan_success_timestamp_seconds",
        "reckon_source_up",
        "reckon_metrics_collector_up",
        "reckon_metrics_collector_last_success_timestamp_seconds",
        "reckon_metrics_collector_duration_seconds",
        "reckon_build_info",
    ] {
        assert!(have.contains(n), "{n} missing from the scrape");
    }

    // Access: /metrics on the main listener needs the operator token.
    assert_eq!(get(port, "/metrics", None).await.status, 401);
    assert_eq!(get(port, "/metrics", Some("wrong")).await.status, 401);
    let main = get(port, "/metrics", Some(operator_token)).await;
    assert_eq!(main.status, 200);
    // HTTP requests are counted by route template.
    let _ = get(
        port,
        "/api/v1/effects/shop/charge:v1:SECRET-ORDER",
        Some(&beta_token),
    )
    .await;
    let tenant_view = get(port, "/api/v1/metrics", Some(&beta_token)).await;
    assert_eq!(tenant_view.status, 200);
    let tv = parse(&tenant_view.body);
    assert!(!tv.is_empty());
    for (n, l) in tv.keys() {
        if !n.starts_with("reckon_metrics_collector_") {
            assert_eq!(
                l.get("tenant").map(String::as_str),
                Some("beta"),
                "{n} {l:?}"
            );
        }
    }
    assert_unresolved(&tv, "beta", "other", &other_expect, now());
    assert!(!tenant_view.body.contains("acme"));
    assert_eq!(get(port, "/api/v1/metrics", None).await.status, 401);
    let again = parse(&get(mport, "/metrics", None).await.body);
    assert!(again.keys().any(|(n, l)| n == "reckon_http_requests_total"
        && l.get("route").map(String::as_str) == Some("/api/v1/effects/{source}/{*key}")));
    assert!(
        !again
            .keys()
            .any(|(_, l)| l.values().any(|v| v.contains("SECRET-ORDER")))
    );

    // The PostgreSQL source's database goes away.
    let before = value(
        &again,
        "reckon_source_last_scan_success_timestamp_seconds",
        &[("source", "pgshop"), ("tenant", "acme")],
    )
    .unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "DROP DATABASE \"{db}\" WITH (FORCE)"
    )))
    .execute(&mut adm)
    .await
    .unwrap();
    let dropped_at = now();
    let deadline = Instant::now() + Duration::from_secs(60);
    let down = loop {
        let s = parse(&get(mport, "/metrics", None).await.body);
        if value(
            &s,
            "reckon_source_up",
            &[("source", "pgshop"), ("tenant", "acme")],
        ) == Some(0.0)
        {
            break s;
        }
        assert!(Instant::now() < deadline, "reckon_source_up never dropped");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let stuck = value(
        &down,
        "reckon_source_last_scan_success_timestamp_seconds",
        &[("source", "pgshop"), ("tenant", "acme")],
    )
    .unwrap();
    assert!((before..=dropped_at + 1.0).contains(&stuck));
    // A few more scan rounds: the failed source's timestamp stays, the healthy one moves.
    let shop_before = value(
        &down,
        "reckon_source_last_scan_success_timestamp_seconds",
        &[("source", "shop"), ("tenant", "acme")],
    )
    .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let later = parse(&get(mport, "/metrics", None).await.body);
    assert_eq!(
        value(
            &later,
            "reckon_source_last_scan_success_timestamp_seconds",
            &[("source", "pgshop"), ("tenant", "acme")]
        ),
        Some(stuck)
    );
    assert_eq!(
        value(
            &later,
            "reckon_source_up",
            &[("source", "pgshop"), ("tenant", "acme")]
        ),
        Some(0.0)
    );
    assert!(
        value(
            &later,
            "reckon_source_scan_errors_total",
            &[("source", "pgshop"), ("tenant", "acme")]
        )
        .unwrap()
            >= 1.0
    );
    assert!(
        value(
            &later,
            "reckon_source_last_scan_success_timestamp_seconds",
            &[("source", "shop"), ("tenant", "acme")]
        )
        .unwrap()
            > shop_before
    );
    // Its effects are still in the ledger: the backlog gauges stay (the staleness alert
    // says they are old news).
    assert_unresolved(&later, "acme", "pgshop", &pg_expect, now());
}
