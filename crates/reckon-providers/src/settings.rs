//! Provider settings (stored as JSON beside the sealed secret), read once for every kind,
//! and the one place a provider row becomes an adapter (through the kind's entry in
//! [`registry`]). Unknown settings are refused by name.

use crate::{GetClient, Provider, registry};
use reckon_domain::ProviderKind;
use secrecy::SecretString;
use serde::Deserialize;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("provider settings: {0}")]
    Invalid(String),
    #[error("a {0} provider needs a secret ({1})")]
    MissingSecret(ProviderKind, &'static str),
    /// A live Stripe key moves money: it never crosses the network in clear text.
    #[error("a live Stripe key is only sent over https: base_url must be https")]
    LiveKeyInClear,
    /// Stripe lists that cannot see a key on a PaymentIntent, with no reason given.
    #[error(
        "list_objects reads charges only, but Stripe does not copy a PaymentIntent's \
         metadata to its charges: keys the application puts on PaymentIntents would never \
         be found, and the empty list would read as \"not charged\". Add \
         \"payment_intents\" to list_objects, or, if the application puts its keys on \
         charges, say so in \"override_reason\""
    )]
    ChargesOnly,
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

pub(crate) fn url(s: &Option<String>, default: &str) -> Result<url::Url, SettingsError> {
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

pub(crate) fn nonnegative(name: &str, v: Option<f64>, default: f64) -> Result<f64, SettingsError> {
    match v {
        None => Ok(default),
        Some(x) if x.is_finite() && x >= 0.0 => Ok(x),
        Some(x) => Err(SettingsError::Invalid(format!(
            "{name}: {x} (a number of seconds, 0 or more)"
        ))),
    }
}

/// Check settings for a kind when a person saves them (`provider add`, `provider edit`):
/// the kind's own checks of what is saved (`new_secret`: the secret given now, if any;
/// `has_secret`: one given now or already stored), then that it builds.
pub fn validate(
    kind: ProviderKind,
    settings: &serde_json::Value,
    new_secret: Option<&str>,
    has_secret: bool,
) -> Result<(), SettingsError> {
    let adapter = registry::adapter(kind);
    if let (Some(what), false) = (adapter.needs_secret, has_secret) {
        return Err(SettingsError::MissingSecret(kind, what));
    }
    let raw = parse(settings)?;
    (adapter.check_at_save)(&raw, new_secret)?;
    let secret = has_secret.then(|| SecretString::from("sk_test_validate".to_owned()));
    (adapter.build)(raw, secret, GetClient::shared()).map(|_| ())
}

/// The adapter of a provider row: its kind's entry in the registry, over its settings.
pub fn build_provider(
    kind: ProviderKind,
    settings: &serde_json::Value,
    secret: Option<SecretString>,
    client: GetClient,
) -> Result<Arc<dyn Provider>, SettingsError> {
    (registry::adapter(kind).build)(parse(settings)?, secret, client)
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
pub fn replay_window_secs(kind: ProviderKind, settings: &serde_json::Value) -> Option<f64> {
    (registry::adapter(kind).replay_window_secs)(&parse(settings).ok()?)
}
