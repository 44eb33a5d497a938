//! `reckon demo` as a newcomer runs it: nothing configured, a fresh data directory. Within
//! seconds it serves unresolved effects, resolved ones with the provider's evidence (one
//! charged, one charged twice, one never charged), and `/metrics` with the ledger's gauges
//! and the reconciler's outcome counters; and its dashboard, signed in with the password it
//! prints, shows them on its pages.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

struct Demo(Child);

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn after<'a>(banner: &'a str, marker: &str) -> &'a str {
    banner
        .split(marker)
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("the banner has no {marker:?}: {banner}"))
}

async fn get(url: &str, token: &str) -> (u16, String) {
    let auth = format!("Bearer {token}");
    let r = reckon_providers::GetClient::shared()
        .get(
            &url::Url::parse(url).unwrap(),
            &[("Authorization", auth.as_str())],
        )
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e:?}"));
    (r.status, String::from_utf8(r.body).unwrap())
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// Sign in through the form as a browser would (same origin), and return the session
/// cookie.
async fn sign_in(base: &str, email: &str, password: &str) -> String {
    let r = client()
        .post(format!("{base}/signin"))
        .header("origin", base)
        .header("sec-fetch-site", "same-origin")
        .form(&[("email", email), ("password", password)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303, "sign-in: {:?}", r.text().await);
    r.headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|c| c.starts_with("__Host-reckon_session="))
        .and_then(|c| c.split(';').next())
        .expect("a session cookie")
        .to_owned()
}

/// A dashboard page's HTML (200, or the test fails with the page).
async fn page(base: &str, cookie: &str, path: &str) -> String {
    let r = client()
        .get(format!("{base}{path}"))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body = r.text().await.unwrap();
    assert_eq!(status, 200, "{path}: {body}");
    body
}

#[tokio::test(flavor = "multi_thread")]
async fn the_demo_serves_unresolved_effects_verdicts_with_evidence_and_metrics() {
    let cwd = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_reckon"))
        .args(["demo", "--listen", "127.0.0.1:0"])
        .current_dir(cwd.path())
        .env_remove("RECKON_DATABASE_URL")
        // The schedule checks every second, so its audit of yesterday runs within the test.
        .env("RECKON_AUDIT_CHECK_SECS", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start reckon demo");
    let out = child.stdout.take().unwrap();
    let demo = Demo(child);
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
        .recv_timeout(Duration::from_secs(60))
        .expect("the demo printed its banner");
    let ready_after = started.elapsed();
    let token = after(&banner, "admin API token: ");
    let metrics_token =
        after(&banner, "metrics: curl -H 'Authorization: Bearer ").trim_end_matches('\'');
    let base = after(&banner, "health: ")
        .trim_end_matches("/healthz")
        .to_owned();
    assert!(banner.contains("admin@demo.invalid"), "{banner}");

    // Unresolved effects, oldest kinds both present.
    let (status, body) = get(&format!("{base}/api/v1/effects?unresolved=true"), token).await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let unresolved = v["effects"].as_array().unwrap();
    assert!(
        !unresolved.is_empty(),
        "no unresolved effect in the demo: {body}"
    );

    // The planted unknowns got their verdicts, with the provider's objects as evidence.
    for (order, outcome) in [
        ("ORD-1017", "applied"),
        ("ORD-1101", "duplicate"),
        ("ORD-1063", "not_applied"),
        ("ORD-1040", "applied"),
        ("ORD-1088", "not_applied"),
    ] {
        let (status, body) = get(
            &format!("{base}/api/v1/effects/shop/charge%3Av1%3A{order}"),
            token,
        )
        .await;
        assert_eq!(status, 200, "{order}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        let r = &v["reconcile"]["resolution"];
        assert_eq!(r["outcome"], outcome, "{order}: {body}");
        assert_eq!(r["author"], "reconciler", "{order}");
        if outcome != "not_applied" {
            assert!(
                r["evidence"].to_string().contains("demo_ch_"),
                "{order}: no object id in {r}"
            );
        } else {
            assert!(
                r["evidence"].to_string().contains("certificate"),
                "{order}: {r}"
            );
        }
    }

    // Yesterday's audit: the planted duplicate and orphan, with the CSV for finance.
    let (status, body) = get(&format!("{base}/api/v1/audits"), token).await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let run = v["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["triggered_by"] == "operator")
        .unwrap_or_else(|| panic!("no operator run: {body}"));
    assert_eq!(run["status"], "complete", "{body}");
    let (status, body) = get(&format!("{base}/api/v1/audits/{}", run["id"]), token).await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let findings = v["run"]["findings"].as_array().expect("findings");
    let has = |kind: &str, key: &str| {
        findings
            .iter()
            .any(|f| f["kind"] == kind && f.to_string().contains(key))
    };
    assert!(
        has("duplicate", "ORD-1101"),
        "no duplicate for ORD-1101: {body}"
    );
    assert!(
        has("orphan", "\"amount\":4900"),
        "no orphan of 49.00: {body}"
    );
    // Finance's CSV of it: each row says whom the money concerns, which charge, how much,
    // and what to do; reckon's verdict sits beside the shop's state.
    let (status, text) = get(
        &format!("{base}/api/v1/audits/{}?format=csv", run["id"]),
        token,
    )
    .await;
    assert_eq!(status, 200, "{text}");
    eprintln!("the demo's audit CSV:\n{text}");
    let mut rd = csv::Reader::from_reader(text.as_bytes());
    let header: Vec<String> = rd.headers().unwrap().iter().map(str::to_owned).collect();
    let rows: Vec<csv::StringRecord> = rd.records().map(|r| r.unwrap()).collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| h == name)
            .unwrap_or_else(|| panic!("no {name} column: {header:?}"))
    };
    let row = |kind: &str, needle: &str| {
        rows.iter()
            .find(|r| &r[col("kind")] == kind && r.iter().any(|c| c.contains(needle)))
            .unwrap_or_else(|| panic!("no {kind} row naming {needle}: {text}"))
    };
    let dup = row("duplicate", "ORD-1101");
    let action = &dup[col("action")];
    assert!(
        action.starts_with("Refund demo_ch_")
            && action.contains(" to cus_demo_1101 (order ORD-1101)"),
        "{dup:?}"
    );
    assert_eq!(&dup[col("customer")], "cus_demo_1101");
    assert!(
        dup[col("at_stake")].starts_with("charged twice: "),
        "{dup:?}"
    );
    assert_eq!(&dup[col("effect_states")], "unknown");
    assert_eq!(&dup[col("effect_verdicts")], "duplicate");
    let orphan = row("orphan", "ORD-9001");
    assert!(
        orphan[col("action")].contains("(49.00 USD)")
            && orphan[col("action")].contains("refund it to cus_demo_9001"),
        "{orphan:?}"
    );
    let missing = row("missing", "ORD-1075");
    assert!(
        missing[col("action")]
            .starts_with("Check order ORD-1075 in the shop before telling the customer"),
        "{missing:?}"
    );
    // The reclaim charged once: nothing at stake.
    let reclaim = row("risky_reclaim", "ORD-1052");
    assert_eq!(&reclaim[col("at_stake")], "", "{reclaim:?}");
    for r in &rows {
        if &r[col("kind")] != "total" {
            assert!(
                !r[col("action")].is_empty(),
                "a finding with nothing to do: {r:?}"
            );
        }
    }
    // ORD-1017 was unknown at the source, but reckon resolved it: not unresolved any more;
    // the refund routed to the provider that is down is not in this provider's audit.
    assert!(
        !has("unresolved", "ORD-1017"),
        "a resolved effect listed unresolved: {body}"
    );

    // /metrics for the operator: the ledger's gauges and the reconciler's counters.
    let (status, metrics) = get(&format!("{base}/metrics"), metrics_token).await;
    assert_eq!(status, 200, "{metrics}");
    for series in [
        "reckon_unresolved_effects{",
        "reckon_oldest_unresolved_age_seconds{",
        "reckon_source_last_scan_success_timestamp_seconds{",
        "reckon_reconcile_outcomes_total{",
        "reckon_provider_request_duration_seconds_count{",
    ] {
        assert!(metrics.contains(series), "/metrics lacks {series}");
    }
    assert!(
        metrics.contains(r#"outcome="duplicate""#),
        "the duplicate verdict is not counted"
    );
    // The dashboard, as the banner tells a newcomer: sign in with the printed password and
    // read the pages.
    let password = after(&banner, "(admin@demo.invalid / ").trim_end_matches(')');
    let cookie = sign_in(&base, "admin@demo.invalid", password).await;
    let read = |path: &'static str| {
        let (base, cookie) = (base.clone(), cookie.clone());
        async move { page(&base, &cookie, path).await }
    };
    let overview = read("/t/demo").await;
    assert!(
        overview.contains("Unresolved now") && overview.contains("class=\"card\" data-kind="),
        "no unresolved effects on the overview: {overview}"
    );
    let queue = read("/t/demo/queue").await;
    // The refunds routed to the provider that is down stay unresolved, with their ages.
    assert!(queue.contains("refund:v1:"), "{queue}");
    let effect = read("/t/demo/effects/shop/charge:v1:ORD-1101").await;
    assert!(
        effect.contains("duplicate") && effect.contains("demo_ch_"),
        "the duplicate's verdict and evidence are not on its page: {effect}"
    );
    let lookup = read("/t/demo/lookup?q=ORD-1017").await;
    assert!(lookup.contains("charge:v1:ORD-1017"), "{lookup}");
    // Yesterday's audit, the page finance opens in the morning: the duplicate and the orphan.
    let audit = read("/t/demo/audit").await;
    assert!(audit.contains("(yesterday)"), "{audit}");
    let group = |kind: &str| {
        audit
            .split(&format!("data-kind=\"{kind}\""))
            .nth(1)
            .map_or_else(
                || panic!("no {kind} findings on the audit page: {audit}"),
                |g| g.split("</section>").next().unwrap_or_default().to_owned(),
            )
    };
    assert!(group("duplicate").contains("ORD-1101"), "{audit}");
    assert!(group("orphan").contains("49.00"), "{audit}");

    // The support lookup says what reckon found, on the orders that once misled it.
    for (order, verdict, says) in [
        ("ORD-1075", "missing", "no charge for it"),
        ("ORD-1063", "not_applied", "Not charged"),
        ("ORD-1017", "applied", "Charged once"),
        ("ORD-1101", "duplicate", "Charged twice"),
    ] {
        let (status, body) = get(&format!("{base}/api/v1/lookup?q={order}"), token).await;
        assert_eq!(status, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        let charge = v["effects"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["operation"] == "charge")
            .unwrap_or_else(|| panic!("{order}: {body}"));
        assert_eq!(charge["verdict"], verdict, "{order}: {charge:#}");
        assert!(
            charge["sentence"].as_str().unwrap().contains(says),
            "{order}: {charge:#}"
        );
        let html = page(&base, &cookie, &format!("/t/demo/lookup?q={order}")).await;
        assert!(
            html.contains(&format!("data-verdict=\"{verdict}\"")),
            "{order}: {html}"
        );
    }

    // The nightly schedule audits yesterday over every provider: demo-pay's part complete
    // with its findings, the in-house ledger's failed with its reason, and the day partial.
    let deadline = Instant::now() + Duration::from_secs(30);
    let scheduled = loop {
        let (_, body) = get(&format!("{base}/api/v1/audits"), token).await;
        let v: Value = serde_json::from_str(&body).unwrap();
        if let Some(r) = v["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["triggered_by"] == "schedule")
        {
            break r.clone();
        }
        assert!(Instant::now() < deadline, "no scheduled run: {body}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(scheduled["status"], "partial", "{scheduled:#}");
    let (_, body) = get(&format!("{base}/api/v1/audits/{}", scheduled["id"]), token).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    let parts = v["run"]["evidence"]["providers"].as_array().unwrap();
    let part = |name: &str| {
        parts
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no part for {name}: {body}"))
    };
    assert_eq!(part("demo-pay")["status"], "complete", "{body}");
    assert_eq!(part("legacy-ledger")["status"], "failed", "{body}");
    assert!(
        part("legacy-ledger")["reason"]
            .as_str()
            .unwrap()
            .contains("legacy-ledger"),
        "{body}"
    );
    assert!(
        v["run"]["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["kind"] == "duplicate"),
        "the working provider's findings are published: {body}"
    );
    // The overview's reading is cached for 2 s: wait out the copy read before the run.
    let deadline = Instant::now() + Duration::from_secs(10);
    let overview = loop {
        let o = read("/t/demo").await;
        if o.contains("id=\"audit-failure\"") || Instant::now() > deadline {
            break o;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(
        !overview.contains("id=\"audit-failed\""),
        "the overview calls the day failed: {overview}"
    );
    assert!(
        overview.contains("id=\"audit-failure\"") && overview.contains("legacy-ledger"),
        "the overview does not show the failed provider beside the findings: {overview}"
    );
    assert!(
        overview.contains("data-finding=\"duplicate\""),
        "{overview}"
    );
    // Two runs of the day now (the operator's, complete; the schedule's, partial): the
    // overview and the audit page show the same one.
    let run_of = |html: &str, anchor: &str| -> Option<String> {
        Some(
            html.split(anchor)
                .nth(1)?
                .split("data-run=\"")
                .nth(1)?
                .split('"')
                .next()?
                .to_owned(),
        )
    };
    let day_page = read("/t/demo/audit").await;
    let on_overview = run_of(&overview, "id=\"audit-summary\"");
    assert!(on_overview.is_some(), "{overview}");
    assert_eq!(
        on_overview,
        run_of(&day_page, "id=\"audit-report\""),
        "the overview and the audit page show different runs of {}",
        scheduled["day"]
    );
    // The scheduled run's page names the failed provider's part and its reason.
    let audit = page(
        &base,
        &cookie,
        &format!(
            "/t/demo/audit?day={}&run={}",
            scheduled["day"].as_str().unwrap(),
            scheduled["id"]
        ),
    )
    .await;
    assert!(
        audit.contains("data-failed-provider=\"legacy-ledger\""),
        "{audit}"
    );

    assert!(
        ready_after < Duration::from_secs(30),
        "the demo took {ready_after:?} to be ready"
    );
    eprintln!("demo ready after {ready_after:?}");
    drop(demo);
}
