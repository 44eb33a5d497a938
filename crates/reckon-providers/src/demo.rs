//! The demo provider: a credential-free provider speaking the `http` protocol (see
//! [`crate::http`]) over a state it keeps itself. `reckon demo` and tests run it on
//! loopback; it decides nothing itself (the http adapter and `classify` do).

use crate::registry::Adapter;
use axum::extract::{Query, State};
use axum::routing::get;
use axum::{Json, Router};
use reckon_domain::ProviderKind;
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The demo in the registry of provider kinds: the http adapter with loopback defaults.
pub(crate) static ADAPTER: Adapter = Adapter {
    kind: ProviderKind::Demo,
    label: "Demo",
    needs_secret: None,
    build: |r, secret, client| crate::http::build(ProviderKind::Demo, r, secret, client),
    check_at_save: |_, _| Ok(()),
    replay_window_secs: |r| r.replay_window_secs,
    calibrates: false,
};

#[derive(Debug, Clone)]
pub struct DemoCharge {
    pub id: String,
    pub key: String,
    pub status: String,
    pub amount: i64,
    pub currency: String,
    pub created: f64,
    /// (refund id, amount, reason)
    pub refunds: Vec<(String, i64, Option<String>)>,
    pub metadata: BTreeMap<String, String>,
    pub customer: Option<String>,
}

#[derive(Clone, Default)]
pub struct DemoState {
    charges: Arc<Mutex<BTreeMap<String, Vec<DemoCharge>>>>,
    /// Simulated answer time, for benchmarks.
    pub delay: Option<Duration>,
    /// Lookups answered, so tests and benchmarks can count the provider's side.
    lookups: Arc<std::sync::atomic::AtomicU64>,
}

impl DemoState {
    pub fn new() -> DemoState {
        DemoState::default()
    }

    pub fn with_delay(delay: Duration) -> DemoState {
        DemoState {
            delay: Some(delay),
            ..DemoState::default()
        }
    }

    /// How many lookups this provider has answered.
    pub fn lookups(&self) -> u64 {
        self.lookups.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Record a charge made with `key`.
    pub fn charge(&self, key: &str, amount: i64, currency: &str, created: f64) -> String {
        self.charge_of(key, amount, currency, created, None)
    }

    /// Record a charge made with `key`, of `customer` as the provider names them.
    pub fn charge_of(
        &self,
        key: &str,
        amount: i64,
        currency: &str,
        created: f64,
        customer: Option<&str>,
    ) -> String {
        let mut map = self
            .charges
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n: usize = map.values().map(Vec::len).sum();
        let id = format!("demo_ch_{}", n + 1);
        map.entry(key.to_owned()).or_default().push(DemoCharge {
            id: id.clone(),
            key: key.to_owned(),
            status: "succeeded".into(),
            amount,
            currency: currency.into(),
            created,
            refunds: Vec::new(),
            metadata: BTreeMap::new(),
            customer: customer.map(str::to_owned),
        });
        id
    }

    /// Record a charge as given (its id is kept; `key` may be empty for a charge made
    /// without one, which the lookup endpoint then never finds).
    pub fn add(&self, c: DemoCharge) {
        let mut map = self
            .charges
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.entry(c.key.clone()).or_default().push(c);
    }
}

fn wire(c: &DemoCharge) -> Value {
    let refunded: i64 = c.refunds.iter().map(|r| r.1).sum();
    json!({ "id": c.id, "status": c.status, "amount": c.amount, "currency": c.currency,
            "created": c.created, "key": c.key, "amount_refunded": refunded })
}

/// The charges list's richer shape (see `crate::http`).
fn wire_charge(c: &DemoCharge) -> Value {
    let refunded: i64 = c.refunds.iter().map(|r| r.1).sum();
    json!({ "id": c.id, "status": c.status, "amount": c.amount, "currency": c.currency,
            "created": c.created,
            "idempotency_key": if c.key.is_empty() { None } else { Some(&c.key) },
            "amount_captured": if c.status == "succeeded" { c.amount } else { 0 },
            "amount_refunded": refunded,
            "refunds": c.refunds.iter()
                .map(|(id, amount, reason)| json!({"id": id, "amount": amount, "reason": reason}))
                .collect::<Vec<_>>(),
            "metadata": c.metadata, "customer": c.customer })
}

#[derive(Deserialize)]
struct KeyQuery {
    key: String,
}

#[derive(Deserialize)]
struct RangeQuery {
    from: f64,
    to: f64,
    limit: Option<usize>,
    cursor: Option<String>,
}

async fn lookup(State(s): State<DemoState>, Query(q): Query<KeyQuery>) -> Json<Value> {
    if let Some(d) = s.delay {
        tokio::time::sleep(d).await;
    }
    s.lookups.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let map = s
        .charges
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let objects: Vec<Value> = map.get(&q.key).into_iter().flatten().map(wire).collect();
    Json(json!({ "found": !objects.is_empty(), "complete": true, "objects": objects }))
}

/// Pages in (created, id) order, at most 100 objects each (fewer than reckon asks for, as a
/// real server may answer, so clients page); the cursor is the offset of the next page.
async fn charges(State(s): State<DemoState>, Query(q): Query<RangeQuery>) -> Json<Value> {
    let map = s
        .charges
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut all: Vec<&DemoCharge> = map
        .values()
        .flatten()
        .filter(|c| c.created >= q.from && c.created < q.to)
        .collect();
    all.sort_by(|a, b| {
        a.created
            .total_cmp(&b.created)
            .then_with(|| a.id.cmp(&b.id))
    });
    let limit = q.limit.unwrap_or(100).clamp(1, 100);
    let offset: usize = q
        .cursor
        .as_deref()
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let objects: Vec<Value> = all
        .iter()
        .skip(offset)
        .take(limit)
        .map(|c| wire_charge(c))
        .collect();
    let next = (offset + limit < all.len()).then(|| (offset + limit).to_string());
    Json(json!({ "objects": objects, "next_cursor": next }))
}

pub fn router(state: DemoState) -> Router {
    Router::new()
        .route("/effects/lookup", get(lookup))
        .route("/charges", get(charges))
        .with_state(state)
}

/// Serve the demo provider on a free loopback port; returns its base URL.
pub async fn serve_loopback(
    state: DemoState,
) -> std::io::Result<(String, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let addr = listener.local_addr()?;
    let handle = tokio::spawn(async move {
        let _ = axum::serve(listener, router(state)).await;
    });
    Ok((format!("http://{addr}/"), handle))
}
