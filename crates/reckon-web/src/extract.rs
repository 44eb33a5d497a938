//! axum's extractors with our rejection: every malformed request gets the same JSON error
//! body as any other [`ApiError`].

use crate::error::ApiError;
use axum::extract::{FromRequest, FromRequestParts, Request};
use serde::de::DeserializeOwned;

/// `axum::Json`, rejecting with [`ApiError`], for bodies that are one JSON object. Every
/// JSON body the API takes is an object, and serde would otherwise read a struct from an
/// array too (`[null, null]` as the struct's fields in order), so anything but an object
/// is refused before it is read.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let axum::Json(value) = axum::Json::<serde_json::Value>::from_request(req, state).await?;
        if !value.is_object() {
            return Err(ApiError::BadRequest(
                "the body must be a JSON object".into(),
            ));
        }
        // Well-formed JSON of the wrong shape is unprocessable (422), as axum's `Json` says.
        serde_json::from_value(value)
            .map(ApiJson)
            .map_err(|e| ApiError::Unprocessable(format!("the body does not fit: {e}")))
    }
}

/// `axum::extract::Query`, rejecting with [`ApiError`] (400 for unknown or malformed
/// parameters).
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct ApiQuery<T>(pub T);

/// `axum::extract::Path`, rejecting with [`ApiError`].
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct ApiPath<T>(pub T);
