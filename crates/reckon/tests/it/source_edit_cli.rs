//! `reckon source edit`: a source's settings changed from the CLI through the checks `source
//! add` makes (durations, table name, the egress policy, the tenant's SQLite directory);
//! only the flags given change; a password-less DSN keeps the stored password only where it
//! already went; a new password comes from the environment or stdin; no password is ever
//! printed or stored in clear.

use serde_json::Value;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

const CANARY: &str = "canarypw-7Qx";
const NEW_CANARY: &str = "newcanary-9Zt";

fn reckon(dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_reckon"));
    c.arg("--data-dir")
        .arg(dir.join("data"))
        .env("RECKON_LOG", "warn")
        .env_remove("RECKON_DATABASE_URL")
        .env_remove("RECKON_MASTER_KEY")
        .env_remove("RECKON_DATA_DIR")
        .env("RECKON_SQLITE_SOURCE_DIR", dir.join("sources"))
        .env("RECKON_EGRESS_ALLOW", r#"["127.0.0.1/32"]"#);
    c
}

fn said(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn no_secret(out: &Output) {
    let s = said(out);
    assert!(
        !s.contains(CANARY) && !s.contains(NEW_CANARY),
        "a password was printed: {s}"
    );
}

fn ok(out: Output) -> String {
    no_secret(&out);
    assert!(out.status.success(), "{}", said(&out));
    said(&out)
}

fn refused(out: Output, why: &str) {
    no_secret(&out);
    assert!(!out.status.success(), "not refused: {}", said(&out));
    assert!(said(&out).contains(why), "{why:?} not in: {}", said(&out));
}

fn edit(d: &Path, name: &str, args: &[&str]) -> Output {
    reckon(d)
        .args(["source", "edit", "--tenant", "acme", "--name", name])
        .args(args)
        .output()
        .unwrap()
}

fn source(d: &Path, name: &str) -> Value {
    let out = reckon(d)
        .args(["source", "list", "--tenant", "acme", "--format", "json"])
        .output()
        .unwrap();
    no_secret(&out);
    assert!(out.status.success(), "{}", said(&out));
    let out = String::from_utf8(out.stdout).unwrap();
    let list: Vec<Value> = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    list.into_iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no source {name}: {out}"))
}

/// Whether `needle` is anywhere in the ledger's files, in clear.
fn in_ledger_files(d: &Path, needle: &str) -> bool {
    std::fs::read_dir(d.join("data")).unwrap().any(|e| {
        let p = e.unwrap().path();
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("reckon.db"))
            && std::fs::read(&p)
                .unwrap()
                .windows(needle.len())
                .any(|w| w == needle.as_bytes())
    })
}

#[test]
fn source_edit_changes_settings_through_the_checks_of_add_and_keeps_secrets_sealed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mine = d.join("sources/acme");
    std::fs::create_dir_all(&mine).unwrap();
    ok(reckon(d)
        .args(["tenant", "create", "acme"])
        .output()
        .unwrap());
    let shop = mine.join("shop.db");
    ok(reckon(d)
        .args([
            "source", "add", "--tenant", "acme", "--name", "shop", "--kind", "sqlite",
        ])
        .arg("--dsn")
        .arg(&shop)
        .output()
        .unwrap());

    // Only what is given changes; the line says what, and the checks run again.
    let out = ok(edit(
        d,
        "shop",
        &["--scan-interval", "5m", "--table", "orders_keys"],
    ));
    assert!(
        out.contains("source shop changed: table, scan_interval"),
        "{out}"
    );
    assert!(out.contains("checks of source shop:"), "{out}");
    let s = source(d, "shop");
    assert_eq!(s["scan_interval_secs"], 300, "{s}");
    assert_eq!(s["table_name"], "orders_keys", "{s}");
    assert_eq!(s["overlap_secs"], 60.0, "{s}");
    let moved = mine.join("shop2.db");
    ok(edit(d, "shop", &["--dsn", moved.to_str().unwrap()]));
    let shown = format!("sqlite://{}", moved.display());
    assert_eq!(source(d, "shop")["dsn_display"], shown.as_str());

    // Refused as `add` refuses, and nothing changes.
    refused(edit(d, "shop", &["--scan-interval", "0s"]), "at least 1s");
    refused(
        edit(d, "shop", &["--overlap", "soon"]),
        "overlap \"soon\" is not a duration",
    );
    refused(edit(d, "shop", &["--table", "x; drop table y"]), "table");
    refused(
        edit(
            d,
            "shop",
            &["--dsn", d.join("elsewhere.db").to_str().unwrap()],
        ),
        "RECKON_SQLITE_SOURCE_DIR",
    );
    refused(edit(d, "shop", &[]), "nothing to change");
    refused(
        edit(d, "nope", &["--scan-interval", "5m"]),
        "source \"nope\" not found",
    );
    let s = source(d, "shop");
    assert_eq!(s["scan_interval_secs"], 300, "{s}");
    assert_eq!(s["table_name"], "orders_keys", "{s}");
    assert_eq!(s["dsn_display"], shown.as_str());

    // A PostgreSQL source: its password stays sealed through every edit.
    let dsn = format!("postgres://ro:{CANARY}@127.0.0.1:5432/billing?sslmode=require");
    ok(reckon(d)
        .args([
            "source", "add", "--tenant", "acme", "--name", "pg", "--kind", "postgres",
        ])
        .args(["--dsn", &dsn])
        .output()
        .unwrap());
    // The same server without the password keeps it; a weaker transport, another database
    // or a private address is refused, the password not given again.
    ok(edit(
        d,
        "pg",
        &[
            "--dsn",
            "postgres://ro@127.0.0.1:5432/billing?sslmode=verify-full",
        ],
    ));
    refused(
        edit(
            d,
            "pg",
            &[
                "--dsn",
                "postgres://ro@127.0.0.1:5432/billing?sslmode=disable",
            ],
        ),
        "give the password again",
    );
    refused(
        edit(
            d,
            "pg",
            &[
                "--dsn",
                "postgres://ro@127.0.0.1:5432/other?sslmode=verify-full",
            ],
        ),
        "give the password again",
    );
    refused(
        edit(
            d,
            "pg",
            &[
                "--dsn",
                &format!("postgres://ro:{CANARY}@10.1.2.3:5432/billing"),
            ],
        ),
        "egress policy",
    );
    // A new password from stdin, never from an argument.
    let mut child = reckon(d)
        .args([
            "source",
            "edit",
            "--tenant",
            "acme",
            "--name",
            "pg",
            "--password-stdin",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{NEW_CANARY}\n").as_bytes())
        .unwrap();
    let out = ok(child.wait_with_output().unwrap());
    assert!(out.contains("source pg changed: password"), "{out}");
    // From the environment too (an unset variable is refused by its name).
    refused(
        edit(d, "pg", &["--password-env", "RECKON_TEST_UNSET_PASSWORD"]),
        "RECKON_TEST_UNSET_PASSWORD is not set",
    );
    let out = ok(reckon(d)
        .args(["source", "edit", "--tenant", "acme", "--name", "pg"])
        .args(["--password-env", "RECKON_TEST_PG_PASSWORD"])
        .env("RECKON_TEST_PG_PASSWORD", NEW_CANARY)
        .output()
        .unwrap());
    assert!(out.contains("source pg changed: password"), "{out}");
    refused(
        edit(d, "pg", &["--password-env", "X", "--password-stdin"]),
        "cannot be used with",
    );
    let s = source(d, "pg");
    assert_eq!(
        s["dsn_display"], "postgres://ro@127.0.0.1:5432/billing?sslmode=verify-full",
        "{s}"
    );
    assert!(!in_ledger_files(d, CANARY) && !in_ledger_files(d, NEW_CANARY));
}
