//! A provider as a person gives it (the API's JSON, the dashboard's form, the CLI's flags),
//! checked before it is stored: a known kind, settings it understands, a secret where one is
//! needed, a base URL the egress policy allows. The errors never quote the secret.

use reckon_ledger::NewProvider;
use secrecy::SecretString;
use serde::Deserialize;
use serde_json::Value;

/// A new provider as the API and the CLI take it.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProviderInput {
    #[schema(max_length = 63, pattern = "^[a-z0-9][a-z0-9_-]*$")]
    pub name: String,
    #[schema(value_type = crate::schema::ProviderKind)]
    pub kind: String,
    /// Stripe: a restricted read-only key (`rk_live_...`); http: the auth header's value.
    /// Stored sealed, never shown again.
    #[serde(default)]
    pub secret: Option<String>,
    /// Non-secret settings (base_url, account, mode, metadata_field, key_template, ...).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub settings: Option<Value>,
}

impl std::fmt::Debug for ProviderInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderInput")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .field("settings", &self.settings)
            .finish()
    }
}

/// Check a provider before it is stored: known kind, settings it understands, a secret
/// where one is needed, a base URL the egress policy allows. The error says which; it never
/// quotes the secret.
pub async fn new_provider(
    input: ProviderInput,
    egress: &reckon_sources::EgressPolicy,
) -> Result<NewProvider, String> {
    let settings = input.settings.unwrap_or(Value::Object(Default::default()));
    check_provider(
        &input.kind,
        &settings,
        input.secret.as_deref(),
        input.secret.is_some(),
        egress,
    )
    .await?;
    Ok(NewProvider {
        name: input.name,
        kind: input.kind,
        secret: input.secret.map(SecretString::from),
        settings,
    })
}

/// The checks a provider passes when added and again when edited: settings an object the
/// kind understands, a non-empty secret where given, one where needed (`has_secret`: given
/// now or already stored), a base URL the egress policy allows. Never quotes the secret.
pub async fn check_provider(
    kind: &str,
    settings: &Value,
    new_secret: Option<&str>,
    has_secret: bool,
    egress: &reckon_sources::EgressPolicy,
) -> Result<(), String> {
    if !settings.is_object() {
        return Err("settings must be a JSON object".into());
    }
    if let Some(secret) = new_secret
        && secret.trim().is_empty()
    {
        return Err("secret is empty".into());
    }
    reckon_providers::settings::validate(kind, settings, has_secret).map_err(|e| e.to_string())?;
    check_stripe_lists(kind, settings)?;
    if let Some(base) = settings.get("base_url").and_then(|u| u.as_str()) {
        let url = url::Url::parse(base).map_err(|e| format!("base_url: {e}"))?;
        // A live Stripe key moves money: it never crosses the network in clear text.
        let live = settings
            .get("mode")
            .and_then(|m| m.as_str())
            .is_none_or(|m| m == "live")
            || new_secret.is_some_and(|s| s.trim_start().contains("_live_"));
        if kind == "stripe" && live && url.scheme() != "https" {
            return Err("a live Stripe key is only sent over https: base_url must be https".into());
        }
        egress
            .check_url(&url)
            .await
            .map_err(|e| format!("base_url is refused by the egress policy: {e}"))?;
    }
    Ok(())
}

/// A Stripe provider that lists charges only never sees a key the application put on its
/// PaymentIntents (Stripe does not copy a PaymentIntent's metadata to its charges), and its
/// empty lists would read as absence. Refused unless a person says why their keys live on
/// charges (`override_reason`); the calibration then checks that claim against the
/// application's known outcomes.
fn check_stripe_lists(kind: &str, settings: &Value) -> Result<(), String> {
    let Some(lists) = settings.get("list_objects").and_then(Value::as_array) else {
        return Ok(());
    };
    let reason = settings
        .get("override_reason")
        .and_then(Value::as_str)
        .is_some_and(|r| !r.trim().is_empty());
    if kind == "stripe"
        && lists.iter().any(|l| l == "charges")
        && !lists.iter().any(|l| l == "payment_intents")
        && !reason
    {
        return Err(
            "list_objects reads charges only, but Stripe does not copy a PaymentIntent's \
             metadata to its charges: keys the application puts on PaymentIntents would never \
             be found, and the empty list would read as \"not charged\". Add \
             \"payment_intents\" to list_objects, or, if the application puts its keys on \
             charges, say so in \"override_reason\""
                .into(),
        );
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
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProviderEdit {
    #[serde(default)]
    pub secret: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub settings: Option<Value>,
}

impl std::fmt::Debug for ProviderEdit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderEdit")
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .field("settings", &self.settings)
            .finish()
    }
}
