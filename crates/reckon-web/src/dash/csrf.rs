//! The dashboard forms' CSRF check: every state-changing form carries the session's CSRF
//! token (besides `CsrfLayer`'s Origin check), and [`accept`] refuses it before anything
//! else is read or written.

use super::chrome::bad_request;
use super::error_page;
use crate::session::WebSession;
use axum::Form;
use axum::extract::rejection::FormRejection;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;

fn csrf_ok(s: &WebSession, token: &str) -> bool {
    crate::session::same_token(token, &s.csrf_token)
}

/// A dashboard form that carries the session's CSRF token.
pub(super) trait HasCsrf {
    fn csrf(&self) -> &str;
}

/// Implements [`HasCsrf`] for forms whose token is the field `csrf`.
macro_rules! csrf_form {
    ($($t:ty),* $(,)?) => {
        $(impl $crate::dash::csrf::HasCsrf for $t {
            fn csrf(&self) -> &str {
                &self.csrf
            }
        })*
    };
}
pub(super) use csrf_form;

/// Every state-changing form's first step, in one place: the form, or the page refusing
/// it (400 when it does not parse or is too large, 403 when its CSRF token is not the
/// session's). Nothing else is read or written before this passes.
#[allow(
    clippy::result_large_err,
    reason = "The refusal is a whole response, returned at once, once per request: boxing it buys nothing"
)]
pub(super) fn accept<F: HasCsrf>(
    s: &WebSession,
    form: Result<Form<F>, FormRejection>,
) -> Result<F, Response> {
    let Ok(Form(f)) = form else {
        return Err(bad_request("The form is malformed or too large."));
    };
    if !csrf_ok(s, f.csrf()) {
        return Err(error_page(
            StatusCode::FORBIDDEN,
            "Missing or wrong CSRF token: reload the page and try again.",
        ));
    }
    Ok(f)
}

/// A form with nothing but its CSRF token (a button).
#[derive(Deserialize)]
pub struct CsrfOnly {
    #[serde(default)]
    csrf: String,
}

csrf_form!(CsrfOnly);
