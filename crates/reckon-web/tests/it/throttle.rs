//! The sign-in throttle: each attempt is admitted and counted in one ledger step, so
//! concurrent wrong passwords cannot all be checked; an account's lock grows with its
//! failures; and behind a trusted proxy the per-address limit counts each client, so one
//! client cannot lock everyone else out.

use crate::common;

use axum::http::StatusCode;
use common::{Backend, PASSWORD, World, sign_in};
use reckon_ledger::Admission;
use reckon_web::client_addr::{ClientAddress, ForwardedHeader};
use reckon_web::web::{ACCOUNT_LIMIT, ADDRESS_LIMIT, THROTTLE};
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// 50 wrong passwords for one account at once, then 49 wrong and the right one at once for
/// another: at most `ACCOUNT_LIMIT` of each burst is checked (401, or the sign-in), the
/// rest are refused unchecked (429), and the locked account stays locked for the right
/// password too.
async fn concurrent_attempts(backend: Backend) {
    let w = World::new(backend).await;
    let burst = |email: &'static str, right: Option<usize>| {
        let mut set = tokio::task::JoinSet::new();
        for i in 0..50 {
            let app = w.app.clone();
            let password = if Some(i) == right {
                PASSWORD.to_owned()
            } else {
                format!("wrong guess {i}")
            };
            set.spawn(async move { sign_in(&app, email, &password, &[]).await.status });
        }
        set
    };
    let mut statuses = Vec::new();
    let mut set = burst("alice@acme.test", None);
    while let Some(s) = set.join_next().await {
        statuses.push(s.unwrap());
    }
    let checked = statuses
        .iter()
        .filter(|s| **s == StatusCode::UNAUTHORIZED)
        .count();
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!(checked as i64, ACCOUNT_LIMIT, "{statuses:?}");
    assert_eq!(checked + refused, 50, "{statuses:?}");
    let r = sign_in(&w.app, "alice@acme.test", PASSWORD, &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text);

    let mut statuses = Vec::new();
    let mut set = burst("bob@globex.test", Some(25));
    while let Some(s) = set.join_next().await {
        statuses.push(s.unwrap());
    }
    let checked = statuses
        .iter()
        .filter(|s| **s == StatusCode::UNAUTHORIZED || **s == StatusCode::SEE_OTHER)
        .count();
    assert!(checked as i64 <= ACCOUNT_LIMIT, "{statuses:?}");
    w.finish().await;
}

#[tokio::test]
async fn fifty_concurrent_wrong_passwords_check_at_most_the_limit_on_sqlite() {
    concurrent_attempts(Backend::Sqlite).await;
}

#[tokio::test]
async fn fifty_concurrent_wrong_passwords_check_at_most_the_limit_on_postgres() {
    concurrent_attempts(Backend::Postgres).await;
}

/// The account's lock: none for the first `ACCOUNT_LIMIT` failures, then a minute, doubling
/// with each failure after it; a success ends it; other accounts from the same address are
/// not touched. (Times are given, so the test does not wait.)
async fn lock_grows(backend: Backend) {
    let w = World::new(backend).await;
    let l = &w.ledger;
    let (acct, addr) = ("carol@acme.test", "203.0.113.5");
    let t0 = 2_000_000_000.0;
    for i in 0..ACCOUNT_LIMIT {
        let a = l
            .throttle_admit(acct, addr, None, t0 + i as f64, &THROTTLE)
            .await;
        assert_eq!(a.unwrap(), Admission::Admitted, "attempt {i}");
    }
    let last = t0 + (ACCOUNT_LIMIT - 1) as f64;
    let a = l
        .throttle_admit(acct, addr, None, last + 1.0, &THROTTLE)
        .await;
    assert_eq!(a.unwrap(), Admission::AccountLocked(last + 60.0));
    // Another account from the same address is not locked.
    let a = l
        .throttle_admit("dave@acme.test", addr, None, last + 1.0, &THROTTLE)
        .await;
    assert_eq!(a.unwrap(), Admission::Admitted);
    // After the minute: one more attempt, then two minutes, then four.
    let mut at = last + 60.0;
    for lock in [120.0, 240.0, 480.0] {
        let a = l.throttle_admit(acct, addr, None, at, &THROTTLE).await;
        assert_eq!(a.unwrap(), Admission::Admitted);
        let a = l
            .throttle_admit(acct, addr, None, at + 1.0, &THROTTLE)
            .await;
        assert_eq!(a.unwrap(), Admission::AccountLocked(at + lock));
        at += lock;
    }
    assert_eq!(THROTTLE.lock_after(40), 3600.0);
    // A success (after an admitted attempt) ends the lock and the count.
    let a = l.throttle_admit(acct, addr, None, at, &THROTTLE).await;
    assert_eq!(a.unwrap(), Admission::Admitted);
    l.throttle_succeeded(acct, addr, None).await.unwrap();
    for i in 0..ACCOUNT_LIMIT {
        let a = l
            .throttle_admit(acct, addr, None, at + 1.0 + i as f64, &THROTTLE)
            .await;
        assert_eq!(
            a.unwrap(),
            Admission::Admitted,
            "after the success, attempt {i}"
        );
    }
    w.finish().await;
}

#[tokio::test]
async fn an_accounts_lock_grows_with_its_failures_on_sqlite() {
    lock_grows(Backend::Sqlite).await;
}

#[tokio::test]
async fn an_accounts_lock_grows_with_its_failures_on_postgres() {
    lock_grows(Backend::Postgres).await;
}

/// One sign-in over a real TCP connection from `local` (a loopback address), with an
/// `X-Forwarded-For` header; the answer's status code.
async fn post_signin(server: SocketAddr, local: &str, xff: &str, email: &str, pw: &str) -> u16 {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{local}:0").parse().unwrap()).unwrap();
    let mut stream = socket.connect(server).await.unwrap();
    let body = common::form(&[("email", email), ("password", pw)]);
    let request = format!(
        "POST /signin HTTP/1.1\r\nHost: reckon.test\r\nOrigin: https://reckon.test\r\n\
         Sec-Fetch-Site: same-origin\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         X-Forwarded-For: {xff}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"))
}

/// reckon behind a proxy at 127.0.0.1 (trusted): a client that spends its address's
/// attempts is refused, and another client behind the same proxy still signs in. A peer
/// that is not a trusted proxy (127.0.0.2) is counted by its own address, whatever
/// `X-Forwarded-For` it sends, so rotating that header gets it nothing.
#[tokio::test]
async fn behind_a_trusted_proxy_one_client_cannot_lock_out_the_others() {
    let w = World::new(Backend::Sqlite).await;
    let state = reckon_web::AppState {
        client_address: ClientAddress::new(&["127.0.0.1".into()], ForwardedHeader::XForwardedFor)
            .unwrap(),
        ..reckon_web::AppState::new(w.ledger.clone())
    };
    let app = reckon_web::app(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    // The attacker, through the proxy: a different unknown account each time.
    let mut codes = Vec::new();
    for i in 0..ADDRESS_LIMIT + 3 {
        let email = format!("nobody{i}@acme.test");
        codes.push(post_signin(server, "127.0.0.1", "203.0.113.66", &email, "x").await);
    }
    assert!(
        codes[..ADDRESS_LIMIT as usize].iter().all(|c| *c == 401),
        "{codes:?}"
    );
    assert!(
        codes[ADDRESS_LIMIT as usize..].iter().all(|c| *c == 429),
        "{codes:?}"
    );
    // Everyone else behind the same proxy signs in.
    let code = post_signin(
        server,
        "127.0.0.1",
        "203.0.113.9",
        "alice@acme.test",
        PASSWORD,
    )
    .await;
    assert_eq!(code, 303);
    // The client's own claim left of the proxy's entry changes nothing.
    let code = post_signin(
        server,
        "127.0.0.1",
        "198.51.100.1, 203.0.113.66",
        "bob@globex.test",
        PASSWORD,
    )
    .await;
    assert_eq!(code, 429);
    // An untrusted peer's header is not read: its attempts count on 127.0.0.2.
    let mut codes = Vec::new();
    for i in 0..ADDRESS_LIMIT + 2 {
        let xff = format!("198.51.100.{i}");
        let email = format!("other{i}@acme.test");
        codes.push(post_signin(server, "127.0.0.2", &xff, &email, "x").await);
    }
    assert!(
        codes[ADDRESS_LIMIT as usize..].iter().all(|c| *c == 429),
        "{codes:?}"
    );
    w.finish().await;
}
