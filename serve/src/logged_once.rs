//! [`LoggedOnce`]: a refusal is logged once per remote address, so a
//! scanner cannot flood the log.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Mutex;

use palisade_plumbing::sync::lock;

/// Remembers which remote addresses were already logged for a refusal, so
/// each is logged once. Bounded: forgets everything past `LIMIT` entries.
#[derive(Debug, Default)]
pub(crate) struct LoggedOnce(Mutex<HashSet<IpAddr>>);

impl LoggedOnce {
    const LIMIT: usize = 4096;

    /// Whether `ip` is seen for the first time (since the last reset).
    pub(crate) fn first_time(&self, ip: IpAddr) -> bool {
        let mut seen = lock(&self.0);
        if seen.len() >= Self::LIMIT {
            seen.clear();
        }
        seen.insert(ip)
    }
}
