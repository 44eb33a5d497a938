//! `/metrics` (operator, every tenant) and `/api/v1/metrics` (one tenant's series only).
//!
//! Two kinds of series meet here:
//! - instance-level counters and histograms ([`reckon_metrics::Metrics`]), updated as
//!   things happen in this process;
//! - gauges computed from the ledger at scrape time ([`Ledger::metrics_snapshot`]), written
//!   as exposition text at every scrape so that a drained backlog's series disappear
//!   (Prometheus then marks them stale) instead of lingering at an old value.
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
use prometheus::proto::MetricFamily;
use prometheus::{Encoder, TextEncoder};
use reckon_domain::time;
use reckon_ledger::{Ledger, MetricsQuery, MetricsSnapshot, TenantId};
pub use reckon_metrics::{Metrics, Outcome, ProviderStatus};
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
    /// A routed unresolved effect counts as "replay window closing" this long before the
    /// window ends, and as "closed" after. One window for every provider: the scrape reads
    /// routes, not each provider's settings (a provider's own window is on the effect's
    /// page, `reckon_engine::reconcile::replay_window`).
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
    /// Also read by the dashboard for the replay window.
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
            replay_closed_created_before: now - self.settings.replay_window.as_secs_f64(),
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

    /// The whole exposition for one scope: `tenant` filters to that tenant's series.
    async fn render(
        &self,
        ledger: &dyn Ledger,
        tenant: Option<(TenantId, &str)>,
    ) -> Result<String, prometheus::Error> {
        let collected = self.collect(ledger, tenant.map(|t| t.0)).await;
        let now = time::now();
        // The ledger families first: writing them touches the sources' instance counters,
        // which the registry's families then include.
        let mut ledger_part = String::new();
        self.write_ledger_families(&collected, tenant.map(|t| t.1), now, &mut ledger_part);
        // This process's pool, read now (no query, so never cached or stale). Not a tenant's
        // business: only the operator's scrape has it.
        if tenant.is_none() {
            write_pool(ledger.pool_status(), &mut ledger_part);
        }
        let mut families = self.instance.registry().gather();
        if let Some((_, slug)) = tenant {
            families = only_tenant(families, slug);
        }
        let mut out = String::with_capacity(ledger_part.len() + 64 * 1024);
        TextEncoder::new().encode_utf8(&families, &mut out)?;
        out.push_str(&ledger_part);
        Ok(out)
    }

    /// The ledger-derived families and the collector's health, written as exposition text
    /// directly: they are rebuilt at every scrape (so a drained backlog's series disappear
    /// and Prometheus marks them stale), and building a throw-away registry of ~7,000
    /// gauges for that was most of the 27 ms a scrape spent outside the ledger at 1,000
    /// sources (scrape bench; ~5 ms now).
    fn write_ledger_families(
        &self,
        c: &Collected,
        scope: Option<&str>,
        now: f64,
        out: &mut String,
    ) {
        let mut up = Family::new(&COLLECTOR_UP);
        up.sample(&[], if c.snapshot.is_some() { 1.0 } else { 0.0 });
        up.write_to(out);
        if let Some(t) = c.last_success {
            let mut f = Family::new(&COLLECTOR_LAST_SUCCESS);
            f.sample(&[], t);
            f.write_to(out);
        }
        let mut f = Family::new(&COLLECTOR_DURATION);
        f.sample(&[], c.duration_secs);
        f.write_to(out);
        if let Some(s) = &c.snapshot {
            self.write_snapshot(s, scope, now, out);
        }
    }

    fn write_snapshot(&self, s: &MetricsSnapshot, scope: Option<&str>, now: f64, out: &mut String) {
        let groups = fold_operations(s);
        let sources: BTreeSet<(&str, &str)> = s
            .sources
            .iter()
            .map(|h| (h.tenant.as_str(), h.source.as_str()))
            .collect();
        // (tenant, source, operation) -> its group, or None: unresolved before, drained now
        // (written as zeros while its source exists, so a graph of the count goes to zero
        // instead of stopping).
        let mut rows: BTreeMap<(String, String, String), Option<&Folded>> = BTreeMap::new();
        {
            let mut seen = self.collector.seen.lock().expect("seen lock");
            // A tenant's scrape knows only its own tenant: it leaves the others' alone.
            let in_scope = |t: &str| scope.is_none_or(|slug| slug == t);
            seen.retain(|(t, src, _)| {
                !in_scope(t) || sources.contains(&(t.as_str(), src.as_str()))
            });
            for k in seen.iter().filter(|(t, _, _)| in_scope(t)) {
                rows.insert(k.clone(), None);
            }
            for (k, v) in &groups {
                seen.insert(k.clone());
                rows.insert(k.clone(), Some(v));
            }
        }

        let mut unresolved = Family::new(&UNRESOLVED);
        let mut oldest_ts = Family::new(&OLDEST_TS);
        let mut oldest_age = Family::new(&OLDEST_AGE);
        let mut replay = Family::new(&REPLAY_CLOSING);
        let mut replay_closed = Family::new(&REPLAY_CLOSED);
        let mut unrouted = Family::new(&UNROUTED);
        let mut needs_attention = Family::new(&NEEDS_ATTENTION);
        for ((t, src, op), v) in &rows {
            let tso = [("tenant", t.as_str()), ("source", src), ("operation", op)];
            let zero = Folded::default();
            let f = v.unwrap_or(&zero);
            for (kind, n) in [("abandoned", f.abandoned), ("unknown", f.unknown)] {
                unresolved.sample(&[tso[0], tso[1], tso[2], ("kind", kind)], n as f64);
            }
            replay.sample(&tso, f.replay as f64);
            replay_closed.sample(&tso, f.replay_closed as f64);
            unrouted.sample(&tso, f.unrouted as f64);
            needs_attention.sample(&tso, f.attention as f64);
            // Omitted when nothing is unresolved: a timestamp of 0 would read as "1970".
            if let Some(v) = v {
                oldest_ts.sample(&tso, v.oldest);
                oldest_age.sample(&tso, (now - v.oldest).max(0.0));
            }
        }

        let mut by_reason: BTreeMap<(&str, &str, &str), i64> = BTreeMap::new();
        for q in &s.quarantine {
            *by_reason
                .entry((&q.tenant, &q.source, &q.reason))
                .or_default() += q.count.max(0);
        }
        let mut quarantined = Family::new(&QUARANTINED);
        for ((t, src, reason), n) in by_reason {
            quarantined.sample(
                &[("tenant", t), ("source", src), ("reason", reason)],
                n as f64,
            );
        }

        let mut source_up = Family::new(&SOURCE_UP);
        let mut source_last_success = Family::new(&SOURCE_LAST_SUCCESS);
        let mut scanned: Vec<_> = s.sources.iter().filter(|h| h.kind != "push").collect();
        scanned.sort_by(|a, b| (&a.tenant, &a.source).cmp(&(&b.tenant, &b.source)));
        for h in scanned {
            let labels = [("tenant", h.tenant.as_str()), ("source", h.source.as_str())];
            source_up.sample(&labels, if h.up() { 1.0 } else { 0.0 });
            // Omitted until the first success: 0 would read as "1970", a false page.
            if let Some(t) = h.last_success_at {
                source_last_success.sample(&labels, t);
            }
            // So the first scan error is an increase from 0, not a new series.
            self.instance.touch_source(&h.tenant, &h.source);
        }

        let mut provider_up = Family::new(&PROVIDER_UP);
        let mut provider_last_lookup = Family::new(&PROVIDER_LAST_LOOKUP);
        let mut providers: Vec<_> = s.providers.iter().collect();
        providers.sort_by(|a, b| (&a.tenant, &a.provider).cmp(&(&b.tenant, &b.provider)));
        for p in providers {
            let labels = [
                ("tenant", p.tenant.as_str()),
                ("provider_kind", p.kind.as_str()),
                ("provider", p.provider.as_str()),
            ];
            // Omitted for a provider never asked: nothing is known of it yet.
            if let (Some(up), Some(at)) = (p.up(), p.last_lookup_at) {
                provider_up.sample(&labels, if up { 1.0 } else { 0.0 });
                provider_last_lookup.sample(&labels, at);
            }
        }

        for f in [
            needs_attention,
            oldest_age,
            oldest_ts,
            provider_last_lookup,
            provider_up,
            quarantined,
            replay,
            replay_closed,
            source_last_success,
            source_up,
            unresolved,
            unrouted,
        ] {
            f.write_to(out);
        }
    }
}

#[derive(Default)]
struct Folded {
    unknown: i64,
    abandoned: i64,
    oldest: f64,
    replay: i64,
    replay_closed: i64,
    unrouted: i64,
    attention: i64,
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
            f.replay_closed += u.replay_window_closed;
            f.unrouted += u.unrouted();
            f.attention += u.needs_attention;
            f.oldest = f.oldest.min(u.oldest_since);
        }
    }
    out
}

/// One family's name, type and help text.
struct FamilyDef {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
}

const UNRESOLVED: FamilyDef = FamilyDef {
    name: "reckon_unresolved_effects",
    kind: "gauge",
    help: "Effects nobody knows the outcome of, by kind (unknown, abandoned claim). From the ledger at scrape time (cached up to a few seconds).",
};
const OLDEST_TS: FamilyDef = FamilyDef {
    name: "reckon_oldest_unresolved_timestamp_seconds",
    kind: "gauge",
    help: "Unix time since which the oldest unresolved effect has been unresolved (updated_at of an unknown effect, lease end of an abandoned claim). Absent when nothing is unresolved.",
};
const OLDEST_AGE: FamilyDef = FamilyDef {
    name: "reckon_oldest_unresolved_age_seconds",
    kind: "gauge",
    help: "Seconds since the oldest unresolved effect became unresolved, at scrape time. Absent when nothing is unresolved.",
};
const REPLAY_CLOSING: FamilyDef = FamilyDef {
    name: "reckon_replay_window_closing_effects",
    kind: "gauge",
    help: "Unresolved effects routed to a provider whose idempotency window (24 h from creation) closes within the warning margin (4 h): still open, not for long.",
};
const REPLAY_CLOSED: FamilyDef = FamilyDef {
    name: "reckon_replay_window_closed_effects",
    kind: "gauge",
    help: "Unresolved effects routed to a provider whose idempotency window (24 h from creation) has closed: the provider may have forgotten the key, and a retry of the original request would run it again.",
};
const UNROUTED: FamilyDef = FamilyDef {
    name: "reckon_unrouted_effects",
    kind: "gauge",
    help: "Unresolved effects no provider is asked about: no route for their operation or the source's *, or a route to none. They wait for a route or a person.",
};
const POOL: FamilyDef = FamilyDef {
    name: "reckon_ledger_pool_connections",
    kind: "gauge",
    help: "This process's ledger connection pool: idle and in_use connections now, and max, the most it opens.",
};
const NEEDS_ATTENTION: FamilyDef = FamilyDef {
    name: "reckon_needs_attention_effects",
    kind: "gauge",
    help: "Unresolved effects the reconciler parked for a person to decide.",
};
const QUARANTINED: FamilyDef = FamilyDef {
    name: "reckon_records_quarantined_total",
    kind: "counter",
    help: "Source rows quarantined (not exactly a justonce record), by reason. Counted in the ledger, so every replica reports the same value.",
};
const SOURCE_LAST_SUCCESS: FamilyDef = FamilyDef {
    name: "reckon_source_last_scan_success_timestamp_seconds",
    kind: "gauge",
    help: "Unix time of the source's last successful scan. Absent before the first one.",
};
const SOURCE_UP: FamilyDef = FamilyDef {
    name: "reckon_source_up",
    kind: "gauge",
    help: "1 if the source's latest scan succeeded, 0 if it failed or none succeeded yet.",
};
const PROVIDER_UP: FamilyDef = FamilyDef {
    name: "reckon_provider_up",
    kind: "gauge",
    help: "1 if the latest lookup at the provider (any replica's, as stored in the ledger) got an answer, 0 if it was indeterminate (timeout, refused, 429, 5xx, 404, malformed). Absent for a provider never asked.",
};
const PROVIDER_LAST_LOOKUP: FamilyDef = FamilyDef {
    name: "reckon_provider_last_lookup_timestamp_seconds",
    kind: "gauge",
    help: "Unix time the latest lookup at the provider finished, as stored in the ledger. Absent for a provider never asked.",
};
const COLLECTOR_UP: FamilyDef = FamilyDef {
    name: "reckon_metrics_collector_up",
    kind: "gauge",
    help: "1 if this scrape's ledger query succeeded; when 0, the ledger-derived series are omitted.",
};
const COLLECTOR_LAST_SUCCESS: FamilyDef = FamilyDef {
    name: "reckon_metrics_collector_last_success_timestamp_seconds",
    kind: "gauge",
    help: "Unix time of this process's last successful ledger query for metrics.",
};
const COLLECTOR_DURATION: FamilyDef = FamilyDef {
    name: "reckon_metrics_collector_duration_seconds",
    kind: "gauge",
    help: "Duration of the latest ledger query for metrics.",
};

/// Every family written at scrape time.
const LEDGER_FAMILIES: [&FamilyDef; 16] = [
    &UNRESOLVED,
    &OLDEST_TS,
    &OLDEST_AGE,
    &REPLAY_CLOSING,
    &REPLAY_CLOSED,
    &UNROUTED,
    &POOL,
    &NEEDS_ATTENTION,
    &QUARANTINED,
    &SOURCE_LAST_SUCCESS,
    &SOURCE_UP,
    &PROVIDER_UP,
    &PROVIDER_LAST_LOOKUP,
    &COLLECTOR_UP,
    &COLLECTOR_LAST_SUCCESS,
    &COLLECTOR_DURATION,
];

fn write_pool(p: reckon_ledger::PoolStatus, out: &mut String) {
    let mut f = Family::new(&POOL);
    for (state, n) in [("idle", p.idle), ("in_use", p.in_use), ("max", p.max)] {
        f.sample(&[("state", state)], f64::from(n));
    }
    f.write_to(out);
}

/// One family's samples in the text format (version 0.0.4), written only if it has any,
/// as the registry would (an empty vector is not exposed).
struct Family {
    def: &'static FamilyDef,
    samples: String,
}

impl Family {
    fn new(def: &'static FamilyDef) -> Family {
        Family {
            def,
            samples: String::new(),
        }
    }

    fn sample(&mut self, labels: &[(&str, &str)], value: f64) {
        use std::fmt::Write as _;
        self.samples.push_str(self.def.name);
        if !labels.is_empty() {
            self.samples.push('{');
            for (i, (name, value)) in labels.iter().enumerate() {
                if i > 0 {
                    self.samples.push(',');
                }
                self.samples.push_str(name);
                self.samples.push_str("=\"");
                escape_label_value(value, &mut self.samples);
                self.samples.push('"');
            }
            self.samples.push('}');
        }
        self.samples.push(' ');
        write_value(value, &mut self.samples);
        let _ = writeln!(self.samples);
    }

    fn write_to(self, out: &mut String) {
        if self.samples.is_empty() {
            return;
        }
        out.push_str("# HELP ");
        out.push_str(self.def.name);
        out.push(' ');
        // Help texts are ours and hold no backslash or newline (checked by a test).
        out.push_str(self.def.help);
        out.push_str("\n# TYPE ");
        out.push_str(self.def.name);
        out.push(' ');
        out.push_str(self.def.kind);
        out.push('\n');
        out.push_str(&self.samples);
    }
}

/// Label values come from reckon's tables (tenant, source and operation names), which a
/// tenant chose: `\`, `"` and newlines are escaped as the text format requires.
fn escape_label_value(v: &str, out: &mut String) {
    for ch in v.chars() {
        match ch {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Values as the text format spells them (Go's `ParseFloat` syntax).
fn write_value(v: f64, out: &mut String) {
    use std::fmt::Write as _;
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else {
        let _ = write!(out, "{v}");
    }
}

/// Every metric name reckon exports (scrape-time and instance-level), read from the
/// metrics' own definitions. Histograms are listed by base name.
pub fn exported_metric_names() -> Vec<String> {
    let mut names = Metrics::new().metric_names();
    names.extend(LEDGER_FAMILIES.iter().map(|f| f.name.to_owned()));
    names.sort();
    names
}

/// Keep only the instance series labelled with this tenant. (The ledger families of a
/// tenant's scrape come from a query that read only that tenant; the collector's health
/// then describes that query.)
fn only_tenant(families: Vec<MetricFamily>, slug: &str) -> Vec<MetricFamily> {
    families
        .into_iter()
        .filter_map(|mut f| {
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
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "operatorMetrics",
    tag = "meta",
    description = "Every tenant's series in the Prometheus text format, with the operator's \
        metrics token (`metrics_token`); off (404) unless one is configured. A dedicated \
        listener (`metrics_listen`) serves it without a token.",
    responses(
        (status = 200, description = "The exposition.", content_type = "text/plain", body = String),
        (status = 401, description = "Not the operator's metrics token."),
        (status = 404, description = "Off on this listener."),
        (status = 500, description = "The exposition could not be written."),
    )
)]
pub(crate) async fn operator_metrics(
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

/// The token's tenant's series only, in the Prometheus text format.
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "tenantMetrics",
    tag = "meta",
    responses((status = 200, description = "The exposition.", content_type = "text/plain", body = String))
)]
pub(crate) async fn tenant_metrics(
    State(state): State<AppState>,
    auth: Auth,
) -> Result<Response, ApiError> {
    render_or_500(&state, Some((auth.tenant.id, &auth.tenant.slug))).await
}

/// The whole app of the dedicated metrics listener (`metrics_listen`): `/metrics` only.
pub fn operator_app(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(open_metrics))
        .with_state(state)
        .layer(axum::middleware::from_fn(operator_view))
}

/// Middleware: the operator's and people's views (everything but the API: `/metrics`,
/// `/healthz`, `/readyz`, sign-in and the dashboard) read the ledger through its operator
/// pool, which background work cannot fill (`reckon_ledger::operator_view`). The API is
/// applications' traffic, and shares the work's pool with the reconciler and the scans.
pub async fn operator_view(req: Request, next: Next) -> Response {
    if req.uri().path().starts_with("/api/") {
        next.run(req).await
    } else {
        reckon_ledger::operator_view(next.run(req)).await
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use reckon_ledger::{SourceHealth, UnresolvedGroup};

    fn source(tenant: &str, name: &str) -> SourceHealth {
        SourceHealth {
            tenant: tenant.into(),
            source: name.into(),
            kind: "sqlite".into(),
            last_scan_at: Some(100.0),
            last_success_at: Some(100.0),
            consecutive_failures: 0,
        }
    }

    fn group(tenant: &str, src: &str, op: &str, unknown: i64) -> UnresolvedGroup {
        UnresolvedGroup {
            tenant: tenant.into(),
            source: src.into(),
            operation: Some(op.into()),
            unknown,
            abandoned: 0,
            oldest_since: 50.0,
            routed: true,
            replay_window_closing: 0,
            replay_window_closed: 0,
            needs_attention: 0,
        }
    }

    fn scrape(m: &MetricsState, s: MetricsSnapshot, scope: Option<&str>) -> String {
        let c = Collected {
            fetched: Instant::now(),
            snapshot: Some(s),
            duration_secs: 0.25,
            last_success: Some(99.0),
        };
        let mut out = String::new();
        m.write_ledger_families(&c, scope, 110.0, &mut out);
        out
    }

    #[test]
    fn a_drained_group_reads_zero_and_loses_its_age_series() {
        let m = MetricsState::default();
        let busy = MetricsSnapshot {
            unresolved: vec![group("acme", "shop", "charge", 3)],
            sources: vec![source("acme", "shop")],
            ..MetricsSnapshot::default()
        };
        let text = scrape(&m, busy, None);
        assert!(text.contains(
            "reckon_unresolved_effects{tenant=\"acme\",source=\"shop\",operation=\"charge\",kind=\"unknown\"} 3\n"
        ), "{text}");
        assert!(text.contains(
            "reckon_oldest_unresolved_age_seconds{tenant=\"acme\",source=\"shop\",operation=\"charge\"} 60\n"
        ), "{text}");
        let drained = MetricsSnapshot {
            sources: vec![source("acme", "shop")],
            ..MetricsSnapshot::default()
        };
        let text = scrape(&m, drained, None);
        assert!(text.contains(
            "reckon_unresolved_effects{tenant=\"acme\",source=\"shop\",operation=\"charge\",kind=\"unknown\"} 0\n"
        ), "{text}");
        // No sample and no header: an empty family is not exposed.
        assert!(!text.contains("reckon_oldest_unresolved"), "{text}");
        assert!(text.contains("reckon_metrics_collector_up 1\n"));
        assert!(text.contains("reckon_metrics_collector_duration_seconds 0.25\n"));
    }

    #[test]
    fn a_tenants_scrape_leaves_the_other_tenants_drained_groups_alone() {
        let m = MetricsState::default();
        let both = MetricsSnapshot {
            unresolved: vec![
                group("acme", "shop", "charge", 1),
                group("beta", "app", "email", 2),
            ],
            sources: vec![source("acme", "shop"), source("beta", "app")],
            ..MetricsSnapshot::default()
        };
        scrape(&m, both, None);
        // acme's own scrape: it sees only acme's source.
        let acme = MetricsSnapshot {
            unresolved: vec![group("acme", "shop", "charge", 1)],
            sources: vec![source("acme", "shop")],
            ..MetricsSnapshot::default()
        };
        let text = scrape(&m, acme, Some("acme"));
        assert!(!text.contains("beta"), "{text}");
        // beta drained meanwhile: the operator still gets its zero.
        let drained = MetricsSnapshot {
            unresolved: vec![group("acme", "shop", "charge", 1)],
            sources: vec![source("acme", "shop"), source("beta", "app")],
            ..MetricsSnapshot::default()
        };
        let text = scrape(&m, drained, None);
        assert!(text.contains(
            "reckon_unresolved_effects{tenant=\"beta\",source=\"app\",operation=\"email\",kind=\"unknown\"} 0\n"
        ), "{text}");
    }

    #[test]
    fn parked_effects_are_a_gauge_per_operation_folded_like_the_others_and_zero_once_drained() {
        let m = MetricsState::default();
        // One group per operation past the per-source limit: the smallest fold into "_other",
        // parked counts with them.
        let mut unresolved: Vec<UnresolvedGroup> = (0..MAX_OPERATIONS_PER_SOURCE as i64 + 2)
            .map(|i| UnresolvedGroup {
                needs_attention: 1,
                ..group("acme", "shop", &format!("op{i:02}"), 100 - i)
            })
            .collect();
        unresolved[0].needs_attention = 7;
        let s = MetricsSnapshot {
            unresolved,
            sources: vec![source("acme", "shop")],
            ..MetricsSnapshot::default()
        };
        let text = scrape(&m, s, None);
        for line in [
            "reckon_needs_attention_effects{tenant=\"acme\",source=\"shop\",operation=\"op00\"} 7\n",
            "reckon_needs_attention_effects{tenant=\"acme\",source=\"shop\",operation=\"op01\"} 1\n",
            "reckon_needs_attention_effects{tenant=\"acme\",source=\"shop\",operation=\"_other\"} 2\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert_eq!(
            text.matches("reckon_needs_attention_effects{").count(),
            MAX_OPERATIONS_PER_SOURCE + 1
        );
        let drained = MetricsSnapshot {
            sources: vec![source("acme", "shop")],
            ..MetricsSnapshot::default()
        };
        let text = scrape(&m, drained, None);
        assert!(text.contains(
            "reckon_needs_attention_effects{tenant=\"acme\",source=\"shop\",operation=\"op00\"} 0\n"
        ), "{text}");
    }

    #[test]
    fn unrouted_effects_are_counted_apart_and_only_routed_ones_have_a_replay_window() {
        let m = MetricsState::default();
        let s = MetricsSnapshot {
            unresolved: vec![
                UnresolvedGroup {
                    replay_window_closing: 1,
                    replay_window_closed: 2,
                    ..group("acme", "shop", "charge", 3)
                },
                UnresolvedGroup {
                    routed: false,
                    ..group("acme", "shop", "email", 2)
                },
            ],
            sources: vec![source("acme", "shop")],
            ..MetricsSnapshot::default()
        };
        let text = scrape(&m, s, None);
        for line in [
            "reckon_replay_window_closing_effects{tenant=\"acme\",source=\"shop\",operation=\"charge\"} 1\n",
            "reckon_replay_window_closed_effects{tenant=\"acme\",source=\"shop\",operation=\"charge\"} 2\n",
            "reckon_unrouted_effects{tenant=\"acme\",source=\"shop\",operation=\"charge\"} 0\n",
            "reckon_replay_window_closing_effects{tenant=\"acme\",source=\"shop\",operation=\"email\"} 0\n",
            "reckon_replay_window_closed_effects{tenant=\"acme\",source=\"shop\",operation=\"email\"} 0\n",
            "reckon_unrouted_effects{tenant=\"acme\",source=\"shop\",operation=\"email\"} 2\n",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn the_pool_is_written_by_state() {
        let mut out = String::new();
        write_pool(
            reckon_ledger::PoolStatus {
                idle: 2,
                in_use: 1,
                max: 10,
            },
            &mut out,
        );
        assert!(
            out.contains("reckon_ledger_pool_connections{state=\"idle\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains("reckon_ledger_pool_connections{state=\"in_use\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("reckon_ledger_pool_connections{state=\"max\"} 10\n"),
            "{out}"
        );
    }

    #[test]
    fn label_values_are_escaped_and_help_texts_need_no_escaping() {
        let mut f = Family::new(&SOURCE_UP);
        f.sample(&[("tenant", "a\"b"), ("source", "c\\d\ne")], 1.0);
        let mut out = String::new();
        f.write_to(&mut out);
        assert_eq!(
            out,
            "# HELP reckon_source_up 1 if the source's latest scan succeeded, 0 if it failed or none succeeded yet.\n\
             # TYPE reckon_source_up gauge\n\
             reckon_source_up{tenant=\"a\\\"b\",source=\"c\\\\d\\ne\"} 1\n"
        );
        for def in LEDGER_FAMILIES {
            assert!(
                !def.help.contains(['\\', '\n']),
                "{} help needs escaping",
                def.name
            );
        }
        let mut v = String::new();
        write_value(f64::INFINITY, &mut v);
        write_value(1_764_512_345.5, &mut v);
        assert_eq!(v, "+Inf1764512345.5");
    }
}
