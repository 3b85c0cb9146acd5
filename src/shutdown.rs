//! [`shutdown_signal`]: what every long-running command stops on.

/// Resolves on SIGINT or SIGTERM, or once stdout is closed (the reader of
/// `palisade lease watch orders | head -1` went away: see `output.rs`).
pub async fn shutdown_signal() {
    tokio::select! {
        () = signal() => {}
        () = crate::output::closed() => tracing::debug!("stdout closed; stopping"),
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => signal,
                Err(err) => {
                    tracing::error!(%err, "cannot listen for SIGTERM");
                    let _ = interrupt.await;
                    return;
                }
            };
        tokio::select! {
            _ = interrupt => tracing::info!("SIGINT received"),
            _ = terminate.recv() => tracing::info!("SIGTERM received"),
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}
