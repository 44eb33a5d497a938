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
use serde_json::Value;

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

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// Only this source's effects.
    source: Option<String>,
    /// Only effects in this state.
    #[param(value_type = Option<reckon_domain::State>, inline)]
    state: Option<String>,
    /// true: only effects nobody knows the outcome of (unknown, abandoned); false: only
    /// the others.
    unresolved: Option<bool>,
    /// Only this operation (the key's first part).
    operation: Option<String>,
    /// Only effects that changed at or after this time (epoch seconds).
    updated_since: Option<f64>,
    /// The `next` of the previous page.
    after: Option<String>,
    /// Page size; default 100.
    #[param(minimum = 1, maximum = 1000)]
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

/// A page of effects.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EffectList {
    #[schema(value_type = Vec<reckon_engine::schema::Effect>)]
    effects: Vec<EffectJson>,
    /// The cursor of the next page (`after`); null when this page is not full.
    #[schema(required = true)]
    next: Option<String>,
}

/// The tenant's effects, newest first, filtered (support and above).
#[utoipa::path(
    get,
    path = "/effects",
    operation_id = "listEffects",
    tag = "effects",
    params(ListParams),
    responses((status = 200, description = "A page of effects.", body = EffectList))
)]
pub async fn list(
    State(state): State<AppState>,
    auth: Auth,
    ApiQuery(params): ApiQuery<ListParams>,
) -> Result<Json<EffectList>, ApiError> {
    let query = params.into_query()?;
    let effects = state.ledger.list_effects(auth.tenant.id, &query).await?;
    // A full page may have more behind it; the page after the last one is then empty.
    let next = match effects.last() {
        Some(last) if effects.len() as i64 >= query.limit => Some(encode_cursor(last.id)),
        _ => None,
    };
    Ok(Json(EffectList {
        effects: to_json(effects)?,
        next,
    }))
}

/// One effect with everything reckon knows about it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EffectDetail {
    #[schema(value_type = reckon_engine::schema::Effect)]
    effect: EffectJson,
    /// Every change reckon observed in the row.
    #[schema(value_type = Vec<reckon_engine::schema::EffectEvent>)]
    history: Vec<EffectEvent>,
    /// Lease, schedule, every attempt with its evidence, and the resolution if any.
    #[schema(value_type = reckon_engine::schema::ReconcileView)]
    reconcile: ReconcileView,
    /// What happened, as support's lookup says it for this effect: the same verdict and
    /// sentence (`GET /lookup`), never judged apart.
    answer: reckon_engine::answer::EffectAnswer,
    /// For an unresolved effect: when its provider may forget the key (a retry would run
    /// the call again).
    #[schema(required = true)]
    replay_window: Option<ReplayWindow>,
}

/// One effect by source and key, with its history and reconciliation (support and
/// above). A key may hold `/`, encoded or not.
#[utoipa::path(
    get,
    path = "/effects/{source}/{key}",
    operation_id = "getEffect",
    tag = "effects",
    params(
        ("source" = String, Path, description = "The source's name.", example = json!("billing")),
        ("key" = String, Path, description = "The effect's whole key.", example = json!("charge:v1:ORD-1")),
    ),
    responses(
        (status = 200, description = "The effect.", body = EffectDetail),
        (status = 404, description = "No effect with that key in that source."),
    )
)]
pub async fn detail(
    State(state): State<AppState>,
    auth: Auth,
    ApiPath((source, key)): ApiPath<(String, String)>,
) -> Result<Json<EffectDetail>, ApiError> {
    let now = time::now();
    let v = reckon_engine::read::effect::effect_view(
        &*state.ledger,
        auth.tenant.id,
        &source,
        &key,
        now,
    )
    .await?
    .ok_or_else(|| ApiError::NotFound(format!("no effect with that key in source {source:?}")))?;
    let replay_window = if v.open {
        replay_window(&*state.ledger, &auth.tenant, &v.effect, now).await?
    } else {
        None
    };
    Ok(Json(EffectDetail {
        effect: v.effect.try_into()?,
        history: v.history,
        reconcile: v.reconcile,
        answer: v.answer,
        replay_window,
    }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct LookupParams {
    /// An order id, a part of a key, a whole key, or a provider object id (`ch_...`,
    /// `pi_...`, `re_...`). Surrounding spaces are ignored; it must hold more than them.
    #[param(min_length = 1, max_length = 512, example = json!("ORD-1"))]
    q: String,
}

/// Support's answer for an order, a key or a provider object id: reckon's verdict per
/// effect with its sentence, findings and charges (the dashboard's lookup, as JSON). Nothing
/// found is an answer too (`found: false`, with any near match in `did_you_mean`).
#[utoipa::path(
    get,
    path = "/lookup",
    operation_id = "lookup",
    tag = "effects",
    params(LookupParams),
    responses((status = 200, description = "The answer (found or not).", body = reckon_engine::answer::Answer))
)]
pub async fn lookup(
    State(state): State<AppState>,
    auth: Auth,
    ApiQuery(params): ApiQuery<LookupParams>,
) -> Result<Json<reckon_engine::answer::Answer>, ApiError> {
    match reckon_engine::read::lookup(
        &*state.ledger,
        auth.tenant.id,
        &params.q,
        reckon_domain::time::now(),
    )
    .await
    {
        Ok(v) => Ok(Json(v.answer)),
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
