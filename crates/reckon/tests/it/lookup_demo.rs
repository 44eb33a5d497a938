//! Support's lookup on the demo as a newcomer meets it: every order of the demo's day asked
//! on the API, the dashboard and the CLI gives the same lines, none with a word of reckon's
//! workings; a reconciled charge is said with its charge id, amount and time; an order of
//! several effects is one short line each, named by what it is; a search by an id the
//! application recorded finds its order; near misses are offered the order meant. Each
//! effect's own page and its API answer give the verdict and sentence the lookup gives.

use reckon_testkit::answer_cases::developer_words;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

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

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

fn enc(q: &str) -> String {
    url::form_urlencoded::byte_serialize(q.as_bytes()).collect()
}

async fn api(base: &str, token: &str, q: &str) -> Value {
    let r = client()
        .get(format!("{base}/api/v1/lookup?q={}", enc(q)))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{q}");
    serde_json::from_str(&r.text().await.unwrap()).unwrap()
}

async fn sign_in(base: &str, email: &str, password: &str) -> String {
    let r = client()
        .post(format!("{base}/signin"))
        .header("origin", base)
        .header("sec-fetch-site", "same-origin")
        .form(&[("email", email), ("password", password)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303, "sign-in");
    r.headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|c| c.starts_with("__Host-reckon_session="))
        .and_then(|c| c.split(';').next())
        .expect("a session cookie")
        .to_owned()
}

async fn page(base: &str, cookie: &str, q: &str) -> String {
    let r = client()
        .get(format!("{base}/t/demo/lookup?q={}", enc(q)))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{q}");
    r.text().await.unwrap()
}

/// Text with tags dropped and the entities askama writes decoded.
fn text(html: &str) -> String {
    let mut out = String::new();
    let mut tag = false;
    for c in html.chars() {
        match c {
            '<' => tag = true,
            '>' => tag = false,
            c if !tag => out.push(c),
            _ => {}
        }
    }
    out.replace("&amp;", "&")
        .replace("&quot;", "\"")
        .replace("&#x27;", "'")
        .replace("&#39;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
}

/// The page's answer block (`#verdict`): one text per line it shows.
fn page_lines(html: &str) -> Vec<String> {
    if let Some(b) = html
        .split("<ul class=\"verdict lines\" id=\"verdict\">")
        .nth(1)
    {
        let b = b.split("</ul>").next().unwrap_or_default();
        return b.split("<li>").skip(1).map(text).collect();
    }
    html.split("<p class=\"verdict\" id=\"verdict\">")
        .nth(1)
        .map(|b| vec![text(b.split("</p>").next().unwrap_or_default())])
        .unwrap_or_default()
}

fn cli(data: &Path, args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_reckon"))
        .arg("--data-dir")
        .arg(data)
        .arg("--config")
        .arg(data.join("reckon.toml"))
        .args(args)
        .env_remove("RECKON_DATABASE_URL")
        .env("RECKON_LOG", "warn")
        .output()
        .expect("run reckon");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

/// A path segment: everything but unreserved characters escaped, as the dashboard's links.
fn seg(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The effect page's verdict (`data-verdict`) and its sentence, badges left out.
async fn effect_page(base: &str, cookie: &str, source: &str, key: &str) -> (String, String) {
    let r = client()
        .get(format!(
            "{base}/t/demo/effects/{}/{}",
            seg(source),
            seg(key)
        ))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{source}/{key}");
    let html = r.text().await.unwrap();
    let Some(block) = html.split("<p class=\"verdict\" id=\"answer\"").nth(1) else {
        return (
            String::new(),
            format!("(no answer on the page of {source}/{key})"),
        );
    };
    let verdict = block
        .split("data-verdict=\"")
        .nth(1)
        .and_then(|v| v.split('"').next())
        .unwrap_or_default()
        .to_owned();
    let body = block.split_once('>').map(|x| x.1).unwrap_or_default();
    let body = body.split("</p>").next().unwrap_or_default();
    let sentence = body.split("<span class=\"badge").next().unwrap_or_default();
    (verdict, text(sentence).trim().to_owned())
}

/// A sentence with its numbers masked: ages ("for 3 min") move between two readings a
/// moment apart; the words must not.
fn words_of(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii_digit() {
            if !out.ends_with('#') {
                out.push('#');
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn every_demo_order_reads_the_same_to_a_customer_on_every_surface() {
    // reckon's HTTP client installs the TLS crypto provider the test's client needs too.
    let _ = reckon_providers::GetClient::shared();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut child = Command::new(env!("CARGO_BIN_EXE_reckon"))
        .args(["demo", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .current_dir(dir.path())
        .env_remove("RECKON_DATABASE_URL")
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
        .recv_timeout(Duration::from_secs(90))
        .expect("the demo printed its banner");
    let token = after(&banner, "admin API token: ").to_owned();
    let base = after(&banner, "health: ")
        .trim_end_matches("/healthz")
        .to_owned();
    let password = after(&banner, "(admin@demo.invalid / ").trim_end_matches(')');
    let cookie = sign_in(&base, "admin@demo.invalid", password).await;

    let orders: Vec<String> = (1000..1120)
        .map(|n| format!("ORD-{n}"))
        .chain(["ORD-2000".to_owned(), "ORD-9001".to_owned()])
        .collect();
    let mut answers: Vec<(String, Value)> = Vec::new();
    for q in &orders {
        let a = api(&base, &token, q).await;
        let lines = strings(&a["lines"]);
        assert_eq!(a["sentence"].as_str().unwrap(), lines.join("\n"), "{q}");
        // The CLI's JSON is the API's answer; its table and the page say the same lines.
        let (code, json) = cli(
            &data,
            &["lookup", "--tenant", "demo", q, "--format", "json"],
        );
        assert_eq!(code, 0, "{q}: {json}");
        let c: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(c["lines"], a["lines"], "{q}: the CLI says otherwise");
        let (code, table) = cli(&data, &["lookup", "--tenant", "demo", q]);
        assert_eq!(code, 0, "{q}: {table}");
        let html = page(&base, &cookie, q).await;
        let shown = page_lines(&html);
        assert_eq!(shown, lines, "{q}: the page says otherwise");
        for l in &lines {
            assert!(
                table.contains(l.as_str()),
                "{q}: the table lacks {l:?}:\n{table}"
            );
        }
        let mut said: Vec<String> = lines.clone();
        for o in a["orphans"].as_array().into_iter().flatten() {
            said.push(o["sentence"].as_str().unwrap().to_owned());
        }
        for e in a["effects"].as_array().unwrap() {
            said.push(e["sentence"].as_str().unwrap().to_owned());
            let key = e["key"].as_str().unwrap();
            assert!(
                lines.iter().all(|l| !l.contains(key)),
                "{q}: a line names the key {key}: {lines:?}"
            );
        }
        for s in &said {
            assert!(
                developer_words(s).is_empty(),
                "{q}: {s:?} holds {:?}",
                developer_words(s)
            );
            // One sentence read out to a customer, not brackets stacked one after another.
            assert!(!s.contains(") ("), "{q}: {s:?} has two brackets in a row");
        }
        answers.push((q.clone(), a));
    }
    let of = |q: &str| {
        &answers
            .iter()
            .find(|(o, _)| o == q)
            .unwrap_or_else(|| panic!("{q} not asked"))
            .1
    };
    let charge_of = |q: &str| {
        of(q)["effects"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["operation"] == "charge")
            .unwrap_or_else(|| panic!("{q}: no charge"))
            .clone()
    };

    // Charged once, resolved by the reconciler: charge id, amount and time in words.
    let c = charge_of("ORD-1017");
    assert_eq!(c["by"], "reconciler");
    let s = c["sentence"].as_str().unwrap();
    assert!(
        s.starts_with("Charged once (customer cus_demo_") && s.contains("): demo_ch_"),
        "{s}"
    );
    assert!(s.contains(", $") && s.ends_with(" UTC."), "{s}");
    // An order of several effects: one line each, named by what it is.
    let lines = strings(&of("ORD-1017")["lines"]);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].starts_with("Charge: Charged once (customer cus_demo_"),
        "{lines:?}"
    );
    assert!(lines[1].starts_with("Receipt email: "), "{lines:?}");
    // The duplicate: both charges and the one to refund.
    let s = charge_of("ORD-1101")["sentence"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        s.starts_with("Charged twice (customer cus_demo_")
            && s.contains("Refund the extra one: demo_ch_"),
        "{s}"
    );
    // The charge with no order behind it: whose it is, then the charge, in one bracket.
    let orphan = strings(&of("ORD-9001")["lines"]).join("\n");
    assert!(
        orphan.contains("has a charge for customer cus_demo_9001 that the application has no record of (demo_ch_"),
        "{orphan}"
    );
    // The refund its provider never answered for: a person must check, in plain words.
    let unanswered: Vec<String> = answers
        .iter()
        .flat_map(|(_, a)| a["effects"].as_array().unwrap().iter())
        .filter(|e| e["operation"] == "refund" && e["needs_person"] == true)
        .map(|e| e["sentence"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        unanswered.len(),
        1,
        "the refund routed to the ledger that is down"
    );
    assert!(
        unanswered[0]
            .starts_with("Nobody knows yet whether the refund went through: legacy-ledger"),
        "{unanswered:?}"
    );

    // By an id the application recorded in its row (the reclaimed ORD-1052's charge).
    let a = api(&base, &token, "ch_demo_52").await;
    assert_eq!(a["matched_by"], "recorded_id", "{a:#}");
    assert_eq!(a["effects"][0]["key"], "charge:v1:ORD-1052", "{a:#}");
    // Near misses: a letter O for a zero, one digit too many, a bare number.
    for q in ["ORD-1O17", "ORD-10170", "1017"] {
        let a = api(&base, &token, q).await;
        assert_eq!(a["found"], false, "{q}");
        assert_eq!(a["did_you_mean"][0], "ORD-1017", "{q}: {a:#}");
        let (code, out) = cli(&data, &["lookup", "--tenant", "demo", q]);
        assert_eq!(code, 1, "{q}: {out}");
        assert!(out.contains("Did you mean “ORD-1017”"), "{q}: {out}");
    }

    // Every effect of every order: its own page and its API answer say what the lookup says.
    let mut page_differs: Vec<String> = Vec::new();
    let mut api_differs: Vec<String> = Vec::new();
    let mut walked = 0;
    for q in &orders {
        // Asked again now: the demo's reconciler keeps working while the test reads.
        let a = api(&base, &token, q).await;
        for e in a["effects"].as_array().unwrap() {
            let (source, key) = (e["source"].as_str().unwrap(), e["key"].as_str().unwrap());
            let verdict = e["verdict"].as_str().unwrap();
            let sentence = e["sentence"].as_str().unwrap();
            walked += 1;
            let (v, said) = effect_page(&base, &cookie, source, key).await;
            if v != verdict || words_of(&said) != words_of(sentence) {
                page_differs.push(format!(
                    "{q} {source}/{key}: the lookup says {verdict}: {sentence:?}; \
                     its page says {v}: {said:?}"
                ));
            }
            let r = client()
                .get(format!(
                    "{base}/api/v1/effects/{}/{}",
                    seg(source),
                    seg(key)
                ))
                .bearer_auth(&token)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{source}/{key}");
            let d: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
            let said = d["answer"]["sentence"].as_str().unwrap_or_default();
            if d["answer"]["verdict"] != e["verdict"]
                || d["answer"]["needs_person"] != e["needs_person"]
                || d["answer"]["is_final"] != e["is_final"]
                || words_of(said) != words_of(sentence)
            {
                api_differs.push(format!(
                    "{q} {source}/{key}: the lookup says {verdict}: {sentence:?}; \
                     GET /effects says {}: {said:?}",
                    d["answer"]["verdict"]
                ));
            }
        }
    }
    assert!(walked > orders.len(), "{walked} effects walked");
    assert!(
        page_differs.is_empty(),
        "{} of {walked} effect pages disagree with the lookup:\n{}",
        page_differs.len(),
        page_differs.join("\n")
    );
    assert!(
        api_differs.is_empty(),
        "{} of {walked} API effects disagree with the lookup:\n{}",
        api_differs.len(),
        api_differs.join("\n")
    );

    for q in [
        "ORD-1017", "ORD-1101", "ORD-1063", "ORD-1040", "ORD-1075", "ORD-9001",
    ] {
        eprintln!("{q}:\n  {}", strings(&of(q)["lines"]).join("\n  "));
    }
    for (q, a) in &answers {
        if a["effects"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["operation"] == "refund" && e["needs_person"] == true)
        {
            eprintln!("{q}:\n  {}", strings(&a["lines"]).join("\n  "));
        }
    }
    drop(demo);
}
