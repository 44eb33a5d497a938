//! A Stripe-shaped provider world, served over real HTTP on loopback, for the tests and
//! soaks that judge reckon's verdicts against the truth.
//!
//! The world holds payments with the lifecycle they have at Stripe: a PaymentIntent is
//! created (`requires_payment_method`), attempts are declined (a `failed` charge, the
//! PaymentIntent back in `requires_payment_method` with `last_payment_error`), succeed, sit
//! in `processing`, `requires_action` or `requires_capture` until they settle, are
//! canceled, refunded. What the HTTP surface shows of them is what Stripe shows:
//!
//! - retrieve (`/v1/payment_intents/{id}`, `/v1/charges/{id}`): the object as it is now
//!   (`expand[]=latest_charge` embeds the PaymentIntent's latest charge);
//! - lists (`/v1/payment_intents`, `/v1/charges`, `/v1/events`): newest first, `created`
//!   filters, `limit` capped by the world's page size, `starting_after`, `has_more`
//!   (`expand[]=data.latest_charge` embeds each PaymentIntent's latest charge);
//! - events: `payment_intent.created` carries the PaymentIntent as it was at creation
//!   and the creating request's idempotency key; later events carry later snapshots;
//! - search: only payments that reached the index, as the index saw them (at creation);
//! - `Request-Id` on every answer, `livemode: false` on every object;
//! - the provider's own rate limit (429 with `Stripe-Rate-Limited-Reason`) when set;
//! - a fault schedule by request number: 5xx, 429 with and without
//!   `Stripe-Should-Retry: false`, 401, a reset connection, a timeout, a body cut off,
//!   malformed JSON, `has_more` without a cursor.
//!
//! Every request is logged with its method and arrival time, so a test can check that
//! only GETs were sent and that no sliding second held more than a budget.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How one payment lives. Pending lives show their pending state until [`Sim::settle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Life {
    /// One captured charge.
    Succeeded,
    /// One failed charge; the PaymentIntent back in `requires_payment_method`.
    Declined,
    /// A failed charge, then a captured one, on the same PaymentIntent.
    DeclinedThenSucceeded,
    /// Canceled before any charge.
    Canceled,
    /// Captured, then refunded in full: money moved all the same.
    Refunded,
    /// Captured, then disputed by the cardholder (a chargeback).
    Disputed,
    /// `processing` until it settles.
    Processing { succeeds: bool },
    /// `requires_capture` (an authorization) until captured, or canceled when it expires.
    Authorized { captured: bool },
    /// `requires_action` (3-D Secure) until the customer finishes or gives up.
    RequiresAction { succeeds: bool },
}

impl Life {
    /// Whether money moved once everything settled.
    pub fn moves_money(self) -> bool {
        match self {
            Life::Succeeded | Life::DeclinedThenSucceeded | Life::Refunded | Life::Disputed => true,
            Life::Declined | Life::Canceled => false,
            Life::Processing { succeeds } | Life::RequiresAction { succeeds } => succeeds,
            Life::Authorized { captured } => captured,
        }
    }

    fn pending(self) -> bool {
        matches!(
            self,
            Life::Processing { .. } | Life::Authorized { .. } | Life::RequiresAction { .. }
        )
    }
}

#[derive(Debug, Clone)]
pub struct PaymentSpec {
    pub life: Life,
    pub amount: i64,
    /// Seconds after the effect's `created_at`.
    pub offset: f64,
    /// Whether search's index has it yet.
    pub indexed: bool,
}

#[derive(Debug, Clone)]
pub struct EffectSpec {
    pub key: String,
    pub created_at: f64,
    pub updated_at: f64,
    /// What the application stored in the effect's response before it died, when it got
    /// that far.
    pub recorded: Recorded,
    pub payments: Vec<PaymentSpec>,
}

/// An id the application kept in its response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    Nothing,
    /// The first PaymentIntent's id.
    PaymentIntent,
    /// The first charge's id (a declined first attempt's, perhaps).
    Charge,
}

/// What really happened to an effect, once every payment settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Truth {
    Applied,
    NotApplied,
    Duplicate,
}

impl Truth {
    pub fn as_str(self) -> &'static str {
        match self {
            Truth::Applied => "applied",
            Truth::NotApplied => "not_applied",
            Truth::Duplicate => "duplicate",
        }
    }
}

impl EffectSpec {
    pub fn truth(&self) -> Truth {
        match self
            .payments
            .iter()
            .filter(|p| p.life.moves_money())
            .count()
        {
            0 => Truth::NotApplied,
            1 => Truth::Applied,
            _ => Truth::Duplicate,
        }
    }
}

/// A failure the server answers instead of the real answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Status500,
    Status502,
    /// 429, rate limited, with `Stripe-Rate-Limited-Reason`.
    RateLimited,
    /// 429 with `Stripe-Should-Retry: false`.
    RateLimitedDoNotRetry,
    Unauthorized,
    /// The connection is reset before any answer.
    Reset,
    /// No answer within this many milliseconds; then the connection closes.
    Timeout(u64),
    /// The body is cut off half-way (the declared length is not sent).
    Truncated,
    /// A 200 whose body is not JSON.
    Malformed,
    /// A list page with `has_more: true` and no item to continue from.
    HasMoreWithoutCursor,
}

#[derive(Debug, Clone)]
pub struct WorldConfig {
    /// Items per list page at most, whatever `limit` asks.
    pub page_size: usize,
    /// Payments of other keys in the same window (they fill the list pages).
    pub noise: usize,
    /// The provider's own limit, requests per second (429 above it).
    pub server_rate_limit: Option<f64>,
    /// The metadata field the application puts its key under (the world need not match
    /// reckon's configuration).
    pub metadata_field: String,
    /// The application also puts the key on each charge (the Charges API way); Stripe
    /// does not copy a PaymentIntent's metadata to its charges.
    pub keys_on_charges: bool,
    /// The application sends its key as the creating request's `Idempotency-Key`, so the
    /// events that request caused carry it as `request.idempotency_key`.
    pub request_keys: bool,
    /// A payment that is not `indexed` reaches search's index this long after it was
    /// created; `None`: never (an index lagging past any bound).
    pub index_lag_secs: Option<f64>,
    /// An object reaches the lists (payments, charges, events) this long after it was
    /// created; retrieving it by id finds it at once. Stripe's lists are eventually
    /// consistent: what a read cannot show yet, it may show a moment later.
    pub list_lag_secs: f64,
}

impl Default for WorldConfig {
    fn default() -> Self {
        WorldConfig {
            page_size: 100,
            noise: 0,
            server_rate_limit: None,
            metadata_field: "idempotency_key".into(),
            keys_on_charges: false,
            request_keys: true,
            index_lag_secs: None,
            list_lag_secs: 0.0,
        }
    }
}

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Logged {
    pub method: String,
    pub target: String,
    pub at: Instant,
    /// The status answered (0 for a reset or a timeout).
    pub status: u16,
}

struct Charge {
    id: String,
    ok: bool,
    created: f64,
}

struct Payment {
    pi: String,
    key: String,
    life: Life,
    amount: i64,
    created: f64,
    indexed: bool,
    charges: Vec<Charge>,
}

/// What a snapshot shows of a payment.
#[derive(Clone, Copy, PartialEq)]
enum View {
    /// As it was when created.
    Created,
    /// As it is now.
    Now { settled: bool },
}

impl Payment {
    fn status(&self, view: View) -> &'static str {
        let settled = match view {
            View::Created => return "requires_payment_method",
            View::Now { settled } => settled,
        };
        match self.life {
            Life::Succeeded | Life::DeclinedThenSucceeded | Life::Refunded | Life::Disputed => {
                "succeeded"
            }
            Life::Declined => "requires_payment_method",
            Life::Canceled => "canceled",
            l if l.pending() && !settled => match l {
                Life::Processing { .. } => "processing",
                Life::Authorized { .. } => "requires_capture",
                _ => "requires_action",
            },
            l if l.moves_money() => "succeeded",
            // An authorization that was never captured expires and is canceled.
            Life::Authorized { .. } => "canceled",
            // A failed bank debit or a 3-D Secure check the customer did not pass.
            _ => "requires_payment_method",
        }
    }

    /// The charges that exist in this view, with their status and capture.
    fn charges(&self, view: View) -> Vec<(&Charge, &'static str, bool)> {
        let settled = match view {
            View::Created => return Vec::new(),
            View::Now { settled } => settled,
        };
        self.charges
            .iter()
            .filter_map(|c| {
                if !c.ok {
                    return Some((c, "failed", false));
                }
                match self.life {
                    Life::Processing { succeeds } if !settled || succeeds => {
                        Some((c, if settled { "succeeded" } else { "pending" }, settled))
                    }
                    Life::Processing { .. } => Some((c, "failed", false)),
                    Life::Authorized { captured } => Some((c, "succeeded", settled && captured)),
                    Life::RequiresAction { .. } if !settled => None,
                    _ => Some((c, "succeeded", true)),
                }
            })
            .collect()
    }

    fn pi_json(&self, view: View, field: &str) -> Value {
        let status = self.status(view);
        let charges = self.charges(view);
        let declined = charges.iter().any(|(_, s, _)| *s == "failed");
        let last_error = if status != "requires_payment_method" {
            None
        } else if declined {
            Some(json!({"type": "card_error", "code": "card_declined",
                        "decline_code": "insufficient_funds"}))
        } else if matches!(self.life, Life::RequiresAction { .. }) && view != View::Created {
            Some(json!({"type": "invalid_request_error",
                        "code": "payment_intent_authentication_failure"}))
        } else {
            None
        };
        let received = if status == "succeeded" {
            self.amount
        } else {
            0
        };
        json!({
            "id": self.pi,
            "object": "payment_intent",
            "amount": self.amount,
            "amount_received": received,
            "currency": "usd",
            "created": self.created as i64,
            "livemode": false,
            "metadata": {field: self.key},
            "status": status,
            "latest_charge": charges.last().map(|(c, _, _)| c.id.clone()),
            "last_payment_error": last_error,
            "cancellation_reason": (status == "canceled").then_some("automatic"),
        })
    }

    fn charge_json(
        &self,
        c: &Charge,
        status: &str,
        captured: bool,
        view: View,
        keyed: Option<&str>,
    ) -> Value {
        // A refund, or an authorization released when it expired (Stripe refunds the
        // uncaptured amount).
        let refunded =
            (self.life == Life::Refunded && status == "succeeded" && view != View::Created)
                || (self.life == Life::Authorized { captured: false }
                    && view == View::Now { settled: true });
        json!({
            "id": c.id,
            "object": "charge",
            "amount": self.amount,
            "amount_captured": if captured { self.amount } else { 0 },
            "amount_refunded": if refunded { self.amount } else { 0 },
            "refunded": refunded,
            "disputed": self.life == Life::Disputed && status == "succeeded",
            "captured": captured,
            "currency": "usd",
            "created": c.created as i64,
            "livemode": false,
            "metadata": keyed.map_or_else(|| json!({}), |f| json!({f: self.key})),
            "payment_intent": self.pi,
            "status": status,
            "failure_code": (status == "failed").then_some("card_declined"),
        })
    }
}

struct State {
    payments: Vec<Payment>,
    cfg: WorldConfig,
    settled: bool,
    faults: HashMap<usize, Fault>,
    faults_on: bool,
    log: Vec<Logged>,
    /// Arrivals inside the last second, for the provider's own rate limit.
    recent: std::collections::VecDeque<Instant>,
}

/// A running world. Dropping it stops the server.
pub struct Sim {
    pub base_url: String,
    state: Arc<Mutex<State>>,
    counter: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Sim {
    /// Serve `effects`' payments (and `cfg.noise` payments of other keys) on a free
    /// loopback port.
    pub async fn start(effects: &[EffectSpec], cfg: WorldConfig) -> std::io::Result<Sim> {
        let mut payments = Vec::new();
        let mut n = 0;
        let mut next = || {
            n += 1;
            n
        };
        for e in effects {
            for p in &e.payments {
                let pi = format!("pi_{:06}", next());
                let created = e.created_at + p.offset;
                let charge = |ok: bool, n: usize, at: f64| Charge {
                    id: format!("ch_{n:06}"),
                    ok,
                    created: at,
                };
                let charges = match p.life {
                    Life::Canceled | Life::RequiresAction { .. } => {
                        if let Life::RequiresAction { succeeds: true } = p.life {
                            vec![charge(true, next(), created + 1.0)]
                        } else {
                            Vec::new()
                        }
                    }
                    Life::Declined => vec![charge(false, next(), created + 1.0)],
                    Life::DeclinedThenSucceeded => vec![
                        charge(false, next(), created + 1.0),
                        charge(true, next(), created + 2.0),
                    ],
                    _ => vec![charge(true, next(), created + 1.0)],
                };
                payments.push(Payment {
                    pi,
                    key: e.key.clone(),
                    life: p.life,
                    amount: p.amount,
                    created,
                    indexed: p.indexed,
                    charges,
                });
            }
        }
        let (lo, hi) = effects
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), e| {
                (a.min(e.created_at), b.max(e.updated_at))
            });
        for i in 0..cfg.noise {
            let at = if lo.is_finite() {
                lo + (hi - lo + 1.0) * (i as f64 + 0.5) / cfg.noise as f64
            } else {
                0.0
            };
            let pi = format!("pi_{:06}", next());
            let ch = format!("ch_{:06}", next());
            payments.push(Payment {
                pi,
                key: format!("noise:v1:{i}"),
                life: Life::Succeeded,
                amount: 100,
                created: at,
                indexed: true,
                charges: vec![Charge {
                    id: ch,
                    ok: true,
                    created: at + 1.0,
                }],
            });
        }
        let state = Arc::new(Mutex::new(State {
            payments,
            cfg,
            settled: false,
            faults: HashMap::new(),
            faults_on: true,
            log: Vec::new(),
            recent: Default::default(),
        }));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let counter = Arc::new(AtomicUsize::new(0));
        let (st, ct) = (state.clone(), counter.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(connection(stream, st.clone(), ct.clone()));
            }
        });
        Ok(Sim {
            base_url: format!("http://{addr}/"),
            state,
            counter,
            task,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Answer request number `n` (counted from 0, in arrival order) with `fault`.
    pub fn fault_at(&self, n: usize, fault: Fault) {
        self.lock().faults.insert(n, fault);
    }

    /// Requests answered so far (the next request's number).
    pub fn requests_so_far(&self) -> usize {
        self.counter.load(Ordering::SeqCst)
    }

    /// No scheduled fault is answered from now on.
    pub fn faults_off(&self) {
        self.lock().faults_on = false;
    }

    /// Every pending payment reaches its end state.
    pub fn settle(&self) {
        self.lock().settled = true;
    }

    pub fn log(&self) -> Vec<Logged> {
        self.lock().log.clone()
    }

    /// Requests that were not GETs.
    pub fn non_get(&self) -> usize {
        self.lock().log.iter().filter(|l| l.method != "GET").count()
    }

    /// The most requests that arrived within any one second.
    pub fn busiest_second(&self) -> usize {
        busiest(&self.lock().log, Duration::from_secs(1))
    }
}

/// The most log entries inside any window of length `w` (closed at both ends).
pub fn busiest(log: &[Logged], w: Duration) -> usize {
    let mut at: Vec<Instant> = log.iter().map(|l| l.at).collect();
    at.sort();
    let mut best = 0;
    let mut lo = 0;
    for hi in 0..at.len() {
        while at[hi].duration_since(at[lo]) > w {
            lo += 1;
        }
        best = best.max(hi - lo + 1);
    }
    best
}

async fn connection(mut stream: TcpStream, state: Arc<Mutex<State>>, counter: Arc<AtomicUsize>) {
    // An answer goes out in one write, without waiting for the peer's delayed ACK.
    let _ = stream.set_nodelay(true);
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(k) => buf.extend_from_slice(&chunk[..k]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        buf.drain(..head_end);
        let mut parts = head.lines().next().unwrap_or("").split(' ');
        let method = parts.next().unwrap_or("").to_owned();
        let target = parts.next().unwrap_or("/").to_owned();
        let n = counter.fetch_add(1, Ordering::SeqCst);
        let at = Instant::now();
        let (fault, answer) = {
            let mut st = state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let fault = st.faults.get(&n).copied().filter(|_| st.faults_on);
            let limited = st.cfg.server_rate_limit.is_some_and(|limit| {
                while st
                    .recent
                    .front()
                    .is_some_and(|t| at.duration_since(*t) > Duration::from_secs(1))
                {
                    st.recent.pop_front();
                }
                st.recent.push_back(at);
                st.recent.len() as f64 > limit
            });
            let answer = if method != "GET" {
                (
                    405,
                    json!({"error": {"message": "reckon only reads"}}),
                    vec![],
                )
            } else if limited {
                (
                    429,
                    json!({"error": {"type": "rate_limit_error", "message": "Too many requests"}}),
                    vec![("Stripe-Rate-Limited-Reason", "global-rate")],
                )
            } else {
                answer(&st, &target)
            };
            let status = match fault {
                Some(Fault::Reset | Fault::Timeout(_)) => 0,
                Some(Fault::Status500) => 500,
                Some(Fault::Status502) => 502,
                Some(Fault::RateLimited | Fault::RateLimitedDoNotRetry) => 429,
                Some(Fault::Unauthorized) => 401,
                _ => answer.0,
            };
            st.log.push(Logged {
                method: method.clone(),
                target: target.clone(),
                at,
                status,
            });
            (fault, answer)
        };
        let rid = format!("req_{n:06}");
        let (status, body, extra): (u16, String, Vec<(&str, &str)>) = match fault {
            None => (answer.0, answer.1.to_string(), answer.2),
            Some(Fault::Reset) => {
                let _ = stream.set_zero_linger();
                return;
            }
            Some(Fault::Timeout(ms)) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                return;
            }
            Some(Fault::Status500) => (500, err("api_error"), vec![]),
            Some(Fault::Status502) => (502, "<html>Bad gateway</html>".into(), vec![]),
            Some(Fault::RateLimited) => (
                429,
                err("rate_limit_error"),
                vec![("Stripe-Rate-Limited-Reason", "global-rate")],
            ),
            Some(Fault::RateLimitedDoNotRetry) => (
                429,
                err("rate_limit_error"),
                vec![("Stripe-Should-Retry", "false")],
            ),
            Some(Fault::Unauthorized) => (401, err("invalid_request_error"), vec![]),
            Some(Fault::Truncated) => {
                let full = answer.1.to_string();
                let head = response_head(200, full.len(), &rid, &[]);
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(&full.as_bytes()[..full.len() / 2]).await;
                let _ = stream.shutdown().await;
                return;
            }
            Some(Fault::Malformed) => (200, "{\"object\": \"list\", \"data\": [".into(), vec![]),
            Some(Fault::HasMoreWithoutCursor) => (
                200,
                json!({"object": "list", "data": [], "has_more": true}).to_string(),
                vec![],
            ),
        };
        let mut out = response_head(status, body.len(), &rid, &extra);
        out.push_str(&body);
        if stream.write_all(out.as_bytes()).await.is_err() {
            return;
        }
    }
}

fn err(kind: &str) -> String {
    json!({"error": {"type": kind, "message": format!("simulated {kind}")}}).to_string()
}

fn response_head(status: u16, len: usize, rid: &str, extra: &[(&str, &str)]) -> String {
    let mut h = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len}\r\nRequest-Id: {rid}\r\n"
    );
    for (k, v) in extra {
        h.push_str(&format!("{k}: {v}\r\n"));
    }
    h.push_str("\r\n");
    h
}

fn not_found(what: &str) -> (u16, Value, Vec<(&'static str, &'static str)>) {
    (
        404,
        json!({"error": {"type": "invalid_request_error", "code": "resource_missing",
                         "message": format!("No such {what}")}}),
        vec![],
    )
}

/// The real answer to a GET.
fn answer(st: &State, target: &str) -> (u16, Value, Vec<(&'static str, &'static str)>) {
    let Ok(url) = url::Url::parse(&format!("http://sim{target}")) else {
        return not_found("path");
    };
    let q: Vec<(String, String)> = url.query_pairs().into_owned().collect();
    let param = |k: &str| q.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let now = View::Now {
        settled: st.settled,
    };
    // An object created later than now does not exist yet: a payment made after a lookup
    // is not in that lookup's answers.
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let field = st.cfg.metadata_field.as_str();
    let charge_key = st.cfg.keys_on_charges.then_some(field);
    let payments = || st.payments.iter().filter(move |p| p.created <= wall);
    fn visible(p: &Payment, now: View, wall: f64) -> Vec<(&Charge, &'static str, bool)> {
        p.charges(now)
            .into_iter()
            .filter(|(c, _, _)| c.created <= wall)
            .collect()
    }
    let charges_of = |p| visible(p, now, wall);
    let path: Vec<&str> = url.path().trim_matches('/').split('/').collect();
    match path.as_slice() {
        ["v1", what @ ("payment_intents" | "charges"), "search"] => {
            // Search matches the field it is asked about: a key under another name is not
            // found.
            let asked = param("query").and_then(search_field_key);
            let index_lag = st.cfg.index_lag_secs;
            let hit = |p: &Payment| {
                (p.indexed || index_lag.is_some_and(|l| p.created + l <= wall))
                    && asked
                        .as_ref()
                        .is_some_and(|(f, k)| f == field && *k == p.key)
            };
            let data: Vec<Value> = if *what == "payment_intents" {
                payments()
                    .filter(|p| hit(p))
                    .map(|p| p.pi_json(View::Created, field))
                    .collect()
            } else if charge_key.is_some() {
                payments()
                    .filter(|p| hit(p))
                    .flat_map(|p| {
                        charges_of(p)
                            .into_iter()
                            .map(|(c, s, cap)| p.charge_json(c, s, cap, View::Created, charge_key))
                            .collect::<Vec<_>>()
                    })
                    .collect()
            } else {
                Vec::new()
            };
            (
                200,
                json!({"object": "search_result", "data": data, "has_more": false, "next_page": null}),
                vec![],
            )
        }
        ["v1", "payment_intents", id] => match payments().find(|p| p.pi == *id) {
            Some(p) => {
                let mut v = p.pi_json(now, field);
                let expand = q
                    .iter()
                    .any(|(k, v)| k == "expand[]" && v == "latest_charge");
                if expand && let Some((c, s, cap)) = charges_of(p).last().copied() {
                    v["latest_charge"] = p.charge_json(c, s, cap, now, charge_key);
                }
                (200, v, vec![])
            }
            None => not_found("payment_intent"),
        },
        ["v1", "charges", id] => {
            for p in payments() {
                for (c, s, cap) in charges_of(p) {
                    if c.id == *id {
                        return (200, p.charge_json(c, s, cap, now, charge_key), vec![]);
                    }
                }
            }
            not_found("charge")
        }
        ["v1", what @ ("payment_intents" | "charges" | "events")] => {
            let mut items: Vec<(f64, String, Value)> = Vec::new();
            for p in payments() {
                match *what {
                    "payment_intents" => {
                        let mut v = p.pi_json(now, field);
                        let expand = q
                            .iter()
                            .any(|(k, v)| k == "expand[]" && v == "data.latest_charge");
                        if expand && let Some((c, s, cap)) = charges_of(p).last().copied() {
                            v["latest_charge"] = p.charge_json(c, s, cap, now, charge_key);
                        }
                        items.push((p.created, p.pi.clone(), v));
                    }
                    "charges" => {
                        for (c, s, cap) in charges_of(p) {
                            items.push((
                                c.created,
                                c.id.clone(),
                                p.charge_json(c, s, cap, now, charge_key),
                            ));
                        }
                    }
                    _ => {
                        let types: Vec<&str> = q
                            .iter()
                            .filter(|(k, _)| k == "types[]" || k == "type")
                            .map(|(_, v)| v.as_str())
                            .collect();
                        let request_key = st.cfg.request_keys.then(|| p.key.clone());
                        let mut evs = vec![(
                            p.created,
                            "payment_intent.created",
                            p.pi_json(View::Created, field),
                            request_key,
                        )];
                        let status = p.status(now);
                        let kind = match status {
                            "succeeded" => Some("payment_intent.succeeded"),
                            "canceled" => Some("payment_intent.canceled"),
                            "requires_payment_method" if !charges_of(p).is_empty() => {
                                Some("payment_intent.payment_failed")
                            }
                            "processing" => Some("payment_intent.processing"),
                            "requires_capture" => Some("payment_intent.amount_capturable_updated"),
                            _ => None,
                        };
                        if let Some(k) = kind
                            && p.created + 3.0 <= wall
                        {
                            evs.push((p.created + 3.0, k, p.pi_json(now, field), None));
                        }
                        for (i, (at, kind, obj, key)) in evs.into_iter().enumerate() {
                            if !types.is_empty() && !types.contains(&kind) {
                                continue;
                            }
                            let pi = p.pi.strip_prefix("pi_").unwrap_or(&p.pi);
                            let id = format!("evt_{pi}_{i}");
                            items.push((
                                at,
                                id.clone(),
                                json!({"id": id, "object": "event", "type": kind,
                                       "created": at as i64, "livemode": false,
                                       "data": {"object": obj},
                                       "request": {"id": format!("req_c{pi}"),
                                                   "idempotency_key": key}}),
                            ));
                        }
                    }
                }
            }
            let listed_by = wall - st.cfg.list_lag_secs;
            items.retain(|(c, _, _)| *c <= listed_by);
            list(st, &q, items)
        }
        _ => not_found("path"),
    }
}

/// One page of a list: newest first, filtered by `created`, after `starting_after`.
fn list(
    st: &State,
    q: &[(String, String)],
    mut items: Vec<(f64, String, Value)>,
) -> (u16, Value, Vec<(&'static str, &'static str)>) {
    let num = |k: &str| {
        q.iter()
            .find(|(n, _)| n == k)
            .and_then(|(_, v)| v.parse::<f64>().ok())
    };
    items.retain(|(c, _, _)| {
        let c = c.floor();
        num("created[gte]").is_none_or(|b| c >= b)
            && num("created[gt]").is_none_or(|b| c > b)
            && num("created[lte]").is_none_or(|b| c <= b)
            && num("created[lt]").is_none_or(|b| c < b)
    });
    items.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| b.1.cmp(&a.1)));
    if let Some((_, after)) = q.iter().find(|(k, _)| k == "starting_after") {
        match items.iter().position(|(_, id, _)| id == after) {
            Some(i) => {
                items.drain(..=i);
            }
            None => return not_found("starting_after object"),
        }
    }
    let limit = num("limit").map_or(10, |l| l as usize).clamp(1, 100);
    let size = limit.min(st.cfg.page_size.max(1));
    let has_more = items.len() > size;
    let data: Vec<Value> = items.into_iter().take(size).map(|(_, _, v)| v).collect();
    (
        200,
        json!({"object": "list", "url": "/v1/...", "data": data, "has_more": has_more}),
        vec![],
    )
}

/// The field and value of `metadata["FIELD"]:"VALUE"` in a search query.
fn search_field_key(query: &str) -> Option<(String, String)> {
    let open = query.find("metadata[\"")? + 10;
    let close = open + query.get(open..)?.find("\"]")?;
    let field = query.get(open..close)?.to_owned();
    let start = query.find("]:\"")? + 3;
    let rest = query.get(start..)?;
    let end = rest.rfind('"')?;
    let key = rest.get(..end)?.replace("\\\"", "\"").replace("\\\\", "\\");
    Some((field, key))
}

/// A world of `n` effects drawn from `seed`, for soaks (the tests draw theirs with
/// proptest). Every payment carries its key in metadata, as reckon's list check assumes.
pub fn random_world(seed: u64, n: usize, base: f64) -> Vec<EffectSpec> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let created_at = base + i as f64 * 7.0;
            let k = rng.random_range(0..4usize);
            let payments = (0..k)
                .map(|j| PaymentSpec {
                    life: match rng.random_range(0..10) {
                        0 => Life::Declined,
                        1 => Life::DeclinedThenSucceeded,
                        2 => Life::Canceled,
                        3 if rng.random() => Life::Refunded,
                        3 => Life::Disputed,
                        4 => Life::Processing {
                            succeeds: rng.random(),
                        },
                        5 => Life::Authorized {
                            captured: rng.random(),
                        },
                        6 => Life::RequiresAction {
                            succeeds: rng.random(),
                        },
                        _ => Life::Succeeded,
                    },
                    amount: rng.random_range(100..10_000),
                    offset: 0.5 + j as f64,
                    indexed: rng.random(),
                })
                .collect();
            EffectSpec {
                key: format!("charge:v1:ORD-{seed}-{i}"),
                created_at,
                updated_at: created_at + 5.0,
                recorded: match rng.random_range(0..3) {
                    0 => Recorded::Nothing,
                    1 => Recorded::PaymentIntent,
                    _ => Recorded::Charge,
                },
                payments,
            }
        })
        .collect()
}

impl Sim {
    /// The response the application recorded for `e`, as a justonce response would hold
    /// it.
    pub fn recorded_response(&self, e: &EffectSpec) -> Option<String> {
        let id = match e.recorded {
            Recorded::Nothing => return None,
            Recorded::PaymentIntent => self.payment_ids(&e.key).into_iter().next()?,
            Recorded::Charge => self.charge_ids(&e.key).into_iter().next()?,
        };
        let field = if id.starts_with("pi_") {
            "payment_intent"
        } else {
            "id"
        };
        Some(json!({ field: id }).to_string())
    }

    /// The charge ids of the effect with `key`, in creation order.
    pub fn charge_ids(&self, key: &str) -> Vec<String> {
        self.lock()
            .payments
            .iter()
            .filter(|p| p.key == key)
            .flat_map(|p| p.charges.iter().map(|c| c.id.clone()))
            .collect()
    }

    /// The PaymentIntent ids made for the effect with `key`, in creation order.
    pub fn payment_ids(&self, key: &str) -> Vec<String> {
        self.lock()
            .payments
            .iter()
            .filter(|p| p.key == key)
            .map(|p| p.pi.clone())
            .collect()
    }
}
