//! Serving with a drain deadline.

use std::future::Future;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;

/// Serves `app` on `listener` until `shutdown` resolves, then drains in-flight
/// requests for at most `drain`.
///
/// # Errors
/// The listener's I/O error.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    drain: Duration,
) -> std::io::Result<()> {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        let mut stopped = stopped;
        let _ = stopped.wait_for(|&s| s).await;
    });
    let mut server = std::pin::pin!(std::future::IntoFuture::into_future(server));
    tokio::select! {
        result = &mut server => return result,
        () = shutdown => {}
    }
    tracing::info!(
        drain_ms = drain.as_millis() as u64,
        "shutting down; draining requests"
    );
    let _ = stop.send(true);
    match tokio::time::timeout(drain, server).await {
        Ok(result) => result,
        Err(_) => {
            tracing::warn!("drain deadline passed; closing remaining connections");
            Ok(())
        }
    }
}
