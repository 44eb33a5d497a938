//! The shipped alert rules, evaluated by a real Prometheus (Debian's `prometheus`) scraping
//! a running `reckon serve`, in the state the rules exist for: an old backlog, effects
//! parked for a person, an effect routed to no provider, a provider that answers only 404,
//! routed effects inside and past their replay window, a nightly audit whose part failed.
//! Each expected alert fires, labelled as the rules say, with a description that carries its
//! value and an absolute runbook link; an unrouted effect never raises a replay-window alert.
//! Then reckon is killed: the per-instance ReckonDown fires within a minute while the backlog
//! alerts, finance's (a duplicate charge, an overdue audit, a failed audit run) and the down
//! provider keep firing (the rules hold the last value when no replica answers), and
//! Alertmanager (the shipped alertmanager.yml, on Debian's `prometheus-alertmanager`) mutes
//! the alerts reckon's death sets off but not finance's. Then reckon starts again on the
//! same ledger: from its first scrapes on, those alerts are the same ones, never resolved in
//! between (their `activeAt` unchanged), the down provider and the failed audit run included
//! (their state is the ledger's).
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
    let demo = reckon_providers::demo::DemoState::new();
    let (provider_url, _provider) = reckon_providers::demo::serve_loopback(demo.clone())
        .await
        .unwrap();
    // Every nightly audit below was due two hours ago (the minute, in the tenants' zone):
    // late enough for ReckonAuditOverdue. The audit of yesterday is due from its time of
    // day on, so two hours ago must be today in that zone: UTC, or twelve hours ahead of
    // it in the first hours of a UTC day.
    let now = reckon_domain::time::now();
    let day = 86_400.0;
    let (zone, ahead) = if now % day < 3.0 * 3600.0 {
        ("Etc/GMT-12", 12.0 * 3600.0)
    } else {
        ("UTC", 0.0)
    };
    let due = now + ahead - 7200.0;
    let due_day = (due / day).floor() * day;
    let at = format!(
        "{:02}:{:02}",
        ((due - due_day) / 3600.0).floor(),
        ((due - due_day) % 3600.0 / 60.0).floor()
    );
    // The day that run audits (the one before, from its midnight in that zone), where
    // finance's tenant was charged twice.
    let audited = due_day - day - ahead;
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
    // The nightly audit is due: the server's first check runs it, and the down service's
    // part fails (the day stays incomplete: overdue).
    ok(reckon(&data).args([
        "audit",
        "settings",
        "--tenant",
        "acme",
        "--time-zone",
        zone,
        "--at",
        &at,
    ]));
    // Finance's tenant: a day on which one order was charged twice (the provider's
    // charges, the application's one effect); its nightly audit finds the duplicate.
    ok(reckon(&data).args(["tenant", "create", "fin"]));
    ok(reckon(&data).args([
        "source", "add", "--tenant", "fin", "--name", "shop", "--kind", "push",
    ]));
    ok(reckon(&data).args([
        "provider",
        "add",
        "--tenant",
        "fin",
        "--name",
        "pay",
        "--kind",
        "demo",
        "--settings",
        &format!(r#"{{"base_url": "{provider_url}"}}"#),
    ]));
    ok(reckon(&data).args([
        "route",
        "set",
        "--tenant",
        "fin",
        "--source",
        "shop",
        "--operation",
        "charge",
        "--provider",
        "pay",
    ]));
    {
        // The effect, stored before the server (and its audit) starts.
        let keyring =
            reckon_ledger::Keyring::load_or_create_file(&data.join("master.key")).unwrap();
        let ledger = reckon_ledger::connect(None, &data, keyring).await.unwrap();
        let fin = ledger.tenant_by_slug("fin").await.unwrap();
        let shop = ledger
            .list_sources(fin.id)
            .await
            .unwrap()
            .into_iter()
            .find(|s| s.name == "shop")
            .unwrap();
        ledger
            .ingest(
                fin.id,
                shop.id,
                reckon_ledger::IngestBatch {
                    origin: reckon_ledger::Origin::Push,
                    observed_at: now,
                    records: vec![reckon_domain::SourceRecord {
                        key: "charge:v1:ORD-DUP".into(),
                        state: reckon_domain::State::Succeeded,
                        request_hash: "1:a".into(),
                        response: Some(r#"{"id":"ch_dup_1"}"#.into()),
                        attempts: 1,
                        created_at: audited + 3590.0,
                        updated_at: audited + 3600.0,
                        expires_at: None,
                    }],
                    rejected: vec![],
                    abandoned_after_secs: 300.0,
                    cursor: None,
                    lease: None,
                    expect_new: false,
                },
            )
            .await
            .unwrap();
    }
    ok(reckon(&data).args([
        "audit",
        "settings",
        "--tenant",
        "fin",
        "--time-zone",
        zone,
        "--at",
        &at,
    ]));
    for (id, offset) in [("ch_dup_1", 3600.0), ("ch_dup_2", 3660.0)] {
        demo.add(reckon_providers::demo::DemoCharge {
            id: id.into(),
            key: "charge:v1:ORD-DUP".into(),
            status: "succeeded".into(),
            amount: 2500,
            currency: "usd".into(),
            created: audited + offset,
            refunds: vec![],
            metadata: std::collections::BTreeMap::new(),
            customer: None,
        });
    }
    let token = ok(reckon(&data).args(["token", "create", "--tenant", "acme", "--role", "admin"]))
        .trim()
        .to_owned();

    let (port, mport) = (free_port(), free_port());
    let serve = || {
        Killed(
            reckon(&data)
                .arg("serve")
                .env("RECKON_LISTEN", format!("127.0.0.1:{port}"))
                .env("RECKON_METRICS_LISTEN", format!("127.0.0.1:{mport}"))
                .env("RECKON_AUDIT_CHECK_SECS", "1")
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap(),
        )
    };
    let mut server = serve();
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
                    // Still opening its ledger ("migrating"): not ready yet.
                    Ok(r) if r.status() == 503 && Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Ok(r) => panic!("push: {} {:?}", r.status(), r.text().await),
                    Err(_) if Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(e) => panic!("push: {e}"),
                }
            }
        }
    };
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
    let am = free_port();
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
             alerting:\n  alertmanagers:\n    - static_configs:\n        \
             - targets: ['127.0.0.1:{am}']\n\
             scrape_configs:\n  - job_name: reckon\n    static_configs:\n      \
             - targets: ['127.0.0.1:{mport}']\n"
        ),
    )
    .unwrap();
    // Alertmanager with the shipped configuration (its receivers point nowhere: the test
    // reads what it would notify, and what it mutes, from its API).
    let am_dir = dir.path().join("alertmanager");
    std::fs::create_dir_all(&am_dir).unwrap();
    let _alertmanager = Killed(
        Command::new("prometheus-alertmanager")
            .arg(format!(
                "--config.file={}",
                root()
                    .join("deploy/alertmanager/alertmanager.yml")
                    .display()
            ))
            .arg(format!("--storage.path={}", am_dir.display()))
            .arg(format!("--web.listen-address=127.0.0.1:{am}"))
            .arg("--cluster.listen-address=")
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(am_dir.join("alertmanager.log")).unwrap())
            .spawn()
            .expect(
                "alertmanager is required (Debian package prometheus-alertmanager, see .ci/run)",
            ),
    );
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
            // Alerts reach Alertmanager every evaluation, not every minute.
            .arg("--rules.alert.resend-delay=1s")
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
            alert: "ReckonOldestUnresolvedTooOld",
            labels: &[
                ("severity", "warning"),
                ("tenant", "acme"),
                ("source", "shop"),
                ("operation", "charge"),
            ],
            description: &["has waited 1d 6h 2", "(warning past 1h"],
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
    ];

    // Finance's alerts and the down provider: they must survive reckon's death and restart.
    let held = [
        Want {
            alert: "ReckonAuditFoundDuplicate",
            labels: &[("severity", "warning"), ("tenant", "fin")],
            description: &["The last complete audit of fin found 1 duplicate charges"],
        },
        Want {
            alert: "ReckonAuditOverdue",
            labels: &[("severity", "warning"), ("tenant", "acme")],
            description: &["The nightly audit of acme was due 2h"],
        },
        Want {
            alert: "ReckonAuditRunFailed",
            labels: &[("severity", "warning"), ("tenant", "acme")],
            description: &["The newest audit run of acme that read provider"],
        },
        Want {
            alert: "ReckonProviderNotAnswering",
            labels: &[
                ("tenant", "acme"),
                ("provider", "legacy"),
                ("provider_kind", "http"),
            ],
            description: &["The latest lookup reckon made at acme's provider legacy (http)"],
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
            .chain(&held)
            .filter(|w| !firing.iter().any(|a| matches(a, w)))
            .map(|w| w.alert)
            .collect();
        if missing.is_empty() {
            break firing;
        }
        assert!(
            Instant::now() < deadline,
            "not firing: {missing:?}; firing: {} fin's audits: {} prometheus log: {}",
            summary(&firing),
            ok(reckon(&data).args(["audit", "list", "--tenant", "fin", "--format", "json"])),
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
    for w in backlog.iter().chain(&others).chain(&held) {
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
    // Nor a page: an effect no provider is asked about warns (and ReckonUnroutedEffects
    // says why), it never wakes anyone.
    assert!(
        !firing.iter().any(
            |a| a["labels"]["alertname"] == "ReckonOldestUnresolvedTooOldPage"
                && a["labels"]["operation"] == "send_receipt"
        ),
        "a page for an unrouted receipt: {}",
        summary(&firing)
    );
    assert!(
        !firing
            .iter()
            .any(|a| a["labels"]["alertname"] == "ReckonDown"),
        "ReckonDown while reckon runs: {}",
        summary(&firing)
    );
    // When each alert that must outlive reckon went active: the same alert, never resolved
    // in between, keeps it.
    let active_before: std::collections::BTreeMap<&str, Value> = backlog
        .iter()
        .chain(&held)
        .map(|w| {
            let a = firing.iter().find(|a| matches(a, w)).unwrap();
            (w.alert, a["activeAt"].clone())
        })
        .collect();
    // Alertmanager: the 4 h page about the backlog mutes its 1 h warning (same tenant,
    // source and operation), so one effect does not notify twice.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let am_now = am_alerts(&client, am).await;
        let find = |name: &str| {
            am_now.iter().find(|a| {
                a["labels"]["alertname"] == name
                    && a["labels"]["tenant"] == "acme"
                    && a["labels"]["operation"] == "charge"
            })
        };
        let (warning, page) = (
            find("ReckonOldestUnresolvedTooOld"),
            find("ReckonOldestUnresolvedTooOldPage"),
        );
        if let (Some(w), Some(p)) = (warning, page)
            && w["status"]["state"] == "suppressed"
            && p["status"]["state"] == "active"
        {
            assert!(
                w["status"]["inhibitedBy"]
                    .as_array()
                    .is_some_and(|by| by.iter().any(|f| *f == p["fingerprint"])),
                "the warning is muted by something else than its page: {w}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Alertmanager does not mute the 1 h warning under its 4 h page: {warning:?} {page:?}; log: {}",
            std::fs::read_to_string(am_dir.join("alertmanager.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // reckon dies: ReckonDown for its instance within a minute (30 s `for:` as shipped),
    // and the backlog alerts, finance's and the down provider are still firing then: held,
    // not resolved.
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
    for w in backlog.iter().chain(&held) {
        let a = firing.iter().find(|a| matches(a, w)).unwrap_or_else(|| {
            panic!(
                "{} resolved when reckon died; firing: {}",
                w.alert,
                summary(&firing)
            )
        });
        check(a, w, runbooks);
        assert_eq!(
            a["activeAt"], active_before[w.alert],
            "{} resolved and fired again while reckon was dead",
            w.alert
        );
    }

    // No reckon answers: ReckonNotScraped fires, and Alertmanager mutes what reckon's death
    // alone sets off (the ageing backlog) while finance's findings and the down provider
    // still notify.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let muted = am_alerts(&client, am).await;
        let state = |name: &str, tenant: &str| {
            muted
                .iter()
                .find(|a| a["labels"]["alertname"] == name && a["labels"]["tenant"] == tenant)
                .map(|a| a["status"]["state"].as_str().unwrap_or("").to_owned())
        };
        let seen = (
            state("ReckonOldestUnresolvedTooOldPage", "acme"),
            state("ReckonAuditOverdue", "acme"),
            state("ReckonAuditFoundDuplicate", "fin"),
            state("ReckonProviderNotAnswering", "acme"),
        );
        let want = |s: &str| Some(s.to_owned());
        if seen
            == (
                want("suppressed"),
                want("suppressed"),
                want("active"),
                want("active"),
            )
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Alertmanager while reckon is dead (page, overdue, duplicate, provider): {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // reckon starts again on the same ledger. Once Prometheus has scraped it and evaluated
    // the rules on what it exports, the held alerts are still the same ones.
    let restarted_at = Instant::now();
    let _server = serve();
    let deadline = Instant::now() + Duration::from_secs(60);
    let scraped = loop {
        // The live value of the ledger-derived provider health, from the new process.
        let v = query(&client, prom, r#"reckon_provider_up{provider="legacy"}"#).await;
        if let Some(t) = v.first().and_then(|s| s["value"][0].as_f64()) {
            break t;
        }
        assert!(
            Instant::now() < deadline,
            "the restarted reckon was not scraped in time"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    // Two evaluations of every group after that scrape (the first may have begun before).
    let evaluated = loop {
        let after = rule_evaluations(&client, prom).await;
        if !after.is_empty() && after.iter().all(|t| *t > scraped + 1.0) {
            break after.len();
        }
        assert!(
            Instant::now() < deadline,
            "the rules were not evaluated after the restart"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let firing = alerts(&client, prom).await;
    for w in backlog.iter().chain(&held) {
        let a = firing.iter().find(|a| matches(a, w)).unwrap_or_else(|| {
            panic!(
                "{} not firing after reckon restarted; firing: {}",
                w.alert,
                summary(&firing)
            )
        });
        check(a, w, runbooks);
        assert_eq!(
            a["activeAt"], active_before[w.alert],
            "{} resolved and fired again across reckon's restart",
            w.alert
        );
    }
    assert!(
        !firing
            .iter()
            .any(|a| a["labels"]["alertname"] == "ReckonNotScraped"),
        "ReckonNotScraped still firing after the restart: {}",
        summary(&firing)
    );
    eprintln!(
        "after the restart ({:?} to scrape, {evaluated} groups evaluated) every held alert is the one from before",
        restarted_at.elapsed()
    );
    eprintln!("prometheus alerts test took {:?}", started.elapsed());
}

/// Alertmanager's alerts, each with its status (`active`, or `suppressed` with what
/// inhibits it).
async fn am_alerts(client: &reqwest::Client, am: u16) -> Vec<Value> {
    let Ok(r) = client
        .get(format!("http://127.0.0.1:{am}/api/v2/alerts"))
        .send()
        .await
    else {
        return vec![];
    };
    serde_json::from_str::<Value>(&r.text().await.unwrap_or_default())
        .ok()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
}

/// An instant query's samples.
async fn query(client: &reqwest::Client, prom: u16, q: &str) -> Vec<Value> {
    let Ok(r) = client
        .get(
            url::Url::parse_with_params(
                &format!("http://127.0.0.1:{prom}/api/v1/query"),
                [("query", q)],
            )
            .unwrap(),
        )
        .send()
        .await
    else {
        return vec![];
    };
    let v: Value = serde_json::from_str(&r.text().await.unwrap_or_default()).unwrap_or_default();
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// When each rule group was last evaluated (Unix seconds).
async fn rule_evaluations(client: &reqwest::Client, prom: u16) -> Vec<f64> {
    let Ok(r) = client
        .get(format!("http://127.0.0.1:{prom}/api/v1/rules"))
        .send()
        .await
    else {
        return vec![];
    };
    let v: Value = serde_json::from_str(&r.text().await.unwrap_or_default()).unwrap_or_default();
    v["data"]["groups"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|g| {
            g["lastEvaluation"]
                .as_str()?
                .parse::<jiff::Timestamp>()
                .ok()
        })
        .map(|t| t.as_millisecond() as f64 / 1000.0)
        .collect()
}
