//! Security headers on every response (ASVS 3.4): a CSP that allows no inline script, no
//! eval, no plugins, no framing; nosniff; a strict referrer policy. Set only where a
//! handler did not set its own.

use axum::http::{HeaderName, HeaderValue, header};
use tower::ServiceBuilder;
use tower::layer::util::{Identity, Stack};
use tower_http::set_header::SetResponseHeaderLayer;

pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
    img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; \
    form-action 'self'";

type L = SetResponseHeaderLayer<HeaderValue>;
/// The four header layers stacked (named for clippy::type_complexity).
type Headers = Stack<L, Stack<L, Stack<L, Stack<L, Identity>>>>;

pub fn security_headers() -> ServiceBuilder<Headers> {
    let set = |name: HeaderName, value: &'static str| {
        SetResponseHeaderLayer::if_not_present(name, HeaderValue::from_static(value))
    };
    ServiceBuilder::new()
        .layer(set(header::CONTENT_SECURITY_POLICY, CSP))
        .layer(set(header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .layer(set(header::REFERRER_POLICY, "same-origin"))
        .layer(set(header::X_FRAME_OPTIONS, "DENY"))
}
