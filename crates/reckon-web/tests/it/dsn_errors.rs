//! A refused DSN is answered with a sentence that never depends on a stored secret: no
//! parameter name or value is repeated, and nothing is cut out of the answer, so a guess
//! put in the DSN (or any other field) gets the same answer whether or not it is the stored
//! password, and a short password does not punch holes in words.

use crate::common;

use axum::http::{Method, StatusCode};
use common::{Backend, Reply, Req, World, send};
use serde_json::{Value, json};

const STORED: &str = "hunter2";

async fn call(w: &World, method: Method, uri: &str, body: Value) -> Reply {
    send(
        &w.app,
        method,
        uri,
        Req {
            token: Some(&w.token_a),
            content_type: Some("application/json"),
            body: body.to_string(),
            ..Default::default()
        },
    )
    .await
}

fn error(r: &Reply) -> String {
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    r.json["error"].as_str().unwrap().to_owned()
}

/// PATCH a source whose stored password is `hunter2` with DSNs that put a guess where the
/// old scrubber would have cut the stored password out of the answer: the answer to the
/// right guess equals the answer to a wrong one (with the guess swapped), and neither holds
/// "<redacted>".
#[tokio::test]
async fn a_refused_dsn_is_no_oracle_for_the_stored_password() {
    let w = World::new(Backend::Sqlite).await;
    let r = call(
        &w,
        Method::POST,
        "/api/v1/sources",
        json!({"name": "shop", "kind": "postgres",
               "dsn": format!("postgres://app:{STORED}@93.184.216.34:5432/shop")}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);

    let answer = |guess: &str| {
        let guess = guess.to_owned();
        let w = &w;
        async move {
            let mut said = Vec::new();
            for body in [
                // An unknown parameter named, or valued, like the guess.
                json!({"dsn": format!("postgres://app@93.184.216.34:5432/shop?{guess}=1")}),
                json!({"dsn": format!("postgres://app@93.184.216.34:5432/shop?sslmode={guess}")}),
                // The guess as a scheme, a table, a duration.
                json!({"dsn": format!("{guess}://app@93.184.216.34:5432/shop")}),
                json!({"table": format!("{guess};drop")}),
                json!({"scan_interval": guess}),
            ] {
                let r = call(w, Method::PATCH, "/api/v1/sources/shop", body).await;
                said.push(error(&r).replace(&guess, "GUESS"));
            }
            said
        }
    };
    let right = answer(STORED).await;
    let wrong = answer("swordfish").await;
    assert_eq!(right, wrong);
    for s in &right {
        assert!(!s.contains("redacted"), "{s}");
    }
    // No parameter name or value is repeated at all.
    assert!(!right[0].contains("GUESS"), "{}", right[0]);
    assert!(!right[1].contains("GUESS"), "{}", right[1]);
    assert!(!right[2].contains("GUESS"), "{}", right[2]);
    assert!(!right[3].contains("GUESS"), "{}", right[3]);
    assert!(right[0].contains("only sslmode"), "{}", right[0]);
    w.finish().await;
}

/// A one-letter password is not cut out of the sentences that refuse its DSN (at add and
/// at edit, API and dashboard): "egress policy" stays whole.
#[tokio::test]
async fn a_short_password_leaves_the_refusal_readable() {
    let w = World::new(Backend::Sqlite).await;
    let r = call(
        &w,
        Method::POST,
        "/api/v1/sources",
        json!({"name": "shop", "kind": "postgres",
               "dsn": "postgres://app:p@10.0.0.1:5432/shop"}),
    )
    .await;
    let said = error(&r);
    assert!(said.contains("egress policy"), "{said}");
    assert!(said.contains("private"), "{said}");
    assert!(!said.contains("redacted"), "{said}");

    let r = call(
        &w,
        Method::POST,
        "/api/v1/sources",
        json!({"name": "shop", "kind": "postgres",
               "dsn": "postgres://app:p@93.184.216.34:5432/shop"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    // An edit that keeps the stored "p" (same server, user, database): its refusal whole.
    let r = call(
        &w,
        Method::PATCH,
        "/api/v1/sources/shop",
        json!({"dsn": "postgres://app@93.184.216.34:5432/shop?sslmode=bogus"}),
    )
    .await;
    let said = error(&r);
    assert!(said.contains("prefer, require"), "{said}");
    assert!(!said.contains("redacted"), "{said}");

    let (session, csrf) = common::session(&w.app, "alice@acme.test").await;
    let r = send(
        &w.app,
        Method::POST,
        "/t/acme/settings/sources",
        Req {
            cookie: Some(&session),
            headers: common::same_origin(),
            content_type: Some("application/x-www-form-urlencoded"),
            body: common::form(&[
                ("csrf", &csrf),
                ("name", "other"),
                ("kind", "postgres"),
                ("dsn", "postgres://app:p@10.0.0.1:5432/shop"),
            ]),
            ..Default::default()
        },
    )
    .await;
    assert!(r.text.contains("egress policy"), "{}", r.text);
    assert!(!r.text.contains("redacted"), "{}", r.text);
    w.finish().await;
}
