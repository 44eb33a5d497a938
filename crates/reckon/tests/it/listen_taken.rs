//! `reckon serve` on an address another process holds stops at once, non-zero, and its one
//! error line says how to choose another address.

use std::process::Command;

#[test]
fn a_taken_address_names_the_flag_and_the_variable_that_change_it() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_reckon"))
        .arg("--data-dir")
        .arg(dir.path())
        .env("RECKON_LOG", "warn")
        .args(["serve", "--listen", &addr])
        .output()
        .expect("run reckon serve");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains(&addr), "{err}");
    assert!(
        err.contains("--listen") && err.contains("RECKON_LISTEN"),
        "{err}"
    );
    drop(taken);
}
