//! Dashboard sign-in: `GET/POST /signin`, `POST /signout`, and `GET /app` (the tenant
//! picker).
//!
//! - Passwords: argon2id off the executor (`password.rs`); an unknown email costs the same
//!   time as a wrong password, and both get the same answer.
//! - Throttling: failures counted in the ledger (so the limits hold across replicas) per
//!   sender and account, per client address (IPv6: per prefix, `client_addr.rs`), and per
//!   account over the addresses it never signed in from; past a limit, sign-in answers 429
//!   without checking the password. A browser that signed in before carries a device
//!   cookie (`__Host-reckon_device`) and is counted on its own, so nobody else's failures
//!   lock the right person out there; a new password or `reckon user unlock` lifts every
//!   lock of an account. What the failures lock is in `Accounts::throttle_admit`.
//! - A wrong password for a known email and any password for an unknown one take the same
//!   steps before the answer (one throttle step, one lookup, one argon2 verification);
//!   writing a known person's failure into their tenants' audit logs happens after it.
//! - Sessions: a fresh random id at every sign-in (any session the browser came with is
//!   ended: no fixation), stored only as SHA-256 in the ledger, sent as
//!   `__Host-reckon_session` (Secure, HttpOnly, SameSite=Lax, Path=/). Idle timeout and an
//!   absolute lifetime; sign-out deletes it; a new password or disabling the user ends all
//!   of the user's sessions and tokens (their generation changes).
//! - CSRF: these routes sit behind tower-http's `CsrfLayer` (Sec-Fetch-Site / Origin), and
//!   state-changing requests of a signed-in session also carry the session's CSRF token.
//! - Optional TOTP second factor per user (totp-rs, SHA-1, 6 digits, 30 s, ±1 step); a
//!   code is accepted once (the last step used is kept per user in the ledger).

use crate::AppState;
use crate::error::ApiError;
use crate::password;
use crate::session::{
    COOKIE_NAME, WebSession, cookie_named, cookie_value, same_token, sha256_hex, well_formed_id,
};
use askama::Template;
use axum::Extension;
use axum::Form;
use axum::Router;
use axum::extract::{ConnectInfo, DefaultBodyLimit, State};
use axum::http::header::{CACHE_CONTROL, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use reckon_domain::time;
use reckon_ledger::{Admission, NewSession, ThrottlePolicy};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use std::net::SocketAddr;
use tower_http::csrf::CsrfLayer;

/// The browser's device id: set at a sign-in, kept a year, only ever a key to its own
/// attempt count (it grants nothing: the password is still checked).
pub const DEVICE_COOKIE: &str = "__Host-reckon_device";
const DEVICE_MAX_AGE_SECS: u64 = 365 * 24 * 3600;
/// A session ends after this long in any case (and after
/// [`crate::session::IDLE_SECS`] without a request).
pub const ABSOLUTE_SECS: f64 = 12.0 * 3600.0;
/// Attempts of one client address counted per window.
pub const THROTTLE_WINDOW_SECS: f64 = 15.0 * 60.0;
/// Failed sign-ins (in a row) of one sender at one account before that sender is locked
/// out of it: for a minute, then each further failure doubles the lock, up to an hour; a
/// success ends it.
pub const ACCOUNT_LIMIT: i64 = 5;
/// Failed sign-ins of one account from all the addresses it never signed in from before
/// those are held too. Above what one address can reach in a day under its own lock
/// (5, then one an hour at most), so it takes many addresses, and it never holds the
/// account's home addresses or known browsers.
pub const ACCOUNT_WIDE_LIMIT: i64 = 50;
/// Attempts from one client address in a window (many accounts, one attacker). The
/// address is the peer's, or a trusted proxy's header's (`client_addr.rs`).
pub const ADDRESS_LIMIT: i64 = 50;
/// The throttle, checked and counted in one ledger step per attempt
/// (`Accounts::throttle_admit`), so concurrent attempts on any replica cannot all pass.
pub const THROTTLE: ThrottlePolicy = ThrottlePolicy {
    account_free: ACCOUNT_LIMIT,
    account_wide_free: ACCOUNT_WIDE_LIMIT,
    lock_secs: 60.0,
    max_lock_secs: 3600.0,
    forget_after_secs: 24.0 * 3600.0,
    address_limit: ADDRESS_LIMIT,
    address_window_secs: THROTTLE_WINDOW_SECS,
};
/// How long after a failed sign-in's answer its audit-log lines are written: long enough
/// for the answer to have left, so that writing them does not slow it down.
pub const FAILURE_RECORD_DELAY: std::time::Duration = std::time::Duration::from_millis(200);
/// Sign-in forms are small.
const FORM_LIMIT_BYTES: usize = 16 * 1024;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/signin", get(signin_page).post(signin))
        .route("/signout", post(signout))
        .route("/app", get(app_home))
        .layer(DefaultBodyLimit::max(FORM_LIMIT_BYTES))
        .layer(CsrfLayer::new())
}

fn random_token() -> String {
    let mut b = [0u8; 32];
    rand::rng().fill_bytes(&mut b);
    URL_SAFE_NO_PAD.encode(b)
}

/// The device id the browser sent, if it is one reckon could have made.
fn device_id(headers: &HeaderMap) -> Option<String> {
    cookie_named(headers, DEVICE_COOKIE).filter(|id| well_formed_id(id))
}

#[derive(Template)]
#[template(path = "signin.html")]
struct SignInPage {
    /// The dashboard's stylesheet.
    css: String,
    message: Option<String>,
    email: String,
    tenant: String,
}

// /app is the tenant picker inside the dashboard's frame; a person in one tenant goes
// straight on to its overview.
#[derive(Template)]
#[template(path = "app.html")]
struct AppPage {
    c: crate::dash::chrome::Chrome,
    tenants: Vec<(String, String, &'static str)>,
}

fn page(status: StatusCode, tpl: &impl Template) -> Response {
    match tpl.render() {
        Ok(html) => {
            let mut res = (status, Html(html)).into_response();
            res.headers_mut()
                .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
            res
        }
        Err(e) => ApiError::internal(e).into_response(),
    }
}

async fn signin_page() -> Response {
    page(
        StatusCode::OK,
        &SignInPage {
            css: crate::dash::assets::css_href(),
            message: None,
            email: String::new(),
            tenant: String::new(),
        },
    )
}

#[derive(Deserialize)]
pub struct SignInForm {
    email: String,
    password: SecretString,
    #[serde(default)]
    totp: Option<String>,
    #[serde(default)]
    tenant: Option<String>,
}

/// The time step (30 s) whose code `code` is, within ±1 step of `now`, or `None`.
fn totp_step(secret: &[u8], code: Option<&str>, now: f64) -> Option<i64> {
    let code = code.map(str::trim).filter(|c| !c.is_empty())?;
    let t = totp_rs::TOTP::new(totp_rs::Algorithm::SHA1, 6, 0, 30, secret.to_vec()).ok()?;
    let current = (now / 30.0).floor() as i64;
    // Every candidate is compared (constant time each), so timing says nothing of which.
    let mut found = None;
    for step in [current - 1, current, current + 1] {
        if step >= 0 && t.check(code, (step * 30) as u64) && found.is_none() {
            found = Some(step);
        }
    }
    found
}

async fn signin(
    State(state): State<AppState>,
    conn: Option<Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    form: Result<Form<SignInForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    let form = match form {
        Ok(Form(f)) => Ok(f),
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return (StatusCode::PAYLOAD_TOO_LARGE, "the form is too large").into_response();
        }
        Err(e) => Err(e),
    };
    let Ok(form) = form else {
        return page(
            StatusCode::BAD_REQUEST,
            &SignInPage {
                css: crate::dash::assets::css_href(),
                message: Some("Enter an email and a password.".into()),
                email: String::new(),
                tenant: String::new(),
            },
        );
    };
    match signin_inner(&state, conn.as_ref().map(|e| &e.0), &headers, &form).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn signin_inner(
    state: &AppState,
    conn: Option<&ConnectInfo<SocketAddr>>,
    headers: &HeaderMap,
    form: &SignInForm,
) -> Result<Response, ApiError> {
    let ledger = &state.ledger;
    let now = time::now();
    let address = state.client_address.of(conn.map(|c| c.0.ip()), headers);
    // What the throttle counts: the address, or its IPv6 prefix.
    let sender = state.client_address.throttle_key(&address);
    let account = form.email.trim().to_lowercase();
    let device = device_id(headers);
    let device_hash = device.as_deref().map(sha256_hex);
    let again = |status, message: &str| {
        page(
            status,
            &SignInPage {
                css: crate::dash::assets::css_href(),
                message: Some(message.to_owned()),
                email: form.email.clone(),
                tenant: form.tenant.clone().unwrap_or_default(),
            },
        )
    };
    // Admitted and counted as a failure in one step, before the password is looked at; a
    // success gives it back below.
    match ledger
        .throttle_admit(&account, &sender, device_hash.as_deref(), now, &THROTTLE)
        .await?
    {
        Admission::Admitted => {}
        Admission::AccountLocked(until) => {
            tracing::warn!(throttled = "account", "sign-in refused: account locked");
            let minutes = ((until - now) / 60.0).ceil().max(1.0);
            return Ok(again(
                StatusCode::TOO_MANY_REQUESTS,
                &format!(
                    "Too many failed sign-ins for this account from here. Try again in \
                     {minutes} minute{}, or from a browser you signed in with before.",
                    if minutes == 1.0 { "" } else { "s" }
                ),
            ));
        }
        Admission::AddressLimited => {
            tracing::warn!(throttled = "address", "sign-in refused: address limited");
            return Ok(again(
                StatusCode::TOO_MANY_REQUESTS,
                "Too many sign-in attempts from your address. Try again in 15 minutes.",
            ));
        }
    }
    let creds = ledger.user_by_email(&form.email).await?;
    let password_ok = password::verify(
        SecretString::from(form.password.expose_secret().to_owned()),
        creds.as_ref().map(|c| c.password_hash.clone()),
    )
    .await;
    let ok = match &creds {
        Some(c) if password_ok && !c.user.disabled => match &c.totp_secret {
            None => true,
            // A code signs in once: its step is taken in the ledger by a conditional
            // update, so a replayed (or older) code fails on every replica.
            Some(secret) => match totp_step(secret.expose_secret(), form.totp.as_deref(), now) {
                Some(step) => ledger.use_totp_step(c.user.id, step).await?,
                None => false,
            },
        },
        _ => false,
    };
    let named_user = creds.as_ref().map(|c| (c.user.id, c.user.email.clone()));
    let Some(creds) = creds.filter(|_| ok) else {
        // Already counted when it was admitted.
        tracing::info!(outcome = "failed", "sign-in");
        // Into the audit log of every tenant the named person belongs to (an unknown email
        // belongs to none: nobody's log is the place for it). Written after the answer has
        // left, by the same task for a known and an unknown email (the lookup of an
        // unknown one finds no tenant): done before the answer, those writes made a known
        // email's failure slower than an unknown one's, which told who has an account.
        let (user_id, actor) = named_user.map_or((0, None), |(id, email)| (id, Some(email)));
        let state = state.clone();
        let address = address.clone();
        tokio::spawn(async move {
            tokio::time::sleep(FAILURE_RECORD_DELAY).await;
            let tenants = match state.ledger.memberships(user_id).await {
                Ok(t) => t,
                Err(e) => {
                    tracing::error!(error = %e, "recording a failed sign-in");
                    return;
                }
            };
            let Some(email) = actor else { return };
            for (t, _) in tenants {
                crate::actions::record(
                    &state,
                    t.id,
                    format!("user:{email}"),
                    "signin_failed",
                    None,
                    serde_json::json!({ "address": address }),
                )
                .await;
            }
        });
        return Ok(again(
            StatusCode::UNAUTHORIZED,
            "The email, password or one-time code is not right.",
        ));
    };
    ledger
        .throttle_succeeded(&account, &sender, device_hash.as_deref())
        .await?;
    let memberships = ledger.memberships(creds.user.id).await?;
    let wanted = form
        .tenant
        .as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty());
    let chosen = match wanted {
        Some(slug) => memberships.iter().find(|(t, _)| t.slug == slug),
        None if memberships.len() == 1 => memberships.first(),
        None => None,
    };
    let Some((tenant, _role)) = chosen else {
        let msg = if memberships.is_empty() {
            "This account belongs to no tenant yet."
        } else {
            "Name the tenant to sign in to."
        };
        return Ok(again(StatusCode::BAD_REQUEST, msg));
    };
    // Rotation: whatever session the browser arrived with ends here, and a new id is made.
    if let Some(old) = cookie_value(headers) {
        ledger.delete_session(&sha256_hex(&old)).await?;
    }
    let id = random_token();
    ledger
        .create_session(
            tenant.id,
            NewSession {
                id_hash: sha256_hex(&id),
                user_id: creds.user.id,
                generation: creds.generation,
                csrf_token: random_token(),
                now,
                expires_at: now + ABSOLUTE_SECS,
            },
        )
        .await?;
    tracing::info!(outcome = "ok", tenant = %tenant.slug, "sign-in");
    crate::actions::record(
        state,
        tenant.id,
        format!("user:{}", creds.user.email),
        "signin",
        None,
        serde_json::json!({ "address": address }),
    )
    .await;
    // A person with one tenant has nothing to choose: straight to its overview.
    let home = match memberships.as_slice() {
        [(only, _)] => format!("/t/{}", crate::dash::fmt::seg(&only.slug)),
        _ => "/app".to_owned(),
    };
    // This browser is now a known one for the account: its own attempts are counted on
    // their own from here on. An id it already has is kept (one browser, many accounts).
    let device = device.unwrap_or_else(random_token);
    ledger
        .remember_device(&account, &sha256_hex(&device), now)
        .await?;
    let mut res = Redirect::to(&home).into_response();
    res.headers_mut().insert(
        SET_COOKIE,
        HeaderValue::from_str(&format!(
            "{COOKIE_NAME}={id}; Path=/; Secure; HttpOnly; SameSite=Lax; Max-Age={}",
            ABSOLUTE_SECS as u64
        ))
        .expect("base64url is a valid header value"),
    );
    res.headers_mut().append(
        SET_COOKIE,
        HeaderValue::from_str(&format!(
            "{DEVICE_COOKIE}={device}; Path=/; Secure; HttpOnly; SameSite=Strict; \
             Max-Age={DEVICE_MAX_AGE_SECS}"
        ))
        .expect("base64url is a valid header value"),
    );
    Ok(res)
}

#[derive(Deserialize)]
pub struct SignOutForm {
    #[serde(default)]
    csrf: String,
}

async fn signout(
    State(state): State<AppState>,
    Extension(session): Extension<WebSession>,
    form: Result<Form<SignOutForm>, axum::extract::rejection::FormRejection>,
) -> Result<Response, ApiError> {
    let csrf = form.map(|f| f.0.csrf).unwrap_or_default();
    if !same_token(&csrf, &session.csrf_token) {
        return Ok((StatusCode::FORBIDDEN, "missing or wrong CSRF token").into_response());
    }
    state.ledger.delete_session(&session.id_hash).await?;
    let mut res = Redirect::to("/signin").into_response();
    res.headers_mut().insert(
        SET_COOKIE,
        HeaderValue::from_static(
            "__Host-reckon_session=; Path=/; Secure; HttpOnly; SameSite=Lax; Max-Age=0",
        ),
    );
    Ok(res)
}

async fn app_home(
    State(state): State<AppState>,
    Extension(session): Extension<WebSession>,
) -> Result<Response, ApiError> {
    let memberships = state.ledger.memberships(session.user.id).await?;
    let tenants = memberships
        .iter()
        .map(|(t, role)| {
            (
                t.slug.clone(),
                format!("/t/{}", crate::dash::fmt::seg(&t.slug)),
                role.as_str(),
            )
        })
        .collect();
    Ok(page(
        StatusCode::OK,
        &AppPage {
            c: crate::dash::chrome::Chrome::new(&session, "app"),
            tenants,
        },
    ))
}
