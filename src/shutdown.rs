//! [`shutdown_signal`]: what every long-running command stops on.

use std::future::Future;

/// Resolves on SIGINT or SIGTERM, or once stdout is closed (the reader of
/// `palisade lease watch orders | head -1` went away: see `output.rs`).
///
/// The signal handlers are installed when this is called, not when the
/// future is first polled: a command that says it holds a lease and is
/// stopped at once (`lease acquire --hold`, then SIGTERM) still releases
/// it, where the default action would have killed it first. Call it before
/// announcing anything a signal should undo.
pub fn shutdown_signal() -> impl Future<Output = ()> {
    let signals = Signals::install();
    async move {
        tokio::select! {
            () = signals.recv() => {}
            () = crate::output::closed() => tracing::debug!("stdout closed; stopping"),
        }
    }
}

/// SIGINT and SIGTERM, listened for from the moment they are installed.
struct Signals {
    #[cfg(unix)]
    interrupt: std::io::Result<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    terminate: std::io::Result<tokio::signal::unix::Signal>,
}

impl Signals {
    fn install() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Self {
                interrupt: signal(SignalKind::interrupt()),
                terminate: signal(SignalKind::terminate()),
            }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// Resolves on SIGINT or SIGTERM.
    async fn recv(self) {
        #[cfg(unix)]
        {
            let (mut interrupt, mut terminate) = match (self.interrupt, self.terminate) {
                (Ok(interrupt), Ok(terminate)) => (interrupt, terminate),
                (interrupt, terminate) => {
                    let err = interrupt.err().or(terminate.err());
                    tracing::error!(?err, "cannot listen for SIGINT and SIGTERM; Ctrl-C only");
                    let _ = tokio::signal::ctrl_c().await;
                    return;
                }
            };
            tokio::select! {
                _ = interrupt.recv() => tracing::info!("SIGINT received"),
                _ = terminate.recv() => tracing::info!("SIGTERM received"),
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
