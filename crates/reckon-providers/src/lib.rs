//! Provider adapters: they ask a provider (Stripe, an in-house HTTP endpoint, the built-in
//! demo) what happened to one effect, and report what they saw, step by step, without
//! judging it. The judgement lives in one place, [`classify::classify`]: every path that
//! is not a complete, successful answer is `indeterminate`.
//!
//! Adapters are read-only by construction: their only HTTP type, [`client::GetClient`],
//! cannot send anything but a GET.

pub mod classify;
pub mod client;
pub mod demo;
pub mod http;
pub mod listing;
pub mod registry;
pub mod settings;
pub mod stripe;

pub use classify::{Certificate, Classification, classify};
pub use client::{AddressPolicy, GetClient, Pace};
// The redactor is pure and the ledger scrubs stored answers with it too.
pub use reckon_domain::redact::{self, Redactor};
pub use reckon_domain::{Outcome, ProviderKind};
pub use registry::{Adapter, adapter};
pub use settings::{SettingsError, build_provider, provider_key};

use serde::{Deserialize, Serialize};

/// Where a payment stands with the money. The verdict is decided on this, never on the
/// mere existence of an object: a declined attempt is an object too.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Money {
    /// Terminal without money: declined, failed, canceled (an authorization that expired).
    None,
    /// Not settled yet, money may still move: `processing`, `requires_action`,
    /// `requires_confirmation`, `requires_capture` (authorised, not captured), a
    /// PaymentIntent that no payment method was tried on yet.
    Pending,
    /// Money moved (captured). A refund later does not undo that the call happened.
    Moved,
}

/// One object the provider holds (a charge, a PaymentIntent, an in-house record).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProviderObject {
    pub id: String,
    /// `charge`, `payment_intent`, or `object` for the http protocol.
    pub object: String,
    pub status: Option<String>,
    pub amount: Option<i64>,
    pub currency: Option<String>,
    pub created: Option<f64>,
    /// Objects of one payment share a group (a charge belongs to its PaymentIntent), so a
    /// PaymentIntent and its charge are one payment, not a duplicate.
    pub group: String,
    pub money: Money,
    /// Read from the object itself, now, by a strongly consistent method (a retrieve, the
    /// in-house system's own answer), or listed in a state that cannot change any more by
    /// a strongly consistent list page read moments ago. False for leads: an event's
    /// `data.object` (a snapshot from when the event happened), a search hit (an index that
    /// lags), a list item that may still change. Only confirmed objects decide a verdict.
    pub confirmed: bool,
    /// What was given back (refunds), in minor units; the payment still moved money.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount_refunded: Option<i64>,
    /// Why no money moved (a decline code, `canceled`), for the certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// The cardholder disputed it (a chargeback): the money moved all the same, and
    /// finance sees the dispute beside the verdict.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disputed: bool,
}

impl ProviderObject {
    pub fn money_moved(&self) -> bool {
        self.money == Money::Moved
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Consistency {
    /// An ordinary read: what was written is visible (Stripe retrieve, list, events).
    Strong,
    /// An index that lags (Stripe search): a miss proves nothing.
    Eventual,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    Timeout,
    Connection,
    ServerError,
    RateLimited,
    Auth,
    NotFound,
    Malformed,
    Truncated,
    /// The answer was over the size limit and was not read (`max_provider_answer_bytes`).
    TooLarge,
    Unsupported,
    Config,
}

/// How hard to back off after a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryAdvice {
    Normal,
    /// Rate limited with a reason (`Stripe-Rate-Limited-Reason`): back off harder.
    Harder,
    /// The provider said not to retry (`Stripe-Should-Retry: false`), or the request
    /// itself is wrong (auth, configuration): a person must look.
    DoNotRetry,
}

/// Why a step did not give a complete, successful answer.
#[derive(Debug, Clone, Serialize)]
pub struct Fault {
    pub kind: FaultKind,
    pub detail: String,
    pub retry: RetryAdvice,
    pub http_status: Option<u16>,
}

impl Fault {
    pub fn new(kind: FaultKind, detail: impl Into<String>) -> Fault {
        let retry = match kind {
            FaultKind::Auth | FaultKind::NotFound | FaultKind::Config | FaultKind::Unsupported => {
                RetryAdvice::DoNotRetry
            }
            _ => RetryAdvice::Normal,
        };
        Fault {
            kind,
            detail: detail.into(),
            retry,
            http_status: None,
        }
    }
}

/// One method of the lookup ladder, as it went.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    /// e.g. `stripe.list.charges`, `http.lookup`.
    pub method: String,
    pub consistency: Consistency,
    /// The created-time window this step covered; `None` = all time (a lookup by key).
    pub window: Option<(f64, f64)>,
    pub pages: u32,
    /// Every page of the window was read, to the provider's own end marker.
    pub complete: bool,
    pub request_ids: Vec<String>,
    pub objects: Vec<ProviderObject>,
    pub fault: Option<Fault>,
    /// Whether a complete miss of this method can ever prove absence (search: never; events:
    /// only when the guarded call's event types are configured).
    pub proves_absence: bool,
    /// The method finds the key's objects by the key itself, whatever their `created` says
    /// and whichever object type or list holds them (a lookup by key, events by the
    /// creating request's idempotency key, search by metadata). A window list is not: it
    /// sees only the objects created in its window, of the listed types, under the
    /// configured field. Absence read from a window list needs one of these to agree.
    #[serde(default)]
    pub key_indexed: bool,
}

impl Step {
    pub fn new(method: &str, consistency: Consistency, window: Option<(f64, f64)>) -> Step {
        Step {
            method: method.to_owned(),
            consistency,
            window,
            pages: 0,
            complete: false,
            request_ids: Vec::new(),
            objects: Vec::new(),
            fault: None,
            proves_absence: consistency == Consistency::Strong,
            key_indexed: window.is_none(),
        }
    }
}

/// Everything an adapter saw for one effect. Facts only; [`classify`] judges.
#[derive(Debug, Clone, Serialize)]
pub struct LookupReport {
    pub provider_kind: ProviderKind,
    /// The key as the application sent it to the provider (after the key template).
    pub provider_key: String,
    pub account: Option<String>,
    pub mode: Option<String>,
    /// The answers came from the configured account and mode (key prefix and objects'
    /// `livemode` agree with the settings).
    pub account_verified: bool,
    /// The window in which the guarded call could have created something.
    pub effect_window: (f64, f64),
    pub visibility_lag_secs: f64,
    /// How long an eventually consistent, key-indexed method (search) may lag behind: its
    /// miss witnesses absence only once the whole listed span is older than this.
    #[serde(default)]
    pub index_lag_secs: f64,
    pub steps: Vec<Step>,
    pub checked_at: f64,
    /// When reckon saw the row in its current state, by its own clock ([`LookupQuery`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_at: Option<f64>,
    /// What the route's lookup was measured to find among the application's own known
    /// outcomes, when it was measured ([`Calibration`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<Calibration>,
}

/// Whether a route's configured lookup finds what the application itself recorded as done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CalibrationStatus {
    /// Too few known-done effects to say: absence needs a key-indexed witness.
    Unmeasured,
    /// The configured lookup found (nearly) every known-done effect, each inside the window
    /// it reads: a complete window list is a view that would have shown the payment.
    Calibrated,
    /// It missed known-done effects: a miss of this route proves nothing, whatever else
    /// agrees, until its configuration is fixed.
    Uncalibrated,
}

/// The route's lookup held against effects the application recorded as done: the share it
/// finds as configured (lists, object types, metadata field, window), and how far the
/// provider's `created` was from the application's recorded time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Calibration {
    pub status: CalibrationStatus,
    /// Known-done effects looked up.
    pub samples: usize,
    /// Of them, found by the lookup as configured (window widened as below).
    pub found: usize,
    /// Found only by a key-indexed method (outside the window, or on an object the lists
    /// do not read).
    pub found_elsewhere: usize,
    /// Provider `created` minus the application's recorded call time, seconds.
    pub offset_p50_secs: f64,
    pub offset_p99_secs: f64,
    pub offset_max_abs_secs: f64,
    /// Added to both ends of the window, so observed offsets fall inside it.
    pub widen_secs: f64,
    /// Why it is not calibrated, or what was widened, in words.
    pub reason: String,
    pub measured_at: f64,
}

/// Known-done effects a route needs before its calibration says anything.
pub const CALIBRATION_MIN_SAMPLES: usize = 20;
/// The share of known-done effects a calibrated route finds.
pub const CALIBRATION_THRESHOLD: f64 = 0.995;

/// What an adapter is asked about one effect.
#[derive(Debug, Clone)]
pub struct LookupQuery {
    /// The key as sent to the provider (see [`provider_key`]).
    pub key: String,
    pub created_at: f64,
    pub updated_at: f64,
    pub expires_at: Option<f64>,
    /// The response the source recorded, if any (may carry a provider object id).
    pub response_json: Option<String>,
    pub now: f64,
    /// When reckon saw the row in its current state, by reckon's own clock: the call had
    /// ended by then (an `unknown` is written after it), whatever the application's clock
    /// says. `None` when not known (the application's times are taken as they are).
    pub observed_at: Option<f64>,
}

#[async_trait::async_trait]
pub trait Provider: Send + Sync {
    fn kind(&self) -> ProviderKind;
    /// How long after creation the provider keeps an idempotency key (Stripe: 24 h), after
    /// which an application retry with the same key executes again.
    fn replay_window_secs(&self) -> Option<f64>;
    async fn lookup(&self, q: &LookupQuery) -> LookupReport;

    /// The request budget of the account this provider asks, if it has one: the
    /// reconciler tells it how many replicas share it.
    fn pace(&self) -> Option<std::sync::Arc<Pace>> {
        None
    }

    /// Whether its lookup reads windows and so needs [`Provider::calibrate`] (a lookup by
    /// key does not): the reconciler gathers samples only for those.
    fn calibrates(&self) -> bool {
        false
    }

    /// Hold the configured lookup against effects the application recorded as done
    /// (`samples`: their keys and recorded times). `None`: the provider's lookup is by key
    /// and needs no calibration (the http protocol, the demo).
    async fn calibrate(&self, samples: &[LookupQuery]) -> Option<Calibration> {
        let _ = samples;
        None
    }

    /// Use a calibration measured earlier (by this process) for the lookups that follow.
    fn set_calibration(&self, calibration: Calibration) {
        let _ = calibration;
    }

    /// Every money-moving object created in `[from, to)`, read to the provider's end marker,
    /// or the reason it could not be (never a partial window).
    async fn list_charges(
        &self,
        from: f64,
        to: f64,
    ) -> Result<listing::ChargeListing, listing::ListingFailure> {
        let _ = (from, to);
        Err(listing::fail(
            self.kind().as_str(),
            1,
            Fault::new(FaultKind::Unsupported, "this provider cannot list charges"),
            &[],
        ))
    }
}

pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
