//! The generic `http` lookup protocol, for in-house systems (and the built-in demo).
//!
//! ```text
//! GET {base}/effects/lookup?key=<key>        (auth header from the provider's secret)
//! 200 {"found": bool, "complete": bool,
//!      "objects": [{"id": str, "status": str, "amount": int, "currency": str,
//!                   "created": number, "final": bool (optional, default true)}]}
//!
//! GET {base}/charges?from=<epoch>&to=<epoch>&cursor=<opaque>   (the audit's paged list)
//! 200 {"objects": [...same shape...], "next_cursor": str | null}
//! ```
//!
//! `found` must agree with `objects`; `complete: false` means the answering system could
//! not check everything (a replica behind, a partial index) and is never read as absence.
//! The endpoint is expected to be strongly consistent (read-after-write); set the
//! provider's `consistency` to `eventual` if it is not, and no miss will ever conclude.
//! Several objects with `status` other than `failed`/`canceled` make a duplicate.

use crate::client::{GetClient, budget, status_fault};
use crate::{Consistency, Fault, FaultKind, LookupQuery, LookupReport, ProviderObject, Step};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

#[derive(Debug, Clone)]
pub struct HttpSettings {
    pub kind: &'static str,
    pub base_url: url::Url,
    pub auth_header: String,
    pub consistency: Consistency,
    pub visibility_lag_secs: f64,
    pub max_call_secs: f64,
    pub rate_per_sec: f64,
    pub replay_window_secs: Option<f64>,
}

pub struct HttpProvider {
    settings: HttpSettings,
    secret: Option<SecretString>,
    client: GetClient,
}

impl HttpProvider {
    pub fn new(settings: HttpSettings, secret: Option<SecretString>, client: GetClient) -> Self {
        HttpProvider {
            settings,
            secret,
            client,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Answer {
    found: bool,
    complete: bool,
    objects: Vec<WireObject>,
}

#[derive(Deserialize)]
pub(crate) struct WireObject {
    pub id: String,
    pub status: String,
    pub amount: i64,
    pub currency: String,
    pub created: f64,
    #[serde(default = "yes")]
    pub r#final: bool,
}

fn yes() -> bool {
    true
}

impl WireObject {
    fn into_object(self) -> ProviderObject {
        let money_moved = !matches!(self.status.as_str(), "failed" | "canceled");
        ProviderObject {
            group: self.id.clone(),
            id: self.id,
            object: "object".into(),
            status: Some(self.status),
            amount: Some(self.amount),
            currency: Some(self.currency),
            created: Some(self.created),
            final_state: self.r#final,
            money_moved,
        }
    }
}

#[async_trait::async_trait]
impl crate::Provider for HttpProvider {
    fn kind(&self) -> &'static str {
        self.settings.kind
    }

    fn replay_window_secs(&self) -> Option<f64> {
        self.settings.replay_window_secs
    }

    async fn lookup(&self, q: &LookupQuery) -> LookupReport {
        let s = &self.settings;
        let end = q.updated_at.max(q.expires_at.unwrap_or(q.updated_at)) + s.max_call_secs;
        let mut step = Step::new("http.lookup", s.consistency, None);
        self.run(q, &mut step).await;
        LookupReport {
            provider_kind: s.kind.to_owned(),
            provider_key: q.key.clone(),
            account: None,
            mode: None,
            account_verified: true,
            effect_window: (q.created_at, end),
            visibility_lag_secs: s.visibility_lag_secs,
            steps: vec![step],
            checked_at: q.now,
        }
    }
}

impl HttpProvider {
    async fn run(&self, q: &LookupQuery, step: &mut Step) {
        let mut url = match self.settings.base_url.join("effects/lookup") {
            Ok(u) => u,
            Err(e) => {
                step.fault = Some(Fault::new(FaultKind::Config, format!("base_url: {e}")));
                return;
            }
        };
        url.query_pairs_mut().append_pair("key", &q.key);
        if let Some(b) = budget(self.settings.base_url.as_str(), self.settings.rate_per_sec) {
            b.until_ready().await;
        }
        let secret = self.secret.as_ref().map(|s| s.expose_secret().to_owned());
        let headers: Vec<(&str, &str)> = secret
            .as_deref()
            .map(|v| vec![(self.settings.auth_header.as_str(), v)])
            .unwrap_or_default();
        step.pages = 1;
        let resp = match self.client.get(&url, &headers).await {
            Ok(r) => r,
            Err(f) => {
                step.fault = Some(f);
                return;
            }
        };
        if let Some(id) = resp.header("x-request-id") {
            step.request_ids.push(id);
        }
        if let Some(f) = status_fault(&resp) {
            step.fault = Some(f);
            return;
        }
        let answer: Answer = match serde_json::from_slice(&resp.body) {
            Ok(a) => a,
            Err(e) => {
                step.fault = Some(Fault::new(FaultKind::Malformed, format!("answer: {e}")));
                return;
            }
        };
        if answer.found == answer.objects.is_empty() {
            step.fault = Some(Fault::new(
                FaultKind::Malformed,
                "`found` disagrees with `objects`",
            ));
            return;
        }
        step.objects = answer
            .objects
            .into_iter()
            .map(WireObject::into_object)
            .collect();
        step.complete = answer.complete;
    }
}
