//! Sign-in locks that cannot deny the right person on a trusted path: an attacker's
//! failures lock the attacker's own (address, account) pair, not the admin's own address;
//! a browser that signed in before passes with the right password whatever anyone else
//! did; many addresses guessing one password hold those addresses, never the account's
//! home address or known browsers; refused attempts count against their sender; IPv6
//! senders count per /64; a new password or an unlock lifts every lock. Served over real
//! TCP from several loopback addresses, on both ledgers.

use crate::common;

use axum::http::{StatusCode, header};
use common::{Backend, PASSWORD, World, sign_in};
use reckon_ledger::Admission;
use reckon_web::client_addr::{ClientAddress, ForwardedHeader};
use reckon_web::web::{ACCOUNT_LIMIT, ACCOUNT_WIDE_LIMIT, ADDRESS_LIMIT, THROTTLE};
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// reckon served on a loopback port; 127.0.0.1 is a trusted proxy (its `X-Forwarded-For`
/// is read), every other loopback address is a client as it is.
async fn serve(w: &World) -> SocketAddr {
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
    server
}

struct Answer {
    status: u16,
    /// `name=value` of each cookie set.
    cookies: Vec<String>,
}

impl Answer {
    fn cookie(&self, name: &str) -> Option<String> {
        self.cookies
            .iter()
            .find_map(|c| c.strip_prefix(&format!("{name}=")).map(str::to_owned))
    }
}

/// One sign-in over TCP from `local`, with `X-Forwarded-For: xff` when given and the
/// cookies given.
async fn post(
    server: SocketAddr,
    local: &str,
    xff: Option<&str>,
    cookie: Option<&str>,
    email: &str,
    pw: &str,
) -> Answer {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{local}:0").parse().unwrap()).unwrap();
    let mut stream = socket.connect(server).await.unwrap();
    let body = common::form(&[("email", email), ("password", pw)]);
    let mut extra = String::new();
    if let Some(x) = xff {
        extra.push_str(&format!("X-Forwarded-For: {x}\r\n"));
    }
    if let Some(c) = cookie {
        extra.push_str(&format!("Cookie: {c}\r\n"));
    }
    let request = format!(
        "POST /signin HTTP/1.1\r\nHost: reckon.test\r\nOrigin: https://reckon.test\r\n\
         Sec-Fetch-Site: same-origin\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         {extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
    let cookies = answer
        .lines()
        .take_while(|l| !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("set-cookie")
                .then(|| v.trim().split(';').next().unwrap_or_default().to_owned())
        })
        .collect();
    Answer { status, cookies }
}

/// The attacker sends `n` wrong passwords for alice from `local`; the statuses.
async fn hammer(server: SocketAddr, local: &str, n: usize) -> Vec<u16> {
    let mut codes = Vec::with_capacity(n);
    for i in 0..n {
        let a = post(
            server,
            local,
            None,
            None,
            "alice@acme.test",
            &format!("guess {i}"),
        )
        .await;
        codes.push(a.status);
    }
    codes
}

/// The admin signs in once from 127.0.0.3 (her own address, and a browser that now holds
/// a device cookie). An attacker at 127.0.0.4 then sends 200 wrong passwords: past the
/// first few it is refused, and the admin still signs in at once from her own address
/// (before, the account itself was locked for everyone). The attacker then moves to her
/// very address (same NAT): her address is locked for alice now, but her browser, with
/// its device cookie, signs in with the right password at once.
async fn the_right_person_is_never_locked_out(backend: Backend) {
    let w = World::new(backend).await;
    let server = serve(&w).await;
    let first = post(server, "127.0.0.3", None, None, "alice@acme.test", PASSWORD).await;
    assert_eq!(first.status, 303);
    let device = first
        .cookie("__Host-reckon_device")
        .expect("a device cookie");

    let codes = hammer(server, "127.0.0.4", 200).await;
    let checked = codes.iter().filter(|c| **c == 401).count() as i64;
    assert_eq!(checked, ACCOUNT_LIMIT, "{codes:?}");
    assert!(codes[checked as usize..].iter().all(|c| *c == 429));
    // The attacker's own address stays refused, right password or not.
    let a = post(server, "127.0.0.4", None, None, "alice@acme.test", PASSWORD).await;
    assert_eq!(a.status, 429);

    // Her own address, a fresh browser (no cookie): in at once.
    let a = post(server, "127.0.0.3", None, None, "alice@acme.test", PASSWORD).await;
    assert_eq!(a.status, 303, "the admin's own address is locked out");

    // The attacker at her address: that address is locked for alice...
    let codes = hammer(server, "127.0.0.3", 50).await;
    assert!(codes.ends_with(&[429, 429, 429]), "{codes:?}");
    let a = post(server, "127.0.0.3", None, None, "alice@acme.test", PASSWORD).await;
    assert_eq!(a.status, 429);
    // ...but not her browser.
    let cookie = format!("__Host-reckon_device={device}");
    let a = post(
        server,
        "127.0.0.3",
        None,
        Some(&cookie),
        "alice@acme.test",
        PASSWORD,
    )
    .await;
    assert_eq!(a.status, 303, "a known browser is locked out");
    // A device cookie grants nothing by itself: a wrong password is still wrong.
    let a = post(
        server,
        "127.0.0.3",
        None,
        Some(&cookie),
        "alice@acme.test",
        "not her password",
    )
    .await;
    assert_eq!(a.status, 401);
    // Another account's device id, or an invented one, is no known browser.
    let other = post(server, "127.0.0.5", None, None, "bob@globex.test", PASSWORD).await;
    let bobs = other.cookie("__Host-reckon_device").unwrap();
    for fake in [bobs, "A".repeat(43)] {
        let cookie = format!("__Host-reckon_device={fake}");
        let a = post(
            server,
            "127.0.0.3",
            None,
            Some(&cookie),
            "alice@acme.test",
            PASSWORD,
        )
        .await;
        assert_eq!(a.status, 429, "{fake}");
    }
    w.finish().await;
}

#[tokio::test]
async fn an_attacker_cannot_lock_the_admin_out_of_her_address_or_browser_on_sqlite() {
    the_right_person_is_never_locked_out(Backend::Sqlite).await;
}

#[tokio::test]
async fn an_attacker_cannot_lock_the_admin_out_of_her_address_or_browser_on_postgres() {
    the_right_person_is_never_locked_out(Backend::Postgres).await;
}

/// Many addresses guessing one password: past `ACCOUNT_WIDE_LIMIT` failures from
/// addresses alice never signed in from, every such address is held, a fresh one too; her
/// home address and her browser are not.
async fn many_addresses(backend: Backend) {
    let w = World::new(backend).await;
    let server = serve(&w).await;
    let first = post(server, "127.0.0.3", None, None, "alice@acme.test", PASSWORD).await;
    assert_eq!(first.status, 303);
    let device = first.cookie("__Host-reckon_device").unwrap();
    let per_address = ACCOUNT_LIMIT as usize;
    let addresses = (ACCOUNT_WIDE_LIMIT as usize).div_ceil(per_address) + 1;
    for n in 0..addresses {
        hammer(server, &format!("127.0.1.{}", n + 1), per_address).await;
    }
    let a = post(server, "127.0.2.1", None, None, "alice@acme.test", PASSWORD).await;
    assert_eq!(
        a.status, 429,
        "a fresh address is held by the account-wide count"
    );
    let cookie = format!("__Host-reckon_device={device}");
    let a = post(
        server,
        "127.0.2.2",
        None,
        Some(&cookie),
        "alice@acme.test",
        PASSWORD,
    )
    .await;
    assert_eq!(a.status, 303, "her browser is held");
    // Her sign-in ended the count; many addresses again, and her home address.
    for n in 0..addresses {
        hammer(server, &format!("127.0.3.{}", n + 1), per_address).await;
    }
    let a = post(server, "127.0.4.1", None, None, "alice@acme.test", PASSWORD).await;
    assert_eq!(a.status, 429);
    let a = post(server, "127.0.0.3", None, None, "alice@acme.test", PASSWORD).await;
    assert_eq!(a.status, 303, "her home address is held");
    w.finish().await;
}

#[tokio::test]
async fn many_addresses_are_held_but_not_the_home_address_or_a_known_browser_on_sqlite() {
    many_addresses(Backend::Sqlite).await;
}

#[tokio::test]
async fn many_addresses_are_held_but_not_the_home_address_or_a_known_browser_on_postgres() {
    many_addresses(Backend::Postgres).await;
}

/// A sender past its address limit that keeps trying stays refused: each refused attempt
/// counts, and starts the window again; after a quiet window it is admitted. (Times are
/// given, so the test does not wait.)
async fn refused_attempts_count(backend: Backend) {
    let w = World::new(backend).await;
    let l = &w.ledger;
    let addr = "198.51.100.7";
    let t0 = 2_000_000_000.0;
    for i in 0..ADDRESS_LIMIT {
        let acct = format!("user{i}@acme.test");
        let a = l.throttle_admit(&acct, addr, None, t0, &THROTTLE).await;
        assert_eq!(a.unwrap(), Admission::Admitted, "attempt {i}");
    }
    let window = THROTTLE.address_window_secs;
    let mut at = t0 + 1.0;
    // Refused attempts spread over more than a window.
    while at < t0 + 2.0 * window {
        let a = l
            .throttle_admit("x@acme.test", addr, None, at, &THROTTLE)
            .await;
        assert_eq!(a.unwrap(), Admission::AddressLimited, "at t0 + {}", at - t0);
        at += window / 3.0;
    }
    let last = at - window / 3.0;
    let a = l
        .throttle_admit("x@acme.test", addr, None, last + window + 1.0, &THROTTLE)
        .await;
    assert_eq!(a.unwrap(), Admission::Admitted, "after a quiet window");
    w.finish().await;
}

#[tokio::test]
async fn refused_attempts_count_against_the_sender_on_sqlite() {
    refused_attempts_count(Backend::Sqlite).await;
}

#[tokio::test]
async fn refused_attempts_count_against_the_sender_on_postgres() {
    refused_attempts_count(Backend::Postgres).await;
}

/// A locked sender is let in again by a new password (the failures were guesses at the
/// old one) and by `reckon user unlock`.
async fn lifted(backend: Backend) {
    let w = World::new(backend).await;
    let l = &w.ledger;
    let addr = "203.0.113.5";
    let t0 = reckon_domain::time::now();
    let lock = |acct: &'static str| async move {
        for i in 0..ACCOUNT_LIMIT {
            let a = l.throttle_admit(acct, addr, None, t0 + i as f64, &THROTTLE);
            assert_eq!(a.await.unwrap(), Admission::Admitted);
        }
        let a = l.throttle_admit(acct, addr, None, t0 + 10.0, &THROTTLE);
        assert!(matches!(a.await.unwrap(), Admission::AccountLocked(_)));
    };
    lock("alice@acme.test").await;
    let hash = reckon_web::password::hash_blocking("a brand new password");
    l.set_password(w.alice, &hash).await.unwrap();
    let a = l.throttle_admit("alice@acme.test", addr, None, t0 + 11.0, &THROTTLE);
    assert_eq!(
        a.await.unwrap(),
        Admission::Admitted,
        "after a new password"
    );

    lock("bob@globex.test").await;
    assert!(l.unlock_account("Bob@Globex.test").await.unwrap() > 0);
    let a = l.throttle_admit("bob@globex.test", addr, None, t0 + 11.0, &THROTTLE);
    assert_eq!(a.await.unwrap(), Admission::Admitted, "after an unlock");
    w.finish().await;
}

#[tokio::test]
async fn a_new_password_or_an_unlock_lifts_the_lock_on_sqlite() {
    lifted(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_new_password_or_an_unlock_lifts_the_lock_on_postgres() {
    lifted(Backend::Postgres).await;
}

/// Three (and more) addresses of one IPv6 /64, behind the trusted proxy, share one
/// address allowance: the attempt past `ADDRESS_LIMIT` is refused whichever of them sends
/// it, while another /64 is not.
async fn ipv6_prefix(backend: Backend) {
    let w = World::new(backend).await;
    let server = serve(&w).await;
    let mut codes = Vec::new();
    for i in 0..ADDRESS_LIMIT + 1 {
        let xff = format!("2001:db8:7:7::{:x}", i % 3 + 1);
        let email = format!("nobody{i}@acme.test");
        let a = post(server, "127.0.0.1", Some(&xff), None, &email, "x").await;
        codes.push(a.status);
    }
    assert!(codes[..ADDRESS_LIMIT as usize].iter().all(|c| *c == 401));
    assert_eq!(codes[ADDRESS_LIMIT as usize], 429, "{codes:?}");
    let a = post(
        server,
        "127.0.0.1",
        Some("2001:db8:7:7:ffff:ffff:ffff:ffff"),
        None,
        "bob@globex.test",
        PASSWORD,
    )
    .await;
    assert_eq!(a.status, 429, "another address of the same /64");
    let a = post(
        server,
        "127.0.0.1",
        Some("2001:db8:7:8::1"),
        None,
        "bob@globex.test",
        PASSWORD,
    )
    .await;
    assert_eq!(a.status, 303, "another /64");
    w.finish().await;
}

#[tokio::test]
async fn ipv6_senders_are_counted_per_64_on_sqlite() {
    ipv6_prefix(Backend::Sqlite).await;
}

#[tokio::test]
async fn ipv6_senders_are_counted_per_64_on_postgres() {
    ipv6_prefix(Backend::Postgres).await;
}

/// A sign-in sets the device cookie beside the session's: `__Host-`, HttpOnly, Secure,
/// and sent only with the site's own requests.
#[tokio::test]
async fn a_sign_in_sets_a_device_cookie() {
    let w = World::new(Backend::Sqlite).await;
    let r = sign_in(&w.app, "alice@acme.test", PASSWORD, &[]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    let set: Vec<&str> = r
        .headers
        .get_all(header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let device = set
        .iter()
        .find(|c| c.starts_with("__Host-reckon_device="))
        .expect("a device cookie");
    for part in ["Path=/", "Secure", "HttpOnly", "SameSite=Strict"] {
        assert!(device.contains(part), "{part} missing from {device}");
    }
    w.finish().await;
}
