//! The scrub's two passes over a chain: re-linked when it verified, scrubbed in place when it
//! did not (so the break stays visible).

use reckon_audit::chain::{
    AuditRun, ChainLink, ChainWalk, NewAuditRun, run_digest, verify_chain, verify_links,
};
use reckon_domain::Redactor;
use serde_json::{Value, json};

const KEY: &str = "rk_live_51HxYzAbCdEf";

fn run(reason: Option<&str>, evidence: Value) -> NewAuditRun {
    NewAuditRun {
        day: "2026-11-30".into(),
        time_zone: "UTC".into(),
        window_start: 0.0,
        window_end: 86400.0,
        provider: "*".into(),
        triggered_by: "schedule".into(),
        status: "failed".into(),
        reason: reason.map(str::to_owned),
        started_at: 1.0,
        finished_at: 2.0,
        counts: json!({}),
        findings: json!([]),
        totals: json!({}),
        evidence,
    }
}

fn chain(tenant: i64, runs: Vec<NewAuditRun>) -> Vec<AuditRun> {
    let mut prev = String::new();
    runs.into_iter()
        .enumerate()
        .map(|(i, run)| {
            let seq = i as i64 + 1;
            let digest = run_digest(tenant, seq, &prev, &run);
            let prev_digest = std::mem::replace(&mut prev, digest.clone());
            AuditRun {
                id: 100 + seq,
                seq,
                run,
                prev_digest,
                digest,
            }
        })
        .collect()
}

/// Both passes over `runs`, the edits applied: what the ledger would hold after.
fn scrub(tenant: i64, runs: &[AuditRun], r: &Redactor) -> (Vec<AuditRun>, Vec<i64>) {
    let mut walk = ChainWalk::new();
    for x in runs {
        walk.verify(tenant, x);
    }
    let intact = walk.broken.is_empty();
    let broken = walk.broken.clone();
    let out = runs
        .iter()
        .map(|x| match walk.relink(tenant, x, r, intact) {
            Some(e) => AuditRun {
                id: e.id,
                seq: x.seq,
                run: e.run,
                prev_digest: e.prev_digest,
                digest: e.digest,
            },
            None => x.clone(),
        })
        .collect();
    (out, broken)
}

#[test]
fn a_scrubbed_chain_verifies_and_keeps_the_runs_before_the_first_change() {
    let t = 7;
    let runs = chain(
        t,
        vec![
            run(None, json!({"pages": 1})),
            run(
                Some(&format!("provider p: 401 Invalid API Key provided: {KEY}")),
                json!({}),
            ),
            run(
                None,
                json!({"providers": [{"reason": format!("echo {KEY}")}]}),
            ),
            run(None, json!({"pages": 4})),
        ],
    );
    assert!(verify_chain(t, &runs).is_empty());
    let (after, broken) = scrub(t, &runs, &Redactor::new([KEY]));
    assert!(broken.is_empty());
    assert!(
        verify_chain(t, &after).is_empty(),
        "the re-linked chain verifies"
    );
    assert_eq!(
        after[0], runs[0],
        "a run before the first change is untouched"
    );
    assert_ne!(after[3].digest, runs[3].digest, "a later run is re-linked");
    assert_eq!(after[3].run, runs[3].run, "with its content as it was");
    let text = serde_json::to_string(&after).unwrap();
    assert!(!text.contains(KEY), "{text}");
    assert!(text.contains("[redacted]"));
}

#[test]
fn a_chain_broken_before_is_scrubbed_but_not_relinked() {
    let t = 7;
    let mut runs = chain(
        t,
        vec![
            run(None, json!({"pages": 1})),
            run(Some(&format!("echo {KEY}")), json!({})),
        ],
    );
    runs[0].run.evidence = json!({"pages": 2}); // edited after it was stored
    let (after, broken) = scrub(t, &runs, &Redactor::new([KEY]));
    assert_eq!(broken, vec![1]);
    assert_eq!(after[1].digest, runs[1].digest, "not re-linked");
    assert_eq!(after[1].run.reason.as_deref(), Some("echo [redacted]"));
    assert!(
        !verify_chain(t, &after).is_empty(),
        "the break stays visible"
    );
}

fn link(id: i64, seq: i64, prev: &str, digest: &str) -> ChainLink {
    ChainLink {
        id,
        seq,
        prev_digest: prev.into(),
        digest: digest.into(),
    }
}

#[test]
fn links_break_where_a_run_was_removed_or_relinked() {
    let chain = [
        link(1, 1, "", "a"),
        link(2, 2, "a", "b"),
        link(3, 3, "b", "c"),
    ];
    assert!(verify_links(&chain).is_empty());
    // The middle run removed: the third is out of place and names a digest not before it.
    let removed = [chain[0].clone(), chain[2].clone()];
    let breaks = verify_links(&removed);
    assert_eq!(breaks.len(), 2, "{breaks:?}");
    assert!(breaks.iter().all(|b| b.id == 3));
    // A run relinked to another predecessor.
    let relinked = [chain[0].clone(), link(2, 2, "x", "b"), chain[2].clone()];
    let breaks = verify_links(&relinked);
    assert_eq!(breaks.iter().map(|b| b.id).collect::<Vec<_>>(), [2]);
}

#[test]
fn the_run_of_a_day_is_its_newest_complete_else_newest_partial_else_newest() {
    use reckon_audit::chain::run_of_the_day;
    let pick = |runs: &[(&'static str, i64)]| run_of_the_day(runs, |r| r.0, |r| r.1).map(|r| r.1);
    assert_eq!(pick(&[]), None);
    assert_eq!(pick(&[("failed", 1), ("failed", 2)]), Some(2));
    assert_eq!(pick(&[("partial", 1), ("failed", 2)]), Some(1));
    // A newer partial re-run does not take a complete run's place.
    assert_eq!(
        pick(&[("complete", 1), ("partial", 2), ("failed", 3)]),
        Some(1)
    );
    assert_eq!(
        pick(&[("complete", 3), ("complete", 1), ("partial", 2)]),
        Some(3)
    );
    assert_eq!(pick(&[("partial", 4), ("partial", 2)]), Some(4));
}

#[test]
fn the_newest_run_that_read_a_provider_says_whether_its_audit_is_failing() {
    use reckon_audit::chain::{AuditRunHead, failing_audits};
    let head = |provider: &str, status: &str, parts: Option<&[(&str, &str)]>| AuditRunHead {
        provider: provider.into(),
        status: status.into(),
        parts: parts.map(|ps| {
            ps.iter()
                .map(|(n, s)| ((*n).to_owned(), (*s).to_owned()))
                .collect()
        }),
    };
    let providers = ["pay".to_owned(), "ledger".to_owned()];
    let failing = |heads: &[AuditRunHead]| -> Vec<(String, bool)> {
        failing_audits(heads, &providers).into_iter().collect()
    };
    let state = |pairs: &[(&str, bool)]| -> Vec<(String, bool)> {
        let mut v: Vec<(String, bool)> = pairs.iter().map(|(n, f)| ((*n).to_owned(), *f)).collect();
        v.sort();
        v
    };
    // No run: nothing is failing.
    assert_eq!(
        failing(&[]),
        state(&[("*", false), ("ledger", false), ("pay", false)])
    );
    // The nightly run's part of pay failed; a later run of ledger alone completed.
    let heads = [
        head("ledger", "complete", None),
        head(
            "*",
            "partial",
            Some(&[("pay", "failed"), ("ledger", "complete")]),
        ),
    ];
    assert_eq!(
        failing(&heads),
        state(&[("*", false), ("ledger", false), ("pay", true)])
    );
    // A re-run of pay alone that read it whole ends pay's failure; an older failure
    // behind a newer completion is history.
    let mut newer = vec![head("pay", "complete", None)];
    newer.extend(heads.iter().cloned());
    assert_eq!(
        failing(&newer),
        state(&[("*", false), ("ledger", false), ("pay", false)])
    );
    // A nightly run that reached no provider fails under `*` until a nightly run reaches
    // them; it says nothing of each provider.
    let heads = [head("*", "failed", Some(&[])), head("*", "complete", None)];
    assert_eq!(
        failing(&heads),
        state(&[("*", true), ("ledger", false), ("pay", false)])
    );
    let heads = [
        head(
            "*",
            "failed",
            Some(&[("pay", "failed"), ("ledger", "failed")]),
        ),
        head("*", "failed", Some(&[])),
    ];
    assert_eq!(
        failing(&heads),
        state(&[("*", false), ("ledger", true), ("pay", true)])
    );
    // A provider no longer configured is not reported.
    let heads = [head(
        "*",
        "partial",
        Some(&[("gone", "failed"), ("pay", "complete")]),
    )];
    assert_eq!(
        failing(&heads),
        state(&[("*", false), ("ledger", false), ("pay", false)])
    );
}
