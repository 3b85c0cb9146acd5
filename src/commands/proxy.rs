//! The fencing sidecar: `palisade proxy --lease NAME --listen ADDR`, and the
//! same endpoint inside `palisade run`. A loopback HTTP endpoint forwards
//! object reads and writes under the lease to the gateway, each stamped with
//! the lease's current JWT (the SDK renews it in the background), so a child
//! in any language writes fenced for as long as the lease is held — and is
//! refused (409 `lost`) from the moment the SDK knows it is not.
//!
//! Routes: `GET|PUT|DELETE /v1/objects/{key}`, where `key` is the lease's
//! name or lies under it (`{lease}/...`); anything else is 403. A write's
//! `If-Match` / `If-None-Match: *` goes on to the gateway (412
//! `precondition_failed` when the object is not as required). Answers are
//! the gateway's JSON (a read answers `{"key","value","version","token"}`,
//! `version` and `token` numbers as a write answers them, the value as
//! UTF-8 text or, if it is not, base64 with `"encoding":"base64"`).
//!
//! It listens on loopback only: whoever reaches it writes with the lease.

use crate::output::{complain, say};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use clap::Args;
use palisade_client::{Error, Lease, Precondition};
use serde_json::{json, Value};

use super::endpoints::Endpoints;
use super::hold::HoldArgs;

#[derive(Debug, Args)]
pub struct ProxyArgs {
    #[command(flatten)]
    hold: HoldArgs,
    /// Where to listen: a loopback address (default: a free port on
    /// 127.0.0.1, printed at start).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    #[command(flatten)]
    endpoints: Endpoints,
}

/// `palisade proxy`: holds the lease and serves the sidecar until a signal;
/// exit code 3 if the lease was lost meanwhile (the endpoint answers 409
/// from then on, until the signal).
pub async fn run(args: ProxyArgs) -> anyhow::Result<ExitCode> {
    if !args.listen.ip().is_loopback() {
        complain!(
            "error: --listen must be a loopback address (whoever reaches it writes with the lease)"
        );
        return Ok(ExitCode::from(2));
    }
    if args.endpoints.gateway.is_none() {
        complain!("error: the proxy needs --gateway (or PALISADE_GATEWAY)");
        return Ok(ExitCode::from(2));
    }
    let lease = match args.hold.acquire(&args.endpoints).await? {
        Ok(lease) => Arc::new(lease),
        Err(code) => return Ok(code),
    };
    // Listening before the announcement: a signal right after it still
    // releases the lease.
    let shutdown = crate::shutdown::shutdown_signal();
    let mut shutdown = std::pin::pin!(shutdown);
    let (addr, server) = start(lease.clone(), args.listen).await?;
    say!(
        "proxy listening on http://{addr} for lease {} (token {})",
        lease.name(),
        lease.token()
    );
    let lost = tokio::select! {
        () = lease.lost() => true,
        () = &mut shutdown => false,
    };
    if lost {
        complain!("palisade proxy: lease lost; refusing writes until stopped");
        shutdown.await;
    }
    server.abort();
    // Released now, though open connections may still hold the handle
    // (dropped later, it would be released after the runtime is gone).
    let _ = lease.release_shared().await;
    Ok(ExitCode::from(if lost { crate::exit::LOST } else { 0 }))
}

/// Serves the sidecar for `lease` on `listen` (loopback); the address it
/// got and the server task.
///
/// # Errors
/// `listen` is not loopback, or cannot be bound.
pub async fn start(
    lease: Arc<Lease>,
    listen: SocketAddr,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    anyhow::ensure!(
        listen.ip().is_loopback(),
        "the proxy listens on loopback only, not {listen}"
    );
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let app = Router::new()
        .route("/v1/objects/{*key}", get(read).put(write).delete(remove))
        .with_state(lease);
    let server = tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app).await {
            tracing::error!(%err, "the proxy stopped");
        }
    });
    Ok((addr, server))
}

/// A 403 unless `key` is the lease's name or lies under it.
fn outside_the_lease(lease: &Lease, key: &str) -> Option<Response> {
    let first = key.split('/').next().unwrap_or_default();
    if first == lease.name() {
        None
    } else {
        Some(refusal(
            StatusCode::FORBIDDEN,
            "forbidden",
            &format!("this proxy writes only under the lease {}", lease.name()),
        ))
    }
}

fn refusal(status: StatusCode, code: &str, message: &str) -> Response {
    (status, Json(json!({ "error": code, "message": message }))).into_response()
}

/// The answer for an SDK error: the status the gateway (or the loss) means.
fn failed(err: &Error) -> Response {
    let message = err.to_string();
    match err {
        Error::LeaseLost(_) | Error::Preempted(_) => {
            refusal(StatusCode::CONFLICT, "lost", &message)
        }
        Error::Fenced { .. } => refusal(StatusCode::CONFLICT, "stale_token", &message),
        Error::BadRequest(_) => refusal(StatusCode::BAD_REQUEST, "bad_request", &message),
        Error::Unauthorized(_) => refusal(StatusCode::UNAUTHORIZED, "unauthorized", &message),
        Error::Forbidden(_) => refusal(StatusCode::FORBIDDEN, "forbidden", &message),
        Error::NotFound(_) => refusal(StatusCode::NOT_FOUND, "not_found", &message),
        Error::PreconditionFailed {
            key,
            current_version,
        } => (
            StatusCode::PRECONDITION_FAILED,
            Json(json!({"error": "precondition_failed", "message": message,
                "key": key, "current_version": current_version})),
        )
            .into_response(),
        Error::Protocol { status, .. } => refusal(
            StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_GATEWAY),
            "gateway",
            &message,
        ),
        _ => refusal(StatusCode::SERVICE_UNAVAILABLE, "unavailable", &message),
    }
}

fn answered(result: Result<Value, Error>) -> Response {
    match result {
        Ok(value) => Json(value).into_response(),
        Err(err) => failed(&err),
    }
}

async fn write(
    State(lease): State<Arc<Lease>>,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(refused) = outside_the_lease(&lease, &key) {
        return refused;
    }
    match precondition(&headers) {
        Ok(when) => answered(lease.put_if(&key, body, when).await.map(|w| json!(w))),
        Err(message) => refusal(StatusCode::BAD_REQUEST, "invalid_precondition", message),
    }
}

async fn remove(
    State(lease): State<Arc<Lease>>,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Some(refused) = outside_the_lease(&lease, &key) {
        return refused;
    }
    match precondition(&headers) {
        Ok(when) => answered(lease.delete_if(&key, when).await.map(|d| json!(d))),
        Err(message) => refusal(StatusCode::BAD_REQUEST, "invalid_precondition", message),
    }
}

/// The child's `If-Match` / `If-None-Match`, passed on to the gateway,
/// which judges them (a malformed one is its 400).
fn precondition(headers: &HeaderMap) -> Result<Precondition, &'static str> {
    let text = |name| headers.get(name).map(|v| v.to_str().map(str::trim));
    match (text(header::IF_MATCH), text(header::IF_NONE_MATCH)) {
        (None, None) => Ok(Precondition::Any),
        (Some(Ok("*")), None) => Ok(Precondition::Exists),
        (None, Some(Ok("*"))) => Ok(Precondition::Absent),
        (Some(Ok(tag)), None) => tag
            .trim_matches('"')
            .parse()
            .map(Precondition::Version)
            .map_err(|_| "If-Match takes one version or *"),
        _ => Err("send If-Match (a version or *) or If-None-Match: *, not both"),
    }
}

async fn read(State(lease): State<Arc<Lease>>, Path(key): Path<String>) -> Response {
    if let Some(refused) = outside_the_lease(&lease, &key) {
        return refused;
    }
    match lease.get(&key).await {
        Ok(Some(object)) => {
            // A number, as the gateway's PUT answers it (the ETag is its
            // decimal text).
            let version = object.version.trim_matches('"');
            let version = version
                .parse::<u64>()
                .map_or_else(|_| json!(version), |v| json!(v));
            let mut body = json!({
                "key": key,
                "version": version,
                "token": object.token,
            });
            match std::str::from_utf8(&object.value) {
                Ok(text) => body["value"] = json!(text),
                Err(_) => {
                    use base64::Engine;
                    body["value"] =
                        json!(base64::engine::general_purpose::STANDARD.encode(&object.value));
                    body["encoding"] = json!("base64");
                }
            }
            Json(body).into_response()
        }
        Ok(None) => refusal(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!("no object {key}"),
        ),
        Err(err) => failed(&err),
    }
}
