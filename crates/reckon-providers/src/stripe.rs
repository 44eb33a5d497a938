//! The Stripe adapter, on Stripe's real request and response shapes, GET only
//! (`stripe.md` sections 2 and 7).
//!
//! Every object an answer depends on is read as it is now: an id the application recorded
//! (L0 retrieve), then the complete check, the lists of PaymentIntents and charges created
//! in the effect's window matched on the metadata field (L2, paged with `starting_after`
//! to `has_more: false`); only when that check did not come back whole, events whose
//! `request.idempotency_key` is the key (L1, inside Stripe's 30-day window; their
//! `data.object` is a snapshot from when the event happened) and search (L3, an index that
//! lags). Objects from events and search are leads, and so are listed objects that may
//! still change; each lead's payment is then retrieved for its current state. A listed
//! object in a final state (a captured charge, a canceled PaymentIntent) from a page read
//! within the last minute answers for its payment without that second read. The adapter maps objects to where their money stands
//! ([`Money`]) and [`crate::classify`] judges. After a 401/403 or `Stripe-Should-Retry:
//! false` the lookup sends nothing more.

use crate::client::{GetClient, GetResponse, status_fault};
use crate::registry::Adapter;
use crate::settings::{self, RawSettings, SettingsError};
use crate::{
    Consistency, Fault, FaultKind, LookupQuery, LookupReport, Money, ProviderObject, Step,
};
use reckon_domain::{ChargeStatus, ProviderKind};
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;

/// Stripe keeps events for 30 days ("List events, going back up to 30 days").
const EVENTS_WINDOW_SECS: f64 = 30.0 * 86_400.0;
/// Stripe may prune an idempotency key after 24 hours.
pub const REPLAY_WINDOW_SECS: f64 = 86_400.0;

/// Stripe in the registry of provider kinds.
pub(crate) static ADAPTER: Adapter = Adapter {
    kind: ProviderKind::Stripe,
    label: "Stripe",
    needs_secret: Some(KEY_WANTED),
    build,
    check_at_save,
    replay_window_secs: |_| Some(REPLAY_WINDOW_SECS),
    calibrates: true,
};

const KEY_WANTED: &str = "a restricted read-only key rk_live_... or rk_test_...";

/// What a person may not save for Stripe, though it would build: a live key sent over
/// plain http, and lists that read charges only with no reason given (Stripe does not copy
/// a PaymentIntent's metadata to its charges, so a key the application put on its
/// PaymentIntents would never be found and the empty lists would read as absence; with a
/// reason, the calibration checks the claim against the application's known outcomes).
fn check_at_save(r: &RawSettings, new_secret: Option<&str>) -> Result<(), SettingsError> {
    if let Some(base) = &r.base_url {
        let live = r.mode.as_deref().is_none_or(|m| m == "live")
            || new_secret.is_some_and(|s| s.trim_start().contains("_live_"));
        if live && settings::url(&Some(base.clone()), "")?.scheme() != "https" {
            return Err(SettingsError::LiveKeyInClear);
        }
    }
    if let Some(lists) = &r.list_objects {
        let reason = r
            .override_reason
            .as_deref()
            .is_some_and(|why| !why.trim().is_empty());
        if lists.iter().any(|l| l == "charges")
            && !lists.iter().any(|l| l == "payment_intents")
            && !reason
        {
            return Err(SettingsError::ChargesOnly);
        }
    }
    Ok(())
}

/// A Stripe provider from its settings, with Stripe's defaults.
fn build(
    r: RawSettings,
    secret: Option<SecretString>,
    client: GetClient,
) -> Result<Arc<dyn crate::Provider>, SettingsError> {
    let mode = r.mode.clone().unwrap_or_else(|| "live".into());
    if mode != "live" && mode != "test" {
        return Err(SettingsError::Invalid("mode must be live or test".into()));
    }
    let list_objects = r
        .list_objects
        .clone()
        .unwrap_or_else(|| vec!["payment_intents".into(), "charges".into()]);
    if let Some(bad) = list_objects
        .iter()
        .find(|o| !matches!(o.as_str(), "payment_intents" | "charges"))
    {
        return Err(SettingsError::Invalid(format!(
            "list_objects: {bad:?} (use payment_intents, charges)"
        )));
    }
    let key = secret.ok_or(SettingsError::MissingSecret(
        ProviderKind::Stripe,
        KEY_WANTED,
    ))?;
    Ok(Arc::new(StripeProvider::new(
        StripeSettings {
            base_url: settings::url(&r.base_url, "https://api.stripe.com")?,
            account: r.account,
            mode,
            metadata_field: r.metadata_field.unwrap_or_else(|| "idempotency_key".into()),
            visibility_lag_secs: r.visibility_lag_secs.unwrap_or(60.0),
            max_call_secs: r.max_call_secs.unwrap_or(60.0),
            skew_secs: r.skew_secs.unwrap_or(300.0),
            // Stripe allows 100 req/s live per account, shared with checkout: take a small
            // slice by default.
            rate_per_sec: r.rate_per_sec.unwrap_or(5.0),
            list_objects,
            upper_bound: r.upper_bound.unwrap_or(true),
            use_search: r.use_search.unwrap_or(true),
            // Stripe: "searchable in less than a minute. Occasionally ... up to an hour
            // behind during outages": a miss counts after the hour.
            search_lag_secs: settings::nonnegative("search_lag_secs", r.search_lag_secs, 3600.0)?,
            use_events: r.use_events.unwrap_or(true),
            // An application clock a few hours off (a time zone taken for UTC) or a payment
            // made the same day still falls inside.
            witness_span_secs: settings::nonnegative(
                "witness_span_secs",
                r.witness_span_secs,
                86_400.0,
            )?,
            event_types: r.event_types.unwrap_or_default(),
            max_pages: r.max_pages.unwrap_or(200),
        },
        key,
        client,
    )))
}

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
    /// How far search's index may lag behind (Stripe: under a minute, up to an hour during
    /// outages): its miss witnesses absence only once the listed span is this much older.
    pub search_lag_secs: f64,
    pub use_events: bool,
    /// How far either side of the effect's window the events are read for the creating
    /// request's idempotency key: an application clock off by less than this, or a payment
    /// made this much later, is still seen.
    pub witness_span_secs: f64,
    /// The event types the guarded call emits; with none configured an events miss proves
    /// nothing.
    pub event_types: Vec<String>,
    pub max_pages: u32,
}

pub struct StripeProvider {
    s: StripeSettings,
    key: SecretString,
    client: GetClient,
    /// The complete reads of this provider's lists, shared by its lookups (a provider is
    /// one tenant's account: nothing is shared between tenants).
    mirror: tokio::sync::Mutex<Mirror>,
    /// The same for its events, keyed by the creating request's idempotency key.
    events: tokio::sync::Mutex<Mirror>,
    /// The route's calibration against the application's known outcomes, when measured.
    calibration: std::sync::Mutex<Option<crate::Calibration>>,
    /// The application's keys this provider has met: those it was asked about and those of
    /// the effects recorded as done the calibration was given. An event carrying one shows
    /// the account's events carry the application's keys.
    known_keys: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// What one lookup carries from request to request.
struct Run {
    /// Every object came from the configured mode (`livemode`).
    verified: bool,
    /// The provider said not to go on (401/403, `Stripe-Should-Retry: false`): nothing
    /// more is sent for this lookup.
    stopped: bool,
}

impl StripeProvider {
    pub fn new(s: StripeSettings, key: SecretString, client: GetClient) -> Self {
        StripeProvider {
            s,
            key,
            client,
            mirror: Default::default(),
            events: Default::default(),
            known_keys: Default::default(),
            calibration: Default::default(),
        }
    }

    fn current_calibration(&self) -> Option<crate::Calibration> {
        self.calibration
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
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

    /// The account's pace, shared by every lookup and listing of the process. The
    /// account is who the key belongs to: two tenants' accounts on the same base URL keep
    /// two budgets (the key is only ever held here as its digest).
    fn account_pace(&self) -> Option<std::sync::Arc<crate::Pace>> {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(self.key.expose_secret().as_bytes());
        let account_key = format!(
            "stripe|{}|{}|{}|{}",
            self.s.base_url,
            self.s.account.as_deref().unwrap_or("-"),
            self.s.mode,
            digest
                .iter()
                .take(16)
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        self.client.budget(&account_key, self.s.rate_per_sec)
    }

    async fn get(
        &self,
        path: &str,
        query: &[(String, String)],
        step: &mut Step,
        run: &mut Run,
    ) -> Option<Value> {
        if run.stopped {
            step.fault = Some(Fault::new(
                FaultKind::Unsupported,
                "not sent: the provider refused an earlier request of this lookup for good",
            ));
            return None;
        }
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
        let pace = self.account_pace();
        if let Some(p) = &pace {
            p.until_ready().await;
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
            if f.kind == FaultKind::RateLimited
                && let Some(p) = &pace
            {
                p.rate_limited();
            }
            if f.retry == crate::RetryAdvice::DoNotRetry {
                run.stopped = true;
            }
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

    /// Map a Stripe object to where its money stands; `Err` when it lacks what every
    /// object has or its status is not one Stripe documents.
    fn object(&self, v: &Value, confirmed: bool, run: &mut Run) -> Result<ProviderObject, Fault> {
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
            run.verified = false;
        }
        let mut status = v["status"].as_str().map(str::to_owned);
        let st = status.clone().unwrap_or_default();
        let text = |p: &str| v.pointer(p).and_then(Value::as_str).map(str::to_owned);
        let (group, money, failure, amount) = match kind {
            "payment_intent" => {
                let error = text("/last_payment_error/decline_code")
                    .or_else(|| text("/last_payment_error/code"))
                    .or_else(|| text("/last_payment_error/message"))
                    .or_else(|| {
                        v["last_payment_error"]
                            .is_object()
                            .then(|| "declined".into())
                    });
                let (money, failure) = match st.as_str() {
                    "succeeded" => (Money::Moved, None),
                    "processing"
                    | "requires_action"
                    | "requires_confirmation"
                    | "requires_capture" => (Money::Pending, None),
                    "canceled" => (
                        Money::None,
                        Some(
                            text("/cancellation_reason")
                                .map_or_else(|| "canceled".into(), |r| format!("canceled: {r}")),
                        ),
                    ),
                    // Back in requires_payment_method after a declined attempt: that
                    // attempt moved no money. Without one, nobody has tried to pay yet and
                    // someone still may.
                    "requires_payment_method" => match error {
                        Some(e) => (Money::None, Some(format!("declined: {e}"))),
                        None => (Money::Pending, None),
                    },
                    other => return Err(malformed(&format!("PaymentIntent status {other:?}"))),
                };
                let amount = if money == Money::Moved {
                    v["amount_received"]
                        .as_i64()
                        .filter(|a| *a > 0)
                        .or(v["amount"].as_i64())
                } else {
                    v["amount"].as_i64()
                };
                (id.clone(), money, failure, amount)
            }
            "charge" => {
                let captured = v["captured"].as_bool().unwrap_or(true);
                let (money, failure) = match st.as_str() {
                    "succeeded" if captured => (Money::Moved, None),
                    // Authorised, then released (the authorization expired or was
                    // canceled): refunded in full without being captured.
                    "succeeded" if v["refunded"].as_bool() == Some(true) => {
                        status = Some("authorization released".into());
                        (Money::None, Some("authorization released".into()))
                    }
                    "succeeded" => {
                        // Authorised only: the money is held, not moved.
                        status = Some("authorized".into());
                        (Money::Pending, None)
                    }
                    "pending" => (Money::Pending, None),
                    "failed" => (
                        Money::None,
                        Some(format!(
                            "failed: {}",
                            text("/failure_code")
                                .or_else(|| text("/outcome/reason"))
                                .unwrap_or_else(|| "declined".into())
                        )),
                    ),
                    other => return Err(malformed(&format!("charge status {other:?}"))),
                };
                (
                    v["payment_intent"].as_str().unwrap_or(&id).to_owned(),
                    money,
                    failure,
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
            money,
            confirmed,
            amount_refunded: v["amount_refunded"]
                .as_i64()
                .or(v["latest_charge"]["amount_refunded"].as_i64())
                .filter(|a| *a > 0),
            failure,
            disputed: v["disputed"].as_bool() == Some(true)
                || v["latest_charge"]["disputed"].as_bool() == Some(true),
        })
    }

    fn matches(&self, v: &Value, key: &str) -> bool {
        v["metadata"][self.s.metadata_field.as_str()].as_str() == Some(key)
    }

    /// Search hits are leads: the index lags and may hold an old version of the object.
    async fn search(&self, what: &str, q: &LookupQuery, run: &mut Run) -> Step {
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
            .get(&format!("v1/{what}/search"), &params, &mut step, run)
            .await
        else {
            return step;
        };
        if let Some(data) = v["data"].as_array() {
            for item in data.iter().filter(|i| self.matches(i, &q.key)) {
                match self.object(item, false, run) {
                    Ok(o) => step.objects.push(o),
                    Err(f) => {
                        step.fault = Some(f);
                        return step;
                    }
                }
            }
            step.complete = v["has_more"].as_bool() == Some(false);
            // A key has a few payments, and one page holds a hundred hits: more pages (or
            // none said) means this view of the key is partial, and its miss vouches for
            // nothing. A fault, so that no other witness stands in for it.
            if !step.complete {
                step.fault = Some(Fault::new(
                    FaultKind::Truncated,
                    "search answered with more hits than one page (or no has_more): the \
                     key's view is partial",
                ));
            }
        } else {
            step.fault = Some(Fault::new(
                FaultKind::Malformed,
                "search result without data",
            ));
        }
        step
    }

    /// Read one object as it is now: the only read whose answer decides.
    async fn retrieve(&self, id: &str, run: &mut Run) -> Step {
        let path = if id.starts_with("pi_") {
            format!("v1/payment_intents/{id}")
        } else {
            format!("v1/charges/{id}")
        };
        let mut step = Step::new("stripe.retrieve", Consistency::Strong, None);
        // A retrieve by id answers for that id only; its miss says nothing about the key.
        step.proves_absence = false;
        step.key_indexed = false;
        // A PaymentIntent comes with its latest charge, which says what was refunded.
        let expand = if id.starts_with("pi_") {
            vec![("expand[]".to_owned(), "latest_charge".to_owned())]
        } else {
            Vec::new()
        };
        if let Some(v) = self.get(&path, &expand, &mut step, run).await {
            match self.object(&v, true, run) {
                Ok(o) if o.id == id => {
                    step.objects.push(o);
                    step.complete = true;
                }
                Ok(o) => {
                    step.fault = Some(Fault::new(
                        FaultKind::Malformed,
                        format!("asked for {id}, answered {}", o.id),
                    ));
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
    /// an object (a lead: list items are confirmed by a retrieve). Complete only at
    /// `has_more: false`.
    async fn list(
        &self,
        method: &str,
        path: &str,
        window: (f64, f64),
        extra: &[(String, String)],
        run: &mut Run,
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
            let Some(v) = self.get(path, &params, &mut step, run).await else {
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
                    match self.object(&obj, false, run) {
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

/// Whole seconds of `created`, inclusive.
type Span = (i64, i64);

/// The complete reads of one provider's lists, shared by its lookups (a reconcile run
/// builds the tenant's providers once and looks up every due effect with them). On a
/// busy account a list per effect reads the same payments again and again (100 payments a
/// second is 30,000 objects in a 5-minute window); the mirror remembers which spans of
/// `created` were read to `has_more: false`, and which of their objects carry a key in the
/// metadata field. An object's `created` never changes and a new object is created now, so
/// a span that ended before its read began stays complete; the objects it holds are leads
/// (each lookup reads its own payments as they are now).
#[derive(Default)]
struct Mirror {
    /// Sorted, disjoint, merged.
    covered: Vec<Span>,
    /// Key -> (created, object, when its page was read) of every listed object that
    /// carries one.
    by_key: HashMap<String, Vec<(i64, Value, f64)>>,
    objects: usize,
    /// The Request-Ids of the pages that read each span: a certificate resting on the
    /// mirror names the responses it rests on, whichever lookup read them.
    reads: Vec<(Span, Vec<String>)>,
    /// The object types on which a listed object carried a key (`payment_intent`,
    /// `charge`): where this account's application puts its keys.
    keyed: std::collections::BTreeSet<String>,
    /// Objects listed (keyed or not, every source) and seconds of `created` read whole,
    /// for the account's density: how far a read ahead may reach for about one page.
    listed: u64,
    listed_secs: u64,
}

/// Objects a mirror keeps before it forgets its oldest spans.
const MIRROR_MAX_OBJECTS: usize = 200_000;

/// The objects a read ahead aims to add to each list (a page holds 100): most of a page,
/// so that it rarely costs a page of its own.
const READ_AHEAD_OBJECTS: f64 = 80.0;
/// However sparse the account, a read ahead reaches at most an hour past the gap.
const READ_AHEAD_MAX_SECS: f64 = 3600.0;
/// The newest seconds of an events span that a lookup may leave to a later read, when what
/// was read already reaches past when reckon saw the row: the newest second is always
/// missing (every lookup of a run would otherwise read one page for it), and a minute more
/// of it is as if the visibility lag were a minute longer.
const TAIL_SLACK_SECS: i64 = 60;

/// How a mirror read reaches beyond what one lookup asks for.
#[derive(Debug, Clone, Copy)]
enum Reach {
    /// The lists: objects as they are now (a final one settles its payment, see
    /// [`settled_in_list`]), each gap read ahead by about a page at the density seen.
    Lists,
    /// The events: snapshots of the past, never settling. `need` is how far the read must
    /// reach for the witness (the window's end, or when reckon saw the row if later); a
    /// tail past it younger than [`TAIL_SLACK_SECS`] is left to a later read.
    Events { need: f64 },
}

/// How long a list page's word on an object in a final state stands for reading the
/// object itself: within a reconcile run, the lookups that share a page come seconds
/// apart, and a final state does not change (a refund later only adds to it).
const LIST_FRESH_SECS: f64 = 60.0;

/// Whether a listed object's page was read recently enough, and it is in a state final
/// enough, to stand for reading the object itself.
fn fresh(v: &Value, read_at: f64) -> bool {
    settled_in_list(v) && crate::now() - read_at <= LIST_FRESH_SECS
}

/// One listed object that carries a key: the key, `created`, the object, when its page was
/// read.
type Listed = (String, i64, Value, f64);

/// Whether a listed object, as its page showed it, answers for its payment as reading it
/// would: a charge that moved money (captured; it carries its own refunds and dispute), a
/// charge without a PaymentIntent that failed, a PaymentIntent canceled, or succeeded and
/// listed with its latest charge (which carries the refunds and dispute). Anything that can
/// still change (pending, authorised only, awaiting a payment method), a succeeded
/// PaymentIntent without its charge, and a failed charge of a PaymentIntent (another
/// attempt may have paid it) is read itself.
fn settled_in_list(v: &Value) -> bool {
    match (v["object"].as_str(), v["status"].as_str()) {
        (Some("charge"), Some("succeeded")) => v["captured"].as_bool().unwrap_or(true),
        (Some("charge"), Some("failed")) => v["payment_intent"].as_str().is_none(),
        (Some("payment_intent"), Some("canceled")) => true,
        (Some("payment_intent"), Some("succeeded")) => v["latest_charge"].is_object(),
        _ => false,
    }
}

impl Mirror {
    /// The parts of `want` not covered yet.
    fn gaps(&self, want: Span) -> Vec<Span> {
        let mut out = Vec::new();
        let mut from = want.0;
        for &(a, b) in &self.covered {
            if b < from {
                continue;
            }
            if a > want.1 {
                break;
            }
            if a > from {
                out.push((from, a - 1));
            }
            from = from.max(b + 1);
            if from > want.1 {
                return out;
            }
        }
        if from <= want.1 {
            out.push((from, want.1));
        }
        out
    }

    fn add(&mut self, span: Span, found: Vec<Listed>, listed: u64, request_ids: Vec<String>) {
        self.listed += listed;
        self.listed_secs += (span.1 - span.0 + 1).unsigned_abs();
        for (key, created, v, read_at) in found {
            if let Some(t) = v["object"].as_str()
                && !self.keyed.contains(t)
            {
                self.keyed.insert(t.to_owned());
            }
            let list = self.by_key.entry(key).or_default();
            let id = v["id"].as_str().map(str::to_owned);
            if !list
                .iter()
                .any(|(_, o, _)| o["id"].as_str() == id.as_deref())
            {
                list.push((created, v, read_at));
                self.objects += 1;
            }
        }
        self.reads.push((span, request_ids));
        self.covered.push(span);
        self.covered.sort();
        let mut merged: Vec<Span> = Vec::with_capacity(self.covered.len());
        for (a, b) in self.covered.drain(..) {
            match merged.last_mut() {
                Some(last) if a <= last.1 + 1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        self.covered = merged;
        while self.objects > MIRROR_MAX_OBJECTS && !self.covered.is_empty() {
            let (_, cut) = self.covered.remove(0);
            let mut left = 0;
            self.by_key.retain(|_, v| {
                v.retain(|(c, _, _)| *c > cut);
                left += v.len();
                !v.is_empty()
            });
            self.objects = left;
            self.reads.retain(|(span, _)| span.1 > cut);
        }
    }

    /// The key's objects created in `span`, each with when its page was read.
    fn found(&self, key: &str, span: Span) -> Vec<(Value, f64)> {
        self.by_key
            .get(key)
            .into_iter()
            .flatten()
            .filter(|(c, _, _)| *c >= span.0 && *c <= span.1)
            .map(|(_, v, at)| (v.clone(), *at))
            .collect()
    }

    /// How many seconds past a gap a read may reach and still cost about one more page of
    /// each list, at the density this account has shown: the lookups of a run that come
    /// next (effects created seconds later) find their windows read. Nothing before the
    /// first read shows the density (an account listing a hundred payments a second would
    /// make a blind read ahead cost pages by the hundred).
    fn read_ahead_secs(&self, sources: usize) -> i64 {
        if self.listed_secs == 0 {
            return 0;
        }
        let per_sec = self.listed as f64 / (self.listed_secs as f64 * sources.max(1) as f64);
        let secs = if per_sec > 0.0 {
            READ_AHEAD_OBJECTS / per_sec
        } else {
            READ_AHEAD_MAX_SECS
        };
        secs.clamp(0.0, READ_AHEAD_MAX_SECS) as i64
    }

    /// Where the next span read whole after `at` begins, if any.
    fn next_covered_after(&self, at: i64) -> Option<i64> {
        self.covered.iter().map(|s| s.0).find(|&a| a > at)
    }

    /// The Request-Ids of the pages that read any part of `span`.
    fn request_ids(&self, span: Span) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for (s, ids) in &self.reads {
            if s.1 >= span.0 && s.0 <= span.1 {
                for id in ids {
                    if !out.contains(id) {
                        out.push(id.clone());
                    }
                }
            }
        }
        out
    }
}

/// One list endpoint a mirror reads: the step method, the path, and extra parameters.
struct Source {
    method: String,
    path: String,
    extra: Vec<(String, String)>,
}

/// What a mirrored list keeps of one listed item: the key it carries and the object that
/// is a lead for it.
type Extract<'a> = &'a (dyn Fn(&Value) -> Option<(String, Value)> + Sync);

impl StripeProvider {
    /// L2 for one key over `window`: the gaps of the account's mirror are listed (every
    /// configured list, every page), and the key's objects come from the mirror.
    async fn mirrored_lists(&self, key: &str, window: (f64, f64), run: &mut Run) -> Step {
        let s = &self.s;
        let sources: Vec<Source> = s
            .list_objects
            .iter()
            .map(|what| Source {
                method: format!("stripe.list.{what}"),
                path: format!("v1/{what}"),
                // A PaymentIntent listed with its latest charge says what was refunded or
                // disputed, as its retrieve does: a succeeded one needs no second read.
                extra: if what == "payment_intents" {
                    vec![("expand[]".to_owned(), "data.latest_charge".to_owned())]
                } else {
                    Vec::new()
                },
            })
            .collect();
        let field = s.metadata_field.as_str();
        let extract = move |item: &Value| {
            item["metadata"][field]
                .as_str()
                .map(|k| (k.to_owned(), item.clone()))
        };
        let method = format!("stripe.list.{}", s.list_objects.join("+"));
        self.mirrored(
            &self.mirror,
            &method,
            &sources,
            &extract,
            Reach::Lists,
            key,
            window,
            run,
        )
        .await
    }

    /// Events whose creating request carried the key, over `window`, through the events'
    /// own mirror. Their objects are snapshots from when each event happened: leads.
    /// `need`: how far the span read must reach (see [`Reach::Events`]).
    async fn mirrored_events(
        &self,
        key: &str,
        window: (f64, f64),
        need: f64,
        run: &mut Run,
    ) -> Step {
        let extra: Vec<(String, String)> = self
            .s
            .event_types
            .iter()
            .map(|t| ("types[]".to_owned(), t.clone()))
            .collect();
        let sources = [Source {
            method: "stripe.events".into(),
            path: "v1/events".into(),
            extra,
        }];
        let extract = |ev: &Value| {
            ev["request"]["idempotency_key"]
                .as_str()
                .map(|k| (k.to_owned(), ev["data"]["object"].clone()))
        };
        self.mirrored(
            &self.events,
            "stripe.events",
            &sources,
            &extract,
            Reach::Events { need },
            key,
            window,
            run,
        )
        .await
    }

    /// One key's objects over `window` from a mirror: the spans no earlier lookup of this
    /// provider read whole are listed now (every source, every page), and the key's
    /// objects come from the mirror. With `settles` (the lists, read as objects are now;
    /// not the events, whose objects are snapshots of the past), an object in a final state
    /// from a page read a moment ago answers for its payment.
    #[expect(
        clippy::too_many_arguments,
        reason = "one read of a mirror: which mirror, what to list, what to keep, for which key and span"
    )]
    async fn mirrored(
        &self,
        mirror: &tokio::sync::Mutex<Mirror>,
        method: &str,
        sources: &[Source],
        extract: Extract<'_>,
        reach: Reach,
        key: &str,
        window: (f64, f64),
        run: &mut Run,
    ) -> Step {
        let settles = matches!(reach, Reach::Lists);
        let mut want = (window.0.floor() as i64, window.1.ceil() as i64);
        let mut m = mirror.lock().await;
        // The events' newest seconds, when what was read already reaches far enough: left
        // to a later read, and the step says the span it did read.
        if let Reach::Events { need } = reach
            && let Some(&(tail, _)) = m.gaps(want).last()
            && want.1 - tail < TAIL_SLACK_SECS
            && (tail - 1) as f64 >= need
            && m.gaps((want.0, tail - 1)).is_empty()
        {
            want.1 = tail - 1;
        }
        let mut step = Step::new(
            method,
            Consistency::Strong,
            Some((window.0, window.1.min(want.1 as f64))),
        );
        step.key_indexed = false;
        for gap in m.gaps(want) {
            // A span is complete up to when its read began, less the visibility lag: later
            // objects are created now, and one created within the lag may not be listed
            // yet. The mirror remembers the span as read, so a later lookup whose window
            // ends there (and is past its own lag) would trust a read that could not have
            // shown its payment.
            let began = crate::now().floor() as i64 - 1;
            let visible = began - self.s.visibility_lag_secs.ceil() as i64;
            let mut gap = (gap.0, gap.1.min(visible));
            if gap.0 > gap.1 {
                continue;
            }
            // The last gap of the lists reads ahead, up to the next span already read.
            if settles && gap.1 == want.1 {
                let ahead = m.read_ahead_secs(sources.len());
                let until = m.next_covered_after(gap.1).map_or(i64::MAX, |a| a - 1);
                gap.1 = (gap.1 + ahead).min(until).min(visible).max(gap.1);
            }
            let found = std::sync::Mutex::new(Vec::new());
            let listed = std::sync::atomic::AtomicU64::new(0);
            let mut ids = Vec::new();
            for src in sources {
                let found = &found;
                let listed = &listed;
                let pick = move |item: &Value| {
                    listed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if let (Some((k, obj)), Some(c)) = (extract(item), item["created"].as_i64()) {
                        found
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .push((k, c, obj, crate::now()));
                    }
                    None
                };
                let st = self
                    .list(
                        &src.method,
                        &src.path,
                        (gap.0 as f64, gap.1 as f64),
                        &src.extra,
                        run,
                        &pick,
                    )
                    .await;
                step.pages += st.pages;
                step.request_ids.extend(st.request_ids.iter().cloned());
                ids.extend(st.request_ids);
                if st.fault.is_some() || !st.complete {
                    step.fault = st
                        .fault
                        .or_else(|| Some(Fault::new(FaultKind::Truncated, "a list stopped early")));
                    // The pages read before the failure, and the spans read whole before,
                    // still name leads; this span is not remembered as read.
                    let partial = std::mem::take(
                        &mut *found
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner),
                    );
                    let leads = partial
                        .into_iter()
                        .filter(|(k, c, _, _)| k == key && *c >= want.0 && *c <= want.1)
                        .map(|(_, _, v, at)| (v, at))
                        .chain(m.found(key, want));
                    for (v, at) in leads {
                        if let Ok(o) = self.object(&v, settles && fresh(&v, at), run) {
                            step.objects.push(o);
                        }
                    }
                    return step;
                }
            }
            m.add(
                gap,
                found
                    .into_inner()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
                listed.into_inner(),
                ids,
            );
        }
        // Complete only when every second of the window was read once it and the
        // visibility lag had passed: a window that reaches into the future is read again
        // once it is past.
        step.complete = m.gaps(want).is_empty();
        // The pages this answer rests on, whichever lookup read them.
        for id in m.request_ids(want) {
            if !step.request_ids.contains(&id) {
                step.request_ids.push(id);
            }
        }
        for (v, at) in m.found(key, want) {
            match self.object(&v, settles && fresh(&v, at), run) {
                Ok(o) => step.objects.push(o),
                Err(f) => {
                    step.fault = Some(f);
                    return step;
                }
            }
        }
        step
    }

    /// Whether the lists have seen any object of this account carry a key under the
    /// configured metadata field.
    async fn field_in_use(&self) -> bool {
        !self.mirror.lock().await.keyed.is_empty()
    }

    /// Whether this account's events are seen to carry the application's keys as their
    /// creating requests' idempotency keys: an event read carried a key that its own
    /// object or a listed one carries under the metadata field, that reckon was asked
    /// about, or that an effect recorded as done has. Or neither an event nor any listed
    /// object was read: then no payment was made there, whatever key it would have carried.
    async fn events_carry_keys(&self) -> bool {
        let events = self.events.lock().await;
        let lists = self.mirror.lock().await;
        // Nothing at all: neither an event of the configured types nor any listed object
        // (an application on the Charges API has no PaymentIntent events, but its charges
        // are listed).
        if events.listed == 0 && lists.listed == 0 {
            return true;
        }
        let known = self
            .known_keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let field = self.s.metadata_field.as_str();
        events.by_key.iter().any(|(k, objects)| {
            lists.by_key.contains_key(k)
                || known.contains(k)
                || objects
                    .iter()
                    .any(|(_, o, _)| o["metadata"][field].as_str() == Some(k.as_str()))
        })
    }

    /// Whether the keys of this account were seen on PaymentIntents only (so a search of
    /// charges would find nothing a search of PaymentIntents does not).
    async fn keys_on_payment_intents_only(&self) -> bool {
        let m = self.mirror.lock().await;
        m.keyed.len() == 1 && m.keyed.contains("payment_intent")
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

/// Payment groups read as they are now that moved money.
fn confirmed_moved(r: &LookupReport) -> usize {
    let groups: std::collections::BTreeSet<&str> = r
        .steps
        .iter()
        .flat_map(|s| &s.objects)
        .filter(|o| o.confirmed && o.money == Money::Moved)
        .map(|o| o.group.as_str())
        .collect();
    groups.len()
}

/// A step that read a strongly consistent, absence-proving method to its end.
fn clean_complete(st: &Step) -> bool {
    st.complete && st.fault.is_none() && st.proves_absence && st.consistency == Consistency::Strong
}

#[async_trait::async_trait]
impl crate::Provider for StripeProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Stripe
    }

    fn replay_window_secs(&self) -> Option<f64> {
        Some(REPLAY_WINDOW_SECS)
    }

    fn pace(&self) -> Option<std::sync::Arc<crate::Pace>> {
        self.account_pace()
    }

    async fn list_charges(
        &self,
        from: f64,
        to: f64,
    ) -> Result<crate::listing::ChargeListing, crate::listing::ListingFailure> {
        self.list_window(from, to).await
    }

    /// The ladder: the recorded id (read itself), then the complete check (the lists of
    /// the effect's window, matched on metadata), then the key-indexed methods that see a
    /// payment wherever and whenever it was made (events by the creating request's key
    /// over a wider span, through their own mirror; search by metadata over both object
    /// types, when no strong witness agreed or the lists did not come back whole); finally
    /// every lead is read itself. It stops early only when two payments that moved money
    /// are confirmed (a duplicate needs no more), or when the provider refuses for good.
    async fn lookup(&self, q: &LookupQuery) -> LookupReport {
        let s = &self.s;
        self.known_keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(q.key.clone());
        let calibration = self.current_calibration();
        let widen = calibration.as_ref().map_or(0.0, |c| c.widen_secs);
        let (effect_window, window) = self.windows(q, widen);
        let mut report = LookupReport {
            provider_kind: ProviderKind::Stripe,
            provider_key: q.key.clone(),
            account: s.account.clone(),
            mode: Some(s.mode.clone()),
            account_verified: false,
            effect_window,
            visibility_lag_secs: s.visibility_lag_secs,
            index_lag_secs: s.search_lag_secs,
            steps: Vec::new(),
            checked_at: q.now,
            observed_at: q.observed_at,
            calibration,
        };
        if self.key_mode() != Some(s.mode.as_str()) {
            let mut step = Step::new("stripe.config", Consistency::Strong, None);
            step.key_indexed = false;
            step.fault = Some(Fault::new(
                FaultKind::Config,
                format!("the key's prefix does not match mode {:?}", s.mode),
            ));
            report.steps.push(step);
            return report;
        }
        let mut run = Run {
            verified: true,
            stopped: false,
        };
        // L0: ids the application recorded, read as they are now.
        for id in recorded_ids(q.response_json.as_deref()) {
            if run.stopped {
                break;
            }
            let st = self.retrieve(&id, &mut run).await;
            report.steps.push(st);
        }
        let mut whole = false;
        // L2: the complete check, through the account's mirror: only the parts of the
        // window no earlier lookup of this process read whole are listed now. The lists
        // make one step: absence (and uniqueness) needs every one of them read to its end.
        if confirmed_moved(&report) < 2 && !run.stopped && !s.list_objects.is_empty() {
            let st = self.mirrored_lists(&q.key, window, &mut run).await;
            whole = clean_complete(&st);
            report.steps.push(st);
        }
        // L1: events carrying the key as their creating request's idempotency key, over the
        // window widened by the witness span and cut to Stripe's 30 days. With the guarded
        // call's event types configured, a whole read is a witness (and, without lists, the
        // complete check); their objects are snapshots from when each event happened: leads.
        let mut witnessed = false;
        let span = self.witness_span(q, window);
        if confirmed_moved(&report) < 2
            && !run.stopped
            && s.use_events
            && let Some(span) = span
        {
            // The read must reach the list window's end and when reckon saw the row.
            let need = q.observed_at.map_or(window.1, |o| o.max(window.1));
            let mut st = self.mirrored_events(&q.key, span, need, &mut run).await;
            // Only a span that covers the whole list window (skew included) can stand for it.
            // And only on an account whose events are seen to carry the application's
            // keys: one that sends Stripe other idempotency keys (or none) has events that
            // never carry this one, paid or not.
            st.proves_absence = !s.event_types.is_empty()
                && st.window.is_some_and(|(_, b)| b >= window.1)
                && self.events_carry_keys().await;
            st.key_indexed = st.proves_absence;
            let clean = clean_complete(&st);
            whole |= clean && s.list_objects.is_empty();
            witnessed = clean && st.key_indexed;
            report.steps.push(st);
        }
        // L3: search by metadata, whatever `created` says and on both object types (the
        // application may put its key on an object the lists do not read). Its hits are
        // leads; its miss, once past the index's lag, is a witness.
        if confirmed_moved(&report) < 2 && !run.stopped && s.use_search && (!whole || !witnessed) {
            // The listed types first: a provider that refuses for good stops the rest.
            let pi_only = self.keys_on_payment_intents_only().await;
            let mut types: Vec<&str> = s.list_objects.iter().map(String::as_str).collect();
            for what in ["payment_intents", "charges"] {
                if !types.contains(&what) {
                    types.push(what);
                }
            }
            types.retain(|t| *t == "payment_intents" || !pi_only);
            // A search miss says something only if keys live under the field it searches:
            // the lists must have seen this account's objects carry keys under it (in this
            // run, or when the route was calibrated).
            let calibrated = report
                .calibration
                .as_ref()
                .is_some_and(|c| c.status == crate::CalibrationStatus::Calibrated);
            let field_in_use = calibrated || self.field_in_use().await;
            for what in types {
                let mut st = self.search(what, q, &mut run).await;
                st.key_indexed = field_in_use;
                report.steps.push(st);
                if run.stopped {
                    break;
                }
            }
        }
        // Every lead is read as it is now, once per payment (a PaymentIntent answers for
        // its charges). A payment counts as read when the object that speaks for it was
        // read, or a read object of it moved money; a read charge that failed does not
        // answer for its PaymentIntent, which may have been paid by another attempt.
        let objects = || report.steps.iter().flat_map(|st| &st.objects);
        let mut read: std::collections::BTreeSet<String> = objects()
            .filter(|o| o.confirmed && (o.id == o.group || o.money == Money::Moved))
            .map(|o| o.group.clone())
            .collect();
        let mut leads: Vec<String> = objects()
            .filter(|o| !read.contains(&o.group))
            .map(|o| o.group.clone())
            .collect();
        leads.dedup();
        for group in leads {
            if run.stopped || confirmed_moved(&report) >= 2 {
                break;
            }
            if !read.insert(group.clone()) {
                continue;
            }
            let st = self.retrieve(&group, &mut run).await;
            report.steps.push(st);
        }
        report.account_verified = run.verified;
        report
    }

    fn calibrates(&self) -> bool {
        true
    }

    async fn calibrate(&self, samples: &[LookupQuery]) -> Option<crate::Calibration> {
        let c = self.measure(samples).await;
        *self
            .calibration
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(c.clone());
        Some(c)
    }

    fn set_calibration(&self, calibration: crate::Calibration) {
        *self
            .calibration
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(calibration);
    }
}

impl StripeProvider {
    /// The effect's own window (`created_at` to the end of its call), and the window the
    /// lists read: skew either side, and `widen` more (from the calibration).
    fn windows(&self, q: &LookupQuery, widen: f64) -> ((f64, f64), (f64, f64)) {
        let s = &self.s;
        let end = q.updated_at.max(q.expires_at.unwrap_or(q.updated_at)) + s.max_call_secs;
        let start = q.created_at - s.skew_secs - widen;
        ((q.created_at, end), (start, end + s.skew_secs + widen))
    }

    /// The span the events are read over: the list window widened by the witness span,
    /// cut to what is past plus the visibility lag (so the span is read whole as it will
    /// stay) and to Stripe's 30 days. `None` when nothing of it is left.
    fn witness_span(&self, q: &LookupQuery, window: (f64, f64)) -> Option<(f64, f64)> {
        let oldest = q.now - EVENTS_WINDOW_SECS + 3600.0;
        let from = (window.0 - self.s.witness_span_secs).max(oldest);
        let to = (window.1 + self.s.witness_span_secs)
            .min(q.now.floor() - self.s.visibility_lag_secs - 1.0);
        (from <= to).then_some((from, to))
    }

    /// Hold the configured lookup against effects the application recorded as done: the
    /// lists of each one's window, as configured, through the mirror; for those the lists
    /// miss, search by key (it finds an object whatever its `created` and type) to learn
    /// why. A route whose observed offsets exceed its skew is widened to them; one that
    /// still misses more than the threshold allows is uncalibrated.
    async fn measure(&self, samples: &[LookupQuery]) -> crate::Calibration {
        let s = &self.s;
        self.known_keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend(samples.iter().map(|q| q.key.clone()));
        let mut run = Run {
            verified: true,
            stopped: false,
        };
        let mut offsets: Vec<f64> = Vec::new();
        let (mut found, mut elsewhere, mut elsewhere_listed) = (0, 0, 0);
        let mut unlisted_types: std::collections::BTreeSet<String> = Default::default();
        // Searches are rate-limited apart (20 a second for the account): a few misses say
        // enough about why; the other misses are listed again over the widened window.
        let mut searches_left = 10;
        let mut faults = 0;
        let mut unsearched: Vec<&LookupQuery> = Vec::new();
        let mut nowhere = 0;
        // Samples looked at: a provider that refused for good stops the measure, and the
        // samples never asked count neither way.
        let mut asked = 0;
        for q in samples {
            if run.stopped {
                break;
            }
            asked += 1;
            let (_, window) = self.windows(q, 0.0);
            let st = self.mirrored_lists(&q.key, window, &mut run).await;
            if st.fault.is_some() || !st.complete {
                faults += 1;
                continue;
            }
            if let Some(c) = st.objects.iter().filter_map(|o| o.created).reduce(f64::min) {
                found += 1;
                offsets.push(c - q.created_at);
                continue;
            }
            if searches_left < 2 {
                unsearched.push(q);
                continue;
            }
            let mut hit: Option<ProviderObject> = None;
            for what in ["payment_intents", "charges"] {
                searches_left -= 1;
                let st = self.search(what, q, &mut run).await;
                if let Some(o) = st.objects.into_iter().next() {
                    hit = Some(o);
                    break;
                }
            }
            match hit {
                Some(o) => {
                    elsewhere += 1;
                    if let Some(c) = o.created {
                        offsets.push(c - q.created_at);
                    }
                    let list = format!("{}s", o.object);
                    if s.list_objects.contains(&list) {
                        elsewhere_listed += 1;
                    } else {
                        unlisted_types.insert(list);
                    }
                }
                None => nowhere += 1,
            }
        }
        let max_abs = offsets.iter().map(|o| o.abs()).fold(0.0, f64::max);
        // The window already reaches skew before `created_at` and max_call + skew after
        // the recorded end: widen only by what the offsets exceed, with a minute to spare.
        let needed = if max_abs > s.skew_secs {
            (max_abs - s.skew_secs + 60.0).ceil()
        } else {
            0.0
        };
        // An offset beyond the witness span is no clock that is off (or the provider's
        // answer is wrong): a window that wide would list the account's history for every
        // lookup. Not widened; the route is uncalibrated and says why.
        let too_far = needed > s.witness_span_secs;
        let widen = if too_far { 0.0 } else { needed };
        // The misses not searched, listed over the window as it will be read.
        let mut missed = 0;
        for q in unsearched {
            let (_, window) = self.windows(q, widen);
            let st = self.mirrored_lists(&q.key, window, &mut run).await;
            if st.fault.is_some() || !st.complete {
                faults += 1;
            } else if let Some(c) = st.objects.iter().filter_map(|o| o.created).reduce(f64::min) {
                elsewhere_listed += 1;
                elsewhere += 1;
                offsets.push(c - q.created_at);
            } else {
                missed += 1;
            }
        }
        missed += nowhere;
        let measured = asked - faults;
        offsets.sort_by(f64::total_cmp);
        let pct = |p: f64| {
            offsets
                .get(((offsets.len() as f64 - 1.0) * p).round().max(0.0) as usize)
                .copied()
                .unwrap_or(0.0)
        };
        let found_as_widened = found + elsewhere_listed;
        let share = if measured == 0 {
            0.0
        } else {
            found_as_widened as f64 / measured as f64
        };
        let (status, reason) = if too_far && measured >= crate::CALIBRATION_MIN_SAMPLES {
            (
                crate::CalibrationStatus::Uncalibrated,
                format!(
                    "the provider's times were up to {max_abs:.0} s from the recorded ones, \
                     beyond the {:.0} s a window is widened to (witness_span_secs): is the \
                     application's clock that far off, or the key reused?",
                    s.witness_span_secs
                ),
            )
        } else if measured < crate::CALIBRATION_MIN_SAMPLES {
            (
                crate::CalibrationStatus::Unmeasured,
                format!(
                    "{measured} effects recorded as done to measure against, {} needed",
                    crate::CALIBRATION_MIN_SAMPLES
                ),
            )
        } else if share >= crate::CALIBRATION_THRESHOLD {
            (
                crate::CalibrationStatus::Calibrated,
                if widen > 0.0 {
                    format!(
                        "found {found_as_widened} of {measured} effects recorded as done; the \
                         provider's times were up to {max_abs:.0} s from the recorded ones, so \
                         the window is widened by {widen:.0} s"
                    )
                } else {
                    format!("found {found_as_widened} of {measured} effects recorded as done")
                },
            )
        } else {
            let mut why = vec![format!(
                "the lookup as configured (lists {}, metadata field {:?}) found {} of {} \
                 effects the application recorded as done",
                s.list_objects.join("+"),
                s.metadata_field,
                found_as_widened,
                measured
            )];
            if !unlisted_types.is_empty() {
                why.push(format!(
                    "{} carry the key on {}, which the lists do not read: add them to \
                     list_objects",
                    elsewhere - elsewhere_listed,
                    unlisted_types.into_iter().collect::<Vec<_>>().join(", ")
                ));
            }
            if missed > 0 {
                why.push(format!(
                    "{missed} were found nowhere under metadata[{:?}]: is the key under \
                     another field (metadata_field), or the key template wrong?",
                    s.metadata_field
                ));
            }
            (crate::CalibrationStatus::Uncalibrated, why.join("; "))
        };
        crate::Calibration {
            status,
            samples: measured,
            found: found_as_widened,
            found_elsewhere: elsewhere,
            offset_p50_secs: pct(0.5),
            offset_p99_secs: pct(0.99),
            offset_max_abs_secs: max_abs,
            widen_secs: widen,
            reason,
            measured_at: crate::now(),
        }
    }
}

// The audit: listing a day of charges.

use crate::listing::{ChargeListing, ListedCharge, ListingFailure, PageEvidence, fail};
use std::collections::BTreeMap;

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
            if let Some(md) = c.payment.as_ref().and_then(|pi| pi_metadata.get(pi)) {
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
            let mut run = Run {
                verified: true,
                stopped: false,
            };
            let Some(v) = self.get(path, &params, &mut step, &mut run).await else {
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
        // Stripe's charge statuses are `succeeded`, `pending` and `failed`; a succeeded
        // charge not captured is authorised only: no money has moved yet.
        let status = match status.as_str() {
            "succeeded" if captured => ChargeStatus::Paid,
            "succeeded" => ChargeStatus::Authorized,
            "failed" => ChargeStatus::Failed,
            _ => ChargeStatus::Pending,
        };
        Ok(ListedCharge {
            payment: text("payment_intent"),
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
