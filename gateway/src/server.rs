//! [`serve`]: the gateway on `palisade_serve`'s connection loop.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;

/// Serves `app` on `listener` (over `tls` when given), at most
/// `max_requests` at once, until `shutdown` resolves, then drains in-flight
/// requests for at most `drain`. The
/// connection loop is `palisade_serve`'s: a connection cap, slow-header and
/// handshake timeouts, refusals logged once.
///
/// # Errors
/// The listener's I/O error.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<Arc<palisade_serve::rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    drain: Duration,
    max_requests: usize,
) -> std::io::Result<()> {
    let mut config = palisade_serve::ServeConfig::new("gateway");
    config.drain = drain;
    config.max_requests = max_requests;
    config.tls = tls;
    palisade_serve::serve(listener, app, config, shutdown).await
}
