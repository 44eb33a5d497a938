//! Support's lookup gives one answer for every case, through the API and the dashboard, on
//! both ledgers: reconciled applied / not_applied / duplicate while the application still
//! says unknown, a provisional applied, the audit's missing and duplicate (with amounts), an
//! orphan charge found by the order id in its metadata, an abandoned claim, an effect no
//! provider answers for, a resolution by hand, a "not charged" verdict the day's charge list
//! later contradicts (never "safe to try again" beside the charge), a charge taken for an
//! effect recorded failed or released, nothing found (with "did you mean"), and provider object ids.

use crate::common;
use reckon_testkit::answer_cases;

use answer_cases::*;
use axum::http::{Method, StatusCode};
use common::{Backend, Req, World, send, session};
use serde_json::Value;

/// What one case must answer.
struct Expect {
    q: &'static str,
    verdict: &'static str,
    is_final: bool,
    by: &'static str,
    needs_person: bool,
    /// Words the sentence must hold.
    says: &'static [&'static str],
}

const CASES: &[Expect] = &[
    Expect {
        q: APPLIED,
        verdict: "applied",
        is_final: true,
        by: "reconciler",
        needs_person: false,
        says: &["Charged once", "still says unknown"],
    },
    Expect {
        q: NOT_APPLIED,
        verdict: "not_applied",
        is_final: true,
        by: "reconciler",
        needs_person: false,
        says: &["Not charged", "safe to try again"],
    },
    Expect {
        q: DUPLICATE_RECONCILED,
        verdict: "duplicate",
        is_final: true,
        by: "reconciler",
        needs_person: false,
        says: &["more than once"],
    },
    Expect {
        q: PROVISIONAL,
        verdict: "applied",
        is_final: false,
        by: "reconciler",
        needs_person: false,
        says: &["Probably charged once", "not complete", "looks again at"],
    },
    Expect {
        q: MISSING,
        verdict: "missing",
        is_final: false,
        by: "audit",
        needs_person: true,
        says: &["recorded it as done", "no charge for it", "missing"],
    },
    Expect {
        q: DUPLICATE_AUDIT,
        verdict: "duplicate",
        is_final: true,
        by: "audit",
        needs_person: true,
        says: &["Charged twice", "$1,234.00", "refunded $1,234.00"],
    },
    Expect {
        q: ABANDONED,
        verdict: "unknown",
        is_final: false,
        by: "nobody",
        needs_person: false,
        says: &["worker stopped before recording"],
    },
    Expect {
        q: UNROUTED,
        verdict: "unknown",
        is_final: false,
        by: "nobody",
        needs_person: true,
        says: &["no provider is set up", "A person must check"],
    },
    Expect {
        q: CONTRADICTED,
        verdict: "unknown",
        is_final: false,
        by: "audit",
        needs_person: true,
        says: &["Contradicted", "not charged", "Do not try again"],
    },
    Expect {
        q: CHARGED_NOT_RECORDED,
        verdict: "applied",
        is_final: false,
        by: "audit",
        needs_person: true,
        says: &[
            "recorded it as failed or released it",
            "$31.00",
            "Do not charge again",
        ],
    },
    Expect {
        q: RELEASED,
        verdict: "applied",
        is_final: false,
        by: "audit",
        needs_person: true,
        says: &[
            "recorded it as failed or released it",
            "$42.00",
            "Do not charge again",
        ],
    },
    Expect {
        q: BY_HAND,
        verdict: "applied",
        is_final: true,
        by: "person",
        needs_person: false,
        says: &["Resolved by hand", HAND_AUTHOR, HAND_NOTE],
    },
];

async fn api(w: &World, q: &str) -> Value {
    let r = send(
        &w.app,
        Method::GET,
        &format!(
            "/api/v1/lookup?q={}",
            url::form_urlencoded::byte_serialize(q.as_bytes()).collect::<String>()
        ),
        Req {
            token: Some(&w.token_a),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{q}: {}", r.text);
    r.json
}

async fn page(w: &World, cookie: &str, q: &str) -> String {
    let r = send(
        &w.app,
        Method::GET,
        &format!(
            "/t/acme/lookup?q={}",
            url::form_urlencoded::byte_serialize(q.as_bytes()).collect::<String>()
        ),
        Req {
            cookie: Some(cookie),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{q}: {}", r.text);
    r.text
}

/// The page's text with its tags dropped and entities decoded, for sentence checks.
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

async fn every_case_answers_the_same_on_the_api_and_the_page(backend: Backend) {
    let w = World::new(backend).await;
    let cases = plant(w.ledger.clone(), &w.a).await;
    let (cookie, _) = session(&w.app, "alice@acme.test").await;

    for e in CASES {
        let a = api(&w, e.q).await;
        assert_eq!(a["found"], true, "{}: {a:#}", e.q);
        assert_eq!(a["matched_by"], "key", "{}", e.q);
        let effects = a["effects"].as_array().unwrap();
        assert_eq!(effects.len(), 1, "{}: {a:#}", e.q);
        let x = &effects[0];
        assert_eq!(x["verdict"], e.verdict, "{}: {x:#}", e.q);
        assert_eq!(x["final"], e.is_final, "{}: {x:#}", e.q);
        assert_eq!(x["by"], e.by, "{}: {x:#}", e.q);
        assert_eq!(x["needs_person"], e.needs_person, "{}: {x:#}", e.q);
        let sentence = x["sentence"].as_str().unwrap();
        for w in e.says {
            assert!(sentence.contains(w), "{}: {sentence:?} lacks {w:?}", e.q);
        }
        assert_eq!(
            a["sentence"], x["sentence"],
            "one effect: its sentence is the answer"
        );
        // Times come as epoch and RFC 3339 together.
        assert!(x["recorded"]["created"]["epoch"].is_number());
        assert!(
            x["recorded"]["created"]["rfc3339"]
                .as_str()
                .unwrap()
                .ends_with('Z')
        );

        let html = page(&w, &cookie, e.q).await;
        assert!(
            html.contains(&format!("data-verdict=\"{}\"", e.verdict)),
            "{}: {html}",
            e.q
        );
        let words = text(&html);
        for w in e.says {
            assert!(words.contains(w), "{}: the page lacks {w:?}", e.q);
        }
        assert_eq!(
            html.contains("needs a person"),
            e.needs_person,
            "{}: needs-a-person badge",
            e.q
        );

        // The effect's own page says what the lookup says, in the same words.
        let path = format!(
            "/t/acme/effects/{}/{}",
            x["source"].as_str().unwrap(),
            x["key"].as_str().unwrap()
        );
        let r = send(
            &w.app,
            Method::GET,
            &path,
            Req {
                cookie: Some(&cookie),
                ..Default::default()
            },
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.text);
        assert!(
            r.text
                .contains(&format!("id=\"answer\" data-verdict=\"{}\"", e.verdict)),
            "{}: the effect page's verdict: {}",
            e.q,
            r.text
        );
        assert!(
            text(&r.text).contains(sentence),
            "{}: the effect page does not say {sentence:?}",
            e.q
        );
        assert_eq!(
            r.text.contains("needs a person"),
            e.needs_person,
            "{}: the effect page's needs-a-person badge",
            e.q
        );
    }

    // The facts behind the sentences.
    let a = api(&w, PROVISIONAL).await;
    assert!(a["effects"][0]["lookup"]["next_lookup"]["rfc3339"].is_string());
    let a = api(&w, UNROUTED).await;
    assert!(a["effects"][0]["provider"].is_null());
    assert!(
        a["effects"][0]["lookup"]["next_lookup"].is_null(),
        "no provider: no next lookup"
    );
    let a = api(&w, BY_HAND).await;
    let r = &a["effects"][0]["resolution"];
    assert_eq!(r["author"], HAND_AUTHOR);
    assert_eq!(r["note"], HAND_NOTE);
    assert_eq!(r["by_person"], true);
    assert!(a["effects"][0]["lookup"]["next_lookup"].is_null());
    assert_ne!(a["effects"][0]["lookup"]["needs_attention"], true);
    let a = api(&w, MISSING).await;
    let f = &a["effects"][0]["findings"][0];
    assert_eq!(f["kind"], "missing");
    assert_eq!(f["day"], cases.day.as_str());
    let a = api(&w, DUPLICATE_AUDIT).await;
    let charges = a["effects"][0]["charges"].as_array().unwrap();
    assert_eq!(charges.len(), 2, "{a:#}");
    assert!(charges.iter().all(|c| c["amount"] == "$1,234.00"));
    assert!(
        a["effects"][0]["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["kind"] == "duplicate")
    );
    let a = api(&w, ABANDONED).await;
    assert_eq!(a["effects"][0]["recorded"]["unresolved"], "abandoned");

    // An orphan: money at the provider, found by the order id in its metadata only.
    let a = api(&w, ORPHAN).await;
    assert_eq!(a["found"], true, "{a:#}");
    assert_eq!(a["effects"].as_array().unwrap().len(), 0);
    let o = &a["orphans"][0];
    assert_eq!(o["charge"]["id"], "demo_ch_orphan", "{a:#}");
    assert_eq!(o["charge"]["amount"], "$49.00");
    assert!(o["sentence"].as_str().unwrap().contains("no effect"));
    assert!(
        o["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["kind"] == "orphan"),
        "{a:#}"
    );
    let html = page(&w, &cookie, ORPHAN).await;
    assert!(html.contains("data-charge=\"demo_ch_orphan\""), "{html}");
    assert!(text(&html).contains("no effect of the application accounts for"));

    // Provider object ids: a charge, a refund.
    for (q, order) in [
        (cases.applied_charge.as_str(), APPLIED),
        (cases.duplicate_refund.as_str(), DUPLICATE_AUDIT),
    ] {
        let a = api(&w, q).await;
        assert_eq!(a["matched_by"], "provider_object", "{q}: {a:#}");
        assert_eq!(
            a["effects"][0]["key"],
            format!("charge:v1:{order}"),
            "{q}: {a:#}"
        );
        let html = page(&w, &cookie, q).await;
        assert!(html.contains(&format!("charge:v1:{order}")), "{q}");
    }

    // Nothing found, and a near match offered, never answered.
    let a = api(&w, NOBODY_HAS).await;
    assert_eq!(a["found"], false);
    assert_eq!(a["matched_by"], "nothing");
    assert!(a["sentence"].as_str().unwrap().starts_with("Nothing found"));
    let a = api(&w, &APPLIED.to_lowercase()).await;
    assert_eq!(a["found"], false, "a near match is not an answer");
    assert_eq!(a["effects"].as_array().unwrap().len(), 0);
    assert_eq!(a["did_you_mean"][0], APPLIED);
    let html = page(&w, &cookie, &APPLIED.to_lowercase()).await;
    assert!(html.contains("id=\"did-you-mean\""), "{html}");
    assert!(html.contains(&format!("q={APPLIED}")), "{html}");

    // Refused searches say why, on both surfaces.
    let long = "x".repeat(600);
    let r = send(
        &w.app,
        Method::GET,
        &format!("/api/v1/lookup?q={long}"),
        Req {
            token: Some(&w.token_a),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(r.text.contains("too long"), "{}", r.text);
    w.finish().await;
}

#[tokio::test]
async fn every_case_answers_the_same_on_sqlite() {
    every_case_answers_the_same_on_the_api_and_the_page(Backend::Sqlite).await;
}

#[tokio::test]
async fn every_case_answers_the_same_on_postgres() {
    every_case_answers_the_same_on_the_api_and_the_page(Backend::Postgres).await;
}
