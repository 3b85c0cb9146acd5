//! One accepted connection: the TLS handshake (with a timeout), the
//! connection's facts as request extensions, HTTP/1.1 or HTTP/2, and the
//! server-wide cap on requests in flight.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::Watcher;
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use crate::config::ServeConfig;
use crate::idle::{idle, Activity, Liveness};
use crate::logged_once::LoggedOnce;

/// The client certificate a TLS connection verified (leaf, DER), as a
/// request extension. Absent on plain connections and when none was asked.
#[derive(Debug, Clone)]
pub struct PeerCertificate(pub Arc<CertificateDer<'static>>);

/// What every connection of one server is served with; cloned into each
/// connection's task.
#[derive(Clone)]
pub(crate) struct Connections {
    /// The app and the server-wide cap on requests in flight.
    served: Served,
    /// HTTP/1.1 and HTTP/2 settings (header timeout, stream cap, pings).
    builder: auto::Builder<TokioExecutor>,
    /// TLS, when the server has it.
    acceptor: Option<TlsAcceptor>,
    /// Remote addresses already logged for a refusal.
    pub(crate) refused: Arc<LoggedOnce>,
    /// The server's name, for log lines.
    name: &'static str,
    /// Time to finish the TLS handshake.
    handshake_timeout: Duration,
    /// A connection quiet this long with no request in flight is closed.
    idle_timeout: Duration,
}

impl Connections {
    /// The settings `config` asks for, around `app`.
    pub(crate) fn new(app: Router, config: &ServeConfig) -> Self {
        Self {
            served: Served {
                app,
                in_flight: Arc::new(Semaphore::new(config.max_requests)),
            },
            builder: http_builder(config),
            acceptor: config.tls.clone().map(TlsAcceptor::from),
            refused: Arc::new(LoggedOnce::default()),
            name: config.name,
            handshake_timeout: config.handshake_timeout,
            idle_timeout: config.idle_timeout,
        }
    }

    /// Serves `stream` until it closes or the drain ends it: first the TLS
    /// handshake, if the server has TLS (a refusal logged once per address,
    /// a slow handshake dropped).
    /// A connection `evicted` (a newcomer needed its place at a cap:
    /// `server.rs`'s `Table`) is closed at once.
    pub(crate) async fn serve(
        self,
        stream: TcpStream,
        remote: SocketAddr,
        watcher: Watcher,
        liveness: Arc<Liveness>,
        evicted: Arc<tokio::sync::Notify>,
    ) {
        let stream = Activity {
            io: stream,
            liveness: liveness.clone(),
        };
        let idle = idle(liveness.clone(), self.idle_timeout);
        let quiet = async move {
            tokio::select! {
                () = idle => {}
                () = evicted.notified() => {}
            }
        };
        let connection = Connection {
            builder: self.builder,
            served: self.served,
            remote,
            liveness,
            watcher,
        };
        let Some(acceptor) = self.acceptor else {
            tokio::select! {
                () = connection.serve(stream, None) => {}
                () = quiet => {}
            }
            return;
        };
        let mut quiet = std::pin::pin!(quiet);
        let handshake = tokio::time::timeout(self.handshake_timeout, acceptor.accept(stream));
        let handshake = tokio::select! {
            done = handshake => done,
            () = &mut quiet => return,
        };
        let tls = match handshake {
            Ok(Ok(tls)) => tls,
            Ok(Err(err)) => {
                if self.refused.first_time(remote.ip()) {
                    tracing::warn!(server = self.name, %remote, %err, "TLS handshake refused (logged once per address)");
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
        tokio::select! {
            () = connection.serve(tls, certificate) => {}
            () = quiet => {}
        }
    }
}

/// HTTP/1.1 with the header timeout, HTTP/2 with the stream cap and pings.
fn http_builder(config: &ServeConfig) -> auto::Builder<TokioExecutor> {
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
    builder
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

/// One connection's serving parts.
struct Connection {
    builder: auto::Builder<TokioExecutor>,
    served: Served,
    remote: SocketAddr,
    /// Its requests in flight, for the idle watchdog.
    liveness: Arc<Liveness>,
    watcher: Watcher,
}

impl Connection {
    /// Serves the connection with `served`'s app, the connection's facts as
    /// request extensions, until it closes or the drain ends it.
    async fn serve<I>(self, io: I, certificate: Option<PeerCertificate>)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (served, remote, liveness) = (self.served, self.remote, self.liveness);
        let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            request.extensions_mut().insert(ConnectInfo(remote));
            if let Some(certificate) = &certificate {
                request.extensions_mut().insert(certificate.clone());
            }
            let permit = served.in_flight.clone().try_acquire_owned();
            let app = served.app.clone();
            let in_flight = liveness.request();
            async move {
                let _in_flight = in_flight;
                let Ok(_permit) = permit else {
                    return Ok(overloaded());
                };
                app.oneshot(request.map(axum::body::Body::new)).await
            }
        });
        let connection = self
            .builder
            .serve_connection_with_upgrades(TokioIo::new(io), service);
        let _ = self.watcher.watch(connection.into_owned()).await;
    }
}
