//! What the fencing audit keeps of writes refused for a stale token, in an
//! engine that shares it between gateways ([`PostgresStore`](crate::PostgresStore)).

/// One write refused because its token was below the fence.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// A lease's refused writes, over every gateway sharing the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRefusals {
    /// The lease.
    pub lease: String,
    /// How many writes were refused since the lease's record was made.
    pub count: u64,
    /// The latest.
    pub last: Refusal,
}
