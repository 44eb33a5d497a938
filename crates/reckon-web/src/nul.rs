//! NUL characters are refused at the door. PostgreSQL `text` cannot hold U+0000, so a NUL
//! that reached a ledger query failed it (a 500 on one ledger, stored on the other); no
//! name, key, note, query or email reckon keeps has a use for one. Every request's path
//! parameters, query, form body and JSON body are checked before the route's guard and
//! handler run, and a NUL anywhere is a 400 naming the field that holds it.
//!
//! The one exception is the body of `POST /api/v1/effects` (push): its items are judged
//! one by one, and an item holding a NUL is rejected on its own (as a scanned row with one
//! is quarantined) while the others are stored.

use crate::AppState;
use crate::error::ApiError;
use axum::body::Body;
use axum::extract::{FromRequestParts, MatchedPath, RawPathParams, Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

/// The route whose body holds independent items (see the module's notes), for POST.
const PUSH_ROUTE: &str = "/api/v1/effects";

pub async fn refuse_nul(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let api = req.uri().path().starts_with("/api/");
    let refuse = |field: String| -> Response {
        let message =
            format!("{field} contains a NUL character (U+0000), which reckon does not accept");
        if api {
            ApiError::BadRequest(message).into_response()
        } else {
            crate::dash::error_page(StatusCode::BAD_REQUEST, &message)
        }
    };
    let (mut parts, body) = req.into_parts();
    if let Ok(params) = RawPathParams::from_request_parts(&mut parts, &()).await {
        for (name, value) in &params {
            if value.contains('\0') {
                return refuse(format!("the path parameter {name:?}"));
            }
        }
    }
    if let Some(query) = parts.uri.query() {
        for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
            if name.contains('\0') {
                return refuse("a query parameter's name".into());
            }
            if value.contains('\0') {
                return refuse(format!("the query parameter {name:?}"));
            }
        }
    }
    let essence = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .unwrap_or_default();
    let form = essence == "application/x-www-form-urlencoded";
    let json = essence == "application/json" || essence.ends_with("+json");
    let route = parts
        .extensions
        .get::<MatchedPath>()
        .map(MatchedPath::as_str);
    let push = parts.method == Method::POST && route == Some(PUSH_ROUTE);
    if !(form || json) || push {
        return next.run(Request::from_parts(parts, body)).await;
    }
    // The body limit the handlers' extractors apply; over it, the handler answers 413 as
    // it would without this check.
    let Ok(bytes) = axum::body::to_bytes(body, state.max_body_bytes).await else {
        return if api {
            ApiError::PayloadTooLarge("the request body is larger than this server accepts".into())
                .into_response()
        } else {
            (StatusCode::PAYLOAD_TOO_LARGE, "the form is too large").into_response()
        };
    };
    if form {
        for (name, value) in url::form_urlencoded::parse(&bytes) {
            if name.contains('\0') {
                return refuse("a form field's name".into());
            }
            if value.contains('\0') {
                return refuse(format!("the form field {name:?}"));
            }
        }
    } else if may_hold_nul(&bytes)
        && let Ok(value) = serde_json::from_slice::<Value>(&bytes)
        && let Some(field) = nul_in_json(&value, "")
    {
        return refuse(field);
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// A NUL can only be in valid JSON as the escape `\u0000` (a raw one is invalid JSON), so
/// a body without that text is not parsed a second time.
fn may_hold_nul(bytes: &[u8]) -> bool {
    bytes.windows(6).any(|w| w == b"\\u0000")
}

/// The first field of `value` holding a NUL (in a string or an object's key), named by its
/// path (`note`, `items[2].key`), or `None`.
fn nul_in_json(value: &Value, path: &str) -> Option<String> {
    match value {
        Value::String(s) if s.contains('\0') => Some(if path.is_empty() {
            "the body".into()
        } else {
            format!("the field {path:?}")
        }),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, v)| nul_in_json(v, &format!("{path}[{i}]"))),
        Value::Object(fields) => fields.iter().find_map(|(k, v)| {
            if k.contains('\0') {
                return Some("a field name".into());
            }
            let p = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            nul_in_json(v, &p)
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nul_is_named_by_the_field_that_holds_it() {
        let v: Value =
            serde_json::from_str(r#"{"name":"ok","items":[{"k":"a"},{"k":"b\u0000"}]}"#).unwrap();
        assert_eq!(
            nul_in_json(&v, "").as_deref(),
            Some("the field \"items[1].k\"")
        );
        let v: Value = serde_json::from_str(r#"{"a\u0000":1}"#).unwrap();
        assert!(nul_in_json(&v, "").unwrap().contains("field name"));
        let v: Value = serde_json::from_str(r#"{"note":"a\\u0000 is text"}"#).unwrap();
        assert_eq!(nul_in_json(&v, ""), None);
        assert!(may_hold_nul(br#"{"a":"\u0000"}"#));
        assert!(!may_hold_nul(br#"{"a":"b"}"#));
    }
}
