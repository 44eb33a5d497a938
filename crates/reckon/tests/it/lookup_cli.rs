//! `reckon lookup` as support runs it: the binary against an embedded ledger holding every
//! case of the answer (planted as the dashboard's and the API's tests plant them), in each
//! format: the table with its sentence and readable times, JSON (the API's answer), CSV; a
//! provider object id; and nothing found, which exits 1 and offers a near match.

use reckon_testkit::answer_cases;

use answer_cases::*;
use reckon_ledger::Keyring;
use serde_json::Value;
use std::path::Path;

async fn reckon(data: &Path, args: &[&str]) -> (i32, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_reckon"))
        .arg("--data-dir")
        .arg(data)
        .args(args)
        .env("RECKON_LOG", "warn")
        .output()
        .await
        .expect("run reckon");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn reckon_lookup_answers_every_case_in_every_format() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let keyring = Keyring::load_or_create_file(&data.join("master.key")).unwrap();
    let ledger = reckon_ledger::connect(None, &data, keyring).await.unwrap();
    let t = ledger.create_tenant("acme").await.unwrap();
    let cases = plant(ledger.clone(), &t).await;

    // (order, verdict, final, words of the sentence)
    let expect: &[(&str, &str, bool, &str)] = &[
        (APPLIED, "applied", true, "Charged once"),
        (NOT_APPLIED, "not_applied", true, "Not charged"),
        (DUPLICATE_RECONCILED, "duplicate", true, "Charged twice"),
        (PROVISIONAL, "applied", false, "Probably charged once"),
        (MISSING, "missing", false, "no charge for it"),
        (DUPLICATE_AUDIT, "duplicate", true, "$1,234.00"),
        (ABANDONED, "unknown", false, "worker stopped"),
        (UNROUTED, "unknown", false, "no provider is set up"),
        (BY_HAND, "applied", true, HAND_NOTE),
    ];
    for (order, verdict, is_final, says) in expect {
        let (code, out, err) = reckon(
            &data,
            &["lookup", "--tenant", "acme", order, "--format", "json"],
        )
        .await;
        assert_eq!(code, 0, "{order}: {err}");
        let a: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(a["effects"][0]["verdict"], *verdict, "{order}: {a:#}");
        assert_eq!(a["effects"][0]["final"], *is_final, "{order}: {a:#}");
        assert!(
            a["sentence"].as_str().unwrap().contains(says),
            "{order}: {a:#}"
        );

        let (code, out, err) = reckon(&data, &["lookup", "--tenant", "acme", order]).await;
        assert_eq!(code, 0, "{order}: {err}");
        assert!(out.contains(says), "{order}: the table's sentence: {out}");
        let v = match (*verdict, *is_final) {
            ("applied", false) => "applied (provisional)".to_owned(),
            (v, _) => v.to_owned(),
        };
        assert!(out.contains(&v), "{order}: {out}");
        // Readable times, never epoch seconds.
        assert!(out.contains(" UTC"), "{order}: {out}");
        assert!(
            !out.split_whitespace()
                .any(|w| w.len() >= 10 && w.parse::<f64>().is_ok_and(|x| x > 1e9)),
            "{order}: an epoch in the table: {out}"
        );

        let (code, out, err) = reckon(
            &data,
            &["lookup", "--tenant", "acme", order, "--format", "csv"],
        )
        .await;
        assert_eq!(code, 0, "{order}: {err}");
        let mut r = csv::Reader::from_reader(out.as_bytes());
        let headers = r.headers().unwrap().clone();
        let col = |name: &str| headers.iter().position(|h| h == name).unwrap();
        let row = r.records().next().expect("a row").unwrap();
        assert_eq!(&row[col("verdict")], *verdict, "{order}: {out}");
        assert!(row[col("sentence")].contains(says), "{order}: {out}");
    }

    // The orphan charge, found by its order id in its metadata.
    let (code, out, _) = reckon(&data, &["lookup", "--tenant", "acme", ORPHAN]).await;
    assert_eq!(code, 0);
    assert!(
        out.contains("demo_ch_orphan") && out.contains("$49.00"),
        "{out}"
    );
    assert!(out.contains("(no effect)"), "{out}");

    // By a provider object id.
    let (code, out, _) = reckon(
        &data,
        &[
            "lookup",
            "--tenant",
            "acme",
            &cases.duplicate_refund,
            "--format",
            "json",
        ],
    )
    .await;
    assert_eq!(code, 0);
    let a: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(a["matched_by"], "provider_object");
    assert_eq!(
        a["effects"][0]["key"],
        format!("charge:v1:{DUPLICATE_AUDIT}")
    );

    // Nothing found: exit 1, with the near match offered.
    let (code, out, _) = reckon(
        &data,
        &["lookup", "--tenant", "acme", &APPLIED.to_lowercase()],
    )
    .await;
    assert_eq!(code, 1, "nothing found exits 1: {out}");
    assert!(out.contains(&format!("Did you mean “{APPLIED}”")), "{out}");
    let (code, out, _) = reckon(&data, &["lookup", "--tenant", "acme", NOBODY_HAS]).await;
    assert_eq!(code, 1);
    assert!(out.starts_with("Nothing found"), "{out}");
}
