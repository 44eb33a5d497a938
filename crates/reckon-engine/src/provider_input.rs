//! A provider as a person gives it (the API's JSON, the dashboard's form, the CLI's flags),
//! checked before it is stored: a known kind, settings it understands, a secret where one is
//! needed, a base URL the egress policy allows. The errors never quote the secret.

use reckon_domain::UnknownProviderKind;
use reckon_ledger::{NewProvider, ProviderKind};
use reckon_providers::SettingsError;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::Value;

// Its secret is a `SecretString`: `Debug` shows `[REDACTED]`, and nothing prints it.
/// A new provider as the API and the CLI take it.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProviderInput {
    #[schema(max_length = 63, pattern = "^[a-z0-9][a-z0-9_-]*$")]
    pub name: String,
    // Text, read by `ProviderKind::parse` in `new_provider`: an unknown kind is refused
    // with the kinds there are, like every other check of the input.
    #[schema(value_type = ProviderKind)]
    pub kind: String,
    /// Stripe: a restricted read-only key (`rk_live_...`); http: the auth header's value.
    /// Stored sealed, never shown again.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub secret: Option<SecretString>,
    /// Non-secret settings (base_url, account, mode, metadata_field, key_template, ...).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub settings: Option<Value>,
}

/// Why a provider as given is not stored. Never quotes the secret.
#[derive(Debug, thiserror::Error)]
pub enum ProviderInputError {
    #[error(transparent)]
    Kind(#[from] UnknownProviderKind),
    #[error("settings must be a JSON object")]
    NotAnObject,
    #[error("secret is empty")]
    EmptySecret,
    /// Settings the kind does not accept (its adapter's refusal).
    #[error(transparent)]
    Settings(#[from] SettingsError),
    #[error("base_url: {0}")]
    BaseUrl(url::ParseError),
    #[error("base_url is refused by the egress policy: {0}")]
    Egress(reckon_sources::EgressError),
}

/// Check a provider before it is stored: known kind, settings it understands, a secret
/// where one is needed, a base URL the egress policy allows. The error says which; it never
/// quotes the secret.
pub async fn new_provider(
    input: ProviderInput,
    egress: &reckon_sources::EgressPolicy,
) -> Result<NewProvider, ProviderInputError> {
    let kind = ProviderKind::parse(input.kind.trim())?;
    let settings = input.settings.unwrap_or(Value::Object(Default::default()));
    check_provider(
        kind,
        &settings,
        input.secret.as_ref().map(ExposeSecret::expose_secret),
        input.secret.is_some(),
        egress,
    )
    .await?;
    Ok(NewProvider {
        name: input.name,
        kind,
        secret: input.secret,
        settings,
    })
}

/// The checks a provider passes when added and again when edited: settings an object the
/// kind understands (with the kind's own checks, `reckon_providers::settings::validate`),
/// a non-empty secret where given, one where needed (`has_secret`: given now or already
/// stored), a base URL the egress policy allows. Never quotes the secret.
pub async fn check_provider(
    kind: ProviderKind,
    settings: &Value,
    new_secret: Option<&str>,
    has_secret: bool,
    egress: &reckon_sources::EgressPolicy,
) -> Result<(), ProviderInputError> {
    if !settings.is_object() {
        return Err(ProviderInputError::NotAnObject);
    }
    if let Some(secret) = new_secret
        && secret.trim().is_empty()
    {
        return Err(ProviderInputError::EmptySecret);
    }
    reckon_providers::settings::validate(kind, settings, new_secret, has_secret)?;
    if let Some(base) = settings.get("base_url").and_then(|u| u.as_str()) {
        let url = url::Url::parse(base).map_err(ProviderInputError::BaseUrl)?;
        egress
            .check_url(&url)
            .await
            .map_err(ProviderInputError::Egress)?;
    }
    Ok(())
}

/// Where a provider's requests (and its secret) go: its `base_url`, normalised, or `None`
/// for the kind's default.
pub fn base_url(settings: &Value) -> Option<String> {
    let s = settings.get("base_url")?;
    let text = s.as_str().map_or_else(|| s.to_string(), str::to_owned);
    Some(url::Url::parse(&text).map_or(text, |u| u.to_string()))
}

/// An edit of a provider: left-out fields keep their stored value. `settings` replaces the
/// settings whole; `secret` replaces the stored secret, which is otherwise kept.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProviderEdit {
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub secret: Option<SecretString>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub settings: Option<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A provider's secret, as the API and the CLI take it, is read but never shown by
    /// `Debug` (a log line or a panic message of the input).
    #[test]
    fn the_inputs_debug_shows_no_secret() {
        let input: ProviderInput = serde_json::from_value(serde_json::json!({
            "name": "p", "kind": "stripe", "secret": "rk_live_canary-1"
        }))
        .unwrap();
        let edit: ProviderEdit =
            serde_json::from_value(serde_json::json!({ "secret": "rk_live_canary-2" })).unwrap();
        let shown = format!("{input:?} {edit:?} {input:#?}");
        assert!(!shown.contains("canary"), "{shown}");
        assert!(shown.contains("REDACTED"), "{shown}");
        let secret = input.secret.as_ref().map(ExposeSecret::expose_secret);
        assert_eq!(secret, Some("rk_live_canary-1"));
    }
}
