//! The one error type of the HTTP surface. Handlers use `?`; this is the only place that
//! decides a status code. Internal errors are logged here, once, inside the request's span,
//! and the client gets a sentence that reveals nothing about the server.

use axum::Json;
use axum::extract::rejection::{BytesRejection, JsonRejection, PathRejection, QueryRejection};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use reckon_ledger::LedgerError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: the request is malformed (query, content type, body shape).
    #[error("{0}")]
    BadRequest(String),
    /// 401: no token, or not a live one. Always answered with `WWW-Authenticate: Bearer`.
    #[error("{0}")]
    Unauthorized(&'static str),
    /// 403: the token is valid but its role may not do this.
    #[error("{0}")]
    Forbidden(String),
    /// 404: nothing of that name in this tenant.
    #[error("{0}")]
    NotFound(String),
    /// 409: it already exists.
    #[error("{0}")]
    Conflict(String),
    /// 413: the request is larger than we take, refused whole.
    #[error("{0}")]
    PayloadTooLarge(String),
    /// 422: well-formed, but the content is not acceptable.
    #[error("{0}")]
    Unprocessable(String),
    /// 500: our fault. The cause is logged, never returned.
    #[error("internal error")]
    Internal(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// 503: the request ran past the server's deadline (`request_timeout`) and was given
    /// up; nothing it would have answered is known. Safe to retry later (every write the
    /// API makes is either idempotent or refused when repeated).
    #[error("{0}")]
    Unavailable(String),
}

/// Every error the API answers (4xx and 5xx) has this body.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    /// One sentence: what is wrong and, where it helps, what to do instead.
    #[schema(example = "limit 0 is not between 1 and 1000")]
    pub error: String,
}

impl ApiError {
    pub fn internal(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> ApiError {
        ApiError::Internal(e.into())
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// An extractor's rejection, by the status axum gives it, with our body shape.
    fn from_rejection(status: StatusCode, text: String) -> ApiError {
        match status {
            StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge(
                "the request body is larger than this server accepts".into(),
            ),
            StatusCode::UNPROCESSABLE_ENTITY => ApiError::Unprocessable(text),
            s if s.is_client_error() => ApiError::BadRequest(text),
            _ => ApiError::internal(text),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let message = match &self {
            ApiError::Internal(cause) => {
                tracing::error!(error = %cause, "request failed");
                "internal error; the server log has the details".to_owned()
            }
            other => other.to_string(),
        };
        let mut response = (status, Json(ErrorBody { error: message })).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<LedgerError> for ApiError {
    fn from(e: LedgerError) -> Self {
        match e {
            LedgerError::NotFound(what) => ApiError::NotFound(format!("{what} not found")),
            LedgerError::Conflict(what) => ApiError::Conflict(format!("{what} already exists")),
            LedgerError::Invalid(why) => ApiError::Unprocessable(why),
            other => ApiError::internal(other),
        }
    }
}

impl From<reckon_engine::commands::CommandError> for ApiError {
    fn from(e: reckon_engine::commands::CommandError) -> Self {
        use reckon_engine::commands::CommandError;
        match e {
            CommandError::Invalid(why) => ApiError::Unprocessable(why),
            CommandError::Forbidden(why) => ApiError::Forbidden(why),
            CommandError::Exists(why) => ApiError::Conflict(why),
            CommandError::Ledger(l) => l.into(),
        }
    }
}

macro_rules! from_rejection {
    ($($t:ty),*) => {$(
        impl From<$t> for ApiError {
            fn from(r: $t) -> Self {
                ApiError::from_rejection(r.status(), r.body_text())
            }
        }
    )*};
}
from_rejection!(JsonRejection, QueryRejection, PathRejection, BytesRejection);
