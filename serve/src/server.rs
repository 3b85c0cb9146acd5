//! [`serve`]: the accept loop, the connection cap, and the drain.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore};

use crate::config::ServeConfig;
use crate::connection::Connections;
use crate::idle::Liveness;

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
        let liveness = Liveness::new();
        let Some(address_permit) =
            per_address.take(remote.ip(), config.max_connections_per_address, &liveness)
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
            let evicted = address_permit.evicted.clone();
            let _permit = (permit, address_permit);
            connection
                .serve(stream, remote, watcher, liveness, evicted)
                .await;
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

/// Connections open per remote address, oldest first.
#[derive(Debug, Default)]
struct PerAddress(std::sync::Mutex<HashMap<IpAddr, BTreeMap<u64, Held>>>);

/// One open connection of an address, as [`PerAddress`] keeps it.
#[derive(Debug)]
struct Held {
    liveness: Arc<Liveness>,
    evicted: Arc<Notify>,
}

/// One connection of an address; given back on drop.
#[derive(Debug)]
struct AddressPermit {
    counts: Arc<PerAddress>,
    address: IpAddr,
    number: u64,
    /// Notified when a newer connection of the address takes its place.
    evicted: Arc<Notify>,
}

/// Numbers connections in accept order (oldest lowest).
static ACCEPTED: AtomicU64 = AtomicU64::new(0);

impl PerAddress {
    /// A permit for one more connection from `address` (whose requests
    /// `liveness` sees). At `limit`, the address's oldest connection that
    /// has not sent a whole request yet gives way (it is closed), so an
    /// address's silent connections never lock its own real clients out;
    /// when every one has sent a request, `None`.
    fn take(
        self: &Arc<Self>,
        address: IpAddr,
        limit: usize,
        liveness: &Arc<Liveness>,
    ) -> Option<AddressPermit> {
        let mut counts = palisade_plumbing::sync::lock(&self.0);
        let held = counts.entry(address).or_default();
        if held.len() >= limit {
            let silent = held
                .iter()
                .find(|(_, h)| !h.liveness.has_requested())
                .map(|(number, _)| *number)?;
            if let Some(gone) = held.remove(&silent) {
                gone.evicted.notify_one();
            }
        }
        let number = ACCEPTED.fetch_add(1, Ordering::Relaxed);
        let evicted = Arc::new(Notify::new());
        held.insert(
            number,
            Held {
                liveness: liveness.clone(),
                evicted: evicted.clone(),
            },
        );
        Some(AddressPermit {
            counts: self.clone(),
            address,
            number,
            evicted,
        })
    }
}

impl Drop for AddressPermit {
    fn drop(&mut self) {
        let mut counts = palisade_plumbing::sync::lock(&self.counts.0);
        if let Some(held) = counts.get_mut(&self.address) {
            held.remove(&self.number);
            if held.is_empty() {
                counts.remove(&self.address);
            }
        }
    }
}
