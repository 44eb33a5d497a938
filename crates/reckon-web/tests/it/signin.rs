//! Dashboard sign-in, sessions, CSRF, headers, throttling, TOTP, and the API token
//! lifecycle, through the real router on a real SQLite ledger (T17-T24 of the checklist).
#![allow(
    clippy::string_slice,
    reason = "the texts sliced here are the tests' own ASCII: URLs, templates, tokens, HTTP heads"
)]

use crate::common;

use axum::http::{Method, StatusCode, header};
use common::{Backend, PASSWORD, Req, World, form, same_origin, send, session, sign_in};
use reckon_ledger::Role;
use serde_json::json;

async fn app_page(w: &World, cookie: &str) -> common::Reply {
    send(
        &w.app,
        Method::GET,
        "/app",
        Req {
            cookie: Some(cookie),
            ..Default::default()
        },
    )
    .await
}

fn signed_in(r: &common::Reply) -> bool {
    r.status == StatusCode::OK
}

async fn sign_out(
    w: &World,
    cookie: &str,
    csrf: &str,
    headers: Vec<(&'static str, String)>,
) -> common::Reply {
    send(
        &w.app,
        Method::POST,
        "/signout",
        Req {
            cookie: Some(cookie),
            content_type: Some("application/x-www-form-urlencoded"),
            headers,
            body: form(&[("csrf", csrf)]),
            ..Default::default()
        },
    )
    .await
}

#[tokio::test]
async fn sign_in_sets_a_host_cookie_and_rotates_the_session() {
    let w = World::new(Backend::Sqlite).await;
    let r = send(&w.app, Method::GET, "/signin", Req::default()).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.text.contains("<form method=\"post\" action=\"/signin\">"));

    let r = sign_in(&w.app, "alice@acme.test", PASSWORD, &[]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    // One tenant: straight to it; a person in several tenants chooses on /app.
    assert_eq!(r.location(), Some("/t/acme"));
    let cookie = r.headers[header::SET_COOKIE].to_str().unwrap().to_owned();
    for part in [
        "__Host-reckon_session=",
        "Path=/",
        "Secure",
        "HttpOnly",
        "SameSite=Lax",
    ] {
        assert!(cookie.contains(part), "{part} missing from {cookie}");
    }
    assert!(
        !cookie.contains("Domain="),
        "__Host- cookies carry no Domain"
    );
    let first = r.session_cookie().unwrap();
    let page = app_page(&w, &first).await;
    assert!(signed_in(&page), "{}", page.text);
    assert!(page.text.contains("alice@acme.test") && page.text.contains("acme"));

    // Signing in again from the same browser: a new id, and the old one is dead (T17).
    let r = send(
        &w.app,
        Method::POST,
        "/signin",
        Req {
            cookie: Some(&first),
            content_type: Some("application/x-www-form-urlencoded"),
            headers: same_origin(),
            body: form(&[("email", "alice@acme.test"), ("password", PASSWORD)]),
            ..Default::default()
        },
    )
    .await;
    let second = r.session_cookie().unwrap();
    assert_ne!(first, second);
    assert_eq!(app_page(&w, &first).await.status, StatusCode::SEE_OTHER);
    assert!(signed_in(&app_page(&w, &second).await));
    // The ledger holds a hash, never the id.
    w.finish().await;
}

#[tokio::test]
async fn sign_out_ends_the_session_and_needs_its_csrf_token() {
    let w = World::new(Backend::Sqlite).await;
    let (cookie, csrf) = session(&w.app, "alice@acme.test").await;

    // T20: a cross-site form post changes nothing.
    let r = sign_out(
        &w,
        &cookie,
        &csrf,
        vec![
            ("origin", "https://evil.example".into()),
            ("sec-fetch-site", "cross-site".into()),
        ],
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(signed_in(&app_page(&w, &cookie).await));
    // A foreign Origin without Sec-Fetch-Site (older browsers).
    let r = sign_out(
        &w,
        &cookie,
        &csrf,
        vec![("origin", "https://evil.example".into())],
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(signed_in(&app_page(&w, &cookie).await));
    // Same origin but the wrong token (or none).
    let r = sign_out(&w, &cookie, "not-the-token", same_origin()).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = sign_out(&w, &cookie, "", same_origin()).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(signed_in(&app_page(&w, &cookie).await));

    let r = sign_out(&w, &cookie, &csrf, same_origin()).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    assert_eq!(r.location(), Some("/signin"));
    assert!(
        r.headers[header::SET_COOKIE]
            .to_str()
            .unwrap()
            .contains("Max-Age=0")
    );
    // The old cookie is refused (T17).
    let r = app_page(&w, &cookie).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(r.location(), Some("/signin"));
    // GET /signout does not exist: no state-changing GET.
    let r = send(
        &w.app,
        Method::GET,
        "/signout",
        Req {
            cookie: Some(&cookie),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    w.finish().await;
}

#[tokio::test]
async fn disabling_a_user_or_a_new_password_ends_their_sessions_and_tokens() {
    let w = World::new(Backend::Sqlite).await;
    // Alice (admin of acme) makes a token through the API with a session-less admin token
    // of her own: made on her behalf, via the ledger.
    let (tok, hash) = reckon_web::mint_token();
    w.ledger
        .create_token_by(
            w.a.id,
            Role::Finance,
            &hash,
            "alice's",
            reckon_ledger::TokenCreator::User { id: w.alice },
        )
        .await
        .unwrap();
    let api = |t: String| {
        let app = w.app.clone();
        async move {
            send(
                &app,
                Method::GET,
                "/api/v1/effects",
                Req {
                    token: Some(&t),
                    ..Default::default()
                },
            )
            .await
            .status
        }
    };
    let (s1, _) = session(&w.app, "alice@acme.test").await;
    let (s2, _) = session(&w.app, "alice@acme.test").await;
    let (bob_session, _) = session(&w.app, "bob@globex.test").await;
    assert_eq!(api(tok.clone()).await, StatusCode::OK);

    w.ledger.set_user_disabled(w.alice, true).await.unwrap();
    for s in [&s1, &s2] {
        assert_eq!(app_page(&w, s).await.status, StatusCode::SEE_OTHER);
    }
    assert_eq!(api(tok.clone()).await, StatusCode::UNAUTHORIZED);
    let r = sign_in(&w.app, "alice@acme.test", PASSWORD, &[]).await;
    assert_eq!(
        r.status,
        StatusCode::UNAUTHORIZED,
        "a disabled user cannot sign in"
    );
    // Others are unaffected, and so are operator tokens.
    assert!(signed_in(&app_page(&w, &bob_session).await));
    assert_eq!(api(w.token_a.clone()).await, StatusCode::OK);
    // Enabling again does not bring the old sessions or tokens back.
    w.ledger.set_user_disabled(w.alice, false).await.unwrap();
    assert_eq!(app_page(&w, &s1).await.status, StatusCode::SEE_OTHER);
    assert_eq!(api(tok).await, StatusCode::UNAUTHORIZED);

    // A new password ends the sessions made before it.
    let (s3, _) = session(&w.app, "alice@acme.test").await;
    let new_hash = reckon_web::password::hash_blocking("another long password");
    w.ledger.set_password(w.alice, &new_hash).await.unwrap();
    assert_eq!(app_page(&w, &s3).await.status, StatusCode::SEE_OTHER);
    let r = sign_in(&w.app, "alice@acme.test", PASSWORD, &[]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let r = sign_in(&w.app, "alice@acme.test", "another long password", &[]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    w.finish().await;
}

#[tokio::test]
async fn many_bad_passwords_lock_the_account_for_a_window_and_nobody_else() {
    let w = World::new(Backend::Sqlite).await;
    for _ in 0..reckon_web::web::ACCOUNT_LIMIT {
        let r = sign_in(&w.app, "alice@acme.test", "wrong password guess", &[]).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        assert!(r.text.contains("not right"));
    }
    // Locked: even the right password is refused, without being checked.
    let r = sign_in(&w.app, "alice@acme.test", PASSWORD, &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text);
    // Other accounts from the same address still sign in.
    let r = sign_in(&w.app, "bob@globex.test", PASSWORD, &[]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    // The lock lives in the ledger (shared by replicas): a second app on the same ledger
    // sees it too.
    let other = reckon_web::app(reckon_web::AppState::new(w.ledger.clone()));
    let r = sign_in(&other, "ALICE@acme.test", PASSWORD, &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // An unknown email answers like a wrong password.
    let r = sign_in(&w.app, "nobody@acme.test", PASSWORD, &[]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(r.text.contains("not right"));
    w.finish().await;
}

#[tokio::test]
async fn a_user_with_totp_needs_the_current_code() {
    let w = World::new(Backend::Sqlite).await;
    let secret = b"0123456789abcdefghij".to_vec();
    w.ledger
        .set_totp_secret(w.alice, Some(&secret))
        .await
        .unwrap();
    let totp = totp_rs::TOTP::new(totp_rs::Algorithm::SHA1, 6, 1, 30, secret).unwrap();
    let r = sign_in(&w.app, "alice@acme.test", PASSWORD, &[]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let r = sign_in(&w.app, "alice@acme.test", PASSWORD, &[("totp", "000000")]).await;
    // (one in a million that 000000 is the current code)
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let code = totp.generate_current().unwrap();
    let r = sign_in(&w.app, "alice@acme.test", PASSWORD, &[("totp", &code)]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    // The secret is sealed in the ledger.
    let creds = w
        .ledger
        .user_by_email("alice@acme.test")
        .await
        .unwrap()
        .unwrap();
    assert!(!format!("{creds:?}").contains("0123456789"));
    w.finish().await;
}

/// A TOTP code signs in once: the same code again (a replay, e.g. read over a shoulder or
/// from a phished form) is refused, also through a second app on the same ledger (another
/// replica), and so is the previous step's code once a later one was used.
async fn totp_replay(backend: Backend) {
    let w = World::new(backend).await;
    let secret = b"0123456789abcdefghij".to_vec();
    w.ledger
        .set_totp_secret(w.alice, Some(&secret))
        .await
        .unwrap();
    let totp = totp_rs::TOTP::new(totp_rs::Algorithm::SHA1, 6, 0, 30, secret).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // Stay clear of a step boundary so "the current step" is one step for the whole test.
    if now % 30 > 25 {
        tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let previous = totp.generate(now - 30);
    let current = totp.generate(now);
    let r = sign_in(&w.app, "alice@acme.test", PASSWORD, &[("totp", &current)]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    let r = sign_in(&w.app, "alice@acme.test", PASSWORD, &[("totp", &current)]).await;
    assert_eq!(
        r.status,
        StatusCode::UNAUTHORIZED,
        "a replayed code: {}",
        r.text
    );
    let replica = reckon_web::app(reckon_web::AppState::new(w.ledger.clone()));
    let r = sign_in(&replica, "alice@acme.test", PASSWORD, &[("totp", &current)]).await;
    assert_eq!(
        r.status,
        StatusCode::UNAUTHORIZED,
        "replayed on another replica"
    );
    let r = sign_in(&w.app, "alice@acme.test", PASSWORD, &[("totp", &previous)]).await;
    assert_eq!(
        r.status,
        StatusCode::UNAUTHORIZED,
        "an older step after a newer one"
    );
    let next = totp.generate(now + 30);
    let r = sign_in(&replica, "alice@acme.test", PASSWORD, &[("totp", &next)]).await;
    assert_eq!(
        r.status,
        StatusCode::SEE_OTHER,
        "the next step's code, once: {}",
        r.text
    );
    w.finish().await;
}

#[tokio::test]
async fn a_totp_code_is_accepted_once() {
    totp_replay(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_totp_code_is_accepted_once_on_postgres() {
    totp_replay(Backend::Postgres).await;
}

#[tokio::test]
async fn every_response_carries_the_security_headers_and_pages_escape_input() {
    let w = World::new(Backend::Sqlite).await;
    for (m, uri) in [
        (Method::GET, "/signin"),
        (Method::GET, "/healthz"),
        (Method::GET, "/api/v1/sources"),
        (Method::GET, "/app"),
    ] {
        let r = send(&w.app, m, uri, Req::default()).await;
        let csp = r.headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        for part in [
            "default-src 'self'",
            "script-src 'self'",
            "object-src 'none'",
            "base-uri 'none'",
            "frame-ancestors 'none'",
        ] {
            assert!(csp.contains(part), "{uri}: {part} missing in {csp}");
        }
        assert!(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"));
        assert_eq!(r.headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        assert_eq!(r.headers[header::REFERRER_POLICY], "same-origin");
    }
    // T22: what a visitor types comes back escaped.
    let evil = "\"><script>alert(1)</script>@x.test";
    let r = sign_in(
        &w.app,
        evil,
        "whatever password",
        &[("tenant", "<img src=x onerror=alert(1)>")],
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(!r.text.contains("<script>alert(1)"), "{}", r.text);
    assert!(!r.text.contains("<img src=x"), "{}", r.text);
    assert!(
        r.text.contains("&lt;script&gt;") || r.text.contains("&#60;script&#62;"),
        "{}",
        r.text
    );
    assert!(!r.text.contains("<script"), "pages have no script at all");
    // Sign-in forms are small: a large one is refused whole.
    let big = "x".repeat(64 * 1024);
    let r = sign_in(&w.app, "alice@acme.test", &big, &[]).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    w.finish().await;
}

#[tokio::test]
async fn tokens_are_capped_by_their_creator_revocable_and_record_their_last_use() {
    let w = World::new(Backend::Sqlite).await;
    let create = |token: String, role: &'static str| {
        let app = w.app.clone();
        async move {
            send(
                &app,
                Method::POST,
                "/api/v1/tokens",
                Req {
                    token: Some(&token),
                    content_type: Some("application/json"),
                    body: json!({"role": role, "label": "t"}).to_string(),
                    ..Default::default()
                },
            )
            .await
        }
    };
    let get = |token: String, uri: &'static str| {
        let app = w.app.clone();
        async move {
            send(
                &app,
                Method::GET,
                uri,
                Req {
                    token: Some(&token),
                    ..Default::default()
                },
            )
            .await
        }
    };

    // Operator admin token mints a finance token; the answer shows it once.
    let r = create(w.token_a.clone(), "finance").await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let finance = r.json["token"].as_str().unwrap().to_owned();
    let finance_id = r.json["id"].as_i64().unwrap();
    // A finance token may not manage tokens at all.
    assert_eq!(
        create(finance.clone(), "viewer").await.status,
        StatusCode::FORBIDDEN
    );
    // A person's token is capped by the person's role, now and later (T24).
    let (tok, hash) = reckon_web::mint_token();
    w.ledger
        .create_token_by(
            w.a.id,
            Role::Admin,
            &hash,
            "alice",
            reckon_ledger::TokenCreator::User { id: w.alice },
        )
        .await
        .unwrap();
    assert_eq!(
        get(tok.clone(), "/api/v1/tokens").await.status,
        StatusCode::OK
    );
    w.ledger
        .set_membership(w.a.id, w.alice, Role::Viewer)
        .await
        .unwrap();
    assert_eq!(
        get(tok.clone(), "/api/v1/tokens").await.status,
        StatusCode::FORBIDDEN
    );
    // Still a valid token, with a viewer's summaries and no records.
    assert_eq!(
        get(tok.clone(), "/api/v1/sources").await.status,
        StatusCode::OK
    );
    assert_eq!(
        get(tok.clone(), "/api/v1/effects").await.status,
        StatusCode::FORBIDDEN
    );
    // And a viewer cannot mint anything above viewer for themselves.
    let (_, h2) = reckon_web::mint_token();
    let e = w
        .ledger
        .create_token_by(
            w.a.id,
            Role::Admin,
            &h2,
            "up",
            reckon_ledger::TokenCreator::User { id: w.alice },
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("higher role"), "{e}");

    // last_used_at is recorded; the list never shows a token.
    assert_eq!(
        get(finance.clone(), "/api/v1/effects").await.status,
        StatusCode::OK
    );
    let list = get(w.token_a.clone(), "/api/v1/tokens").await;
    assert!(!list.text.contains(&finance[4..20]));
    let row = list.json["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == finance_id)
        .unwrap()
        .clone();
    assert!(row["last_used_at"].is_number(), "{row}");

    // Revocation takes effect on the next request; a second revoke is a 404.
    let revoke = |id: i64| {
        let app = w.app.clone();
        let t = w.token_a.clone();
        async move {
            send(
                &app,
                Method::DELETE,
                &format!("/api/v1/tokens/{id}"),
                Req {
                    token: Some(&t),
                    ..Default::default()
                },
            )
            .await
            .status
        }
    };
    assert_eq!(revoke(finance_id).await, StatusCode::NO_CONTENT);
    assert_eq!(
        get(finance, "/api/v1/effects").await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(revoke(finance_id).await, StatusCode::NOT_FOUND);
    w.finish().await;
}
