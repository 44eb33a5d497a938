//! The dashboard through the whole router: every page and partial with its role
//! checks, escaping of tenant data, the actions (resolve by hand with a required note), the
//! tenant in the path, static files and bad input. These are also the "works without
//! JavaScript" tests: each request is what a browser without JavaScript sends (links, GET
//! forms, POST forms), and each answer is a whole page. The browser tests are in
//! `browser.rs`.

use crate::common;

use axum::http::{Method, StatusCode};
use common::{Backend, Reply, Req, World, form, same_origin, send, session, user};
use reckon_ledger::Role;
use serde_json::json;

const SRC: &str = "shop";
const EVIL: &str = "charge:v1:<script>alert(1)</script>";

/// Tenant A (acme) gets a push source with unresolved effects, one done charge, and one
/// effect whose key is hostile markup.
async fn seed(w: &World) {
    let r = send(
        &w.app,
        Method::POST,
        "/api/v1/sources",
        Req {
            token: Some(&w.token_a),
            content_type: Some("application/json"),
            body: json!({"name": SRC, "kind": "push"}).to_string(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let now = reckon_domain::time::now();
    let rec = |key: &str, state: &str, age: f64| {
        json!({
            "key": key, "state": state, "request_hash": "1:abc",
            "response": if state == "succeeded" { json!({"id": "ch_1"}) } else { json!(null) },
            "attempts": 1, "created_at": now - age - 1.0, "updated_at": now - age,
        })
    };
    let records = json!([
        rec("charge:v1:ORD-1", "unknown", 7200.0),
        rec("charge:v1:ORD-2", "unknown", 60.0),
        rec("charge:v1:ORD-3", "succeeded", 600.0),
        rec(EVIL, "unknown", 30.0),
    ]);
    let r = send(
        &w.app,
        Method::POST,
        &format!("/api/v1/effects?source={SRC}"),
        Req {
            token: Some(&w.token_a),
            content_type: Some("application/json"),
            body: records.to_string(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
}

async fn get(w: &World, cookie: &str, uri: &str) -> Reply {
    send(
        &w.app,
        Method::GET,
        uri,
        Req {
            cookie: Some(cookie),
            ..Default::default()
        },
    )
    .await
}

async fn get_htmx(w: &World, cookie: &str, uri: &str) -> Reply {
    send(
        &w.app,
        Method::GET,
        uri,
        Req {
            cookie: Some(cookie),
            headers: vec![("hx-request", "true".into())],
            ..Default::default()
        },
    )
    .await
}

async fn post(w: &World, cookie: &str, uri: &str, pairs: &[(&str, &str)], htmx: bool) -> Reply {
    let mut headers = same_origin();
    if htmx {
        headers.push(("hx-request", "true".into()));
    }
    send(
        &w.app,
        Method::POST,
        uri,
        Req {
            cookie: Some(cookie),
            headers,
            content_type: Some("application/x-www-form-urlencoded"),
            body: form(pairs),
            ..Default::default()
        },
    )
    .await
}

fn effect_path(key: &str) -> String {
    format!(
        "{SRC}/{}",
        url::form_urlencoded::byte_serialize(key.as_bytes()).collect::<String>()
    )
}

async fn resolution(w: &World, key: &str) -> Option<reckon_ledger::Resolution> {
    let e = w
        .ledger
        .get_effect(w.a.id, SRC, key)
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

/// No inline script, no inline style: what the CSP would refuse is never sent. And the
/// page's `<title>` is text (a template block that swallowed markup shows up there).
fn assert_csp_clean(html: &str) {
    let title = html
        .split("<title>")
        .nth(1)
        .and_then(|t| t.split("</title>").next())
        .unwrap_or_default();
    assert!(!title.contains('<'), "markup in the title: {title}");
    for chunk in html.split("<script").skip(1) {
        let tag = chunk.split('>').next().unwrap_or_default();
        assert!(tag.contains("src="), "an inline script: <script{tag}>");
    }
    assert!(!html.contains("<style"), "an inline <style>");
    assert!(!html.contains(" style="), "an inline style attribute");
    assert!(!html.contains(" onclick="), "an inline event handler");
}

#[tokio::test]
async fn every_page_renders_with_real_effects_for_an_admin() {
    let w = World::new(Backend::Sqlite).await;
    seed(&w).await;
    let (cookie, _) = session(&w.app, "alice@acme.test").await;

    let r = get(&w, &cookie, "/t/acme").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.text.contains("data-kind=\"unknown\""), "{}", r.text);
    assert!(r.text.contains("oldest for"), "{}", r.text);
    assert!(r.text.contains("<svg"), "the chart is inline SVG");
    assert!(r.text.contains(">shop</td>"), "the source's health row");
    assert!(
        r.text.contains("id=\"no-audit\""),
        "no audit of yesterday yet, said so: {}",
        r.text
    );
    assert_eq!(r.headers["vary"], "HX-Request");
    assert_eq!(r.headers["cache-control"], "no-store");
    assert!(r.headers.contains_key("content-security-policy"));
    assert_csp_clean(&r.text);

    let r = get(&w, &cookie, "/t/acme/queue").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let one = r.text.find("charge:v1:ORD-1").expect("ORD-1 is queued");
    let two = r.text.find("charge:v1:ORD-2").expect("ORD-2 is queued");
    assert!(one < two, "oldest first");
    assert!(
        !r.text.contains("charge:v1:ORD-3"),
        "a done charge is not queued"
    );
    assert!(r.text.contains("2 h"), "ORD-1's age in words: {}", r.text);
    assert_csp_clean(&r.text);

    let r = get(&w, &cookie, "/t/acme/lookup?q=ORD-3").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(
        r.text
            .contains("Charged once: the application recorded it as done"),
        "{}",
        r.text
    );

    let r = get(
        &w,
        &cookie,
        &format!("/t/acme/effects/{}", effect_path("charge:v1:ORD-1")),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(
        r.text.contains("first_seen"),
        "the timeline has the history: {}",
        r.text
    );
    assert!(
        r.text.contains("id=\"resolve-form\""),
        "an admin may resolve"
    );
    assert_csp_clean(&r.text);

    let r = get(&w, &cookie, "/t/acme/settings").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.text.contains("API tokens"));
    assert_csp_clean(&r.text);

    let r = get(&w, &cookie, "/app").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.text.contains("href=\"/t/acme\""), "{}", r.text);
    w.finish().await;
}

#[tokio::test]
async fn htmx_requests_get_the_fragment_and_history_restores_the_page() {
    let w = World::new(Backend::Sqlite).await;
    seed(&w).await;
    let (cookie, _) = session(&w.app, "alice@acme.test").await;
    for (uri, id) in [
        ("/t/acme/queue?kind=unknown", "id=\"queue-rows\""),
        ("/t/acme/lookup?q=ORD-1", "id=\"result\""),
        ("/t/acme?days=30", "id=\"chart\""),
    ] {
        let r = get_htmx(&w, &cookie, uri).await;
        assert_eq!(r.status, StatusCode::OK, "{uri}: {}", r.text);
        assert!(
            r.text.trim_start().starts_with("<div"),
            "{uri}: a fragment: {}",
            r.text
        );
        assert!(r.text.contains(id), "{uri}: {}", r.text);
        assert!(!r.text.contains("<html"), "{uri}");
        assert_eq!(r.headers["vary"], "HX-Request", "{uri}");
        let full = send(
            &w.app,
            Method::GET,
            uri,
            Req {
                cookie: Some(&cookie),
                headers: vec![
                    ("hx-request", "true".into()),
                    ("hx-history-restore-request", "true".into()),
                ],
                ..Default::default()
            },
        )
        .await;
        assert!(
            full.text.contains("<html"),
            "{uri}: a history restore gets the page"
        );
    }
    w.finish().await;
}

#[tokio::test]
async fn a_key_holding_markup_comes_out_escaped_on_every_page() {
    let w = World::new(Backend::Sqlite).await;
    seed(&w).await;
    let (cookie, _) = session(&w.app, "alice@acme.test").await;
    for uri in [
        "/t/acme/queue".to_owned(),
        format!(
            "/t/acme/lookup?q={}",
            url::form_urlencoded::byte_serialize(EVIL.as_bytes()).collect::<String>()
        ),
        format!("/t/acme/effects/{}", effect_path(EVIL)),
    ] {
        let r = get(&w, &cookie, &uri).await;
        assert_eq!(r.status, StatusCode::OK, "{uri}: {}", r.text);
        assert!(
            !r.text.contains("<script>alert"),
            "{uri} carries the markup raw"
        );
        assert!(
            r.text.contains("&#60;script&#62;alert(1)&#60;/script&#62;")
                || r.text.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{uri}: {}",
            r.text
        );
    }
    w.finish().await;
}

#[tokio::test]
async fn a_resolution_by_hand_needs_a_note_and_records_who_and_why() {
    let w = World::new(Backend::Sqlite).await;
    seed(&w).await;
    user(w.ledger.as_ref(), "sam@acme.test", &w.a, Role::Support).await;
    let (cookie, csrf) = session(&w.app, "sam@acme.test").await;
    let uri = format!("/t/acme/resolve/{}", effect_path("charge:v1:ORD-1"));

    let r = post(
        &w,
        &cookie,
        &uri,
        &[("csrf", &csrf), ("outcome", "applied"), ("note", "  ")],
        false,
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert!(r.text.contains("A note is required"), "{}", r.text);
    let r = post(
        &w,
        &cookie,
        &uri,
        &[("csrf", &csrf), ("outcome", "maybe"), ("note", "x")],
        false,
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    let r = post(
        &w,
        &cookie,
        &uri,
        &[("csrf", "wrong"), ("outcome", "applied"), ("note", "x")],
        false,
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
    // A cross-site form post (another origin) is refused before the handler.
    let r = send(
        &w.app,
        Method::POST,
        &uri,
        Req {
            cookie: Some(&cookie),
            headers: vec![
                ("origin", "https://evil.test".into()),
                ("sec-fetch-site", "cross-site".into()),
            ],
            content_type: Some("application/x-www-form-urlencoded"),
            body: form(&[("csrf", &csrf), ("outcome", "applied"), ("note", "x")]),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
    assert!(
        resolution(&w, "charge:v1:ORD-1").await.is_none(),
        "nothing was resolved"
    );

    // Without JavaScript: Post/Redirect/Get back to the effect.
    let r = post(
        &w,
        &cookie,
        &uri,
        &[
            ("csrf", &csrf),
            ("outcome", "not_applied"),
            ("note", "refunded <b>by hand</b>"),
        ],
        false,
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    assert_eq!(
        r.location(),
        Some(format!("/t/acme/effects/{}", "shop/charge%3Av1%3AORD-1").as_str())
    );
    let res = resolution(&w, "charge:v1:ORD-1").await.expect("resolved");
    assert_eq!(res.author, "sam@acme.test");
    assert_eq!(res.outcome.as_str(), "not_applied");
    assert_eq!(res.note.as_deref(), Some("refunded <b>by hand</b>"));
    let page = get(&w, &cookie, r.location().unwrap()).await;
    assert!(
        page.text
            .contains("Resolved as <strong>not_applied</strong> by sam@acme.test"),
        "{}",
        page.text
    );
    assert!(
        page.text.contains("refunded &#60;b&#62;by hand")
            || page.text.contains("refunded &lt;b&gt;by hand"),
        "{}",
        page.text
    );
    assert!(
        !page.text.contains("id=\"resolve-form\""),
        "no second resolution offered"
    );
    let queue = get(&w, &cookie, "/t/acme/queue").await;
    assert!(
        !queue.text.contains("charge:v1:ORD-1"),
        "a resolved effect leaves the queue"
    );

    // With htmx: the live part of the page comes back, with the new timeline entry.
    let uri2 = format!("/t/acme/resolve/{}", effect_path("charge:v1:ORD-2"));
    let r = post(
        &w,
        &cookie,
        &uri2,
        &[
            ("csrf", &csrf),
            ("outcome", "applied"),
            ("note", "in the provider"),
        ],
        true,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(
        r.text.trim_start().starts_with("<div id=\"effect-live\""),
        "{}",
        r.text
    );
    assert!(
        r.text.contains("resolved as applied by sam@acme.test"),
        "{}",
        r.text
    );
    // Twice: refused, the first stands.
    let r = post(
        &w,
        &cookie,
        &uri2,
        &[
            ("csrf", &csrf),
            ("outcome", "not_applied"),
            ("note", "again"),
        ],
        false,
    )
    .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    assert_eq!(
        resolution(&w, "charge:v1:ORD-2")
            .await
            .unwrap()
            .outcome
            .as_str(),
        "applied"
    );
    w.finish().await;
}

#[tokio::test]
async fn a_viewer_sees_summaries_but_no_record_and_its_posts_are_refused() {
    let w = World::new(Backend::Sqlite).await;
    seed(&w).await;
    user(w.ledger.as_ref(), "vic@acme.test", &w.a, Role::Viewer).await;
    let (cookie, csrf) = session(&w.app, "vic@acme.test").await;
    // The overview: counts and ages, no key, no link to the records.
    let r = get(&w, &cookie, "/t/acme").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.text.contains("Unresolved now"), "{}", r.text);
    assert!(!r.text.contains("charge:v1:ORD-1"), "{}", r.text);
    assert!(
        !r.text.contains("/queue"),
        "no link to the queue for a viewer"
    );
    assert!(
        !r.text.contains("/resolve/"),
        "no resolve action for a viewer"
    );
    assert!(
        !r.text.contains("/settings\""),
        "no settings link for a viewer"
    );
    for uri in [
        "/t/acme/queue".to_owned(),
        format!("/t/acme/effects/{}", effect_path("charge:v1:ORD-1")),
        "/t/acme/lookup?q=ORD-1".to_owned(),
        "/t/acme/settings".to_owned(),
    ] {
        let r = get(&w, &cookie, &uri).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{uri}: {}", r.text);
        assert!(!r.text.contains("charge:v1:ORD-1"), "{uri}: {}", r.text);
    }
    // Support sees the queue's records.
    user(w.ledger.as_ref(), "sam@acme.test", &w.a, Role::Support).await;
    let (support, _) = session(&w.app, "sam@acme.test").await;
    let r = get(&w, &support, "/t/acme/queue").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.text.contains("charge:v1:ORD-1"), "{}", r.text);
    for action in ["resolve", "reconcile"] {
        let uri = format!("/t/acme/{action}/{}", effect_path("charge:v1:ORD-1"));
        let r = post(
            &w,
            &cookie,
            &uri,
            &[("csrf", &csrf), ("outcome", "applied"), ("note", "x")],
            false,
        )
        .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{uri}: {}", r.text);
    }
    assert!(resolution(&w, "charge:v1:ORD-1").await.is_none());
    w.finish().await;
}

#[tokio::test]
async fn another_tenants_effect_is_not_found_by_path_or_by_name() {
    let w = World::new(Backend::Sqlite).await;
    seed(&w).await;
    let (cookie, csrf) = session(&w.app, "bob@globex.test").await;
    let tail = effect_path("charge:v1:ORD-1");
    for uri in [
        format!("/t/acme/effects/{tail}"),
        format!("/t/globex/effects/{tail}"),
        "/t/acme".to_owned(),
        "/t/nonesuch/queue".to_owned(),
    ] {
        let r = get(&w, &cookie, &uri).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{uri}: {}", r.text);
        assert!(!r.text.contains("ORD-1"), "{uri}");
    }
    let r = post(
        &w,
        &cookie,
        &format!("/t/globex/resolve/{tail}"),
        &[("csrf", &csrf), ("outcome", "applied"), ("note", "x")],
        false,
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    assert!(resolution(&w, "charge:v1:ORD-1").await.is_none());
    let r = get(&w, &cookie, "/t/globex/queue").await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(!r.text.contains("ORD-"), "B's queue holds nothing of A");
    w.finish().await;
}

#[tokio::test]
async fn a_person_in_two_tenants_switches_by_path_with_the_role_of_each() {
    let w = World::new(Backend::Sqlite).await;
    seed(&w).await;
    let carol = user(w.ledger.as_ref(), "carol@acme.test", &w.a, Role::Support).await;
    w.ledger
        .set_membership(w.b.id, carol, Role::Viewer)
        .await
        .unwrap();
    let r = common::sign_in(
        &w.app,
        "carol@acme.test",
        common::PASSWORD,
        &[("tenant", "acme")],
    )
    .await;
    let cookie = r.session_cookie().unwrap();
    let home = get(&w, &cookie, "/app").await;
    assert!(
        home.text.contains("href=\"/t/acme\"") && home.text.contains("href=\"/t/globex\""),
        "{}",
        home.text
    );
    assert_eq!(
        get(&w, &cookie, "/t/acme/lookup?q=ORD-1").await.status,
        StatusCode::OK
    );
    assert_eq!(get(&w, &cookie, "/t/globex").await.status, StatusCode::OK);
    // A viewer in globex: its summaries, no records (no queue, no lookup) there.
    for uri in ["/t/globex/queue", "/t/globex/lookup?q=ORD-1"] {
        assert_eq!(
            get(&w, &cookie, uri).await.status,
            StatusCode::FORBIDDEN,
            "{uri}"
        );
    }
    assert_eq!(
        get(&w, &cookie, "/t/acme/queue").await.status,
        StatusCode::OK
    );
    w.finish().await;
}

#[tokio::test]
async fn bad_input_gets_a_clear_400() {
    let w = World::new(Backend::Sqlite).await;
    seed(&w).await;
    let (cookie, _) = session(&w.app, "alice@acme.test").await;
    let long = format!("/t/acme/lookup?q={}", "x".repeat(600));
    for (uri, says) in [
        ("/t/acme/queue?kind=bogus", "kind must be"),
        ("/t/acme/queue?outcome=maybe", "outcome must be"),
        ("/t/acme/queue?after=yesterday", "after must be"),
        ("/t/acme?days=5", "days must be 7 or 30"),
        (long.as_str(), "too long"),
    ] {
        let r = get(&w, &cookie, uri).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{uri}: {}", r.text);
        assert!(r.text.contains(says), "{uri}: {}", r.text);
    }
    w.finish().await;
}

#[tokio::test]
async fn the_queue_filters_and_pages_without_javascript() {
    let w = World::new(Backend::Sqlite).await;
    seed(&w).await;
    let (cookie, _) = session(&w.app, "alice@acme.test").await;
    let r = get(&w, &cookie, "/t/acme/queue?source=shop&kind=abandoned").await;
    assert!(
        r.text
            .contains("No unresolved effects match these filters."),
        "{}",
        r.text
    );
    let r = get(
        &w,
        &cookie,
        "/t/acme/queue?source=&operation=charge&kind=&provider=&outcome=",
    )
    .await;
    assert!(
        r.text.contains("charge:v1:ORD-1"),
        "empty fields filter nothing: {}",
        r.text
    );
    w.finish().await;
}

#[tokio::test]
async fn the_chart_draws_the_hourly_snapshots() {
    let w = World::new(Backend::Sqlite).await;
    seed(&w).await;
    let now = reckon_domain::time::now();
    for h in 0..5 {
        w.ledger
            .take_snapshot(w.a.id, now - f64::from(h) * 3600.0)
            .await
            .unwrap();
    }
    let taken = reckon_engine::snapshot::snapshot_all(w.ledger.as_ref(), now)
        .await
        .unwrap();
    assert_eq!(taken.len(), 2, "one per tenant");
    let (cookie, _) = session(&w.app, "alice@acme.test").await;
    let r = get(&w, &cookie, "/t/acme?days=7").await;
    assert!(r.text.contains("<path d=\"M"), "{}", r.text);
    assert!(r.text.contains("now 3 unresolved"), "{}", r.text);
    w.finish().await;
}

#[tokio::test]
async fn static_files_are_embedded_typed_and_cached_for_good() {
    let w = World::new(Backend::Sqlite).await;
    let r = send(
        &w.app,
        Method::GET,
        "/static/htmx-2.0.11.min.js",
        Req::default(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers["content-type"], "text/javascript; charset=utf-8");
    assert_eq!(
        r.headers["cache-control"],
        "public, max-age=31536000, immutable"
    );
    assert!(r.text.starts_with("var htmx="));
    let css = reckon_web::dash::assets::css_href();
    let r = send(&w.app, Method::GET, &css, Req::default()).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers["content-type"], "text/css; charset=utf-8");
    let r = send(&w.app, Method::GET, "/static/../Cargo.toml", Req::default()).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = send(&w.app, Method::GET, "/static/reckon.css", Req::default()).await;
    assert_eq!(
        r.status,
        StatusCode::NOT_FOUND,
        "only the fingerprinted name is served"
    );
    // The icon browsers ask for on every page, unauthenticated.
    let r = send(&w.app, Method::GET, "/favicon.ico", Req::default()).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers["content-type"], "image/svg+xml");
    assert!(r.text.starts_with("<svg"));
    w.finish().await;
}

#[tokio::test]
async fn the_pages_read_the_postgresql_ledger_too() {
    let w = World::new(Backend::Postgres).await;
    seed(&w).await;
    let (cookie, csrf) = session(&w.app, "alice@acme.test").await;
    for uri in [
        "/t/acme",
        "/t/acme/queue",
        "/t/acme/lookup?q=ORD-1",
        "/t/acme/settings",
    ] {
        let r = get(&w, &cookie, uri).await;
        assert_eq!(r.status, StatusCode::OK, "{uri}: {}", r.text);
    }
    let uri = format!("/t/acme/resolve/{}", effect_path("charge:v1:ORD-1"));
    let r = post(
        &w,
        &cookie,
        &uri,
        &[("csrf", &csrf), ("outcome", "applied"), ("note", "seen")],
        false,
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    assert!(
        !get(&w, &cookie, "/t/acme/queue")
            .await
            .text
            .contains("charge:v1:ORD-1")
    );
    w.finish().await;
}

// The audit page.

/// Yesterday's date in UTC (the tenants' default zone).
fn yesterday() -> String {
    reckon_audit::DayWindow::yesterday(reckon_domain::time::now(), "UTC")
        .unwrap()
        .date
}

/// A complete run of `day` for tenant A: a duplicate in dollars (refunded nothing), an
/// orphan in euros, and the day's totals.
async fn record_run(w: &World, day: &str) -> i64 {
    let start = reckon_audit::DayWindow::new(day, "UTC").unwrap().start;
    let run = reckon_ledger::NewAuditRun {
        day: day.into(),
        time_zone: "UTC".into(),
        window_start: start,
        window_end: start + 86400.0,
        provider: "*".into(),
        triggered_by: "schedule".into(),
        status: "complete".into(),
        reason: None,
        started_at: start + 90000.0,
        finished_at: start + 90001.0,
        counts: json!({"findings": {"duplicate": 1, "orphan": 1}, "effects_in_day": 3,
                       "charges_in_day": 4}),
        findings: json!([
            {"kind": "orphan", "summary": "charge ch_orphan matches no effect",
             "effects": [], "amount": 1999, "currency": "eur", "refunded": false,
             "charges": [{"id": "ch_orphan", "amount": 1999, "currency": "eur",
                          "status": "succeeded", "amount_refunded": 0, "customer": null,
                          "created": start + 3600.0}],
             "suggestions": []},
            {"kind": "duplicate", "summary": "charge:v1:ORD-7 was charged 2 times",
             "effects": [{"source": SRC, "key": "charge:v1:ORD-7", "operation": "charge",
                          "subject": "ORD-7", "state": "succeeded", "attempts": 2,
                          "created_at": start + 7200.0}],
             "amount": 2000, "currency": "usd", "refunded": false,
             "charges": [
                {"id": "ch_first", "amount": 2000, "currency": "usd", "status": "succeeded",
                 "amount_refunded": 0, "customer": null, "created": start + 7201.0},
                {"id": "ch_again", "amount": 2000, "currency": "usd", "status": "succeeded",
                 "amount_refunded": 0, "customer": null, "created": start + 7260.0}],
             "suggestions": []}
        ]),
        totals: json!([
            {"currency": "eur", "charged": 1999, "refunded": 0, "net": 1999, "matched": 0,
             "unmatched": 1999},
            {"currency": "usd", "charged": 6000, "refunded": 0, "net": 6000, "matched": 6000,
             "unmatched": 0}
        ]),
        evidence: json!({"pages": []}),
    };
    w.ledger
        .record_audit_run(w.a.id, run, None)
        .await
        .unwrap()
        .id
}

#[tokio::test]
async fn the_audit_page_shows_yesterdays_findings_by_kind_with_amounts_and_totals() {
    let w = World::new(Backend::Sqlite).await;
    seed(&w).await;
    let day = yesterday();
    let id = record_run(&w, &day).await;
    user(w.ledger.as_ref(), "fin@acme.test", &w.a, Role::Finance).await;
    let (cookie, _) = session(&w.app, "fin@acme.test").await;

    // Yesterday by default.
    let r = get(&w, &cookie, "/t/acme/audit").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.headers["vary"], "HX-Request");
    assert_csp_clean(&r.text);
    assert!(r.text.contains(&format!("value=\"{day}\"")), "{}", r.text);
    assert!(r.text.contains("(yesterday)"), "{}", r.text);
    assert!(
        r.text.contains("href=\"/t/acme/audit\""),
        "the nav links it"
    );
    // Grouped by kind, duplicates before orphans whatever order the run stored them in.
    let dup = r
        .text
        .find("data-kind=\"duplicate\"")
        .expect("a duplicate group");
    let orphan = r
        .text
        .find("data-kind=\"orphan\"")
        .expect("an orphan group");
    assert!(dup < orphan);
    assert!(r.text.contains("Duplicate charges"), "{}", r.text);
    assert!(r.text.contains("charged twice: $20.00 extra"), "{}", r.text);
    assert!(r.text.contains("charged, no order: €19.99"), "{}", r.text);
    // A run stored before findings said what to do is advised when shown.
    assert!(
        r.text
            .contains("Refund ch_again (20.00 USD) to the customer of order ORD-7; keep ch_first"),
        "{}",
        r.text
    );
    assert!(r.text.contains("ch_again"));
    assert!(
        r.text
            .contains("href=\"/t/acme/effects/shop/charge%3Av1%3AORD-7\""),
        "the effect links to its page: {}",
        r.text
    );
    // Totals per currency, from minor units.
    let totals = r.text.split("id=\"audit-totals\"").nth(1).expect("totals");
    assert!(
        totals.contains("<td>USD</td><td class=\"num\">$60.00</td>"),
        "{totals}"
    );
    assert!(
        totals.contains("<td>EUR</td><td class=\"num\">€19.99</td>"),
        "{totals}"
    );
    // The history, with the chain verified.
    assert!(
        r.text.contains(
            "1 runs in the chain: every link verified, and the content of every run on this page"
        ),
        "{}",
        r.text
    );
    assert!(r.text.contains("<span class=\"badge ok\">verified</span>"));
    let csv_href = format!("/t/acme/audit/{id}/csv");
    assert!(
        r.text.contains(&format!("href=\"{csv_href}\"")),
        "{}",
        r.text
    );

    // The CSV: the engine's, with one row per finding, and the export is in the audit log.
    let r = get(&w, &cookie, &csv_href).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(
        r.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/csv")
    );
    assert!(
        r.headers["content-disposition"]
            .to_str()
            .unwrap()
            .contains(&format!("reckon-audit-acme-{day}-{id}.csv"))
    );
    let mut rd = csv::Reader::from_reader(r.text.as_bytes());
    let kinds: Vec<String> = rd.records().map(|x| x.unwrap()[4].to_owned()).collect();
    // The findings, then the day's totals per currency.
    assert_eq!(kinds, vec!["orphan", "duplicate", "total", "total"]);
    let log = w.ledger.list_actions(w.a.id, None, 10).await.unwrap();
    let export = log.iter().find(|a| a.action == "export").expect("logged");
    assert_eq!(export.actor, "user:fin@acme.test");
    assert_eq!(
        export.target.as_deref(),
        Some(format!("audit:{id}").as_str())
    );

    // htmx: the report alone; another day without a run says so.
    let r = get_htmx(&w, &cookie, "/t/acme/audit?day=2020-02-29").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(
        r.text.trim_start().starts_with("<div id=\"audit-report\""),
        "{}",
        r.text
    );
    assert!(r.text.contains("No audit of 2020-02-29 yet"), "{}", r.text);
    assert_eq!(r.headers["vary"], "HX-Request");

    // Someone edits the stored run behind reckon's back: the page says so.
    use sqlx::Connection;
    let mut db = sqlx::SqliteConnection::connect_with(
        &sqlx::sqlite::SqliteConnectOptions::new().filename(w.data_dir().join("reckon.db")),
    )
    .await
    .unwrap();
    sqlx::query("UPDATE audit_run SET findings = '[]' WHERE id = ?")
        .bind(id)
        .execute(&mut db)
        .await
        .unwrap();
    db.close().await.unwrap();
    let r = get(&w, &cookie, "/t/acme/audit").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(
        r.text
            .contains("The chain does not verify: run #1: its content does not match"),
        "{}",
        r.text
    );
    assert!(!r.text.contains("<span class=\"badge ok\">verified</span>"));
    w.finish().await;
}

/// A run of `day` for tenant A with `status` and `findings` (JSON as a run stores them).
async fn record_day_run(w: &World, day: &str, status: &str, findings: serde_json::Value) -> i64 {
    let start = reckon_audit::DayWindow::new(day, "UTC").unwrap().start;
    let kinds: serde_json::Map<String, serde_json::Value> = findings
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["kind"].as_str().unwrap().to_owned(), json!(1)))
        .collect();
    let run = reckon_ledger::NewAuditRun {
        day: day.into(),
        time_zone: "UTC".into(),
        window_start: start,
        window_end: start + 86400.0,
        provider: "*".into(),
        triggered_by: "operator".into(),
        status: status.into(),
        reason: (status != "complete").then(|| "provider legacy: HTTP 503".into()),
        started_at: start + 90000.0,
        finished_at: start + 90001.0,
        counts: json!({"findings": kinds, "effects_in_day": 3, "charges_in_day": 3}),
        findings,
        totals: json!([]),
        evidence: json!({"pages": []}),
    };
    w.ledger
        .record_audit_run(w.a.id, run, None)
        .await
        .unwrap()
        .id
}

#[tokio::test]
async fn the_overview_the_audit_page_and_the_api_show_the_same_run_of_a_day() {
    let w = World::new(Backend::Sqlite).await;
    let day = yesterday();
    let start = reckon_audit::DayWindow::new(&day, "UTC").unwrap().start;
    let charge = |id: &str, amount: i64, at: f64| {
        json!({"id": id, "amount": amount, "currency": "usd", "status": "succeeded",
               "amount_refunded": 0, "customer": "cus_7", "created": start + at})
    };
    // The day's complete run: ORD-7 charged twice while the shop's row says unknown, and a
    // reclaim that charged once.
    let complete = record_day_run(
        &w,
        &day,
        "complete",
        json!([
            {"kind": "duplicate", "summary": "2 successful charges for key charge:v1:ORD-7",
             "effects": [{"source": SRC, "key": "charge:v1:ORD-7", "operation": "charge",
                          "subject": "ORD-7", "state": "unknown", "attempts": 1,
                          "created_at": start + 7200.0, "verdict": "duplicate"}],
             "amount": 5400, "currency": "usd", "refunded": false,
             "charges": [charge("ch_first", 5400, 7201.0), charge("ch_again", 5400, 7221.0)],
             "suggestions": []},
            {"kind": "risky_reclaim",
             "summary": "charge:v1:ORD-8 was attempted 2 times; the provider shows 1 successful charge",
             "effects": [{"source": SRC, "key": "charge:v1:ORD-8", "operation": "charge",
                          "subject": "ORD-8", "state": "succeeded", "attempts": 2,
                          "created_at": start + 8000.0}],
             "amount": 14400, "currency": "usd", "refunded": false,
             "charges": [charge("ch_once", 14400, 8001.0)],
             "suggestions": []}
        ]),
    )
    .await;
    // A newer run of the same day that lost a provider half-way: only an orphan.
    let partial = record_day_run(
        &w,
        &day,
        "partial",
        json!([
            {"kind": "orphan", "summary": "charge ch_orphan matches no recorded effect",
             "effects": [], "amount": 999, "currency": "usd", "refunded": false,
             "charges": [charge("ch_orphan", 999, 9000.0)], "suggestions": []}
        ]),
    )
    .await;
    assert!(partial > complete);
    user(w.ledger.as_ref(), "fin@acme.test", &w.a, Role::Finance).await;
    let (cookie, _) = session(&w.app, "fin@acme.test").await;

    let overview = get(&w, &cookie, "/t/acme").await;
    assert_eq!(overview.status, StatusCode::OK, "{}", overview.text);
    let page = get(&w, &cookie, "/t/acme/audit").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.text);
    // The same findings on both: the overview's cards are the page's groups.
    let kinds_in = |html: &str, attr: &str| -> Vec<String> {
        html.split(attr)
            .skip(1)
            .map(|s| s.split('"').next().unwrap().replace(' ', "_"))
            .collect()
    };
    assert_eq!(
        kinds_in(&overview.text, "data-finding=\""),
        ["duplicate", "risky_reclaim"],
        "{}",
        overview.text
    );
    assert_eq!(
        kinds_in(&page.text, "data-kind=\""),
        ["duplicate", "risky_reclaim"],
        "{}",
        page.text
    );
    // The same run, by id, on the overview, the page and the API's day.
    let run_of = |html: &str, anchor: &str| -> Option<i64> {
        html.split(anchor)
            .nth(1)?
            .split("data-run=\"")
            .nth(1)?
            .split('"')
            .next()?
            .parse()
            .ok()
    };
    assert_eq!(
        run_of(&overview.text, "id=\"audit-summary\""),
        Some(complete)
    );
    assert_eq!(run_of(&page.text, "id=\"audit-report\""), Some(complete));
    let r = send(
        &w.app,
        Method::GET,
        &format!("/api/v1/audits?date={day}"),
        Req {
            token: Some(&w.token_a),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let v: serde_json::Value = serde_json::from_str(&r.text).unwrap();
    assert_eq!(v["day_run"], complete, "{v:#}");
    // The newer run's failure is said beside the day's run, on both.
    assert!(
        overview.text.contains("provider legacy: HTTP 503"),
        "{}",
        overview.text
    );
    assert!(
        page.text.contains("id=\"audit-newer-failure\"")
            && page.text.contains("provider legacy: HTTP 503"),
        "{}",
        page.text
    );

    // What to do, for whom, with which charge; reckon's verdict beside the shop's state.
    let group = |kind: &str| {
        page.text
            .split(&format!("data-kind=\"{kind}\""))
            .nth(1)
            .and_then(|g| g.split("</section>").next())
            .unwrap_or_else(|| panic!("no {kind} group: {}", page.text))
            .to_owned()
    };
    let dup = group("duplicate");
    assert!(
        dup.contains(
            "Refund ch_again (54.00 USD) to cus_7 (order ORD-7); keep ch_first (54.00 USD)"
        ),
        "{dup}"
    );
    assert!(
        dup.contains("data-app-state=\"unknown\" data-verdict=\"duplicate\""),
        "{dup}"
    );
    assert!(dup.contains("reckon: charged twice"), "{dup}");
    assert!(dup.contains("charged twice: $54.00 extra"), "{dup}");
    // A reclaim that charged once has nothing at stake, and says so by saying nothing.
    let reclaim = group("risky_reclaim");
    assert!(!reclaim.contains("data-at-stake"), "{reclaim}");
    assert!(!reclaim.contains("144.00 at stake"), "{reclaim}");
    assert!(
        reclaim.contains("Nothing to do: order ORD-8 was tried 2 times but charged once"),
        "{reclaim}"
    );
    // The CSV of the run the page shows says the same.
    let r = get(&w, &cookie, &format!("/t/acme/audit/{complete}/csv")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let mut rd = csv::Reader::from_reader(r.text.as_bytes());
    let header: Vec<String> = rd.headers().unwrap().iter().map(str::to_owned).collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| h == name)
            .unwrap_or_else(|| panic!("no {name} column: {header:?}"))
    };
    let rows: Vec<csv::StringRecord> = rd.records().map(|x| x.unwrap()).collect();
    let dup = rows
        .iter()
        .find(|r| &r[col("kind")] == "duplicate")
        .unwrap();
    assert!(dup[col("action")].starts_with("Refund ch_again (54.00 USD) to cus_7"));
    assert_eq!(&dup[col("effect_states")], "unknown");
    assert_eq!(&dup[col("effect_verdicts")], "duplicate");
    let reclaim = rows
        .iter()
        .find(|r| &r[col("kind")] == "risky_reclaim")
        .unwrap();
    assert_eq!(&reclaim[col("at_stake")], "");
    w.finish().await;
}

#[tokio::test]
async fn only_finance_and_admin_see_the_audit_and_another_tenants_run_is_not_found() {
    let w = World::new(Backend::Sqlite).await;
    seed(&w).await;
    let day = yesterday();
    let id = record_run(&w, &day).await;
    let csv = format!("/t/acme/audit/{id}/csv");
    for (email, role) in [
        ("sam@acme.test", Role::Support),
        ("vic@acme.test", Role::Viewer),
    ] {
        user(w.ledger.as_ref(), email, &w.a, role).await;
        let (cookie, _) = session(&w.app, email).await;
        for uri in ["/t/acme/audit", csv.as_str()] {
            let r = get(&w, &cookie, uri).await;
            assert_eq!(r.status, StatusCode::FORBIDDEN, "{email} {uri}: {}", r.text);
            assert!(!r.text.contains("ch_orphan"));
        }
        let home = get(&w, &cookie, "/t/acme/queue").await;
        assert!(!home.text.contains("/audit\""), "no audit link for {email}");
    }
    let (admin, _) = session(&w.app, "alice@acme.test").await;
    assert_eq!(
        get(&w, &admin, "/t/acme/audit").await.status,
        StatusCode::OK
    );
    assert_eq!(get(&w, &admin, &csv).await.status, StatusCode::OK);
    // Bob (admin of globex) names acme's run under his own tenant: not found.
    let (bob, _) = session(&w.app, "bob@globex.test").await;
    for uri in [
        format!("/t/globex/audit/{id}/csv"),
        format!("/t/globex/audit?day={day}&run={id}"),
        format!("/t/acme/audit/{id}/csv"),
    ] {
        let r = get(&w, &bob, &uri).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{uri}: {}", r.text);
        assert!(!r.text.contains("ch_orphan"), "{uri}");
    }
    let r = get(&w, &bob, "/t/globex/audit").await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.text.contains("No audit of"), "{}", r.text);
    assert!(!r.text.contains("ch_orphan"));
    // Bad input.
    for (uri, says) in [
        ("/t/acme/audit?day=28/11/2026", "YYYY-MM-DD"),
        ("/t/acme/audit?day=2026-02-30", "YYYY-MM-DD"),
        ("/t/acme/audit?run=abc", "run must be"),
    ] {
        let r = get(&w, &admin, uri).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{uri}: {}", r.text);
        assert!(r.text.contains(says), "{uri}: {}", r.text);
    }
    w.finish().await;
}

// Support lookup by provider object id, times in the tenant's zone.

#[tokio::test]
async fn a_provider_charge_id_finds_its_effect_and_the_verdict_says_charged_once_in_local_time() {
    let w = World::new(Backend::Sqlite).await;
    seed(&w).await;
    w.ledger
        .set_audit_settings(
            w.a.id,
            &reckon_ledger::AuditSettings {
                time_zone: "Europe/Paris".into(),
                audit_time: "06:00".into(),
            },
        )
        .await
        .unwrap();
    let pay = w
        .ledger
        .add_provider(
            w.a.id,
            reckon_ledger::NewProvider {
                name: "pay".into(),
                kind: reckon_ledger::ProviderKind::Demo,
                secret: None,
                settings: json!({"base_url": "http://127.0.0.1:9/"}),
            },
        )
        .await
        .unwrap();
    // 2026-11-28 13:02 UTC is 14:02 in Paris.
    let at = 1_795_870_920.0;
    let charge = |id: &str, key: Option<&str>, amount: i64| reckon_ledger::StoredCharge {
        provider_id: pay.id,
        charge_id: id.into(),
        payment_intent: None,
        amount,
        currency: "usd".into(),
        status: "succeeded".into(),
        amount_captured: amount,
        amount_refunded: 0,
        refunds: json!([]),
        metadata: json!({}),
        idempotency_key: key.map(str::to_owned),
        customer: None,
        created: at,
        raw: json!({"id": id}),
        imported_at: at + 86400.0,
    };
    w.ledger
        .store_provider_charges(
            w.a.id,
            &[
                charge("ch_1", Some("charge:v1:ORD-3"), 2000),
                charge("ch_stray", None, 999),
            ],
        )
        .await
        .unwrap();
    user(w.ledger.as_ref(), "sam@acme.test", &w.a, Role::Support).await;
    let (cookie, _) = session(&w.app, "sam@acme.test").await;

    let said = "Charged once: ch_1, $20.00, 28 Nov 2026 14:02 CET.";
    for q in ["ch_1", "ORD-3"] {
        let r = get(&w, &cookie, &format!("/t/acme/lookup?q={q}")).await;
        assert_eq!(r.status, StatusCode::OK, "{q}: {}", r.text);
        assert!(r.text.contains(said), "{q}: {}", r.text);
        assert!(
            r.text
                .contains("href=\"/t/acme/effects/shop/charge%3Av1%3AORD-3\""),
            "{q}: the effect is listed: {}",
            r.text
        );
        assert!(
            r.text.contains(
                "<time datetime=\"2026-11-28T13:02:00Z\" title=\"28 Nov 2026 13:02 UTC\">28 Nov 2026 14:02 CET</time>"
            ),
            "{q}: local time, UTC on hover: {}",
            r.text
        );
    }
    let r = get(&w, &cookie, "/t/acme/lookup?q=ch_stray").await;
    assert!(
        r.text.contains(
            "Charged with no order behind it: pay has a charge the application has no record of (ch_stray, $9.99, 28 Nov 2026 14:02 CET)"
        ),
        "{}",
        r.text
    );
    // Every other page writes times in the tenant's zone too.
    let r = get(&w, &cookie, "/t/acme/queue").await;
    assert!(
        r.text.contains(" CET") || r.text.contains(" CEST"),
        "{}",
        r.text
    );
    assert!(r.text.contains(" UTC)\""), "UTC on hover: {}", r.text);
    // Another tenant's charge id finds nothing.
    let (bob, _) = session(&w.app, "bob@globex.test").await;
    let r = get(&w, &bob, "/t/globex/lookup?q=ch_1").await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.text.contains("Nothing found"), "{}", r.text);
    assert!(!r.text.contains("ORD-3") && !r.text.contains("$20.00"));
    w.finish().await;
}

// The queue's bulk re-lookup.

#[tokio::test]
async fn finance_looks_up_a_providers_indeterminate_effects_again_from_the_queue() {
    let w = World::new(Backend::Sqlite).await;
    seed(&w).await;
    w.ledger
        .add_provider(
            w.a.id,
            reckon_ledger::NewProvider {
                name: "pay".into(),
                kind: reckon_ledger::ProviderKind::Demo,
                secret: None,
                // Loopback: the default egress policy refuses it, so every lookup is
                // indeterminate (a fault is never an answer).
                settings: json!({"base_url": "http://127.0.0.1:9/"}),
            },
        )
        .await
        .unwrap();
    w.ledger
        .set_route(w.a.id, SRC, "charge", Some("pay"))
        .await
        .unwrap();
    let (admin, admin_csrf) = session(&w.app, "alice@acme.test").await;
    let r = post(
        &w,
        &admin,
        &format!("/t/acme/reconcile/{}", effect_path("charge:v1:ORD-1")),
        &[("csrf", &admin_csrf)],
        false,
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    let queue = get(
        &w,
        &admin,
        "/t/acme/queue?provider=pay&outcome=indeterminate",
    )
    .await;
    assert!(queue.text.contains("charge:v1:ORD-1"), "{}", queue.text);
    assert!(queue.text.contains("id=\"requeue-form\""), "{}", queue.text);
    assert!(
        !get(&w, &admin, "/t/acme/queue")
            .await
            .text
            .contains("id=\"requeue-form\""),
        "no bulk action without a provider filter"
    );

    // Support may not; finance may.
    user(w.ledger.as_ref(), "sam@acme.test", &w.a, Role::Support).await;
    let (sam, sam_csrf) = session(&w.app, "sam@acme.test").await;
    assert!(
        !get(&w, &sam, "/t/acme/queue?provider=pay")
            .await
            .text
            .contains("id=\"requeue-form\"")
    );
    let r = post(
        &w,
        &sam,
        "/t/acme/queue/requeue",
        &[("csrf", &sam_csrf), ("provider", "pay")],
        false,
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
    user(w.ledger.as_ref(), "fin@acme.test", &w.a, Role::Finance).await;
    let (fin, fin_csrf) = session(&w.app, "fin@acme.test").await;
    for (pairs, status) in [
        (
            vec![("csrf", "wrong"), ("provider", "pay")],
            StatusCode::FORBIDDEN,
        ),
        (
            vec![("csrf", fin_csrf.as_str()), ("provider", "")],
            StatusCode::BAD_REQUEST,
        ),
        (
            vec![("csrf", fin_csrf.as_str()), ("provider", "nope")],
            StatusCode::NOT_FOUND,
        ),
    ] {
        let r = post(&w, &fin, "/t/acme/queue/requeue", &pairs, false).await;
        assert_eq!(r.status, status, "{pairs:?}: {}", r.text);
    }
    let r = post(
        &w,
        &fin,
        "/t/acme/queue/requeue",
        &[("csrf", &fin_csrf), ("provider", "pay")],
        false,
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    assert_eq!(r.location(), Some("/t/acme/queue?provider=pay&requeued=1"));
    let page = get(&w, &fin, r.location().unwrap()).await;
    assert!(
        page.text
            .contains("1 indeterminate effect(s) at pay are due for a new lookup now."),
        "{}",
        page.text
    );
    let log = w.ledger.list_actions(w.a.id, None, 10).await.unwrap();
    let done = log
        .iter()
        .find(|a| a.action == "reconcile.requeue")
        .expect("logged");
    assert_eq!(done.actor, "user:fin@acme.test");
    assert_eq!(done.detail["requeued"], 1);
    w.finish().await;
}

// Settings forms.

#[tokio::test]
async fn an_admin_makes_a_token_seen_once_revokes_it_adds_a_provider_with_a_hidden_secret_and_routes()
 {
    let w = World::new(Backend::Sqlite).await;
    seed(&w).await;
    let (cookie, csrf) = session(&w.app, "alice@acme.test").await;

    // A token: shown in this answer only, usable, then revoked.
    let r = post(
        &w,
        &cookie,
        "/t/acme/settings/tokens",
        &[("csrf", &csrf), ("role", "finance"), ("label", "books")],
        false,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_csp_clean(&r.text);
    let token = r
        .text
        .split("<code id=\"new-token\">")
        .nth(1)
        .and_then(|t| t.split('<').next())
        .expect("the new token is shown")
        .to_owned();
    assert!(token.starts_with("rkn_"), "{token}");
    let api = |t: String| {
        let app = w.app.clone();
        async move {
            send(
                &app,
                Method::GET,
                "/api/v1/audits",
                Req {
                    token: Some(&t),
                    ..Default::default()
                },
            )
            .await
            .status
        }
    };
    assert_eq!(api(token.clone()).await, StatusCode::OK, "a finance token");
    let page = get(&w, &cookie, "/t/acme/settings").await;
    assert!(!page.text.contains(&token), "never shown again");
    assert!(page.text.contains("books"));
    let id = w
        .ledger
        .list_tokens(w.a.id)
        .await
        .unwrap()
        .into_iter()
        .find(|t| t.label == "books")
        .unwrap()
        .id;
    let r = post(
        &w,
        &cookie,
        &format!("/t/acme/settings/tokens/{id}/revoke"),
        &[("csrf", &csrf)],
        false,
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    assert_eq!(api(token.clone()).await, StatusCode::UNAUTHORIZED);
    // Bob cannot revoke acme's tokens through his own tenant.
    let (bob, bob_csrf) = session(&w.app, "bob@globex.test").await;
    let admin_token_id = w.ledger.list_tokens(w.a.id).await.unwrap()[0].id;
    let r = post(
        &w,
        &bob,
        &format!("/t/globex/settings/tokens/{admin_token_id}/revoke"),
        &[("csrf", &bob_csrf)],
        false,
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);

    // A provider: refused with the reason (loopback is outside the egress policy), the
    // secret never echoed; then added, its secret masked.
    let secret = "rk_test_zzsecretzz";
    let r = post(
        &w,
        &cookie,
        "/t/acme/settings/providers",
        &[
            ("csrf", &csrf),
            ("name", "loop"),
            ("kind", "demo"),
            ("secret", secret),
            ("settings", "{\"base_url\": \"http://127.0.0.1:9/\"}"),
        ],
        false,
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert!(r.text.contains("egress policy"), "{}", r.text);
    assert!(!r.text.contains(secret), "the secret came back");
    let r = post(
        &w,
        &cookie,
        "/t/acme/settings/providers",
        &[
            ("csrf", &csrf),
            ("name", "stripe-test"),
            ("kind", "stripe"),
            ("secret", secret),
        ],
        false,
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    let page = get(&w, &cookie, "/t/acme/settings").await;
    assert!(page.text.contains("stripe-test"));
    assert!(page.text.contains("(set, write-only)"));
    assert!(!page.text.contains(secret), "the secret is never rendered");
    assert!(page.text.contains("not measured yet"), "{}", page.text);
    // The reconciler measured it against the application's known outcomes and found it
    // wanting: the page says so, with the reason.
    let p = w
        .ledger
        .provider_by_name(w.a.id, "stripe-test")
        .await
        .unwrap();
    let reason = "the lookup as configured found 0 of 24 effects the application recorded as done";
    w.ledger
        .record_calibration(
            w.a.id,
            p.id,
            &p.settings,
            &serde_json::json!({"status": "uncalibrated", "reason": reason}),
        )
        .await
        .unwrap();
    let page = get(&w, &cookie, "/t/acme/settings").await;
    assert!(page.text.contains("uncalibrated"), "{}", page.text);
    assert!(page.text.contains(reason), "{}", page.text);

    // Routing.
    let r = post(
        &w,
        &cookie,
        "/t/acme/settings/routes",
        &[
            ("csrf", &csrf),
            ("source", SRC),
            ("operation", "charge"),
            ("provider", "nope"),
        ],
        false,
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    let r = post(
        &w,
        &cookie,
        "/t/acme/settings/routes",
        &[
            ("csrf", &csrf),
            ("source", SRC),
            ("operation", "charge"),
            ("provider", "stripe-test"),
        ],
        false,
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    let routes = w.ledger.list_routes(w.a.id).await.unwrap();
    assert_eq!(routes[0].provider.as_deref(), Some("stripe-test"));

    // The audit log shows it all, on the settings page.
    let page = get(&w, &cookie, "/t/acme/settings").await;
    let log = page
        .text
        .split("id=\"audit-log\"")
        .nth(1)
        .expect("the audit log");
    for action in ["token.create", "token.revoke", "provider.add", "route.set"] {
        assert!(log.contains(action), "{action}: {log}");
    }
    // People by their email, never a row id.
    assert!(log.contains("alice@acme.test"), "{log}");
    assert!(!log.contains("user:"), "{log}");

    // Finance may not touch settings.
    user(w.ledger.as_ref(), "fin@acme.test", &w.a, Role::Finance).await;
    let (fin, fin_csrf) = session(&w.app, "fin@acme.test").await;
    for uri in [
        "/t/acme/settings/tokens",
        "/t/acme/settings/providers",
        "/t/acme/settings/routes",
    ] {
        let r = post(
            &w,
            &fin,
            uri,
            &[
                ("csrf", &fin_csrf),
                ("role", "viewer"),
                ("label", "x"),
                ("name", "x"),
                ("kind", "demo"),
            ],
            false,
        )
        .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{uri}: {}", r.text);
    }
    // And a wrong CSRF token is refused even for an admin.
    let r = post(
        &w,
        &cookie,
        "/t/acme/settings/tokens",
        &[("csrf", "nope"), ("role", "viewer"), ("label", "x")],
        false,
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
    w.finish().await;
}

// Empty states and the tenant switcher.

#[tokio::test]
async fn an_empty_queue_says_when_it_was_last_cleared_and_a_person_in_two_tenants_can_switch() {
    let w = World::new(Backend::Sqlite).await;
    seed(&w).await;
    let now = reckon_domain::time::now();
    // Three hours ago the three unresolved effects were counted; since then each was
    // resolved by hand.
    w.ledger
        .take_snapshot(w.a.id, now - 3.0 * 3600.0)
        .await
        .unwrap();
    for key in ["charge:v1:ORD-1", "charge:v1:ORD-2", EVIL] {
        let e = w
            .ledger
            .get_effect(w.a.id, SRC, key)
            .await
            .unwrap()
            .unwrap()
            .effect;
        w.ledger
            .resolve_by_hand(
                w.a.id,
                e.id,
                reckon_ledger::NewResolution {
                    outcome: reckon_ledger::Outcome::Applied,
                    author: "alice@acme.test".into(),
                    note: Some("seen in the provider".into()),
                    evidence: json!({}),
                },
            )
            .await
            .unwrap();
    }
    let (cookie, _) = session(&w.app, "alice@acme.test").await;
    let r = get(&w, &cookie, "/t/acme/queue").await;
    assert!(
        r.text.contains("No unresolved effects: every effect reckon knows has a known outcome; the last unresolved effects were cleared 2 h"),
        "{}",
        r.text
    );
    let (bob, _) = session(&w.app, "bob@globex.test").await;
    let r = get(&w, &bob, "/t/globex/queue").await;
    assert!(
        r.text.contains("none was unresolved in the last 30 days"),
        "{}",
        r.text
    );
    let r = get(&w, &bob, "/t/globex").await;
    assert!(r.text.contains("id=\"all-clear\""), "{}", r.text);
    assert!(!r.text.contains("tenant-switcher"), "bob is in one tenant");

    // Carol, in both tenants: every page offers the other one, with her role there.
    let carol = user(w.ledger.as_ref(), "carol@acme.test", &w.a, Role::Support).await;
    w.ledger
        .set_membership(w.b.id, carol, Role::Viewer)
        .await
        .unwrap();
    let r = common::sign_in(
        &w.app,
        "carol@acme.test",
        common::PASSWORD,
        &[("tenant", "acme")],
    )
    .await;
    let carol_cookie = r.session_cookie().unwrap();
    for uri in ["/t/acme", "/t/acme/queue", "/t/acme/lookup?q=ORD-3"] {
        let r = get(&w, &carol_cookie, uri).await;
        let switcher = r
            .text
            .split("id=\"tenant-switcher\"")
            .nth(1)
            .unwrap_or_else(|| panic!("{uri}: no switcher: {}", r.text));
        assert!(
            switcher.contains("<a href=\"/t/globex\">globex (viewer)</a>"),
            "{uri}: {switcher}"
        );
        assert_eq!(r.headers["vary"], "HX-Request", "{uri}");
    }
    let r = get(&w, &carol_cookie, "/t/globex").await;
    assert!(
        r.text.contains("<a href=\"/t/acme\">acme (support)</a>"),
        "{}",
        r.text
    );
    // A fragment carries no header at all.
    let r = get_htmx(&w, &carol_cookie, "/t/acme/queue").await;
    assert!(!r.text.contains("tenant-switcher"));
    w.finish().await;
}

#[tokio::test]
async fn an_admin_browses_a_sources_quarantine_and_a_push_source_refuses_write_back_in_words() {
    let w = World::new(Backend::Sqlite).await;
    seed(&w).await;
    // A row that is not a justonce record: quarantined with its reason.
    let r = send(
        &w.app,
        Method::POST,
        &format!("/api/v1/effects?source={SRC}"),
        Req {
            token: Some(&w.token_a),
            content_type: Some("application/json"),
            body: json!([{"key": "charge:v1:<b>BAD</b>", "state": "maybe", "request_hash": "1:x",
                          "response": null, "attempts": 1, "created_at": 1.0, "updated_at": 2.0}])
            .to_string(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let (cookie, csrf) = session(&w.app, "alice@acme.test").await;
    let page = get(&w, &cookie, "/t/acme/settings").await;
    assert!(
        page.text
            .contains("/t/acme/settings/sources/shop/quarantine"),
        "{}",
        page.text
    );
    assert!(
        page.text.contains("not for push sources"),
        "no write-back form for a push source"
    );
    let r = get(&w, &cookie, "/t/acme/settings/sources/shop/quarantine").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_csp_clean(&r.text);
    let table = r
        .text
        .split("id=\"quarantine\"")
        .nth(1)
        .expect("a row: {r.text}");
    assert!(
        table.contains("state"),
        "the reason names the field: {table}"
    );
    assert!(!r.text.contains("<b>BAD</b>"), "escaped");
    let r = get(&w, &cookie, "/t/acme/settings/sources/nope/quarantine").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);

    let uri = "/t/acme/settings/sources/shop/writeback";
    let r = post(
        &w,
        &cookie,
        uri,
        &[("csrf", &csrf), ("not_applied", "sometimes")],
        false,
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    let r = post(
        &w,
        &cookie,
        uri,
        &[("csrf", &csrf), ("not_applied", "release")],
        false,
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert!(r.text.contains("is a push source"), "{}", r.text);
    assert!(
        w.ledger
            .source_by_name(w.a.id, SRC)
            .await
            .unwrap()
            .writeback()
            .is_none()
    );
    // Finance may neither.
    user(w.ledger.as_ref(), "fin@acme.test", &w.a, Role::Finance).await;
    let (fin, fin_csrf) = session(&w.app, "fin@acme.test").await;
    let r = post(
        &w,
        &fin,
        uri,
        &[("csrf", &fin_csrf), ("not_applied", "release")],
        false,
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = get(&w, &fin, "/t/acme/settings/sources/shop/quarantine").await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    w.finish().await;
}

#[tokio::test]
async fn an_admin_adds_a_source_and_its_dsn_is_never_shown_even_in_an_error() {
    let w = World::new(Backend::Sqlite).await;
    let (cookie, csrf) = session(&w.app, "alice@acme.test").await;
    let dsn = "postgres://reader:hunter2secret@db.example:5432/shop";
    let r = post(
        &w,
        &cookie,
        "/t/acme/settings/sources",
        &[
            ("csrf", &csrf),
            ("name", "billing"),
            ("kind", "postgres"),
            ("dsn", dsn),
            ("scan_interval", "soon"),
        ],
        false,
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert!(r.text.contains("is not a duration"), "{}", r.text);
    assert!(
        !r.text.contains("hunter2secret"),
        "the DSN's password came back"
    );
    // T08 at save: a private address (or the metadata one) is refused with the reason, the
    // password never repeated; nothing is stored.
    for (host, why) in [
        ("10.0.0.1", "host 10.0.0.1 is a private address"),
        ("169.254.169.254", "link-local"),
    ] {
        let r = post(
            &w,
            &cookie,
            "/t/acme/settings/sources",
            &[
                ("csrf", &csrf),
                ("name", "billing"),
                ("kind", "postgres"),
                (
                    "dsn",
                    &format!("postgres://reader:hunter2secret@{host}:5432/shop"),
                ),
            ],
            false,
        )
        .await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
        assert!(r.text.contains(why), "{}", r.text);
        assert!(r.text.contains("egress policy"), "{}", r.text);
        assert!(!r.text.contains("hunter2secret"), "{}", r.text);
    }
    assert!(w.ledger.list_sources(w.a.id).await.unwrap().is_empty());
    let r = post(
        &w,
        &cookie,
        "/t/acme/settings/sources",
        &[
            ("csrf", &csrf),
            ("name", "billing"),
            ("kind", "postgres"),
            ("dsn", "postgres://reader@db.example:5432/shop"),
            // The password has its own write-only field; the DSN field is plain text.
            ("password", "hunter2secret"),
            ("scan_interval", "2m"),
        ],
        false,
    )
    .await;
    // Added, said so, with its checks (this host does not resolve: the connection fails).
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(
        r.text.contains("Source billing added (postgres)."),
        "{}",
        r.text
    );
    assert!(r.text.contains("id=\"source-checks\""), "{}", r.text);
    assert!(!r.text.contains("hunter2secret"), "{}", r.text);
    let stored = w
        .ledger
        .source_dsn(
            w.a.id,
            &w.ledger.source_by_name(w.a.id, "billing").await.unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        secrecy::ExposeSecret::expose_secret(&stored),
        dsn,
        "the password field went into the sealed DSN"
    );
    let page = get(&w, &cookie, "/t/acme/settings").await;
    assert!(page.text.contains(">billing</td>"), "{}", page.text);
    assert!(page.text.contains("2 min"), "{}", page.text);
    assert!(
        !page.text.contains("hunter2secret"),
        "the DSN's password is never shown"
    );
    let log = w.ledger.list_actions(w.a.id, None, 10).await.unwrap();
    assert!(
        log.iter()
            .any(|a| a.action == "source.add" && a.actor == "user:alice@acme.test")
    );
    // Twice: refused by name.
    let r = post(
        &w,
        &cookie,
        "/t/acme/settings/sources",
        &[("csrf", &csrf), ("name", "billing"), ("kind", "push")],
        false,
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert!(r.text.contains("already exists"), "{}", r.text);
    w.finish().await;
}

#[tokio::test]
async fn an_admin_changes_a_members_role_but_not_their_own_nor_reaches_outside_the_tenant() {
    let w = World::new(Backend::Sqlite).await;
    let (cookie, csrf) = session(&w.app, "alice@acme.test").await;
    let page = get(&w, &cookie, "/t/acme/settings").await;
    let people = page.text.split("id=\"people\"").nth(1).expect("people");
    assert!(
        people.contains("<td>alice@acme.test</td><td>admin</td>"),
        "{people}"
    );
    assert!(
        !people.contains("bob@globex.test"),
        "another tenant's people"
    );
    user(w.ledger.as_ref(), "sam@acme.test", &w.a, Role::Support).await;
    let r = post(
        &w,
        &cookie,
        "/t/acme/settings/people",
        &[
            ("csrf", &csrf),
            ("email", "Sam@Acme.test"),
            ("role", "finance"),
        ],
        false,
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    let members = w.ledger.members(w.a.id).await.unwrap();
    assert!(
        members
            .iter()
            .any(|(u, r)| u.email == "sam@acme.test" && *r == Role::Finance)
    );
    for (email, role, says) in [
        (
            "nobody@acme.test",
            "viewer",
            "No member of this tenant has this email",
        ),
        // An account of another tenant gets the same answer: nothing about it leaks.
        (
            "bob@globex.test",
            "viewer",
            "No member of this tenant has this email",
        ),
        (
            "alice@acme.test",
            "viewer",
            "You cannot change your own role",
        ),
        (
            "sam@acme.test",
            "owner",
            "is not one of viewer, support, finance, admin",
        ),
    ] {
        let r = post(
            &w,
            &cookie,
            "/t/acme/settings/people",
            &[("csrf", &csrf), ("email", email), ("role", role)],
            false,
        )
        .await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{email}: {}",
            r.text
        );
        assert!(r.text.contains(says), "{email}: {}", r.text);
    }
    let log = w.ledger.list_actions(w.a.id, None, 10).await.unwrap();
    assert!(log.iter().any(|a| a.action == "member.set"));
    w.finish().await;
}

// Settings: test connection, scan now, write-back, provider test; overview health.

/// A real justonce SQLite store with `keys` left `unknown` by the library itself.
fn justonce_store(path: &std::path::Path, keys: &[&str]) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::process::Command::new(root.join("scripts/test-env.sh"))
        .output()
        .expect("scripts/test-env.sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let python = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let mut cmd = std::process::Command::new(python);
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

/// The app of `w`'s ledger with an egress policy that lets sources and providers on
/// loopback and SQLite files under `sqlite_dir` be reached (the operator's configuration).
fn app_reaching(w: &World, sqlite_dir: &std::path::Path) -> axum::Router {
    let egress =
        reckon_sources::EgressPolicy::new(&["127.0.0.0/8".to_owned()], Some(sqlite_dir.into()))
            .unwrap();
    reckon_web::app(reckon_web::AppState {
        egress: std::sync::Arc::new(egress),
        ..reckon_web::AppState::new(w.ledger.clone())
    })
}

async fn post_to(app: &axum::Router, cookie: &str, uri: &str, pairs: &[(&str, &str)]) -> Reply {
    send(
        app,
        Method::POST,
        uri,
        Req {
            cookie: Some(cookie),
            headers: same_origin(),
            content_type: Some("application/x-www-form-urlencoded"),
            body: form(pairs),
            ..Default::default()
        },
    )
    .await
}

async fn get_from(app: &axum::Router, cookie: &str, uri: &str) -> Reply {
    send(
        app,
        Method::GET,
        uri,
        Req {
            cookie: Some(cookie),
            ..Default::default()
        },
    )
    .await
}

#[tokio::test]
async fn an_admin_tests_a_source_asks_for_a_scan_and_turns_write_back_on_and_off() {
    let w = World::new(Backend::Sqlite).await;
    let dir = tempfile::TempDir::new().unwrap();
    // The tenant's own subdirectory of the operator's SQLite directory.
    let mine = dir.path().join("acme");
    std::fs::create_dir_all(&mine).unwrap();
    let store = mine.join("orders.db");
    justonce_store(&store, &["charge:v1:ORD-9"]);
    let empty = mine.join("empty.db");
    use sqlx::Connection;
    sqlx::SqliteConnection::connect_with(
        &sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&empty)
            .create_if_missing(true),
    )
    .await
    .unwrap()
    .close()
    .await
    .unwrap();
    let app = app_reaching(&w, dir.path());
    for (name, path) in [
        ("orders", &store),
        ("empty", &empty),
        ("gone", &mine.join("gone.db")),
    ] {
        let r = send(
            &app,
            Method::POST,
            "/api/v1/sources",
            Req {
                token: Some(&w.token_a),
                content_type: Some("application/json"),
                body: json!({"name": name, "kind": "sqlite", "dsn": path}).to_string(),
                ..Default::default()
            },
        )
        .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    }
    let (cookie, csrf) = session(&app, "alice@acme.test").await;
    let page = get_from(&app, &cookie, "/t/acme/settings").await;
    assert!(
        page.text
            .contains("action=\"/t/acme/settings/sources/orders/test\""),
        "{}",
        page.text
    );
    assert!(
        page.text
            .contains("action=\"/t/acme/settings/sources/orders/scan\"")
    );

    // Test connection: reached read-only, the table queried, the file unchanged.
    let before = std::fs::read(&store).unwrap();
    let r = post_to(
        &app,
        &cookie,
        "/t/acme/settings/sources/orders/test",
        &[("csrf", &csrf)],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let message = r.text.split("id=\"settings-message\">").nth(1).unwrap();
    assert!(
        message.starts_with("orders: Connected read-only and queried table justonce_keys"),
        "{message}"
    );
    assert_eq!(std::fs::read(&store).unwrap(), before, "a probe wrote");
    // A file without the table and a file that is not there: said, and not a failed scan.
    // Fixed sentences: the probe never echoes the table's name or the path it was given.
    for (name, expect) in [
        (
            "empty",
            "the table, or a column the scanner needs, was not found",
        ),
        ("gone", "does not exist"),
    ] {
        let r = post_to(
            &app,
            &cookie,
            &format!("/t/acme/settings/sources/{name}/test"),
            &[("csrf", &csrf)],
        )
        .await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
        let error = r.text.split("id=\"settings-error\">").nth(1).unwrap();
        let error = error.split("</p>").next().unwrap();
        assert!(error.starts_with(&format!("{name}: ")), "{error}");
        assert!(error.contains(expect), "{error}");
        let s = w.ledger.source_by_name(w.a.id, name).await.unwrap();
        assert_eq!(s.consecutive_failures, 0, "a probe is not a scan");
        assert_eq!(s.last_scan_at, None, "a probe is not a scan");
    }
    // Without the CSRF token nothing is probed (the form is refused before anything).
    let r = post_to(
        &app,
        &cookie,
        "/t/acme/settings/sources/orders/test",
        &[("csrf", "wrong")],
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);

    // Scan now: recorded; the scheduler's due check says so until a scan starts after it.
    let egress = reckon_sources::EgressPolicy::new(&[], Some(dir.path().into())).unwrap();
    let opts = reckon_engine::ScanOptions {
        egress: std::sync::Arc::new(egress),
        ..Default::default()
    };
    let src = w.ledger.source_by_name(w.a.id, "orders").await.unwrap();
    reckon_engine::scan_source(w.ledger.as_ref(), &w.a, &src, &opts)
        .await
        .unwrap();
    let src = w.ledger.source_by_name(w.a.id, "orders").await.unwrap();
    let now = reckon_domain::time::now();
    assert!(
        !src.scan_due(now),
        "just scanned, its interval has not passed"
    );
    let r = post_to(
        &app,
        &cookie,
        "/t/acme/settings/sources/orders/scan",
        &[("csrf", &csrf)],
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    let src = w.ledger.source_by_name(w.a.id, "orders").await.unwrap();
    assert!(src.scan_pending() && src.scan_due(reckon_domain::time::now()));
    let page = get_from(&app, &cookie, "/t/acme/settings").await;
    assert!(
        page.text.contains("id=\"scan-pending-orders\""),
        "{}",
        page.text
    );
    reckon_engine::scan_source(w.ledger.as_ref(), &w.a, &src, &opts)
        .await
        .unwrap();
    let src = w.ledger.source_by_name(w.a.id, "orders").await.unwrap();
    assert!(!src.scan_pending(), "the scan answered the request");
    assert!(!src.scan_due(reckon_domain::time::now()));
    let page = get_from(&app, &cookie, "/t/acme/settings").await;
    assert!(!page.text.contains("id=\"scan-pending-orders\""));
    // Another tenant's source and a push source cannot be asked for.
    let (bob, bob_csrf) = session(&app, "bob@globex.test").await;
    let r = post_to(
        &app,
        &bob,
        "/t/globex/settings/sources/orders/scan",
        &[("csrf", &bob_csrf)],
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);

    // Write-back on (release), then off, for the scanned source; each in the audit log.
    let uri = "/t/acme/settings/sources/orders/writeback";
    let r = post_to(
        &app,
        &cookie,
        uri,
        &[("csrf", &csrf), ("not_applied", "release")],
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    let src = w.ledger.source_by_name(w.a.id, "orders").await.unwrap();
    assert_eq!(
        src.writeback(),
        Some(reckon_ledger::WritebackPolicy::Release)
    );
    let page = get_from(&app, &cookie, "/t/acme/settings").await;
    assert!(
        page.text
            .contains("<option value=\"release\" selected>release</option>"),
        "{}",
        page.text
    );
    let r = post_to(
        &app,
        &cookie,
        uri,
        &[("csrf", &csrf), ("not_applied", "off")],
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    let src = w.ledger.source_by_name(w.a.id, "orders").await.unwrap();
    assert_eq!(src.writeback(), None);
    let log = w.ledger.list_actions(w.a.id, None, 50).await.unwrap();
    let did: Vec<(&str, Option<&str>)> = log
        .iter()
        .map(|a| (a.action.as_str(), a.detail["not_applied"].as_str()))
        .filter(|(a, _)| a.starts_with("source."))
        .collect();
    assert_eq!(
        did,
        [
            ("source.writeback", None),
            ("source.writeback", Some("release")),
            ("source.scan_now", None),
            ("source.test", None),
            ("source.test", None),
            ("source.test", None),
            ("source.add", None),
            ("source.add", None),
            ("source.add", None),
        ],
        "newest first"
    );

    // The same through the API, with a token.
    let api_post = |uri: &'static str| {
        send(
            &app,
            Method::POST,
            uri,
            Req {
                token: Some(&w.token_a),
                ..Default::default()
            },
        )
    };
    let r = api_post("/api/v1/sources/orders/test").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["ok"], true, "{}", r.text);
    let r = api_post("/api/v1/sources/gone/test").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["ok"], false, "{}", r.text);
    let r = api_post("/api/v1/sources/orders/scan").await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    assert!(r.json["scan_requested_at"].as_f64().is_some(), "{}", r.text);
    w.finish().await;
}

#[tokio::test]
async fn an_admin_tests_providers_and_the_overview_shows_their_health_and_yesterdays_audit() {
    let w = World::new(Backend::Sqlite).await;
    seed(&w).await;
    let dir = tempfile::TempDir::new().unwrap();
    let app = app_reaching(&w, dir.path());
    let demo = reckon_providers::demo::DemoState::new();
    demo.charge(
        "charge:v1:ORD-2",
        2000,
        "usd",
        reckon_domain::time::now() - 10.0,
    );
    let (demo_url, _demo) = reckon_providers::demo::serve_loopback(demo).await.unwrap();
    // A provider whose every answer is a 500.
    let broken =
        axum::Router::new().fallback(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "boom") });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let broken_url = format!("http://{}/", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, broken).await.ok() });
    for (name, url) in [("pay", &demo_url), ("broken", &broken_url)] {
        w.ledger
            .add_provider(
                w.a.id,
                reckon_ledger::NewProvider {
                    name: name.into(),
                    kind: reckon_ledger::ProviderKind::Demo,
                    secret: None,
                    settings: json!({"base_url": url}),
                },
            )
            .await
            .unwrap();
    }
    w.ledger
        .set_route(w.a.id, SRC, "charge", Some("broken"))
        .await
        .unwrap();
    record_run(&w, &yesterday()).await;
    let (cookie, csrf) = session(&app, "alice@acme.test").await;

    let r = post_to(
        &app,
        &cookie,
        "/t/acme/settings/providers/pay/test",
        &[("csrf", &csrf)],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let message = r.text.split("id=\"settings-message\">").nth(1).unwrap();
    assert!(
        message.starts_with("pay: Answered with the key: 1 charge(s) in the last 5 minutes"),
        "{message}"
    );
    let r = post_to(
        &app,
        &cookie,
        "/t/acme/settings/providers/broken/test",
        &[("csrf", &csrf)],
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    let error = r.text.split("id=\"settings-error\">").nth(1).unwrap();
    assert!(
        error.starts_with("broken: ") && error.contains("page 1: server error"),
        "{error}"
    );
    let r = post_to(
        &app,
        &cookie,
        "/t/acme/settings/providers/nope/test",
        &[("csrf", &csrf)],
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);

    // One lookup through the broken provider: indeterminate, with its error.
    let r = post_to(
        &app,
        &cookie,
        &format!("/t/acme/reconcile/{}", effect_path("charge:v1:ORD-1")),
        &[("csrf", &csrf)],
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    let r = get_from(&app, &cookie, "/t/acme").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let row = |name: &str| -> String {
        r.text
            .split(&format!("<tr data-provider=\"{name}\">"))
            .nth(1)
            .unwrap_or_else(|| panic!("no row for {name}: {}", r.text))
            .split("</tr>")
            .next()
            .unwrap()
            .to_owned()
    };
    let b = row("broken");
    assert!(b.contains("<td class=\"num\">1</td>"), "{b}");
    assert!(b.contains("100.0 %"), "{b}");
    assert!(
        b.contains("class=\"error\""),
        "the last error is shown: {b}"
    );
    let p = row("pay");
    assert!(
        p.contains("<td class=\"num\">0</td>") && p.contains("–"),
        "{p}"
    );
    assert!(p.contains(">none<"), "{p}");
    // Yesterday's audit at a glance, linking to the day.
    let audit = r.text.split("id=\"audit-summary\"").nth(1).unwrap();
    assert!(
        audit.contains(&format!(
            "Yesterday's audit ({})",
            reckon_engine::when::day_text(&yesterday())
        )),
        "{audit}"
    );
    assert!(audit.contains("data-finding=\"duplicate\""), "{audit}");
    assert!(audit.contains("data-finding=\"orphan\""), "{audit}");
    assert!(!audit.contains("data-finding=\"missing\""), "{audit}");
    assert!(
        audit.contains(&format!("href=\"/t/acme/audit?day={}\"", yesterday())),
        "{audit}"
    );
    w.finish().await;
}

#[tokio::test]
async fn an_unknown_page_under_a_tenant_is_a_404_inside_the_dashboard_and_json_under_the_api() {
    let w = World::new(Backend::Sqlite).await;
    let (cookie, _) = session(&w.app, "alice@acme.test").await;

    // Under her tenant: a 404 page with the dashboard's frame (navigation, who she is).
    let r = get(&w, &cookie, "/t/acme/no-such-page").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    assert!(r.text.contains("id=\"not-found\""), "{}", r.text);
    assert!(
        r.text.contains("<nav aria-label=\"Main\">")
            && r.text.contains("href=\"/t/acme/queue\"")
            && r.text.contains("alice@acme.test"),
        "not inside the dashboard's frame: {}",
        r.text
    );
    assert!(r.text.contains("/t/acme/no-such-page"), "{}", r.text);
    assert_csp_clean(&r.text);
    // Deeper, and under a known page's prefix, the same.
    let r = get(&w, &cookie, "/t/acme/settings/nothing/here").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    assert!(r.text.contains("id=\"not-found\""), "{}", r.text);

    // Another tenant's path looks like one that does not exist: the plain 404, no frame.
    for path in ["/t/globex/no-such-page", "/t/nobody/no-such-page"] {
        let r = get(&w, &cookie, path).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{path}: {}", r.text);
        assert!(
            !r.text.contains("aria-label=\"Main\""),
            "{path}: {}",
            r.text
        );
        assert!(!r.text.contains("globex"), "{path}: {}", r.text);
    }
    // Without a session: sign in first, as on every dashboard page.
    let r = send(&w.app, Method::GET, "/t/acme/no-such-page", Req::default()).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    assert_eq!(r.location(), Some("/signin"));

    // The API answers its JSON error body, with or without a token, under and beside /api/v1.
    for (path, token) in [
        ("/api/v1/no-such-route", Some(w.token_a.as_str())),
        ("/api/v1/no-such-route", None),
        ("/api/v2/effects", Some(w.token_a.as_str())),
        ("/api/nothing", None),
    ] {
        let r = send(
            &w.app,
            Method::GET,
            path,
            Req {
                token,
                ..Default::default()
            },
        )
        .await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{path}: {}", r.text);
        assert!(
            r.headers
                .get("content-type")
                .is_some_and(|v| v.as_bytes().starts_with(b"application/json")),
            "{path}: {:?}",
            r.headers
        );
        assert!(r.json["error"].is_string(), "{path}: {}", r.text);
    }
    // Anywhere else: a 404 page, not the browser's bare one.
    let r = get(&w, &cookie, "/no-such-page").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert!(r.text.contains("<h1>404</h1>"), "{}", r.text);
    w.finish().await;
}

#[tokio::test]
async fn a_refused_resolution_keeps_the_chosen_outcome_and_the_note() {
    let w = World::new(Backend::Sqlite).await;
    seed(&w).await;
    let (cookie, csrf) = session(&w.app, "alice@acme.test").await;
    let uri = format!("/t/acme/resolve/{}", effect_path("charge:v1:ORD-1"));
    for (outcome, htmx) in [("not_applied", false), ("applied", true)] {
        // The note is missing: refused, and the form comes back as it was sent.
        let r = post(
            &w,
            &cookie,
            &uri,
            &[("csrf", &csrf), ("outcome", outcome), ("note", " ")],
            htmx,
        )
        .await;
        assert!(r.text.contains("A note is required"), "{}", r.text);
        let checked = |value: &str| {
            r.text
                .split("<input type=\"radio\"")
                .skip(1)
                .find(|i| i.contains(&format!("value=\"{value}\"")))
                .unwrap_or_else(|| panic!("no {value} radio: {}", r.text))
                .split('>')
                .next()
                .unwrap_or_default()
                .contains("checked")
        };
        assert!(checked(outcome), "{outcome} is not checked: {}", r.text);
        let other = if outcome == "applied" {
            "not_applied"
        } else {
            "applied"
        };
        assert!(!checked(other), "{other} is checked: {}", r.text);
    }
    // A first visit has nothing chosen.
    let r = get(
        &w,
        &cookie,
        &format!("/t/acme/effects/{}", effect_path("charge:v1:ORD-1")),
    )
    .await;
    assert!(!r.text.contains(" checked>"), "{}", r.text);
    assert!(resolution(&w, "charge:v1:ORD-1").await.is_none());
    w.finish().await;
}

#[tokio::test]
async fn the_page_right_after_a_resolution_shows_the_new_state_not_unknown() {
    let w = World::new(Backend::Sqlite).await;
    seed(&w).await;
    let (cookie, csrf) = session(&w.app, "alice@acme.test").await;
    let state_of = |html: &str| -> String {
        html.split("<dt>State</dt>")
            .nth(1)
            .and_then(|s| s.split("</dd>").next())
            .unwrap_or_else(|| panic!("no state on the page: {html}"))
            .to_owned()
    };
    let before = get(
        &w,
        &cookie,
        &format!("/t/acme/effects/{}", effect_path("charge:v1:ORD-2")),
    )
    .await;
    assert!(
        state_of(&before.text).contains("outcome unknown"),
        "{}",
        before.text
    );

    // With htmx, the part the resolution swaps in carries the record's new state.
    let r = post(
        &w,
        &cookie,
        &format!("/t/acme/resolve/{}", effect_path("charge:v1:ORD-2")),
        &[
            ("csrf", &csrf),
            ("outcome", "applied"),
            ("note", "seen in the provider"),
        ],
        true,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let state = state_of(&r.text);
    assert!(
        state.contains("resolved as applied by alice@acme.test"),
        "the swapped part still shows the old state: {state}"
    );
    assert!(!state.contains("outcome unknown"), "{state}");
    assert!(!r.text.contains("Replay window left"), "{}", r.text);

    // Without JavaScript: the page the redirect lands on says the same.
    let r = post(
        &w,
        &cookie,
        &format!("/t/acme/resolve/{}", effect_path("charge:v1:ORD-1")),
        &[
            ("csrf", &csrf),
            ("outcome", "not_applied"),
            ("note", "refunded"),
        ],
        false,
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    let page = get(&w, &cookie, r.location().unwrap()).await;
    let state = state_of(&page.text);
    assert!(
        state.contains("resolved as not_applied by alice@acme.test")
            && state.contains("still says unknown"),
        "{state}"
    );
    assert!(!state.contains("<code>unknown</code>"), "{state}");
    w.finish().await;
}

#[tokio::test]
async fn adding_a_sqlite_source_confirms_it_and_shows_its_path_while_a_dsn_password_stays_hidden() {
    let w = World::new(Backend::Sqlite).await;
    let dir = tempfile::TempDir::new().unwrap();
    let mine = dir.path().join("acme");
    std::fs::create_dir_all(&mine).unwrap();
    let store = mine.join("shop.db");
    justonce_store(&store, &["charge:v1:ORD-1"]);
    let app = app_reaching(&w, dir.path());
    let (cookie, csrf) = session(&app, "alice@acme.test").await;

    // The form: a path is typed in plain text; only the password has a masked field.
    let page = get_from(&app, &cookie, "/t/acme/settings").await;
    let input = |name: &str| -> String {
        let at = page
            .text
            .find(&format!("name=\"{name}\""))
            .unwrap_or_else(|| panic!("no {name} field: {}", page.text));
        let (before, after) = page.text.split_at(at);
        let start = before.rfind("<input").expect("an input");
        format!(
            "{}{}",
            before.split_at(start).1,
            after.split('>').next().unwrap_or_default()
        )
    };
    let dsn = input("dsn");
    assert!(
        dsn.contains("type=\"text\"") && !dsn.contains("password"),
        "the connection field masks what is typed: {dsn}"
    );
    assert!(input("password").contains("type=\"password\""));

    // Added: said so, and the path shown as it is (a path is no secret).
    let path = store.display().to_string();
    let r = post_to(
        &app,
        &cookie,
        "/t/acme/settings/sources",
        &[
            ("csrf", &csrf),
            ("name", "shop"),
            ("kind", "sqlite"),
            ("dsn", &path),
        ],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(
        r.text.contains("Source shop added (sqlite)."),
        "no confirmation: {}",
        r.text
    );
    let page = get_from(&app, &cookie, "/t/acme/settings").await;
    let row = page
        .text
        .split("<tr><td>shop</td>")
        .nth(1)
        .and_then(|t| t.split("</tr>").next())
        .unwrap_or_else(|| panic!("no row for shop: {}", page.text));
    assert!(row.contains(&path), "the path is not shown: {row}");

    // A DSN's password is a secret: never shown, whether typed in the URL or its own field.
    let r = post_to(
        &app,
        &cookie,
        "/t/acme/settings/sources",
        &[
            ("csrf", &csrf),
            ("name", "billing"),
            ("kind", "postgres"),
            (
                "dsn",
                "postgres://reader:hunter2secret@db.example:5432/shop",
            ),
        ],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(
        r.text.contains("Source billing added (postgres)."),
        "{}",
        r.text
    );
    let page = get_from(&app, &cookie, "/t/acme/settings").await;
    assert!(
        page.text.contains("postgres://reader@db.example:5432/shop"),
        "{}",
        page.text
    );
    assert!(!page.text.contains("hunter2secret") && !r.text.contains("hunter2secret"));
    w.finish().await;
}

/// The routing section shows each current route as its own form, its provider already
/// chosen (a route to none as "none"): changing a route is a pick and a click, and the page
/// after it shows the new choice.
#[tokio::test]
async fn the_routing_form_is_prefilled_with_each_current_route() {
    let w = World::new(Backend::Sqlite).await;
    seed(&w).await;
    let (cookie, csrf) = session(&w.app, "alice@acme.test").await;
    for name in ["pay-a", "pay-b"] {
        let r = post(
            &w,
            &cookie,
            "/t/acme/settings/providers",
            &[
                ("csrf", &csrf),
                ("name", name),
                ("kind", "stripe"),
                ("secret", "rk_test_zzsecretzz"),
            ],
            false,
        )
        .await;
        assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    }
    for (operation, provider) in [("charge", "pay-b"), ("send_receipt", "")] {
        let r = post(
            &w,
            &cookie,
            "/t/acme/settings/routes",
            &[
                ("csrf", &csrf),
                ("source", SRC),
                ("operation", operation),
                ("provider", provider),
            ],
            false,
        )
        .await;
        assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    }
    // The row of a route: its form, with the source and operation it changes and the
    // provider it has now selected.
    let row = |html: &str, route: &str| -> String {
        html.split(&format!("<tr data-route=\"{route}\">"))
            .nth(1)
            .unwrap_or_else(|| panic!("no row for {route}: {html}"))
            .split("</tr>")
            .next()
            .unwrap()
            .to_owned()
    };
    let page = get(&w, &cookie, "/t/acme/settings").await;
    let charge = row(&page.text, "shop:charge");
    for want in [
        "name=\"source\" value=\"shop\"",
        "name=\"operation\" value=\"charge\"",
        "<option value=\"pay-b\" selected>",
        "<option value=\"pay-a\">",
        "<option value=\"\">none</option>",
    ] {
        assert!(charge.contains(want), "{want}: {charge}");
    }
    let receipt = row(&page.text, "shop:send_receipt");
    assert!(
        receipt.contains("<option value=\"\" selected>none</option>"),
        "{receipt}"
    );
    assert!(!receipt.contains("\" selected>pay"), "{receipt}");

    // The row's form, sent as it is with another pick, changes that route only.
    let r = post(
        &w,
        &cookie,
        "/t/acme/settings/routes",
        &[
            ("csrf", &csrf),
            ("source", "shop"),
            ("operation", "charge"),
            ("provider", "pay-a"),
        ],
        false,
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    let page = get(&w, &cookie, "/t/acme/settings").await;
    let charge = row(&page.text, "shop:charge");
    assert!(
        charge.contains("<option value=\"pay-a\" selected>"),
        "{charge}"
    );
    assert!(
        !charge.contains("<option value=\"pay-b\" selected>"),
        "{charge}"
    );
    assert!(
        row(&page.text, "shop:send_receipt").contains("<option value=\"\" selected>none</option>")
    );
    w.finish().await;
}
