//! [`free_ports`]: ports for a cluster whose peers must know every port
//! before any node starts.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::Error;

/// Where ports are picked: below the kernel's ephemeral range (32768 and
/// up by default), so no outgoing connection is given one of them between
/// its release here and the node's bind (a node then exited at start,
/// `EADDRINUSE`: a CI flake). Above the fixed ports `palisade dev` uses.
const RANGE: std::ops::Range<u32> = 20_000..30_000;

/// How far apart the ports handed out are: `palisade dev` and the tests
/// that start it take a given port and the next few (three election
/// nodes, two gateways), which must not be ports handed out to another
/// node. Consecutive ports collided: dev's second election node bound the
/// gateway port it had been given.
const STRIDE: u32 = 8;

/// `n` distinct free loopback ports: bound together, then released, since a
/// cluster's peers must know every port before any node starts. Taken in
/// turn from [`RANGE`], [`STRIDE`] apart (each port's next `STRIDE - 1` are
/// never handed out by this process), starting at a place of this
/// process's own, so parallel tests (and test binaries) rarely try the
/// same one.
///
/// # Errors
/// [`Error::Ports`] if the range has not `n` free ports.
pub fn free_ports(n: usize) -> Result<Vec<u16>, Error> {
    static CURSOR: AtomicU32 = AtomicU32::new(u32::MAX);
    let slots = (RANGE.end - RANGE.start) / STRIDE;
    let _ = CURSOR.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7919) % slots,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    let mut listeners = Vec::with_capacity(n);
    for _ in 0..slots {
        if listeners.len() == n {
            break;
        }
        let offset = CURSOR.fetch_add(1, Ordering::SeqCst) % slots * STRIDE;
        let Ok(port) = u16::try_from(RANGE.start + offset) else {
            continue;
        };
        if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            listeners.push(listener);
        }
    }
    if listeners.len() < n {
        return Err(Error::Ports(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!("fewer than {n} free ports in {RANGE:?}"),
        )));
    }
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<_, _>>()
        .map_err(Error::Ports)
}
