//! The demo provider: a credential-free provider speaking the `http` protocol (see
//! [`crate::http`]) over a state it keeps itself. `reckon demo` and tests run it on
//! loopback; it decides nothing itself (the http adapter and `classify` do).

use axum::extract::{Query, State};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct DemoCharge {
    pub id: String,
    pub key: String,
    pub status: String,
    pub amount: i64,
    pub currency: String,
    pub created: f64,
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
        let mut map = self.charges.lock().unwrap_or_else(|p| p.into_inner());
        let n: usize = map.values().map(Vec::len).sum();
        let id = format!("demo_ch_{}", n + 1);
        map.entry(key.to_owned()).or_default().push(DemoCharge {
            id: id.clone(),
            key: key.to_owned(),
            status: "succeeded".into(),
            amount,
            currency: currency.into(),
            created,
        });
        id
    }
}

fn wire(c: &DemoCharge) -> Value {
    json!({ "id": c.id, "status": c.status, "amount": c.amount, "currency": c.currency,
            "created": c.created, "key": c.key })
}

#[derive(Deserialize)]
struct KeyQuery {
    key: String,
}

#[derive(Deserialize)]
struct RangeQuery {
    from: f64,
    to: f64,
}

async fn lookup(State(s): State<DemoState>, Query(q): Query<KeyQuery>) -> Json<Value> {
    if let Some(d) = s.delay {
        tokio::time::sleep(d).await;
    }
    s.lookups.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let map = s.charges.lock().unwrap_or_else(|p| p.into_inner());
    let objects: Vec<Value> = map.get(&q.key).into_iter().flatten().map(wire).collect();
    Json(json!({ "found": !objects.is_empty(), "complete": true, "objects": objects }))
}

async fn charges(State(s): State<DemoState>, Query(q): Query<RangeQuery>) -> Json<Value> {
    let map = s.charges.lock().unwrap_or_else(|p| p.into_inner());
    // One page: the demo holds few charges.
    let objects: Vec<Value> = map
        .values()
        .flatten()
        .filter(|c| c.created >= q.from && c.created < q.to)
        .map(wire)
        .collect();
    Json(json!({ "objects": objects, "next_cursor": null }))
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
