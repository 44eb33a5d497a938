//! The egress policy through the `reckon` binary, with the process environment a real
//! deployment has:
//!
//! - `reckon source add` refuses a DSN the policy forbids (T08 at save) and a SQLite file
//!   outside the tenant's own directory (T12 at save), with the reason and without the
//!   password;
//! - a password-less PostgreSQL DSN never borrows the service's credentials (T11): the scan
//!   runs with `PGPASSWORD`, `PGPASSFILE`, `~/.pgpass` (and `PGUSER`, `PGDATABASE`) set to
//!   canaries, against a loopback server speaking the PostgreSQL protocol that asks for the
//!   password in clear text and records what it is sent. (The machine's PostgreSQL trusts
//!   loopback connections, so it cannot tell a borrowed password from none; this server
//!   can.) And the libpq variables sqlx reads from the process whatever the DSN says (the
//!   service's TLS client certificate and key, root certificate, session options) make a
//!   tenant's PostgreSQL connection refused before it is opened.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

fn reckon(dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_reckon"));
    c.arg("--data-dir")
        .arg(dir.join("data"))
        .env("RECKON_LOG", "warn")
        .env_remove("RECKON_DATABASE_URL")
        .env_remove("RECKON_MASTER_KEY")
        .env("RECKON_SQLITE_SOURCE_DIR", dir.join("sources"))
        .env("RECKON_EGRESS_ALLOW", r#"["127.0.0.1/32"]"#);
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

fn refused(out: Output) -> String {
    assert!(!out.status.success(), "expected a refusal");
    String::from_utf8(out.stderr).unwrap()
}

fn add(dir: &Path, tenant: &str, name: &str, kind: &str, dsn: &str) -> Output {
    reckon(dir)
        .args(["source", "add", "--tenant", tenant, "--name", name])
        .args(["--kind", kind, "--dsn", dsn])
        .output()
        .unwrap()
}

#[test]
fn source_add_refuses_what_the_egress_policy_forbids_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(reckon(d)
        .args(["tenant", "create", "acme"])
        .output()
        .unwrap());
    ok(reckon(d)
        .args(["tenant", "create", "beta"])
        .output()
        .unwrap());
    let (mine, theirs) = (d.join("sources/acme"), d.join("sources/beta"));
    std::fs::create_dir_all(&mine).unwrap();
    std::fs::create_dir_all(&theirs).unwrap();
    std::fs::write(theirs.join("shop.db"), b"beta's").unwrap();
    let p = |x: &Path| x.to_str().unwrap().to_owned();
    for (kind, dsn, why) in [
        (
            "postgres",
            "postgres://u:canarypw@10.0.0.1/db".to_owned(),
            "host 10.0.0.1 is a private address",
        ),
        (
            "mysql",
            "mysql://u:canarypw@169.254.169.254/db".to_owned(),
            "link-local",
        ),
        // 127.0.0.2 is loopback but outside this operator's allow-list (127.0.0.1/32).
        (
            "postgres",
            "postgres://u:canarypw@127.0.0.2/db".to_owned(),
            "loopback",
        ),
        ("sqlite", p(&theirs.join("shop.db")), "inside"),
        ("sqlite", p(&mine.join("../beta/shop.db")), "'..'"),
        // reckon's own ledger file is never a source.
        ("sqlite", p(&d.join("data/reckon.db")), "inside"),
    ] {
        let said = refused(add(d, "acme", "x", kind, &dsn));
        assert!(said.contains("egress policy"), "{dsn}: {said}");
        assert!(said.contains(why), "{dsn}: {said}");
        assert!(!said.contains("canarypw"), "{said}");
    }
    let listed = ok(reckon(d)
        .args(["source", "list", "--tenant", "acme", "--format", "json"])
        .output()
        .unwrap());
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed, serde_json::json!([]), "nothing was stored");
    // The same file is beta's to add; acme's own directory is acme's.
    ok(add(
        d,
        "beta",
        "shop",
        "sqlite",
        &p(&theirs.join("shop.db")),
    ));
    ok(add(d, "acme", "shop", "sqlite", &p(&mine.join("shop.db"))));
}

/// What a fake PostgreSQL server was sent.
#[derive(Default, Debug)]
struct Seen {
    /// The startup parameters (user, database, ...) of each connection.
    startups: Vec<Vec<(String, String)>>,
    /// Every password message.
    passwords: Vec<String>,
}

fn read_exact(s: &mut impl Read, n: usize) -> std::io::Result<Vec<u8>> {
    let mut b = vec![0; n];
    s.read_exact(&mut b)?;
    Ok(b)
}

fn be32(b: &[u8]) -> usize {
    u32::from_be_bytes(b[..4].try_into().unwrap()) as usize
}

/// One connection: refuse TLS, take the startup message, ask for a clear-text password,
/// record it, and refuse it.
fn serve_one(mut s: std::net::TcpStream, seen: &Mutex<Seen>) -> std::io::Result<()> {
    let startup = loop {
        let len = be32(&read_exact(&mut s, 4)?);
        let body = read_exact(&mut s, len - 4)?;
        match be32(&body) {
            // SSLRequest, GSSENCRequest: not here.
            80877103 | 80877104 => s.write_all(b"N")?,
            _ => break body,
        }
    };
    let fields: Vec<String> = startup[4..]
        .split(|b| *b == 0)
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect();
    let params = fields
        .chunks(2)
        .filter(|kv| kv.len() == 2 && !kv[0].is_empty())
        .map(|kv| (kv[0].clone(), kv[1].clone()))
        .collect();
    seen.lock().unwrap().startups.push(params);
    // AuthenticationCleartextPassword.
    s.write_all(&[b'R', 0, 0, 0, 8, 0, 0, 0, 3])?;
    let tag = read_exact(&mut s, 1)?;
    assert_eq!(tag, b"p", "a password message");
    let len = be32(&read_exact(&mut s, 4)?);
    let body = read_exact(&mut s, len - 4)?;
    let password = String::from_utf8_lossy(body.strip_suffix(&[0]).unwrap_or(&body)).into_owned();
    seen.lock().unwrap().passwords.push(password);
    let mut err = Vec::new();
    for (code, text) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', "28P01"),
        (b'M', "password authentication failed"),
    ] {
        err.push(code);
        err.extend_from_slice(text.as_bytes());
        err.push(0);
    }
    err.push(0);
    let mut msg = vec![b'E'];
    msg.extend_from_slice(&((err.len() + 4) as u32).to_be_bytes());
    msg.extend_from_slice(&err);
    s.write_all(&msg)
}

#[test]
fn a_passwordless_postgres_dsn_never_borrows_the_services_credentials() {
    const PGPASSWORD: &str = "canary-pgpassword-3b1f";
    const PASSFILE: &str = "canary-passfile-9d2e";
    const HOME_PGPASS: &str = "canary-home-pgpass-5c7a";
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The service's own credentials, everywhere libpq would look for them.
    let home = d.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let passfile = d.join("pgpass");
    std::fs::write(&passfile, format!("*:*:*:*:{PASSFILE}\n")).unwrap();
    std::fs::write(home.join(".pgpass"), format!("*:*:*:*:{HOME_PGPASS}\n")).unwrap();
    #[cfg(unix)]
    for f in [&passfile, &home.join(".pgpass")] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let s = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let _ = serve_one(conn, &s);
        }
    });

    let with_service_env = |c: &mut Command| {
        c.env("PGPASSWORD", PGPASSWORD)
            .env("PGPASSFILE", &passfile)
            .env("HOME", &home)
            .env("PGUSER", "canary-pguser")
            .env("PGDATABASE", "canary-pgdatabase")
            .env("PGHOST", "127.0.0.9");
    };
    let mut c = reckon(d);
    with_service_env(&mut c);
    ok(c.args(["tenant", "create", "acme"]).output().unwrap());
    let mut c = reckon(d);
    with_service_env(&mut c);
    // No password in the DSN.
    ok(c.args([
        "source", "add", "--tenant", "acme", "--name", "pg", "--kind", "postgres",
    ])
    .arg("--dsn")
    .arg(format!("postgres://shop@127.0.0.1:{port}/orders"))
    .output()
    .unwrap());
    let mut c = reckon(d);
    with_service_env(&mut c);
    let out = c
        .args(["source", "scan", "--tenant", "acme", "--name", "pg"])
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "the server refuses: {said}");
    assert!(said.contains("password authentication failed"), "{said}");

    let seen_handle = seen.clone();
    let seen = seen.lock().unwrap();
    assert!(
        !seen.passwords.is_empty(),
        "no password was asked for: {seen:?}"
    );
    for pw in &seen.passwords {
        assert_eq!(pw, "", "a password was sent for a DSN without one");
    }
    for params in &seen.startups {
        let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("user"), Some("shop"), "{params:?}");
        assert_eq!(get("database"), Some("orders"), "{params:?}");
    }
    for canary in [PGPASSWORD, PASSFILE, HOME_PGPASS] {
        assert!(!said.contains(canary), "{said}");
    }
    let connections = seen.startups.len();
    drop(seen);

    // The libpq variables sqlx would read from reckon's environment whatever the DSN says
    // (the service's TLS client certificate and key, root certificate, session options):
    // the tenant's connection is refused before it is opened, naming the variable.
    for (name, value) in [
        ("PGSSLCERT", d.join("service.crt")),
        ("PGSSLKEY", d.join("service.key")),
        ("PGSSLROOTCERT", d.join("root.crt")),
        ("PGOPTIONS", "-c search_path=service".into()),
    ] {
        let mut c = reckon(d);
        with_service_env(&mut c);
        let out = c
            .env(name, &value)
            .args(["source", "scan", "--tenant", "acme", "--name", "pg"])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{name}: {said}");
        assert!(said.contains(name), "{name}: {said}");
    }
    assert_eq!(
        seen_connections(&seen_handle),
        connections,
        "a refused scan still connected"
    );
}

fn seen_connections(seen: &Mutex<Seen>) -> usize {
    seen.lock().unwrap().startups.len()
}
