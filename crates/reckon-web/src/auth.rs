//! Bearer tokens of one tenant.
//!
//! A token is `rkn_` + 43 characters of base64url (32 random bytes) + `_` + 8 hex characters,
//! the first 4 bytes of SHA-256 of the random part. The checksum lets us refuse a mistyped or
//! invented token without touching the database; the ledger stores only SHA-256 of the whole
//! token, so a copy of the database grants nothing.

use crate::AppState;
use crate::error::ApiError;
use axum::extract::FromRequestParts;
use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use reckon_ledger::{Role, Tenant};
use sha2::{Digest, Sha256};

const PREFIX: &str = "rkn_";
const RANDOM_LEN: usize = 43;
const CHECKSUM_LEN: usize = 8;
const TOKEN_LEN: usize = PREFIX.len() + RANDOM_LEN + 1 + CHECKSUM_LEN;

fn checksum(random_part: &str) -> String {
    hex::encode(&Sha256::digest(random_part.as_bytes())[..CHECKSUM_LEN / 2])
}

fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// A new token, and the hash to store for it. The token itself is shown once and kept nowhere.
pub fn mint_token() -> (String, String) {
    let mut secret = [0u8; 32];
    rand::rng().fill_bytes(&mut secret);
    let random_part = URL_SAFE_NO_PAD.encode(secret);
    let token = format!("{PREFIX}{random_part}_{}", checksum(&random_part));
    let hash = sha256_hex(&token);
    (token, hash)
}

/// The hash under which a token is stored, or `None` when the text is not a well-formed token
/// (wrong prefix, length, alphabet or checksum): such a token cannot exist, so nobody looks.
pub fn token_hash(token: &str) -> Option<String> {
    if token.len() != TOKEN_LEN || !token.is_ascii() {
        return None;
    }
    let rest = token.strip_prefix(PREFIX)?;
    let (random_part, tail) = rest.split_at(RANDOM_LEN);
    let sum = tail.strip_prefix('_')?;
    // Decoding checks the alphabet and that the part is exactly 32 bytes with no stray bits.
    let bytes = URL_SAFE_NO_PAD.decode(random_part).ok()?;
    if bytes.len() != 32 || sum != checksum(random_part) {
        return None;
    }
    Some(sha256_hex(token))
}

/// The tenant and role a request acts as. Every ledger call of a handler uses `tenant.id`
/// from here; no handler takes a tenant from the request.
#[derive(Debug, Clone)]
pub struct Auth {
    pub tenant: Tenant,
    pub role: Role,
    pub token_id: i64,
    /// The person who made the token; `None` for the operator's (CLI) tokens.
    pub user_id: Option<i64>,
}

impl Auth {
    pub fn require(&self, role: Role) -> Result<(), ApiError> {
        if self.role >= role {
            Ok(())
        } else {
            Err(ApiError::Forbidden(format!(
                "this needs a token with the {} role; this token has {}",
                role.as_str(),
                self.role.as_str()
            )))
        }
    }
}

impl Auth {
    /// Check the bearer token of a request. A malformed token is refused before any
    /// database read.
    pub async fn authenticate(headers: &HeaderMap, state: &AppState) -> Result<Auth, ApiError> {
        let value = headers.get(AUTHORIZATION).ok_or(ApiError::Unauthorized(
            "an Authorization: Bearer token is required",
        ))?;
        let token = value
            .to_str()
            .ok()
            .and_then(|v| {
                let (scheme, token) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .ok_or(ApiError::Unauthorized(
                "the Authorization header must be \"Bearer <token>\"",
            ))?;
        let hash = token_hash(token).ok_or(ApiError::Unauthorized("the token is not valid"))?;
        let grant = state
            .ledger
            .authenticate_token(&hash)
            .await?
            .ok_or(ApiError::Unauthorized("the token is not valid"))?;
        Ok(Auth {
            tenant: grant.tenant,
            role: grant.role,
            token_id: grant.token_id,
            user_id: grant.created_by,
        })
    }
}

impl FromRequestParts<AppState> for Auth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Auth, ApiError> {
        // The route guard (routes.rs) has already authenticated the request.
        if let Some(auth) = parts.extensions.get::<Auth>() {
            return Ok(auth.clone());
        }
        Auth::authenticate(&parts.headers, state).await
    }
}

/// An [`Auth`] whose role is admin, checked before the body is read, so a viewer's write is
/// refused with 403 whatever it sends.
#[derive(Debug, Clone)]
pub struct Admin(pub Auth);

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Admin, ApiError> {
        let auth = Auth::from_request_parts(parts, state).await?;
        auth.require(Role::Admin)?;
        Ok(Admin(auth))
    }
}

#[cfg(test)]
#[allow(
    clippy::string_slice,
    reason = "the texts sliced here are the tests' own ASCII"
)]
mod tests {
    use super::*;

    #[test]
    fn a_minted_token_is_well_formed_and_hashes_to_what_is_stored() {
        let (token, hash) = mint_token();
        assert_eq!(token.len(), TOKEN_LEN);
        assert!(token.starts_with("rkn_"));
        assert_eq!(token_hash(&token), Some(hash.clone()));
        assert_eq!(hash.len(), 64);
        let (other, _) = mint_token();
        assert_ne!(token, other);
    }

    #[test]
    fn malformed_tokens_are_refused_without_a_lookup() {
        let (token, _) = mint_token();
        let mut wrong_sum = token.clone();
        let last = if wrong_sum.ends_with('0') { "1" } else { "0" };
        wrong_sum.replace_range(TOKEN_LEN - 1.., last);
        let mut wrong_char = token.clone();
        wrong_char.replace_range(10..11, "+");
        for bad in [
            String::new(),
            "rkn_".into(),
            token.replacen("rkn_", "rkx_", 1),
            format!("{token}0"),
            token[..TOKEN_LEN - 1].to_owned(),
            wrong_sum,
            wrong_char,
            token.replace('_', "é"),
        ] {
            assert_eq!(token_hash(&bad), None, "{bad}");
        }
    }
}
