//! The README's two commands work as a newcomer types them. The first, `cargo run --release
//! -- demo`, must resolve to reckon's binary from the workspace root: cargo picks the
//! default members' only binary, so the test asks cargo itself what it would pick.

use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .and_then(Path::parent)
        .expect("the workspace root")
}

#[test]
fn the_readmes_first_command_runs_reckon() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    assert!(
        readme.contains("\ncargo run --release -- demo\n"),
        "the README's first command changed: update this test with it"
    );
    assert!(
        readme.contains("\n./scripts/test\n"),
        "the README's test command"
    );
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(root())
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let defaults: Vec<&str> = meta["workspace_default_members"]
        .as_array()
        .expect("default members")
        .iter()
        .filter_map(|m| m.as_str())
        .collect();
    // `cargo run` in the root runs the one binary of the default members.
    let bins: Vec<(String, String)> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| defaults.contains(&p["id"].as_str().unwrap_or("")))
        .flat_map(|p| {
            p["targets"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|t| t["kind"].as_array().unwrap().iter().any(|k| k == "bin"))
                .map(|t| {
                    (
                        p["name"].as_str().unwrap().to_owned(),
                        t["name"].as_str().unwrap().to_owned(),
                    )
                })
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        bins,
        vec![("reckon".to_owned(), "reckon".to_owned())],
        "cargo run would not know which binary to run"
    );
}
