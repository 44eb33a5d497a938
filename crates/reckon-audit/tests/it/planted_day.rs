//! A generated day with known planted problems: the audit must find exactly the planted
//! ones, nothing spurious, and totals exact to the cent, with the day cut in a non-UTC
//! time zone (charges just before and after both midnights).

use reckon_audit::{
    AuditEffect, DayWindow, FindingKind, MatchRules, ProviderCharge, Refund, Releaser, audit,
};
use reckon_domain::{ChargeStatus, Outcome, State, UnresolvedKind};
use serde_json::json;
use std::collections::BTreeSet;

const TZ: &str = "America/New_York";
const DAY: &str = "2026-11-28";

struct Day {
    window: DayWindow,
    effects: Vec<AuditEffect>,
    charges: Vec<ProviderCharge>,
    next: u32,
}

impl Day {
    fn new() -> Day {
        Day {
            window: DayWindow::new(DAY, TZ).unwrap(),
            effects: vec![],
            charges: vec![],
            next: 0,
        }
    }

    fn effect(&mut self, key: &str, state: State, at: f64) -> &mut AuditEffect {
        let mut parts = key.splitn(3, ':');
        let operation = parts.next().unwrap().to_owned();
        let _version = parts.next();
        let subject = parts.next().map(str::to_owned);
        let unresolved = match state {
            State::Unknown => Some(UnresolvedKind::Unknown),
            _ => None,
        };
        self.effects.push(AuditEffect {
            source: "shop".into(),
            key: key.into(),
            operation,
            subject,
            state,
            unresolved,
            attempts: 1,
            created_at: at,
            response: None,
            provider_keys: vec![key.into()],
            released: None,
            verdict: None,
        });
        self.effects.last_mut().unwrap()
    }

    fn charge(&mut self, amount: i64, currency: &str, at: f64) -> &mut ProviderCharge {
        self.next += 1;
        self.charges.push(ProviderCharge {
            id: format!("ch_{:04}", self.next),
            payment: Some(format!("pi_{:04}", self.next)),
            amount,
            currency: currency.into(),
            status: ChargeStatus::Paid,
            amount_captured: amount,
            amount_refunded: 0,
            refunds: vec![],
            metadata: Default::default(),
            idempotency_key: None,
            customer: Some(format!("cus_{}", self.next % 17)),
            created: at,
        });
        self.charges.last_mut().unwrap()
    }

    /// An effect charged once, matched by the key in the charge's metadata.
    fn clean(&mut self, key: &str, amount: i64, currency: &str, at: f64) {
        self.effect(key, State::Succeeded, at);
        self.charge(amount, currency, at + 1.5)
            .metadata
            .insert("idempotency_key".into(), key.into());
    }
}

fn keyed(c: &mut ProviderCharge, key: &str) {
    c.metadata.insert("idempotency_key".into(), key.into());
}

fn planted_day() -> Day {
    let mut d = Day::new();
    let (start, end) = (d.window.start, d.window.end);
    assert_eq!(end - start, 86_400.0, "no DST change on this day");
    assert_eq!(
        start, 1_795_842_000.0,
        "midnight in New York is 05:00 UTC in November"
    );

    // 300 ordinary charges across the day, two currencies, three ways of matching.
    for i in 0..300 {
        let at = start + 60.0 + i as f64 * 280.0;
        let cur = if i % 3 == 0 { "eur" } else { "usd" };
        let key = format!("charge:v1:ORD-{i}");
        match i % 3 {
            0 => d.clean(&key, 1000 + i, cur, at),
            1 => {
                // Matched by the id the application recorded in its response.
                let id = format!("ch_{:04}", d.next + 1);
                d.effect(&key, State::Succeeded, at).response = Some(json!({"charge": id}));
                d.charge(2000 + i, cur, at + 2.0);
            }
            _ => {
                // Matched by the originating request's idempotency key (events).
                d.effect(&key, State::Succeeded, at);
                d.charge(500 + i, cur, at + 0.5).idempotency_key = Some(key.clone());
            }
        }
    }
    // Receipts: effects of another operation that never touch the provider... but they
    // are `succeeded`. The caller filters effects to the provider's operations; here the
    // audit gets only charge effects.

    // Duplicates (3): two charges for one key; one pair refunded as duplicate; one pair
    // tied only by the order reference in metadata.
    let at = start + 3600.0 * 5.0;
    d.effect("charge:v1:DUP-1", State::Succeeded, at);
    keyed(d.charge(4200, "usd", at + 1.0), "charge:v1:DUP-1");
    keyed(d.charge(4200, "usd", at + 40.0), "charge:v1:DUP-1");

    d.effect("charge:v1:DUP-2", State::Succeeded, at + 100.0);
    keyed(d.charge(990, "eur", at + 101.0), "charge:v1:DUP-2");
    let c = d.charge(990, "eur", at + 130.0);
    keyed(c, "charge:v1:DUP-2");
    c.amount_refunded = 990;
    c.refunds = vec![Refund {
        id: "re_1".into(),
        amount: 990,
        reason: Some("duplicate".into()),
    }];

    d.effect("charge:v1:DUP-3", State::Succeeded, at + 200.0);
    let c = d.charge(1500, "usd", at + 201.0);
    keyed(c, "charge:v1:DUP-3");
    c.metadata.insert("order_id".into(), "DUP-3".into());
    // A second system charged the same order without the key.
    d.charge(1500, "usd", at + 900.0)
        .metadata
        .insert("order_id".into(), "DUP-3".into());

    // Orphans (2), plus a failed one that moved no money (not a finding).
    d.charge(777, "usd", start + 7200.0);
    d.charge(31400, "eur", start + 7300.0);
    d.charge(100, "usd", start + 7400.0).status = ChargeStatus::Failed;

    // Missing (2): recorded succeeded, nothing at the provider.
    d.effect("charge:v1:MISS-1", State::Succeeded, start + 9000.0);
    d.effect("charge:v1:MISS-2", State::Succeeded, start + 9100.0)
        .response = Some(json!({"charge": "ch_9999"}));

    // Unresolved (3): two unknown, one abandoned claim.
    d.effect("charge:v1:UNK-1", State::Unknown, start + 10_000.0);
    d.effect("charge:v1:UNK-2", State::Unknown, start + 10_100.0);
    d.effect("charge:v1:ABN-1", State::InProgress, start + 10_200.0)
        .unresolved = Some(UnresolvedKind::Abandoned);

    // Risky reclaim (1): attempted twice, charged once.
    d.effect("charge:v1:RCL-1", State::Succeeded, start + 11_000.0)
        .attempts = 2;
    keyed(d.charge(2500, "usd", start + 11_001.0), "charge:v1:RCL-1");

    // Split intents (2): a version bump, and a timestamp in the key; each key charged.
    d.effect("charge:v1:SPL-1", State::Succeeded, start + 12_000.0);
    keyed(d.charge(6000, "usd", start + 12_001.0), "charge:v1:SPL-1");
    d.effect("charge:v2:SPL-1", State::Succeeded, start + 12_500.0);
    keyed(d.charge(6000, "usd", start + 12_501.0), "charge:v2:SPL-1");
    d.effect(
        "charge:v1:SPL-2:1795860000",
        State::Succeeded,
        start + 13_000.0,
    );
    keyed(
        d.charge(800, "eur", start + 13_001.0),
        "charge:v1:SPL-2:1795860000",
    );
    d.effect(
        "charge:v1:SPL-2:1795860600",
        State::Succeeded,
        start + 13_600.0,
    );
    keyed(
        d.charge(800, "eur", start + 13_601.0),
        "charge:v1:SPL-2:1795860600",
    );

    // Midnight edges. Claimed 10 s before the day ends, charged 5 s after: matched, in
    // this day's effects, the charge belongs to tomorrow (not in today's totals).
    d.effect("charge:v1:EDGE-1", State::Succeeded, end - 10.0);
    keyed(d.charge(1200, "usd", end + 5.0), "charge:v1:EDGE-1");
    // Claimed 1 s before the day began, charged 1 s into it: the charge is today's and
    // matched (no orphan), the effect is yesterday's.
    d.effect("charge:v1:EDGE-2", State::Succeeded, start - 1.0);
    keyed(d.charge(1300, "usd", start + 1.0), "charge:v1:EDGE-2");
    // Orphans outside the day: not today's findings.
    d.charge(4400, "usd", start - 2.0);
    d.charge(4500, "usd", end);
    // Unresolved yesterday: not today's.
    d.effect("charge:v1:UNK-OLD", State::Unknown, start - 30.0);
    d
}

fn keys_of(report: &reckon_audit::AuditReport, kind: FindingKind) -> BTreeSet<String> {
    report
        .findings
        .iter()
        .filter(|f| f.kind == kind)
        .map(|f| {
            let mut ks: Vec<String> = f.effects.iter().map(|e| e.key.clone()).collect();
            if ks.is_empty() {
                ks = f.charges.iter().map(|c| c.id.clone()).collect();
            }
            ks.sort();
            ks.join("+")
        })
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(std::string::ToString::to_string).collect()
}

#[test]
fn the_audit_finds_exactly_the_planted_problems_of_the_day() {
    let d = planted_day();
    let r = audit(&d.window, &d.effects, &d.charges, &MatchRules::default());

    assert_eq!(
        keys_of(&r, FindingKind::Duplicate),
        set(&["charge:v1:DUP-1", "charge:v1:DUP-2", "charge:v1:DUP-3"])
    );
    let orphan_ids: BTreeSet<String> = r
        .findings
        .iter()
        .filter(|f| f.kind == FindingKind::Orphan)
        .map(|f| f.charges[0].id.clone())
        .collect();
    let planted_orphans: BTreeSet<String> = d
        .charges
        .iter()
        .filter(|c| c.amount == 777 || c.amount == 31400)
        .map(|c| c.id.clone())
        .collect();
    assert_eq!(orphan_ids, planted_orphans);
    assert_eq!(
        keys_of(&r, FindingKind::Missing),
        set(&["charge:v1:MISS-1", "charge:v1:MISS-2"])
    );
    assert_eq!(
        keys_of(&r, FindingKind::Unresolved),
        set(&["charge:v1:ABN-1", "charge:v1:UNK-1", "charge:v1:UNK-2"])
    );
    assert_eq!(
        keys_of(&r, FindingKind::RiskyReclaim),
        set(&["charge:v1:RCL-1"])
    );
    assert_eq!(
        keys_of(&r, FindingKind::SplitIntent),
        set(&[
            "charge:v1:SPL-1+charge:v2:SPL-1",
            "charge:v1:SPL-2:1795860000+charge:v1:SPL-2:1795860600"
        ])
    );
    assert_eq!(r.findings.len(), 3 + 2 + 2 + 3 + 1 + 2, "nothing spurious");
}

#[test]
fn a_refunded_duplicate_is_listed_as_refunded_not_hidden_and_the_overcharge_is_exact() {
    let d = planted_day();
    let r = audit(&d.window, &d.effects, &d.charges, &MatchRules::default());
    let dup = |key: &str| {
        r.findings
            .iter()
            .find(|f| f.kind == FindingKind::Duplicate && f.effects.iter().any(|e| e.key == key))
            .unwrap_or_else(|| panic!("duplicate for {key}"))
    };
    let one = dup("charge:v1:DUP-1");
    assert!(!one.refunded);
    assert_eq!(
        (one.amount, one.currency.as_deref()),
        (Some(4200), Some("usd"))
    );
    assert_eq!(one.charges.len(), 2);

    let two = dup("charge:v1:DUP-2");
    assert!(two.refunded, "refunded as duplicate: listed as refunded");
    assert_eq!(two.amount, Some(0));
    assert!(two.summary.contains("refunded"));

    let three = dup("charge:v1:DUP-3");
    assert_eq!(
        three.charges.len(),
        2,
        "the order reference ties the keyless charge in"
    );
    assert_eq!(three.amount, Some(1500));
}

#[test]
fn totals_per_currency_are_exact_to_the_cent_and_only_count_the_days_charges() {
    let d = planted_day();
    let r = audit(&d.window, &d.effects, &d.charges, &MatchRules::default());
    let orphans: BTreeSet<&str> = r
        .findings
        .iter()
        .filter(|f| f.kind == FindingKind::Orphan)
        .map(|f| f.charges[0].id.as_str())
        .collect();
    for cur in ["usd", "eur"] {
        let day: Vec<&ProviderCharge> = d
            .charges
            .iter()
            .filter(|c| c.currency == cur && c.status.is_paid())
            .filter(|c| c.created >= d.window.start && c.created < d.window.end)
            .collect();
        let charged: i64 = day.iter().map(|c| c.amount).sum();
        let refunded: i64 = day.iter().map(|c| c.amount_refunded).sum();
        let unmatched: i64 = day
            .iter()
            .filter(|c| orphans.contains(c.id.as_str()))
            .map(|c| c.amount)
            .sum();
        let t = r.totals.iter().find(|t| t.currency == cur).unwrap();
        assert_eq!(t.charged, charged, "{cur} charged");
        assert_eq!(t.refunded, refunded, "{cur} refunded");
        assert_eq!(t.net, charged - refunded, "{cur} net");
        assert_eq!(
            t.unmatched, unmatched,
            "{cur}: unmatched are exactly the orphans"
        );
        assert_eq!(t.matched + t.unmatched, t.charged);
    }
    // Hand-checked anchors: the EUR orphan and the refunded duplicate.
    let eur = r.totals.iter().find(|t| t.currency == "eur").unwrap();
    assert_eq!(eur.unmatched, 31_400);
    assert_eq!(eur.refunded, 990);
    assert_eq!(r.totals.len(), 2);
}

#[test]
fn the_day_is_cut_in_the_tenants_time_zone_including_dst_days() {
    let ny = DayWindow::new("2026-11-01", "America/New_York").unwrap();
    assert_eq!(ny.end - ny.start, 25.0 * 3600.0, "DST ends: a 25-hour day");
    let spring = DayWindow::new("2026-03-08", "America/New_York").unwrap();
    assert_eq!(spring.end - spring.start, 23.0 * 3600.0);
    let utc = DayWindow::new("2026-11-28", "UTC").unwrap();
    assert_eq!(utc.start, 1_795_824_000.0);
    let tokyo = DayWindow::new("2026-11-28", "Asia/Tokyo").unwrap();
    assert_eq!(tokyo.start, utc.start - 9.0 * 3600.0);
    // Yesterday, seen from 03:00 UTC on the 29th, is still the 27th in New York.
    let y = DayWindow::yesterday(utc.start + 86_400.0 + 3.0 * 3600.0, "America/New_York").unwrap();
    assert_eq!(y.date, "2026-11-27");
    assert!(matches!(
        DayWindow::new("2026-11-28", "Mars/Olympus"),
        Err(reckon_audit::AuditError::TimeZone(_))
    ));
    assert!(DayWindow::new("2026-02-30", "UTC").is_err());
}

#[test]
fn a_weak_match_is_only_ever_a_suggestion() {
    let mut d = Day::new();
    let at = d.window.start + 100.0;
    // The application recorded the charge's customer and amount but no id; the charge has
    // no key: the orphan stays an orphan, with the effect suggested.
    d.effect("charge:v1:W-1", State::Succeeded, at).response =
        Some(json!({"amount": 1234, "currency": "usd", "customer": "cus_w"}));
    d.charge(1234, "usd", at + 3.0).customer = Some("cus_w".into());
    let r = audit(&d.window, &d.effects, &d.charges, &MatchRules::default());
    assert_eq!(r.count(FindingKind::Orphan), 1);
    assert_eq!(
        r.count(FindingKind::Missing),
        1,
        "a suggestion decides nothing"
    );
    let orphan = r
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::Orphan)
        .unwrap();
    assert_eq!(orphan.suggestions.len(), 1);
    assert!(orphan.suggestions[0].why.contains("suggested"));
    assert!(r.matches.is_empty());
}

#[test]
fn a_runs_matches_summary_counts_them_by_method_and_digests_the_list_in_order() {
    use reckon_audit::{Match, MatchMethod, matches_summary};
    use sha2::Digest;
    let d = planted_day();
    let r = audit(&d.window, &d.effects, &d.charges, &MatchRules::default());
    assert!(r.matches.len() > 10, "{}", r.matches.len());
    let s = matches_summary(&r.matches);
    assert_eq!(s["count"], json!(r.matches.len()));
    let idem = r
        .matches
        .iter()
        .filter(|m| m.method == MatchMethod::IdempotencyKey)
        .count();
    assert!(idem > 0);
    assert_eq!(s["by_method"]["idempotency_key"], json!(idem));
    let by_method: u64 = s["by_method"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(by_method as usize, r.matches.len());
    // The digest is of the list as written out by hand here: one JSON array per line.
    let mut text = String::new();
    for m in &r.matches {
        let method = serde_json::to_value(m.method).unwrap();
        text.push_str(&json!([m.charge, m.source, m.key, method]).to_string());
        text.push('\n');
    }
    assert_eq!(
        s["sha256"],
        json!(hex::encode(sha2::Sha256::digest(text.as_bytes())))
    );

    // Another order, or a match whose key holds what would separate two fields, is another
    // list and another digest.
    let m = |charge: &str, key: &str| Match {
        charge: charge.into(),
        source: "shop".into(),
        key: key.into(),
        method: MatchMethod::IdempotencyKey,
    };
    let (a, b) = (m("ch_1", "k1"), m("ch_2", "k2"));
    let digest = |ms: &[Match]| matches_summary(ms)["sha256"].clone();
    assert_ne!(digest(&[a.clone(), b.clone()]), digest(&[b, a]));
    assert_ne!(
        digest(&[m("ch_1", "k\",\"x")]),
        digest(&[m("ch_1\",\"k", "x")])
    );
    assert_eq!(matches_summary(&[])["count"], 0);
}

#[test]
fn money_taken_for_an_effect_recorded_failed_is_its_own_finding_never_an_orphan() {
    let mut d = Day::new();
    let at = d.window.start + 100.0;
    // Paid at the provider, cancelled in the application.
    d.effect("charge:v1:CNR-1", State::Failed, at);
    keyed(d.charge(2500, "usd", at + 1.0), "charge:v1:CNR-1");
    // The same, already given back in full.
    d.effect("charge:v1:CNR-2", State::Failed, at + 100.0);
    let c = d.charge(990, "eur", at + 101.0);
    keyed(c, "charge:v1:CNR-2");
    c.amount_refunded = 990;
    // Recorded failed, and the card was declined: nothing to say.
    d.effect("charge:v1:CNR-3", State::Failed, at + 200.0);
    let c = d.charge(700, "usd", at + 201.0);
    keyed(c, "charge:v1:CNR-3");
    c.status = ChargeStatus::Failed;
    c.amount_captured = 0;
    // Recorded failed, never reached the provider.
    d.effect("charge:v1:CNR-4", State::Failed, at + 300.0);
    // A claim the application released (deleted) after a transient failure: it holds the
    // charge not made, and a retry may charge again.
    d.effect("charge:v1:CNR-5", State::InProgress, at + 400.0)
        .released = Some(Releaser::Application);
    keyed(d.charge(1200, "usd", at + 401.0), "charge:v1:CNR-5");
    // An `unknown` row reckon deleted, writing back a "not charged" verdict the charge now
    // contradicts: the application may have charged again.
    // (Resolved by reckon, so not unresolved, whatever the row said.)
    let e = d.effect("charge:v1:CNR-6", State::Unknown, at + 500.0);
    e.released = Some(Releaser::Reckon);
    e.unresolved = None;
    keyed(d.charge(4200, "usd", at + 501.0), "charge:v1:CNR-6");
    let r = audit(&d.window, &d.effects, &d.charges, &MatchRules::default());
    assert_eq!(
        keys_of(&r, FindingKind::ChargedNotRecorded),
        set(&[
            "charge:v1:CNR-1",
            "charge:v1:CNR-2",
            "charge:v1:CNR-5",
            "charge:v1:CNR-6"
        ])
    );
    assert_eq!(r.count(FindingKind::Orphan), 0, "{:#?}", r.findings);
    assert_eq!(r.findings.len(), 4, "nothing else: {:#?}", r.findings);
    let by_reckon = r
        .findings
        .iter()
        .find(|f| f.effects[0].key == "charge:v1:CNR-6")
        .unwrap();
    assert!(
        by_reckon
            .summary
            .contains("released by reckon's write-back")
            && by_reckon.summary.contains("42.00 USD"),
        "{}",
        by_reckon.summary
    );
    let released = r
        .findings
        .iter()
        .find(|f| f.effects[0].key == "charge:v1:CNR-5")
        .unwrap();
    assert!(
        released.summary.contains("released by the application"),
        "{}",
        released.summary
    );
    let f = |key: &str| r.findings.iter().find(|f| f.effects[0].key == key).unwrap();
    let one = f("charge:v1:CNR-1");
    assert_eq!(
        (one.amount, one.currency.as_deref(), one.refunded),
        (Some(2500), Some("usd"), false)
    );
    assert!(one.summary.contains("recorded failed"), "{}", one.summary);
    assert!(one.summary.contains("ch_0001 25.00 USD"), "{}", one.summary);
    let two = f("charge:v1:CNR-2");
    assert_eq!((two.amount, two.refunded), (Some(0), true));
    assert_eq!(
        FindingKind::ChargedNotRecorded.as_str(),
        "charged_not_recorded"
    );
}

#[test]
fn a_duplicate_says_what_was_charged_refunded_and_is_still_charged_twice() {
    let mut d = Day::new();
    let at = d.window.start + 100.0;
    // The extra charge refunded in full, but not marked as a duplicate.
    d.effect("charge:v1:RF-1", State::Succeeded, at);
    keyed(d.charge(2000, "usd", at + 1.0), "charge:v1:RF-1");
    let c = d.charge(2000, "usd", at + 30.0);
    keyed(c, "charge:v1:RF-1");
    c.amount_refunded = 2000;
    // The extra charge partly refunded.
    d.effect("charge:v1:RF-2", State::Succeeded, at + 100.0);
    keyed(d.charge(3000, "usd", at + 101.0), "charge:v1:RF-2");
    let c = d.charge(3000, "usd", at + 130.0);
    keyed(c, "charge:v1:RF-2");
    c.amount_refunded = 1000;
    let r = audit(&d.window, &d.effects, &d.charges, &MatchRules::default());
    let dup = |key: &str| {
        r.findings
            .iter()
            .find(|f| f.kind == FindingKind::Duplicate && f.effects.iter().any(|e| e.key == key))
            .unwrap_or_else(|| panic!("duplicate for {key}"))
    };
    let one = dup("charge:v1:RF-1");
    assert_eq!(one.amount, Some(0));
    assert!(
        one.summary.contains("refunded in full") && one.summary.contains("nothing is still"),
        "{}",
        one.summary
    );
    assert!(
        !one.summary.contains("0.00 USD charged twice"),
        "{}",
        one.summary
    );
    let two = dup("charge:v1:RF-2");
    assert_eq!(two.amount, Some(2000));
    assert!(
        two.summary.contains("30.00 USD charged beyond the first")
            && two.summary.contains("10.00 USD of it refunded")
            && two.summary.contains("20.00 USD still charged twice"),
        "{}",
        two.summary
    );
}

#[test]
fn each_finding_names_whom_and_what_to_do_and_what_is_at_stake_only_when_something_is() {
    let mut d = Day::new();
    let at = d.window.start + 100.0;
    // Charged twice while the shop's row says unknown; reckon's verdict is `duplicate`.
    let e = d.effect("charge:v1:ORD-54", State::Unknown, at);
    e.verdict = Some(Outcome::Duplicate);
    e.unresolved = None;
    keyed(d.charge(5400, "usd", at + 1.0), "charge:v1:ORD-54");
    keyed(d.charge(5400, "usd", at + 20.0), "charge:v1:ORD-54");
    // Charged twice, the extra refunded as duplicate since.
    d.effect("charge:v1:ORD-55", State::Succeeded, at + 100.0);
    keyed(d.charge(3000, "usd", at + 101.0), "charge:v1:ORD-55");
    let c = d.charge(3000, "usd", at + 130.0);
    keyed(c, "charge:v1:ORD-55");
    c.amount_refunded = 3000;
    c.refunds = vec![Refund {
        id: "re_1".into(),
        amount: 3000,
        reason: Some("duplicate".into()),
    }];
    // Charged twice by a provider that names no customer.
    d.effect("charge:v1:ORD-56", State::Succeeded, at + 200.0);
    for t in [201.0, 230.0] {
        let c = d.charge(1250, "usd", at + t);
        keyed(c, "charge:v1:ORD-56");
        c.customer = None;
    }
    // Claimed twice, charged once.
    d.effect("charge:v1:ORD-57", State::Succeeded, at + 300.0)
        .attempts = 2;
    keyed(d.charge(14_400, "usd", at + 301.0), "charge:v1:ORD-57");
    // Nobody knows yet.
    d.effect("charge:v1:ORD-58", State::Unknown, at + 400.0);
    let r = audit(&d.window, &d.effects, &d.charges, &MatchRules::default());
    let find = |kind: FindingKind, key: &str| {
        r.findings
            .iter()
            .find(|f| f.kind == kind && f.effects.iter().any(|e| e.key == key))
            .unwrap_or_else(|| panic!("{kind:?} for {key}: {:#?}", r.findings))
    };

    let dup = find(FindingKind::Duplicate, "charge:v1:ORD-54");
    assert_eq!(dup.customer.as_deref(), Some("cus_1"));
    assert_eq!(dup.order.as_deref(), Some("ORD-54"));
    assert_eq!(
        dup.action,
        "Refund ch_0002 (54.00 USD) to cus_1 (order ORD-54); keep ch_0001 (54.00 USD), the \
         payment the customer meant to make."
    );
    assert_eq!(dup.effects[0].verdict, Some(Outcome::Duplicate));
    assert_eq!(
        dup.at_stake_words().as_deref(),
        Some("charged twice: 54.00 USD extra")
    );

    let refunded = find(FindingKind::Duplicate, "charge:v1:ORD-55");
    assert!(
        refunded
            .action
            .starts_with("Nothing to refund: the extra charge ch_0004"),
        "{}",
        refunded.action
    );
    assert!(!refunded.action.contains("Refund "), "{}", refunded.action);
    assert_eq!(refunded.at_stake(), None);

    let nobody = find(FindingKind::Duplicate, "charge:v1:ORD-56");
    assert_eq!(nobody.customer, None);
    assert!(
        nobody
            .action
            .starts_with("Refund ch_0006 (12.50 USD) to the customer of order ORD-56;"),
        "{}",
        nobody.action
    );

    let reclaim = find(FindingKind::RiskyReclaim, "charge:v1:ORD-57");
    assert_eq!(reclaim.at_stake(), None, "charged once: nothing at stake");
    assert_eq!(reclaim.at_stake_words(), None);
    assert!(
        reclaim.action.starts_with("Nothing to do:"),
        "{}",
        reclaim.action
    );

    let unknown = find(FindingKind::Unresolved, "charge:v1:ORD-58");
    assert_eq!(unknown.at_stake(), None);
    assert!(
        unknown
            .action
            .starts_with("Check order ORD-58 in the shop before telling the customer"),
        "{}",
        unknown.action
    );
    for f in &r.findings {
        assert!(!f.action.is_empty(), "{f:#?}");
    }
}

#[test]
fn a_finding_stored_before_findings_said_what_to_do_still_reads_and_is_advised() {
    // As a run stored it: no customer, order, action or verdict.
    let stored = json!({
        "kind": "risky_reclaim",
        "summary": "charge:v1:ORD-8 was attempted 2 times; the provider shows 1 successful charge",
        "effects": [{"source": "shop", "key": "charge:v1:ORD-8", "operation": "charge",
                     "subject": "ORD-8", "state": "succeeded", "attempts": 2,
                     "created_at": 1.0}],
        "charges": [{"id": "ch_once", "amount": 14400, "currency": "usd",
                     "status": "succeeded", "amount_refunded": 0, "customer": "cus_8",
                     "created": 2.0}],
        "amount": 14400, "currency": "usd", "refunded": false
    });
    let f: reckon_audit::Finding = serde_json::from_value(stored).unwrap();
    assert_eq!(f.action, "");
    assert_eq!(f.effects[0].verdict, None);
    assert_eq!(f.at_stake(), None, "charged once: nothing at stake");
    assert_eq!(f.customer_named().as_deref(), Some("cus_8"));
    assert_eq!(
        f.action_words(),
        "Nothing to do: order ORD-8 was tried 2 times but charged once, ch_once (144.00 USD)."
    );
}
