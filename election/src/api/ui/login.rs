//! Signing in to the status page from a browser, under a policy: `GET
//! /ui/login` is a form, `POST /ui/login` checks the API key it posts and
//! opens a session (`sessions.rs`), answering with a cookie that holds the
//! session's id alone (`cookie.rs`: `HttpOnly`, `SameSite=Strict`,
//! `Path=/ui`, `Secure` under client TLS); `POST /ui/logout` ends the
//! session on this node and clears the cookie.
//!
//! The key travels in a POST body only: never in a URL (so never in a
//! history, a referrer or an access log), never in a cookie, and nothing
//! here logs or keeps it. A POST whose `Origin` is not one of this node's
//! (`origin.rs`) is refused with 403. Both POSTs take a seat of the
//! caller's address's share (admission), like every other call.

use axum::extract::rejection::FormRejection;
use std::sync::Arc;

use axum::extract::{Form, State};
use axum::http::header::{CONTENT_TYPE, LOCATION, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::Deserialize;

use palisade_serve::policy::{Policy, Principal, Right};

use super::headers::LOGIN_CSS;
use super::origin::from_own_page;
use super::status::StatusPage;
use super::{cookie, escape, query_escape};
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

/// `POST /ui/login`: 303 to the status page with a session cookie for a
/// key the policy knows; 401 with the form and the reason otherwise
/// (nothing set).
#[utoipa::path(post, path = "/ui/login", tag = "health",
    request_body(content = Login, content_type = "application/x-www-form-urlencoded"),
    responses((status = 303, description = "Signed in (a session cookie for /ui), or no policy: to /ui"),
        (status = 400, body = String, content_type = "text/html", description = "No key in the form: the form again"),
        (status = 401, body = String, content_type = "text/html", description = "Unknown key: the form again, no cookie"),
        (status = 403, body = String, content_type = "text/html", description = "No Origin, or not this node's (--public-url): nothing set"),
        (status = 429, body = crate::error::ErrorBody, description = "Over the caller's share of this node's seats")))]
pub(in crate::api) async fn login(
    State(state): State<ApiState>,
    Extension(status): Extension<Arc<StatusPage>>,
    request: HeaderMap,
    form: Result<Form<Login>, FormRejection>,
) -> Response {
    if let Err(reason) = from_own_page(&state.config, &request) {
        return page(StatusCode::FORBIDDEN, Some(reason));
    }
    let Ok(Form(Login { key })) = form else {
        return page(StatusCode::BAD_REQUEST, Some("the form needs a key"));
    };
    let Some(policy) = &state.config.policy else {
        // Nothing to sign in to: the page is open.
        return redirect("/ui".to_owned(), None);
    };
    let policy = policy.current();
    let Some((principal, digest)) = policy.authenticate_key(key.trim()) else {
        return page(StatusCode::UNAUTHORIZED, Some("unknown API key"));
    };
    let name = cookie::name(state.config.id);
    if let Some(old) = cookie::find(&request, &name) {
        // A fresh id at every sign-in; the one the browser had ends.
        status.sessions.close(&old);
    }
    let landing = landing(&policy, &principal);
    let id = status.sessions.open(principal, digest);
    let max_age = status.sessions.lifetime().as_secs();
    let set = cookie::set(&name, &id, max_age, state.config.client_tls.is_some());
    redirect(landing, Some(set))
}

/// Where a signed-in principal lands: the whole status page if it may read
/// every lease, else the page of its first `read` prefix (the whole page
/// would be 403).
fn landing(policy: &Policy, principal: &Principal) -> String {
    if policy.allow_prefix(principal, Right::Read, "").is_ok() {
        return "/ui".to_owned();
    }
    policy.prefixes(principal, Right::Read).first().map_or_else(
        || "/ui".to_owned(),
        |p| format!("/ui?prefix={}", query_escape(p)),
    )
}

/// `POST /ui/logout`: ends the session on this node, clears the cookie,
/// back to the form.
#[utoipa::path(post, path = "/ui/logout", tag = "health",
    responses((status = 303, description = "The session ended and its cookie cleared; to /ui/login"),
        (status = 403, body = String, content_type = "text/html", description = "No Origin, or not this node's: nothing ended"),
        (status = 429, body = crate::error::ErrorBody, description = "Over the caller's share of this node's seats")))]
pub(in crate::api) async fn logout(
    State(state): State<ApiState>,
    Extension(status): Extension<Arc<StatusPage>>,
    request: HeaderMap,
) -> Response {
    if let Err(reason) = from_own_page(&state.config, &request) {
        return page(StatusCode::FORBIDDEN, Some(reason));
    }
    let name = cookie::name(state.config.id);
    if let Some(id) = cookie::find(&request, &name) {
        status.sessions.close(&id);
    }
    let cleared = cookie::set(&name, "", 0, state.config.client_tls.is_some());
    redirect("/ui/login".to_owned(), Some(cleared))
}

/// 303 See Other to `to`, setting `cookie` if given.
fn redirect(to: String, cookie: Option<String>) -> Response {
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
         <style>{LOGIN_CSS}</style></head><body><h1>Palisade status page</h1>{problem}\
         <form id=\"login\" method=\"post\" action=\"/ui/login\">\
         <label>API key <input type=\"password\" name=\"key\" autocomplete=\"current-password\" \
         required autofocus></label> <button type=\"submit\">Sign in</button></form>\
         <p>The key needs the <code>read</code> right on the leases to show. It opens a \
         session on this node; the browser keeps only the session's id, which no API call \
         accepts.</p></body></html>"
    );
    (status, [(CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response()
}
