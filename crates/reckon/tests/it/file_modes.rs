//! What `reckon serve` creates in a fresh data directory is private to the service's user:
//! the directory 0700, the ledger file, its `-wal` and `-shm`, the master key and the serve
//! lock 0600, whatever the process's umask would have given them.
#![cfg(unix)]

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o777
}

#[test]
fn a_fresh_data_directory_and_the_ledger_files_are_private() {
    let dir = tempfile::tempdir().unwrap();
    let parent = dir.path().join("srv");
    let data = parent.join("reckon-data");
    let mut child = Command::new(env!("CARGO_BIN_EXE_reckon"))
        .arg("--data-dir")
        .arg(&data)
        .env("RECKON_LOG", "info")
        .args(["serve", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start reckon serve");
    let (tx, rx) = std::sync::mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    while !seen.iter().any(|l: &String| l.contains("listening")) {
        let left = deadline
            .checked_duration_since(Instant::now())
            .unwrap_or_else(|| panic!("serve did not start: {seen:?}"));
        match rx.recv_timeout(left) {
            Ok(l) => seen.push(l),
            Err(_) => panic!("serve did not start: {seen:?}"),
        }
    }
    // Every directory reckon made, and every file it made in it, while it runs (the -wal
    // and -shm files exist only while the ledger is open).
    let checks = [
        (parent, 0o700),
        (data.clone(), 0o700),
        (data.join("reckon.db"), 0o600),
        (data.join("reckon.db-wal"), 0o600),
        (data.join("reckon.db-shm"), 0o600),
        (data.join("master.key"), 0o600),
        (data.join("reckon.db.serve-lock"), 0o600),
    ];
    let found: Vec<(String, u32)> = checks
        .iter()
        .map(|(p, _)| (p.display().to_string(), mode(p)))
        .collect();
    let _ = child.kill();
    let _ = child.wait();
    for ((path, got), (_, want)) in found.iter().zip(checks.iter()) {
        assert_eq!(*got, *want, "{path} is {got:o}, not {want:o}");
    }
}
