//! `/metrics` (operator, every tenant) and `/api/v1/metrics` (one tenant's series only).
//!
//! Two kinds of series meet here:
//! - instance-level counters and histograms ([`reckon_metrics::Metrics`]), updated as
//!   things happen in this process;
//! - gauges computed from the ledger at scrape time ([`Ledger::metrics_snapshot`]), built
//!   fresh into a throw-away registry on every scrape so that a drained backlog's series
//!   disappear (Prometheus then marks them stale) instead of lingering at an old value.
//!
//! A scrape storm costs one query: answers are cached for [`MetricsSettings::cache_ttl`]
//! per scope, and concurrent scrapes wait for the one query in flight. The query has a
//! timeout; when it fails, `reckon_metrics_collector_up` is 0, the ledger series are
//! omitted (never stale values, never zeros) and the instance series are still served.
//!
//! Access: `/metrics` is off unless configured. It is served without a token on its own
//! listener ([`operator_app`], `metrics_listen`), or on the main listener to a bearer
//! token (`metrics_token`). A tenant's API token reads `/api/v1/metrics`: the same
//! rendering, filtered to the series whose `tenant` label is that tenant, from a query
//! that asked the ledger for that tenant only.

use crate::AppState;
use crate::auth::Auth;
use crate::error::ApiError;
use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus::core::Collector;
use prometheus::proto::MetricFamily;
use prometheus::{Encoder, GaugeVec, IntCounterVec, Opts, Registry, TextEncoder};
use reckon_domain::time;
use reckon_ledger::{Ledger, MetricsQuery, MetricsSnapshot, TenantId};
pub use reckon_metrics::{Metrics, ProviderStatus, ReconcileOutcome};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Label value for effects whose key is not of the `operation:vN:...` shape.
pub const UNPARSED_OPERATION: &str = "_unparsed";
/// Label value that folds the operations of a source beyond [`MAX_OPERATIONS_PER_SOURCE`].
pub const OTHER_OPERATION: &str = "_other";
/// Operation names come from tenants' keys: a bound keeps a hostile or buggy key scheme
/// from multiplying series. The largest groups keep their own label.
pub const MAX_OPERATIONS_PER_SOURCE: usize = 50;

#[derive(Debug, Clone)]
pub struct MetricsSettings {
    /// SHA-256 of the bearer token that may read `/metrics` on the main listener; `None`
    /// leaves `/metrics` off there (404).
    pub operator_token_sha256: Option<[u8; 32]>,
    /// How long one ledger answer serves scrapes.
    pub cache_ttl: Duration,
    /// How long a scrape waits for the ledger.
    pub timeout: Duration,
    /// Stripe keeps an idempotency key at least 24 h (reference/stripe.md): after that a
    /// replay of the original request would execute again.
    pub replay_window: Duration,
    /// An unresolved effect counts as "replay window closing" this long before the window
    /// ends. HOOK(recon): per-provider windows replace this once providers carry them.
    pub replay_warning: Duration,
}

impl Default for MetricsSettings {
    fn default() -> Self {
        MetricsSettings {
            operator_token_sha256: None,
            cache_ttl: Duration::from_secs(2),
            timeout: Duration::from_secs(5),
            replay_window: Duration::from_secs(24 * 3600),
            replay_warning: Duration::from_secs(4 * 3600),
        }
    }
}

impl MetricsSettings {
    pub fn with_operator_token(mut self, token: &str) -> Self {
        self.operator_token_sha256 = Some(Sha256::digest(token.as_bytes()).into());
        self
    }
}

/// The metrics half of [`AppState`]: cheap to clone.
#[derive(Clone)]
pub struct MetricsState {
    pub instance: Metrics,
    /// Also read by the dashboard (issue 7) for the replay window.
    pub(crate) settings: Arc<MetricsSettings>,
    collector: Arc<CollectorState>,
}

impl Default for MetricsState {
    fn default() -> Self {
        MetricsState::new(Metrics::new(), MetricsSettings::default())
    }
}

#[derive(Default)]
struct CollectorState {
    /// Per scope (0 = every tenant, else a tenant id): the latest answer. The async mutex
    /// makes concurrent scrapes of one process share one query.
    cache: tokio::sync::Mutex<HashMap<i64, Collected>>,
    /// (tenant, source, operation) seen unresolved since start: they read 0 once drained,
    /// so a graph of the count goes to zero instead of stopping.
    seen: Mutex<BTreeSet<(String, String, String)>>,
}

#[derive(Clone)]
struct Collected {
    fetched: Instant,
    /// `None`: the query failed or timed out.
    snapshot: Option<MetricsSnapshot>,
    duration_secs: f64,
    last_success: Option<f64>,
}

impl MetricsState {
    pub fn new(instance: Metrics, settings: MetricsSettings) -> MetricsState {
        MetricsState {
            instance,
            settings: Arc::new(settings),
            collector: Arc::default(),
        }
    }

    async fn collect(&self, ledger: &dyn Ledger, tenant: Option<TenantId>) -> Collected {
        let scope = tenant.map_or(0, TenantId::get);
        let mut cache = self.collector.cache.lock().await;
        if let Some(c) = cache.get(&scope)
            && c.fetched.elapsed() < self.settings.cache_ttl
        {
            return c.clone();
        }
        let started = Instant::now();
        let now = time::now();
        let closing_after = self
            .settings
            .replay_window
            .saturating_sub(self.settings.replay_warning);
        let q = MetricsQuery {
            tenant,
            now,
            replay_closing_created_before: now - closing_after.as_secs_f64(),
        };
        let snapshot =
            match tokio::time::timeout(self.settings.timeout, ledger.metrics_snapshot(q)).await {
                Ok(Ok(s)) => Some(s),
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "metrics query failed");
                    None
                }
                Err(_) => {
                    tracing::warn!(timeout = ?self.settings.timeout, "metrics query timed out");
                    None
                }
            };
        let previous = cache.get(&scope).and_then(|c| c.last_success);
        let collected = Collected {
            fetched: Instant::now(),
            last_success: if snapshot.is_some() {
                Some(time::now())
            } else {
                previous
            },
            snapshot,
            duration_secs: started.elapsed().as_secs_f64(),
        };
        cache.insert(scope, collected.clone());
        collected
    }

    /// The whole exposition for one scope: `tenant_slug` filters to that tenant's series.
    async fn render(
        &self,
        ledger: &dyn Ledger,
        tenant: Option<(TenantId, &str)>,
    ) -> Result<String, prometheus::Error> {
        let collected = self.collect(ledger, tenant.map(|t| t.0)).await;
        let mut families = self.instance.registry().gather();
        families.extend(self.scrape_families(&collected, time::now())?);
        if let Some((_, slug)) = tenant {
            families = only_tenant(families, slug);
        }
        families.sort_by(|a, b| a.name().cmp(b.name()));
        let mut out = Vec::new();
        TextEncoder::new().encode(&families, &mut out)?;
        Ok(String::from_utf8(out).expect("the text format is UTF-8"))
    }

    fn scrape_families(
        &self,
        c: &Collected,
        now: f64,
    ) -> Result<Vec<MetricFamily>, prometheus::Error> {
        let g = ScrapeGauges::new()?;
        g.collector_up.with_label_values::<&str>(&[]).set(0.0);
        g.collector_duration
            .with_label_values::<&str>(&[])
            .set(c.duration_secs);
        if let Some(t) = c.last_success {
            g.collector_last_success
                .with_label_values::<&str>(&[])
                .set(t);
        }
        if let Some(s) = &c.snapshot {
            g.collector_up.with_label_values::<&str>(&[]).set(1.0);
            self.fill(&g, s, now);
        }
        let reg = Registry::new();
        for col in g.collectors() {
            reg.register(col)?;
        }
        Ok(reg.gather())
    }

    fn fill(&self, g: &ScrapeGauges, s: &MetricsSnapshot, now: f64) {
        let groups = fold_operations(s);
        let mut seen = self.collector.seen.lock().expect("seen lock");
        let sources: BTreeSet<(&str, &str)> = s
            .sources
            .iter()
            .map(|h| (h.tenant.as_str(), h.source.as_str()))
            .collect();
        // Zeros for what was unresolved before and is no longer (while its source exists).
        seen.retain(|(t, src, _)| sources.contains(&(t.as_str(), src.as_str())));
        for (t, src, op) in seen.iter() {
            for kind in ["unknown", "abandoned"] {
                g.unresolved
                    .with_label_values(&[t.as_str(), src, op, kind])
                    .set(0.0);
            }
            g.replay_closing
                .with_label_values(&[t.as_str(), src, op])
                .set(0.0);
        }
        for ((t, src, op), v) in &groups {
            let labels = [t.as_str(), src.as_str(), op.as_str()];
            g.unresolved
                .with_label_values(&[t.as_str(), src, op, "unknown"])
                .set(v.unknown as f64);
            g.unresolved
                .with_label_values(&[t.as_str(), src, op, "abandoned"])
                .set(v.abandoned as f64);
            g.oldest_ts.with_label_values(&labels).set(v.oldest);
            g.oldest_age
                .with_label_values(&labels)
                .set((now - v.oldest).max(0.0));
            g.replay_closing
                .with_label_values(&labels)
                .set(v.replay as f64);
            seen.insert((t.clone(), src.clone(), op.clone()));
        }
        for n in &s.needs_attention {
            let op = n.operation.as_deref().unwrap_or(UNPARSED_OPERATION);
            g.needs_attention
                .with_label_values(&[n.tenant.as_str(), &n.source, op])
                .set(n.count as f64);
        }
        for q in &s.quarantine {
            g.quarantined
                .with_label_values(&[q.tenant.as_str(), &q.source, &q.reason])
                .inc_by(q.count.max(0) as u64);
        }
        for h in s.sources.iter().filter(|h| h.kind != "push") {
            let labels = [h.tenant.as_str(), h.source.as_str()];
            g.source_up
                .with_label_values(&labels)
                .set(if h.up() { 1.0 } else { 0.0 });
            // Omitted until the first success: 0 would read as "1970", a false page.
            if let Some(t) = h.last_success_at {
                g.source_last_success.with_label_values(&labels).set(t);
            }
            // So the first scan error is an increase from 0, not a new series.
            self.instance.touch_source(&h.tenant, &h.source);
        }
    }
}

#[derive(Default)]
struct Folded {
    unknown: i64,
    abandoned: i64,
    oldest: f64,
    replay: i64,
}

/// Group by (tenant, source, operation label), keeping at most
/// [`MAX_OPERATIONS_PER_SOURCE`] operations per source (the largest) and folding the rest
/// into [`OTHER_OPERATION`].
fn fold_operations(s: &MetricsSnapshot) -> BTreeMap<(String, String, String), Folded> {
    let mut per_source: BTreeMap<(&str, &str), Vec<&reckon_ledger::UnresolvedGroup>> =
        BTreeMap::new();
    for u in &s.unresolved {
        per_source
            .entry((u.tenant.as_str(), u.source.as_str()))
            .or_default()
            .push(u);
    }
    let mut out: BTreeMap<(String, String, String), Folded> = BTreeMap::new();
    for ((t, src), mut groups) in per_source {
        groups.sort_by_key(|u| std::cmp::Reverse(u.unknown + u.abandoned));
        for (i, u) in groups.into_iter().enumerate() {
            let op = if i >= MAX_OPERATIONS_PER_SOURCE {
                OTHER_OPERATION
            } else {
                u.operation.as_deref().unwrap_or(UNPARSED_OPERATION)
            };
            let f = out
                .entry((t.to_owned(), src.to_owned(), op.to_owned()))
                .or_insert(Folded {
                    oldest: f64::INFINITY,
                    ..Folded::default()
                });
            f.unknown += u.unknown;
            f.abandoned += u.abandoned;
            f.replay += u.replay_window_closing;
            f.oldest = f.oldest.min(u.oldest_since);
        }
    }
    out
}

/// The gauges built fresh at every scrape.
struct ScrapeGauges {
    unresolved: GaugeVec,
    oldest_ts: GaugeVec,
    oldest_age: GaugeVec,
    replay_closing: GaugeVec,
    needs_attention: GaugeVec,
    quarantined: IntCounterVec,
    source_last_success: GaugeVec,
    source_up: GaugeVec,
    collector_up: GaugeVec,
    collector_last_success: GaugeVec,
    collector_duration: GaugeVec,
}

const TSO: &[&str] = &["tenant", "source", "operation"];

impl ScrapeGauges {
    fn new() -> Result<ScrapeGauges, prometheus::Error> {
        let gauge =
            |name: &str, help: &str, labels: &[&str]| GaugeVec::new(Opts::new(name, help), labels);
        Ok(ScrapeGauges {
            unresolved: gauge(
                "reckon_unresolved_effects",
                "Effects nobody knows the outcome of, by kind (unknown, abandoned claim). From the ledger at scrape time (cached up to a few seconds).",
                &["tenant", "source", "operation", "kind"],
            )?,
            oldest_ts: gauge(
                "reckon_oldest_unresolved_timestamp_seconds",
                "Unix time since which the oldest unresolved effect has been unresolved (updated_at of an unknown effect, lease end of an abandoned claim). Absent when nothing is unresolved.",
                TSO,
            )?,
            oldest_age: gauge(
                "reckon_oldest_unresolved_age_seconds",
                "Seconds since the oldest unresolved effect became unresolved, at scrape time. Absent when nothing is unresolved.",
                TSO,
            )?,
            replay_closing: gauge(
                "reckon_replay_window_closing_effects",
                "Unresolved effects created long enough ago that the provider's idempotency window (24 h) closes within the warning margin (4 h).",
                TSO,
            )?,
            needs_attention: gauge(
                "reckon_needs_attention_effects",
                "Unresolved effects the reconciler parked for a person to decide.",
                TSO,
            )?,
            quarantined: IntCounterVec::new(
                Opts::new(
                    "reckon_records_quarantined_total",
                    "Source rows quarantined (not exactly a justonce record), by reason. Counted in the ledger, so every replica reports the same value.",
                ),
                &["tenant", "source", "reason"],
            )?,
            source_last_success: gauge(
                "reckon_source_last_scan_success_timestamp_seconds",
                "Unix time of the source's last successful scan. Absent before the first one.",
                &["tenant", "source"],
            )?,
            source_up: gauge(
                "reckon_source_up",
                "1 if the source's latest scan succeeded, 0 if it failed or none succeeded yet.",
                &["tenant", "source"],
            )?,
            collector_up: gauge(
                "reckon_metrics_collector_up",
                "1 if this scrape's ledger query succeeded; when 0, the ledger-derived series are omitted.",
                &[],
            )?,
            collector_last_success: gauge(
                "reckon_metrics_collector_last_success_timestamp_seconds",
                "Unix time of this process's last successful ledger query for metrics.",
                &[],
            )?,
            collector_duration: gauge(
                "reckon_metrics_collector_duration_seconds",
                "Duration of the latest ledger query for metrics.",
                &[],
            )?,
        })
    }

    fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.unresolved.clone()),
            Box::new(self.oldest_ts.clone()),
            Box::new(self.oldest_age.clone()),
            Box::new(self.replay_closing.clone()),
            Box::new(self.needs_attention.clone()),
            Box::new(self.quarantined.clone()),
            Box::new(self.source_last_success.clone()),
            Box::new(self.source_up.clone()),
            Box::new(self.collector_up.clone()),
            Box::new(self.collector_last_success.clone()),
            Box::new(self.collector_duration.clone()),
        ]
    }
}

/// Every metric name reckon exports (scrape-time and instance-level), read from the
/// metrics' own descriptors. Histograms are listed by base name.
pub fn exported_metric_names() -> Vec<String> {
    let mut names = Metrics::new().metric_names();
    let g = ScrapeGauges::new().expect("valid metrics");
    names.extend(
        g.collectors()
            .iter()
            .flat_map(|c| c.desc().into_iter().map(|d| d.fq_name.clone())),
    );
    names.sort();
    names
}

/// Keep only the series labelled with this tenant, plus the collector's health (which,
/// for a tenant scope, describes that tenant's own query).
fn only_tenant(families: Vec<MetricFamily>, slug: &str) -> Vec<MetricFamily> {
    families
        .into_iter()
        .filter_map(|mut f| {
            if f.name().starts_with("reckon_metrics_collector_") {
                return Some(f);
            }
            f.mut_metric().retain(|m| {
                m.get_label()
                    .iter()
                    .any(|l| l.name() == "tenant" && l.value() == slug)
            });
            (!f.get_metric().is_empty()).then_some(f)
        })
        .collect()
}

fn exposition(body: String) -> Response {
    (
        [(header::CONTENT_TYPE, TextEncoder::new().format_type())],
        body,
    )
        .into_response()
}

async fn render_or_500(
    state: &AppState,
    tenant: Option<(TenantId, &str)>,
) -> Result<Response, ApiError> {
    let body = state
        .metrics
        .render(&*state.ledger, tenant)
        .await
        .map_err(|e| ApiError::Internal(Box::new(e)))?;
    Ok(exposition(body))
}

/// `/metrics` on the main listener: only with the operator's bearer token, and 404 when
/// no token is configured (the endpoint is off).
async fn operator_metrics(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Some(expected) = state.metrics.settings.operator_token_sha256 else {
        return Err(ApiError::NotFound(
            "/metrics is off on this listener: set metrics_listen (a listener of its own) or metrics_token".into(),
        ));
    };
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim());
    // Comparing digests, not the tokens: the time a mismatch takes tells nothing about
    // the token.
    match presented {
        Some(t) if <[u8; 32]>::from(Sha256::digest(t.as_bytes())) == expected => {
            render_or_500(&state, None).await
        }
        _ => Err(ApiError::Unauthorized(
            "/metrics needs the operator's metrics token as Authorization: Bearer",
        )),
    }
}

/// `/metrics` on the dedicated metrics listener: no token, the network is the boundary.
async fn open_metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    render_or_500(&state, None).await
}

/// `GET /api/v1/metrics`: the token's tenant's series only.
async fn tenant_metrics(State(state): State<AppState>, auth: Auth) -> Result<Response, ApiError> {
    render_or_500(&state, Some((auth.tenant.id, &auth.tenant.slug))).await
}

/// The routes of the main listener, merged into [`crate::app`].
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/metrics", get(operator_metrics))
        .route("/api/v1/metrics", get(tenant_metrics))
}

/// The whole app of the dedicated metrics listener (`metrics_listen`): `/metrics` only.
pub fn operator_app(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(open_metrics))
        .with_state(state)
}

/// Middleware: count and time every request by its route template (`MatchedPath`, never
/// the raw path, which holds keys and names).
pub async fn track_http(State(m): State<Metrics>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    // Methods are client input: anything but the standard ones is folded.
    let method = match *req.method() {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    };
    let started = Instant::now();
    let resp = next.run(req).await;
    m.record_http(method, &route, resp.status().as_u16(), started.elapsed());
    resp
}
