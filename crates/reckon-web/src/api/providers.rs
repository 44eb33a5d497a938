//! Providers and routes of one tenant (`/api/v1/providers`, `/api/v1/routes`). A provider's
//! secret goes in once and never comes back out: answers carry `has_secret` only.

use crate::AppState;
use crate::auth::Auth;
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use reckon_ledger::{LedgerError, NewProvider, Provider, ProviderChange, Route};
use secrecy::SecretString;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// A new provider as the API and the CLI take it.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProviderInput {
    #[schema(max_length = 63, pattern = "^[a-z0-9][a-z0-9_-]*$")]
    pub name: String,
    #[schema(value_type = reckon_engine::schema::ProviderKind)]
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
async fn check_provider(
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

/// Where a provider's requests (and its secret) go: its `base_url`, normalised, or `None`
/// for the kind's default.
fn base_url(settings: &Value) -> Option<String> {
    let s = settings.get("base_url")?;
    let text = s
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| s.to_string());
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

/// Change a provider's secret or settings (admin). The stored secret is only sent where it
/// was sent before: a new base_url needs the secret given again.
#[utoipa::path(
    patch,
    path = "/providers/{name}",
    operation_id = "editProvider",
    tag = "reconciliation",
    params(("name" = String, Path, description = "The provider's name.")),
    request_body = ProviderEdit,
    responses(
        (status = 200, description = "Changed.", body = reckon_engine::schema::Provider),
        (status = 404, description = "The tenant has no provider of that name."),
        (status = 413, description = "The body is larger than the server accepts."),
        (status = 422, description = "Nothing to change, or settings the kind does not accept; `error` says which."),
    )
)]
pub async fn edit(
    State(state): State<AppState>,
    auth: Auth,
    ApiPath(name): ApiPath<String>,
    ApiJson(edit): ApiJson<ProviderEdit>,
) -> Result<Json<Provider>, ApiError> {
    let tenant = auth.tenant.id;
    let provider = state.ledger.provider_by_name(tenant, &name).await?;
    if edit.secret.is_none() && edit.settings.is_none() {
        return Err(ApiError::Unprocessable(
            "nothing to change: give secret and/or settings".into(),
        ));
    }
    let settings = edit.settings.as_ref().unwrap_or(&provider.settings);
    // The stored secret goes only where it went before: another base URL needs it given
    // again, or whoever may edit the provider could have it sent to a server of theirs.
    if edit.secret.is_none()
        && provider.has_secret
        && base_url(settings) != base_url(&provider.settings)
    {
        return Err(ApiError::Unprocessable(
            "the base_url changed: give the secret again (secret), the stored one is only \
             sent where it was sent before"
                .into(),
        ));
    }
    let has_secret = edit.secret.is_some() || provider.has_secret;
    check_provider(
        &provider.kind,
        settings,
        edit.secret.as_deref(),
        has_secret,
        &state.egress,
    )
    .await
    .map_err(|why| match &edit.secret {
        Some(s) if !s.is_empty() => ApiError::Unprocessable(why.replace(s.as_str(), "<redacted>")),
        _ => ApiError::Unprocessable(why),
    })?;
    let mut fields = Vec::new();
    if edit.secret.is_some() {
        fields.push("secret");
    }
    if edit.settings.is_some() {
        fields.push("settings");
    }
    let change = ProviderChange {
        secret: edit.secret.map(SecretString::from),
        settings: edit.settings,
    };
    let provider = state.ledger.update_provider(tenant, &name, change).await?;
    crate::actions::by_token(
        &state,
        &auth,
        "provider.edit",
        &provider.name,
        json!({ "fields": fields, "has_secret": provider.has_secret }),
    )
    .await;
    Ok(Json(provider))
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ProviderList {
    #[schema(value_type = Vec<reckon_engine::schema::Provider>)]
    providers: Vec<Provider>,
}

/// The tenant's providers (never their secrets).
#[utoipa::path(
    get,
    path = "/providers",
    operation_id = "listProviders",
    tag = "reconciliation",
    responses((status = 200, description = "Every provider of the token's tenant.", body = ProviderList))
)]
pub async fn list(
    State(state): State<AppState>,
    auth: Auth,
) -> Result<Json<ProviderList>, ApiError> {
    let providers = state.ledger.list_providers(auth.tenant.id).await?;
    Ok(Json(ProviderList { providers }))
}

/// Add a provider (admin): a known kind, settings it understands, a secret where needed, a
/// base URL the egress policy allows.
#[utoipa::path(
    post,
    path = "/providers",
    operation_id = "createProvider",
    tag = "reconciliation",
    request_body = ProviderInput,
    responses(
        (status = 201, description = "Added.", body = reckon_engine::schema::Provider),
        (status = 409, description = "A provider of that name exists."),
        (status = 413, description = "The body is larger than the server accepts."),
        (status = 422, description = "Not an acceptable provider; `error` says why (never quoting the secret)."),
    )
)]
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

#[derive(Serialize, utoipa::ToSchema)]
pub struct RouteList {
    #[schema(value_type = Vec<reckon_engine::schema::Route>)]
    routes: Vec<Route>,
}

/// Which provider answers for which operations of which source.
#[utoipa::path(
    get,
    path = "/routes",
    operation_id = "listRoutes",
    tag = "reconciliation",
    responses((status = 200, description = "Every route of the token's tenant.", body = RouteList))
)]
pub async fn routes(
    State(state): State<AppState>,
    auth: Auth,
) -> Result<Json<RouteList>, ApiError> {
    let routes = state.ledger.list_routes(auth.tenant.id).await?;
    Ok(Json(RouteList { routes }))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RouteInput {
    /// The source's name.
    source: String,
    /// An operation name, or `*` for every operation of the source.
    #[schema(max_length = 63, pattern = "^(\\*|[a-z0-9][a-z0-9_-]*)$")]
    operation: String,
    /// A provider name, or null: no provider can answer (the effect says so).
    #[schema(required = true)]
    provider: Option<String>,
}

/// Set (or replace) the route of one operation pattern of a source (admin).
#[utoipa::path(
    put,
    path = "/routes",
    operation_id = "setRoute",
    tag = "reconciliation",
    request_body = RouteInput,
    responses(
        (status = 200, description = "The route as stored.", body = reckon_engine::schema::Route),
        (status = 404, description = "No source, or no provider, of that name."),
        (status = 413, description = "The body is larger than the server accepts."),
        (status = 422, description = "Not an operation pattern."),
    )
)]
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
