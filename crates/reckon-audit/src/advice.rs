//! What finance does about a finding, in its own words: who the money concerns, what is at
//! stake, and the one thing to do with which charge.
//!
//! Everything here reads a finding as stored (its effects and charges), so a run stored
//! before a finding carried its action is advised the same way when it is shown; a run
//! stores what it advised at the time (`Finding::action`), and that is what is shown when
//! it is there.

use crate::{ChargeRef, Finding, FindingKind, MatchRules, money};
use reckon_domain::Outcome;
use reckon_domain::key::OperationKey;

impl Finding {
    /// Who the money concerns as the provider names them (`cus_…`): the first of the
    /// finding's charges that names a customer.
    pub fn customer_of(&self) -> Option<String> {
        self.charges
            .iter()
            .filter_map(|c| c.customer.as_deref())
            .find(|c| !c.trim().is_empty())
            .map(str::to_owned)
    }

    /// The order the finding is about, as the application names it: its effect's subject,
    /// else the order the provider's charge names (its metadata, else the subject of the
    /// idempotency key it was made with).
    pub fn order_of(&self, rules: &MatchRules) -> Option<String> {
        if let Some(s) = self.effects.iter().find_map(|e| e.subject.clone()) {
            return Some(s);
        }
        self.charges.iter().find_map(|c| {
            rules
                .order_fields
                .iter()
                .find_map(|f| c.metadata.get(f).cloned())
                .or_else(|| {
                    c.idempotency_key
                        .as_deref()
                        .and_then(OperationKey::parse)
                        .map(|k| k.subject)
                })
        })
    }

    /// The customer as stored, else as its charges name them.
    pub fn customer_named(&self) -> Option<String> {
        self.customer.clone().or_else(|| self.customer_of())
    }

    /// The order as stored, else as its effects and charges name it.
    pub fn order_named(&self) -> Option<String> {
        self.order
            .clone()
            .or_else(|| self.order_of(&MatchRules::default()))
    }

    /// Whom a refund goes to, in words: `cus_9 (order ORD-7)`, `the customer of order
    /// ORD-7`, or `the customer`.
    pub fn whom(&self) -> String {
        match (self.customer_named(), self.order_named()) {
            (Some(c), Some(o)) => format!("{c} (order {o})"),
            (Some(c), None) => c,
            (None, Some(o)) => format!("the customer of order {o}"),
            (None, None) => "the customer".into(),
        }
    }

    /// The money still at stake, in minor units with its currency; `None` when nothing is
    /// (a reclaim that charged once, a duplicate refunded since, an unresolved effect whose
    /// amount nobody knows).
    pub fn at_stake(&self) -> Option<(i64, String)> {
        let currency = || {
            self.currency
                .clone()
                .or_else(|| self.charges.first().map(|c| c.currency.clone()))
                .unwrap_or_default()
                .to_ascii_lowercase()
        };
        let amount = match self.kind {
            FindingKind::Duplicate | FindingKind::ChargedNotRecorded | FindingKind::Missing => {
                self.amount.filter(|_| !self.refunded)
            }
            FindingKind::RiskyReclaim | FindingKind::SplitIntent => {
                Some(extra(&self.charges).iter().map(|(_, left)| left).sum())
            }
            FindingKind::Orphan => self
                .charges
                .iter()
                .find(|c| c.status != reckon_domain::ChargeStatus::Failed.as_str())
                .map(|c| c.amount - c.amount_refunded.min(c.amount)),
            FindingKind::Unresolved | FindingKind::Other => None,
        };
        amount.filter(|a| *a > 0).map(|a| (a, currency()))
    }

    /// What is at stake, in words (`charged twice: 54.00 USD extra`), when anything is.
    pub fn at_stake_words(&self) -> Option<String> {
        self.at_stake()
            .map(|(a, cur)| stake_words(self.kind, &money(a, &cur)))
    }

    /// What to do, as stored with the run, else as advised now.
    pub fn action_words(&self) -> String {
        if self.action.trim().is_empty() {
            advice(self)
        } else {
            self.action.clone()
        }
    }
}

/// What is at stake for a finding of `kind`, given the money in words.
pub fn stake_words(kind: FindingKind, amount: &str) -> String {
    match kind {
        FindingKind::Duplicate | FindingKind::RiskyReclaim | FindingKind::SplitIntent => {
            format!("charged twice: {amount} extra")
        }
        FindingKind::Orphan => format!("charged, no order: {amount}"),
        FindingKind::Missing => format!("recorded as paid, not charged: {amount}"),
        FindingKind::ChargedNotRecorded => format!("charged, not recorded: {amount}"),
        FindingKind::Unresolved | FindingKind::Other => amount.to_owned(),
    }
}

/// reckon's verdict on an effect in finance's words.
pub fn verdict_words(o: Outcome) -> &'static str {
    match o {
        Outcome::Applied => "charged once",
        Outcome::NotApplied => "not charged",
        Outcome::Duplicate => "charged twice",
        Outcome::Indeterminate => "not known yet",
    }
}

/// `demo_ch_3 (54.00 USD)`.
fn charge_words(c: &ChargeRef, minor: i64) -> String {
    format!("{} ({})", c.id, money(minor, &c.currency))
}

fn list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// The charges that moved money, oldest first, without those refunded as duplicate: the
/// first is the payment the customer meant to make.
fn standing(charges: &[ChargeRef]) -> Vec<&ChargeRef> {
    let mut ok: Vec<&ChargeRef> = charges
        .iter()
        .filter(|c| c.paid() && !c.refunded_as_duplicate)
        .collect();
    ok.sort_by(|a, b| a.created.total_cmp(&b.created).then(a.id.cmp(&b.id)));
    ok
}

/// Each charge beyond the first that moved money, with what of it is not refunded yet.
fn extra(charges: &[ChargeRef]) -> Vec<(&ChargeRef, i64)> {
    standing(charges)
        .into_iter()
        .skip(1)
        .map(|c| (c, c.amount - c.amount_refunded.min(c.amount)))
        .collect()
}

fn the_order(f: &Finding) -> String {
    f.order_named()
        .map_or_else(|| "the order".into(), |o| format!("order {o}"))
}

/// The one thing finance does about `f`, with the charge ids and amounts, in plain words.
pub fn advice(f: &Finding) -> String {
    let whom = f.whom();
    let order = the_order(f);
    match f.kind {
        FindingKind::Duplicate | FindingKind::SplitIntent | FindingKind::RiskyReclaim => {
            let ok = standing(&f.charges);
            let extra = extra(&f.charges);
            let to_refund: Vec<String> = extra
                .iter()
                .filter(|(_, left)| *left > 0)
                .map(|(c, left)| charge_words(c, *left))
                .collect();
            let attempts = f.effects.iter().map(|e| e.attempts).max().unwrap_or(1);
            match (f.kind, ok.first()) {
                (FindingKind::RiskyReclaim, Some(_)) if !to_refund.is_empty() => format!(
                    "Charged more than once: refund {} to {whom} once, as the duplicate \
                     charge of {order} says.",
                    list(&to_refund)
                ),
                (_, Some(first)) if !to_refund.is_empty() => format!(
                    "Refund {} to {whom}; keep {}, the payment the customer meant to make.",
                    list(&to_refund),
                    charge_words(first, first.amount)
                ),
                (FindingKind::Duplicate, _) => {
                    let given_back: Vec<String> = f
                        .charges
                        .iter()
                        .filter(|c| ok.first().is_none_or(|k| k.id != c.id))
                        .map(|c| c.id.clone())
                        .collect();
                    format!(
                        "Nothing to refund: the extra charge {} was already refunded to {whom}.",
                        list(&given_back)
                    )
                }
                (FindingKind::RiskyReclaim, Some(first)) => format!(
                    "Nothing to do: {order} was tried {attempts} times but charged once, {}.",
                    charge_words(first, first.amount)
                ),
                (FindingKind::RiskyReclaim, None) => format!(
                    "Nothing to refund: {order} was tried {attempts} times and no payment went \
                     through."
                ),
                (_, Some(first)) => format!(
                    "Nothing to refund: {order} was charged once, {}. Its payment was started \
                     under several references: tell the developers.",
                    charge_words(first, first.amount)
                ),
                (_, None) => format!(
                    "Nothing to refund: no payment of {order} went through. Its payment was \
                     started under several references: tell the developers."
                ),
            }
        }
        FindingKind::Orphan => {
            let Some(c) = f.charges.first() else {
                return "Find the order this payment was for in the shop.".into();
            };
            let left = c.amount - c.amount_refunded.min(c.amount);
            if left <= 0 {
                return format!("Nothing to refund: {} was refunded in full.", c.id);
            }
            let lead = f
                .suggestions
                .iter()
                .map(|s| {
                    OperationKey::parse(&s.key)
                        .map_or_else(|| s.key.clone(), |k| format!("order {}", k.subject))
                })
                .collect::<Vec<_>>();
            let hint = if lead.is_empty() {
                f.order_named()
                    .map(|o| format!(" (the provider names order {o})"))
                    .unwrap_or_default()
            } else {
                format!(" (it may be {})", list(&lead))
            };
            format!(
                "Find the order {} paid for in the shop{hint}; if the shop has none, refund it \
                 to {whom}.",
                charge_words(c, left)
            )
        }
        FindingKind::Missing => {
            let paid = f
                .amount
                .zip(f.currency.as_deref())
                .map(|(a, cur)| format!(" ({})", money(a, cur)))
                .unwrap_or_default();
            format!(
                "Check {order} in the shop before telling the customer: the shop recorded it as \
                 paid{paid}, but the provider has no payment for it. Do not deliver it until the \
                 payment is found."
            )
        }
        FindingKind::Unresolved => format!(
            "Check {order} in the shop before telling the customer: nobody knows yet whether \
             it was charged."
        ),
        FindingKind::ChargedNotRecorded => {
            let paid: Vec<String> = f
                .charges
                .iter()
                .map(|c| charge_words(c, c.amount - c.amount_refunded.min(c.amount)))
                .collect();
            if f.refunded || f.amount.is_some_and(|a| a <= 0) {
                let ids: Vec<String> = f.charges.iter().map(|c| c.id.clone()).collect();
                format!(
                    "Nothing to refund: {} was refunded in full. Do not charge {order} again \
                     without asking the customer.",
                    list(&ids)
                )
            } else {
                format!(
                    "Do not charge {order} again: the shop recorded it as not paid, but {} went \
                     through. Mark the order as paid in the shop, or refund it to {whom}.",
                    list(&paid)
                )
            }
        }
        FindingKind::Other => format!("Read the finding: {}", f.summary),
    }
}
