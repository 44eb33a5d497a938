//! Listing a window of provider charges for the audit, complete or failed.
//!
//! A listing is all or nothing: every page is read to the provider's own end marker, and a
//! failed, cut-off or malformed page, a "more" without a cursor, or a timeout fails the whole
//! listing with that reason. A partial window is never returned, because an audit over a
//! partial day would report the missing charges' effects as `missing` and the day as clean.

use crate::{Fault, FaultKind};
use reckon_domain::ChargeStatus;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ListedRefund {
    pub id: String,
    pub amount: i64,
    pub reason: Option<String>,
}

/// A money-moving object at the provider, with what the audit needs and the raw object, in
/// reckon's words: each adapter maps its provider's own (the raw object keeps them).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ListedCharge {
    pub id: String,
    /// The payment the charge is an attempt of, when the provider groups attempts (Stripe:
    /// its PaymentIntent; the http protocol: `payment_intent`).
    pub payment: Option<String>,
    /// Minor units.
    pub amount: i64,
    /// Lower case ISO code.
    pub currency: String,
    pub status: ChargeStatus,
    pub amount_captured: i64,
    pub amount_refunded: i64,
    pub refunds: Vec<ListedRefund>,
    pub metadata: BTreeMap<String, String>,
    pub idempotency_key: Option<String>,
    pub customer: Option<String>,
    pub created: f64,
    /// The object as the provider sent it: the evidence.
    pub raw: Value,
}

/// One page read, for the run's evidence.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PageEvidence {
    /// e.g. `stripe.list.charges`, `http.charges`.
    pub method: String,
    pub page: u32,
    /// The cursor the page was asked for (`None`: the first page).
    pub cursor: Option<String>,
    pub request_id: Option<String>,
    /// Objects on the page, and how many of them fell in the window.
    pub objects: usize,
    pub in_window: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChargeListing {
    pub from: f64,
    pub to: f64,
    pub charges: Vec<ListedCharge>,
    pub pages: Vec<PageEvidence>,
}

/// Why a listing failed, with the pages read before it did.
#[derive(Debug, Clone, Serialize)]
pub struct ListingFailure {
    pub method: String,
    /// The page that failed (1-based).
    pub page: u32,
    pub fault: Fault,
    pub pages: Vec<PageEvidence>,
}

impl std::fmt::Display for ListingFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} page {}: {}: {}",
            self.method,
            self.page,
            kind_word(self.fault.kind),
            self.fault.detail
        )
    }
}

fn kind_word(k: FaultKind) -> &'static str {
    match k {
        FaultKind::Timeout => "timeout",
        FaultKind::Connection => "connection failed",
        FaultKind::ServerError => "server error",
        FaultKind::RateLimited => "rate limited",
        FaultKind::Auth => "not authorised",
        FaultKind::NotFound => "not found",
        FaultKind::Malformed => "malformed page",
        FaultKind::Truncated => "truncated page",
        FaultKind::TooLarge => "size limit",
        FaultKind::Unsupported => "unsupported",
        FaultKind::Config => "configuration",
    }
}

pub(crate) fn fail(
    method: &str,
    page: u32,
    fault: Fault,
    pages: &[PageEvidence],
) -> ListingFailure {
    ListingFailure {
        method: method.to_owned(),
        page,
        fault,
        pages: pages.to_vec(),
    }
}

/// `{"k": "v"}` -> map; non-string values are kept as their JSON text (Stripe metadata is
/// string-only; an in-house system may send numbers).
pub(crate) fn metadata(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|m| {
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| {
                    let s = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                    (k.clone(), s)
                })
                .collect()
        })
        .unwrap_or_default()
}

pub(crate) fn refunds(v: &Value) -> Result<Vec<ListedRefund>, String> {
    let Some(items) = v.as_array() else {
        return Err("refunds is not a list".into());
    };
    items
        .iter()
        .map(|r| {
            Ok(ListedRefund {
                id: r["id"].as_str().ok_or("a refund without id")?.to_owned(),
                amount: r["amount"].as_i64().ok_or("a refund without amount")?,
                reason: r["reason"].as_str().map(str::to_owned),
            })
        })
        .collect()
}
