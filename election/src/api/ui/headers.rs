//! The headers every status-page answer carries ([`secure`]), and the
//! pages' two style sheets, whose hashes the content security policy
//! names.
//!
//! The pages load nothing: no script, no image, no font, no frame; their
//! SVG plots are inline markup, their styles the two `<style>` blocks
//! below (no `style=` attribute anywhere), their forms post to this node.
//! So the policy allows exactly that: `default-src 'none'`, the two style
//! blocks by SHA-256, forms to `'self'`, and no framing
//! (`frame-ancestors 'none'` and, for older browsers, `X-Frame-Options:
//! DENY`) — a page elsewhere cannot frame the page to click its buttons
//! (clickjacking). `Referrer-Policy: same-origin` keeps lease names in
//! URLs from leaking to any other site; it is not `no-referrer` because
//! under `no-referrer` a browser sends `Origin: null` on the page's own
//! form POSTs (Fetch, "serialize a request origin"), which `origin.rs`
//! must refuse: the sign-out button would stop working. `Cache-Control:
//! no-store` keeps a signed-in page out of caches and the back-button
//! history after sign-out.

use std::sync::LazyLock;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use base64::Engine as _;
use http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS,
    X_FRAME_OPTIONS,
};
use http::HeaderValue;
use sha2::{Digest, Sha256};

/// The status and lease pages' style sheet.
pub(super) const PAGE_CSS: &str = "body{font-family:sans-serif;margin:2em}\
    table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}\
    figcaption{font-size:.85em;color:#333}figure{margin:0}\
    #plots{display:flex;flex-wrap:wrap;gap:1em}.leader-change-note{color:#c0392b}";

/// The sign-in form's style sheet.
pub(super) const LOGIN_CSS: &str =
    "body{font-family:sans-serif;margin:2em}input{font-size:1em;padding:.3em}";

/// The content security policy of every status-page answer.
static POLICY: LazyLock<HeaderValue> = LazyLock::new(|| {
    let hash = |css: &str| {
        let digest = Sha256::digest(css.as_bytes());
        format!(
            "'sha256-{}'",
            base64::engine::general_purpose::STANDARD.encode(digest)
        )
    };
    let policy = format!(
        "default-src 'none'; style-src {} {}; form-action 'self'; \
         frame-ancestors 'none'; base-uri 'none'",
        hash(PAGE_CSS),
        hash(LOGIN_CSS)
    );
    HeaderValue::from_str(&policy).unwrap_or(HeaderValue::from_static("default-src 'none'"))
});

/// Middleware on every `/ui` route: the headers above on every answer,
/// the page, the form, a redirect or an error alike.
pub(in crate::api) async fn secure(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(CONTENT_SECURITY_POLICY, POLICY.clone());
    headers.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_names_both_style_sheets_and_forbids_framing() {
        let policy = POLICY.to_str().expect("ascii");
        assert!(policy.starts_with("default-src 'none'; style-src 'sha256-"));
        assert_eq!(policy.matches("'sha256-").count(), 2, "{policy}");
        assert!(policy.contains("frame-ancestors 'none'"), "{policy}");
        assert!(policy.contains("form-action 'self'"), "{policy}");
    }
}
