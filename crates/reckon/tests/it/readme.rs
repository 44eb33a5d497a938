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

/// The README's "Connecting a real justonce store" commands, pasted as written into a
/// shell, take a store the real justonce library wrote to verdicts. The one line not run
/// as written is the Stripe provider's (no Stripe account here): the built-in demo provider
/// on loopback takes its place under the same name, so the route line runs as written.
/// Prints the time the commands took.
#[tokio::test(flavor = "multi_thread")]
async fn the_readmes_connect_commands_take_a_justonce_store_to_verdicts() {
    use reckon_providers::demo::{DemoState, serve_loopback};

    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let section = readme
        .split_once("## Connecting a real justonce store\n")
        .expect("the README's connect section")
        .1;
    let block = section
        .split_once("```sh\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("its first shell block")
        .0;
    let lines: Vec<&str> = block.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(
        lines.iter().any(|l| l.contains("RECKON_SQLITE_SOURCE_DIR")),
        "the block names the setting SQLite stores need"
    );

    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("shop.db");
    let writer = root().join("testdata/justonce_writer.py");
    let python = {
        let out = Command::new(root().join("scripts/test-env.sh"))
            .output()
            .expect("scripts/test-env.sh");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    let out = Command::new(python)
        .arg(&writer)
        .args(["--backend", "sqlite", "--dsn"])
        .arg(&store)
        .arg("populate")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expect: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let unknown: Vec<String> = expect["expect"]["unresolved_unknown"]
        .as_array()
        .expect("the writer's unknown keys")
        .iter()
        .map(|k| k.as_str().unwrap().to_owned())
        .collect();
    assert!(!unknown.is_empty());

    // The provider charged the first unknown and never saw the others.
    let provider = DemoState::new();
    provider.charge(&unknown[0], 1999, "eur", reckon_domain::time::now() - 60.0);
    let (url, _server) = serve_loopback(provider).await.unwrap();

    let data = dir.path().join("data");
    let bin = env!("CARGO_BIN_EXE_reckon");
    let started = std::time::Instant::now();
    // One shell, as a person pastes the block (an `export` holds for the lines after it);
    // each line's output and exit status are told apart by markers.
    let mut script = format!(
        "reckon() {{ {bin} --data-dir {} \"$@\"; }}\n",
        data.display()
    );
    let run: Vec<String> = lines
        .iter()
        .map(|line| {
            if line.contains("provider add") && line.contains("--kind stripe") {
                format!(
                    r#"reckon provider add --tenant acme --name stripe --kind demo --settings '{{"base_url": "{url}"}}'"#
                )
            } else {
                (*line).to_owned()
            }
        })
        .collect();
    for line in &run {
        script.push_str(&format!(
            "echo '@@line'\n{{ {line}\n}} 2>&1\necho \"@@status $?\"\n"
        ));
    }
    let out = Command::new("sh")
        .arg("-c")
        .arg(&script)
        .current_dir(dir.path())
        .env("STORE", &store)
        .env("RECKON_LOG", "warn")
        // The stand-in provider listens on loopback: the README's egress setting.
        .env("RECKON_EGRESS_ALLOW", r#"["127.0.0.1/32"]"#)
        .env_remove("RECKON_DATABASE_URL")
        .env_remove("RECKON_MASTER_KEY")
        .env_remove("RECKON_DATA_DIR")
        .env_remove("RECKON_SQLITE_SOURCE_DIR")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let said: Vec<(String, bool, String)> = text
        .split("@@line\n")
        .skip(1)
        .zip(&run)
        .map(|(part, line)| {
            let (body, status) = part.rsplit_once("@@status ").expect("a status marker");
            (line.clone(), status.trim() == "0", body.to_owned())
        })
        .collect();
    assert_eq!(said.len(), run.len(), "{text}");
    let elapsed = started.elapsed();
    // The store was written seconds ago: a lookup's window (the provider's clock skew
    // included) must pass before its answer is final. `reckon reconcile` again, as the
    // README's last line says, until nothing is open.
    let mut last = String::new();
    for _ in 0..40 {
        let out = Command::new(bin)
            .arg("--data-dir")
            .arg(&data)
            .args(["reconcile", "--tenant", "acme"])
            .env("RECKON_LOG", "warn")
            .env("RECKON_EGRESS_ALLOW", r#"["127.0.0.1/32"]"#)
            .env("RECKON_SQLITE_SOURCE_DIR", dir.path().join("stores"))
            .env_remove("RECKON_DATABASE_URL")
            .env_remove("RECKON_MASTER_KEY")
            .env_remove("RECKON_DATA_DIR")
            .output()
            .unwrap();
        last = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if last.contains("nothing is still open") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_secs(5));
    }
    let to_verdicts = started.elapsed();
    let all: String = said
        .iter()
        .map(|(l, ok, t)| format!("$ {l}\n[{}]\n{t}\n", if *ok { "ok" } else { "exit 1" }))
        .collect();
    println!("{all}");
    println!("{last}");
    println!(
        "the README's connect commands took {:.1} s; every unknown had a final verdict {:.1} s \
         after the first command",
        elapsed.as_secs_f64(),
        to_verdicts.as_secs_f64()
    );

    let checks: Vec<&(String, bool, String)> = said
        .iter()
        .filter(|(l, _, _)| l.contains("source check"))
        .collect();
    assert_eq!(checks.len(), 2, "{all}");
    // Before the route: the check fails, names the unrouted operation and its fix.
    assert!(!checks[0].1, "{all}");
    assert!(
        checks[0]
            .2
            .contains("no provider routed for operation charge of source shop")
            && checks[0]
                .2
                .contains("reckon route set --tenant acme --source shop --operation charge"),
        "{all}"
    );
    // Every other command succeeded, the last check included.
    for (l, ok, t) in &said {
        if !std::ptr::eq(l, &checks[0].0) {
            assert!(ok, "`{l}` failed: {t}\n{all}");
        }
    }
    let reconcile = said
        .iter()
        .find(|(l, _, _)| l.starts_with("reckon reconcile"))
        .expect("the block reconciles");
    for key in &unknown {
        assert!(reconcile.2.contains(key.as_str()), "{key} looked up: {all}");
    }
    assert!(
        !reconcile.2.contains("not looked up (no provider routed)"),
        "after the route nothing is left unrouted: {all}"
    );
    assert!(checks[1].2.contains("every check passed"), "{all}");
    // Final verdicts: the charged unknown applied, the other not applied, nothing open.
    assert!(last.contains("nothing is still open"), "{last}");
    let verdicts = Command::new(bin)
        .arg("--data-dir")
        .arg(&data)
        .args([
            "lookup",
            "--tenant",
            "acme",
            "--format",
            "json",
            unknown[0].as_str(),
        ])
        .env("RECKON_LOG", "warn")
        .output()
        .unwrap();
    let verdicts = String::from_utf8_lossy(&verdicts.stdout);
    assert!(verdicts.contains("applied"), "{verdicts}");
}
