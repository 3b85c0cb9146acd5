//! The fencing audit's records ([`Refused`], [`Refusals`]) and
//! [`SharedAudit`]: where they are kept when every gateway on one database
//! must show the same audit (the PostgreSQL engine keeps them in a table).
//! Without one, each gateway keeps its own in memory (`observe.rs`).

use std::future::Future;
use std::pin::Pin;

use palisade_store::{LeaseRefusals, PostgresStore, Refusal, StoreError};
use serde::Serialize;

/// One refused write.
#[derive(Debug, Clone, Serialize)]
pub struct Refused {
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
    /// When, in ms since the Unix epoch.
    pub at_unix_ms: u64,
}

/// A lease's refused writes.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Refusals {
    /// Writes refused for a stale token (since the gateway started, or,
    /// shared, since the database's record of the lease was made).
    pub count: u64,
    /// The latest.
    pub last: Option<Refused>,
}

type Answer<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// A fencing audit shared by the gateways of one store.
pub trait SharedAudit: Send + Sync + std::fmt::Debug {
    /// Counts a refused write of `lease` and keeps it as its last.
    fn record<'a>(&'a self, lease: &'a str, refused: &'a Refused) -> Answer<'a, ()>;
    /// `lease`'s refused writes.
    fn refusals<'a>(&'a self, lease: &'a str) -> Answer<'a, Refusals>;
    /// The leases with refused writes, the most recently refused first.
    fn recent(&self, limit: usize) -> Answer<'_, Vec<(String, Refusals)>>;
}

impl SharedAudit for PostgresStore {
    fn record<'a>(&'a self, lease: &'a str, refused: &'a Refused) -> Answer<'a, ()> {
        let refusal = Refusal {
            token: refused.token,
            fence: refused.fence,
            holder: refused.holder.clone(),
            key: refused.key.clone(),
            peer: refused.peer.clone(),
            at_unix_ms: refused.at_unix_ms,
        };
        Box::pin(async move { self.record_refusal(lease, &refusal).await })
    }

    fn refusals<'a>(&'a self, lease: &'a str) -> Answer<'a, Refusals> {
        Box::pin(async move {
            Ok(PostgresStore::refusals(self, lease)
                .await?
                .map(|r| from_store(r).1)
                .unwrap_or_default())
        })
    }

    fn recent(&self, limit: usize) -> Answer<'_, Vec<(String, Refusals)>> {
        Box::pin(async move {
            let recent = self.recent_refusals(limit).await?;
            Ok(recent.into_iter().map(from_store).collect())
        })
    }
}

fn from_store(record: LeaseRefusals) -> (String, Refusals) {
    let last = record.last;
    (
        record.lease,
        Refusals {
            count: record.count,
            last: Some(Refused {
                token: last.token,
                fence: last.fence,
                holder: last.holder,
                key: last.key,
                peer: last.peer,
                at_unix_ms: last.at_unix_ms,
            }),
        },
    )
}
