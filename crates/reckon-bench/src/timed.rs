//! Where a scan's time goes, measured without touching the engine or the ledger:
//! [`TimedLedger`] wraps the real ledger and times every call the scan makes, and
//! [`StatementLayer`] collects the `elapsed` that sqlx reports for every statement it runs
//! (target `sqlx::query`), on the source connection and on the ledger pool alike.

use async_trait::async_trait;
use reckon_domain::Disappearance;
use reckon_ledger::{
    Backend, Effect, EffectDetail, EffectQuery, IngestBatch, IngestOutcome, Lease, Ledger,
    NewSource, Origin, QuarantineCount, QuarantineEntry, Result, Role, Source, Tenant, TenantId,
    TokenGrant,
};
use secrecy::SecretString;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// One ledger call made during a scan.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: &'static str,
    pub origin: Option<Origin>,
    pub start: Instant,
    pub dur: Duration,
    /// Records + rejected rows of an ingest batch, keys of a page or a mark_gone call.
    pub items: usize,
    /// For a successful ingest: (created, updated, unchanged, quarantined).
    pub outcome: Option<(u64, u64, u64, u64)>,
}

pub struct TimedLedger {
    inner: Arc<dyn Ledger>,
    calls: Mutex<Vec<Call>>,
}

impl TimedLedger {
    pub fn new(inner: Arc<dyn Ledger>) -> TimedLedger {
        TimedLedger {
            inner,
            calls: Mutex::new(Vec::new()),
        }
    }

    /// Totals of the successful ingests that started at or after `since`:
    /// (rows, created, updated, unchanged, quarantined). A scan that fails returns no
    /// report, so this is how its stored batches are counted.
    pub fn ingested_since(&self, since: Instant) -> (u64, u64, u64, u64, u64) {
        let calls = self.calls.lock().expect("calls lock");
        calls
            .iter()
            .filter(|c| c.method == "ingest" && c.start >= since)
            .filter_map(|c| c.outcome.map(|o| (c.items as u64, o)))
            .fold((0, 0, 0, 0, 0), |a, (n, o)| {
                (a.0 + n, a.1 + o.0, a.2 + o.1, a.3 + o.2, a.4 + o.3)
            })
    }

    /// The calls recorded since the last `take`.
    pub fn take(&self) -> Vec<Call> {
        std::mem::take(&mut *self.calls.lock().expect("calls lock"))
    }

    async fn timed<T>(
        &self,
        method: &'static str,
        origin: Option<Origin>,
        items: usize,
        fut: impl Future<Output = T>,
    ) -> T {
        let start = Instant::now();
        let out = fut.await;
        let dur = start.elapsed();
        self.calls.lock().expect("calls lock").push(Call {
            method,
            origin,
            start,
            dur,
            items,
            outcome: None,
        });
        out
    }
}

#[async_trait]
impl Ledger for TimedLedger {
    fn backend(&self) -> Backend {
        self.inner.backend()
    }
    async fn migrate(&self) -> Result<()> {
        self.inner.migrate().await
    }
    async fn ping(&self) -> Result<()> {
        self.inner.ping().await
    }
    fn pool_status(&self) -> reckon_ledger::PoolStatus {
        self.inner.pool_status()
    }
    async fn instance_identity(&self) -> Result<String> {
        self.inner.instance_identity().await
    }
    async fn create_tenant(&self, slug: &str) -> Result<Tenant> {
        self.inner.create_tenant(slug).await
    }
    async fn tenant_by_slug(&self, slug: &str) -> Result<Tenant> {
        self.inner.tenant_by_slug(slug).await
    }
    async fn tenant_by_id(&self, tenant: TenantId) -> Result<Tenant> {
        self.inner.tenant_by_id(tenant).await
    }
    async fn list_tenants(&self) -> Result<Vec<Tenant>> {
        self.inner.list_tenants().await
    }
    async fn create_token(
        &self,
        tenant: TenantId,
        role: Role,
        token_hash: &str,
        label: &str,
    ) -> Result<i64> {
        self.inner
            .create_token(tenant, role, token_hash, label)
            .await
    }
    async fn authenticate_token(&self, token_hash: &str) -> Result<Option<TokenGrant>> {
        self.inner.authenticate_token(token_hash).await
    }
    async fn add_source(&self, tenant: TenantId, new: NewSource) -> Result<Source> {
        self.inner.add_source(tenant, new).await
    }
    async fn list_sources(&self, tenant: TenantId) -> Result<Vec<Source>> {
        self.inner.list_sources(tenant).await
    }
    async fn source_by_name(&self, tenant: TenantId, name: &str) -> Result<Source> {
        self.inner.source_by_name(tenant, name).await
    }
    async fn update_source(
        &self,
        tenant: TenantId,
        name: &str,
        change: reckon_ledger::SourceChange,
    ) -> Result<Source> {
        self.inner.update_source(tenant, name, change).await
    }
    async fn update_provider(
        &self,
        tenant: TenantId,
        name: &str,
        change: reckon_ledger::ProviderChange,
    ) -> Result<reckon_ledger::Provider> {
        self.inner.update_provider(tenant, name, change).await
    }
    async fn all_scanned_sources(&self) -> Result<Vec<(Tenant, Source)>> {
        self.inner.all_scanned_sources().await
    }
    async fn source_dsn(&self, tenant: TenantId, source: &Source) -> Result<SecretString> {
        self.timed("source_dsn", None, 0, self.inner.source_dsn(tenant, source))
            .await
    }
    async fn record_scan_success(
        &self,
        tenant: TenantId,
        source_id: i64,
        at: f64,
        full: bool,
        lease: Option<&Lease>,
    ) -> Result<()> {
        self.timed(
            "record_scan_success",
            None,
            0,
            self.inner
                .record_scan_success(tenant, source_id, at, full, lease),
        )
        .await
    }
    async fn record_scan_failure(
        &self,
        tenant: TenantId,
        source_id: i64,
        at: f64,
        error: &str,
        lease: Option<&Lease>,
    ) -> Result<()> {
        self.timed(
            "record_scan_failure",
            None,
            0,
            self.inner
                .record_scan_failure(tenant, source_id, at, error, lease),
        )
        .await
    }
    async fn ingest(
        &self,
        tenant: TenantId,
        source_id: i64,
        batch: IngestBatch,
    ) -> Result<IngestOutcome> {
        let origin = batch.origin;
        let items = batch.records.len() + batch.rejected.len();
        let start = Instant::now();
        let out = self.inner.ingest(tenant, source_id, batch).await;
        self.calls.lock().expect("calls lock").push(Call {
            method: "ingest",
            origin: Some(origin),
            start,
            dur: start.elapsed(),
            items,
            outcome: out
                .as_ref()
                .ok()
                .map(|o| (o.created, o.updated, o.unchanged, o.quarantined)),
        });
        out
    }
    async fn present_keys(
        &self,
        tenant: TenantId,
        source_id: i64,
        after_id: i64,
        limit: i64,
    ) -> Result<Vec<(i64, String)>> {
        let start = Instant::now();
        let out = self
            .inner
            .present_keys(tenant, source_id, after_id, limit)
            .await;
        let items = out.as_ref().map(Vec::len).unwrap_or(0);
        self.calls.lock().expect("calls lock").push(Call {
            method: "present_keys",
            origin: None,
            start,
            dur: start.elapsed(),
            items,
            outcome: None,
        });
        out
    }
    async fn mark_gone(
        &self,
        tenant: TenantId,
        source_id: i64,
        keys: &[String],
        at: f64,
        origin: Origin,
        lease: Option<&Lease>,
    ) -> Result<Vec<(String, Disappearance)>> {
        self.timed(
            "mark_gone",
            Some(origin),
            keys.len(),
            self.inner
                .mark_gone(tenant, source_id, keys, at, origin, lease),
        )
        .await
    }
    async fn list_effects(&self, tenant: TenantId, query: &EffectQuery) -> Result<Vec<Effect>> {
        self.inner.list_effects(tenant, query).await
    }
    async fn get_effect(
        &self,
        tenant: TenantId,
        source_name: &str,
        key: &str,
    ) -> Result<Option<EffectDetail>> {
        self.inner.get_effect(tenant, source_name, key).await
    }
    async fn lookup(&self, tenant: TenantId, text: &str, limit: i64) -> Result<Vec<Effect>> {
        self.inner.lookup(tenant, text, limit).await
    }
    async fn quarantine_counts(&self, tenant: TenantId) -> Result<Vec<QuarantineCount>> {
        self.inner.quarantine_counts(tenant).await
    }
    async fn list_quarantine(
        &self,
        tenant: TenantId,
        source_id: i64,
        limit: i64,
    ) -> Result<Vec<QuarantineEntry>> {
        self.inner.list_quarantine(tenant, source_id, limit).await
    }
    async fn try_lease(&self, name: &str, owner: &str, ttl_secs: f64) -> Result<Option<Lease>> {
        self.inner.try_lease(name, owner, ttl_secs).await
    }
    async fn renew_lease(&self, lease: &Lease, ttl_secs: f64) -> Result<Option<Lease>> {
        self.inner.renew_lease(lease, ttl_secs).await
    }
    async fn release_lease(&self, lease: &Lease) -> Result<()> {
        self.inner.release_lease(lease).await
    }
    async fn lease_holder(&self, name: &str) -> Result<Option<Lease>> {
        self.inner.lease_holder(name).await
    }
    async fn count_leases(&self, prefix: &str) -> Result<i64> {
        self.inner.count_leases(prefix).await
    }
    async fn metrics_snapshot(
        &self,
        q: reckon_ledger::MetricsQuery,
    ) -> Result<reckon_ledger::MetricsSnapshot> {
        self.inner.metrics_snapshot(q).await
    }

    // ---- the master key (issue 3): plain delegation ----
    async fn check_keyring(&self) -> Result<()> {
        self.inner.check_keyring().await
    }
    async fn rotate_keyring(
        &self,
        new: &reckon_ledger::Keyring,
    ) -> Result<reckon_ledger::RotateReport> {
        self.inner.rotate_keyring(new).await
    }
    async fn record_action(
        &self,
        tenant: TenantId,
        action: reckon_ledger::NewAction,
    ) -> Result<()> {
        self.inner.record_action(tenant, action).await
    }
    async fn list_actions(
        &self,
        tenant: TenantId,
        before_id: Option<i64>,
        limit: i64,
    ) -> Result<Vec<reckon_ledger::Action>> {
        self.inner.list_actions(tenant, before_id, limit).await
    }

    // ---- reconciliation (issue 4): plain delegation ----
    async fn add_provider(
        &self,
        tenant: TenantId,
        new: reckon_ledger::NewProvider,
    ) -> Result<reckon_ledger::Provider> {
        self.inner.add_provider(tenant, new).await
    }
    async fn list_providers(&self, tenant: TenantId) -> Result<Vec<reckon_ledger::Provider>> {
        self.inner.list_providers(tenant).await
    }
    async fn provider_by_name(
        &self,
        tenant: TenantId,
        name: &str,
    ) -> Result<reckon_ledger::Provider> {
        self.inner.provider_by_name(tenant, name).await
    }
    async fn provider_by_id(&self, tenant: TenantId, id: i64) -> Result<reckon_ledger::Provider> {
        self.inner.provider_by_id(tenant, id).await
    }
    async fn provider_secret(
        &self,
        tenant: TenantId,
        provider: &reckon_ledger::Provider,
    ) -> Result<Option<SecretString>> {
        self.inner.provider_secret(tenant, provider).await
    }
    async fn set_route(
        &self,
        tenant: TenantId,
        source: &str,
        operation: &str,
        provider: Option<&str>,
    ) -> Result<reckon_ledger::Route> {
        self.inner
            .set_route(tenant, source, operation, provider)
            .await
    }
    async fn list_routes(&self, tenant: TenantId) -> Result<Vec<reckon_ledger::Route>> {
        self.inner.list_routes(tenant).await
    }
    async fn claim_due(
        &self,
        tenant: TenantId,
        owner: &str,
        now: f64,
        lease_secs: f64,
        limit: i64,
    ) -> Result<Vec<reckon_ledger::Claim>> {
        self.inner
            .claim_due(tenant, owner, now, lease_secs, limit)
            .await
    }
    async fn claim_effect(
        &self,
        tenant: TenantId,
        effect_id: i64,
        owner: &str,
        now: f64,
        lease_secs: f64,
    ) -> Result<Option<reckon_ledger::Claim>> {
        self.inner
            .claim_effect(tenant, effect_id, owner, now, lease_secs)
            .await
    }
    async fn defer(
        &self,
        tenant: TenantId,
        effect_id: i64,
        owner: &str,
        next_attempt_at: f64,
        note: &str,
    ) -> Result<()> {
        self.inner
            .defer(tenant, effect_id, owner, next_attempt_at, note)
            .await
    }
    async fn record_attempt(
        &self,
        tenant: TenantId,
        effect_id: i64,
        owner: &str,
        attempt: reckon_ledger::NewAttempt,
    ) -> Result<reckon_ledger::AttemptRecorded> {
        self.inner
            .record_attempt(tenant, effect_id, owner, attempt)
            .await
    }
    async fn resolve_by_hand(
        &self,
        tenant: TenantId,
        effect_id: i64,
        new: reckon_ledger::NewResolution,
    ) -> Result<reckon_ledger::Resolution> {
        self.inner.resolve_by_hand(tenant, effect_id, new).await
    }
    async fn reconcile_view(
        &self,
        tenant: TenantId,
        effect_id: i64,
    ) -> Result<reckon_ledger::ReconcileView> {
        self.inner.reconcile_view(tenant, effect_id).await
    }
    async fn requeue_indeterminate(
        &self,
        tenant: TenantId,
        provider_id: i64,
        from: f64,
        to: f64,
        now: f64,
    ) -> Result<u64> {
        self.inner
            .requeue_indeterminate(tenant, provider_id, from, to, now)
            .await
    }

    // ---- write-back (issue 4 item 7): delegated untimed ----
    async fn set_source_writeback(
        &self,
        tenant: TenantId,
        source: &str,
        policy: Option<reckon_ledger::WritebackPolicy>,
    ) -> Result<Source> {
        self.inner
            .set_source_writeback(tenant, source, policy)
            .await
    }
    async fn writeback_candidates(
        &self,
        tenant: TenantId,
        source_id: Option<i64>,
        limit: i64,
    ) -> Result<Vec<reckon_ledger::WritebackCandidate>> {
        self.inner
            .writeback_candidates(tenant, source_id, limit)
            .await
    }
    async fn list_writebacks(
        &self,
        tenant: TenantId,
        source_id: Option<i64>,
        status: Option<reckon_ledger::WritebackStatus>,
        limit: i64,
    ) -> Result<Vec<reckon_ledger::Writeback>> {
        self.inner
            .list_writebacks(tenant, source_id, status, limit)
            .await
    }
    async fn begin_writeback(
        &self,
        tenant: TenantId,
        new: reckon_ledger::NewWriteback,
        lease: Option<&Lease>,
    ) -> Result<reckon_ledger::Writeback> {
        self.inner.begin_writeback(tenant, new, lease).await
    }
    async fn finish_writeback(
        &self,
        tenant: TenantId,
        id: i64,
        status: reckon_ledger::WritebackStatus,
        detail: &str,
        recovered: bool,
        lease: Option<&Lease>,
    ) -> Result<reckon_ledger::Writeback> {
        self.inner
            .finish_writeback(tenant, id, status, detail, recovered, lease)
            .await
    }
    // ---- end write-back ----
    // ---- dashboard (issue 7, branch `dash`): plain delegation ----
    async fn unresolved_queue(
        &self,
        tenant: TenantId,
        q: &reckon_ledger::QueueQuery,
    ) -> Result<Vec<reckon_ledger::QueueRow>> {
        self.inner.unresolved_queue(tenant, q).await
    }
    async fn unresolved_summary(
        &self,
        tenant: TenantId,
        now: f64,
        replay: reckon_ledger::ReplayClosing,
    ) -> Result<Vec<reckon_ledger::KindSummary>> {
        self.inner.unresolved_summary(tenant, now, replay).await
    }
    async fn take_snapshot(&self, tenant: TenantId, now: f64) -> Result<reckon_ledger::Snapshot> {
        self.inner.take_snapshot(tenant, now).await
    }
    async fn snapshots(
        &self,
        tenant: TenantId,
        since: f64,
    ) -> Result<Vec<reckon_ledger::Snapshot>> {
        self.inner.snapshots(tenant, since).await
    }
    async fn provider_health(
        &self,
        tenant: TenantId,
        since: f64,
    ) -> Result<Vec<reckon_ledger::ProviderHealth>> {
        self.inner.provider_health(tenant, since).await
    }
    async fn request_scan(
        &self,
        tenant: TenantId,
        name: &str,
        at: f64,
    ) -> Result<reckon_ledger::Source> {
        self.inner.request_scan(tenant, name, at).await
    }
}

/// Totals for one statement text.
#[derive(Debug, Default, Clone)]
pub struct StatementStat {
    pub count: u64,
    pub total: f64,
    pub max: f64,
    pub rows_returned: u64,
    pub rows_affected: u64,
}

pub type StatementStats = Arc<Mutex<HashMap<String, StatementStat>>>;

/// Collects sqlx's per-statement log events (`sqlx::query`, emitted when a statement
/// finishes; for a streamed query that is when the stream is dropped, so its `elapsed`
/// includes the time the consumer spent between rows).
pub struct StatementLayer {
    pub stats: StatementStats,
}

#[derive(Default)]
struct Fields {
    summary: String,
    statement: String,
    elapsed: f64,
    rows_returned: u64,
    rows_affected: u64,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "summary" => self.summary = value.to_owned(),
            "db.statement" => self.statement = value.to_owned(),
            _ => {}
        }
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        if field.name() == "elapsed_secs" {
            self.elapsed = value;
        }
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        match field.name() {
            "rows_returned" => self.rows_returned = value,
            "rows_affected" => self.rows_affected = value,
            _ => {}
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        // `summary` and `db.statement` may arrive as Debug if recorded without a str hint.
        match field.name() {
            "summary" if self.summary.is_empty() => {
                self.summary = format!("{value:?}").trim_matches('"').to_owned()
            }
            "db.statement" if self.statement.is_empty() => {
                self.statement = format!("{value:?}").trim_matches('"').replace("\\n", " ")
            }
            _ => {}
        }
    }
}

/// A short, distinguishing label: the head and the tail of the statement.
fn label(sql: &str) -> String {
    let flat = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    let chars: Vec<char> = flat.chars().collect();
    if chars.len() <= 96 {
        flat
    } else {
        let head: String = chars[..56].iter().collect();
        let tail: String = chars[chars.len() - 36..].iter().collect();
        format!("{head} … {tail}")
    }
}

impl<S: Subscriber> Layer<S> for StatementLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if event.metadata().target() != "sqlx::query" {
            return;
        }
        let mut f = Fields::default();
        event.record(&mut f);
        let sql = if f.statement.trim().is_empty() {
            f.summary.trim_end_matches(" …").to_owned()
        } else {
            f.statement
        };
        let mut stats = self.stats.lock().expect("stats lock");
        let s = stats.entry(label(&sql)).or_default();
        s.count += 1;
        s.total += f.elapsed;
        s.max = s.max.max(f.elapsed);
        s.rows_returned += f.rows_returned;
        s.rows_affected += f.rows_affected;
    }
}

// Account calls are not timed: the benchmarks measure scans.
#[async_trait]
impl reckon_ledger::Accounts for TimedLedger {
    async fn create_user(
        &self,
        email: &str,
        password_hash: &str,
    ) -> reckon_ledger::Result<reckon_ledger::User> {
        self.inner.create_user(email, password_hash).await
    }
    async fn user_by_email(
        &self,
        email: &str,
    ) -> reckon_ledger::Result<Option<reckon_ledger::UserCredentials>> {
        self.inner.user_by_email(email).await
    }
    async fn set_membership(
        &self,
        tenant: reckon_ledger::TenantId,
        user_id: i64,
        role: reckon_ledger::Role,
    ) -> reckon_ledger::Result<()> {
        self.inner.set_membership(tenant, user_id, role).await
    }
    async fn memberships(
        &self,
        user_id: i64,
    ) -> reckon_ledger::Result<Vec<(reckon_ledger::Tenant, reckon_ledger::Role)>> {
        self.inner.memberships(user_id).await
    }
    async fn members(
        &self,
        tenant: reckon_ledger::TenantId,
    ) -> reckon_ledger::Result<Vec<(reckon_ledger::User, reckon_ledger::Role)>> {
        self.inner.members(tenant).await
    }
    async fn set_password(&self, user_id: i64, password_hash: &str) -> reckon_ledger::Result<()> {
        self.inner.set_password(user_id, password_hash).await
    }
    async fn set_user_disabled(&self, user_id: i64, disabled: bool) -> reckon_ledger::Result<()> {
        self.inner.set_user_disabled(user_id, disabled).await
    }
    async fn use_totp_step(&self, user_id: i64, step: i64) -> reckon_ledger::Result<bool> {
        self.inner.use_totp_step(user_id, step).await
    }
    async fn set_totp_secret(
        &self,
        user_id: i64,
        secret: Option<&[u8]>,
    ) -> reckon_ledger::Result<()> {
        self.inner.set_totp_secret(user_id, secret).await
    }
    async fn create_session(
        &self,
        tenant: reckon_ledger::TenantId,
        new: reckon_ledger::NewSession,
    ) -> reckon_ledger::Result<()> {
        self.inner.create_session(tenant, new).await
    }
    async fn session(
        &self,
        id_hash: &str,
        now: f64,
        idle_secs: f64,
    ) -> reckon_ledger::Result<Option<reckon_ledger::SessionGrant>> {
        self.inner.session(id_hash, now, idle_secs).await
    }
    async fn delete_session(&self, id_hash: &str) -> reckon_ledger::Result<()> {
        self.inner.delete_session(id_hash).await
    }
    async fn throttle_failures(
        &self,
        scope: &str,
        key: &str,
        now: f64,
        window: f64,
    ) -> reckon_ledger::Result<i64> {
        self.inner.throttle_failures(scope, key, now, window).await
    }
    async fn throttle_record_failure(
        &self,
        scope: &str,
        key: &str,
        now: f64,
        window: f64,
    ) -> reckon_ledger::Result<()> {
        self.inner
            .throttle_record_failure(scope, key, now, window)
            .await
    }
    async fn throttle_admit(
        &self,
        account: &str,
        address: &str,
        now: f64,
        policy: &reckon_ledger::ThrottlePolicy,
    ) -> reckon_ledger::Result<reckon_ledger::Admission> {
        self.inner
            .throttle_admit(account, address, now, policy)
            .await
    }
    async fn throttle_succeeded(&self, account: &str, address: &str) -> reckon_ledger::Result<()> {
        self.inner.throttle_succeeded(account, address).await
    }
    async fn throttle_reset(&self, scope: &str, key: &str) -> reckon_ledger::Result<()> {
        self.inner.throttle_reset(scope, key).await
    }
    async fn create_token_by(
        &self,
        tenant: reckon_ledger::TenantId,
        role: reckon_ledger::Role,
        token_hash: &str,
        label: &str,
        creator: reckon_ledger::TokenCreator,
    ) -> reckon_ledger::Result<i64> {
        self.inner
            .create_token_by(tenant, role, token_hash, label, creator)
            .await
    }
    async fn list_tokens(
        &self,
        tenant: reckon_ledger::TenantId,
    ) -> reckon_ledger::Result<Vec<reckon_ledger::TokenInfo>> {
        self.inner.list_tokens(tenant).await
    }
    async fn revoke_token(
        &self,
        tenant: reckon_ledger::TenantId,
        token_id: i64,
    ) -> reckon_ledger::Result<bool> {
        self.inner.revoke_token(tenant, token_id).await
    }
}

// ---- audit (issue 6, branch `audit`): delegate the audit storage unchanged ----
#[async_trait]
impl reckon_ledger::Audits for TimedLedger {
    async fn audit_settings(
        &self,
        tenant: reckon_ledger::TenantId,
    ) -> reckon_ledger::Result<reckon_ledger::AuditSettings> {
        self.inner.audit_settings(tenant).await
    }
    async fn set_audit_settings(
        &self,
        tenant: reckon_ledger::TenantId,
        s: &reckon_ledger::AuditSettings,
    ) -> reckon_ledger::Result<()> {
        self.inner.set_audit_settings(tenant, s).await
    }
    async fn store_provider_charges(
        &self,
        tenant: reckon_ledger::TenantId,
        charges: &[reckon_ledger::StoredCharge],
    ) -> reckon_ledger::Result<u64> {
        self.inner.store_provider_charges(tenant, charges).await
    }
    async fn provider_charges(
        &self,
        tenant: reckon_ledger::TenantId,
        provider_id: Option<i64>,
        from: f64,
        to: f64,
    ) -> reckon_ledger::Result<Vec<reckon_ledger::StoredCharge>> {
        self.inner
            .provider_charges(tenant, provider_id, from, to)
            .await
    }
    async fn charges_by_ids_or_keys(
        &self,
        tenant: reckon_ledger::TenantId,
        ids: &[String],
        keys: &[String],
        limit: i64,
    ) -> reckon_ledger::Result<Vec<reckon_ledger::StoredCharge>> {
        self.inner
            .charges_by_ids_or_keys(tenant, ids, keys, limit)
            .await
    }
    async fn effects_created_between(
        &self,
        tenant: reckon_ledger::TenantId,
        from: f64,
        to: f64,
        now: f64,
    ) -> reckon_ledger::Result<Vec<reckon_ledger::Effect>> {
        self.inner
            .effects_created_between(tenant, from, to, now)
            .await
    }
    async fn record_audit_run(
        &self,
        tenant: reckon_ledger::TenantId,
        run: reckon_ledger::NewAuditRun,
        lease: Option<&reckon_ledger::Lease>,
    ) -> reckon_ledger::Result<reckon_ledger::AuditRun> {
        self.inner.record_audit_run(tenant, run, lease).await
    }
    async fn list_audit_runs(
        &self,
        tenant: reckon_ledger::TenantId,
        day: Option<&str>,
        limit: i64,
    ) -> reckon_ledger::Result<Vec<reckon_ledger::AuditRun>> {
        self.inner.list_audit_runs(tenant, day, limit).await
    }
    async fn get_audit_run(
        &self,
        tenant: reckon_ledger::TenantId,
        id: i64,
    ) -> reckon_ledger::Result<Option<reckon_ledger::AuditRun>> {
        self.inner.get_audit_run(tenant, id).await
    }
    async fn audit_chain(
        &self,
        tenant: reckon_ledger::TenantId,
        after_seq: i64,
        limit: i64,
    ) -> reckon_ledger::Result<Vec<reckon_ledger::AuditRun>> {
        self.inner.audit_chain(tenant, after_seq, limit).await
    }
    async fn scheduled_audit_done(
        &self,
        tenant: reckon_ledger::TenantId,
        day: &str,
        provider: &str,
    ) -> reckon_ledger::Result<bool> {
        self.inner.scheduled_audit_done(tenant, day, provider).await
    }
    async fn audit_metric(
        &self,
        tenant: reckon_ledger::TenantId,
    ) -> reckon_ledger::Result<Option<reckon_ledger::AuditMetric>> {
        self.inner.audit_metric(tenant).await
    }
    async fn audit_glance(
        &self,
        tenant: reckon_ledger::TenantId,
        day: &str,
    ) -> reckon_ledger::Result<Option<reckon_ledger::AuditGlance>> {
        self.inner.audit_glance(tenant, day).await
    }
    async fn audit_links(
        &self,
        tenant: reckon_ledger::TenantId,
    ) -> reckon_ledger::Result<Vec<reckon_ledger::ChainLink>> {
        self.inner.audit_links(tenant).await
    }
}
