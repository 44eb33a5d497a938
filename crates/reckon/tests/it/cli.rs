//! The CLI against ledgers that exist and ledgers that do not: a read command never
//! creates a ledger or a key file (it fails naming where it looked), only the commands
//! meant to set one up do; every failure exits non-zero with one line on stderr and no
//! backtrace.

use std::path::Path;
use std::process::{Command, Output};

fn reckon(data: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_reckon"))
        .arg("--data-dir")
        .arg(data)
        // No reckon.toml from wherever the test runs.
        .arg("--config")
        .arg(data.with_extension("no-such.toml"))
        .args(args)
        .env("RECKON_LOG", "warn")
        // A backtrace would be printed here if errors carried one to the user.
        .env("RUST_BACKTRACE", "1")
        .env_remove("RECKON_DATABASE_URL")
        .env_remove("RECKON_MASTER_KEY")
        .env_remove("RECKON_DATA_DIR")
        .output()
        .expect("run reckon")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A failure: exit status 1, one line on stderr starting `error:`, no backtrace.
fn failure(what: &str, out: &Output) -> String {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{what}: {err}");
    assert_eq!(err.lines().count(), 1, "{what}: not one line: {err}");
    assert!(err.starts_with("error: "), "{what}: {err}");
    assert!(
        !err.contains("backtrace") && !err.contains("Caused by"),
        "{what}: {err}"
    );
    err
}

const READ_COMMANDS: &[&[&str]] = &[
    &["tenant", "list"],
    &["token", "list", "--tenant", "acme"],
    &["source", "list", "--tenant", "acme"],
    &["source", "scan"],
    &["provider", "list", "--tenant", "acme"],
    &["route", "list", "--tenant", "acme"],
    &["audit", "list", "--tenant", "acme"],
    &["audit", "verify", "--tenant", "acme"],
    &["writeback", "list", "--tenant", "acme"],
    &["lookup", "--tenant", "acme", "ORD-1"],
    &["reconcile"],
    &["keys", "rotate"],
];

#[test]
fn a_read_command_on_a_missing_ledger_names_the_path_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // A data directory that does not exist, and one that exists but holds no ledger.
    let missing = dir.path().join("missing");
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    for data in [&missing, &empty] {
        for args in READ_COMMANDS {
            let what = args.join(" ");
            let err = failure(&what, &reckon(data, args));
            let db = data.join("reckon.db");
            assert!(
                err.contains(&db.display().to_string()),
                "{what}: the path is not named: {err}"
            );
            assert!(!db.exists(), "{what} created {}", db.display());
            assert!(!data.join("master.key").exists(), "{what} made a key file");
        }
    }
    assert!(
        !missing.exists(),
        "a read command created the data directory"
    );
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0);
}

#[test]
fn setting_up_creates_the_ledger_and_failures_exit_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // `tenant create` is meant to set a ledger up: it creates it, with its key file.
    let out = reckon(&data, &["tenant", "create", "acme"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(data.join("reckon.db").exists() && data.join("master.key").exists());
    let out = reckon(&data, &["tenant", "list", "--format", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["slug"], "acme", "{v}");
    // `migrate` on it again is harmless.
    let out = reckon(&data, &["migrate"]);
    assert!(out.status.success(), "{}", stderr(&out));

    // Failures of every kind exit 1 with one line.
    let err = failure(
        "scan of an unknown source",
        &reckon(
            &data,
            &["source", "scan", "--tenant", "acme", "--name", "nope"],
        ),
    );
    assert!(err.contains("nope"), "{err}");
    failure(
        "unknown tenant",
        &reckon(&data, &["source", "list", "--tenant", "nobody"]),
    );
    failure(
        "revoking a token that does not exist",
        &reckon(
            &data,
            &["token", "revoke", "--tenant", "acme", "--id", "999"],
        ),
    );

    // Another master key than the ledger's: refused, exit 1, for a scan as for any other
    // command, and the key file is left alone.
    let key_file = std::fs::read_to_string(data.join("master.key")).unwrap();
    let other = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    let out = Command::new(env!("CARGO_BIN_EXE_reckon"))
        .arg("--data-dir")
        .arg(&data)
        .args(["source", "scan"])
        .env("RECKON_LOG", "warn")
        .env("RECKON_MASTER_KEY", other)
        .env_remove("RECKON_DATABASE_URL")
        .output()
        .unwrap();
    let err = failure("scan with another master key", &out);
    assert!(err.contains("master key does not open"), "{err}");
    assert_eq!(
        std::fs::read_to_string(data.join("master.key")).unwrap(),
        key_file
    );

    // A usage error is clap's (exit 2), with the usage line.
    let out = reckon(&data, &["source", "scan", "--tenant", "acme"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[tokio::test]
async fn a_source_added_from_the_cli_is_in_the_tenants_audit_log_as_the_operators() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = reckon(&data, &["tenant", "create", "acme"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let add = [
        "source", "add", "--tenant", "acme", "--name", "orders", "--kind", "push",
    ];
    let out = reckon(&data, &add);
    assert!(out.status.success(), "{}", stderr(&out));
    // The same add again changes nothing and logs nothing.
    failure("adding the same source twice", &reckon(&data, &add));

    let keyring = reckon_ledger::Keyring::load_file(&data.join("master.key"))
        .unwrap()
        .expect("the key file the CLI made");
    let ledger = reckon_ledger::connect(None, &data, keyring).await.unwrap();
    let acme = ledger.tenant_by_slug("acme").await.unwrap();
    let log = ledger.list_actions(acme.id, None, 10).await.unwrap();
    let lines: Vec<_> = log
        .iter()
        .map(|a| (a.actor.as_str(), a.action.as_str(), a.target.as_deref()))
        .collect();
    assert_eq!(lines, [("operator", "source.add", Some("orders"))]);
    assert_eq!(
        log[0].detail,
        serde_json::json!({"kind": "push", "via": "cli"})
    );
}

#[tokio::test]
async fn providers_routes_and_tokens_changed_from_the_cli_are_in_the_audit_log() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let ok = |args: &[&str]| {
        let out = reckon(&data, args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    ok(&["tenant", "create", "acme"]);
    ok(&[
        "source", "add", "--tenant", "acme", "--name", "orders", "--kind", "push",
    ]);
    let out = Command::new(env!("CARGO_BIN_EXE_reckon"))
        .args(["--data-dir"])
        .arg(&data)
        .arg("--config")
        .arg(data.with_extension("no-such.toml"))
        .args(["provider", "add", "--tenant", "acme", "--name", "stripe"])
        .args(["--kind", "stripe", "--secret-env", "RK_TEST_KEY"])
        .env("RK_TEST_KEY", "rk_test_clicanary")
        .env("RECKON_LOG", "warn")
        .env_remove("RECKON_DATABASE_URL")
        .env_remove("RECKON_MASTER_KEY")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    ok(&[
        "route",
        "set",
        "--tenant",
        "acme",
        "--source",
        "orders",
        "--operation",
        "charge",
        "--provider",
        "stripe",
    ]);
    let minted = ok(&[
        "token", "create", "--tenant", "acme", "--role", "viewer", "--label", "ci",
    ]);
    assert!(
        minted.trim().starts_with("rkn_"),
        "the token alone on stdout: {minted}"
    );
    // A role that does not exist is refused before anything is stored or logged.
    failure(
        "a token of no role",
        &reckon(
            &data,
            &[
                "token", "create", "--tenant", "acme", "--role", "owner", "--label", "x",
            ],
        ),
    );

    let keyring = reckon_ledger::Keyring::load_file(&data.join("master.key"))
        .unwrap()
        .expect("the key file the CLI made");
    let ledger = reckon_ledger::connect(None, &data, keyring).await.unwrap();
    let acme = ledger.tenant_by_slug("acme").await.unwrap();
    let token = ledger.list_tokens(acme.id).await.unwrap()[0].id;
    drop(ledger);
    ok(&[
        "token",
        "revoke",
        "--tenant",
        "acme",
        "--id",
        &token.to_string(),
    ]);
    failure(
        "revoking it twice",
        &reckon(
            &data,
            &[
                "token",
                "revoke",
                "--tenant",
                "acme",
                "--id",
                &token.to_string(),
            ],
        ),
    );

    let keyring = reckon_ledger::Keyring::load_file(&data.join("master.key"))
        .unwrap()
        .unwrap();
    let ledger = reckon_ledger::connect(None, &data, keyring).await.unwrap();
    let log = ledger.list_actions(acme.id, None, 20).await.unwrap();
    let lines: Vec<_> = log
        .iter()
        .map(|a| {
            (
                a.actor.as_str(),
                a.action.as_str(),
                a.target.clone().unwrap_or_default(),
            )
        })
        .collect();
    let t = format!("token:{token}");
    assert_eq!(
        lines,
        [
            ("operator", "token.revoke", t.clone()),
            ("operator", "token.create", t),
            ("operator", "route.set", "orders/charge".into()),
            ("operator", "provider.add", "stripe".into()),
            ("operator", "source.add", "orders".into()),
        ]
    );
    assert!(log.iter().all(|a| a.detail["via"] == "cli"), "{log:?}");
    assert_eq!(log[3].detail["has_secret"], true);
    let text = format!("{log:?}");
    assert!(
        !text.contains("clicanary"),
        "a secret reached the audit log: {text}"
    );
}

/// People are accounts across tenants: the role a person gets is in that tenant's log, and
/// what happens to their account (password, disabled, second factor) is in the log of every
/// tenant they belong to, and of no other.
#[tokio::test]
async fn people_changed_from_the_cli_are_in_the_audit_log_of_each_of_their_tenants() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let ok = |args: &[&str]| {
        let out = reckon(&data, args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for t in ["acme", "globex", "initech"] {
        ok(&["tenant", "create", t]);
    }
    let password = ok(&[
        "user",
        "create",
        "--email",
        "Ann@Acme.test",
        "--tenant",
        "acme",
        "--role",
        "finance",
    ]);
    assert!(
        password.trim().len() >= 20,
        "a generated password: {password}"
    );
    // An existing account gets a role in a second tenant; no password is made or printed.
    let again = ok(&[
        "user",
        "create",
        "--email",
        "ann@acme.test",
        "--tenant",
        "globex",
        "--role",
        "viewer",
    ]);
    assert_eq!(again, "", "nothing on stdout for an existing account");
    failure(
        "a role that does not exist",
        &reckon(
            &data,
            &[
                "user",
                "create",
                "--email",
                "bob@acme.test",
                "--tenant",
                "acme",
                "--role",
                "owner",
            ],
        ),
    );
    ok(&["user", "disable", "--email", "ann@acme.test"]);
    ok(&["user", "enable", "--email", "ann@acme.test"]);
    let url = ok(&["user", "totp", "--email", "ann@acme.test"]);
    assert!(url.starts_with("otpauth://totp/"), "{url}");
    ok(&["user", "password", "--email", "ann@acme.test"]);
    failure(
        "the password of nobody",
        &reckon(&data, &["user", "password", "--email", "nobody@acme.test"]),
    );

    let keyring = reckon_ledger::Keyring::load_file(&data.join("master.key"))
        .unwrap()
        .unwrap();
    let ledger = reckon_ledger::connect(None, &data, keyring).await.unwrap();
    let lines = |slug: &'static str| {
        let ledger = ledger.clone();
        async move {
            let t = ledger.tenant_by_slug(slug).await.unwrap();
            let log = ledger.list_actions(t.id, None, 20).await.unwrap();
            assert!(
                log.iter()
                    .all(|a| a.actor == "operator" && a.detail["via"] == "cli")
            );
            log.iter()
                .rev()
                .map(|a| (a.action.clone(), a.target.clone().unwrap_or_default()))
                .collect::<Vec<_>>()
        }
    };
    let ann = || "user:ann@acme.test".to_owned();
    let account = [
        ("user.disable".to_owned(), ann()),
        ("user.enable".to_owned(), ann()),
        ("user.second_factor".to_owned(), ann()),
        ("user.password".to_owned(), ann()),
    ];
    let mut acme = vec![
        ("user.create".to_owned(), ann()),
        ("member.set".to_owned(), ann()),
    ];
    acme.extend(account.clone());
    assert_eq!(lines("acme").await, acme);
    let mut globex = vec![("member.set".to_owned(), ann())];
    globex.extend(account);
    assert_eq!(lines("globex").await, globex);
    assert_eq!(lines("initech").await, [], "not a tenant of hers");
    let acme_id = ledger.tenant_by_slug("acme").await.unwrap().id;
    let log = ledger.list_actions(acme_id, None, 20).await.unwrap();
    let totp = log
        .iter()
        .find(|a| a.action == "user.second_factor")
        .unwrap();
    assert_eq!(totp.detail["on"], true);
    let member = log.iter().find(|a| a.action == "member.set").unwrap();
    assert_eq!(member.detail["role"], "finance");
}

/// `reckon source scan` takes the scheduler's lease on the source: while another process
/// holds it (a `reckon serve` replica mid-scan) the command waits, says so, and scans
/// nothing, instead of racing that scan over the same keys; once the lease is free, it
/// scans.
#[tokio::test]
async fn a_cli_scan_waits_for_a_scan_another_process_is_running() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let stores = dir.path().join("stores");
    std::fs::create_dir_all(stores.join("acme")).unwrap();
    let store = stores.join("acme/shop.db");
    let made = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import sqlite3, sys, time\n\
             c = sqlite3.connect(sys.argv[1])\n\
             c.execute('CREATE TABLE justonce_keys (key TEXT PRIMARY KEY, state TEXT NOT NULL, \
             request_hash TEXT NOT NULL, response TEXT, attempts INTEGER NOT NULL DEFAULT 1, \
             created_at REAL NOT NULL, updated_at REAL NOT NULL, expires_at REAL)')\n\
             t = time.time()\n\
             c.execute(\"INSERT INTO justonce_keys VALUES ('charge:v1:ORD-1', 'unknown', '1:ab', \
             NULL, 1, ?, ?, NULL)\", (t - 2, t - 1))\n\
             c.commit()\n",
        )
        .arg(&store)
        .output()
        .expect("python3");
    assert!(made.status.success(), "{}", stderr(&made));
    let out = reckon(&data, &["tenant", "create", "acme"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let keyring = reckon_ledger::Keyring::load_file(&data.join("master.key"))
        .unwrap()
        .expect("the key file the CLI made");
    let ledger = reckon_ledger::connect(None, &data, keyring).await.unwrap();
    let acme = ledger.tenant_by_slug("acme").await.unwrap();
    let source = ledger
        .add_source(
            acme.id,
            reckon_ledger::NewSource {
                name: "shop".into(),
                kind: reckon_ledger::SourceKind::Sqlite,
                dsn: Some(store.display().to_string().into()),
                dsn_display: Some(store.display().to_string()),
                table_name: "justonce_keys".into(),
                scan_interval_secs: 60,
                abandoned_after_secs: 300.0,
                overlap_secs: 5.0,
                full_scan_every_secs: 3600,
                mapping: None,
            },
        )
        .await
        .unwrap();
    let held = ledger
        .try_lease(&format!("scan:{}", source.id), "replica-b", 60.0)
        .await
        .unwrap()
        .expect("the lease is free");
    let scan = Command::new(env!("CARGO_BIN_EXE_reckon"))
        .arg("--data-dir")
        .arg(&data)
        .arg("--config")
        .arg(data.with_extension("no-such.toml"))
        .args(["source", "scan", "--tenant", "acme", "--name", "shop"])
        .env("RECKON_LOG", "warn")
        .env("RECKON_SQLITE_SOURCE_DIR", &stores)
        .env_remove("RECKON_DATABASE_URL")
        .env_remove("RECKON_MASTER_KEY")
        .env_remove("RECKON_DATA_DIR")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run reckon");
    // Held by the other process: nothing is scanned while it holds it.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert!(
        ledger
            .get_effect(acme.id, "shop", "charge:v1:ORD-1")
            .await
            .unwrap()
            .is_none(),
        "nothing was scanned while another process held the scan"
    );
    ledger.release_lease(&held).await.unwrap();
    let out = scan.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("acme/shop: another process is scanning it now; waiting"),
        "{}",
        stderr(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("acme/shop: read 1 rows: 1 created"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
