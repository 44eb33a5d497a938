//! Providers and routes of one tenant (`/api/v1/providers`, `/api/v1/routes`). A provider's
//! secret goes in once and never comes back out: answers carry `has_secret` only.

use crate::AppState;
use crate::auth::Auth;
use crate::error::ApiError;
use crate::extract::ApiJson;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use reckon_ledger::{LedgerError, NewProvider, Provider, Route};
use secrecy::SecretString;
use serde::Deserialize;
use serde_json::{Value, json};

/// A new provider as the API and the CLI take it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderInput {
    pub name: String,
    /// `stripe` | `http` | `demo`
    pub kind: String,
    /// Stripe: a restricted read-only key (`rk_live_...`); http: the auth header's value.
    #[serde(default)]
    pub secret: Option<String>,
    /// Non-secret settings (base_url, account, mode, metadata_field, key_template, ...).
    #[serde(default)]
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
    if !settings.is_object() {
        return Err("settings must be a JSON object".into());
    }
    if let Some(secret) = &input.secret
        && secret.trim().is_empty()
    {
        return Err("secret is empty".into());
    }
    reckon_providers::settings::validate(&input.kind, &settings, input.secret.is_some())
        .map_err(|e| e.to_string())?;
    if let Some(base) = settings.get("base_url").and_then(|u| u.as_str()) {
        let url = url::Url::parse(base).map_err(|e| format!("base_url: {e}"))?;
        egress
            .check_url(&url)
            .await
            .map_err(|e| format!("base_url is refused by the egress policy: {e}"))?;
    }
    Ok(NewProvider {
        name: input.name,
        kind: input.kind,
        secret: input.secret.map(SecretString::from),
        settings,
    })
}

pub async fn list(State(state): State<AppState>, auth: Auth) -> Result<Json<Value>, ApiError> {
    let providers = state.ledger.list_providers(auth.tenant.id).await?;
    Ok(Json(json!({ "providers": providers })))
}

pub async fn create(
    State(state): State<AppState>,
    auth: Auth,
    ApiJson(input): ApiJson<ProviderInput>,
) -> Result<(StatusCode, Json<Provider>), ApiError> {
    let name = input.name.clone();
    let new = new_provider(input, &state.egress)
        .await
        .map_err(ApiError::Unprocessable)?;
    let provider = state
        .ledger
        .add_provider(auth.tenant.id, new)
        .await
        .map_err(|e| match e {
            LedgerError::Conflict(_) => {
                ApiError::Conflict(format!("a provider named {name:?} already exists"))
            }
            other => other.into(),
        })?;
    crate::actions::by_token(
        &state,
        &auth,
        "provider.add",
        &provider.name,
        json!({ "kind": provider.kind, "has_secret": provider.has_secret }),
    )
    .await;
    Ok((StatusCode::CREATED, Json(provider)))
}

pub async fn routes(State(state): State<AppState>, auth: Auth) -> Result<Json<Value>, ApiError> {
    let routes = state.ledger.list_routes(auth.tenant.id).await?;
    Ok(Json(json!({ "routes": routes })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteInput {
    source: String,
    /// An operation name, or `*` for every operation of the source.
    operation: String,
    /// A provider name, or null: no provider can answer (the effect says so).
    provider: Option<String>,
}

/// Set (or replace) the route of one operation pattern of a source.
pub async fn set_route(
    State(state): State<AppState>,
    auth: Auth,
    ApiJson(input): ApiJson<RouteInput>,
) -> Result<Json<Route>, ApiError> {
    let route = state
        .ledger
        .set_route(
            auth.tenant.id,
            &input.source,
            &input.operation,
            input.provider.as_deref(),
        )
        .await?;
    crate::actions::by_token(
        &state,
        &auth,
        "route.set",
        &format!("{}/{}", route.source, route.operation),
        json!({ "provider": route.provider }),
    )
    .await;
    Ok(Json(route))
}
