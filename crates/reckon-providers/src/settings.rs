//! Provider settings (stored as JSON beside the sealed secret) and the one place a
//! provider row becomes an adapter. Unknown settings are refused by name.

use crate::http::{HttpProvider, HttpSettings};
use crate::stripe::{StripeProvider, StripeSettings};
use crate::{Consistency, GetClient, Provider};
use secrecy::SecretString;
use serde::Deserialize;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("provider kind {0:?} is unknown: use stripe, http or demo")]
    Kind(String),
    #[error("provider settings: {0}")]
    Invalid(String),
    #[error("a {0} provider needs a secret ({1})")]
    MissingSecret(&'static str, &'static str),
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawSettings {
    pub base_url: Option<String>,
    pub account: Option<String>,
    pub mode: Option<String>,
    pub metadata_field: Option<String>,
    /// How the application derived the key it sent to the provider: `{key}`, `{subject}`,
    /// `{operation}` are replaced (default `{key}`).
    pub key_template: Option<String>,
    pub visibility_lag_secs: Option<f64>,
    pub max_call_secs: Option<f64>,
    pub skew_secs: Option<f64>,
    pub rate_per_sec: Option<f64>,
    pub list_objects: Option<Vec<String>>,
    pub upper_bound: Option<bool>,
    pub use_search: Option<bool>,
    pub search_lag_secs: Option<f64>,
    pub use_events: Option<bool>,
    pub witness_span_secs: Option<f64>,
    pub event_types: Option<Vec<String>>,
    pub max_pages: Option<u32>,
    pub auth_header: Option<String>,
    pub consistency: Option<String>,
    pub replay_window_secs: Option<f64>,
    /// A person's stated reason to keep a configuration reckon's checks refuse (a
    /// charges-only list): kept with the settings and in the audit log.
    pub override_reason: Option<String>,
}

pub fn parse(settings: &serde_json::Value) -> Result<RawSettings, SettingsError> {
    if settings.is_null() {
        return Ok(RawSettings::default());
    }
    serde_json::from_value(settings.clone()).map_err(|e| SettingsError::Invalid(e.to_string()))
}

fn url(s: &Option<String>, default: &str) -> Result<url::Url, SettingsError> {
    let text = s.as_deref().unwrap_or(default);
    // join() needs a trailing slash to keep a base path.
    let text = if text.ends_with('/') {
        text.to_owned()
    } else {
        format!("{text}/")
    };
    let u = url::Url::parse(&text).map_err(|e| SettingsError::Invalid(format!("base_url: {e}")))?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err(SettingsError::Invalid("base_url must be http(s)".into()));
    }
    Ok(u)
}

fn nonnegative(name: &str, v: Option<f64>, default: f64) -> Result<f64, SettingsError> {
    match v {
        None => Ok(default),
        Some(x) if x.is_finite() && x >= 0.0 => Ok(x),
        Some(x) => Err(SettingsError::Invalid(format!(
            "{name}: {x} (a number of seconds, 0 or more)"
        ))),
    }
}

/// Check settings for a kind without building (for `provider add`).
pub fn validate(
    kind: &str,
    settings: &serde_json::Value,
    has_secret: bool,
) -> Result<(), SettingsError> {
    let secret = has_secret.then(|| SecretString::from("sk_test_validate".to_owned()));
    match kind {
        "stripe" if !has_secret => Err(SettingsError::MissingSecret(
            "stripe",
            "a restricted read-only key rk_live_... or rk_test_...",
        )),
        _ => build_provider(kind, settings, secret, GetClient::shared()).map(|_| ()),
    }
}

pub fn build_provider(
    kind: &str,
    settings: &serde_json::Value,
    secret: Option<SecretString>,
    client: GetClient,
) -> Result<Arc<dyn Provider>, SettingsError> {
    let r = parse(settings)?;
    let lag = r.visibility_lag_secs.unwrap_or(60.0);
    let max_call = r.max_call_secs.unwrap_or(60.0);
    match kind {
        "stripe" => {
            let mode = r.mode.clone().unwrap_or_else(|| "live".into());
            if mode != "live" && mode != "test" {
                return Err(SettingsError::Invalid("mode must be live or test".into()));
            }
            let list_objects = r
                .list_objects
                .clone()
                .unwrap_or_else(|| vec!["payment_intents".into(), "charges".into()]);
            if let Some(bad) = list_objects
                .iter()
                .find(|o| !matches!(o.as_str(), "payment_intents" | "charges"))
            {
                return Err(SettingsError::Invalid(format!(
                    "list_objects: {bad:?} (use payment_intents, charges)"
                )));
            }
            let key = secret.ok_or(SettingsError::MissingSecret(
                "stripe",
                "a restricted read-only key rk_live_... or rk_test_...",
            ))?;
            Ok(Arc::new(StripeProvider::new(
                StripeSettings {
                    base_url: url(&r.base_url, "https://api.stripe.com")?,
                    account: r.account,
                    mode,
                    metadata_field: r.metadata_field.unwrap_or_else(|| "idempotency_key".into()),
                    visibility_lag_secs: lag,
                    max_call_secs: max_call,
                    skew_secs: r.skew_secs.unwrap_or(300.0),
                    // Stripe allows 100 req/s live per account, shared with checkout: take
                    // a small slice by default.
                    rate_per_sec: r.rate_per_sec.unwrap_or(5.0),
                    list_objects,
                    upper_bound: r.upper_bound.unwrap_or(true),
                    use_search: r.use_search.unwrap_or(true),
                    // Stripe: "searchable in less than a minute. Occasionally ... up to an
                    // hour behind during outages": a miss counts after the hour.
                    search_lag_secs: nonnegative("search_lag_secs", r.search_lag_secs, 3600.0)?,
                    use_events: r.use_events.unwrap_or(true),
                    // An application clock a few hours off (a time zone taken for UTC) or a
                    // payment made the same day still falls inside.
                    witness_span_secs: nonnegative(
                        "witness_span_secs",
                        r.witness_span_secs,
                        86_400.0,
                    )?,
                    event_types: r.event_types.unwrap_or_default(),
                    max_pages: r.max_pages.unwrap_or(200),
                },
                key,
                client,
            )))
        }
        "http" | "demo" => {
            let consistency = match r.consistency.as_deref().unwrap_or("strong") {
                "strong" => Consistency::Strong,
                "eventual" => Consistency::Eventual,
                other => {
                    return Err(SettingsError::Invalid(format!(
                        "consistency {other:?} (use strong or eventual)"
                    )));
                }
            };
            let base = r
                .base_url
                .as_ref()
                .ok_or_else(|| SettingsError::Invalid("base_url is required".into()))?;
            Ok(Arc::new(HttpProvider::new(
                HttpSettings {
                    kind: if kind == "demo" { "demo" } else { "http" },
                    base_url: url(&Some(base.clone()), "")?,
                    auth_header: r.auth_header.unwrap_or_else(|| "Authorization".into()),
                    consistency,
                    visibility_lag_secs: r.visibility_lag_secs.unwrap_or(if kind == "demo" {
                        1.0
                    } else {
                        30.0
                    }),
                    max_call_secs: max_call,
                    rate_per_sec: r
                        .rate_per_sec
                        .unwrap_or(if kind == "demo" { 0.0 } else { 20.0 }),
                    replay_window_secs: r.replay_window_secs,
                },
                secret,
                client,
            )))
        }
        other => Err(SettingsError::Kind(other.to_owned())),
    }
}

/// The key the application sent to the provider, from the provider's key template.
pub fn provider_key(
    settings: &serde_json::Value,
    key: &str,
    operation: Option<&str>,
    subject: Option<&str>,
) -> String {
    let template = settings
        .get("key_template")
        .and_then(|t| t.as_str())
        .unwrap_or("{key}");
    template
        .replace("{key}", key)
        .replace("{operation}", operation.unwrap_or(""))
        .replace("{subject}", subject.unwrap_or(""))
}

/// How long the provider keeps an idempotency key, from a provider row's kind and settings
/// alone (no secret needed): Stripe's documented 24 hours, or an http/demo provider's
/// `replay_window_secs`. `None`: the provider does not say.
pub fn replay_window_secs(kind: &str, settings: &serde_json::Value) -> Option<f64> {
    match kind {
        "stripe" => Some(crate::stripe::REPLAY_WINDOW_SECS),
        _ => parse(settings).ok()?.replay_window_secs,
    }
}
