//! Signing in to the status page from a browser, under a policy: `GET
//! /ui/login` is a form, `POST /ui/login` checks the API key it posts and
//! answers with a `palisade_key` cookie (`HttpOnly`: no script reads it;
//! `SameSite=Strict`: no other site's page sends it; `Secure` under client
//! TLS; `Path=/ui`: only the read-only status page honours it, see
//! [`super::key_from_cookie`]), and `POST /ui/logout` clears it.
//!
//! The key travels in a POST body only: never in a URL (so never in a
//! history, a referrer or an access log), and nothing here logs it. A POST
//! that a browser sends from another site's page (its `Origin` names
//! another host than `Host`) is refused with 403: no page elsewhere can
//! sign a visitor in under the attacker's key (login CSRF) or out. Both
//! POSTs take a seat of the caller's address's share (admission), like
//! every other call.

use axum::extract::rejection::FormRejection;
use axum::extract::{Form, State};
use axum::http::header::{CONTENT_TYPE, LOCATION, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::{escape, COOKIE};
use crate::api::state::ApiState;

/// `POST /ui/login`'s form.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub(in crate::api) struct Login {
    /// The API key.
    key: String,
}

/// `GET /ui/login`: the sign-in form.
#[utoipa::path(get, path = "/ui/login", tag = "health",
    responses((status = 200, body = String, content_type = "text/html", description = "The sign-in form")))]
pub(in crate::api) async fn form() -> Response {
    page(StatusCode::OK, None)
}

/// `POST /ui/login`: 303 to `/ui` with the cookie for a key the policy
/// knows; 401 with the form and the reason otherwise (nothing set).
#[utoipa::path(post, path = "/ui/login", tag = "health",
    request_body(content = Login, content_type = "application/x-www-form-urlencoded"),
    responses((status = 303, description = "Signed in (a cookie for /ui), or no policy: to /ui"),
        (status = 400, body = String, content_type = "text/html", description = "No key in the form: the form again"),
        (status = 401, body = String, content_type = "text/html", description = "Unknown key: the form again, no cookie"),
        (status = 403, body = String, content_type = "text/html", description = "Posted from another site's page (Origin is not this host): nothing set"),
        (status = 429, body = crate::api::schema::ErrorBody, description = "Over the caller's share of this node's seats")))]
pub(in crate::api) async fn login(
    State(state): State<ApiState>,
    uri: Uri,
    request: HeaderMap,
    form: Result<Form<Login>, FormRejection>,
) -> Response {
    if !same_origin(&uri, &request) {
        return page(StatusCode::FORBIDDEN, Some(CROSS_SITE));
    }
    let Ok(Form(Login { key })) = form else {
        return page(StatusCode::BAD_REQUEST, Some("the form needs a key"));
    };
    let Some(policy) = &state.config.policy else {
        // Nothing to sign in to: the page is open.
        return redirect("/ui", None);
    };
    let mut headers = HeaderMap::new();
    let Ok(value) = HeaderValue::from_str(key.trim()) else {
        return page(StatusCode::UNAUTHORIZED, Some("unknown API key"));
    };
    headers.insert(palisade_serve::policy::KEY_HEADER, value.clone());
    match policy.current().authenticate(&headers) {
        Ok(_) => {
            let cookie = format!("{COOKIE}={}; {}", key.trim(), attributes(&state));
            redirect("/ui", Some(cookie))
        }
        Err(_) => page(StatusCode::UNAUTHORIZED, Some("unknown API key")),
    }
}

/// `POST /ui/logout`: clears the cookie, back to the form.
#[utoipa::path(post, path = "/ui/logout", tag = "health",
    responses((status = 303, description = "The cookie cleared; to /ui/login"),
        (status = 403, body = String, content_type = "text/html", description = "Posted from another site's page: nothing cleared"),
        (status = 429, body = crate::api::schema::ErrorBody, description = "Over the caller's share of this node's seats")))]
pub(in crate::api) async fn logout(
    State(state): State<ApiState>,
    uri: Uri,
    request: HeaderMap,
) -> Response {
    if !same_origin(&uri, &request) {
        return page(StatusCode::FORBIDDEN, Some(CROSS_SITE));
    }
    let cookie = format!("{COOKIE}=; Max-Age=0; {}", attributes(&state));
    redirect("/ui/login", Some(cookie))
}

/// Whether a POST came from this node's own page (else: 403, the form,
/// [`CROSS_SITE`]). The browser's `Origin` says which page sent it, and a
/// page of this node names the host it was loaded from: `Host`, the URI's
/// authority (HTTP/2), or behind a proxy `X-Forwarded-Host` (no page can
/// set that header on a form it posts). No `Origin` (curl, scripts) passes: only a browser
/// carries a visitor's cookies, and browsers send it on every POST.
fn same_origin(uri: &Uri, request: &HeaderMap) -> bool {
    let Some(origin) = request.get(axum::http::header::ORIGIN) else {
        return true;
    };
    let from = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, authority)| authority);
    let header = |name: &str| request.get(name).and_then(|h| h.to_str().ok());
    let ours = [
        header("host"),
        uri.authority().map(|a| a.as_str()),
        header("x-forwarded-host"),
    ];
    from.is_some_and(|from| ours.iter().flatten().any(|h| h.eq_ignore_ascii_case(from)))
}

/// Why a cross-site POST was refused.
const CROSS_SITE: &str = "refused: this form was posted from another site's page";

/// The cookie's attributes: `Secure` when clients speak TLS to this node.
fn attributes(state: &ApiState) -> String {
    let secure = if state.config.client_tls.is_some() {
        "; Secure"
    } else {
        ""
    };
    format!("Path=/ui; HttpOnly; SameSite=Strict{secure}")
}

/// 303 See Other to `to`, setting `cookie` if given.
fn redirect(to: &'static str, cookie: Option<String>) -> Response {
    let mut response = (StatusCode::SEE_OTHER, [(LOCATION, to)]).into_response();
    if let Some(value) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        response.headers_mut().insert(SET_COOKIE, value);
    }
    response
}

/// The form, with `problem` above it.
fn page(status: StatusCode, problem: Option<&str>) -> Response {
    let problem = problem.map_or_else(String::new, |p| {
        format!("<p id=\"problem\" role=\"alert\">{}</p>", escape(p))
    });
    let html = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Palisade: sign in</title>\
         <style>body{{font-family:sans-serif;margin:2em}}input{{font-size:1em;padding:.3em}}</style>\
         </head><body><h1>Palisade status page</h1>{problem}\
         <form id=\"login\" method=\"post\" action=\"/ui/login\">\
         <label>API key <input type=\"password\" name=\"key\" autocomplete=\"current-password\" \
         required autofocus></label> <button type=\"submit\">Sign in</button></form>\
         <p>The key needs the <code>read</code> right on the leases to show; it is kept in a \
         cookie only this page reads.</p></body></html>"
    );
    (status, [(CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response()
}
