use crate::AppState;
use crate::auth::{Admin, Auth};
use crate::error::ApiError;
use crate::extract::ApiJson;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use reckon_engine::{SourceInput, new_source};
use reckon_ledger::{LedgerError, Source};
use serde_json::{Value, json};

pub async fn list(State(state): State<AppState>, auth: Auth) -> Result<Json<Value>, ApiError> {
    let sources = state.ledger.list_sources(auth.tenant.id).await?;
    Ok(Json(json!({ "sources": sources })))
}

pub async fn create(
    State(state): State<AppState>,
    Admin(auth): Admin,
    ApiJson(input): ApiJson<SourceInput>,
) -> Result<(StatusCode, Json<Source>), ApiError> {
    let name = input.name.clone();
    let secrets = dsn_secrets(input.dsn.as_deref());
    let new = new_source(input).map_err(|why| ApiError::Unprocessable(scrub(why, &secrets)))?;
    let source = state
        .ledger
        .add_source(auth.tenant.id, new)
        .await
        .map_err(|e| match e {
            LedgerError::Conflict(_) => {
                ApiError::Conflict(format!("a source named {name:?} already exists"))
            }
            other => other.into(),
        })?;
    crate::actions::by_token(
        &state,
        &auth,
        "source.add",
        &source.name,
        json!({ "kind": source.kind.as_str() }),
    )
    .await;
    Ok((StatusCode::CREATED, Json(source)))
}

/// What of a DSN must never appear in an answer: the whole DSN and its password, raw and
/// decoded. `new_source` promises not to echo them; this keeps that promise for it should a
/// driver's message ever quote its input.
pub(crate) fn dsn_secrets(dsn: Option<&str>) -> Vec<String> {
    let Some(dsn) = dsn else { return Vec::new() };
    let mut secrets = vec![dsn.to_owned()];
    if let Some(password) = url::Url::parse(dsn)
        .ok()
        .and_then(|u| u.password().map(str::to_owned))
    {
        let decoded = percent_encoding::percent_decode_str(&password)
            .decode_utf8_lossy()
            .into_owned();
        secrets.push(password);
        secrets.push(decoded);
    }
    secrets.retain(|s| !s.is_empty());
    secrets
}

pub(crate) fn scrub(mut message: String, secrets: &[String]) -> String {
    for secret in secrets {
        message = message.replace(secret.as_str(), "<redacted>");
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_sentence_never_carries_the_dsn_password() {
        let secrets = dsn_secrets(Some("postgres://u:p%40ss@h/db"));
        let said = scrub("bad p@ss and p%40ss".into(), &secrets);
        assert_eq!(said, "bad <redacted> and <redacted>");
    }
}
