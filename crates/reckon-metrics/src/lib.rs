//! Instance-level metrics: counters and histograms that code updates as things happen
//! (records ingested, scan errors, reconcile outcomes, provider requests, HTTP requests,
//! audit results). One [`Metrics`] per process, cloned cheaply (the series are shared).
//!
//! This crate knows nothing of HTTP or the ledger, so the engine and the reconciler can
//! record into it without depending on `reckon-web`; `reckon-web` renders it next to the
//! gauges it computes from the ledger at scrape time.
//!
//! Labels stay bounded: tenant and source are slugs/names from reckon's own tables,
//! `provider` a configured provider name, the rest small enums defined here. Never a key,
//! an order id or user input.

use prometheus::{
    Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, core::Collector,
};
pub use reckon_domain::Outcome;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How one provider HTTP request ended, reduced to a bounded set for the `status` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderStatus {
    /// A 2xx answer that parsed.
    Ok,
    /// A 404: reckon asks only for what should exist (an http provider's lookup endpoint,
    /// an id Stripe issued), so this is a failed answer, and the effect is parked for a person.
    NotFound,
    RateLimited,
    ClientError,
    ServerError,
    Timeout,
    /// Connection refused/reset, TLS, DNS.
    Transport,
    /// A 2xx whose body could not be understood.
    Malformed,
}

impl ProviderStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderStatus::Ok => "ok",
            ProviderStatus::NotFound => "not_found",
            ProviderStatus::RateLimited => "rate_limited",
            ProviderStatus::ClientError => "client_error",
            ProviderStatus::ServerError => "server_error",
            ProviderStatus::Timeout => "timeout",
            ProviderStatus::Transport => "transport",
            ProviderStatus::Malformed => "malformed",
        }
    }

    /// Whether this status counts as a provider error in alerts: everything that is not a
    /// 2xx answer, a 404 included (`status!="ok"` in deploy/prometheus/alerts.yml).
    pub fn is_error(self) -> bool {
        !matches!(self, ProviderStatus::Ok)
    }
}

/// The standard `process_*` series of this process (CPU seconds, resident memory, open and
/// maximum file descriptors, threads, start time), read from `/proc` at each scrape. Linux
/// only: elsewhere they are simply not exported.
fn process_collector() -> Option<Box<dyn Collector>> {
    #[cfg(target_os = "linux")]
    {
        Some(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// Buckets for provider calls: tens of milliseconds to the 30 s a slow API may take.
const PROVIDER_BUCKETS: &[f64] = &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
/// Buckets for our own HTTP handlers.
const HTTP_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    records_ingested: IntCounterVec,
    scan_errors: IntCounterVec,
    reconcile_outcomes: IntCounterVec,
    provider_duration: HistogramVec,
    http_requests: IntCounterVec,
    http_duration: HistogramVec,
    audit_findings: GaugeVec,
    audit_last_run: GaugeVec,
    audit_runs: IntCounterVec,
    audit_failing: GaugeVec,
    /// tenant -> the providers its `audit_failing` series name now (a provider removed
    /// from the tenant loses its series at the next publish).
    audit_failing_names: Arc<Mutex<HashMap<String, BTreeSet<String>>>>,
    audit_scheduled: GaugeVec,
    audit_scheduled_complete: GaugeVec,
    provider_calibrated: GaugeVec,
    provider_calibration_found: GaugeVec,
    build_info: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let records_ingested = IntCounterVec::new(
            Opts::new(
                "reckon_records_ingested_total",
                "Source records this instance stored as new or changed effects.",
            ),
            &["tenant", "source"],
        )
        .expect("valid metric");
        let scan_errors = IntCounterVec::new(
            Opts::new(
                "reckon_source_scan_errors_total",
                "Scans of a source that failed on this instance.",
            ),
            &["tenant", "source"],
        )
        .expect("valid metric");
        let reconcile_outcomes = IntCounterVec::new(
            Opts::new(
                "reckon_reconcile_outcomes_total",
                "Provider lookups by their outcome: applied, not_applied, duplicate, indeterminate.",
            ),
            &["tenant", "provider", "outcome"],
        )
        .expect("valid metric");
        let provider_duration = HistogramVec::new(
            HistogramOpts::new(
                "reckon_provider_request_duration_seconds",
                "Duration of provider HTTP requests, by provider and how they ended (status).",
            )
            .buckets(PROVIDER_BUCKETS.to_vec()),
            &["provider_kind", "provider", "status"],
        )
        .expect("valid metric");
        let http_requests = IntCounterVec::new(
            Opts::new(
                "reckon_http_requests_total",
                "HTTP requests served, by route template (never the raw path) and status code.",
            ),
            &["method", "route", "status"],
        )
        .expect("valid metric");
        let http_duration = HistogramVec::new(
            HistogramOpts::new(
                "reckon_http_request_duration_seconds",
                "Time to produce the response head, by route template.",
            )
            .buckets(HTTP_BUCKETS.to_vec()),
            &["method", "route"],
        )
        .expect("valid metric");
        let audit_findings = GaugeVec::new(
            Opts::new(
                "reckon_audit_findings",
                "Findings of the tenant's last audit, by kind (duplicate, orphan, missing, unresolved, risky_reclaim).",
            ),
            &["tenant", "kind"],
        )
        .expect("valid metric");
        let audit_last_run = GaugeVec::new(
            Opts::new(
                "reckon_audit_last_run_timestamp_seconds",
                "Unix time the tenant's last audit finished.",
            ),
            &["tenant"],
        )
        .expect("valid metric");
        let audit_runs = IntCounterVec::new(
            Opts::new(
                "reckon_audit_runs_total",
                "Audit runs this instance stored, counted once per provider the run read, with that provider's part's status (complete, failed); a run that reached no provider counts under its own selection (`*`: every provider of the tenant).",
            ),
            &["tenant", "provider", "status"],
        )
        .expect("valid metric");
        let audit_failing = GaugeVec::new(
            Opts::new(
                "reckon_audit_failing",
                "1 if the newest stored audit run that read this provider of the tenant failed to list its charges, 0 once a newer run read it whole; `*`: the newest run of every provider reached none. From the runs in the ledger, so every replica, and one just restarted, reports the same. Absent for a tenant with no provider.",
            ),
            &["tenant", "provider"],
        )
        .expect("valid metric");
        let audit_scheduled = GaugeVec::new(
            Opts::new(
                "reckon_audit_scheduled_timestamp_seconds",
                "Unix time the tenant's latest nightly audit was due (its audit time in its zone, at or before now). Absent for a tenant with no provider.",
            ),
            &["tenant"],
        )
        .expect("valid metric");
        let audit_scheduled_complete = GaugeVec::new(
            Opts::new(
                "reckon_audit_scheduled_day_complete",
                "1 if the day audited by the latest nightly run that was due has a complete scheduled run, 0 if not (yet).",
            ),
            &["tenant"],
        )
        .expect("valid metric");
        let provider_calibrated = GaugeVec::new(
            Opts::new(
                "reckon_provider_calibrated",
                "Whether the provider's lookup, as configured, finds the effects the application recorded as done: 1 calibrated, 0 uncalibrated (no final verdict of absence on it), -1 too few known-done effects to say. As this instance last measured it.",
            ),
            &["tenant", "provider"],
        )
        .expect("valid metric");
        let provider_calibration_found = GaugeVec::new(
            Opts::new(
                "reckon_provider_calibration_found_ratio",
                "The share of known-done effects the provider's lookup found at its last calibration on this instance.",
            ),
            &["tenant", "provider"],
        )
        .expect("valid metric");
        let build_info = Gauge::with_opts(
            Opts::new(
                "reckon_build_info",
                "Always 1; the version label says which reckon.",
            )
            .const_label("version", env!("CARGO_PKG_VERSION")),
        )
        .expect("valid metric");
        build_info.set(1.0);
        let m = Metrics {
            registry,
            records_ingested,
            scan_errors,
            reconcile_outcomes,
            provider_duration,
            http_requests,
            http_duration,
            audit_findings,
            audit_last_run,
            audit_runs,
            audit_failing,
            audit_failing_names: Arc::default(),
            audit_scheduled,
            audit_scheduled_complete,
            provider_calibrated,
            provider_calibration_found,
            build_info,
        };
        for c in m.collectors() {
            m.registry.register(c).expect("unique metric names");
        }
        if let Some(p) = process_collector() {
            m.registry.register(p).expect("unique metric names");
        }
        m
    }

    fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.records_ingested.clone()),
            Box::new(self.scan_errors.clone()),
            Box::new(self.reconcile_outcomes.clone()),
            Box::new(self.provider_duration.clone()),
            Box::new(self.http_requests.clone()),
            Box::new(self.http_duration.clone()),
            Box::new(self.audit_findings.clone()),
            Box::new(self.audit_last_run.clone()),
            Box::new(self.audit_runs.clone()),
            Box::new(self.audit_failing.clone()),
            Box::new(self.audit_scheduled.clone()),
            Box::new(self.audit_scheduled_complete.clone()),
            Box::new(self.provider_calibrated.clone()),
            Box::new(self.provider_calibration_found.clone()),
            Box::new(self.build_info.clone()),
        ]
    }

    /// The registry to render (`prometheus::TextEncoder`).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// This registry alone in the text format: for tests and tools (the server renders it
    /// next to the ledger's gauges).
    pub fn text(&self) -> String {
        let mut out = String::new();
        prometheus::TextEncoder::new()
            .encode_utf8(&self.registry.gather(), &mut out)
            .expect("the text format of our own families encodes");
        out
    }

    /// Every metric name this type defines, from the metrics' own descriptors (so a name
    /// check never relies on a hand-copied list). Histograms are listed by base name.
    pub fn metric_names(&self) -> Vec<String> {
        self.collectors()
            .into_iter()
            .chain(process_collector())
            .flat_map(|c| {
                c.desc()
                    .into_iter()
                    .map(|d| d.fq_name.clone())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// A finished scan of a source: `stored` records became new or changed effects.
    pub fn record_scan_success(&self, tenant: &str, source: &str, stored: u64) {
        self.records_ingested
            .with_label_values(&[tenant, source])
            .inc_by(stored);
    }

    /// A scan of a source that failed (or panicked). The counter is created at zero by the
    /// first success too, so `rate()` sees the first error.
    pub fn record_scan_error(&self, tenant: &str, source: &str) {
        self.scan_errors.with_label_values(&[tenant, source]).inc();
    }

    /// Make a source's counters exist at zero, so the first error is a visible increase.
    pub fn touch_source(&self, tenant: &str, source: &str) {
        self.records_ingested.with_label_values(&[tenant, source]);
        self.scan_errors.with_label_values(&[tenant, source]);
    }

    /// For the reconciler: one provider lookup ended with `outcome`.
    pub fn record_reconcile(&self, tenant: &str, provider: &str, outcome: Outcome) {
        self.reconcile_outcomes
            .with_label_values(&[tenant, provider, outcome.as_str()])
            .inc();
    }

    /// For provider clients: one HTTP request to a provider (`provider_kind` is `stripe`,
    /// `http` or `demo`; `provider` the configured provider's name).
    pub fn record_provider_request(
        &self,
        provider_kind: &str,
        provider: &str,
        status: ProviderStatus,
        took: Duration,
    ) {
        self.provider_duration
            .with_label_values(&[provider_kind, provider, status.as_str()])
            .observe(took.as_secs_f64());
    }

    /// For the audit: the findings of a tenant's finished audit, by kind, replacing the
    /// previous run's. Pass every kind, zeros included, so a cleared finding reads 0.
    pub fn record_audit(&self, tenant: &str, findings: &[(&str, u64)], finished_at: f64) {
        for (kind, n) in findings {
            self.audit_findings
                .with_label_values(&[tenant, kind])
                .set(*n as f64);
        }
        self.audit_last_run
            .with_label_values(&[tenant])
            .set(finished_at);
    }

    /// For the audit: one run stored (`status` is the run's: `complete` or `failed`).
    pub fn record_audit_run(&self, tenant: &str, provider: &str, status: &str) {
        self.audit_runs
            .with_label_values(&[tenant, provider, status])
            .inc();
    }

    /// For the audit: whether each provider's audit of the tenant is failing now, as the
    /// stored runs say (`reckon_audit::chain::failing_audits`), replacing the tenant's
    /// previous series: a provider no longer in `failing` loses its series.
    pub fn record_audit_failing(&self, tenant: &str, failing: &BTreeMap<String, bool>) {
        let mut names = self.audit_failing_names.lock().expect("audit names lock");
        let now: BTreeSet<String> = failing.keys().cloned().collect();
        if let Some(before) = names.get(tenant) {
            for gone in before.difference(&now) {
                let _ = self
                    .audit_failing
                    .remove_label_values(&[tenant, gone.as_str()]);
            }
        }
        for (provider, failed) in failing {
            self.audit_failing
                .with_label_values(&[tenant, provider.as_str()])
                .set(if *failed { 1.0 } else { 0.0 });
        }
        names.insert(tenant.to_owned(), now);
    }

    /// Make the nightly run's counters (`provider` `*`) exist at zero, so a first failure is
    /// an increase rather than a new series.
    pub fn touch_audit_runs(&self, tenant: &str) {
        for status in ["complete", "failed"] {
            self.audit_runs.with_label_values(&[tenant, "*", status]);
        }
    }

    /// For the audit schedule: the latest instant the tenant's nightly audit was due, and
    /// whether the day it audits has a complete scheduled run.
    pub fn record_audit_schedule(&self, tenant: &str, due_at: f64, complete: bool) {
        self.audit_scheduled
            .with_label_values(&[tenant])
            .set(due_at);
        self.audit_scheduled_complete
            .with_label_values(&[tenant])
            .set(if complete { 1.0 } else { 0.0 });
    }

    /// A provider's calibration: `state` 1 calibrated, 0 uncalibrated, -1 not measured yet;
    /// `found` the share of known-done effects its lookup found.
    pub fn provider_calibration(&self, tenant: &str, provider: &str, state: i64, found: f64) {
        self.provider_calibrated
            .with_label_values(&[tenant, provider])
            .set(state as f64);
        self.provider_calibration_found
            .with_label_values(&[tenant, provider])
            .set(found);
    }

    /// A tenant with nothing to audit (no provider): no schedule to be late for.
    pub fn forget_audit_schedule(&self, tenant: &str) {
        let _ = self.audit_scheduled.remove_label_values(&[tenant]);
        let _ = self.audit_scheduled_complete.remove_label_values(&[tenant]);
    }

    /// One HTTP request; `route` must be a route template (`MatchedPath`) or `unmatched`.
    pub fn record_http(&self, method: &str, route: &str, status: u16, took: Duration) {
        self.http_requests
            .with_label_values(&[method, route, &status.to_string()])
            .inc();
        self.http_duration
            .with_label_values(&[method, route])
            .observe(took.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{Encoder, TextEncoder};

    fn render(m: &Metrics) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&m.registry().gather(), &mut out)
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn recorded_events_appear_with_their_labels() {
        let m = Metrics::new();
        m.record_scan_success("acme", "shop", 3);
        m.record_scan_success("acme", "shop", 2);
        m.record_scan_error("acme", "shop");
        m.record_reconcile("acme", "stripe-live", Outcome::Indeterminate);
        m.record_provider_request(
            "stripe",
            "stripe-live",
            ProviderStatus::RateLimited,
            Duration::from_millis(30),
        );
        m.record_audit("acme", &[("duplicate", 2), ("orphan", 0)], 1700000000.0);
        m.touch_audit_runs("acme");
        m.record_audit_run("acme", "*", "failed");
        m.record_audit_schedule("acme", 1700020000.0, false);
        m.provider_calibration("acme", "stripe-live", 0, 0.25);
        let text = render(&m);
        for line in [
            "reckon_records_ingested_total{source=\"shop\",tenant=\"acme\"} 5",
            "reckon_source_scan_errors_total{source=\"shop\",tenant=\"acme\"} 1",
            "reckon_reconcile_outcomes_total{outcome=\"indeterminate\",provider=\"stripe-live\",tenant=\"acme\"} 1",
            "reckon_provider_request_duration_seconds_bucket{provider=\"stripe-live\",provider_kind=\"stripe\",status=\"rate_limited\",le=\"0.05\"} 1",
            "reckon_provider_request_duration_seconds_bucket{provider=\"stripe-live\",provider_kind=\"stripe\",status=\"rate_limited\",le=\"0.025\"} 0",
            "reckon_audit_findings{kind=\"duplicate\",tenant=\"acme\"} 2",
            "reckon_audit_findings{kind=\"orphan\",tenant=\"acme\"} 0",
            "reckon_audit_last_run_timestamp_seconds{tenant=\"acme\"} 1700000000",
            "reckon_audit_runs_total{provider=\"*\",status=\"complete\",tenant=\"acme\"} 0",
            "reckon_audit_runs_total{provider=\"*\",status=\"failed\",tenant=\"acme\"} 1",
            "reckon_audit_scheduled_timestamp_seconds{tenant=\"acme\"} 1700020000",
            "reckon_audit_scheduled_day_complete{tenant=\"acme\"} 0",
            "reckon_provider_calibrated{provider=\"stripe-live\",tenant=\"acme\"} 0",
            "reckon_provider_calibration_found_ratio{provider=\"stripe-live\",tenant=\"acme\"} 0.25",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn names_come_from_the_descriptors() {
        let names = Metrics::new().metric_names();
        assert!(names.contains(&"reckon_reconcile_outcomes_total".to_owned()));
        assert!(names.contains(&"reckon_provider_request_duration_seconds".to_owned()));
        let process = if cfg!(target_os = "linux") { 7 } else { 0 };
        assert_eq!(names.len(), 15 + process, "{names:?}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_process_series_are_exported_with_this_process_values() {
        let text = Metrics::new().text();
        for name in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_max_fds",
            "process_threads",
            "process_start_time_seconds",
        ] {
            let value: f64 = text
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                .unwrap_or_else(|| panic!("no {name} in\n{text}"))
                .parse()
                .unwrap();
            assert!(value >= 0.0, "{name} {value}");
        }
        let rss = text
            .lines()
            .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
            .unwrap();
        assert!(
            rss.parse::<f64>().unwrap() > 1e6,
            "a process holds more than 1 MB: {rss}"
        );
    }

    #[test]
    fn every_answer_but_a_2xx_is_a_provider_error_a_404_included() {
        assert!(!ProviderStatus::Ok.is_error());
        assert!(ProviderStatus::NotFound.is_error());
        assert!(ProviderStatus::ServerError.is_error());
    }

    #[test]
    fn a_providers_failing_audit_series_goes_with_the_provider() {
        let m = Metrics::new();
        let state = |pairs: &[(&str, bool)]| -> BTreeMap<String, bool> {
            pairs.iter().map(|(p, f)| ((*p).to_owned(), *f)).collect()
        };
        m.record_audit_failing(
            "acme",
            &state(&[("*", false), ("pay", true), ("old", true)]),
        );
        m.record_audit_failing("beta", &state(&[("*", true)]));
        m.record_audit_failing("acme", &state(&[("*", false), ("pay", true)]));
        let text = render(&m);
        for line in [
            "reckon_audit_failing{provider=\"pay\",tenant=\"acme\"} 1",
            "reckon_audit_failing{provider=\"*\",tenant=\"acme\"} 0",
            "reckon_audit_failing{provider=\"*\",tenant=\"beta\"} 1",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
        assert!(!text.contains("provider=\"old\""), "{text}");
        m.record_audit_failing("acme", &BTreeMap::new());
        assert!(!render(&m).contains("tenant=\"acme\""));
    }

    #[test]
    fn a_tenant_without_providers_has_no_audit_schedule() {
        let m = Metrics::new();
        m.record_audit_schedule("acme", 1700020000.0, true);
        m.record_audit_schedule("beta", 1700020000.0, false);
        m.forget_audit_schedule("beta");
        let text = render(&m);
        assert!(text.contains("reckon_audit_scheduled_day_complete{tenant=\"acme\"} 1"));
        assert!(!text.contains("tenant=\"beta\""), "{text}");
    }
}
