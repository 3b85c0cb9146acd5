//! The fencing audit, a store capability: per lease, how many writes were
//! refused for a stale token and the last one ([`Refusal`]), kept by a
//! [`FencingAudit`]. [`MemoryAudit`] keeps them in the process (a gateway
//! on sled: its own refusals); [`PostgresStore`](crate::PostgresStore)
//! keeps them in the database every gateway on it shares
//! (`postgres_store/audit.rs`). Both are bounded to [`AUDITED_LEASES`]
//! leases: past it the leases refused longest ago are forgotten.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use palisade_plumbing::sync::lock;
use serde::Serialize;

use crate::error::StoreError;

/// Leases whose refusals an audit keeps.
pub const AUDITED_LEASES: usize = 10_000;

/// One write refused because its token was below the fence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refusal {
    /// The token the write carried.
    pub token: u64,
    /// The fence it was below.
    pub fence: u64,
    /// The JWT's `sub`: who the cluster granted that token to.
    pub holder: String,
    /// The object key (the lease's name for a fence bump).
    pub key: String,
    /// Where the request came from, if known.
    pub peer: Option<String>,
    /// When, in ms since the Unix epoch (the refusing gateway's clock).
    pub at_unix_ms: u64,
}

/// A lease's refused writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRefusals {
    /// The lease.
    pub lease: String,
    /// How many writes were refused since the audit's record of the lease
    /// was made (since the gateway started, in memory).
    pub count: u64,
    /// The latest.
    pub last: Refusal,
}

/// What an audit call answers, later.
pub type AuditAnswer<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Where the fencing audit is kept. Object-safe: the gateway holds one as
/// `Arc<dyn FencingAudit>`, whichever engine keeps it.
pub trait FencingAudit: Send + Sync + std::fmt::Debug {
    /// Counts a refused write of `lease` and keeps it as its last.
    fn record<'a>(&'a self, lease: &'a str, refusal: &'a Refusal) -> AuditAnswer<'a, ()>;
    /// `lease`'s refused writes, if any are kept.
    fn refusals<'a>(&'a self, lease: &'a str) -> AuditAnswer<'a, Option<LeaseRefusals>>;
    /// The leases with refused writes, the most recently refused first (at
    /// most `limit`).
    fn recent(&self, limit: usize) -> AuditAnswer<'_, Vec<LeaseRefusals>>;
}

/// The audit in this process's memory.
#[derive(Debug)]
pub struct MemoryAudit {
    leases: Mutex<HashMap<String, LeaseRefusals>>,
    capacity: usize,
}

impl Default for MemoryAudit {
    fn default() -> Self {
        Self::with_capacity(AUDITED_LEASES)
    }
}

impl MemoryAudit {
    /// An audit that keeps at most `capacity` leases (at least one).
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            leases: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
        }
    }

    fn keep(&self, lease: &str, refusal: &Refusal) {
        let mut leases = lock(&self.leases);
        if !leases.contains_key(lease) && leases.len() >= self.capacity {
            let oldest = leases
                .values()
                .min_by_key(|r| r.last.at_unix_ms)
                .map(|r| r.lease.clone());
            if let Some(oldest) = oldest {
                leases.remove(&oldest);
            }
        }
        leases
            .entry(lease.to_owned())
            .and_modify(|r| {
                r.count += 1;
                r.last = refusal.clone();
            })
            .or_insert_with(|| LeaseRefusals {
                lease: lease.to_owned(),
                count: 1,
                last: refusal.clone(),
            });
    }
}

impl FencingAudit for MemoryAudit {
    fn record<'a>(&'a self, lease: &'a str, refusal: &'a Refusal) -> AuditAnswer<'a, ()> {
        self.keep(lease, refusal);
        Box::pin(std::future::ready(Ok(())))
    }

    fn refusals<'a>(&'a self, lease: &'a str) -> AuditAnswer<'a, Option<LeaseRefusals>> {
        let found = lock(&self.leases).get(lease).cloned();
        Box::pin(std::future::ready(Ok(found)))
    }

    fn recent(&self, limit: usize) -> AuditAnswer<'_, Vec<LeaseRefusals>> {
        let mut all: Vec<LeaseRefusals> = lock(&self.leases).values().cloned().collect();
        all.sort_by_key(|r| std::cmp::Reverse(r.last.at_unix_ms));
        all.truncate(limit);
        Box::pin(std::future::ready(Ok(all)))
    }
}
