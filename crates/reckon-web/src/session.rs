//! A signed-in person's session, as every dashboard page and the sign-in use it: the
//! session cookie, its lookup in the ledger, and the constant-time comparison of CSRF
//! tokens. It stands below both (`web.rs` signs in and out, `dash/` renders), so neither
//! imports the other for it.

use crate::AppState;
use crate::error::ApiError;
use axum::http::HeaderMap;
use axum::http::header::COOKIE;
use reckon_domain::time;
use reckon_ledger::{Role, Tenant, User};
use sha2::{Digest, Sha256};

pub const COOKIE_NAME: &str = "__Host-reckon_session";
/// A session ends after this long without a request (and after `web::ABSOLUTE_SECS` in
/// any case).
pub const IDLE_SECS: f64 = 30.0 * 60.0;

/// A signed-in person, as the route guard found them.
#[derive(Debug, Clone)]
pub struct WebSession {
    pub tenant: Tenant,
    pub user: User,
    pub role: Role,
    pub csrf_token: String,
    pub id_hash: String,
}

pub(crate) fn sha256_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

pub(crate) fn cookie_value(headers: &HeaderMap) -> Option<String> {
    cookie_named(headers, COOKIE_NAME)
}

pub(crate) fn cookie_named(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_owned())
}

/// Random ids are 43 characters of base64url; anything else cannot exist.
pub(crate) fn well_formed_id(id: &str) -> bool {
    id.len() == 43
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The live session of this request, if its cookie names one.
pub async fn current_session(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<Option<WebSession>, ApiError> {
    let Some(id) = cookie_value(headers) else {
        return Ok(None);
    };
    if !well_formed_id(&id) {
        return Ok(None);
    }
    let id_hash = sha256_hex(&id);
    let grant = state
        .ledger
        .session(&id_hash, time::now(), IDLE_SECS)
        .await?;
    Ok(grant.map(|g| WebSession {
        tenant: g.tenant,
        user: g.user,
        role: g.role,
        csrf_token: g.csrf_token,
        id_hash,
    }))
}

/// The CSRF token's comparison, for sign-out and every dashboard form alike: constant-time,
/// so the token cannot be guessed byte by byte.
pub(crate) fn same_token(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}
