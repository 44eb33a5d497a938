//! What a newcomer notices in their first hour with `reckon demo`, run as they run it (no
//! `--data-dir`, stderr to a pipe or a file rather than a terminal):
//!
//! - the overview's chart has a point from the first page view, not after an hour;
//! - stderr carries no colour codes when it is not a terminal;
//! - the nightly audit that is stored partial (one provider of the demo is down) is a
//!   warning with why, not an INFO line;
//! - the temporary data directory is removed when the demo stops (the banner says where it
//!   is and how to keep it), and kept with `--keep`.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

struct Demo {
    child: Child,
    banner: String,
    stderr: Arc<Mutex<String>>,
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Demo {
    /// `reckon demo` with its temporary directory under `tmp` (TMPDIR), stdout and stderr
    /// both pipes; returns once the banner is printed.
    fn start(tmp: &Path, extra: &[&str]) -> Demo {
        let mut child = Command::new(env!("CARGO_BIN_EXE_reckon"))
            .args(["demo", "--listen", "127.0.0.1:0"])
            .args(extra)
            .current_dir(tmp)
            .env("TMPDIR", tmp)
            // The schedule checks every second, so the nightly audit of yesterday runs
            // within the test.
            .env("RECKON_AUDIT_CHECK_SECS", "1")
            .env_remove("RECKON_DATABASE_URL")
            .env_remove("RECKON_MASTER_KEY")
            .env_remove("RECKON_DATA_DIR")
            .env_remove("RECKON_LOG")
            .env_remove("RUST_LOG")
            .env_remove("RECKON_LOG_FORMAT")
            .env_remove("NO_COLOR")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start reckon demo");
        let out = child.stdout.take().unwrap();
        let mut err = child.stderr.take().unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut text = String::new();
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                text.push_str(&line);
                text.push('\n');
                if line.starts_with("Ctrl-C") {
                    let _ = tx.send(text.clone());
                }
            }
        });
        let banner = rx
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("no banner; stderr: {}", stderr.lock().unwrap()));
        Demo {
            child,
            banner,
            stderr,
        }
    }

    fn line_after(&self, marker: &str) -> &str {
        self.banner
            .lines()
            .find_map(|l| l.split_once(marker).map(|(_, rest)| rest.trim()))
            .unwrap_or_else(|| panic!("the banner has no {marker:?}: {}", self.banner))
    }

    fn data_dir(&self) -> PathBuf {
        PathBuf::from(self.line_after("Data: "))
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Wait until stderr holds a line with every one of `words`, and return it (`None`
    /// when none came within `within`).
    fn wait_for_line(&self, words: &[&str], within: Duration) -> Option<String> {
        let deadline = Instant::now() + within;
        loop {
            let err = self.stderr();
            if let Some(l) = err.lines().find(|l| words.iter().all(|w| l.contains(w))) {
                return Some(l.to_owned());
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Ctrl-C, as a person stops it; waits for the process to end.
    fn interrupt(&mut self) {
        let ok = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "the demo did not stop on Ctrl-C");
            std::thread::sleep(Duration::from_millis(100));
        }
        // Let the reader take the last lines.
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn client() -> reqwest::Client {
    // rustls is built without a bundled crypto provider: reckon's own client installs ring,
    // the process's one, before this test builds its plain-HTTP client.
    let _ = reckon_providers::GetClient::shared();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

async fn overview(demo: &Demo) -> String {
    let base = demo
        .line_after("health: ")
        .trim_end_matches("/healthz")
        .to_owned();
    let password = demo
        .line_after("(admin@demo.invalid / ")
        .trim_end_matches(')')
        .to_owned();
    let r = client()
        .post(format!("{base}/signin"))
        .header("origin", &base)
        .header("sec-fetch-site", "same-origin")
        .form(&[("email", "admin@demo.invalid"), ("password", &password)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303, "sign-in: {:?}", r.text().await);
    let cookie = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|c| c.starts_with("__Host-reckon_session="))
        .and_then(|c| c.split(';').next())
        .expect("a session cookie")
        .to_owned();
    let r = client()
        .get(format!("{base}/t/demo"))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_first_hour_of_the_demo_has_a_chart_plain_stderr_a_warned_partial_audit_and_no_leftovers()
 {
    let tmp = tempfile::tempdir().unwrap();
    let mut demo = Demo::start(tmp.path(), &[]);
    let dir = demo.data_dir();
    assert!(dir.starts_with(tmp.path()), "{}", dir.display());
    assert!(dir.join("reckon.db").exists(), "{}", dir.display());
    // Each thing a newcomer would notice is checked, and all that fail are reported
    // together.
    let mut problems: Vec<String> = Vec::new();

    // The chart has its first point at once: this hour's count, drawn as a dot.
    let html = overview(&demo).await;
    let chart = html
        .split("id=\"chart\"")
        .nth(1)
        .and_then(|c| c.split("</svg>").next())
        .expect("the chart")
        .to_owned();
    if !(chart.contains("<circle class=\"point\"") || chart.contains(" L")) {
        problems.push(format!(
            "the chart is empty in the demo's first hour: {chart}"
        ));
    }

    // The nightly audit of yesterday is partial (the in-house ledger is down): a warning
    // that says why.
    match demo.wait_for_line(&["nightly audit stored"], Duration::from_secs(60)) {
        Some(line) if line.contains("WARN") && line.contains("legacy-ledger") => {}
        Some(line) => problems.push(format!(
            "the partial nightly audit is not a warning that says why: {line}"
        )),
        None => problems.push(format!("no nightly audit on stderr: {}", demo.stderr())),
    }

    // stderr is a pipe here: no colour codes in it.
    let err = demo.stderr();
    if err.contains('\u{1b}') {
        problems.push(format!(
            "colour codes on a stderr that is not a terminal: {:?}",
            err.lines()
                .find(|l| l.contains('\u{1b}'))
                .unwrap_or_default()
        ));
    }

    // The banner says where the data is and how to keep it.
    match demo.banner.lines().find(|l| l.contains("data directory: ")) {
        Some(said) if said.contains("removed when the demo stops") && said.contains("--keep") => {}
        other => problems.push(format!(
            "the banner does not say the data directory goes, nor how to keep it: {other:?}"
        )),
    }
    // Ctrl-C: the temporary data directory goes with the demo, and it says so.
    demo.interrupt();
    if dir.exists() {
        problems.push(format!("{} is left behind", dir.display()));
    } else if !demo.stderr().contains(&format!(
        "removed the demo's data directory {}",
        dir.display()
    )) {
        problems.push(format!("the removal is not said: {}", demo.stderr()));
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_demo_keeps_its_data_directory_when_asked_and_says_where() {
    let tmp = tempfile::tempdir().unwrap();
    let mut demo = Demo::start(tmp.path(), &["--keep"]);
    let dir = demo.data_dir();
    assert!(
        demo.line_after("data directory: ").contains("kept"),
        "{}",
        demo.banner
    );
    demo.interrupt();
    assert!(
        dir.join("reckon.db").exists(),
        "{} was removed",
        dir.display()
    );
    assert!(
        demo.stderr()
            .contains(&format!("the demo's data is kept in {}", dir.display())),
        "{}",
        demo.stderr()
    );
}
