//! `reckon demo --data-dir DIR` leaves a ledger the CLI can work on: it writes the settings
//! it used into DIR/reckon.toml and prints the prefix that points the CLI there; with that
//! prefix, reading and acting commands (audit, source scan, reconcile) work against the
//! running demo's ledger, and every listing command's JSON and CSV parse.

use crate::support;

use serde_json::Value;
use support::{Demo, ok};

/// Run `reckon ARGS` with the banner's prefix; stdout of a success.
fn run(demo: &Demo, args: &str) -> String {
    ok(
        &format!("reckon {args}"),
        demo.sh(&format!("reckon {args}"), &[]),
    )
}

fn json(demo: &Demo, args: &str) -> Value {
    let out = run(demo, &format!("{args} --format json"));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args}: not JSON ({e}): {out}"))
}

/// The CSV's header and rows; the header starts with `first`.
fn csv(demo: &Demo, args: &str, first: &str) -> Vec<csv::StringRecord> {
    let out = run(demo, &format!("{args} --format csv"));
    let mut r = csv::Reader::from_reader(out.as_bytes());
    let header = r.headers().unwrap().clone();
    assert_eq!(&header[0], first, "{args}: {out}");
    r.records()
        .map(|x| x.unwrap_or_else(|e| panic!("{args}: {e}: {out}")))
        .collect()
}

#[test]
fn the_cli_works_on_the_demo_ledger_with_the_banners_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("demo-data");
    let demo = Demo::start(&data);

    // The banner names the data directory, and the prefix that points the CLI at it.
    assert_eq!(demo.line_after("Data: "), data.display().to_string());
    let prefix = demo.cli_prefix();
    assert!(
        prefix.contains(&format!("--data-dir {}", data.display()))
            && prefix.contains(&format!("--config {}", data.join("reckon.toml").display())),
        "{prefix}"
    );
    let toml = std::fs::read_to_string(data.join("reckon.toml")).unwrap();
    assert!(
        toml.contains("egress_allow") && toml.contains("sqlite_source_dir"),
        "{toml}"
    );
    assert!(data.join("reckon.db").exists() && data.join("master.key").exists());

    // The demo's own settings are what the CLI needs: its loopback provider (egress
    // allowance) for the audit and reconcile, its SQLite source directory for the scan.
    let scan = run(&demo, "source scan --tenant demo --name shop");
    assert!(scan.starts_with("demo/shop: read "), "{scan}");
    let audit = json(&demo, "audit --tenant demo --provider demo-pay");
    assert_eq!(audit["status"], "complete", "{audit}");
    let outcomes = json(&demo, "reconcile --tenant demo");
    assert!(outcomes.is_array(), "{outcomes}");

    // Every listing command, as JSON and as CSV.
    let tenants = json(&demo, "tenant list");
    assert_eq!(tenants[0]["slug"], "demo", "{tenants}");
    assert_eq!(csv(&demo, "tenant list", "slug").len(), 1);
    let tokens = json(&demo, "token list --tenant demo");
    assert_eq!(tokens[0]["label"], "demo", "{tokens}");
    assert!(!csv(&demo, "token list --tenant demo", "id").is_empty());
    let sources = json(&demo, "source list --tenant demo");
    assert_eq!(sources[0]["name"], "shop", "{sources}");
    assert_eq!(csv(&demo, "source list --tenant demo", "name").len(), 1);
    let providers = json(&demo, "provider list --tenant demo");
    assert_eq!(providers.as_array().unwrap().len(), 2, "{providers}");
    assert_eq!(csv(&demo, "provider list --tenant demo", "name").len(), 2);
    let routes = json(&demo, "route list --tenant demo");
    assert!(routes.as_array().unwrap().len() >= 3, "{routes}");
    assert!(csv(&demo, "route list --tenant demo", "source").len() >= 3);
    let runs = json(&demo, "audit list --tenant demo");
    let runs = runs.as_array().unwrap();
    assert!(runs.len() >= 2, "the demo's run and this test's: {runs:?}");
    let listed = csv(&demo, "audit list --tenant demo", "id");
    assert_eq!(listed.len(), runs.len());
    let id = runs[0]["id"].as_i64().unwrap();
    let shown = json(&demo, &format!("audit show --tenant demo {id}"));
    assert_eq!(shown["id"], id, "{shown}");
    csv(&demo, &format!("audit show --tenant demo {id}"), "run_id");
    let writebacks = json(&demo, "writeback list --tenant demo");
    assert_eq!(writebacks, serde_json::json!([]), "no source opted in");
    assert!(csv(&demo, "writeback list --tenant demo", "id").is_empty());
    csv(&demo, "reconcile --tenant demo", "tenant");
    let dry = json(&demo, "writeback --tenant demo --dry-run");
    assert!(dry.is_array(), "{dry}");

    // Tables write times as the dashboard does (the demo tenant's zone is UTC), not as
    // epoch seconds.
    let table = run(&demo, "source list --tenant demo");
    let today = jiff::Timestamp::now().strftime("%d %b %Y ").to_string();
    assert!(
        table.contains(&today) && table.contains(" UTC"),
        "no readable time: {table}"
    );
    let table = run(&demo, "audit list --tenant demo");
    assert!(table.contains(" UTC"), "{table}");

    // A second demo on the same data directory is refused: it would plant a second day
    // into the first one's ledger.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_reckon"))
        .arg("--data-dir")
        .arg(&data)
        .args(["demo", "--listen", "127.0.0.1:0"])
        .env("RECKON_LOG", "warn")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&data.join("reckon.db").display().to_string()),
        "{err}"
    );
}
