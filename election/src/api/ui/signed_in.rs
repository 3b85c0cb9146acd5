//! Middleware on the status pages (`/ui`, `/ui/leases/{name}`): a valid
//! session cookie (`cookie.rs`, `sessions.rs`) stands for its principal,
//! and a browser refused for want of one is sent to the sign-in form.
//!
//! The cookie is read here alone: no other route has this middleware, and
//! `authorize.rs` reads the [`SessionPrincipal`] it leaves only when the
//! request sends no API key. So a session id opens the read-only status
//! pages and nothing else; it is never taken for a key.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use http::HeaderValue;

use super::cookie;
use super::sessions::SessionPrincipal;
use super::status::StatusPage;
use crate::api::state::ApiState;

/// See the module documentation.
pub(in crate::api) async fn session_from_cookie(
    State(state): State<ApiState>,
    Extension(status): Extension<Arc<StatusPage>>,
    mut request: Request,
    next: Next,
) -> Response {
    let wants_html = request
        .headers()
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/html"));
    let legacy = cookie::find(request.headers(), cookie::LEGACY_KEY_COOKIE).is_some();
    let id = cookie::find(request.headers(), &cookie::name(state.config.id));
    if let (Some(policy), Some(id)) = (&state.config.policy, id) {
        if let Some(principal) = status.sessions.check(&id, &policy.current()) {
            request.extensions_mut().insert(SessionPrincipal(principal));
        }
    }
    let mut response = next.run(request).await;
    if wants_html && response.status() == http::StatusCode::UNAUTHORIZED {
        response = (
            http::StatusCode::SEE_OTHER,
            [(http::header::LOCATION, "/ui/login")],
        )
            .into_response();
    }
    if legacy {
        // An earlier version kept the API key in this cookie: erase it.
        let clear = cookie::set(cookie::LEGACY_KEY_COOKIE, "", 0, false);
        if let Ok(value) = HeaderValue::from_str(&clear) {
            response
                .headers_mut()
                .append(http::header::SET_COOKIE, value);
        }
    }
    response
}
