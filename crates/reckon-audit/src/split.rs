//! Split intents: one operation on one subject claimed under more than one key.
//!
//! justonce dedupes by key, so each key is its own claim and the side effect may have run
//! once per key. The key-design mistakes that cause it put something per-attempt into the
//! key: a version bump (`charge:v1:ORD-1` then `charge:v2:ORD-1`), a timestamp
//! (`charge:v1:ORD-1:1732871000`) or a per-attempt UUID. The intent's subject is the
//! key's subject with such per-attempt parts removed.

use crate::{
    AuditEffect, DayWindow, Finding, FindingKind, MatchRules, ProviderCharge, charge_ref,
    effect_ref,
};
use std::collections::{BTreeMap, BTreeSet};

/// The subject of the intent behind a key's subject: its `:`-separated parts without the
/// ones that look per-attempt (a UUID, a Unix timestamp in seconds or milliseconds, a long
/// hex nonce). `None` when nothing stable is left.
pub fn intent_subject(subject: &str) -> Option<String> {
    let kept: Vec<&str> = subject.split(':').filter(|p| !per_attempt(p)).collect();
    if kept.is_empty() {
        None
    } else {
        Some(kept.join(":"))
    }
}

fn per_attempt(part: &str) -> bool {
    let digits = part.bytes().all(|b| b.is_ascii_digit());
    // 2001-09-09 in seconds has 10 digits; milliseconds 13. Order numbers that long are
    // possible but rare, and then every order would be its own intent anyway.
    if digits && (part.len() == 10 || part.len() == 13) {
        return true;
    }
    let hex = |s: &str| s.bytes().all(|b| b.is_ascii_hexdigit());
    // 8-4-4-4-12 UUID.
    let groups: Vec<&str> = part.split('-').collect();
    if groups.len() == 5
        && groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups.iter().all(|g| hex(g))
    {
        return true;
    }
    part.len() >= 16 && hex(part) && part.bytes().any(|b| b.is_ascii_digit())
}

pub(crate) fn split_intents(
    window: &DayWindow,
    effects: &[AuditEffect],
    charges: &[ProviderCharge],
    by_effect: &crate::Ties,
    rules: &MatchRules,
) -> Vec<Finding> {
    let mut groups: BTreeMap<(&str, String), Vec<usize>> = BTreeMap::new();
    for (i, e) in effects.iter().enumerate() {
        if !window.contains(e.created_at) {
            continue;
        }
        let Some(subject) = e.subject.as_deref().and_then(intent_subject) else {
            continue;
        };
        groups
            .entry((e.operation.as_str(), subject))
            .or_default()
            .push(i);
    }
    let mut out = Vec::new();
    for ((operation, subject), members) in groups {
        let keys: BTreeSet<&str> = members.iter().map(|&i| effects[i].key.as_str()).collect();
        if keys.len() < 2 {
            continue;
        }
        // The provider's charges for the subject: tied to one of the keys, or naming the
        // subject as their order.
        let mut cs: BTreeSet<usize> = members
            .iter()
            .flat_map(|i| by_effect.get(i).into_iter().flatten().copied())
            .collect();
        for (c, ch) in charges.iter().enumerate() {
            if rules
                .order_fields
                .iter()
                .any(|f| ch.metadata.get(f).is_some_and(|o| *o == subject))
            {
                cs.insert(c);
            }
        }
        let ok = cs.iter().filter(|&&c| charges[c].status.is_paid()).count();
        out.push(Finding {
            kind: FindingKind::SplitIntent,
            summary: format!(
                "{operation} of {subject} was claimed under {} keys ({}); the provider shows {ok} successful charge{}",
                keys.len(),
                keys.iter().copied().collect::<Vec<_>>().join(", "),
                if ok == 1 { "" } else { "s" }
            ),
            effects: members.iter().map(|&i| effect_ref(&effects[i])).collect(),
            charges: cs.iter().map(|&c| charge_ref(&charges[c])).collect(),
            amount: None,
            currency: None,
            refunded: false,
            suggestions: vec![],
            customer: None,
            order: None,
            action: String::new(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::intent_subject;

    #[test]
    fn per_attempt_parts_are_dropped_from_the_intent_subject() {
        assert_eq!(intent_subject("ORD-1").as_deref(), Some("ORD-1"));
        assert_eq!(intent_subject("ORD-1:1732871000").as_deref(), Some("ORD-1"));
        assert_eq!(
            intent_subject("ORD-1:1732871000123").as_deref(),
            Some("ORD-1")
        );
        assert_eq!(
            intent_subject("ORD-1:3f2b8c1e-9a4d-4c1b-8e7f-0a1b2c3d4e5f").as_deref(),
            Some("ORD-1")
        );
        assert_eq!(
            intent_subject("cus_9:ORD-17").as_deref(),
            Some("cus_9:ORD-17"),
            "customer and order both stay: two orders of one customer are two intents"
        );
        assert_eq!(intent_subject("1732871000"), None);
        assert_eq!(intent_subject("ORD-12345").as_deref(), Some("ORD-12345"));
    }
}
