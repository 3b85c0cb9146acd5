//! Signing in to the status page from a browser, under a policy: `GET
//! /ui/login` is a form, `POST /ui/login` checks the API key it posts and
//! answers with a `palisade_key` cookie (`HttpOnly`: no script reads it;
//! `SameSite=Strict`: no other site's page sends it; `Secure` under client
//! TLS; `Path=/ui`: only the read-only status page honours it, see
//! [`super::key_from_cookie`]), and `POST /ui/logout` clears it.
//!
//! The key travels in a POST body only: never in a URL (so never in a
//! history, a referrer or an access log), and nothing here logs it.

use axum::extract::rejection::FormRejection;
use axum::extract::{Form, State};
use axum::http::header::{CONTENT_TYPE, LOCATION, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
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
        (status = 401, body = String, content_type = "text/html", description = "Unknown key: the form again, no cookie")))]
pub(in crate::api) async fn login(
    State(state): State<ApiState>,
    form: Result<Form<Login>, FormRejection>,
) -> Response {
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
    responses((status = 303, description = "The cookie cleared; to /ui/login")))]
pub(in crate::api) async fn logout(State(state): State<ApiState>) -> Response {
    let cookie = format!("{COOKIE}=; Max-Age=0; {}", attributes(&state));
    redirect("/ui/login", Some(cookie))
}

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
