//! The only HTTP type adapters have. It wraps one `reqwest::Client` and exposes GET and
//! nothing else, so no code path of a reconciler can send a POST (a replayed POST is not a
//! lookup: it may execute, see `stripe.md` section 1). Budgets are per provider account.

use crate::{Fault, FaultKind};
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// The largest provider answer read unless configured otherwise. Stripe's list pages (100
/// objects, expanded) are well under 1 MiB, an in-house page of 1000 charges about the
/// same: 8 MiB leaves room for fat metadata and refuses what only a broken or hostile
/// provider sends.
pub const DEFAULT_MAX_ANSWER_BYTES: usize = 8 * 1024 * 1024;

/// The process's answer cap (`max_provider_answer_bytes`), read by every client that was
/// not given its own: one provider's answer is held in memory whole while it is parsed,
/// so an unbounded one from one tenant's provider could take the memory of all.
static MAX_ANSWER_BYTES: AtomicUsize = AtomicUsize::new(DEFAULT_MAX_ANSWER_BYTES);

/// Set the process's provider answer cap (at least 1 KiB).
pub fn set_max_answer_bytes(bytes: usize) {
    MAX_ANSWER_BYTES.store(bytes.max(1024), Ordering::Relaxed);
}

/// The process's provider answer cap.
pub fn max_answer_bytes() -> usize {
    MAX_ANSWER_BYTES.load(Ordering::Relaxed)
}

#[derive(Clone)]
pub struct GetClient {
    inner: reqwest::Client,
    /// Where each request's duration and status are counted, with the provider's labels
    /// (`provider_kind`, `provider`). Set per provider by [`GetClient::observed`].
    observer: Option<Observer>,
    timeout: Duration,
    /// The pace of every provider account this client's lookups go to (the process's
    /// client holds the process's paces; a client made with [`GetClient::new`] has its
    /// own, as another process would).
    budgets: Budgets,
    /// This client's answer cap; `None`: the process's ([`max_answer_bytes`]).
    max_answer: Option<usize>,
}

type Budgets = Arc<Mutex<HashMap<String, Arc<Pace>>>>;

/// Where provider lookups may connect (T09): the operator's egress policy, as the HTTP
/// client sees it. Every host name the client connects to is resolved through
/// [`AddressPolicy::addresses`], which answers only addresses that passed the policy (or
/// why none did), so a name that answers a public address to the check before a step and
/// a private one when the connection is made is never connected to the second.
/// (An IP literal in a URL is not resolved: the check before each step judged it, and it
/// cannot change.) `reckon_engine` implements it over `reckon_sources::EgressPolicy`.
pub trait AddressPolicy: Send + Sync + 'static {
    /// The checked addresses of `host`, or a sentence saying why it may not be reached.
    fn addresses(
        &self,
        host: String,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<IpAddr>, String>> + Send + 'static>>;
}

/// reqwest's DNS hook, answering through an [`AddressPolicy`].
struct PolicyResolver(Arc<dyn AddressPolicy>);

impl reqwest::dns::Resolve for PolicyResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let answer = self.0.addresses(name.as_str().to_owned());
        Box::pin(async move {
            type BoxError = Box<dyn std::error::Error + Send + Sync>;
            let ips = match answer.await {
                Ok(ips) if !ips.is_empty() => ips,
                Ok(_) => return Err(BoxError::from("refused by the egress policy: no address")),
                Err(why) => {
                    return Err(BoxError::from(format!(
                        "refused by the egress policy: {why}"
                    )));
                }
            };
            // Port 0: reqwest puts the URL's port (or the scheme's) in its place.
            let addrs: reqwest::dns::Addrs =
                Box::new(ips.into_iter().map(|ip| SocketAddr::new(ip, 0)));
            Ok(addrs)
        })
    }
}

#[derive(Clone)]
struct Observer {
    metrics: reckon_metrics::Metrics,
    kind: crate::ProviderKind,
    provider: String,
}

impl std::fmt::Debug for GetClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GetClient")
    }
}

/// A response, read whole.
#[derive(Debug)]
pub struct GetResponse {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Vec<u8>,
}

impl GetResponse {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }
}

impl GetClient {
    /// The process's client (one connection pool for all lookups): 30 s per request.
    pub fn shared() -> GetClient {
        static CLIENT: OnceLock<GetClient> = OnceLock::new();
        CLIENT
            .get_or_init(|| GetClient::new(Duration::from_secs(30)))
            .clone()
    }

    pub fn new(timeout: Duration) -> GetClient {
        GetClient {
            inner: build(timeout, None),
            observer: None,
            timeout,
            budgets: Budgets::default(),
            max_answer: None,
        }
    }

    /// The same client, refusing answers over `bytes` (instead of the process's cap).
    pub fn with_max_answer_bytes(mut self, bytes: usize) -> GetClient {
        self.max_answer = Some(bytes);
        self
    }

    /// The largest answer this client reads.
    pub fn max_answer_bytes(&self) -> usize {
        self.max_answer.unwrap_or_else(max_answer_bytes)
    }

    /// A client like this one (same timeouts, its own connection pool) whose every host
    /// name is resolved through `policy` (T09): it connects only to addresses the policy
    /// answered. Building one costs a TLS configuration: callers keep it (see
    /// `reckon_engine::provider_client`), they do not make one per request. Counts
    /// nothing: call [`GetClient::observed`] on the result.
    pub fn confined(&self, policy: Arc<dyn AddressPolicy>) -> GetClient {
        GetClient {
            inner: build(self.timeout, Some(Arc::new(PolicyResolver(policy)))),
            observer: None,
            timeout: self.timeout,
            budgets: self.budgets.clone(),
            max_answer: self.max_answer,
        }
    }

    /// The per-request timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The pace of a provider account (`account_key` names it), shared by every lookup
    /// through this client and its confined and observed copies. `rate_per_sec <= 0`
    /// means no budget.
    pub fn budget(&self, account_key: &str, rate_per_sec: f64) -> Option<Arc<Pace>> {
        if rate_per_sec <= 0.0 || !rate_per_sec.is_finite() {
            return None;
        }
        let mut map = self
            .budgets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = format!("{account_key}|{rate_per_sec}");
        Some(
            map.entry(key)
                .or_insert_with(|| Arc::new(Pace::new(account_key, rate_per_sec)))
                .clone(),
        )
    }

    /// The same client (same pool), counting every request in `metrics` under this
    /// provider's labels (`reckon_provider_request_duration_seconds`).
    pub fn observed(
        &self,
        metrics: reckon_metrics::Metrics,
        kind: crate::ProviderKind,
        provider: &str,
    ) -> Self {
        GetClient {
            inner: self.inner.clone(),
            observer: Some(Observer {
                metrics,
                kind,
                provider: provider.to_owned(),
            }),
            timeout: self.timeout,
            budgets: self.budgets.clone(),
            max_answer: self.max_answer,
        }
    }

    /// GET `url`. Transport failures become faults; the URL and headers are never part of
    /// the fault (headers carry secrets).
    pub async fn get(
        &self,
        url: &url::Url,
        headers: &[(&str, &str)],
    ) -> Result<GetResponse, Fault> {
        let started = std::time::Instant::now();
        let result = self.send(url, headers).await;
        if let Some(o) = &self.observer {
            o.metrics.record_provider_request(
                o.kind.as_str(),
                &o.provider,
                status_of(&result),
                started.elapsed(),
            );
        }
        result
    }

    async fn send(&self, url: &url::Url, headers: &[(&str, &str)]) -> Result<GetResponse, Fault> {
        let mut req = self.inner.get(url.clone());
        for (k, v) in headers {
            let mut value = reqwest::header::HeaderValue::from_str(v)
                .map_err(|_| Fault::new(FaultKind::Config, format!("header {k} is not valid")))?;
            value.set_sensitive(true);
            req = req.header(*k, value);
        }
        let mut resp = req.send().await.map_err(transport)?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let cap = self.max_answer_bytes();
        // A declared length over the cap is refused before a byte of the body is read.
        if let Some(declared) = resp.content_length()
            && declared > cap as u64
        {
            return Err(too_large(cap, 0, Some(declared), status));
        }
        // Read chunk by chunk, so an answer over the cap is refused once the cap is passed
        // (the rest is never read: the connection is dropped with the response). The
        // client's timeout bounds the whole read, body included.
        let mut body: Vec<u8> = Vec::new();
        loop {
            let chunk = resp.chunk().await.map_err(|e| {
                let mut f = transport(e);
                if f.kind == FaultKind::Connection {
                    f.kind = FaultKind::Truncated;
                    f.detail = format!("the body was cut off: {}", f.detail);
                }
                f
            })?;
            let Some(chunk) = chunk else { break };
            if body.len() + chunk.len() > cap {
                return Err(too_large(cap, body.len() + chunk.len(), None, status));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(GetResponse {
            status,
            headers,
            body,
        })
    }
}

/// The fault of an answer over the cap: the attempt says nothing about the effect (never
/// a verdict), and says how much was seen so a person can tell a fat page from a hostile
/// answer.
fn too_large(cap: usize, read: usize, declared: Option<u64>, status: u16) -> Fault {
    let seen = match declared {
        Some(n) => format!("its Content-Length says {n} bytes"),
        None => format!("{read} bytes were read before stopping"),
    };
    let mut f = Fault::new(
        FaultKind::TooLarge,
        format!("answer too large: over the limit of {cap} bytes ({seen}; HTTP {status})"),
    );
    f.http_status = Some(status);
    f
}

fn build(timeout: Duration, resolver: Option<Arc<PolicyResolver>>) -> reqwest::Client {
    // rustls is built without a bundled provider (see Cargo.toml); ring is the one the
    // rest of the process (sqlx) already uses. A second install is a harmless no-op.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5).min(timeout))
        .timeout(timeout)
        .pool_idle_timeout(Duration::from_secs(60))
        // T10: a redirect is never followed (reqwest follows up to 10 by default): a
        // provider on an allowed host could otherwise send reckon to 127.0.0.1 or the
        // metadata address. A 3xx is an answer like any other non-2xx: a fault.
        .redirect(reqwest::redirect::Policy::none())
        // T09: no proxy from the environment (HTTP_PROXY, ...): a proxy would resolve and
        // connect to the provider's host itself, past the egress policy.
        .no_proxy()
        .user_agent(concat!("reckon/", env!("CARGO_PKG_VERSION")));
    let builder = match resolver {
        Some(r) => builder.dns_resolver(r),
        None => builder,
    };
    builder
        .build()
        .expect("a reqwest client with rustls and static settings builds")
}

/// The bounded status label of one request (a 2xx whose body turns out malformed is
/// still `ok` here: the transport worked; the adapter's step records the rest).
fn status_of(r: &Result<GetResponse, Fault>) -> reckon_metrics::ProviderStatus {
    use reckon_metrics::ProviderStatus as S;
    match r {
        Ok(resp) => match resp.status {
            200..=299 => S::Ok,
            404 => S::NotFound,
            429 => S::RateLimited,
            408 => S::Timeout,
            400..=499 => S::ClientError,
            _ => S::ServerError,
        },
        Err(f) => match f.kind {
            FaultKind::Timeout => S::Timeout,
            FaultKind::Config => S::ClientError,
            _ => S::Transport,
        },
    }
}

fn transport(e: reqwest::Error) -> Fault {
    let e = e.without_url();
    let kind = if e.is_timeout() {
        FaultKind::Timeout
    } else {
        FaultKind::Connection
    };
    // The chain holds the useful part ("connection reset", "unexpected EOF").
    let mut detail = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        detail.push_str(": ");
        detail.push_str(&s.to_string());
        src = s.source();
    }
    Fault::new(kind, detail)
}

/// How much wider than a second the pace's window is: a request's way from the pace to
/// the provider varies by a few milliseconds (a pooled or a new connection, the
/// scheduler), and the provider counts arrivals, so a second as reckon measures it must
/// hold what any second as the provider measures it may hold.
const PACE_MARGIN: Duration = Duration::from_millis(30);
/// After a 429 the pace halves, and grows back by this share of the budget per second.
const PACE_RECOVERY_PER_SEC: f64 = 0.1;
/// The pace never drops below this share of the budget.
const PACE_FLOOR: f64 = 1.0 / 16.0;

/// The request budget of one provider account, shared by every lookup and listing of the
/// process: never more than `rate_per_sec` requests in any sliding second (a window of
/// one second plus [`PACE_MARGIN`] holds at most `floor(rate)` send times), spaced evenly
/// rather than bunched, and slowed down for the whole account by a 429, recovering
/// gradually.
pub struct Pace {
    /// Names the account among replicas (a digest of what identifies it, never a secret).
    id: String,
    budget: f64,
    /// Processes sending to this account now (this one included): each keeps to its
    /// share of the budget. Kept by the reconciler from the ledger's leases.
    share: std::sync::atomic::AtomicUsize,
    state: Mutex<PaceState>,
}

struct PaceState {
    /// Send times inside the current window, oldest first.
    sent: std::collections::VecDeque<std::time::Instant>,
    /// The rate allowed now (the budget, or less after a 429).
    rate: f64,
    updated: std::time::Instant,
    /// When the next request is due on an evenly spaced schedule. A request may go up to
    /// half a spacing early, so a timer that wakes late does not slow the schedule down
    /// (the window above still caps every second).
    due: Option<std::time::Instant>,
}

impl Pace {
    pub fn new(account_key: &str, rate_per_sec: f64) -> Pace {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(account_key.as_bytes());
        Pace {
            id: digest.iter().take(12).map(|b| format!("{b:02x}")).collect(),
            budget: rate_per_sec,
            share: std::sync::atomic::AtomicUsize::new(1),
            state: Mutex::new(PaceState {
                sent: Default::default(),
                rate: rate_per_sec,
                updated: std::time::Instant::now(),
                due: None,
            }),
        }
    }

    /// The budget this pace keeps to, across every process that shares it.
    pub fn budget(&self) -> f64 {
        self.budget
    }

    /// The account's name among replicas.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// `n` processes (this one included) send to this account now: keep to 1/n of the
    /// budget (at least one request a window: a budget below the number of replicas
    /// cannot be kept without a shared pace).
    pub fn set_share(&self, n: usize) {
        self.share
            .store(n.max(1), std::sync::atomic::Ordering::Relaxed);
    }

    pub fn share(&self) -> usize {
        self.share.load(std::sync::atomic::Ordering::Relaxed).max(1)
    }

    /// The rate allowed now.
    pub fn rate(&self) -> f64 {
        let mut st = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.recover(&mut st, std::time::Instant::now());
        st.rate
    }

    fn recover(&self, st: &mut PaceState, now: std::time::Instant) {
        let dt = now.saturating_duration_since(st.updated).as_secs_f64();
        st.rate = (st.rate + self.budget * PACE_RECOVERY_PER_SEC * dt).min(self.budget);
        st.updated = now;
    }

    /// Wait for this request's turn; its send time is taken when this returns.
    pub async fn until_ready(&self) {
        let window = Duration::from_secs(1) + PACE_MARGIN;
        loop {
            let wait = {
                let mut st = self
                    .state
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let now = std::time::Instant::now();
                self.recover(&mut st, now);
                while st
                    .sent
                    .front()
                    .is_some_and(|t| now.saturating_duration_since(*t) >= window)
                {
                    st.sent.pop_front();
                }
                let allowed = ((st.rate / self.share() as f64).floor() as usize).max(1);
                let spacing = window.div_f64(allowed as f64);
                let by_window = if st.sent.len() >= allowed {
                    // The oldest send of the window leaves it at `t + window`.
                    let idx = st.sent.len() - allowed;
                    Some(st.sent[idx] + window)
                } else {
                    None
                };
                let by_spacing = st.due.map(|d| d.checked_sub(spacing / 2).unwrap_or(d));
                let at = by_window.into_iter().chain(by_spacing).max();
                match at {
                    Some(at) if at > now => at - now,
                    _ => {
                        st.sent.push_back(now);
                        st.due = Some(st.due.map_or(now, |d| d.max(now)) + spacing);
                        return;
                    }
                }
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// The provider refused for rate limiting: slow the whole account down.
    pub fn rate_limited(&self) {
        let mut st = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = std::time::Instant::now();
        self.recover(&mut st, now);
        st.rate = (st.rate / 2.0).max(self.budget * PACE_FLOOR).max(1.0);
    }
}

/// The fault of a non-2xx answer, honouring Stripe's headers: `Stripe-Should-Retry`
/// (the server's explicit advice) and `Stripe-Rate-Limited-Reason` (back off harder).
pub(crate) fn status_fault(r: &GetResponse) -> Option<Fault> {
    use crate::RetryAdvice;
    if (200..300).contains(&r.status) {
        return None;
    }
    let kind = match r.status {
        401 | 403 => FaultKind::Auth,
        404 => FaultKind::NotFound,
        408 => FaultKind::Timeout,
        429 => FaultKind::RateLimited,
        500..=599 => FaultKind::ServerError,
        _ => FaultKind::Unsupported,
    };
    // The provider's own error type, code and message help the person who must fix a key
    // or a setting; nothing else of the body is kept, and the caller redacts what is.
    let message = crate::redact::error_excerpt(&r.body);
    let mut f = Fault::new(
        kind,
        format!("HTTP {} {}", r.status, message).trim().to_owned(),
    );
    f.http_status = Some(r.status);
    if kind == FaultKind::RateLimited
        && let Some(reason) = r.header("stripe-rate-limited-reason")
    {
        f.retry = RetryAdvice::Harder;
        f.detail.push_str(&format!(" (rate limited: {reason})"));
    }
    match r.header("stripe-should-retry").as_deref() {
        Some("false") => {
            f.retry = RetryAdvice::DoNotRetry;
            f.detail.push_str(" (Stripe-Should-Retry: false)");
        }
        Some("true") if f.retry == RetryAdvice::DoNotRetry => f.retry = RetryAdvice::Normal,
        _ => {}
    }
    Some(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Send times of `n` requests through `pace`, as fast as it lets them go.
    async fn paced(pace: &Pace, n: usize) -> Vec<std::time::Instant> {
        let mut at = Vec::with_capacity(n);
        for _ in 0..n {
            pace.until_ready().await;
            at.push(std::time::Instant::now());
        }
        at
    }

    fn busiest(at: &[std::time::Instant]) -> usize {
        (0..at.len())
            .map(|i| {
                at[i..]
                    .iter()
                    .take_while(|t| t.duration_since(at[i]) <= Duration::from_secs(1))
                    .count()
            })
            .max()
            .unwrap_or(0)
    }

    #[tokio::test]
    async fn the_pace_never_holds_more_than_the_budget_in_any_second() {
        let pace = Pace::new("test", 20.0);
        let at = paced(&pace, 45).await;
        assert!(busiest(&at) <= 20, "{}", busiest(&at));
    }

    #[tokio::test]
    async fn a_429_halves_the_pace_of_the_whole_account_and_it_recovers() {
        let pace = Arc::new(Pace::new("test", 20.0));
        pace.rate_limited();
        let after = pace.rate();
        assert!(after <= 10.5, "{after}");
        // Every request of the account goes at the slower pace: 23 requests at 20 a
        // second, evenly spaced, take 1.16 s; at 10 a second (growing back) about 2 s.
        let at = paced(&pace, 23).await;
        let span = at[22].duration_since(at[0]);
        assert!(span >= Duration::from_millis(1500), "{span:?}");
        // It grows back by 2 a second (a tenth of the budget).
        let now = pace.rate();
        assert!(now > after + 1.0, "{after} -> {now}");
    }

    /// T10: a provider answering 302 to another address (here a second loopback server
    /// standing in for 127.0.0.1's admin port or the metadata address) is not followed: the
    /// 302 is the answer, a fault, and the target is never asked.
    #[tokio::test]
    async fn redirects_are_never_followed() {
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        let target = axum::Router::new().fallback(move || {
            h.fetch_add(1, Ordering::SeqCst);
            async { "internal secret" }
        });
        let tl = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target_addr = tl.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(tl, target).await.ok() });
        let redirector = axum::Router::new().fallback(move || async move {
            (
                axum::http::StatusCode::FOUND,
                [(
                    axum::http::header::LOCATION,
                    format!("http://{target_addr}/latest/meta-data"),
                )],
            )
        });
        let rl = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = url::Url::parse(&format!(
            "http://{}/effects/lookup",
            rl.local_addr().unwrap()
        ))
        .unwrap();
        tokio::spawn(async move { axum::serve(rl, redirector).await.ok() });

        let r = GetClient::new(Duration::from_secs(5))
            .get(&url, &[])
            .await
            .expect("an answer");
        assert_eq!(r.status, 302);
        assert!(status_fault(&r).is_some(), "a 3xx is not a success");
        assert_eq!(hits.load(Ordering::SeqCst), 0, "the redirect was followed");
    }
}
