use crate::AppState;
use crate::auth::{Admin, Auth};
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::extract::ApiPath;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use reckon_engine::commands;
use reckon_engine::{SourceEdit, SourceInput};
use reckon_ledger::Source;
use serde::Serialize;

#[derive(Serialize, utoipa::ToSchema)]
pub struct SourceList {
    #[schema(value_type = Vec<reckon_engine::schema::Source>)]
    sources: Vec<Source>,
}

/// The tenant's sources with their scan health.
#[utoipa::path(
    get,
    path = "/sources",
    operation_id = "listSources",
    tag = "sources",
    responses((status = 200, description = "Every source of the token's tenant.", body = SourceList))
)]
pub async fn list(State(state): State<AppState>, auth: Auth) -> Result<Json<SourceList>, ApiError> {
    let sources = state.ledger.list_sources(auth.tenant.id).await?;
    Ok(Json(SourceList { sources }))
}

/// Add a source (admin). A scanned source's DSN is checked against the egress policy now
/// and before every connection; it is stored sealed and never shown again.
#[utoipa::path(
    post,
    path = "/sources",
    operation_id = "createSource",
    tag = "sources",
    request_body = reckon_engine::SourceInput,
    responses(
        (status = 201, description = "Added.", body = reckon_engine::schema::Source),
        (status = 409, description = "A source of that name exists."),
        (status = 413, description = "The body is larger than the server accepts."),
        (status = 422, description = "Not an acceptable source: the name, kind, DSN, table or a duration; `error` says which."),
    )
)]
pub async fn create(
    State(state): State<AppState>,
    Admin(auth): Admin,
    ApiJson(input): ApiJson<SourceInput>,
) -> Result<(StatusCode, Json<Source>), ApiError> {
    // The refusals never quote a DSN beyond its host (fixed sentences, see
    // `reckon_sources::dsn`), so they are answered as they are: cutting a secret out of
    // them would tell the caller where it matched (see `scrub`).
    let source = commands::add_source(&crate::actions::api_ctx(&state, &auth), input).await?;
    Ok((StatusCode::CREATED, Json(source)))
}

/// Change a source's settings (admin). Fields left out keep their stored value; the DSN's
/// secret is replaced only when a new one is given (a DSN without a password keeps the
/// stored password). The same checks as adding apply: a new DSN is checked against the
/// egress policy now and before every connection, like one added.
#[utoipa::path(
    patch,
    path = "/sources/{name}",
    operation_id = "editSource",
    tag = "sources",
    params(("name" = String, Path, description = "The source's name.", example = json!("billing"))),
    request_body = reckon_engine::SourceEdit,
    responses(
        (status = 200, description = "Changed.", body = reckon_engine::schema::Source),
        (status = 404, description = "The tenant has no source of that name."),
        (status = 413, description = "The body is larger than the server accepts."),
        (status = 422, description = "Nothing to change, or not an acceptable value; `error` says which."),
    )
)]
pub async fn edit(
    State(state): State<AppState>,
    Admin(auth): Admin,
    ApiPath(name): ApiPath<String>,
    ApiJson(edit): ApiJson<SourceEdit>,
) -> Result<Json<Source>, ApiError> {
    let source =
        commands::edit_source(&crate::actions::api_ctx(&state, &auth), &name, edit).await?;
    Ok(Json(source))
}

/// What of a DSN must never appear in a probe's answer, which comes from drivers and the
/// tenant's server: the whole DSN and its password, raw and decoded.
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

/// Cut `secrets` out of a message from a driver or a server. Only for text reckon did not
/// write: a refusal of reckon's own is written never to quote a secret, and is not passed
/// through here, since where "<redacted>" lands says what the secret is (a one-letter
/// password turns "policy" into "<redacted>olicy") and whether a guess the caller put in
/// the message equals it.
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
