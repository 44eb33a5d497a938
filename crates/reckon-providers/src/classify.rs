//! The one judgement of a lookup. Rule 1 of PRODUCT.md lives here: an error is never an
//! answer. `not_applied` needs a step that is strongly consistent, read its window to the
//! end without a fault, can prove absence at all, covers the effect's window, from the
//! verified account and mode, and an effect older than the visibility lag. Everything
//! else without a provider object is `indeterminate`.

use crate::{Consistency, Fault, LookupReport, Outcome, ProviderObject, RetryAdvice};
use serde::Serialize;
use std::collections::BTreeSet;

/// Why absence was concluded: all the facts the rule needed, in one record.
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
    pub statement: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Classification {
    pub outcome: Outcome,
    pub reason: String,
    /// The method whose answer decided (none for indeterminate).
    pub method: Option<String>,
    pub objects: Vec<ProviderObject>,
    /// Some object may still change state: re-check before resolving.
    pub non_final: bool,
    pub certificate: Option<Certificate>,
    /// The faults seen, for the evidence and the backoff.
    pub faults: Vec<Fault>,
    pub retry: RetryAdvice,
    /// Not worth asking again before this time (a too-recent effect).
    pub not_before: Option<f64>,
}

fn covers(step: Option<(f64, f64)>, effect: (f64, f64)) -> bool {
    match step {
        None => true,
        Some((a, b)) => a <= effect.0 && b >= effect.1,
    }
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
        non_final: false,
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
    // Objects found by any step are evidence, whatever else failed.
    let mut seen = BTreeSet::new();
    let mut methods = Vec::new();
    for s in &r.steps {
        for o in &s.objects {
            if seen.insert(o.id.clone()) {
                out.objects.push(o.clone());
                if !methods.contains(&s.method) {
                    methods.push(s.method.clone());
                }
            }
        }
    }
    if !out.objects.is_empty() {
        let groups: BTreeSet<&str> = out
            .objects
            .iter()
            .filter(|o| o.money_moved)
            .map(|o| o.group.as_str())
            .collect();
        out.non_final = out.objects.iter().any(|o| !o.final_state);
        out.method = Some(methods.join("+"));
        if groups.len() >= 2 {
            out.outcome = Outcome::Duplicate;
            out.reason = format!(
                "{} distinct payments carry this key: money moved more than once",
                groups.len()
            );
        } else {
            out.outcome = Outcome::Applied;
            out.reason = if out.non_final {
                "the provider has it, in a state that may still change".into()
            } else {
                "the provider has it".into()
            };
        }
        return out;
    }
    let visible_from = r.effect_window.1 + r.visibility_lag_secs;
    let mut why: Vec<String> = Vec::new();
    for s in &r.steps {
        let blocker = if let Some(f) = &s.fault {
            Some(format!("{}: {:?}: {}", s.method, f.kind, f.detail))
        } else if !s.proves_absence || s.consistency != Consistency::Strong {
            Some(format!(
                "{}: a miss of this method proves nothing",
                s.method
            ))
        } else if !s.complete {
            Some(format!("{}: the window was not read to its end", s.method))
        } else if !covers(s.window, r.effect_window) {
            Some(format!(
                "{}: its window does not cover the effect's",
                s.method
            ))
        } else if now < visible_from {
            out.not_before = Some(visible_from);
            Some(format!(
                "{}: the effect is younger than the visibility lag ({} s)",
                s.method, r.visibility_lag_secs
            ))
        } else {
            None
        };
        match blocker {
            Some(b) => why.push(b),
            None => {
                out.outcome = Outcome::NotApplied;
                out.method = Some(s.method.clone());
                out.reason = "a complete, strongly consistent answer without it".into();
                out.certificate = Some(Certificate {
                    method: s.method.clone(),
                    window: s.window,
                    effect_window: r.effect_window,
                    pages: s.pages,
                    request_ids: s.request_ids.clone(),
                    account: r.account.clone(),
                    mode: r.mode.clone(),
                    visibility_lag_secs: r.visibility_lag_secs,
                    checked_at: r.checked_at,
                    statement: format!(
                        "every page of {} covering [{:.0}, {:.0}] was read to its end without \
                         error; no object carries key {:?}; the effect's window ended {:.0} s \
                         before the check, more than the visibility lag of {} s",
                        s.method,
                        s.window.map(|w| w.0).unwrap_or(f64::NEG_INFINITY),
                        s.window.map(|w| w.1).unwrap_or(f64::INFINITY),
                        r.provider_key,
                        r.checked_at - r.effect_window.1,
                        r.visibility_lag_secs
                    ),
                });
                return out;
            }
        }
    }
    if why.is_empty() {
        why.push("no lookup method ran".into());
    }
    out.reason = why.join("; ");
    out
}
