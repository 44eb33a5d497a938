//! The Stripe adapter: the lookup ladder of `stripe.md` section 2, on Stripe's real request
//! and response shapes, GET only.
//!
//! - L3 search (`/v1/{payment_intents,charges}/search`, metadata) first, as a fast path:
//!   a hit is evidence, a miss proves nothing (the index lags).
//! - L0 retrieve by an object id (`pi_...`, `ch_...`) found in the recorded response.
//! - L1 events whose `request.idempotency_key` is the key, inside Stripe's 30-day window.
//!   A miss proves absence only when the guarded call's event types are configured.
//! - L2 list PaymentIntents and charges in the effect's created window (paged with
//!   `starting_after` to `has_more: false`), matched on the configured metadata field.
//!
//! Any fault leaves the step incomplete; [`crate::classify`] turns that into
//! `indeterminate`. Objects in non-final states are reported as such.

use crate::client::{GetClient, GetResponse, budget, status_fault};
use crate::{Consistency, Fault, FaultKind, LookupQuery, LookupReport, ProviderObject, Step};
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;

/// Stripe keeps events for 30 days ("List events, going back up to 30 days").
const EVENTS_WINDOW_SECS: f64 = 30.0 * 86_400.0;
/// Stripe may prune an idempotency key after 24 hours.
pub const REPLAY_WINDOW_SECS: f64 = 86_400.0;

#[derive(Debug, Clone)]
pub struct StripeSettings {
    pub base_url: url::Url,
    /// Connected account (`Stripe-Account` header), if any.
    pub account: Option<String>,
    /// `live` or `test`; checked against the key's prefix and objects' `livemode`.
    pub mode: String,
    pub metadata_field: String,
    pub visibility_lag_secs: f64,
    pub max_call_secs: f64,
    pub skew_secs: f64,
    pub rate_per_sec: f64,
    /// `payment_intents`, `charges`: what L2 lists.
    pub list_objects: Vec<String>,
    /// Send `created[lte]` as well as the lower bound. Without it the list is read from now
    /// back to the window's start: more pages, same correctness (for models of Stripe that
    /// accept a single bound).
    pub upper_bound: bool,
    pub use_search: bool,
    pub use_events: bool,
    /// The event types the guarded call emits; with none configured an events miss proves
    /// nothing.
    pub event_types: Vec<String>,
    pub max_pages: u32,
}

pub struct StripeProvider {
    s: StripeSettings,
    key: SecretString,
    client: GetClient,
}

impl StripeProvider {
    pub fn new(s: StripeSettings, key: SecretString, client: GetClient) -> Self {
        StripeProvider { s, key, client }
    }

    fn key_mode(&self) -> Option<&'static str> {
        let k = self.key.expose_secret();
        if k.starts_with("sk_live_") || k.starts_with("rk_live_") {
            Some("live")
        } else if k.starts_with("sk_test_") || k.starts_with("rk_test_") {
            Some("test")
        } else {
            None
        }
    }

    async fn get(&self, path: &str, query: &[(String, String)], step: &mut Step) -> Option<Value> {
        let mut url = match self.s.base_url.join(path) {
            Ok(u) => u,
            Err(e) => {
                step.fault = Some(Fault::new(FaultKind::Config, format!("base_url: {e}")));
                return None;
            }
        };
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        let account_key = format!(
            "stripe|{}|{}|{}",
            self.s.base_url,
            self.s.account.as_deref().unwrap_or("-"),
            self.s.mode
        );
        if let Some(b) = budget(&account_key, self.s.rate_per_sec) {
            b.until_ready().await;
        }
        let auth = format!("Bearer {}", self.key.expose_secret());
        let mut headers = vec![("Authorization", auth.as_str())];
        if let Some(a) = &self.s.account {
            headers.push(("Stripe-Account", a.as_str()));
        }
        step.pages += 1;
        let resp: GetResponse = match self.client.get(&url, &headers).await {
            Ok(r) => r,
            Err(f) => {
                step.fault = Some(f);
                return None;
            }
        };
        if let Some(id) = resp.header("request-id") {
            step.request_ids.push(id);
        }
        if let Some(f) = status_fault(&resp) {
            step.fault = Some(f);
            return None;
        }
        match serde_json::from_slice::<Value>(&resp.body) {
            Ok(v) if v.is_object() => Some(v),
            Ok(_) => {
                step.fault = Some(Fault::new(FaultKind::Malformed, "not a JSON object"));
                None
            }
            Err(e) => {
                step.fault = Some(Fault::new(FaultKind::Malformed, format!("body: {e}")));
                None
            }
        }
    }

    /// Map a Stripe object; `Err` when it lacks what every object has.
    fn object(&self, v: &Value, verified: &mut bool) -> Result<ProviderObject, Fault> {
        let malformed = |what: &str| Fault::new(FaultKind::Malformed, format!("object: {what}"));
        let id = v["id"]
            .as_str()
            .ok_or_else(|| malformed("no id"))?
            .to_owned();
        let kind = v["object"]
            .as_str()
            .ok_or_else(|| malformed("no object type"))?;
        if let Some(live) = v["livemode"].as_bool()
            && live != (self.s.mode == "live")
        {
            *verified = false;
        }
        let status = v["status"].as_str().map(str::to_owned);
        let st = status.as_deref().unwrap_or("");
        let (group, final_state, money_moved, amount) = match kind {
            "payment_intent" => (
                id.clone(),
                matches!(st, "succeeded" | "canceled" | "requires_payment_method"),
                matches!(st, "succeeded" | "processing" | "requires_capture"),
                v["amount_received"]
                    .as_i64()
                    .filter(|a| *a > 0)
                    .or(v["amount"].as_i64()),
            ),
            "charge" => {
                let captured = v["captured"].as_bool().unwrap_or(true);
                (
                    v["payment_intent"].as_str().unwrap_or(&id).to_owned(),
                    matches!(st, "failed") || (st == "succeeded" && captured),
                    st != "failed",
                    v["amount"].as_i64(),
                )
            }
            other => return Err(malformed(&format!("unexpected type {other:?}"))),
        };
        Ok(ProviderObject {
            id,
            object: kind.to_owned(),
            status,
            amount,
            currency: v["currency"].as_str().map(str::to_owned),
            created: v["created"].as_f64(),
            group,
            final_state,
            money_moved,
        })
    }

    fn matches(&self, v: &Value, key: &str) -> bool {
        v["metadata"][self.s.metadata_field.as_str()].as_str() == Some(key)
    }

    async fn search(&self, what: &str, q: &LookupQuery, verified: &mut bool) -> Step {
        let mut step = Step::new(
            &format!("stripe.search.{what}"),
            Consistency::Eventual,
            None,
        );
        step.proves_absence = false;
        let escaped = q.key.replace('\\', "\\\\").replace('"', "\\\"");
        let query = format!("metadata[\"{}\"]:\"{}\"", self.s.metadata_field, escaped);
        let params = vec![
            ("query".to_owned(), query),
            ("limit".to_owned(), "100".to_owned()),
        ];
        let Some(v) = self
            .get(&format!("v1/{what}/search"), &params, &mut step)
            .await
        else {
            return step;
        };
        if let Some(data) = v["data"].as_array() {
            for item in data.iter().filter(|i| self.matches(i, &q.key)) {
                match self.object(item, verified) {
                    Ok(o) => step.objects.push(o),
                    Err(f) => {
                        step.fault = Some(f);
                        return step;
                    }
                }
            }
            step.complete = v["has_more"].as_bool() == Some(false);
        } else {
            step.fault = Some(Fault::new(
                FaultKind::Malformed,
                "search result without data",
            ));
        }
        step
    }

    async fn retrieve(&self, id: &str, verified: &mut bool) -> Step {
        let path = if id.starts_with("pi_") {
            format!("v1/payment_intents/{id}")
        } else {
            format!("v1/charges/{id}")
        };
        let mut step = Step::new("stripe.retrieve", Consistency::Strong, None);
        // A retrieve by id answers for that id only; its miss says nothing about the key.
        step.proves_absence = false;
        if let Some(v) = self.get(&path, &[], &mut step).await {
            match self.object(&v, verified) {
                Ok(o) => {
                    step.objects.push(o);
                    step.complete = true;
                }
                Err(f) => step.fault = Some(f),
            }
        } else if let Some(f) = &mut step.fault
            && f.kind == FaultKind::NotFound
        {
            // The id came from Stripe: a 404 means the wrong account, mode or key.
            f.detail
                .push_str(": an id Stripe issued is missing: check account, mode and key");
        }
        step
    }

    /// Page through a list endpoint over `window`, keeping items for which `pick` returns
    /// an object. Complete only at `has_more: false`.
    async fn list(
        &self,
        method: &str,
        path: &str,
        window: (f64, f64),
        extra: &[(String, String)],
        verified: &mut bool,
        pick: &(dyn Fn(&Value) -> Option<Value> + Sync),
    ) -> Step {
        let mut step = Step::new(method, Consistency::Strong, Some(window));
        let (lo, hi) = (window.0.floor() as i64, window.1.ceil() as i64);
        let mut cursor: Option<String> = None;
        loop {
            if step.pages >= self.s.max_pages {
                step.fault = Some(Fault::new(
                    FaultKind::Truncated,
                    format!("stopped after {} pages", self.s.max_pages),
                ));
                return step;
            }
            let mut params = vec![("limit".to_owned(), "100".to_owned())];
            if self.s.upper_bound {
                params.push(("created[gte]".to_owned(), lo.to_string()));
                params.push(("created[lte]".to_owned(), hi.to_string()));
            } else {
                params.push(("created[gt]".to_owned(), (lo - 1).to_string()));
            }
            params.extend_from_slice(extra);
            if let Some(c) = &cursor {
                params.push(("starting_after".to_owned(), c.clone()));
            }
            let Some(v) = self.get(path, &params, &mut step).await else {
                return step;
            };
            let (Some(data), Some(has_more)) = (v["data"].as_array(), v["has_more"].as_bool())
            else {
                step.fault = Some(Fault::new(
                    FaultKind::Malformed,
                    "a list page without `data` or `has_more`",
                ));
                return step;
            };
            for item in data {
                let created = item["created"].as_f64();
                // A bound the server ignored must not widen what we match.
                if created.is_none_or(|c| c < lo as f64 || c > hi as f64) {
                    continue;
                }
                if let Some(obj) = pick(item) {
                    match self.object(&obj, verified) {
                        Ok(o) => step.objects.push(o),
                        Err(f) => {
                            step.fault = Some(f);
                            return step;
                        }
                    }
                }
            }
            if !has_more {
                step.complete = true;
                return step;
            }
            match data.last().and_then(|i| i["id"].as_str()) {
                Some(last) => cursor = Some(last.to_owned()),
                None => {
                    step.fault = Some(Fault::new(
                        FaultKind::Truncated,
                        "`has_more: true` without a cursor to continue from",
                    ));
                    return step;
                }
            }
        }
    }
}

/// Object ids (`pi_...`, `ch_...`) in a recorded response, top level or one level down.
pub fn recorded_ids(response_json: Option<&str>) -> Vec<String> {
    let Some(v) = response_json.and_then(|r| serde_json::from_str::<Value>(r).ok()) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut visit = |o: &serde_json::Map<String, Value>| {
        for field in ["id", "payment_intent", "latest_charge", "charge"] {
            if let Some(s) = o.get(field).and_then(Value::as_str)
                && (s.starts_with("pi_") || s.starts_with("ch_") || s.starts_with("py_"))
                && !out.iter().any(|x| x == s)
            {
                out.push(s.to_owned());
            }
        }
    };
    if let Some(o) = v.as_object() {
        visit(o);
        for inner in o.values().filter_map(Value::as_object) {
            visit(inner);
        }
    }
    out
}

#[async_trait::async_trait]
impl crate::Provider for StripeProvider {
    fn kind(&self) -> &'static str {
        "stripe"
    }

    fn replay_window_secs(&self) -> Option<f64> {
        Some(REPLAY_WINDOW_SECS)
    }

    async fn list_charges(
        &self,
        from: f64,
        to: f64,
    ) -> Result<crate::listing::ChargeListing, crate::listing::ListingFailure> {
        self.list_window(from, to).await
    }

    async fn lookup(&self, q: &LookupQuery) -> LookupReport {
        let s = &self.s;
        let start = q.created_at - s.skew_secs;
        let end = q.updated_at.max(q.expires_at.unwrap_or(q.updated_at)) + s.max_call_secs;
        let window = (start, end + s.skew_secs);
        let mut verified = self.key_mode() == Some(s.mode.as_str());
        let mut report = LookupReport {
            provider_kind: "stripe".into(),
            provider_key: q.key.clone(),
            account: s.account.clone(),
            mode: Some(s.mode.clone()),
            account_verified: false,
            effect_window: (q.created_at, end),
            visibility_lag_secs: s.visibility_lag_secs,
            steps: Vec::new(),
            checked_at: q.now,
        };
        let found = |r: &LookupReport| r.steps.iter().any(|st| !st.objects.is_empty());
        if !verified {
            let mut step = Step::new("stripe.config", Consistency::Strong, None);
            step.fault = Some(Fault::new(
                FaultKind::Config,
                format!("the key's prefix does not match mode {:?}", s.mode),
            ));
            report.steps.push(step);
            return report;
        }
        // L3: fast path.
        if s.use_search {
            for what in &s.list_objects {
                let st = self.search(what, q, &mut verified).await;
                report.steps.push(st);
            }
        }
        // L0: an id the application recorded.
        if !found(&report) {
            for id in recorded_ids(q.response_json.as_deref()) {
                let st = self.retrieve(&id, &mut verified).await;
                report.steps.push(st);
            }
        }
        // L1: events carrying the key, inside the 30-day window.
        if !found(&report) && s.use_events && q.now - window.0 < EVENTS_WINDOW_SECS - 3600.0 {
            let key = q.key.clone();
            let pick = move |ev: &Value| {
                (ev["request"]["idempotency_key"].as_str() == Some(key.as_str()))
                    .then(|| ev["data"]["object"].clone())
            };
            let extra: Vec<(String, String)> = s
                .event_types
                .iter()
                .map(|t| ("types[]".to_owned(), t.clone()))
                .collect();
            let mut st = self
                .list(
                    "stripe.events",
                    "v1/events",
                    window,
                    &extra,
                    &mut verified,
                    &pick,
                )
                .await;
            st.proves_absence = !s.event_types.is_empty();
            report.steps.push(st);
        }
        // L2: list the window, matched on metadata. The lists make one step: absence
        // needs every one of them read to its end.
        if !found(&report) && !s.list_objects.is_empty() {
            let mut merged = Step::new(
                &format!("stripe.list.{}", s.list_objects.join("+")),
                Consistency::Strong,
                Some(window),
            );
            merged.complete = true;
            for what in &s.list_objects {
                let key = q.key.clone();
                let field = s.metadata_field.clone();
                let pick = move |item: &Value| {
                    (item["metadata"][field.as_str()].as_str() == Some(key.as_str()))
                        .then(|| item.clone())
                };
                let st = self
                    .list(
                        &format!("stripe.list.{what}"),
                        &format!("v1/{what}"),
                        window,
                        &[],
                        &mut verified,
                        &pick,
                    )
                    .await;
                merged.pages += st.pages;
                merged.request_ids.extend(st.request_ids);
                merged.objects.extend(st.objects);
                merged.complete &= st.complete;
                if merged.fault.is_none() {
                    merged.fault = st.fault;
                }
            }
            report.steps.push(merged);
        }
        report.account_verified = verified;
        report
    }
}

// ---- audit (issue 6, branch `audit`): listing a day of charges ----

use crate::listing::{ChargeListing, ListedCharge, ListingFailure, PageEvidence, fail};
use std::collections::{BTreeMap, HashMap};

impl StripeProvider {
    /// Every charge created in `[from, to)`, with its refunds, and the metadata of its
    /// PaymentIntent merged in (applications usually put their keys on the PaymentIntent,
    /// which Stripe does not copy to the charge). All pages to `has_more: false`, or a
    /// failure naming the page.
    async fn list_window(&self, from: f64, to: f64) -> Result<ChargeListing, ListingFailure> {
        let mut pages: Vec<PageEvidence> = Vec::new();
        if self.key_mode() != Some(self.s.mode.as_str()) {
            let f = Fault::new(
                FaultKind::Config,
                format!("the key's prefix does not match mode {:?}", self.s.mode),
            );
            return Err(fail("stripe.config", 1, f, &pages));
        }
        let window = Some((from, to));
        let mut pi_metadata: HashMap<String, BTreeMap<String, String>> = HashMap::new();
        if self.s.list_objects.iter().any(|o| o == "payment_intents") {
            let mut items = Vec::new();
            self.pages(
                "stripe.list.payment_intents",
                "v1/payment_intents",
                window,
                &[],
                &mut pages,
                &mut items,
            )
            .await?;
            for pi in items {
                if let Some(id) = pi["id"].as_str() {
                    pi_metadata.insert(id.to_owned(), crate::listing::metadata(&pi["metadata"]));
                }
            }
        }
        let mut raw = Vec::new();
        self.pages(
            "stripe.list.charges",
            "v1/charges",
            window,
            &[],
            &mut pages,
            &mut raw,
        )
        .await?;
        let mut charges = Vec::with_capacity(raw.len());
        for v in raw {
            let mut c = self.charge(&v).map_err(|d| {
                fail(
                    "stripe.list.charges",
                    pages.len() as u32,
                    Fault::new(FaultKind::Malformed, d),
                    &pages,
                )
            })?;
            // Refunds embedded in the charge (older API versions, or expanded) when they are
            // all there; otherwise their own list, to its end.
            let embedded = v["refunds"]["data"]
                .as_array()
                .filter(|_| v["refunds"]["has_more"].as_bool() == Some(false));
            if let Some(list) = embedded {
                c.refunds = crate::listing::refunds(&Value::Array(list.clone())).map_err(|d| {
                    fail(
                        "stripe.list.charges",
                        pages.len() as u32,
                        Fault::new(FaultKind::Malformed, d),
                        &pages,
                    )
                })?;
            } else if c.amount_refunded > 0 {
                let mut items = Vec::new();
                self.pages(
                    "stripe.list.refunds",
                    "v1/refunds",
                    None,
                    &[("charge".to_owned(), c.id.clone())],
                    &mut pages,
                    &mut items,
                )
                .await?;
                c.refunds = crate::listing::refunds(&Value::Array(items)).map_err(|d| {
                    fail(
                        "stripe.list.refunds",
                        pages.len() as u32,
                        Fault::new(FaultKind::Malformed, d),
                        &pages,
                    )
                })?;
            }
            if let Some(md) = c.payment_intent.as_ref().and_then(|pi| pi_metadata.get(pi)) {
                for (k, val) in md {
                    c.metadata.entry(k.clone()).or_insert_with(|| val.clone());
                }
            }
            charges.push(c);
        }
        Ok(ChargeListing {
            from,
            to,
            charges,
            pages,
        })
    }

    /// Page through a list endpoint to `has_more: false`, keeping the items created in
    /// `window` (all items when `None`). With `upper_bound` off only `created[gt]` is sent
    /// (models of Stripe that take a single bound): the list then runs from now back to the
    /// window's start, more pages and the same items.
    async fn pages(
        &self,
        method: &str,
        path: &str,
        window: Option<(f64, f64)>,
        extra: &[(String, String)],
        pages: &mut Vec<PageEvidence>,
        out: &mut Vec<Value>,
    ) -> Result<(), ListingFailure> {
        let mut cursor: Option<String> = None;
        let mut n = 0u32;
        loop {
            n += 1;
            if n > self.s.max_pages.max(1) * 1000 {
                let f = Fault::new(
                    FaultKind::Truncated,
                    format!("stopped after {} pages", n - 1),
                );
                return Err(fail(method, n, f, pages));
            }
            let mut params = vec![("limit".to_owned(), "100".to_owned())];
            if let Some((from, to)) = window {
                if self.s.upper_bound {
                    params.push(("created[gte]".to_owned(), (from.floor() as i64).to_string()));
                    params.push(("created[lt]".to_owned(), (to.ceil() as i64).to_string()));
                } else {
                    params.push((
                        "created[gt]".to_owned(),
                        (from.floor() as i64 - 1).to_string(),
                    ));
                }
            }
            params.extend_from_slice(extra);
            if let Some(c) = &cursor {
                params.push(("starting_after".to_owned(), c.clone()));
            }
            let mut step = Step::new(method, Consistency::Strong, window);
            let Some(v) = self.get(path, &params, &mut step).await else {
                let f = step
                    .fault
                    .unwrap_or_else(|| Fault::new(FaultKind::Malformed, "no answer"));
                return Err(fail(method, n, f, pages));
            };
            let (Some(data), Some(has_more)) = (v["data"].as_array(), v["has_more"].as_bool())
            else {
                let f = Fault::new(
                    FaultKind::Malformed,
                    "a list page without `data` or `has_more`",
                );
                return Err(fail(method, n, f, pages));
            };
            let mut in_window = 0;
            for item in data {
                if let Some(live) = item["livemode"].as_bool()
                    && live != (self.s.mode == "live")
                {
                    let f = Fault::new(
                        FaultKind::Config,
                        format!("an object of the other mode than {:?}", self.s.mode),
                    );
                    return Err(fail(method, n, f, pages));
                }
                let keep = match window {
                    None => true,
                    Some((from, to)) => item["created"]
                        .as_f64()
                        .is_some_and(|c| c >= from && c < to),
                };
                if keep {
                    in_window += 1;
                    out.push(item.clone());
                }
            }
            pages.push(PageEvidence {
                method: method.to_owned(),
                page: n,
                cursor: cursor.clone(),
                request_id: step.request_ids.last().cloned(),
                objects: data.len(),
                in_window,
            });
            if !has_more {
                return Ok(());
            }
            match data.last().and_then(|i| i["id"].as_str()) {
                Some(last) => cursor = Some(last.to_owned()),
                None => {
                    let f = Fault::new(
                        FaultKind::Truncated,
                        "`has_more: true` without a cursor to continue from",
                    );
                    return Err(fail(method, n, f, pages));
                }
            }
        }
    }

    /// A Stripe charge object as the audit reads it.
    fn charge(&self, v: &Value) -> Result<ListedCharge, String> {
        let text = |f: &str| v[f].as_str().map(str::to_owned);
        let id = text("id").ok_or("a charge without id")?;
        let amount = v["amount"]
            .as_i64()
            .ok_or_else(|| format!("{id}: no amount"))?;
        let status = text("status").ok_or_else(|| format!("{id}: no status"))?;
        let captured = v["captured"].as_bool().unwrap_or(true);
        let status = if status == "succeeded" && !captured {
            // Authorised only: no money has moved yet.
            "authorized".to_owned()
        } else {
            status
        };
        Ok(ListedCharge {
            payment_intent: text("payment_intent"),
            amount,
            currency: text("currency")
                .ok_or_else(|| format!("{id}: no currency"))?
                .to_ascii_lowercase(),
            amount_captured: v["amount_captured"].as_i64().unwrap_or(if captured {
                amount
            } else {
                0
            }),
            amount_refunded: v["amount_refunded"].as_i64().unwrap_or(0),
            refunds: Vec::new(),
            metadata: crate::listing::metadata(&v["metadata"]),
            // Stripe reports the creating request's key on events, not on the charge.
            idempotency_key: None,
            customer: text("customer"),
            created: v["created"]
                .as_f64()
                .ok_or_else(|| format!("{id}: no created"))?,
            raw: v.clone(),
            status,
            id,
        })
    }
}
