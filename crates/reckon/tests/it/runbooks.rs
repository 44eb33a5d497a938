//! Every `reckon …` command in docs/runbooks.md runs, as written, against a running demo's
//! ledger and succeeds: the commands are read out of the markdown (code spans and `sh`
//! blocks), the alert's labels and the other variables the runbooks name are set to the
//! demo's values, and `reckon` is the prefix the demo's banner prints. A step marked
//! *read-only* must use a command that changes nothing.
#![allow(
    clippy::string_slice,
    reason = "the texts sliced here are the tests' own ASCII: URLs, templates, tokens, HTTP heads"
)]

use crate::support;

use serde_json::Value;
use support::{Demo, ok};

const RUNBOOKS: &str = include_str!("../../../../docs/runbooks.md");

/// Code spans that name a command without asking anyone to run it here: the service itself
/// (the demo is running it), the demo, and `reckon audit` named as what not to run.
const MENTIONS: &[&str] = &["reckon serve", "reckon demo", "reckon audit"];

/// The commands (subcommand words, before any option or value) that only read.
const READ_ONLY: &[&str] = &[
    "tenant list",
    "token list",
    "source list",
    "provider list",
    "route list",
    "lookup",
    "audit list",
    "audit show",
    "audit verify",
    "audit settings",
    "writeback list",
];

#[derive(Debug, Clone, Copy, PartialEq)]
enum Marker {
    ReadOnly,
    Acts,
}

#[derive(Debug)]
struct Step {
    command: String,
    /// The nearest *read-only* / *acts* before it in its bullet or paragraph.
    marker: Option<Marker>,
}

fn marker_in(text: &str) -> Option<Marker> {
    let r = text.rfind("*read-only*");
    let a = text.rfind("*acts*");
    match (r, a) {
        (Some(r), Some(a)) if r > a => Some(Marker::ReadOnly),
        (Some(_), None) => Some(Marker::ReadOnly),
        (_, Some(_)) => Some(Marker::Acts),
        (None, None) => None,
    }
}

/// The commands and mentions of one run of prose (bullets and paragraphs).
fn flush(prose: &mut String, steps: &mut Vec<Step>, mentions: &mut Vec<String>) {
    // Each bullet or paragraph is its own context for the markers.
    for block in prose.split("\n- ") {
        let parts: Vec<&str> = block.split('`').collect();
        for (i, span) in parts.iter().enumerate().skip(1).step_by(2) {
            let span = span.split_whitespace().collect::<Vec<_>>().join(" ");
            if !span.starts_with("reckon ") {
                continue;
            }
            if MENTIONS.contains(&span.as_str()) {
                mentions.push(span);
                continue;
            }
            let before = parts[..i].join("`");
            steps.push(Step {
                command: span,
                marker: marker_in(&before),
            });
        }
    }
    prose.clear();
}

/// `reckon …` commands of the markdown: every code span that starts with `reckon ` (a span
/// may wrap across lines), and in fenced blocks every line's command from its `reckon `
/// word (after `docker compose exec …` or `kubectl exec … --`), without a trailing comment.
/// Also the spans that are only mentions (`MENTIONS`), to check that list.
fn steps(md: &str) -> (Vec<Step>, Vec<String>) {
    let mut steps = Vec::new();
    let mut mentions = Vec::new();
    let mut prose = String::new();
    let mut in_fence = false;
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            let words = format!(" {line}");
            // The last `reckon ` word: `kubectl -n reckon exec … -- reckon …` names it twice.
            if let Some(at) = words.rfind(" reckon ") {
                let cmd = &words[at + 1..];
                let cmd = cmd.split(" #").next().unwrap().trim();
                steps.push(Step {
                    command: cmd.to_owned(),
                    marker: None,
                });
            }
            continue;
        }
        if line.trim().is_empty() || line.starts_with('#') {
            flush(&mut prose, &mut steps, &mut mentions);
        }
        prose.push('\n');
        prose.push_str(line);
    }
    flush(&mut prose, &mut steps, &mut mentions);
    (steps, mentions)
}

/// The subcommand words of a command line: up to the first option or quoted value.
fn subcommand(cmd: &str) -> String {
    cmd.split_whitespace()
        .skip(1)
        .take_while(|w| !w.starts_with('-') && !w.starts_with('"'))
        .take(2)
        .filter(|w| w.chars().all(|c| c.is_ascii_lowercase()))
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn the_extraction_finds_spans_blocks_and_markers() {
    let md = "Intro `reckon a\nb --x` then *acts*: `reckon c`.\n\n```sh\nfoo exec r-1 reckon d e   # note\nk -n reckon exec x -- reckon h\n```\n\n- *read-only*: `reckon f` and `reckon serve`\n- `reckon g`, `reckon_metric`\n";
    let (s, m) = steps(md);
    let got: Vec<(&str, Option<Marker>)> =
        s.iter().map(|s| (s.command.as_str(), s.marker)).collect();
    assert_eq!(
        got,
        [
            ("reckon a b --x", None),
            ("reckon c", Some(Marker::Acts)),
            ("reckon d e", None),
            ("reckon h", None),
            ("reckon f", Some(Marker::ReadOnly)),
            ("reckon g", None),
        ]
    );
    assert_eq!(m, ["reckon serve"]);
    assert_eq!(
        subcommand("reckon audit show --tenant \"$T\" 3"),
        "audit show"
    );
    assert_eq!(
        subcommand("reckon lookup --tenant \"$T\" \"$ORDER\""),
        "lookup"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn every_runbook_command_runs_against_the_demo() {
    let (steps, mentions) = steps(RUNBOOKS);
    assert!(steps.len() >= 20, "too few commands found: {steps:#?}");
    for m in MENTIONS {
        assert!(
            mentions.iter().any(|x| x == m),
            "{m} is no longer in the runbooks: drop it from MENTIONS"
        );
    }
    // Read-only steps use read-only commands (`audit show`, not a new `audit` run).
    for s in &steps {
        if s.marker == Some(Marker::ReadOnly) {
            let sub = subcommand(&s.command);
            assert!(
                READ_ONLY.contains(&sub.as_str())
                    && !s.command.contains("--time-zone")
                    && !s.command.contains("--at"),
                "a read-only step runs {:?}, which acts",
                s.command
            );
        }
    }

    let dir = tempfile::tempdir().unwrap();
    let demo = Demo::start(&dir.path().join("data"));
    // The values an alert would carry, from the demo: its tenant, source and provider, the
    // refund parked because its provider is down (what ReckonNeedsAttention is about),
    // a charge's order id, and the demo's audit of yesterday.
    let token = demo.word_after("admin API token: ").to_owned();
    let base = demo
        .word_after("health: ")
        .trim_end_matches("/healthz")
        .to_owned();
    let auth = format!("Bearer {token}");
    let r = reckon_providers::GetClient::shared()
        .get(
            &url::Url::parse(&format!(
                "{base}/api/v1/effects?unresolved=true&operation=refund"
            ))
            .unwrap(),
            &[("Authorization", auth.as_str())],
        )
        .await
        .unwrap();
    let effects: Value = serde_json::from_slice(&r.body).unwrap();
    let key = effects["effects"][0]["key"]
        .as_str()
        .unwrap_or_else(|| panic!("no unresolved refund in the demo: {effects}"))
        .to_owned();
    let runs: Value = serde_json::from_str(&ok(
        "audit list",
        demo.sh("reckon audit list --tenant demo --format json", &[]),
    ))
    .unwrap();
    let run_id = runs[0]["id"].to_string();
    let day = runs[0]["day"].as_str().unwrap().to_owned();
    let env = [
        ("TENANT", "demo"),
        ("SOURCE", "shop"),
        ("OPERATION", "charge"),
        ("PROVIDER", "demo-pay"),
        ("KEY", key.as_str()),
        ("ORDER", "ORD-1017"),
        ("DAY", day.as_str()),
        ("RUN_ID", run_id.as_str()),
    ];

    let mut failed = Vec::new();
    for s in &steps {
        let out = demo.sh(&s.command, &env);
        if !out.status.success() {
            failed.push(format!(
                "{} ({}): {}",
                s.command,
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "runbook commands that fail:\n{}",
        failed.join("\n")
    );
    eprintln!("{} runbook commands ran", steps.len());

    // The API call the runbooks list effects with, made with the token the runbooks tell
    // people to create for it: the role they name must be allowed to make the call.
    let create = steps
        .iter()
        .map(|s| s.command.as_str())
        .find(|c| c.starts_with("reckon token create"))
        .expect("the runbooks say how to make the API token");
    let listed = RUNBOOKS
        .split('`')
        .find(|span| {
            span.starts_with("curl -H \"Authorization: Bearer $TOKEN\" \"$RECKON/api/v1/effects")
        })
        .expect("the runbooks list effects through the API");
    let path = listed
        .split("\"$RECKON")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .replace("$SOURCE", "shop")
        .replace("$OPERATION", "charge");
    let made = ok(create, demo.sh(create, &env));
    let runbook_token = made.trim();
    let r = reckon_providers::GetClient::shared()
        .get(
            &url::Url::parse(&format!("{base}{path}")).unwrap(),
            &[("Authorization", format!("Bearer {runbook_token}").as_str())],
        )
        .await
        .unwrap();
    assert_eq!(
        r.status,
        200,
        "{listed} with the token of `{create}`: {}",
        String::from_utf8_lossy(&r.body)
    );
}
