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
use reckon_domain::{SourceRecord, State, time};
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
        says: &["Charged once: "],
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
        says: &["Charged twice", "Refund the extra one"],
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
    assert!(o["sentence"].as_str().unwrap().contains("no record of"));
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
    assert!(text(&html).contains("the application has no record of"));

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

/// The sentence parts of a lookup page: the answer (`#verdict`) and each effect's sentence,
/// as text (the folded details are not read to a customer, so they are not checked here).
fn said_on_page(html: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (open, close) in [
        ("<p class=\"verdict\" id=\"verdict\">", "</p>"),
        ("<ul class=\"verdict lines\" id=\"verdict\">", "</ul>"),
        ("<p class=\"sentence\">", "</p>"),
    ] {
        for part in html.split(open).skip(1) {
            out.push(text(part.split(close).next().unwrap_or_default()));
        }
    }
    out
}

async fn ingest_one(w: &World, tenant: &reckon_ledger::Tenant, source: &str, r: SourceRecord) {
    let id = match w
        .ledger
        .list_sources(tenant.id)
        .await
        .unwrap()
        .into_iter()
        .find(|s| s.name == source)
    {
        Some(s) => s.id,
        None => {
            w.ledger
                .add_source(
                    tenant.id,
                    reckon_ledger::NewSource {
                        name: source.into(),
                        kind: reckon_ledger::SourceKind::Push,
                        dsn: None,
                        dsn_display: None,
                        table_name: "justonce_keys".into(),
                        scan_interval_secs: 60,
                        abandoned_after_secs: 300.0,
                        overlap_secs: 5.0,
                        full_scan_every_secs: 3600,
                        mapping: None,
                    },
                )
                .await
                .unwrap()
                .id
        }
    };
    w.ledger
        .ingest(
            tenant.id,
            id,
            reckon_ledger::IngestBatch {
                origin: reckon_ledger::Origin::Push,
                observed_at: time::now(),
                records: vec![r],
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

fn record(key: &str, state: State, response: Option<&str>) -> SourceRecord {
    let at = time::now() - 600.0;
    SourceRecord {
        key: key.to_owned(),
        state,
        request_hash: "1:9f86d081884c7d65".to_owned(),
        response: response.map(str::to_owned),
        attempts: 1,
        created_at: at,
        updated_at: at + if state == State::Unknown { 1.0 } else { 2.0 },
        expires_at: None,
    }
}

async fn api_as(w: &World, token: &str, q: &str) -> Value {
    let r = send(
        &w.app,
        Method::GET,
        &format!(
            "/api/v1/lookup?q={}",
            url::form_urlencoded::byte_serialize(q.as_bytes()).collect::<String>()
        ),
        Req {
            token: Some(token),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{q}: {}", r.text);
    r.json
}

/// Words support reads to a customer: a reconciled charge with its id, amount and time; no
/// word of reckon's workings in any sentence (the detail kept apart); an order of several
/// effects one short line each, named by what it is; the customer the provider named.
async fn words_to_read_to_a_customer(backend: Backend) {
    let w = World::new(backend).await;
    let cases = plant(w.ledger.clone(), &w.a).await;
    let (cookie, _) = session(&w.app, "alice@acme.test").await;

    // A charge the reconciler resolved: its id, amount and time, as the README promises.
    let a = api(&w, APPLIED).await;
    let x = &a["effects"][0];
    let charge = &x["charges"][0];
    assert_eq!(charge["id"], cases.applied_charge.as_str(), "{x:#}");
    let said = format!(
        "Charged once: {}, $20.00, {}.",
        cases.applied_charge,
        charge["created"]["text"].as_str().unwrap()
    );
    assert_eq!(x["sentence"], said.as_str(), "{x:#}");
    assert!(said.ends_with(" UTC."), "{said}");
    // What the application's row still says is detail, not the sentence.
    let details: Vec<&str> = x["details"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    assert!(
        details.iter().any(|d| d.contains("says unknown")),
        "{details:?}"
    );
    let html = page(&w, &cookie, APPLIED).await;
    assert!(text(&html).contains(&said), "{html}");
    assert!(html.contains("<details class=\"details\">"), "{html}");
    // The duplicate names both charges and the one to refund.
    let a = api(&w, DUPLICATE_RECONCILED).await;
    let s = a["sentence"].as_str().unwrap();
    assert!(s.starts_with("Charged twice: demo_ch_"), "{s}");
    assert!(s.contains("$15.00") && s.contains(" UTC"), "{s}");
    assert!(s.contains("Refund the extra one: demo_ch_"), "{s}");

    // No sentence of any case holds a developer's word, on the API or the page.
    let every = CASES
        .iter()
        .map(|c| c.q)
        .chain([MULTI, ORPHAN, NOBODY_HAS, "ORD-1O17"]);
    for q in every {
        let a = api(&w, q).await;
        let mut sentences: Vec<String> = vec![a["sentence"].as_str().unwrap().to_owned()];
        for l in a["lines"].as_array().unwrap() {
            sentences.push(l.as_str().unwrap().to_owned());
        }
        for e in a["effects"].as_array().unwrap() {
            sentences.push(e["sentence"].as_str().unwrap().to_owned());
        }
        for o in a["orphans"].as_array().unwrap() {
            sentences.push(o["sentence"].as_str().unwrap().to_owned());
        }
        sentences.extend(said_on_page(&page(&w, &cookie, q).await));
        for s in &sentences {
            assert!(
                developer_words(s).is_empty(),
                "{q}: {s:?} holds {:?}",
                developer_words(s)
            );
        }
    }

    // An order of three effects: one line each, named by what it is, never by its key.
    let a = api(&w, MULTI).await;
    let lines: Vec<&str> = a["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{a:#}");
    assert!(
        lines[0].starts_with(&format!(
            "Charge: Charged once (customer {MULTI_CUSTOMER}): {MULTI_CHARGE}, $25.00, "
        )),
        "{lines:?}"
    );
    assert!(
        lines[1].starts_with("Receipt email: Sent once: ") && lines[1].contains(MULTI_RECEIPT),
        "{lines:?}"
    );
    assert!(
        lines[2].starts_with("Refund: Nobody knows: ") && lines[2].contains("refunds"),
        "{lines:?}"
    );
    assert_eq!(a["sentence"], lines.join("\n"));
    let labels: Vec<&str> = a["effects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["Charge", "Receipt email", "Refund"]);
    assert_eq!(a["effects"][0]["customer"], MULTI_CUSTOMER);
    let html = page(&w, &cookie, MULTI).await;
    let block = html
        .split("<ul class=\"verdict lines\" id=\"verdict\">")
        .nth(1)
        .and_then(|b| b.split("</ul>").next())
        .unwrap_or_else(|| panic!("no lines on the page: {html}"));
    assert_eq!(block.matches("<li>").count(), 3, "{block}");
    for l in &lines {
        assert!(text(block).contains(l), "{l:?} not in {block}");
    }
    assert!(
        html.contains("<span class=\"label\">Receipt email</span>"),
        "{html}"
    );
    w.finish().await;
}

#[tokio::test]
async fn words_to_read_to_a_customer_on_sqlite() {
    words_to_read_to_a_customer(Backend::Sqlite).await;
}

#[tokio::test]
async fn words_to_read_to_a_customer_on_postgres() {
    words_to_read_to_a_customer(Backend::Postgres).await;
}

/// Search by the ids the application recorded in its own row (its stored result), written
/// when the row was first seen or when a later scan brought its result; and near misses
/// other than case offered from the tenant's own keys, never another tenant's.
async fn recorded_ids_and_near_misses(backend: Backend) {
    let w = World::new(backend).await;
    plant(w.ledger.clone(), &w.a).await;

    // The receipt email's message id, and the id the missing order's row names.
    let a = api(&w, MULTI_RECEIPT).await;
    assert_eq!(a["found"], true, "{a:#}");
    assert_eq!(a["matched_by"], "recorded_id", "{a:#}");
    assert_eq!(a["effects"].as_array().unwrap().len(), 1, "{a:#}");
    assert_eq!(a["effects"][0]["key"], format!("send_receipt:v1:{MULTI}"));
    let a = api(&w, "ch_never_seen").await;
    assert_eq!(
        a["effects"][0]["key"],
        format!("charge:v1:{MISSING}"),
        "{a:#}"
    );
    assert_eq!(a["effects"][0]["verdict"], "missing");
    // A result that came with a later scan: the claim first seen unknown, then completed.
    ingest_one(
        &w,
        &w.a,
        "till",
        record("charge:v1:ORD-T1", State::Unknown, None),
    )
    .await;
    assert_eq!(api(&w, "pi_late_T1").await["found"], false);
    ingest_one(
        &w,
        &w.a,
        "till",
        record(
            "charge:v1:ORD-T1",
            State::Succeeded,
            Some(r#"{"id": "pi_late_T1", "latest_charge": "ch_late_T1", "status": "succeeded"}"#),
        ),
    )
    .await;
    for q in ["pi_late_T1", "ch_late_T1"] {
        let a = api(&w, q).await;
        assert_eq!(a["effects"][0]["key"], "charge:v1:ORD-T1", "{q}: {a:#}");
        assert_eq!(a["matched_by"], "recorded_id", "{q}");
    }
    // Another tenant never finds them.
    let b = api_as(&w, &w.token_b, MULTI_RECEIPT).await;
    assert_eq!(b["found"], false, "{b:#}");

    // Near misses: a letter O for a zero, one digit too many, a bare number.
    for q in ["ORD-1O17", "ord-1o17", "ORD-10170", "1017", "#1017"] {
        let a = api(&w, q).await;
        assert_eq!(a["found"], false, "{q}: a near match is not an answer");
        assert_eq!(a["did_you_mean"][0], MULTI, "{q}: {a:#}");
        assert!(
            a["sentence"]
                .as_str()
                .unwrap()
                .contains(&format!("Did you mean “{MULTI}”")),
            "{q}: {a:#}"
        );
    }
    let (cookie, _) = session(&w.app, "alice@acme.test").await;
    let html = page(&w, &cookie, "1017").await;
    assert!(
        html.contains(&format!("/t/acme/lookup?q={MULTI}\"")),
        "{html}"
    );

    // Another tenant's order is never offered: globex has ORD-7007, acme has not.
    ingest_one(
        &w,
        &w.b,
        "shop",
        record("charge:v1:ORD-7007", State::Succeeded, None),
    )
    .await;
    for q in ["ORD-7O07", "ORD-70070", "7007"] {
        let a = api(&w, q).await;
        assert_eq!(a["did_you_mean"], serde_json::json!([]), "{q}: {a:#}");
        assert!(
            !a.to_string().contains("“ORD-7007”") && a["effects"] == serde_json::json!([]),
            "{q}: another tenant's order offered: {a:#}"
        );
        let b = api_as(&w, &w.token_b, q).await;
        assert_eq!(b["did_you_mean"][0], "ORD-7007", "{q}: globex's own: {b:#}");
    }
    w.finish().await;
}

#[tokio::test]
async fn recorded_ids_and_near_misses_on_sqlite() {
    recorded_ids_and_near_misses(Backend::Sqlite).await;
}

#[tokio::test]
async fn recorded_ids_and_near_misses_on_postgres() {
    recorded_ids_and_near_misses(Backend::Postgres).await;
}
