//! The dashboard's static files, embedded in the binary (no files beside it, no CDN: it
//! works air-gapped). Names carry their version or content hash, so they are cached as
//! immutable for a year; a new build with changed CSS serves it under a new name.

use axum::extract::Path;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use std::sync::LazyLock;

pub const HTMX_NAME: &str = "htmx-2.0.11.min.js";
static HTMX: &[u8] = include_bytes!("../../../../static/vendor/htmx-2.0.11.min.js");
static CSS: &[u8] = include_bytes!("../../../../static/reckon.css");
static FAVICON: &[u8] = include_bytes!("../../../../static/favicon.svg");

/// `reckon.<first 12 hex of its sha256>.css`
static CSS_NAME: LazyLock<String> = LazyLock::new(|| {
    let mut h = hex::encode(Sha256::digest(CSS));
    h.truncate(12);
    format!("reckon.{h}.css")
});

pub fn css_href() -> String {
    format!("/static/{}", *CSS_NAME)
}

pub fn htmx_href() -> String {
    format!("/static/{HTMX_NAME}")
}

pub async fn serve(Path(name): Path<String>) -> Response {
    let (body, content_type) = if name == HTMX_NAME {
        (HTMX, "text/javascript; charset=utf-8")
    } else if name == *CSS_NAME {
        (CSS, "text/css; charset=utf-8")
    } else {
        return (StatusCode::NOT_FOUND, "no such file").into_response();
    };
    let mut res = body.into_response();
    let h = res.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=31536000, immutable"),
    );
    res
}

/// `/favicon.ico`, which browsers ask for whatever the page says: the SVG icon (browsers
/// go by the content type, not the name), cached for a day.
pub async fn favicon() -> Response {
    let mut res = FAVICON.into_response();
    let h = res.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("image/svg+xml"));
    h.insert(
        CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=86400"),
    );
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vendored file is the one `static/vendor/README.md` names (npm `htmx.org` 2.0.11).
    #[test]
    fn vendored_htmx_is_the_recorded_release() {
        let readme = include_str!("../../../../static/vendor/README.md");
        let sha = hex::encode(Sha256::digest(HTMX));
        assert!(readme.contains(&sha), "sha256 {sha} is not in the README");
        assert!(readme.contains(HTMX_NAME));
    }

    #[test]
    fn the_css_name_changes_with_its_content() {
        assert!(CSS_NAME.starts_with("reckon.") && CSS_NAME.ends_with(".css"));
        assert_eq!(CSS_NAME.len(), "reckon.".len() + 12 + ".css".len());
    }
}
