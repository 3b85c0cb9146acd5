//! [`serve`]: the accept loop, the connection cap, and the drain.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::config::ServeConfig;
use crate::connection::Connections;

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
    let connections = Connections::new(app, &config);
    let permits = Arc::new(Semaphore::new(config.max_connections));
    let per_address = Arc::new(PerAddress::default());
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let (stream, remote) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(server = config.name, %err, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            if connections.refused.first_time(remote.ip()) {
                tracing::warn!(server = config.name, %remote, limit = config.max_connections, "connection limit reached; closing new connections");
            }
            drop(stream);
            continue;
        };
        let Some(address_permit) =
            per_address.take(remote.ip(), config.max_connections_per_address)
        else {
            if connections.refused.first_time(remote.ip()) {
                tracing::warn!(server = config.name, %remote, limit = config.max_connections_per_address, "connection limit per address reached; closing its new connections");
            }
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let connection = connections.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let _permit = (permit, address_permit);
            connection.serve(stream, remote, watcher).await;
        });
    }
    drop(listener);
    drain(graceful, &config).await;
    Ok(())
}

/// Lets open connections finish for at most `config.drain`.
async fn drain(graceful: GracefulShutdown, config: &ServeConfig) {
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
}

/// Connections open per remote address.
#[derive(Debug, Default)]
struct PerAddress(std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>);

/// One connection of an address; given back on drop.
#[derive(Debug)]
struct AddressPermit {
    counts: Arc<PerAddress>,
    address: std::net::IpAddr,
}

impl PerAddress {
    /// A permit for one more connection from `address`, unless it holds
    /// `limit` already.
    fn take(self: &Arc<Self>, address: std::net::IpAddr, limit: usize) -> Option<AddressPermit> {
        let mut counts = palisade_names::sync::lock(&self.0);
        let count = counts.entry(address).or_default();
        if *count >= limit {
            return None;
        }
        *count += 1;
        Some(AddressPermit {
            counts: self.clone(),
            address,
        })
    }
}

impl Drop for AddressPermit {
    fn drop(&mut self) {
        let mut counts = palisade_names::sync::lock(&self.counts.0);
        if let Some(count) = counts.get_mut(&self.address) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.address);
            }
        }
    }
}
