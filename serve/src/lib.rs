//! The HTTP server loop every Palisade server runs ([`serve`]).
//!
//! axum's own `serve` has no TLS, no connection cap and no header timeout;
//! this loop adds them around the same `Router`:
//! - optional TLS ([`tls`]), with or without client certificates; a
//!   verified client certificate reaches handlers as a [`PeerCertificate`]
//!   request extension, the remote address as axum's `ConnectInfo`;
//! - at most `max_connections` at once: one more is closed at once (the
//!   client retries elsewhere) instead of exhausting file descriptors;
//! - HTTP/1.1 and HTTP/2 (h2c by prior knowledge, h2 by ALPN over TLS) on
//!   the same port; an HTTP/2 connection carries at most
//!   `max_streams_per_connection` requests at once, and the server at most
//!   `max_requests` across all connections: one more is a fast 503
//!   `overloaded` (so HTTP/2's multiplexing cannot raise what one node
//!   buffers above what `max_connections` HTTP/1.1 connections could);
//! - a slow client gets `header_timeout` to send its headers and
//!   `handshake_timeout` to finish TLS, then is dropped;
//! - on shutdown, no new connection is accepted and open ones get `drain` to
//!   finish their requests.
//!
//! Handshake failures are logged once per remote address (not per attempt),
//! so a scanner cannot flood the log.

pub mod certs;
pub mod checked_in;
pub mod policy;
pub mod tls;

pub use rustls;

use std::collections::HashSet;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

/// How a server runs. [`ServeConfig::new`] gives the documented defaults.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// What the server is, for log lines ("client API", "peer RPC", ...).
    pub name: &'static str,
    /// TLS, when set; plain HTTP otherwise.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Connections served at once; more are closed on accept. Default 4096.
    pub max_connections: usize,
    /// Requests served at once over all connections; more get a 503.
    /// Default 4096.
    pub max_requests: usize,
    /// Requests one HTTP/2 connection may have open at once. Default 256.
    pub max_streams_per_connection: u32,
    /// Time to finish the TLS handshake. Default 5 s.
    pub handshake_timeout: Duration,
    /// Time to send a request's headers (HTTP/1). Default 10 s.
    pub header_timeout: Duration,
    /// Time open connections get after shutdown starts. Default 5 s.
    pub drain: Duration,
}

impl ServeConfig {
    /// Plain HTTP with the default limits.
    pub fn new(name: &'static str) -> Self {
        Self {
            name,
            tls: None,
            max_connections: 4096,
            max_requests: 4096,
            max_streams_per_connection: 256,
            handshake_timeout: Duration::from_secs(5),
            header_timeout: Duration::from_secs(10),
            drain: Duration::from_secs(5),
        }
    }

    /// The same, over TLS.
    #[must_use]
    pub fn with_tls(mut self, tls: Arc<rustls::ServerConfig>) -> Self {
        self.tls = Some(tls);
        self
    }
}

/// The client certificate a TLS connection verified (leaf, DER), as a
/// request extension. Absent on plain connections and when none was asked.
#[derive(Debug, Clone)]
pub struct PeerCertificate(pub Arc<CertificateDer<'static>>);

/// Remembers which remote addresses were already logged for a refusal, so
/// each is logged once. Bounded: forgets everything past `LIMIT` entries.
#[derive(Debug, Default)]
struct LoggedOnce(Mutex<HashSet<IpAddr>>);

impl LoggedOnce {
    const LIMIT: usize = 4096;

    fn first_time(&self, ip: IpAddr) -> bool {
        let mut seen = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.len() >= Self::LIMIT {
            seen.clear();
        }
        seen.insert(ip)
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then drains open
/// connections for at most `config.drain`.
///
/// # Errors
/// None today: accept errors (a full fd table) are logged and retried.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    config: ServeConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let acceptor = config.tls.clone().map(TlsAcceptor::from);
    let permits = Arc::new(Semaphore::new(config.max_connections));
    let graceful = GracefulShutdown::new();
    let refused = Arc::new(LoggedOnce::default());
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(config.header_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(config.max_streams_per_connection)
        .max_header_list_size(64 * 1024)
        // A peer that vanished without closing is found and its permit freed.
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    let in_flight = Arc::new(Semaphore::new(config.max_requests));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(server = config.name, %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            if refused.first_time(remote.ip()) {
                tracing::warn!(server = config.name, %remote, limit = config.max_connections, "connection limit reached; closing new connections");
            }
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (app, builder, acceptor, refused) = (
            Served {
                app: app.clone(),
                in_flight: in_flight.clone(),
            },
            builder.clone(),
            acceptor.clone(),
            refused.clone(),
        );
        let watcher = graceful.watcher();
        let (name, handshake_timeout) = (config.name, config.handshake_timeout);
        tokio::spawn(async move {
            let _permit = permit;
            let Some(acceptor) = acceptor else {
                serve_connection(builder, stream, app, remote, None, watcher).await;
                return;
            };
            let tls = match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(err)) => {
                    if refused.first_time(remote.ip()) {
                        tracing::warn!(server = name, %remote, %err, "TLS handshake refused (logged once per address)");
                    }
                    return;
                }
                Err(_) => return,
            };
            let certificate = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(|leaf| PeerCertificate(Arc::new(leaf.clone().into_owned())));
            serve_connection(builder, tls, app, remote, certificate, watcher).await;
        });
    }
    drop(listener);
    tracing::info!(
        server = config.name,
        drain_ms = config.drain.as_millis() as u64,
        "shutting down; draining connections"
    );
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(config.drain) => {
            tracing::warn!(server = config.name, "drain deadline passed; closing remaining connections");
        }
    }
    Ok(())
}

/// The app and the server-wide cap on requests in flight.
#[derive(Clone)]
struct Served {
    app: Router,
    in_flight: Arc<Semaphore>,
}

/// 503 `overloaded`: the server serves `max_requests` already.
fn overloaded() -> axum::response::Response {
    let body =
        r#"{"error":"overloaded","message":"this server serves its most requests at once; retry"}"#;
    let mut response = axum::response::Response::new(axum::body::Body::from(body));
    *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    headers.insert(
        http::header::RETRY_AFTER,
        http::HeaderValue::from_static("1"),
    );
    response
}

/// Serves one connection with `served`'s app, the connection's facts as
/// request extensions, until it closes or the drain ends it.
async fn serve_connection<I>(
    builder: auto::Builder<TokioExecutor>,
    io: I,
    served: Served,
    remote: SocketAddr,
    certificate: Option<PeerCertificate>,
    watcher: Watcher,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        request.extensions_mut().insert(ConnectInfo(remote));
        if let Some(certificate) = &certificate {
            request.extensions_mut().insert(certificate.clone());
        }
        let permit = served.in_flight.clone().try_acquire_owned();
        let app = served.app.clone();
        async move {
            let Ok(_permit) = permit else {
                return Ok(overloaded());
            };
            app.oneshot(request.map(axum::body::Body::new)).await
        }
    });
    let connection = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    let _ = watcher.watch(connection.into_owned()).await;
}
