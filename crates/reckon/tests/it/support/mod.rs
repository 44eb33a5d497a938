//! A `reckon demo` for the CLI's tests: started on a data directory of the test's, with its
//! banner read back, stopped when dropped.
// Every test binary compiles this module and uses a part of it.
#![allow(
    dead_code,
    reason = "a module shared by several test modules; not each uses all of it"
)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub struct Demo {
    child: Child,
    pub banner: String,
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Demo {
    /// `reckon demo --data-dir DATA` on a free port, in an environment that names no other
    /// ledger; returns once the banner is printed (the server is listening).
    pub fn start(data: &Path) -> Demo {
        let mut child = Command::new(env!("CARGO_BIN_EXE_reckon"))
            .arg("--data-dir")
            .arg(data)
            .args(["demo", "--listen", "127.0.0.1:0"])
            .current_dir(data.parent().unwrap())
            .env("RECKON_LOG", "warn")
            .env_remove("RECKON_DATABASE_URL")
            .env_remove("RECKON_MASTER_KEY")
            .env_remove("RECKON_DATA_DIR")
            .env_remove("RECKON_EGRESS_ALLOW")
            .env_remove("RECKON_SQLITE_SOURCE_DIR")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start reckon demo");
        let out = child.stdout.take().unwrap();
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
            .expect("the demo printed its banner");
        Demo { child, banner }
    }

    /// The rest of the banner's line after `marker`.
    pub fn line_after(&self, marker: &str) -> &str {
        self.banner
            .lines()
            .find_map(|l| l.split_once(marker).map(|(_, rest)| rest.trim()))
            .unwrap_or_else(|| panic!("the banner has no {marker:?}: {}", self.banner))
    }

    /// The banner's command prefix that points the CLI at this demo's ledger.
    pub fn cli_prefix(&self) -> &str {
        self.line_after("CLI prefix for this ledger: ")
    }

    /// The first word after `marker` (a token, a URL).
    pub fn word_after(&self, marker: &str) -> &str {
        self.line_after(marker)
            .split_whitespace()
            .next()
            .unwrap_or_else(|| panic!("nothing after {marker:?}"))
    }

    /// A shell script run with the banner's prefix available as the function `reckon`, as
    /// a person pastes it.
    pub fn sh(&self, script: &str, env: &[(&str, &str)]) -> Output {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(format!(
                "reckon() {{ {} \"$@\"; }}\n{script}",
                self.cli_prefix()
            ))
            .env("RECKON_LOG", "warn")
            .env_remove("RECKON_DATABASE_URL")
            .env_remove("RECKON_MASTER_KEY")
            .env_remove("RECKON_DATA_DIR")
            .env_remove("RECKON_EGRESS_ALLOW")
            .env_remove("RECKON_SQLITE_SOURCE_DIR");
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().expect("run sh")
    }
}

/// stdout of a command that must succeed (the test fails with its stderr otherwise).
pub fn ok(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stdout).unwrap()
}
