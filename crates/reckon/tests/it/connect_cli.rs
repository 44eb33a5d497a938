//! Connecting a justonce store from the CLI, on a store the real library wrote: a refusal
//! names the setting that would allow it, and an operation no provider is routed for is
//! said, with the command that routes it, by `source list`, `route list` and `reconcile`,
//! whose summary counts what is still open and why (never an all-clear while anything is).

use std::path::Path;
use std::process::{Command, Output};

fn reckon(dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_reckon"));
    c.arg("--data-dir")
        .arg(dir.join("data"))
        .env("RECKON_LOG", "warn")
        .env_remove("RECKON_DATABASE_URL")
        .env_remove("RECKON_MASTER_KEY")
        .env_remove("RECKON_DATA_DIR")
        .env_remove("RECKON_EGRESS_ALLOW")
        .env_remove("RECKON_SQLITE_SOURCE_DIR");
    c
}

fn said(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn ok(out: Output) -> String {
    assert!(out.status.success(), "{}", said(&out));
    said(&out)
}

fn justonce_store(path: &Path, keys: &[&str]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(root.join("scripts/test-env.sh"))
        .output()
        .expect("scripts/test-env.sh");
    assert!(out.status.success(), "{}", said(&out));
    let python = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let mut cmd = Command::new(python);
    cmd.arg(root.join("testdata/justonce_writer.py"))
        .args(["--backend", "sqlite", "--dsn"])
        .arg(path)
        .arg("unknown");
    for k in keys {
        cmd.args(["--key", k]);
    }
    ok(cmd.output().unwrap());
}

#[test]
fn source_add_refusals_name_the_setting_that_would_allow_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(reckon(d)
        .args(["tenant", "create", "acme"])
        .output()
        .unwrap());
    let add = |extra: &[(&str, &str)], kind: &str, dsn: &str| {
        let mut c = reckon(d);
        for (k, v) in extra {
            c.env(k, v);
        }
        c.args([
            "source", "add", "--tenant", "acme", "--name", "x", "--kind", kind,
        ])
        .args(["--dsn", dsn])
        .output()
        .unwrap()
    };
    let store = d.join("shop.db");
    // SQLite sources are off until the operator names their directory.
    let out = add(&[], "sqlite", store.to_str().unwrap());
    assert!(!out.status.success());
    assert!(
        said(&out).contains("RECKON_SQLITE_SOURCE_DIR=")
            && said(&out).contains("sqlite_source_dir"),
        "{}",
        said(&out)
    );
    // On, but the tenant's directory is not there yet: how to make it.
    let sources = d.join("sources");
    std::fs::create_dir_all(&sources).unwrap();
    let env = [("RECKON_SQLITE_SOURCE_DIR", sources.to_str().unwrap())];
    let out = add(&env, "sqlite", store.to_str().unwrap());
    assert!(!out.status.success());
    assert!(
        said(&out).contains(&format!("mkdir -p {}", sources.join("acme").display())),
        "{}",
        said(&out)
    );
    // A file outside the tenant's directory: where it must be, and which setting that is.
    std::fs::create_dir_all(sources.join("acme")).unwrap();
    let out = add(&env, "sqlite", store.to_str().unwrap());
    assert!(!out.status.success());
    assert!(
        said(&out).contains(&format!("{}/", sources.join("acme").display()))
            && said(&out).contains("RECKON_SQLITE_SOURCE_DIR"),
        "{}",
        said(&out)
    );
    // A database at a private address: the allow-list entry that would let it through.
    let out = add(
        &[],
        "postgres",
        "postgres://ro:canarypw@10.1.2.3:5432/billing",
    );
    assert!(!out.status.success());
    assert!(
        said(&out).contains(r#"RECKON_EGRESS_ALLOW='["10.1.2.3/32"]'"#),
        "{}",
        said(&out)
    );
    assert!(!said(&out).contains("canarypw"), "{}", said(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn unrouted_unknowns_are_said_with_their_fix_and_reconcile_counts_them_open() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let store = d.join("sources").join("acme").join("shop.db");
    std::fs::create_dir_all(store.parent().unwrap()).unwrap();
    justonce_store(
        &store,
        &["charge:v1:ORD-1", "charge:v1:ORD-2", "refund:v1:ORD-3"],
    );
    let run = |args: &[&str]| {
        reckon(d)
            .env("RECKON_SQLITE_SOURCE_DIR", d.join("sources"))
            .args(args)
            .output()
            .unwrap()
    };
    ok(run(&["tenant", "create", "acme"]));
    let added = ok(run(&[
        "source",
        "add",
        "--tenant",
        "acme",
        "--name",
        "shop",
        "--kind",
        "sqlite",
        "--dsn",
        store.to_str().unwrap(),
    ]));
    assert!(added.contains("source shop added"), "{added}");
    assert!(
        added.contains("FAIL scanned")
            && added.contains("fix: reckon source scan --tenant acme --name shop"),
        "{added}"
    );
    ok(run(&[
        "source", "scan", "--tenant", "acme", "--name", "shop",
    ]));
    // Only refunds are routed, to no provider on purpose: the charges reach no route.
    ok(run(&[
        "route",
        "set",
        "--tenant",
        "acme",
        "--source",
        "shop",
        "--operation",
        "refund",
        "--none",
    ]));
    let fix =
        "run `reckon route set --tenant acme --source shop --operation charge --provider PROVIDER`";
    let listed = ok(run(&["source", "list", "--tenant", "acme"]));
    assert!(
        listed.contains("no provider routed for operation charge of source shop: its 2 open effect(s) are not looked up")
            && listed.contains(fix),
        "{listed}"
    );
    let routes = ok(run(&["route", "list", "--tenant", "acme"]));
    assert!(routes.contains(fix), "{routes}");
    let check = run(&["source", "check", "--tenant", "acme", "--name", "shop"]);
    assert!(!check.status.success(), "a failed check exits 1");
    assert!(said(&check).contains("FAIL routes"), "{}", said(&check));
    let reconciled = ok(run(&["reconcile", "--tenant", "acme"]));
    assert!(
        reconciled.contains(
            "3 still open: 2 not looked up (no provider routed), 1 need a person (routed to no provider)"
        ),
        "{reconciled}"
    );
    assert!(!reconciled.contains("0 still unresolved"), "{reconciled}");
    assert!(reconciled.contains(fix), "{reconciled}");

    // The fix as printed: a provider and the route. The charges the reconciler just put
    // off for want of a route are looked up at the next `reconcile`, not ten minutes on.
    let provider = reckon_providers::demo::DemoState::new();
    let (url, _server) = reckon_providers::demo::serve_loopback(provider)
        .await
        .unwrap();
    let loopback = |args: &[&str]| {
        reckon(d)
            .env("RECKON_SQLITE_SOURCE_DIR", d.join("sources"))
            .env("RECKON_EGRESS_ALLOW", r#"["127.0.0.1/32"]"#)
            .args(args)
            .output()
            .unwrap()
    };
    ok(loopback(&[
        "provider",
        "add",
        "--tenant",
        "acme",
        "--name",
        "pay",
        "--kind",
        "demo",
        "--settings",
        &format!(r#"{{"base_url": "{url}"}}"#),
    ]));
    ok(loopback(&[
        "route",
        "set",
        "--tenant",
        "acme",
        "--source",
        "shop",
        "--operation",
        "charge",
        "--provider",
        "pay",
    ]));
    let reconciled = ok(loopback(&["reconcile", "--tenant", "acme"]));
    assert!(
        reconciled.contains("2 due now: 2 asked a provider"),
        "{reconciled}"
    );
    assert!(
        !reconciled.contains("not looked up (no provider routed)"),
        "{reconciled}"
    );
}
