//! The master key: a ledger refuses a key that is not the one its secrets were sealed with
//! (a lost key file is never silently replaced), and `reckon keys rotate` re-seals every
//! secret under a new key after which the sources still open, on the embedded ledger (key
//! file) and on PostgreSQL (RECKON_MASTER_KEY).

use std::path::Path;
use std::process::{Command, Output};

fn reckon(data: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_reckon"));
    c.arg("--data-dir")
        .arg(data)
        .env("RECKON_LOG", "warn")
        .env_remove("RECKON_MASTER_KEY")
        .env_remove("RECKON_DATABASE_URL")
        .env("RECKON_SQLITE_SOURCE_DIR", data.parent().unwrap());
    c
}

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn err(out: Output) -> String {
    assert!(!out.status.success(), "expected a refusal");
    String::from_utf8(out.stderr).unwrap()
}

/// A justonce store (an empty table is enough for a scan to open it), a source with its
/// DSN sealed, and a provider with its secret sealed.
/// The store is in tenant acme's own directory of the SQLite source directory (T12).
fn seed(run: &dyn Fn(&[&str]) -> Output, store: &Path) {
    std::fs::create_dir_all(store.parent().unwrap()).unwrap();
    let conn = Command::new("python3")
        .args(["-c", "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('CREATE TABLE justonce_keys (key TEXT PRIMARY KEY, state TEXT NOT NULL, request_hash TEXT NOT NULL, response TEXT, attempts INTEGER NOT NULL DEFAULT 1, created_at REAL NOT NULL, updated_at REAL NOT NULL, expires_at REAL)'); c.commit()"])
        .arg(store)
        .status()
        .unwrap();
    assert!(conn.success());
    ok(run(&["tenant", "create", "acme"]));
    ok(run(&[
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
    ok(run(&[
        "provider",
        "add",
        "--tenant",
        "acme",
        "--name",
        "stripe-live",
        "--kind",
        "stripe",
        "--secret-env",
        "KEYS_TEST_STRIPE",
    ]));
}

#[test]
fn a_lost_key_file_is_refused_and_rotation_keeps_every_secret_readable() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let run = |args: &[&str]| {
        reckon(&data)
            .env("KEYS_TEST_STRIPE", "rk_live_keystest")
            .args(args)
            .output()
            .unwrap()
    };
    seed(&run, &dir.path().join("acme").join("shop.db"));
    let key_file = data.join("master.key");
    let before = std::fs::read_to_string(&key_file).unwrap();

    let said = err(run(&["keys", "rotate", "--new-key-env", "X"]));
    assert!(said.contains("key file"), "{said}");
    ok(run(&["keys", "rotate"]));
    let after = std::fs::read_to_string(&key_file).unwrap();
    assert_ne!(before, after, "the key file was not replaced");
    assert!(!data.join("master.key.new").exists());
    // The DSN opens under the new key: the scan connects.
    ok(run(&[
        "source", "scan", "--tenant", "acme", "--name", "shop",
    ]));

    // The old key is refused.
    std::fs::write(&key_file, before.as_bytes()).unwrap();
    let said = err(run(&["tenant", "list"]));
    assert!(said.contains("master key does not open"), "{said}");

    // A lost key file: refused, and no new key file appears in its place.
    std::fs::remove_file(&key_file).unwrap();
    let said = err(run(&["tenant", "list"]));
    assert!(said.contains("master key does not open"), "{said}");
    assert!(!key_file.exists(), "a new key file replaced the lost one");
}

#[test]
fn on_postgresql_rotation_moves_to_the_new_environment_key() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let name = format!(
        "reckon_keys_{}_{}",
        std::process::id(),
        rand::random::<u32>()
    );
    let psql = |sql: String| {
        Command::new("psql")
            .args([
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-c",
                &sql,
            ])
            .output()
            .unwrap()
    };
    assert!(psql(format!("CREATE DATABASE {name}")).status.success());
    let url = format!("postgres://postgres@127.0.0.1:5432/{name}");
    let old = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    let new = ok(reckon(&data).args(["keys", "generate"]).output().unwrap());
    let new = new.trim().to_owned();
    let run_with = |key: &str, args: &[&str]| {
        reckon(&data)
            .env("RECKON_DATABASE_URL", &url)
            .env("RECKON_MASTER_KEY", key)
            .env("KEYS_TEST_STRIPE", "rk_live_keystest")
            .env("KEYS_TEST_NEW", &new)
            .args(args)
            .output()
            .unwrap()
    };
    let run = |args: &[&str]| run_with(old, args);
    seed(&run, &dir.path().join("acme").join("shop.db"));

    let said = err(run(&["keys", "rotate"]));
    assert!(said.contains("--new-key-env"), "{said}");
    ok(run(&["keys", "rotate", "--new-key-env", "KEYS_TEST_NEW"]));
    // Running it again is harmless (resumable); with the new key it opens.
    let said = err(run(&["tenant", "list"]));
    assert!(said.contains("master key does not open"), "{said}");
    ok(run_with(
        &new,
        &["source", "scan", "--tenant", "acme", "--name", "shop"],
    ));
    let out = run_with(&new, &["keys", "rotate", "--new-key-env", "KEYS_TEST_NEW"]);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("re-sealed 0 DSNs, 0 provider secrets"),
        "{said}"
    );
    assert!(said.contains("2 already under the new key"), "{said}");
    let _ = psql(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
}
