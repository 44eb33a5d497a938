//! The shipped alert rules, evaluated by a real Prometheus (Debian's `prometheus`) scraping
//! a running `reckon serve`, in the state the rules exist for: an old backlog, effects
//! parked for a person, an effect routed to no provider, a provider that answers only 404,
//! routed effects inside and past their replay window, a nightly audit whose part failed.
//! Each expected alert fires, labelled as the rules say, with a description that carries its
//! value and an absolute runbook link; an unrouted effect never raises a replay-window alert.
//! Then reckon is killed: the per-instance ReckonDown fires within a minute while the backlog
//! alerts keep firing (the rules hold the last value when no replica answers).
//!
//! The rules are the shipped file with one change: every `for:` in minutes is cut to 1s, so
//! a test does not wait 5 to 15 minutes per alert. The 30 s ones (ReckonDown,
//! ReckonMetricsCollectorDown) are kept, so "down within a minute" is the shipped rule's.
//! Every expression is the shipped one, byte for byte.
#![allow(
    clippy::string_slice,
    reason = "the texts sliced here are the tests' own ASCII: URLs, templates, tokens, HTTP heads"
)]

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const EGRESS: &str = r#"["127.0.0.1/32"]"#;

fn reckon(data: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_reckon"));
    c.arg("--data-dir")
        .arg(data)
        .env("RECKON_LOG", "warn")
        .env("RECKON_EGRESS_ALLOW", EGRESS)
        .env_remove("RECKON_DATABASE_URL")
        .env_remove("RECKON_MASTER_KEY")
        .env_remove("RECKON_DATA_DIR");
    c
}

fn ok(c: &mut Command) -> String {
    let out = c.output().expect("run reckon");
    assert!(
        out.status.success(),
        "{c:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The shipped rules with the minutes of `for:` cut to 1s; nothing else changes.
fn rules_for_the_test() -> String {
    let shipped = std::fs::read_to_string(root().join("deploy/prometheus/alerts.yml")).unwrap();
    let mut cut = 0;
    let out: Vec<String> = shipped
        .lines()
        .map(|l| {
            let t = l.trim_start();
            match t.strip_prefix("for: ") {
                Some(d) if d.ends_with('m') => {
                    cut += 1;
                    format!("{}for: 1s", &l[..l.len() - t.len()])
                }
                _ => l.to_owned(),
            }
        })
        .collect();
    assert!(cut >= 10, "only {cut} `for:` durations found in minutes");
    out.join("\n") + "\n"
}

async fn alerts(client: &reqwest::Client, prom: u16) -> Vec<Value> {
    let Ok(r) = client
        .get(format!("http://127.0.0.1:{prom}/api/v1/alerts"))
        .send()
        .await
    else {
        return vec![];
    };
    let body = r.text().await.unwrap_or_default();
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    v["data"]["alerts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a["state"] == "firing")
        .collect()
}

/// What one alert must look like: its name, labels it must carry, and words its
/// description must contain (the value and the next step).
struct Want {
    alert: &'static str,
    labels: &'static [(&'static str, &'static str)],
    description: &'static [&'static str],
}

fn matches(a: &Value, w: &Want) -> bool {
    a["labels"]["alertname"] == w.alert && w.labels.iter().all(|(k, v)| a["labels"][*k] == *v)
}

fn check(a: &Value, w: &Want, runbooks: &str) {
    let d = a["annotations"]["description"].as_str().unwrap_or("");
    for words in w.description {
        assert!(d.contains(words), "{}: {words:?} not in {d:?}", w.alert);
    }
    assert!(d.contains("Next:"), "{}: {d}", w.alert);
    let runbook = a["annotations"]["runbook_url"].as_str().unwrap_or("");
    // The page and the warning about one backlog share a section.
    let anchor = w.alert.to_lowercase();
    let anchor = anchor.strip_suffix("page").unwrap_or(&anchor);
    assert_eq!(
        runbook,
        format!("{runbooks}#{anchor}"),
        "{}: an absolute runbook link",
        w.alert
    );
}

fn summary(firing: &[Value]) -> String {
    firing
        .iter()
        .map(|a| {
            format!(
                "{} {} :: {}",
                a["labels"]["alertname"],
                a["labels"],
                a["annotations"]["description"].as_str().unwrap_or("")
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_shipped_alerts_fire_on_a_real_prometheus_and_hold_when_reckon_dies() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");

    // The in-house ledger service that is down: the demo provider's `down/` path answers
    // 404 to every lookup and listing.
    let (provider_url, _provider) =
        reckon_providers::demo::serve_loopback(reckon_providers::demo::DemoState::new())
            .await
            .unwrap();
    ok(reckon(&data).args(["tenant", "create", "acme"]));
    ok(reckon(&data).args([
        "source", "add", "--tenant", "acme", "--name", "shop", "--kind", "push",
    ]));
    ok(reckon(&data).args([
        "provider",
        "add",
        "--tenant",
        "acme",
        "--name",
        "legacy",
        "--kind",
        "http",
        "--settings",
        &format!(r#"{{"base_url": "{provider_url}down/"}}"#),
    ]));
    // Charges go to the down service; receipts have no provider to ask.
    ok(reckon(&data).args([
        "route",
        "set",
        "--tenant",
        "acme",
        "--source",
        "shop",
        "--operation",
        "charge",
        "--provider",
        "legacy",
    ]));
    ok(reckon(&data).args([
        "route",
        "set",
        "--tenant",
        "acme",
        "--source",
        "shop",
        "--operation",
        "send_receipt",
        "--none",
    ]));
    // The nightly audit is due from midnight: the server's first check runs yesterday, and
    // the down service's part fails.
    ok(reckon(&data).args([
        "audit",
        "settings",
        "--tenant",
        "acme",
        "--time-zone",
        "UTC",
        "--at",
        "00:00",
    ]));
    let token = ok(reckon(&data).args(["token", "create", "--tenant", "acme", "--role", "admin"]))
        .trim()
        .to_owned();

    let (port, mport) = (free_port(), free_port());
    let mut server = Killed(
        reckon(&data)
            .arg("serve")
            .env("RECKON_LISTEN", format!("127.0.0.1:{port}"))
            .env("RECKON_METRICS_LISTEN", format!("127.0.0.1:{mport}"))
            .env("RECKON_AUDIT_CHECK_SECS", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    // rustls is built without a bundled crypto provider: reckon's own client installs ring,
    // the process's one, before this test builds its plain-HTTP client.
    let _ = reckon_providers::GetClient::shared();
    let client = reqwest::Client::new();
    let push = |records: Value| {
        let client = client.clone();
        let token = token.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let sent = client
                    .post(format!(
                        "http://127.0.0.1:{port}/api/v1/effects?source=shop"
                    ))
                    .bearer_auth(&token)
                    .header("content-type", "application/json")
                    .body(records.to_string())
                    .send()
                    .await;
                match sent {
                    Ok(r) if r.status() == 200 => return,
                    Ok(r) => panic!("push: {} {:?}", r.status(), r.text().await),
                    Err(_) if Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(e) => panic!("push: {e}"),
                }
            }
        }
    };
    let now = reckon_domain::time::now();
    let unknown = |key: &str, created: f64| {
        serde_json::json!({
            "key": key, "state": "unknown", "request_hash": "1:a", "response": null,
            "attempts": 1, "created_at": created, "updated_at": created + 1.0,
        })
    };
    let hours = 3600.0;
    // A charge 30.4 h old (past its 24 h window: closed), one 21 h old (in the window's
    // last 4 h: closing), and a receipt as old that no provider is asked about.
    push(serde_json::json!([
        unknown("charge:v1:ORD-OLD", now - 30.4 * hours - 1.0),
        unknown("charge:v1:ORD-LATE", now - 21.0 * hours),
        unknown("send_receipt:v1:ORD-OLD", now - 30.4 * hours - 1.0),
    ]))
    .await;

    // Prometheus: scrapes reckon's metrics listener every second as job `reckon`, loads the
    // rules, evaluates every second.
    let runbooks = "https://git.example.com/ops/reckon/blob/main/docs/runbooks.md";
    let prom_dir = dir.path().join("prometheus");
    std::fs::create_dir_all(&prom_dir).unwrap();
    std::fs::write(prom_dir.join("alerts.yml"), rules_for_the_test()).unwrap();
    std::fs::write(
        prom_dir.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n  \
             external_labels:\n    reckon_runbooks_url: {runbooks}\n    \
             reckon_public_url: http://reckon.example.com\n\
             rule_files:\n  - alerts.yml\n\
             scrape_configs:\n  - job_name: reckon\n    static_configs:\n      \
             - targets: ['127.0.0.1:{mport}']\n"
        ),
    )
    .unwrap();
    let prom = free_port();
    let _prometheus = Killed(
        Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                prom_dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                prom_dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(prom_dir.join("prometheus.log")).unwrap())
            .spawn()
            .expect("prometheus is required (Debian package prometheus, see .ci/run)"),
    );

    let instance = format!("127.0.0.1:{mport}");
    let backlog = [
        Want {
            alert: "ReckonOldestUnresolvedTooOldPage",
            labels: &[
                ("severity", "page"),
                ("tenant", "acme"),
                ("source", "shop"),
                ("operation", "charge"),
            ],
            // 30 h 24 m and the seconds since, as Prometheus's humanizeDuration writes it.
            description: &["has waited 1d 6h 2", "(page past 4h)"],
        },
        Want {
            alert: "ReckonNeedsAttention",
            labels: &[
                ("severity", "warning"),
                ("tenant", "acme"),
                ("operation", "charge"),
            ],
            description: &["unresolved charge effects of acme/shop are parked", "Next:"],
        },
        Want {
            alert: "ReckonReplayWindowClosed",
            labels: &[
                ("severity", "warning"),
                ("tenant", "acme"),
                ("operation", "charge"),
            ],
            description: &[
                "1 unresolved charge effects of acme/shop were created more than 24h ago",
            ],
        },
        Want {
            alert: "ReckonUnroutedEffects",
            labels: &[
                ("severity", "warning"),
                ("tenant", "acme"),
                ("operation", "send_receipt"),
            ],
            description: &[
                "1 unresolved send_receipt effects of acme/shop are routed to no provider",
            ],
        },
    ];
    let others = [
        Want {
            alert: "ReckonReplayWindowClosing",
            labels: &[
                ("severity", "page"),
                ("tenant", "acme"),
                ("operation", "charge"),
            ],
            description: &["1 unresolved charge effects of acme/shop were created 20h to 24h ago"],
        },
        Want {
            alert: "ReckonProviderErrorsHigh",
            labels: &[("provider", "legacy"), ("provider_kind", "http")],
            description: &["100% of reckon's requests to legacy (http)"],
        },
        Want {
            alert: "ReckonProviderNotAnswering",
            labels: &[("provider", "legacy"), ("provider_kind", "http")],
            description: &["failed in the last hour and none succeeded"],
        },
        Want {
            alert: "ReckonAuditRunFailed",
            labels: &[("tenant", "acme")],
            description: &["audit run(s) of acme"],
        },
    ];

    // Until every expected alert fires. New charges keep arriving meanwhile, so the down
    // service keeps being asked (and answering 404): its error rate is a rate, not a count
    // that stopped when its first effects were parked.
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut n = 0;
    let firing = loop {
        let firing = alerts(&client, prom).await;
        let missing: Vec<&str> = backlog
            .iter()
            .chain(&others)
            .filter(|w| !firing.iter().any(|a| matches(a, w)))
            .map(|w| w.alert)
            .collect();
        if missing.is_empty() {
            break firing;
        }
        assert!(
            Instant::now() < deadline,
            "not firing: {missing:?}; firing: {} prometheus log: {}",
            summary(&firing),
            std::fs::read_to_string(prom_dir.join("prometheus.log")).unwrap_or_default()
        );
        n += 1;
        push(serde_json::json!([unknown(
            &format!("charge:v1:ORD-NEW-{n}"),
            reckon_domain::time::now() - 60.0
        )]))
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    eprintln!("every expected alert fired after {:?}", started.elapsed());
    for w in backlog.iter().chain(&others) {
        let a = firing.iter().find(|a| matches(a, w)).unwrap();
        check(a, w, runbooks);
    }
    // The receipt has no provider: no replay-window alert for it, however old it is.
    for a in &firing {
        let name = a["labels"]["alertname"].as_str().unwrap();
        assert!(
            !(name.starts_with("ReckonReplayWindow") && a["labels"]["operation"] == "send_receipt"),
            "a replay-window alert for an unrouted effect: {a}"
        );
    }
    assert!(
        !firing
            .iter()
            .any(|a| a["labels"]["alertname"] == "ReckonDown"),
        "ReckonDown while reckon runs: {}",
        summary(&firing)
    );

    // reckon dies: ReckonDown for its instance within a minute (30 s `for:` as shipped),
    // and the backlog alerts are still firing then: held, not resolved.
    let killed_at = Instant::now();
    server.0.kill().unwrap();
    server.0.wait().unwrap();
    let down = Want {
        alert: "ReckonDown",
        labels: &[("severity", "page"), ("job", "reckon")],
        description: &["Prometheus cannot scrape reckon at 127.0.0.1:"],
    };
    let firing = loop {
        let firing = alerts(&client, prom).await;
        if firing
            .iter()
            .any(|a| matches(a, &down) && a["labels"]["instance"] == instance.as_str())
        {
            break firing;
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(60),
            "ReckonDown did not fire within a minute of the kill; firing: {}",
            summary(&firing)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    eprintln!("ReckonDown fired {:?} after the kill", killed_at.elapsed());
    // `for: 30s` counts from the first evaluation that saw `up == 0`, which is the kill
    // unless scrapes already failed before it (a 1 s scrape timeout on a loaded machine):
    // the alert must have been pending 30 s, whenever that began.
    let fired = firing
        .iter()
        .find(|a| matches(a, &down) && a["labels"]["instance"] == instance.as_str())
        .unwrap();
    let active_at: jiff::Timestamp = fired["activeAt"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("ReckonDown without an activeAt: {fired}"));
    let pending = jiff::Timestamp::now().duration_since(active_at);
    let before_kill = pending.as_secs_f64() - killed_at.elapsed().as_secs_f64();
    if before_kill > 1.0 {
        eprintln!("ReckonDown went pending {before_kill:.1} s before the kill: scrapes failed");
    }
    assert!(
        pending >= jiff::SignedDuration::from_secs(30),
        "ReckonDown fired {pending:?} after it went pending, before its 30s"
    );
    check(
        firing.iter().find(|a| matches(a, &down)).unwrap(),
        &down,
        runbooks,
    );
    for w in &backlog {
        let a = firing.iter().find(|a| matches(a, w)).unwrap_or_else(|| {
            panic!(
                "{} resolved when reckon died; firing: {}",
                w.alert,
                summary(&firing)
            )
        });
        check(a, w, runbooks);
    }
    eprintln!("prometheus alerts test took {:?}", started.elapsed());
}
