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
use tokio::sync::Notify;

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
    let table = Arc::new(Table::default());
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
        let liveness = Liveness::new();
        let limits = (config.max_connections, config.max_connections_per_address);
        // An IPv4 client of a dual-stack listener arrives as ::ffff:a.b.c.d:
        // counted as the IPv4 address it is (else every one shares ::/64).
        let permit = match table.take(remote.ip().to_canonical(), limits, &liveness) {
            Ok(permit) => permit,
            Err(full) => {
                if connections.refused.first_time(remote.ip()) {
                    tracing::warn!(server = config.name, %remote, cap = full.cap, limit = full.limit, "connection limit reached; closing this address's new connections");
                }
                drop(stream);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let connection = connections.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let evicted = permit.evicted.clone();
            let _permit = permit;
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

/// Every open connection, by remote address, oldest first; and the cap's
/// choice of which gives way to a newcomer.
///
/// At the per-address cap, an address's oldest connection that never sent a
/// request gives way to its newer one (its silent connections never lock
/// its own clients out), else the newcomer is closed. At the server's cap,
/// the heaviest holder gives way: the address whose network (its /24 for
/// IPv4, /64 for IPv6) holds the most connections, and within it the
/// address holding the most, of those that hold a connection that may give
/// way: its oldest silent one first, then its oldest idle one (no request in
/// flight). A connection with a request in flight (a renewal, a peer's
/// append, a watch) never gives way to a newcomer. A newcomer whose own
/// address is the heaviest may displace only its own silent connections. So a few addresses that fill the server with idle
/// keep-alive connections cannot lock a new address out: each new address
/// displaces one of theirs.
#[derive(Debug, Default)]
struct Table(std::sync::Mutex<Held>);

/// What [`Table`] guards.
#[derive(Debug, Default)]
struct Held {
    by_address: HashMap<IpAddr, BTreeMap<u64, Open>>,
    total: usize,
}

/// One open connection, as [`Table`] keeps it.
#[derive(Debug)]
struct Open {
    liveness: Arc<Liveness>,
    evicted: Arc<Notify>,
}

/// Why a newcomer was closed: the cap it met.
#[derive(Debug)]
struct Full {
    cap: &'static str,
    limit: usize,
}

/// One connection's place in the [`Table`]; given back on drop.
#[derive(Debug)]
struct AddressPermit {
    table: Arc<Table>,
    address: IpAddr,
    number: u64,
    /// Notified when a newcomer takes its place.
    evicted: Arc<Notify>,
}

/// Numbers connections in accept order (oldest lowest).
static ACCEPTED: AtomicU64 = AtomicU64::new(0);

/// The network an address is counted in at the server's cap: its /24
/// (IPv4) or /64 (IPv6).
fn network(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V4(v4) => IpAddr::V4(std::net::Ipv4Addr::from(u32::from(v4) & 0xffff_ff00)),
        IpAddr::V6(v6) => IpAddr::V6(std::net::Ipv6Addr::from(
            u128::from(v6) & !((1u128 << 64) - 1),
        )),
    }
}

/// How a connection ranks for giving way: silent first, then idle, then
/// busy; older before newer within each.
fn giving_way(open: &Open) -> u8 {
    if !open.liveness.has_requested() {
        0
    } else if open.liveness.in_flight() == 0 {
        1
    } else {
        2
    }
}

impl Held {
    /// The oldest connection of `address` of rank at most `worst`
    /// ([`giving_way`]), lowest rank first.
    fn victim(&self, address: IpAddr, worst: u8) -> Option<(IpAddr, u64)> {
        let open = self.by_address.get(&address)?;
        (0..=worst).find_map(|rank| {
            open.iter()
                .find(|(_, o)| giving_way(o) == rank)
                .map(|(number, _)| (address, *number))
        })
    }

    /// Who gives way to a newcomer from `newcomer` at the server's cap.
    fn heaviest_victim(&self, newcomer: IpAddr) -> Option<(IpAddr, u64)> {
        let mut per_network: HashMap<IpAddr, usize> = HashMap::new();
        for (address, open) in &self.by_address {
            *per_network.entry(network(*address)).or_default() += open.len();
        }
        let weight = |address: IpAddr| {
            let own = self.by_address.get(&address).map_or(0, BTreeMap::len);
            (
                per_network.get(&network(address)).copied().unwrap_or(0),
                own,
            )
        };
        let heaviest = self
            .by_address
            .keys()
            .copied()
            .filter(|a| *a != newcomer && weight(*a) > weight(newcomer))
            .filter_map(|a| Some((weight(a), self.victim(a, 1)?)))
            .max_by_key(|(weight, _)| *weight);
        match heaviest {
            Some((_, victim)) => Some(victim),
            None => self.victim(newcomer, 0),
        }
    }

    fn evict(&mut self, (address, number): (IpAddr, u64)) {
        if let Some(open) = self.remove(address, number) {
            open.evicted.notify_one();
        }
    }

    fn remove(&mut self, address: IpAddr, number: u64) -> Option<Open> {
        let open = self.by_address.get_mut(&address)?;
        let gone = open.remove(&number)?;
        if open.is_empty() {
            self.by_address.remove(&address);
        }
        self.total -= 1;
        Some(gone)
    }
}

impl Table {
    /// A place for one more connection from `address` (whose requests
    /// `liveness` sees), under `(server cap, per-address cap)`, taken from
    /// the connection that gives way if a cap is met.
    fn take(
        self: &Arc<Self>,
        address: IpAddr,
        (cap, per_address): (usize, usize),
        liveness: &Arc<Liveness>,
    ) -> Result<AddressPermit, Full> {
        let mut held = palisade_plumbing::sync::lock(&self.0);
        let own = held.by_address.get(&address).map_or(0, BTreeMap::len);
        if own >= per_address {
            let victim = held.victim(address, 0).ok_or(Full {
                cap: "per address",
                limit: per_address,
            })?;
            held.evict(victim);
        } else if held.total >= cap {
            let victim = held.heaviest_victim(address).ok_or(Full {
                cap: "server",
                limit: cap,
            })?;
            held.evict(victim);
        }
        let number = ACCEPTED.fetch_add(1, Ordering::Relaxed);
        let evicted = Arc::new(Notify::new());
        held.by_address.entry(address).or_default().insert(
            number,
            Open {
                liveness: liveness.clone(),
                evicted: evicted.clone(),
            },
        );
        held.total += 1;
        Ok(AddressPermit {
            table: self.clone(),
            address,
            number,
            evicted,
        })
    }
}

impl Drop for AddressPermit {
    fn drop(&mut self) {
        palisade_plumbing::sync::lock(&self.table.0).remove(self.address, self.number);
    }
}
