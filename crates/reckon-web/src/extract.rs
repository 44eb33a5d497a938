//! axum's extractors with our rejection: every malformed request gets the same JSON error
//! body as any other [`ApiError`].

use crate::error::ApiError;
use axum::extract::FromRequest;
use axum::extract::FromRequestParts;

/// `axum::Json`, rejecting with [`ApiError`].
#[derive(Debug, FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct ApiJson<T>(pub T);

/// `axum::extract::Query`, rejecting with [`ApiError`] (400 for unknown or malformed
/// parameters).
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct ApiQuery<T>(pub T);

/// `axum::extract::Path`, rejecting with [`ApiError`].
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct ApiPath<T>(pub T);
