//! Several `reckon serve` processes: on SQLite a second one is refused by name; on one
//! PostgreSQL ledger they share the work, each scan done by one replica only.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn reckon(data: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_reckon"));
    c.arg("--data-dir").arg(data).env("RECKON_LOG", "info");
    // The data directories' parent is the operator's SQLite source directory (the default
    // egress policy refuses SQLite sources); the stores are in its `acme/` subdirectory.
    c.env(
        "RECKON_SQLITE_SOURCE_DIR",
        data.parent().expect("the data directory has a parent"),
    );
    c
}

/// A running `reckon serve` whose stderr lines arrive on a channel.
struct Replica {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Replica {
    fn start(mut cmd: Command) -> Replica {
        let mut child = cmd
            .args(["serve", "--listen", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start reckon serve");
        let (tx, lines) = mpsc::channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(strip_ansi(&line)).is_err() {
                    break;
                }
            }
        });
        Replica {
            child,
            lines,
            seen: vec![],
        }
    }

    /// Wait for a stderr line containing `needle`; false on timeout or exit.
    fn wait_for(&mut self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        if self.seen.iter().any(|l| l.contains(needle)) {
            return true;
        }
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let hit = l.contains(needle);
                    self.seen.push(l);
                    if hit {
                        return true;
                    }
                }
                Err(_) => return false,
            }
        }
        false
    }

    fn drain(&mut self) {
        while let Ok(l) = self.lines.try_recv() {
            self.seen.push(l);
        }
    }

    fn count(&self, needle: &str) -> usize {
        self.seen.iter().filter(|l| l.contains(needle)).count()
    }
}

/// The log's colour codes, removed so that `source=a` reads as written.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters final-byte
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_second_serve_on_the_same_sqlite_ledger_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut first = Replica::start(reckon(&data));
    assert!(
        first.wait_for("listening", Duration::from_secs(60)),
        "first serve did not start: {:?}",
        first.seen
    );

    // The container health probe (distroless: no curl) answers for a running serve ...
    let addr = first
        .seen
        .iter()
        .find_map(|l| l.split("addr=").nth(1))
        .map(|a| a.split_whitespace().next().unwrap().to_owned())
        .expect("the listening line names the address");
    let probe = |url: String| {
        Command::new(env!("CARGO_BIN_EXE_reckon"))
            .args(["healthcheck", "--url", &url])
            .output()
            .unwrap()
    };
    assert!(probe(format!("http://{addr}/healthz")).status.success());
    // ... and fails where nothing healthy answers.
    assert!(
        !probe(format!("http://{addr}/nothing-here"))
            .status
            .success()
    );

    let out = reckon(&data)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .output()
        .expect("run second serve");
    assert!(!out.status.success(), "a second serve must not start");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("another `reckon serve` is already running"),
        "the refusal says why: {err}"
    );

    // The lock is the OS's: a SIGKILLed holder leaves nothing behind to clean up.
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    assert!(
        !probe(format!("http://{addr}/healthz")).status.success(),
        "a dead serve is unhealthy"
    );
    let mut third = Replica::start(reckon(&data));
    assert!(
        third.wait_for("listening", Duration::from_secs(60)),
        "serve after a killed one did not start: {:?}",
        third.seen
    );
}

fn python() -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/test-env.sh");
    let out = Command::new(script).output().expect("scripts/test-env.sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A fresh PostgreSQL database for this test's ledger, dropped at the end.
struct PgDb {
    name: String,
    url: String,
}

impl Drop for PgDb {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args(["-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-c"])
            .arg(format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .output();
    }
}

fn fresh_pg_database() -> PgDb {
    let name = format!(
        "reckon_replicas_{}_{}",
        std::process::id(),
        rand::random::<u32>()
    );
    let out = Command::new("psql")
        .args(["-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-c"])
        .arg(format!("CREATE DATABASE {name}"))
        .output()
        .expect("psql");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PgDb {
        url: format!("postgres://postgres@127.0.0.1:5432/{name}"),
        name,
    }
}

#[test]
fn replicas_on_one_postgresql_ledger_scan_each_source_once_per_interval() {
    let dir = tempfile::tempdir().unwrap();
    let db = fresh_pg_database();
    let url = db.url.clone();
    let key = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    let with_ledger = |c: &mut Command| {
        c.env("RECKON_DATABASE_URL", &url)
            .env("RECKON_MASTER_KEY", key);
    };

    // Three sources of 3,000 rows each, written by the real justonce library.
    let writer = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/justonce_writer.py");
    let run = |args: &[&str]| {
        let mut c = reckon(&dir.path().join("cli"));
        with_ledger(&mut c);
        let out = c.args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&["tenant", "create", "acme"]);
    for s in ["a", "b", "c"] {
        // acme's SQLite source sits in acme's own directory of the SQLite source
        // directory (T12: `{sqlite_source_dir}/{tenant-slug}/`).
        let store = dir.path().join("acme").join(format!("{s}.db"));
        std::fs::create_dir_all(store.parent().unwrap()).unwrap();
        let out = Command::new(python())
            .arg(&writer)
            .args(["--backend", "sqlite", "--dsn"])
            .arg(&store)
            .args(["bulk", "--count", "3000"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        run(&[
            "source",
            "add",
            "--tenant",
            "acme",
            "--name",
            s,
            "--kind",
            "sqlite",
            "--dsn",
            store.to_str().unwrap(),
            "--scan-interval",
            "1h",
        ]);
    }

    let mut replicas: Vec<Replica> = (0..3)
        .map(|i| {
            let mut c = reckon(&dir.path().join(format!("r{i}")));
            with_ledger(&mut c);
            Replica::start(c)
        })
        .collect();
    // Every source gets scanned (by someone) ...
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        for r in &mut replicas {
            r.drain();
        }
        let done: usize = replicas.iter().map(|r| r.count("scan done")).sum();
        if done >= 3 || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // ... and then a few more scheduler ticks pass with every replica looking.
    std::thread::sleep(Duration::from_secs(8));
    for r in &mut replicas {
        r.drain();
    }
    let per_replica: Vec<usize> = replicas.iter().map(|r| r.count("scan done")).collect();
    assert_eq!(
        per_replica.iter().sum::<usize>(),
        3,
        "three sources, one scan each across all replicas (per replica: {per_replica:?})"
    );
    for s in ["source=a", "source=b", "source=c"] {
        let n: usize = replicas
            .iter()
            .map(|r| {
                r.seen
                    .iter()
                    .filter(|l| l.contains("scan done") && l.contains(s))
                    .count()
            })
            .sum();
        assert_eq!(n, 1, "{s} scanned exactly once");
    }
    drop(replicas);
    drop(db);
}

/// SIGTERM: readiness turns false first while the server still answers (load balancers
/// stop sending), then the process drains and exits on its own within the bound.
#[test]
fn sigterm_turns_readiness_false_first_then_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut cmd = reckon(&data);
    cmd.env("RECKON_SHUTDOWN_DRAIN_SECS", "3");
    let mut r = Replica::start(cmd);
    assert!(
        r.wait_for("listening", Duration::from_secs(60)),
        "{:?}",
        r.seen
    );
    let addr = r
        .seen
        .iter()
        .find_map(|l| l.split("addr=").nth(1))
        .map(|a| a.split_whitespace().next().unwrap().to_owned())
        .expect("the listening line names the address");
    let ok = |path: &str| {
        Command::new(env!("CARGO_BIN_EXE_reckon"))
            .args(["healthcheck", "--url", &format!("http://{addr}{path}")])
            .output()
            .unwrap()
            .status
            .success()
    };
    assert!(ok("/readyz"), "ready before the signal");

    let sent = Instant::now();
    let status = Command::new("kill")
        .args(["-TERM", &r.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert!(
        r.wait_for("readiness is false", Duration::from_secs(5)),
        "{:?}",
        r.seen
    );
    // Inside the drain window: not ready, still alive and answering.
    assert!(!ok("/readyz"), "readiness still true after SIGTERM");
    assert!(
        ok("/healthz"),
        "the server stopped answering before the drain delay"
    );
    assert!(
        sent.elapsed() < Duration::from_secs(3),
        "the checks above took too long to mean anything"
    );

    let deadline = Instant::now() + Duration::from_secs(30);
    let exit = loop {
        if let Some(s) = r.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "reckon serve did not exit within 30 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "exit status {exit:?}");
    assert!(
        sent.elapsed() >= Duration::from_secs(3),
        "it exited before the drain delay"
    );
    assert!(
        r.wait_for("stopped", Duration::from_secs(5)),
        "{:?}",
        r.seen
    );
}
