//! The one judgement of a lookup, for every provider. Adapters only map what they read to
//! objects (id, payment group, where the money stands, whether the object was read itself
//! or only seen in a snapshot); the verdict is decided here, over the payments that carry
//! the effect's identity:
//!
//! | payments (confirmed: read itself now, or final in a fresh list) | verdict                          |
//! |------------------------------------------------------------------|----------------------------------|
//! | two or more moved money                                          | `duplicate`, final               |
//! | one moved money, the check for a second complete                 | `applied`, final                 |
//! | one moved money, the check incomplete, a fault, a lead unread, a payment still pending | `applied`, provisional |
//! | none moved, one can still move money (`processing`, `requires_capture`, ...) | `indeterminate`, pending: re-checked |
//! | none moved, every one terminal without money, the check complete | `not_applied`, its certificate naming them |
//! | anything else                                                    | `indeterminate`                  |
//!
//! "Complete" is rule 1 of PRODUCT.md: a strongly consistent method that can prove absence
//! read every page of a window covering the effect's, from the verified account and mode,
//! after the visibility lag, with no fault in any step of the lookup and no lead left
//! unconfirmed. A lower bound needs no completeness: two confirmed payments that moved
//! money are a duplicate whatever else failed. An event's object or a search hit is a lead
//! and never decides.

use crate::{Consistency, Fault, LookupReport, Money, Outcome, ProviderObject, RetryAdvice};
use serde::Serialize;
use std::collections::BTreeMap;

/// Why absence (or uniqueness) was concluded: all the facts the rule needed, in one record.
#[derive(Debug, Clone, Serialize)]
pub struct Certificate {
    pub method: String,
    pub window: Option<(f64, f64)>,
    pub effect_window: (f64, f64),
    pub pages: u32,
    pub request_ids: Vec<String>,
    pub account: Option<String>,
    pub mode: Option<String>,
    pub visibility_lag_secs: f64,
    pub checked_at: f64,
    /// The attempts that were found and moved no money (declined, failed, canceled).
    pub failed_attempts: Vec<String>,
    /// What vouches that the check's miss is a miss wherever and whenever the payment was
    /// made: a key-indexed method that agreed, or the route's calibration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub witness: Option<String>,
    pub statement: String,
}

/// One payment (a group of objects: a PaymentIntent and its charges) as judged.
#[derive(Debug, Clone, Serialize)]
pub struct Payment {
    pub group: String,
    pub money: Money,
    pub confirmed: bool,
    pub status: Option<String>,
    pub amount: Option<i64>,
    pub currency: Option<String>,
    pub amount_refunded: Option<i64>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub disputed: bool,
    pub object_ids: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Classification {
    pub outcome: Outcome,
    pub reason: String,
    /// The methods whose objects decided (none for indeterminate).
    pub method: Option<String>,
    pub objects: Vec<ProviderObject>,
    pub payments: Vec<Payment>,
    /// The verdict may still change: re-check before resolving (a provisional `applied`,
    /// or a payment that can still move money).
    pub non_final: bool,
    /// `applied` without a complete check for a second payment: shown as provisional,
    /// never resolved, never written back.
    pub provisional: bool,
    /// A payment can still move money: the answer waits for the provider, not for a fault
    /// to clear.
    pub pending: bool,
    pub certificate: Option<Certificate>,
    /// The faults seen, for the evidence and the backoff.
    pub faults: Vec<Fault>,
    pub retry: RetryAdvice,
    /// Not worth asking again before this time (a too-recent effect).
    pub not_before: Option<f64>,
}

impl Classification {
    /// A conclusion to record as the effect's resolution.
    pub fn is_final(&self) -> bool {
        self.outcome != Outcome::Indeterminate && !self.non_final
    }
}

fn covers(step: Option<(f64, f64)>, effect: (f64, f64)) -> bool {
    match step {
        None => true,
        Some((a, b)) => a <= effect.0 && b >= effect.1,
    }
}

/// Every object once, by id: a confirmed read replaces a lead, a later confirmed read an
/// earlier one (the ladder confirms last).
fn objects(r: &LookupReport) -> (Vec<ProviderObject>, Vec<String>) {
    let mut by_id: BTreeMap<String, (usize, ProviderObject)> = BTreeMap::new();
    let mut methods = Vec::new();
    let mut n = 0;
    for s in &r.steps {
        for o in &s.objects {
            n += 1;
            let replace = match by_id.get(&o.id) {
                None => true,
                Some((_, old)) => o.confirmed || !old.confirmed,
            };
            if replace {
                let first = by_id.get(&o.id).map_or(n, |(i, _)| *i);
                by_id.insert(o.id.clone(), (first, o.clone()));
            }
            if !methods.contains(&s.method) {
                methods.push(s.method.clone());
            }
        }
    }
    let mut out: Vec<(usize, ProviderObject)> = by_id.into_values().collect();
    out.sort_by_key(|(i, _)| *i);
    (out.into_iter().map(|(_, o)| o).collect(), methods)
}

/// The payments: a group is confirmed when any of its objects was read itself, and then
/// only its confirmed objects say where its money stands.
fn payments(objects: &[ProviderObject]) -> Vec<Payment> {
    let mut groups: BTreeMap<&str, Vec<&ProviderObject>> = BTreeMap::new();
    let mut order: Vec<&str> = Vec::new();
    for o in objects {
        if !groups.contains_key(o.group.as_str()) {
            order.push(o.group.as_str());
        }
        groups.entry(o.group.as_str()).or_default().push(o);
    }
    order
        .into_iter()
        .map(|g| {
            let all = &groups[g];
            // A payment is known when the object that speaks for it (the PaymentIntent, a
            // charge of its own) was read, when every object of it seen was read, or when
            // one read object moved money (that cannot be undone). A declined charge read
            // beside a PaymentIntent seen only in a list says nothing of the PaymentIntent's
            // other attempts.
            let head_read = all.iter().any(|o| o.confirmed && o.id == g);
            let moved_read = all.iter().any(|o| o.confirmed && o.money == Money::Moved);
            let confirmed = head_read || moved_read || all.iter().all(|o| o.confirmed);
            let judged: Vec<&&ProviderObject> =
                all.iter().filter(|o| o.confirmed == confirmed).collect();
            // Money that moved stays moved; otherwise the PaymentIntent read now speaks for
            // its charges (an expired authorization's charge still says `succeeded`,
            // uncaptured, while its PaymentIntent is canceled).
            let money = if moved_read {
                Money::Moved
            } else if let Some(h) = all.iter().find(|o| o.confirmed && o.id == g) {
                h.money
            } else {
                judged.iter().map(|o| o.money).max().unwrap_or(Money::None)
            };
            // The object that speaks for the payment: the PaymentIntent when there is one.
            let head = judged
                .iter()
                .find(|o| o.id == g)
                .or_else(|| judged.iter().find(|o| o.money == money))
                .or(judged.first())
                .copied()
                .copied();
            Payment {
                group: g.to_owned(),
                money,
                confirmed,
                status: head.and_then(|o| o.status.clone()),
                amount: head.and_then(|o| o.amount),
                currency: head.and_then(|o| o.currency.clone()),
                // Shown, never judged: a refund only grows, so any read of it will do.
                amount_refunded: all.iter().filter_map(|o| o.amount_refunded).max(),
                disputed: all.iter().any(|o| o.disputed),
                object_ids: all.iter().map(|o| o.id.clone()).collect(),
            }
        })
        .collect()
}

pub fn classify(r: &LookupReport, now: f64) -> Classification {
    let faults: Vec<Fault> = r.steps.iter().filter_map(|s| s.fault.clone()).collect();
    let retry = faults
        .iter()
        .map(|f| f.retry)
        .max_by_key(|a| match a {
            RetryAdvice::Normal => 0,
            RetryAdvice::Harder => 1,
            RetryAdvice::DoNotRetry => 2,
        })
        .unwrap_or(RetryAdvice::Normal);
    let mut out = Classification {
        outcome: Outcome::Indeterminate,
        reason: String::new(),
        method: None,
        objects: Vec::new(),
        payments: Vec::new(),
        non_final: false,
        provisional: false,
        pending: false,
        certificate: None,
        faults,
        retry,
        not_before: None,
    };
    if !r.account_verified {
        out.reason = "the answer could not be tied to the configured account and mode".into();
        out.retry = RetryAdvice::DoNotRetry;
        return out;
    }
    let (objs, methods) = objects(r);
    out.payments = payments(&objs);
    out.objects = objs;
    if !methods.is_empty() {
        out.method = Some(methods.join("+"));
    }
    let confirmed = |m: Money| {
        out.payments
            .iter()
            .filter(|p| p.confirmed && p.money == m)
            .count()
    };
    let moved = confirmed(Money::Moved);
    let pending = confirmed(Money::Pending);
    let leads: Vec<&Payment> = out.payments.iter().filter(|p| !p.confirmed).collect();

    if moved >= 2 {
        out.outcome = Outcome::Duplicate;
        out.reason = format!(
            "{moved} distinct payments carry this key and each moved money (read from the \
             provider just now)"
        );
        return out;
    }

    // What stands between the lookup and a complete check.
    let mut why: Vec<String> = Vec::new();
    for f in &out.faults {
        why.push(format!("{:?}: {}", f.kind, f.detail));
    }
    for p in &leads {
        why.push(format!(
            "{} was seen only in a snapshot or an index, not read itself",
            p.group
        ));
    }
    // When the reads began: a read vouches only for what existed by then.
    let read_at = r.checked_at.min(now);
    let mut complete = None;
    let mut step_why = Vec::new();
    for s in &r.steps {
        // A step vouches for every second of the window it lists, skew included: the whole
        // span must be past, plus the visibility lag, when the lookup began, or a payment
        // created in its future part would not have been seen. (Stripe's lists are read in
        // whole seconds up to the one before the read began, less the lag: a window ready
        // here may still come back not read to its end, and is read again.)
        let ready = span_end(r, s) + r.visibility_lag_secs;
        let blocker = if s.fault.is_some() {
            Some(format!("{}: failed", s.method))
        } else if !s.proves_absence || s.consistency != Consistency::Strong {
            Some(format!(
                "{}: a miss of this method proves nothing",
                s.method
            ))
        } else if read_at < ready {
            out.not_before = Some(out.not_before.map_or(ready, |nb| nb.max(ready)));
            Some(format!(
                "{}: its window (skew included) and the visibility lag ({} s) after it are \
                 past {:.0} s after the lookup began; it is read as a whole then",
                s.method,
                r.visibility_lag_secs,
                ready - read_at
            ))
        } else if !s.complete {
            Some(format!("{}: the window was not read to its end", s.method))
        } else if !covers(s.window, r.effect_window) {
            Some(format!(
                "{}: its window does not cover the effect's",
                s.method
            ))
        } else {
            None
        };
        match blocker {
            None => {
                complete.get_or_insert(s);
            }
            Some(b) => step_why.push(b),
        }
    }
    if complete.is_none() {
        if step_why.is_empty() {
            step_why.push("no complete check ran".into());
        }
        why.extend(step_why);
    }
    let complete = complete.filter(|_| why.is_empty());
    // Absence read from a window list (no payment, or no second one) also needs a view that
    // would have shown this key's payment wherever and whenever it was made.
    let witness = complete.map(|s| witness(r, s, read_at));
    if let Some(Err(w)) = &witness {
        if let Some(at) = w.ready_at {
            out.not_before = Some(out.not_before.map_or(at, |nb| nb.max(at)));
        }
        why.push(w.gap.clone());
    }
    let unwitnessed = complete.filter(|_| matches!(witness, Some(Err(_))));
    let witness = witness.and_then(Result::ok);
    let complete = complete.filter(|_| witness.is_some());

    if moved == 1 {
        out.outcome = Outcome::Applied;
        let p = out
            .payments
            .iter()
            .find(|p| p.confirmed && p.money == Money::Moved)
            .expect("one moved payment");
        let paid = format!(
            "{} moved money ({})",
            p.group,
            p.status.as_deref().unwrap_or("?")
        );
        if pending > 0 {
            why.push("another payment of this key can still move money".into());
        }
        match complete {
            Some(s) if pending == 0 => {
                out.reason = format!("{paid}; no second payment: {}", s.method);
                out.certificate = Some(certificate(
                    r,
                    s,
                    witness.as_ref(),
                    &out.payments,
                    "a second payment",
                ));
            }
            _ => {
                out.provisional = true;
                out.non_final = true;
                out.reason = format!(
                    "provisional: {paid}; the check for a second payment is not complete: {}",
                    why.join("; ")
                );
            }
        }
        return out;
    }
    if pending > 0 {
        let p: Vec<String> = out
            .payments
            .iter()
            .filter(|p| p.confirmed && p.money == Money::Pending)
            .map(|p| {
                format!(
                    "{} is {}",
                    p.group,
                    p.status.as_deref().unwrap_or("pending")
                )
            })
            .collect();
        out.pending = true;
        out.non_final = true;
        out.reason = format!("money may still move: {}", p.join(", "));
        return out;
    }
    if let Some(p) = leads.iter().find(|p| p.money == Money::Moved) {
        // Money seen moving in a snapshot: a strong lead, shown as such, never concluded.
        out.outcome = Outcome::Applied;
        out.provisional = true;
        out.non_final = true;
        out.reason = format!(
            "provisional: {} appears to have moved money, not yet confirmed: {}",
            p.group,
            why.join("; ")
        );
        return out;
    }
    if let Some(s) = complete {
        out.outcome = Outcome::NotApplied;
        out.method = Some(s.method.clone());
        let failed = out.payments.len();
        out.reason = if failed == 0 {
            "a complete, strongly consistent answer without it".into()
        } else {
            format!("no money moved: {failed} attempt(s) found, each declined, failed or canceled")
        };
        out.certificate = Some(certificate(
            r,
            s,
            witness.as_ref(),
            &out.payments,
            "a payment that moved money",
        ));
        return out;
    }
    if let Some(s) = unwitnessed {
        // The check came back whole and without a payment that moved money, but nothing
        // vouches that it could have seen one: "not found so far", never "not charged".
        out.outcome = Outcome::NotApplied;
        out.method = Some(s.method.clone());
        out.provisional = true;
        out.non_final = true;
        out.reason = format!(
            "provisional: no payment that moved money in {}, but that is not proof of \
             absence: {}",
            s.method,
            why.join("; ")
        );
        return out;
    }
    out.reason = why.join("; ");
    out
}

fn certificate(
    r: &LookupReport,
    s: &crate::Step,
    witness: Option<&Witness>,
    payments: &[Payment],
    absent: &str,
) -> Certificate {
    let failed: Vec<String> = payments
        .iter()
        .filter(|p| p.money == Money::None)
        .map(|p| format!("{} ({})", p.group, p.status.as_deref().unwrap_or("?")))
        .collect();
    let mut request_ids = s.request_ids.clone();
    if let Some(w) = witness {
        for id in &w.request_ids {
            if !request_ids.contains(id) {
                request_ids.push(id.clone());
            }
        }
    }
    Certificate {
        method: s.method.clone(),
        window: s.window,
        effect_window: r.effect_window,
        pages: s.pages,
        request_ids,
        account: r.account.clone(),
        mode: r.mode.clone(),
        visibility_lag_secs: r.visibility_lag_secs,
        checked_at: r.checked_at,
        witness: witness.map(|w| w.statement.clone()),
        statement: format!(
            "every page of {} covering [{:.0}, {:.0}] was read to its end without error; no \
             other object carries key {:?} as {absent}{}; the window (skew included) ended \
             {:.0} s before the check, more than the visibility lag of {} s{}",
            s.method,
            s.window.map_or(f64::NEG_INFINITY, |w| w.0),
            s.window.map_or(f64::INFINITY, |w| w.1),
            r.provider_key,
            if failed.is_empty() {
                String::new()
            } else {
                format!("; attempts without money: {}", failed.join(", "))
            },
            r.checked_at - span_end(r, s),
            r.visibility_lag_secs,
            witness.map_or(String::new(), |w| format!("; witness: {}", w.statement)),
        ),
        failed_attempts: failed,
    }
}

/// The last second a step vouches for: its window's end (skew included), or the effect's
/// when it lists no window (a lookup by key).
fn span_end(r: &LookupReport, s: &crate::Step) -> f64 {
    s.window
        .map_or(r.effect_window.1, |w| w.1.max(r.effect_window.1))
}

/// What vouches that a complete check's miss is a miss everywhere.
struct Witness {
    statement: String,
    request_ids: Vec<String>,
}

/// Why a complete check's miss does not yet vouch for absence everywhere, and when it may.
struct WitnessGap {
    gap: String,
    ready_at: Option<f64>,
}

/// A window list sees only the objects created inside its window, of the types it lists,
/// carrying the key under the configured field: an application clock off, keys on another
/// object or under another name, a payment made later, and it comes back whole and empty.
/// It proves absence only beside a key-indexed method that read everything and agrees
/// (events by the creating request's idempotency key, search by metadata once past its
/// lag), or on a route calibrated against the application's own known outcomes. A route
/// measured to miss them proves nothing.
fn witness(r: &LookupReport, s: &crate::Step, read_at: f64) -> Result<Witness, WitnessGap> {
    if s.key_indexed {
        return Ok(Witness {
            statement: format!("{} looks the key itself up", s.method),
            request_ids: Vec::new(),
        });
    }
    let cal = r.calibration.as_ref();
    if let Some(c) = cal.filter(|c| c.status == crate::CalibrationStatus::Uncalibrated) {
        return Err(WitnessGap {
            gap: format!(
                "the route is uncalibrated ({}): a miss of its lookup proves nothing",
                c.reason
            ),
            ready_at: None,
        });
    }
    let end = span_end(r, s);
    // A witness vouches for what existed a lag before it was read; the call had ended by
    // the time reckon saw its row (reckon's clock), whatever the application's clock says.
    let since = r.observed_at.map_or(end, |o| o.max(end));
    let mut gaps = Vec::new();
    let mut ready_at: Option<f64> = None;
    for w in r.steps.iter().filter(|w| w.key_indexed) {
        let whole = w.fault.is_none() && w.complete;
        let covers_effect = covers(w.window, (r.effect_window.0, end));
        if !whole {
            gaps.push(format!("{}: not read whole", w.method));
        } else if !covers_effect {
            gaps.push(format!("{}: its span does not cover the window", w.method));
        } else if w.consistency == Consistency::Strong && w.window.is_some_and(|(_, b)| b < since) {
            // Its span ends a visibility lag before the read: it must reach the moment
            // reckon saw the row, by which the call had ended.
            let at = since + (read_at - w.window.map_or(read_at, |(_, b)| b));
            ready_at = Some(ready_at.map_or(at, |x: f64| x.min(at)));
            gaps.push(format!(
                "{}: its span ends before reckon saw the row (the visibility lag, {} s, is \
                 not past since)",
                w.method, r.visibility_lag_secs
            ));
        } else if w.consistency == Consistency::Strong {
            return Ok(Witness {
                statement: format!(
                    "{} read whole over {}, {} page(s), without a payment of the key beyond \
                     those judged",
                    w.method,
                    w.window
                        .map_or("all time".to_owned(), |(a, b)| format!("[{a:.0}, {b:.0}]")),
                    w.pages
                ),
                request_ids: w.request_ids.clone(),
            });
        } else if read_at >= since + r.index_lag_secs {
            return Ok(Witness {
                statement: format!(
                    "{} (by key, whatever `created` says) read after its index lag of {} s \
                     had passed, without a payment of the key beyond those judged",
                    w.method, r.index_lag_secs
                ),
                request_ids: w.request_ids.clone(),
            });
        } else {
            let at = since + r.index_lag_secs;
            ready_at = Some(ready_at.map_or(at, |x: f64| x.min(at)));
            gaps.push(format!(
                "{}: its index may lag up to {} s behind the call, so its miss counts from \
                 {:.0} s from now",
                w.method,
                r.index_lag_secs,
                at - read_at
            ));
        }
    }
    // A calibration vouches for the window and the field: the application's payments land
    // there. A payment made outside it (a worker that resumed after its lease) is looked
    // for by a key-indexed method read whole, even one whose miss alone proves nothing yet.
    let looked_elsewhere = r
        .steps
        .iter()
        .any(|w| w.key_indexed && w.fault.is_none() && w.complete);
    if let Some(c) = cal.filter(|c| c.status == crate::CalibrationStatus::Calibrated)
        && looked_elsewhere
    {
        return Ok(Witness {
            statement: format!(
                "the route is calibrated: its lookup found {} of {} effects the application \
                 recorded as done, provider times within {:.0} s of the recorded ones",
                c.found, c.samples, c.offset_max_abs_secs
            ),
            request_ids: Vec::new(),
        });
    }
    if gaps.is_empty() {
        gaps.push(
            "the route has no key-indexed method (events with the guarded call's types, search \
             under a field its lists have seen in use)"
                .into(),
        );
    }
    Err(WitnessGap {
        gap: format!(
            "no view that would have shown the key's payment wherever and whenever it was made \
             agrees ({}; calibration: {})",
            gaps.join("; "),
            cal.map_or("not measured".to_owned(), |c| c.reason.clone())
        ),
        ready_at,
    })
}
