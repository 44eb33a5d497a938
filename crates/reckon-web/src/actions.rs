//! Recording people's actions in the tenant's audit log (`Ledger::record_action`), and
//! `GET /api/v1/audit-log` for the tenant's admins.
//!
//! The action has already happened when it is recorded (its own write is committed), so a
//! failed audit write is logged loudly rather than turned into an error the caller would
//! read as "it did not happen".

use crate::AppState;
use crate::auth::Auth;
use crate::error::ApiError;
use crate::extract::ApiQuery;
use axum::Json;
use axum::extract::State;
use reckon_ledger::{NewAction, TenantId};
use serde::Deserialize;
use serde_json::Value;

/// Who acted, as the audit log names them.
pub fn actor(auth: &Auth) -> String {
    match auth.user_id {
        Some(u) => format!("user:{u} via token:{}", auth.token_id),
        None => format!("token:{}", auth.token_id),
    }
}

pub async fn record(
    state: &AppState,
    tenant: TenantId,
    actor: String,
    action: &str,
    target: Option<String>,
    detail: Value,
) {
    let new = NewAction {
        actor,
        action: action.to_owned(),
        target,
        detail,
        address: None,
    };
    if let Err(e) = state.ledger.record_action(tenant, new).await {
        tracing::error!(error = %e, action, "could not write the audit log");
    }
}

/// A command made through the API with this token.
pub fn api_ctx<'a>(state: &'a AppState, auth: &'a Auth) -> reckon_engine::commands::Ctx<'a> {
    reckon_engine::commands::Ctx {
        ledger: state.ledger.as_ref(),
        egress: &state.egress,
        tenant: &auth.tenant,
        actor: actor(auth),
        via: reckon_engine::commands::Via::Api,
    }
}

/// A command made on the dashboard by the person signed in.
pub fn dash_ctx<'a>(
    state: &'a AppState,
    s: &'a crate::session::WebSession,
) -> reckon_engine::commands::Ctx<'a> {
    reckon_engine::commands::Ctx {
        ledger: state.ledger.as_ref(),
        egress: &state.egress,
        tenant: &s.tenant,
        actor: format!("user:{}", s.user.email),
        via: reckon_engine::commands::Via::Dashboard,
    }
}

/// An API caller's action.
pub async fn by_token(state: &AppState, auth: &Auth, action: &str, target: &str, detail: Value) {
    record(
        state,
        auth.tenant.id,
        actor(auth),
        action,
        Some(target.to_owned()),
        detail,
    )
    .await;
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// Only actions with a smaller id (the `next` of the previous page).
    before: Option<i64>,
    /// Page size; default 100.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
    /// Only actions on this target: `source/key` of an effect, a provider's or source's
    /// name, `token:N`, a person's email.
    #[param(max_length = 1000)]
    target: Option<String>,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct ActionList {
    #[schema(value_type = Vec<reckon_engine::schema::Action>)]
    actions: Vec<reckon_ledger::Action>,
    /// The `before` of the next page; null on the last.
    #[schema(required = true)]
    next: Option<i64>,
}

/// The tenant's audit log of people's actions, newest first (admin).
#[utoipa::path(
    get,
    path = "/audit-log",
    operation_id = "listActions",
    tag = "audit",
    params(ListParams),
    responses((status = 200, description = "A page of actions.", body = ActionList))
)]
pub async fn list(
    State(state): State<AppState>,
    auth: Auth,
    ApiQuery(p): ApiQuery<ListParams>,
) -> Result<Json<ActionList>, ApiError> {
    let limit = match p.limit {
        None => 100,
        Some(n) if (1..=1000).contains(&n) => n,
        Some(n) => {
            return Err(ApiError::BadRequest(format!(
                "limit {n} is not between 1 and 1000"
            )));
        }
    };
    if let Some(t) = &p.target
        && t.chars().count() > 1000
    {
        return Err(ApiError::BadRequest(
            "target is longer than 1000 characters".into(),
        ));
    }
    let actions = match &p.target {
        Some(t) => {
            state
                .ledger
                .actions_on(auth.tenant.id, t, p.before, limit)
                .await?
        }
        None => {
            state
                .ledger
                .list_actions(auth.tenant.id, p.before, limit)
                .await?
        }
    };
    let next = (actions.len() as i64 == limit)
        .then(|| actions.last().map(|a| a.id))
        .flatten();
    Ok(Json(ActionList { actions, next }))
}
