//! The generic `http` lookup protocol, for in-house systems (and the built-in demo).
//!
//! ```text
//! GET {base}/effects/lookup?key=<key>        (auth header from the provider's secret)
//! 200 {"found": bool, "complete": bool,
//!      "objects": [{"id": str, "status": str, "amount": int, "currency": str,
//!                   "created": number,
//!                   optional: "money": "moved" | "pending" | "none", "payment": str,
//!                   "amount_refunded": int, "final": bool (default true)}]}
//!
//! GET {base}/charges?from=<epoch>&to=<epoch>&limit=<n>&cursor=<opaque>   (the audit's list)
//! 200 {"objects": [{"id", "status", "amount", "currency", "created",
//!                   optional: "amount_captured", "amount_refunded",
//!                   "refunds": [{"id", "amount", "reason"}], "metadata": {..},
//!                   "idempotency_key", "customer", "payment_intent"}],
//!      "next_cursor": str | null}
//! ```
//!
//! The charges list is read until `next_cursor` is null; the field must be present on every
//! page (a page without it, a cut-off body, a non-2xx answer or a timeout fails the listing).
//!
//! `found` must agree with `objects`; `complete: false` means the answering system could
//! not check everything (a replica behind, a partial index) and is never read as absence.
//! The endpoint is expected to be strongly consistent (read-after-write); set the
//! provider's `consistency` to `eventual` if it is not, and no miss will ever conclude.
//! Every object says where its money stands (`money`, or a documented `status`: see
//! docs/http-provider-protocol.md); an object whose status says neither is a malformed
//! answer. Two payments that moved money make a duplicate; attempts of one payment share
//! `payment`.

use crate::client::{GetClient, status_fault};
use crate::listing::{ChargeListing, ListedCharge, ListingFailure, PageEvidence, fail};
use crate::registry::Adapter;
use crate::settings::{self, RawSettings, SettingsError};
use crate::{
    Consistency, Fault, FaultKind, LookupQuery, LookupReport, Money, ProviderObject, Step,
};
use reckon_domain::{ChargeStatus, ProviderKind};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::Value;
use std::sync::Arc;

/// The http protocol in the registry of provider kinds.
pub(crate) static ADAPTER: Adapter = Adapter {
    kind: ProviderKind::Http,
    label: "HTTP lookup",
    needs_secret: None,
    build: |r, secret, client| build(ProviderKind::Http, r, secret, client),
    check_at_save: |_, _| Ok(()),
    replay_window_secs: |r| r.replay_window_secs,
    calibrates: false,
};

/// An adapter speaking the http protocol from its settings: the `http` kind's, or the
/// demo's (the same protocol, defaults for a provider on loopback).
pub(crate) fn build(
    kind: ProviderKind,
    r: RawSettings,
    secret: Option<SecretString>,
    client: GetClient,
) -> Result<Arc<dyn crate::Provider>, SettingsError> {
    let demo = kind == ProviderKind::Demo;
    let consistency = match r.consistency.as_deref().unwrap_or("strong") {
        "strong" => Consistency::Strong,
        "eventual" => Consistency::Eventual,
        other => {
            return Err(SettingsError::Invalid(format!(
                "consistency {other:?} (use strong or eventual)"
            )));
        }
    };
    let base = r
        .base_url
        .as_ref()
        .ok_or_else(|| SettingsError::Invalid("base_url is required".into()))?;
    Ok(Arc::new(HttpProvider::new(
        HttpSettings {
            kind,
            base_url: settings::url(&Some(base.clone()), "")?,
            auth_header: r.auth_header.unwrap_or_else(|| "Authorization".into()),
            consistency,
            visibility_lag_secs: r
                .visibility_lag_secs
                .unwrap_or(if demo { 1.0 } else { 30.0 }),
            max_call_secs: r.max_call_secs.unwrap_or(60.0),
            rate_per_sec: r.rate_per_sec.unwrap_or(if demo { 0.0 } else { 20.0 }),
            replay_window_secs: r.replay_window_secs,
        },
        secret,
        client,
    )))
}

#[derive(Debug, Clone)]
pub struct HttpSettings {
    pub kind: ProviderKind,
    pub base_url: url::Url,
    pub auth_header: String,
    pub consistency: Consistency,
    pub visibility_lag_secs: f64,
    pub max_call_secs: f64,
    pub rate_per_sec: f64,
    pub replay_window_secs: Option<f64>,
}

pub struct HttpProvider {
    settings: HttpSettings,
    secret: Option<SecretString>,
    client: GetClient,
}

impl HttpProvider {
    pub fn new(settings: HttpSettings, secret: Option<SecretString>, client: GetClient) -> Self {
        HttpProvider {
            settings,
            secret,
            client,
        }
    }
}

/// The answer to a lookup by key. Unknown fields make it malformed, so a changed protocol
/// is noticed.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ProviderLookupAnswer)]
struct Answer {
    /// Must agree with `objects`: true exactly when it is not empty.
    found: bool,
    /// The answer covers every payment ever made with this key, read now. `false`: objects
    /// listed are evidence, but nothing that needs completeness is concluded.
    complete: bool,
    objects: Vec<WireObject>,
}

/// A payment attempt carrying the key.
#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = ProviderLookupObject)]
pub(crate) struct WireObject {
    pub id: String,
    /// Where the money stands, when `money` is not given: succeeded, paid, captured,
    /// refunded, partially_refunded (moved); pending, processing, authorized,
    /// requires_action, requires_confirmation, requires_capture (pending); failed,
    /// declined, canceled, cancelled, voided, expired (none). Any other status without
    /// `money` makes the answer malformed.
    pub status: String,
    pub amount: i64,
    pub currency: String,
    pub created: f64,
    /// Where the money stands: `moved`, `pending` or `none`. Without it, `status` says.
    #[serde(default)]
    pub money: Option<Money>,
    /// The payment this object belongs to (several attempts of one payment share it);
    /// default: the object's own id.
    #[serde(default)]
    pub payment: Option<String>,
    #[serde(default)]
    pub amount_refunded: Option<i64>,
    /// The payment is disputed (a chargeback): shown, it does not change the verdict.
    #[serde(default)]
    pub disputed: bool,
    /// `false`: the object may still change state.
    #[serde(default = "yes")]
    #[schema(default = true)]
    pub r#final: bool,
}

fn yes() -> bool {
    true
}

/// Where the money of a documented status stands (docs/http-provider-protocol.md).
fn money_of(status: &str) -> Option<Money> {
    Some(match status {
        "succeeded" | "paid" | "captured" | "refunded" | "partially_refunded" => Money::Moved,
        "pending"
        | "processing"
        | "authorized"
        | "requires_action"
        | "requires_confirmation"
        | "requires_capture" => Money::Pending,
        "failed" | "declined" | "canceled" | "cancelled" | "voided" | "expired" => Money::None,
        _ => return None,
    })
}

impl WireObject {
    fn into_object(self, confirmed: bool) -> Result<ProviderObject, Fault> {
        let ((Some(money), _) | (None, Some(money))) = (self.money, money_of(&self.status)) else {
            return Err(Fault::new(
                FaultKind::Malformed,
                format!(
                    "object {}: status {:?} does not say whether money moved (add `money`)",
                    self.id, self.status
                ),
            ));
        };
        // An object its provider calls not final has not settled, whatever the word.
        let money = if self.r#final { money } else { Money::Pending };
        Ok(ProviderObject {
            group: self.payment.unwrap_or_else(|| self.id.clone()),
            failure: (money == Money::None).then(|| self.status.clone()),
            id: self.id,
            object: "object".into(),
            status: Some(self.status),
            amount: Some(self.amount),
            currency: Some(self.currency),
            created: Some(self.created),
            money,
            confirmed,
            amount_refunded: self.amount_refunded.filter(|a| *a > 0),
            disputed: self.disputed,
        })
    }
}

#[async_trait::async_trait]
impl crate::Provider for HttpProvider {
    fn kind(&self) -> ProviderKind {
        self.settings.kind
    }

    fn replay_window_secs(&self) -> Option<f64> {
        self.settings.replay_window_secs
    }

    fn pace(&self) -> Option<std::sync::Arc<crate::Pace>> {
        self.client
            .budget(self.settings.base_url.as_str(), self.settings.rate_per_sec)
    }

    async fn list_charges(&self, from: f64, to: f64) -> Result<ChargeListing, ListingFailure> {
        self.list_window(from, to).await
    }

    async fn lookup(&self, q: &LookupQuery) -> LookupReport {
        let s = &self.settings;
        let end = q.updated_at.max(q.expires_at.unwrap_or(q.updated_at)) + s.max_call_secs;
        let mut step = Step::new("http.lookup", s.consistency, None);
        self.run(q, &mut step).await;
        LookupReport {
            provider_kind: s.kind,
            provider_key: q.key.clone(),
            account: None,
            mode: None,
            account_verified: true,
            effect_window: (q.created_at, end),
            visibility_lag_secs: s.visibility_lag_secs,
            index_lag_secs: 0.0,
            steps: vec![step],
            checked_at: q.now,
            observed_at: q.observed_at,
            calibration: None,
        }
    }
}

impl HttpProvider {
    async fn run(&self, q: &LookupQuery, step: &mut Step) {
        let mut url = match self.settings.base_url.join("effects/lookup") {
            Ok(u) => u,
            Err(e) => {
                step.fault = Some(Fault::new(FaultKind::Config, format!("base_url: {e}")));
                return;
            }
        };
        url.query_pairs_mut().append_pair("key", &q.key);
        let pace = self
            .client
            .budget(self.settings.base_url.as_str(), self.settings.rate_per_sec);
        if let Some(p) = &pace {
            p.until_ready().await;
        }
        let secret = self.secret.as_ref().map(|s| s.expose_secret().to_owned());
        let headers: Vec<(&str, &str)> = secret
            .as_deref()
            .map(|v| vec![(self.settings.auth_header.as_str(), v)])
            .unwrap_or_default();
        step.pages = 1;
        let resp = match self.client.get(&url, &headers).await {
            Ok(r) => r,
            Err(f) => {
                step.fault = Some(f);
                return;
            }
        };
        if let Some(id) = resp.header("x-request-id") {
            step.request_ids.push(id);
        }
        if let Some(f) = status_fault(&resp) {
            if f.kind == FaultKind::RateLimited
                && let Some(p) = &pace
            {
                p.rate_limited();
            }
            step.fault = Some(f);
            return;
        }
        let answer: Answer = match serde_json::from_slice(&resp.body) {
            Ok(a) => a,
            Err(e) => {
                step.fault = Some(Fault::new(FaultKind::Malformed, format!("answer: {e}")));
                return;
            }
        };
        if answer.found == answer.objects.is_empty() {
            step.fault = Some(Fault::new(
                FaultKind::Malformed,
                "`found` disagrees with `objects`",
            ));
            return;
        }
        // The endpoint's answer is its system's own read of the object, unless the
        // provider is configured as eventually consistent (then every object is a lead).
        let confirmed = self.settings.consistency == Consistency::Strong;
        for o in answer.objects {
            match o.into_object(confirmed) {
                Ok(o) => step.objects.push(o),
                Err(f) => {
                    step.fault = Some(f);
                    step.objects.clear();
                    return;
                }
            }
        }
        step.complete = answer.complete;
    }
}

/// Pages asked of an in-house endpoint; it may answer with fewer.
const PAGE_LIMIT: usize = 1000;
/// A listing stops (and fails) after this many pages rather than loop forever on a server
/// that keeps handing back cursors.
const MAX_PAGES: u32 = 100_000;

impl HttpProvider {
    async fn list_window(&self, from: f64, to: f64) -> Result<ChargeListing, ListingFailure> {
        let method = format!("{}.charges", self.settings.kind);
        let mut pages: Vec<PageEvidence> = Vec::new();
        let mut charges = Vec::new();
        let mut cursor: Option<String> = None;
        let secret = self.secret.as_ref().map(|s| s.expose_secret().to_owned());
        let headers: Vec<(&str, &str)> = secret
            .as_deref()
            .map(|v| vec![(self.settings.auth_header.as_str(), v)])
            .unwrap_or_default();
        loop {
            let n = pages.len() as u32 + 1;
            if n > MAX_PAGES {
                let f = Fault::new(
                    FaultKind::Truncated,
                    format!("stopped after {MAX_PAGES} pages"),
                );
                return Err(fail(&method, n, f, &pages));
            }
            let mut url = self.settings.base_url.join("charges").map_err(|e| {
                fail(
                    &method,
                    n,
                    Fault::new(FaultKind::Config, e.to_string()),
                    &pages,
                )
            })?;
            url.query_pairs_mut()
                .append_pair("from", &from.to_string())
                .append_pair("to", &to.to_string())
                .append_pair("limit", &PAGE_LIMIT.to_string());
            if let Some(c) = &cursor {
                url.query_pairs_mut().append_pair("cursor", c);
            }
            let pace = self
                .client
                .budget(self.settings.base_url.as_str(), self.settings.rate_per_sec);
            if let Some(p) = &pace {
                p.until_ready().await;
            }
            let resp = self
                .client
                .get(&url, &headers)
                .await
                .map_err(|f| fail(&method, n, f, &pages))?;
            if let Some(f) = status_fault(&resp) {
                if f.kind == FaultKind::RateLimited
                    && let Some(p) = &pace
                {
                    p.rate_limited();
                }
                return Err(fail(&method, n, f, &pages));
            }
            let malformed = |d: String| Fault::new(FaultKind::Malformed, d);
            let page: Value = serde_json::from_slice(&resp.body)
                .map_err(|e| fail(&method, n, malformed(format!("body: {e}")), &pages))?;
            let (Some(objects), Some(next)) = (page["objects"].as_array(), page.get("next_cursor"))
            else {
                let f = malformed("a page without `objects` or `next_cursor`".into());
                return Err(fail(&method, n, f, &pages));
            };
            let next = match next {
                Value::Null => None,
                Value::String(s) if !s.is_empty() => Some(s.clone()),
                _ => {
                    let f = malformed("`next_cursor` is neither a string nor null".into());
                    return Err(fail(&method, n, f, &pages));
                }
            };
            let mut in_window = 0;
            for o in objects {
                let c = wire_charge(o).map_err(|d| fail(&method, n, malformed(d), &pages))?;
                // A server that ignored the bounds must not widen the day.
                if c.created >= from && c.created < to {
                    in_window += 1;
                    charges.push(c);
                }
            }
            pages.push(PageEvidence {
                method: method.clone(),
                page: n,
                cursor: cursor.clone(),
                request_id: resp.header("x-request-id"),
                objects: objects.len(),
                in_window,
            });
            match next {
                None => break,
                Some(c) if Some(&c) == cursor.as_ref() => {
                    let f = malformed("the server returned the same cursor again".into());
                    return Err(fail(&method, n, f, &pages));
                }
                Some(c) => cursor = Some(c),
            }
        }
        Ok(ChargeListing {
            from,
            to,
            charges,
            pages,
        })
    }
}

/// One object of the charges list; `Err` names what is missing.
fn wire_charge(o: &Value) -> Result<ListedCharge, String> {
    let text = |f: &str| o[f].as_str().map(str::to_owned);
    let id = text("id").ok_or("an object without `id`")?;
    let status = text("status").ok_or_else(|| format!("{id}: no `status`"))?;
    let amount = o["amount"]
        .as_i64()
        .ok_or_else(|| format!("{id}: no integer `amount`"))?;
    let currency = text("currency").ok_or_else(|| format!("{id}: no `currency`"))?;
    let created = o["created"]
        .as_f64()
        .ok_or_else(|| format!("{id}: no `created`"))?;
    let refunds = match o.get("refunds") {
        None | Some(Value::Null) => Vec::new(),
        Some(r) => crate::listing::refunds(r).map_err(|e| format!("{id}: {e}"))?,
    };
    let refunded_sum: i64 = refunds.iter().map(|r| r.amount).sum();
    // The protocol's words (`succeeded`, `pending`, `failed`, and `authorized` for money
    // held, not captured); any other is neither paid nor failed, as before it was typed.
    let status = match status.as_str() {
        "succeeded" => ChargeStatus::Paid,
        "authorized" => ChargeStatus::Authorized,
        "failed" => ChargeStatus::Failed,
        _ => ChargeStatus::Pending,
    };
    let captured_default = if status.is_paid() { amount } else { 0 };
    Ok(ListedCharge {
        payment: text("payment_intent"),
        amount,
        currency: currency.to_ascii_lowercase(),
        amount_captured: o["amount_captured"].as_i64().unwrap_or(captured_default),
        amount_refunded: o["amount_refunded"].as_i64().unwrap_or(refunded_sum),
        refunds,
        metadata: crate::listing::metadata(&o["metadata"]),
        idempotency_key: text("idempotency_key").or_else(|| text("key")),
        customer: text("customer"),
        created,
        raw: o.clone(),
        status,
        id,
    })
}

/// The protocol as OpenAPI operations, for the API document's `webhooks`: the requests
/// reckon makes to a tenant's system (`{base}` is the provider's `base_url`) and the
/// answers it accepts. The functions are never called; they carry the descriptions.
pub mod protocol {
    use serde::Serialize;
    use utoipa::ToSchema;

    /// One page of the day's charges.
    #[derive(Serialize, ToSchema)]
    #[schema(as = ProviderChargesPage)]
    pub struct ChargesPage {
        /// Every money-moving object created in `[from, to)`; objects outside are ignored.
        pub objects: Vec<Charge>,
        /// The next page's cursor; null on the last page. Must be on every page; the same
        /// cursor handed back twice fails the import.
        #[schema(required = true)]
        pub next_cursor: Option<String>,
    }

    /// A charge as the audit imports it.
    #[derive(Serialize, ToSchema)]
    #[schema(as = ProviderCharge)]
    pub struct Charge {
        pub id: String,
        /// e.g. succeeded, pending, failed.
        pub status: String,
        /// Minor units (cents).
        pub amount: i64,
        pub currency: String,
        /// Epoch seconds.
        pub created: f64,
        /// Default: `amount` for a succeeded object, else 0.
        pub amount_captured: Option<i64>,
        /// Default: the sum of `refunds`.
        pub amount_refunded: Option<i64>,
        pub refunds: Option<Vec<Refund>>,
        /// `idempotency_key`, `justonce_key`, `reckon_key` (and the provider's
        /// `metadata_field`) carry a key; `order_id` / `order` an order reference.
        pub metadata: Option<std::collections::BTreeMap<String, String>>,
        /// The key of the request that created the object, when the system knows it.
        pub idempotency_key: Option<String>,
        pub customer: Option<String>,
        pub payment_intent: Option<String>,
    }

    /// A refund of a charge; `reason` `duplicate` marks the correction of a double charge.
    #[derive(Serialize, ToSchema)]
    #[schema(as = ProviderRefund)]
    pub struct Refund {
        pub id: String,
        pub amount: i64,
        #[schema(required = true)]
        pub reason: Option<String>,
    }

    /// Did the call with this key happen? (the reconciler, for each unresolved effect)
    #[utoipa::path(
        get,
        path = "providerLookup",
        operation_id = "providerLookup",
        tag = "provider protocol",
        summary = "GET {base}/effects/lookup?key=...",
        description = "reckon asks the tenant's system for every payment made with an \
            effect's key. Only GET is ever sent; the provider's secret goes in one header \
            (`auth_header`, default `Authorization`). Any answer other than a well-formed \
            200 (timeouts, 429, 5xx, 401/403, malformed or cut-off JSON) is `indeterminate`. \
            An `X-Request-Id` response header is kept as evidence.",
        params(("key" = String, Query, description = "The effect's key after the provider's `key_template` (default `{key}`).")),
        responses(
            (status = 200, description = "What the system knows about the key.", body = super::Answer),
            (status = "default", description = "Anything else: the lookup is indeterminate and retried later."),
        )
    )]
    pub fn lookup() {}

    /// The day's charges, paged (the audit, once per tenant and day)
    #[utoipa::path(
        get,
        path = "providerCharges",
        operation_id = "providerCharges",
        tag = "provider protocol",
        summary = "GET {base}/charges?from=&to=&limit=&cursor=",
        description = "reckon reads every page until `next_cursor` is null. The listing is \
            all or nothing: a non-2xx answer, a timeout, a body cut off, malformed JSON, a \
            page without `objects` or `next_cursor`, an object without `id`, `status`, \
            integer `amount`, `currency` or `created`, or a cursor handed back twice fails \
            the whole day's import.",
        params(
            ("from" = f64, Query, description = "Epoch seconds, inclusive (the tenant's day minus an hour)."),
            ("to" = f64, Query, description = "Epoch seconds, exclusive (the day plus an hour)."),
            ("limit" = i64, Query, description = "A hint: reckon asks for 1000; fewer is fine."),
            ("cursor" = Option<String>, Query, description = "The previous page's `next_cursor`; absent on the first request."),
        ),
        responses(
            (status = 200, description = "One page.", body = ChargesPage),
            (status = "default", description = "Anything else fails the day's import (stored as a failed run with the reason)."),
        )
    )]
    pub fn charges() {}

    /// The protocol's operations and their schemas.
    #[derive(utoipa::OpenApi)]
    #[openapi(paths(lookup, charges))]
    pub struct ProtocolDoc;
}
