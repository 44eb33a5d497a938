use crate::AppState;
use crate::auth::Auth;
use crate::error::ApiError;
use crate::extract::{ApiPath, ApiQuery};
use axum::Json;
use axum::extract::State;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use reckon_domain::{State as EffectState, time};
use reckon_engine::reconcile::{ReplayWindow, replay_window};
use reckon_ledger::{Effect, EffectEvent, EffectQuery, ReconcileView};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

const DEFAULT_LIMIT: i64 = 100;
const MAX_LIMIT: i64 = 1000;

/// An effect as the API shows it: the ledger's fields plus `response`, the stored JSON text
/// decoded once (a stored `"done"` is the JSON string `done`, not a string holding quotes).
#[derive(Debug, Serialize)]
pub struct EffectJson {
    #[serde(flatten)]
    pub effect: Effect,
    pub response: Value,
}

impl TryFrom<Effect> for EffectJson {
    type Error = ApiError;

    fn try_from(effect: Effect) -> Result<EffectJson, ApiError> {
        let response = match effect.response_json.as_deref() {
            None => Value::Null,
            Some(text) => serde_json::from_str(text).map_err(|e| {
                ApiError::internal(format!(
                    "effect {} holds a response that is not JSON: {e}",
                    effect.id
                ))
            })?,
        };
        Ok(EffectJson { effect, response })
    }
}

fn to_json(effects: Vec<Effect>) -> Result<Vec<EffectJson>, ApiError> {
    effects.into_iter().map(EffectJson::try_from).collect()
}

/// A page size from the query: 1..=1000, default 100.
pub(super) fn page_limit(limit: Option<i64>) -> Result<i64, ApiError> {
    match limit {
        None => Ok(DEFAULT_LIMIT),
        Some(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::BadRequest(format!(
            "limit {n} is not between 1 and {MAX_LIMIT}"
        ))),
    }
}

/// Cursors are opaque to clients; today they carry the id of the last effect of a page.
fn encode_cursor(effect_id: i64) -> String {
    URL_SAFE_NO_PAD.encode(format!("effect:{effect_id}"))
}

fn decode_cursor(cursor: &str) -> Option<i64> {
    let text = String::from_utf8(URL_SAFE_NO_PAD.decode(cursor).ok()?).ok()?;
    text.strip_prefix("effect:")?
        .parse()
        .ok()
        .filter(|id: &i64| *id >= 0)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    source: Option<String>,
    state: Option<String>,
    unresolved: Option<bool>,
    operation: Option<String>,
    updated_since: Option<f64>,
    after: Option<String>,
    limit: Option<i64>,
}

impl ListParams {
    fn into_query(self) -> Result<EffectQuery, ApiError> {
        let state = match self.state.as_deref() {
            None => None,
            Some(s) => Some(EffectState::parse(s).ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "state {s:?} is not one of in_progress, succeeded, failed, unknown"
                ))
            })?),
        };
        if let Some(t) = self.updated_since
            && !t.is_finite()
        {
            return Err(ApiError::BadRequest(
                "updated_since must be epoch seconds, a finite number".into(),
            ));
        }
        let after_id = match self.after.as_deref() {
            None => None,
            Some(c) => Some(decode_cursor(c).ok_or_else(|| {
                ApiError::BadRequest("after is not a cursor this API returned".into())
            })?),
        };
        Ok(EffectQuery {
            source: self.source,
            state,
            unresolved: self.unresolved,
            operation: self.operation,
            updated_since: self.updated_since,
            after_id,
            limit: page_limit(self.limit)?,
            now: time::now(),
        })
    }
}

pub async fn list(
    State(state): State<AppState>,
    auth: Auth,
    ApiQuery(params): ApiQuery<ListParams>,
) -> Result<Json<Value>, ApiError> {
    let query = params.into_query()?;
    let effects = state.ledger.list_effects(auth.tenant.id, &query).await?;
    // A full page may have more behind it; the page after the last one is then empty.
    let next = match effects.last() {
        Some(last) if effects.len() as i64 >= query.limit => Some(encode_cursor(last.id)),
        _ => None,
    };
    Ok(Json(json!({ "effects": to_json(effects)?, "next": next })))
}

#[derive(Debug, Serialize)]
struct DetailJson {
    effect: EffectJson,
    history: Vec<EffectEvent>,
    /// Lease, schedule, every attempt with its evidence, and the resolution if any.
    reconcile: ReconcileView,
    /// For an unresolved effect: when its provider may forget the key (a retry would run
    /// the call again).
    replay_window: Option<ReplayWindow>,
}

pub async fn detail(
    State(state): State<AppState>,
    auth: Auth,
    ApiPath((source, key)): ApiPath<(String, String)>,
) -> Result<Json<impl Serialize>, ApiError> {
    let found = state
        .ledger
        .get_effect(auth.tenant.id, &source, &key)
        .await?
        .ok_or_else(|| {
            ApiError::NotFound(format!("no effect with that key in source {source:?}"))
        })?;
    let reconcile = state
        .ledger
        .reconcile_view(auth.tenant.id, found.effect.id)
        .await?;
    let replay_window = match (&found.effect.unresolved_kind, &reconcile.resolution) {
        (Some(_), None) => {
            replay_window(&*state.ledger, &auth.tenant, &found.effect, time::now()).await?
        }
        _ => None,
    };
    Ok(Json(DetailJson {
        effect: found.effect.try_into()?,
        history: found.history,
        reconcile,
        replay_window,
    }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LookupParams {
    q: String,
}

/// Support's answer for an order, a key or a provider object id: reckon's verdict per
/// effect with its sentence, findings and charges (the dashboard's lookup, as JSON). Nothing
/// found is an answer too (`found: false`, with any near match in `did_you_mean`).
pub async fn lookup(
    State(state): State<AppState>,
    auth: Auth,
    ApiQuery(params): ApiQuery<LookupParams>,
) -> Result<Json<reckon_engine::answer::Answer>, ApiError> {
    let settings = state.ledger.audit_settings(auth.tenant.id).await?;
    let tz = jiff::tz::TimeZone::get(&settings.time_zone).unwrap_or(jiff::tz::TimeZone::UTC);
    match reckon_engine::answer::answer(
        &*state.ledger,
        auth.tenant.id,
        &params.q,
        reckon_domain::time::now(),
        &tz,
    )
    .await
    {
        Ok(a) => Ok(Json(a)),
        Err(reckon_engine::answer::AnswerError::Invalid(why)) => {
            Err(ApiError::BadRequest(format!("q: {why}")))
        }
        Err(reckon_engine::answer::AnswerError::Ledger(e)) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_round_trips_and_garbage_is_refused() {
        assert_eq!(decode_cursor(&encode_cursor(42)), Some(42));
        for bad in ["", "42", "!!", &URL_SAFE_NO_PAD.encode("effect:-1")] {
            assert_eq!(decode_cursor(bad), None, "{bad}");
        }
    }
}
