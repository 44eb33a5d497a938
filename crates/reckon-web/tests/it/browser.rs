//! The dashboard in a real headless Chromium (Debian's `chromium` + `chromium-driver`,
//! driven over WebDriver by fantoccini), against reckon serving on a loopback port with a
//! real SQLite ledger fed through the push API.
//!
//! - with JavaScript: sign in, the queue with its ages, a filter swapped in place by htmx,
//!   an effect's timeline, a resolution by hand (the note is required; the timeline updates
//!   without a page load), the support lookup, yesterday's audit (a real run over the demo
//!   provider on loopback: its duplicate and its orphan) and its CSV fetched with the
//!   browser's session, another tenant's page is 404, a viewer sees no record; and the
//!   browser's console holds no CSP violation at the end;
//! - with JavaScript off: the same pages, filters and the resolution work as plain forms;
//! - the connect flow: a store the real justonce library wrote, added from the settings
//!   page, checked, scanned, routed, and its unknowns with verdicts (the time it took is
//!   printed).
//!
//! Needs `chromium` and `chromedriver` on PATH (`.ci/run` installs them): a machine without
//! them fails here with that message rather than skipping. `RECKON_SCREENSHOTS=dir` saves a
//! screenshot of each page there (the README's are made this way).

use crate::common;
use reckon_testkit::answer_cases;

use axum::Router;
use axum::http::{Method, StatusCode};
use common::{Backend, Req, World, send, user};
use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client, ClientBuilder, Locator};
use reckon_ledger::Role;
use reckon_providers::demo::{DemoCharge, DemoState, serve_loopback};
use reckon_web::{AppState, app};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// One browser at a time: two Chromiums on a 2-core machine starve each other.
static ONE_BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Driver {
    child: Child,
    port: u16,
    _profile: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn which(bin: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {bin}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

async fn start_driver() -> Driver {
    assert!(
        which("chromedriver") && which("chromium"),
        "the browser tests need Debian's chromium and chromium-driver: \
         apt-get install -y chromium chromium-driver"
    );
    let port = free_port();
    let child = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver starts");
    // Ready when its port answers.
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Driver {
        child,
        port,
        _profile: tempfile::TempDir::new().unwrap(),
    }
}

async fn browser(driver: &Driver, javascript: bool) -> Client {
    browser_in(driver, javascript, None).await
}

/// A browser whose interface (and date inputs) speak `lang`, e.g. `en-US`.
async fn browser_in(driver: &Driver, javascript: bool, lang: Option<&str>) -> Client {
    let profile = tempfile::TempDir::new().unwrap().keep();
    let mut prefs = json!({});
    if !javascript {
        prefs = json!({"profile.managed_default_content_settings.javascript": 2});
    }
    let mut args = vec![
        "--headless".to_owned(),
        "--no-sandbox".into(),
        "--disable-gpu".into(),
        "--disable-dev-shm-usage".into(),
        "--disable-background-networking".into(),
        "--disable-component-update".into(),
        "--disable-sync".into(),
        "--no-first-run".into(),
        "--disable-quic".into(),
        "--window-size=1280,900".into(),
        format!("--user-data-dir={}", profile.display()),
    ];
    if let Some(l) = lang {
        prefs["intl.accept_languages"] = json!(l);
        args.push(format!("--lang={l}"));
    }
    let caps = json!({
        "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": args,
            "prefs": prefs,
        },
        "goog:loggingPrefs": {"browser": "ALL"},
    });
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps.as_object().unwrap().clone())
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .expect("a WebDriver session")
}

/// chromedriver's console log (not in the W3C protocol; `goog:loggingPrefs` turns it on).
#[derive(Debug)]
struct BrowserLog;

impl WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(
        &self,
        base: &url::Url,
        session: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base.join(&format!("session/{}/se/log", session.unwrap_or_default()))
    }
    fn method_and_body(&self, _: &url::Url) -> (axum::http::Method, Option<String>) {
        (
            axum::http::Method::POST,
            Some(json!({"type": "browser"}).to_string()),
        )
    }
}

async fn console(c: &Client) -> Vec<String> {
    match c.issue_cmd(BrowserLog).await.expect("the browser log") {
        Value::Array(entries) => entries
            .iter()
            .map(|e| e["message"].as_str().unwrap_or_default().to_owned())
            .collect(),
        other => panic!("unexpected log answer {other}"),
    }
}

async fn shot(c: &Client, name: &str) {
    if let Some(dir) = std::env::var_os("RECKON_SCREENSHOTS") {
        let png = c.screenshot().await.unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(std::path::Path::new(&dir).join(format!("{name}.png")), png).unwrap();
    }
}

struct Server {
    w: World,
    base: String,
}

async fn serve() -> Server {
    let w = World::new(Backend::Sqlite).await;
    user(w.ledger.as_ref(), "vic@acme.test", &w.a, Role::Viewer).await;
    seed(&w).await;
    // The demo provider is on loopback, which the default egress policy refuses.
    let egress = reckon_sources::EgressPolicy::new(&["127.0.0.0/8".to_owned()], None).unwrap();
    let app = app(AppState {
        egress: std::sync::Arc::new(egress),
        ..AppState::new(w.ledger.clone())
    });
    seed_yesterdays_audit(&w, &app).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    Server {
        w,
        base: format!("http://127.0.0.1:{}", addr.port()),
    }
}

async fn seed(w: &World) {
    let r = send(
        &w.app,
        Method::POST,
        "/api/v1/sources",
        Req {
            token: Some(&w.token_a),
            content_type: Some("application/json"),
            body: json!({"name": "shop", "kind": "push"}).to_string(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let now = reckon_domain::time::now();
    let rec = |key: &str, state: &str, age: f64| {
        json!({
            "key": key, "state": state, "request_hash": "1:abc",
            "response": if state == "succeeded" { json!({"id": "ch_3"}) } else { json!(null) },
            "attempts": 1, "created_at": now - age - 1.0, "updated_at": now - age,
        })
    };
    let r = send(
        &w.app,
        Method::POST,
        "/api/v1/effects?source=shop",
        Req {
            token: Some(&w.token_a),
            content_type: Some("application/json"),
            body: json!([
                rec("charge:v1:ORD-1", "unknown", 3.0 * 3600.0),
                rec("charge:v1:ORD-2", "unknown", 20.0 * 60.0),
                rec("charge:v1:ORD-3", "succeeded", 600.0),
                rec("refund:v1:ORD-4", "unknown", 90.0),
            ])
            .to_string(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let now = reckon_domain::time::now();
    for h in (0..48).rev() {
        w.ledger
            .take_snapshot(w.a.id, now - f64::from(h) * 3600.0)
            .await
            .unwrap();
    }
}

/// Yesterday (UTC, the tenant's zone): `charge:v1:ORD-7` succeeded once in the ledger but
/// was charged twice by the demo provider, which also holds a charge no effect made. The
/// audit runs for real through the API (import from the provider, match, store the run).
async fn seed_yesterdays_audit(w: &World, app: &Router) {
    let day = reckon_audit::DayWindow::yesterday(reckon_domain::time::now(), "UTC").unwrap();
    let at = day.start + 10.0 * 3600.0;
    let api = |method: Method, uri: &'static str, body: Value| {
        let app = app.clone();
        let token = w.token_a.clone();
        async move {
            send(
                &app,
                method,
                uri,
                Req {
                    token: Some(&token),
                    content_type: Some("application/json"),
                    body: body.to_string(),
                    ..Default::default()
                },
            )
            .await
        }
    };
    let r = api(
        Method::POST,
        "/api/v1/effects?source=shop",
        json!([{
            "key": "charge:v1:ORD-7", "state": "succeeded", "request_hash": "1:abc",
            "response": {"id": "demo_ch_1"}, "attempts": 1,
            "created_at": at, "updated_at": at + 2.0,
        }]),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let demo = DemoState::new();
    demo.charge("charge:v1:ORD-7", 2000, "usd", at + 1.0);
    demo.charge("charge:v1:ORD-7", 2000, "usd", at + 60.0);
    demo.add(DemoCharge {
        id: "ch_orphan_1".into(),
        key: String::new(),
        status: "succeeded".into(),
        amount: 1999,
        currency: "eur".into(),
        created: at + 3600.0,
        refunds: vec![],
        metadata: Default::default(),
        customer: None,
    });
    let (url, server) = serve_loopback(demo).await.unwrap();
    // The provider serves as long as the test's runtime.
    std::mem::forget(server);
    let r = api(
        Method::POST,
        "/api/v1/providers",
        json!({"name": "pay-demo", "kind": "demo", "secret": "demo-secret",
               "settings": {"base_url": url}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let r = api(
        Method::PUT,
        "/api/v1/routes",
        json!({"source": "shop", "operation": "charge", "provider": "pay-demo"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = api(Method::POST, "/api/v1/audits", json!({})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(r.json["run"]["status"], "complete", "{}", r.text);
}

async fn sign_in(c: &Client, base: &str, email: &str) {
    c.goto(&format!("{base}/signin")).await.unwrap();
    c.find(Locator::Css("input[name=email]"))
        .await
        .unwrap()
        .send_keys(email)
        .await
        .unwrap();
    c.find(Locator::Css("input[name=password]"))
        .await
        .unwrap()
        .send_keys(common::PASSWORD)
        .await
        .unwrap();
    shot(c, "signin").await;
    c.find(Locator::Css("form button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    // One tenant each here: sign-in lands on its overview (several: the tenant list).
    c.wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css("#audit-summary"))
        .await
        .expect("signed in, on the tenant's overview");
    assert!(
        c.current_url().await.unwrap().path().ends_with("/t/acme"),
        "a person with one tenant lands on it"
    );
}

/// The text of the first element matching `css`. htmx may swap the element out between
/// the find and the read (a stale element reference): find it again rather than fail.
async fn text_of(c: &Client, css: &str) -> String {
    let mut last = None;
    for _ in 0..50 {
        let e = c
            .wait()
            .at_most(Duration::from_secs(10))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"));
        match e.text().await {
            Ok(t) => return t,
            Err(err) => last = Some(err),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{css}: its text could not be read: {last:?}")
}

/// Wait until `css`'s text contains `needle` (htmx swaps asynchronously).
async fn wait_text(c: &Client, css: &str, needle: &str) -> String {
    for _ in 0..100 {
        if let Ok(e) = c.find(Locator::Css(css)).await
            && let Ok(t) = e.text().await
            && t.contains(needle)
        {
            return t;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "{css} never contained {needle:?}: {}",
        c.source().await.unwrap_or_default()
    );
}

async fn resolution(w: &World, key: &str) -> Option<reckon_ledger::Resolution> {
    let e = w
        .ledger
        .get_effect(w.a.id, "shop", key)
        .await
        .unwrap()
        .unwrap()
        .effect;
    w.ledger
        .reconcile_view(w.a.id, e.id)
        .await
        .unwrap()
        .resolution
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_works_in_a_real_browser_with_javascript() {
    let _one = ONE_BROWSER.lock().await;
    let s = serve().await;
    let driver = start_driver().await;
    let c = browser(&driver, true).await;
    let base = &s.base;

    sign_in(&c, base, "alice@acme.test").await;
    let overview = text_of(&c, "main").await;
    assert!(overview.contains("Unresolved now"), "{overview}");
    assert!(
        c.find(Locator::Css("#chart svg path")).await.is_ok(),
        "the chart has its lines"
    );
    // 30 days: the chart alone is swapped in.
    c.find(Locator::Css("#chart a[href$='days=30']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_text(&c, "#chart", "Last 30 days").await;
    shot(&c, "overview").await;

    // The queue: oldest first, with ages in words.
    c.goto(&format!("{base}/t/acme/queue")).await.unwrap();
    let first = text_of(&c, "#queue-rows tbody tr:first-child").await;
    assert!(
        first.contains("charge:v1:ORD-1") && first.contains("3 h"),
        "{first}"
    );
    assert!(text_of(&c, "#queue-rows").await.contains("20 min"));
    shot(&c, "queue").await;
    // Filter by operation: htmx swaps the rows and pushes the URL; no page load.
    c.execute("window.__sameDocument = 'yes'; return null;", vec![])
        .await
        .unwrap();
    c.find(Locator::Css("input[name=operation]"))
        .await
        .unwrap()
        .send_keys("refund")
        .await
        .unwrap();
    c.find(Locator::Css("form.filters button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    for _ in 0..100 {
        let t = text_of(&c, "#queue-rows").await;
        if !t.contains("charge:v1:ORD-1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rows = text_of(&c, "#queue-rows").await;
    assert!(
        rows.contains("refund:v1:ORD-4") && !rows.contains("charge:v1:ORD-1"),
        "{rows}"
    );
    assert!(
        c.current_url()
            .await
            .unwrap()
            .as_str()
            .contains("operation=refund")
    );
    let same = c
        .execute("return window.__sameDocument || 'reloaded';", vec![])
        .await
        .unwrap();
    assert_eq!(same, json!("yes"), "the filter swapped the rows in place");

    // An effect's timeline.
    c.goto(&format!("{base}/t/acme/queue")).await.unwrap();
    c.wait()
        .for_element(Locator::Css("tr[data-key='charge:v1:ORD-1'] a"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let timeline = text_of(&c, "#timeline").await;
    assert!(timeline.contains("first_seen"), "{timeline}");

    // Resolve by hand: without a note the browser does not even send it.
    c.execute("window.__sameDocument = 'yes'; return null;", vec![])
        .await
        .unwrap();
    c.find(Locator::Css("#resolve-form input[value=not_applied]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.find(Locator::Css("#resolve-form button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        resolution(&s.w, "charge:v1:ORD-1").await.is_none(),
        "no note, no resolution"
    );
    let invalid = c
        .execute(
            "return document.querySelector('#note').validity.valueMissing;",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(invalid, json!(true), "the note is marked as missing");
    c.find(Locator::Css("#note"))
        .await
        .unwrap()
        .send_keys("Refunded in the provider's dashboard")
        .await
        .unwrap();
    shot(&c, "effect").await;
    c.find(Locator::Css("#resolve-form button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let resolved = wait_text(&c, "#resolution", "Resolved as").await;
    assert!(
        resolved.contains("not_applied") && resolved.contains("alice@acme.test"),
        "{resolved}"
    );
    wait_text(
        &c,
        "#timeline",
        "resolved as not_applied by alice@acme.test",
    )
    .await;
    let same = c
        .execute("return window.__sameDocument || 'reloaded';", vec![])
        .await
        .unwrap();
    assert_eq!(
        same,
        json!("yes"),
        "the timeline updated without a page load"
    );
    let r = resolution(&s.w, "charge:v1:ORD-1").await.expect("stored");
    assert_eq!(
        r.note.as_deref(),
        Some("Refunded in the provider's dashboard")
    );
    shot(&c, "effect-resolved").await;

    // Support lookup by order id.
    c.goto(&format!("{base}/t/acme/lookup")).await.unwrap();
    c.find(Locator::Css("input[name=q]"))
        .await
        .unwrap()
        .send_keys("ORD-3")
        .await
        .unwrap();
    c.find(Locator::Css("form[role=search] button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let verdict = wait_text(&c, "#verdict", "Charged once").await;
    assert!(verdict.contains("recorded it as done"), "{verdict}");
    assert!(
        text_of(&c, "section[data-key='charge:v1:ORD-3'] h2")
            .await
            .contains("applied")
    );

    // The morning audit: yesterday's by default, from the nav.
    c.find(Locator::Css("header nav a[href='/t/acme/audit']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let dup = text_of(&c, "section[data-kind=duplicate]").await;
    assert!(
        dup.contains("charge:v1:ORD-7") && dup.contains("$20.00"),
        "{dup}"
    );
    let orphan = text_of(&c, "section[data-kind=orphan]").await;
    assert!(
        orphan.contains("ch_orphan_1") && orphan.contains("€19.99"),
        "{orphan}"
    );
    assert!(text_of(&c, "#audit-day").await.contains("(yesterday)"));
    assert!(text_of(&c, "#audit-history").await.contains("verified"));
    shot(&c, "audit").await;
    // The CSV, fetched with the browser's own session cookie.
    let href = c
        .find(Locator::Css("#audit-csv"))
        .await
        .unwrap()
        .attr("href")
        .await
        .unwrap()
        .expect("a CSV link");
    let csv = c
        .execute(
            "return fetch(arguments[0]).then(r => r.text().then(t => \
             r.status + '\\n' + r.headers.get('content-type') + '\\n' + t));",
            vec![json!(href)],
        )
        .await
        .unwrap();
    let csv = csv.as_str().unwrap_or_default().to_owned();
    assert!(csv.starts_with("200\ntext/csv"), "{csv}");
    let body: String = csv.splitn(3, '\n').nth(2).unwrap_or_default().to_owned();
    let mut rd = csv::Reader::from_reader(body.as_bytes());
    let rows: Vec<csv::StringRecord> = rd.records().map(|r| r.unwrap()).collect();
    let kinds: Vec<&str> = rows.iter().map(|r| &r[4]).collect();
    assert!(
        kinds.contains(&"duplicate") && kinds.contains(&"orphan"),
        "{body}"
    );
    assert!(
        body.contains("ch_orphan_1") && body.contains("charge:v1:ORD-7"),
        "{body}"
    );
    let log = s.w.ledger.list_actions(s.w.a.id, None, 20).await.unwrap();
    assert!(
        log.iter()
            .any(|a| a.action == "export" && a.actor == "user:alice@acme.test"),
        "the download is in the audit log: {log:?}"
    );

    // Support looks up the duplicate's second charge by its provider id.
    c.goto(&format!("{base}/t/acme/lookup?q=demo_ch_2"))
        .await
        .unwrap();
    let verdict = text_of(&c, "#verdict").await;
    assert!(
        verdict.contains("Charged twice: demo_ch_1, $20.00")
            && verdict.contains("demo_ch_2, $20.00")
            && verdict.contains("lists it as a duplicate"),
        "{verdict}"
    );
    assert!(
        text_of(&c, "section[data-verdict=duplicate] .charges")
            .await
            .contains("pay-demo")
    );

    // Another tenant's pages do not exist for alice.
    c.goto(&format!("{base}/t/globex/queue")).await.unwrap();
    assert!(text_of(&c, "h1").await.contains("404"));
    // A page of her own tenant that does not exist: a 404 inside the dashboard, with its
    // navigation.
    c.goto(&format!("{base}/t/acme/no-such-page"))
        .await
        .unwrap();
    assert!(text_of(&c, "h1").await.contains("404"));
    assert!(
        c.find(Locator::Css("header nav a[href='/t/acme/queue']"))
            .await
            .is_ok()
    );
    shot(&c, "not-found").await;

    c.goto(&format!("{base}/t/acme/settings")).await.unwrap();
    shot(&c, "settings").await;

    // No CSP violation (or any other error) on any page visited.
    let log = console(&c).await;
    assert!(
        !log.iter()
            .any(|m| m.contains("Content Security Policy") || m.contains("Refused to")),
        "CSP violations: {log:#?}"
    );

    // A viewer: the overview's summaries; the queue and the effect page are not theirs.
    c.goto(&format!("{base}/t/acme")).await.unwrap();
    c.find(Locator::Css("header form button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.wait()
        .for_element(Locator::Css("input[name=email]"))
        .await
        .unwrap();
    sign_in(&c, base, "vic@acme.test").await;
    c.goto(&format!("{base}/t/acme")).await.unwrap();
    assert!(c.find(Locator::Css("nav a[href$='/queue']")).await.is_err());
    c.goto(&format!("{base}/t/acme/queue")).await.unwrap();
    assert!(text_of(&c, "h1").await.contains("403"));
    c.goto(&format!("{base}/t/acme/effects/shop/charge%3Av1%3AORD-2"))
        .await
        .unwrap();
    assert!(text_of(&c, "h1").await.contains("403"));
    assert!(c.find(Locator::Css("#resolve-form")).await.is_err());

    c.close().await.unwrap();
    s.w.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_works_with_javascript_turned_off() {
    let _one = ONE_BROWSER.lock().await;
    let s = serve().await;
    let driver = start_driver().await;
    let c = browser(&driver, false).await;
    let base = &s.base;
    sign_in(&c, base, "alice@acme.test").await;
    c.goto(&format!("{base}/t/acme/queue")).await.unwrap();
    // WebDriver's own script may be refused too; if it runs, it finds no htmx.
    if let Ok(htmx) = c.execute("return typeof window.htmx;", vec![]).await {
        assert_eq!(
            htmx,
            json!("undefined"),
            "JavaScript is off: htmx did not run"
        );
    }
    // The filter is a plain GET form: a whole page comes back.
    c.find(Locator::Css("input[name=operation]"))
        .await
        .unwrap()
        .send_keys("refund")
        .await
        .unwrap();
    c.find(Locator::Css("form.filters button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    // The unfiltered page holds the refund too: wait for the filtered page's URL first.
    for _ in 0..100 {
        if c.current_url()
            .await
            .is_ok_and(|u| u.as_str().contains("operation=refund"))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rows = wait_text(&c, "#queue-rows", "refund:v1:ORD-4").await;
    assert!(!rows.contains("charge:v1:ORD-1"), "{rows}");
    // Resolve by hand with a plain form post (303 back to the effect).
    c.goto(&format!("{base}/t/acme/effects/shop/charge%3Av1%3AORD-2"))
        .await
        .unwrap();
    c.find(Locator::Css("#resolve-form input[value=applied]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.find(Locator::Css("#note"))
        .await
        .unwrap()
        .send_keys("Charge ch_2 found by hand")
        .await
        .unwrap();
    c.find(Locator::Css("#resolve-form button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let resolved = wait_text(&c, "#resolution", "Resolved as").await;
    assert!(resolved.contains("applied"), "{resolved}");
    assert_eq!(
        resolution(&s.w, "charge:v1:ORD-2").await.unwrap().author,
        "alice@acme.test"
    );
    // Lookup as a plain GET form.
    c.goto(&format!("{base}/t/acme/lookup")).await.unwrap();
    c.find(Locator::Css("input[name=q]"))
        .await
        .unwrap()
        .send_keys("ORD-3")
        .await
        .unwrap();
    c.find(Locator::Css("form[role=search] button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_text(&c, "#verdict", "Charged once").await;
    assert!(
        c.current_url()
            .await
            .unwrap()
            .as_str()
            .ends_with("/lookup?q=ORD-3")
    );
    c.close().await.unwrap();
    s.w.finish().await;
}

/// Support's lookup in the browser, for every case the answer knows (planted by the shared
/// `answer_cases`): typed into the search box and answered in place by htmx, each with its
/// verdict and sentence; a near match offered as a link that answers when followed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lookup_answers_every_case_in_a_real_browser() {
    use answer_cases::*;
    let _one = ONE_BROWSER.lock().await;
    let w = World::new(Backend::Sqlite).await;
    let cases = plant(w.ledger.clone(), &w.a).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = w.app.clone();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    let driver = start_driver().await;
    let c = browser(&driver, true).await;
    sign_in(&c, &base, "alice@acme.test").await;

    let every: &[(&str, &str, &str)] = &[
        (APPLIED, "applied", "Charged once"),
        (NOT_APPLIED, "not_applied", "Not charged"),
        (DUPLICATE_RECONCILED, "duplicate", "Charged twice"),
        (PROVISIONAL, "applied", "Probably charged once"),
        (MISSING, "missing", "no charge for it"),
        (DUPLICATE_AUDIT, "duplicate", "Charged twice"),
        (ABANDONED, "unknown", "worker stopped"),
        (UNROUTED, "unknown", "no provider is set up"),
        (BY_HAND, "applied", HAND_NOTE),
        (ORPHAN, "", "the application has no record of"),
        (MULTI, "applied", "Receipt email: Sent once"),
        (NOBODY_HAS, "", "Nothing found"),
    ];
    c.goto(&format!("{base}/t/acme/lookup")).await.unwrap();
    for (q, verdict, says) in every {
        let input = c.find(Locator::Css("input[name=q]")).await.unwrap();
        input.clear().await.unwrap();
        input.send_keys(q).await.unwrap();
        c.find(Locator::Css("form[role=search] button"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        wait_text(&c, "#verdict", says).await;
        if !verdict.is_empty() {
            let card = text_of(&c, &format!("section[data-verdict={verdict}]")).await;
            assert!(card.contains(q), "{q}: {card}");
        }
        match *q {
            // An order of three effects: one line each, the details folded.
            MULTI => {
                let lines = text_of(&c, "#verdict").await;
                assert!(
                    lines.contains("Charge: Charged once") && lines.contains("Refund: "),
                    "{lines}"
                );
                assert!(!lines.contains("charge:v1:"), "{lines}");
                shot(&c, "lookup").await;
            }
            PROVISIONAL => {
                assert!(text_of(&c, ".next-lookup").await.contains("UTC"));
                assert!(text_of(&c, "section h2").await.contains("provisional"));
            }
            UNROUTED => {
                assert!(c.find(Locator::Css(".next-lookup")).await.is_err());
                assert!(text_of(&c, "section h2").await.contains("needs a person"));
            }
            BY_HAND => {
                let r = text_of(&c, ".resolution").await;
                assert!(r.contains(HAND_AUTHOR) && r.contains(HAND_NOTE), "{r}");
            }
            ORPHAN => assert!(text_of(&c, "#charges").await.contains("$49.00")),
            _ => {}
        }
    }

    // By a refund's id: the duplicate order, with both charges and the refund.
    c.goto(&format!(
        "{base}/t/acme/lookup?q={}",
        cases.duplicate_refund
    ))
    .await
    .unwrap();
    let card = text_of(&c, "section[data-verdict=duplicate]").await;
    assert!(
        card.contains("$1,234.00") && card.contains("refunded $1,234.00"),
        "{card}"
    );
    shot(&c, "lookup-charge").await;

    // A near match is offered, and answers when followed.
    c.goto(&format!("{base}/t/acme/lookup?q=ord-a1"))
        .await
        .unwrap();
    assert!(text_of(&c, "#verdict").await.starts_with("Nothing found"));
    c.find(Locator::Css("#did-you-mean a"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_text(&c, "#verdict", "Charged once").await;
    assert!(
        c.current_url()
            .await
            .unwrap()
            .as_str()
            .ends_with(&format!("/lookup?q={APPLIED}"))
    );
    let csp: Vec<String> = console(&c)
        .await
        .into_iter()
        .filter(|m| m.contains("Content Security Policy"))
        .collect();
    assert!(csp.is_empty(), "{csp:?}");
    c.close().await.unwrap();
    w.finish().await;
}

/// A justonce SQLite store written by the real library, with `keys` left `unknown` by it.
fn justonce_store(path: &std::path::Path, keys: &[&str]) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(root.join("scripts/test-env.sh"))
        .output()
        .expect("scripts/test-env.sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let python = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let mut cmd = Command::new(python);
    cmd.arg(root.join("testdata/justonce_writer.py"))
        .args(["--backend", "sqlite", "--dsn"])
        .arg(path)
        .arg("unknown");
    for k in keys {
        cmd.args(["--key", k]);
    }
    let out = cmd.output().expect("justonce_writer.py");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Fill a form field by its CSS selector.
async fn fill(c: &Client, css: &str, text: &str) {
    let e = c
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"));
    e.clear().await.unwrap();
    e.send_keys(text).await.unwrap();
}

async fn click(c: &Client, css: &str) {
    c.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .click()
        .await
        .unwrap();
}

/// Click a form's submit button and wait for the page it answers with: the old page's
/// root goes stale once the new one is loaded, so nothing is read from the old one.
async fn submit(c: &Client, css: &str) {
    let old = c.find(Locator::Css("html")).await.unwrap();
    click(c, css).await;
    for _ in 0..200 {
        if old.tag_name().await.is_err() {
            c.wait()
                .at_most(Duration::from_secs(10))
                .for_element(Locator::Css("main"))
                .await
                .expect("the answer page");
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{css}: no new page within 10 s");
}

/// The connect flow in a real browser, as `reckon serve` runs it (its scan scheduler and
/// reconciler run in this process): an admin adds a SQLite store the real justonce library
/// wrote, is told it was added and what is still missing with the click that fixes each
/// (scan, route), sees the queue say "not routed" rather than a countdown, adds a provider
/// and a route, and the unknowns get verdicts. Prints how long it took from the first
/// click.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connect_flow_takes_a_justonce_store_to_verdicts_in_a_real_browser() {
    let _one = ONE_BROWSER.lock().await;
    let w = World::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("acme").join("shop.db");
    std::fs::create_dir_all(store.parent().unwrap()).unwrap();
    let (charged, never) = ("charge:v1:ORD-1", "charge:v1:ORD-2");
    justonce_store(&store, &[charged, never]);
    // The provider charged one of the two unknown orders and never saw the other.
    let provider = DemoState::new();
    provider.charge(charged, 1999, "eur", reckon_domain::time::now() - 60.0);
    let (provider_url, _provider) = serve_loopback(provider).await.unwrap();

    // The operator's settings: SQLite stores under `dir/{tenant}/`, loopback reachable.
    let egress = std::sync::Arc::new(
        reckon_sources::EgressPolicy::new(&["127.0.0.0/8".to_owned()], Some(dir.path().into()))
            .unwrap(),
    );
    let app = app(AppState {
        egress: egress.clone(),
        ..AppState::new(w.ledger.clone())
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    // What `reckon serve` runs beside the server: the scan scheduler (a "Scan now" is
    // picked up at its next look) and the reconciler.
    let scans = reckon_engine::schedule::ScanScheduler::new(
        w.ledger.clone(),
        "browser-test".into(),
        reckon_web::metrics::Metrics::new(),
        egress.clone(),
    );
    let ctx = reckon_engine::reconcile::ReconcileCtx::new(w.ledger.clone()).with_egress(egress);
    let (ledger, tenant) = (w.ledger.clone(), w.a.clone());
    let background = tokio::spawn(async move {
        loop {
            let now = reckon_domain::time::now();
            for (t, s) in ledger.all_scanned_sources().await.unwrap() {
                if s.scan_due(now) {
                    scans.scan_claimed(t, s, now).await;
                }
            }
            reckon_engine::reconcile::reconcile_all(&ctx, &tenant)
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });

    let driver = start_driver().await;
    let c = browser(&driver, true).await;
    sign_in(&c, &base, "alice@acme.test").await;
    let started = std::time::Instant::now();

    // Add the source: the path is typed in plain sight, not masked as a secret.
    c.goto(&format!("{base}/t/acme/settings")).await.unwrap();
    click(&c, "details summary").await;
    let dsn_type = c
        .find(Locator::Css("#source-form input[name=dsn]"))
        .await
        .unwrap()
        .attr("type")
        .await
        .unwrap();
    assert_eq!(
        dsn_type.as_deref(),
        Some("text"),
        "a SQLite path is not a secret"
    );
    fill(&c, "#source-form input[name=name]", "shop").await;
    c.find(Locator::Css("#source-form select[name=kind]"))
        .await
        .unwrap()
        .select_by_value("sqlite")
        .await
        .unwrap();
    fill(&c, "#source-form input[name=dsn]", store.to_str().unwrap()).await;
    submit(&c, "#source-form button[type=submit]").await;
    let added = text_of(&c, "#settings-message").await;
    assert!(added.contains("Source shop added"), "{added}");
    let checks = text_of(&c, "#source-checks").await;
    assert!(checks.contains("ok connection"), "{checks}");
    assert!(checks.contains("ok table"), "{checks}");
    assert!(
        checks.contains("failed scanned") && checks.contains("Scan now"),
        "{checks}"
    );
    shot(&c, "connect-added").await;

    // Scan now, then Check until the scan is in: the unknowns, and the unrouted operation.
    submit(&c, "button[aria-label='Scan shop now']").await;
    let mut checks = String::new();
    for _ in 0..60 {
        submit(&c, "button[aria-label='Check shop']").await;
        checks = text_of(&c, "#source-checks").await;
        if checks.contains("ok scanned") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(checks.contains("2 unknown"), "{checks}");
    assert!(
        checks.contains("failed routes")
            && checks.contains("no provider routed for operation charge of source shop")
            && checks.contains("Routing"),
        "{checks}"
    );
    shot(&c, "connect-checks").await;

    // The queue says so, and shows "not routed" where a countdown was.
    c.goto(&format!("{base}/t/acme/queue")).await.unwrap();
    let banner = text_of(&c, "#unrouted").await;
    assert!(
        banner.contains("No provider routed for operation charge of source shop")
            && banner.contains("reckon route set --tenant acme --source shop --operation charge"),
        "{banner}"
    );
    let row = text_of(&c, &format!("tr[data-key='{never}']")).await;
    assert!(row.contains("not routed"), "{row}");
    shot(&c, "connect-queue-unrouted").await;

    // A provider and the route, from the settings page.
    c.goto(&format!("{base}/t/acme/settings")).await.unwrap();
    let summaries = c.find_all(Locator::Css("details summary")).await.unwrap();
    summaries[1].click().await.unwrap();
    fill(&c, "#provider-form input[name=name]", "pay").await;
    c.find(Locator::Css("#provider-form select[name=kind]"))
        .await
        .unwrap()
        .select_by_value("demo")
        .await
        .unwrap();
    fill(
        &c,
        "#provider-form textarea[name=settings]",
        &format!(r#"{{"base_url": "{provider_url}"}}"#),
    )
    .await;
    submit(&c, "#provider-form button[type=submit]").await;
    c.wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css("#route-form"))
        .await
        .unwrap();
    fill(&c, "#route-form input[name=operation]", "charge").await;
    c.find(Locator::Css("#route-form select[name=provider]"))
        .await
        .unwrap()
        .select_by_value("pay")
        .await
        .unwrap();
    submit(&c, "#route-form button[type=submit]").await;
    submit(&c, "button[aria-label='Check shop']").await;
    let checks = text_of(&c, "#source-checks").await;
    assert!(
        checks.contains("ok routes") && checks.contains("charge → pay"),
        "{checks}"
    );

    // Verdicts: the queue empties (a just-written store's lookups are final once their
    // window has passed), and the charged order reads as applied.
    let mut empty = String::new();
    for _ in 0..120 {
        c.goto(&format!("{base}/t/acme/queue")).await.unwrap();
        empty = text_of(&c, "#queue-rows").await;
        if empty.contains("No unresolved effects") {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let took = started.elapsed();
    assert!(empty.contains("No unresolved effects"), "{empty}");
    shot(&c, "connect-verdicts").await;
    c.goto(&format!("{base}/t/acme/effects/shop/{charged}"))
        .await
        .unwrap();
    let page = text_of(&c, "main").await;
    assert!(page.contains("applied"), "{page}");
    c.goto(&format!("{base}/t/acme/effects/shop/{never}"))
        .await
        .unwrap();
    let page = text_of(&c, "main").await;
    assert!(
        page.contains("not_applied") || page.contains("not applied"),
        "{page}"
    );
    println!(
        "connect flow in the browser: from the first click to every unknown with a verdict \
         in {:.1} s",
        took.as_secs_f64()
    );
    background.abort();
    c.close().await.unwrap();
}

/// The audit page's day in a browser whose locale writes dates month first (en-US): the
/// day is typed and shown as reckon writes days for machines and commands (YYYY-MM-DD, as
/// `reckon audit --date` and the API take it), never in the browser's own order, and the
/// heading beside it says the chosen day in reckon's words. A day written another way is
/// refused by the browser before it is sent; the previous-day link steps the field too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_day_reads_the_same_in_a_month_first_locale() {
    let _one = ONE_BROWSER.lock().await;
    let s = serve().await;
    let driver = start_driver().await;
    let c = browser_in(&driver, true, Some("en-US")).await;
    let base = &s.base;
    sign_in(&c, base, "alice@acme.test").await;
    c.goto(&format!("{base}/t/acme/audit")).await.unwrap();
    let yesterday = reckon_audit::DayWindow::yesterday(reckon_domain::time::now(), "UTC")
        .unwrap()
        .date;
    let field = |c: &Client| {
        let c = c.clone();
        async move {
            c.find(Locator::Css("#day"))
                .await
                .unwrap()
                .prop("value")
                .await
                .unwrap()
                .unwrap_or_default()
        }
    };
    assert_eq!(field(&c).await, yesterday);

    // Three days before yesterday, typed as reckon writes a day.
    let civil: jiff::civil::Date = yesterday.parse().unwrap();
    let day = civil
        .checked_sub(jiff::Span::new().days(3))
        .unwrap()
        .to_string();
    fill(&c, "#day", &day).await;
    click(&c, "form.filters button[type=submit]").await;
    let words = reckon_engine::when::day_text(&day);
    let heading = wait_text(&c, "#audit-day", &words).await;
    assert!(!heading.contains("(yesterday)"), "{heading}");
    assert_eq!(field(&c).await, day);
    // The field says how it is written.
    let label = text_of(&c, "label[for=day]").await;
    assert!(label.contains("YYYY-MM-DD"), "{label}");
    shot(&c, "audit-day-en-us").await;

    // Month first, as an en-US date input would have it: refused before it is sent.
    fill(&c, "#day", "12/05/2026").await;
    click(&c, "form.filters button[type=submit]").await;
    let mismatch = c
        .execute(
            "return document.getElementById('day').validity.patternMismatch;",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(mismatch, json!(true));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(text_of(&c, "#audit-day").await.contains(&words));

    // The previous day, by its link: the page and the field both move to it.
    let before = civil
        .checked_sub(jiff::Span::new().days(4))
        .unwrap()
        .to_string();
    click(&c, "#audit-report .pager a").await;
    wait_text(&c, "#audit-day", &reckon_engine::when::day_text(&before)).await;
    for _ in 0..50 {
        if field(&c).await == before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(field(&c).await, before);

    c.close().await.unwrap();
    s.w.finish().await;
}
