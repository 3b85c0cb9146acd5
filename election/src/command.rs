//! What goes through the Raft log, and what applying it answers.
//!
//! Every change to the lease table is a [`Command`] in a log entry;
//! [`crate::lease_table::LeaseTable::apply`] turns it into a [`CommandResult`]
//! deterministically. Commands carry everything apply needs: no clock, no
//! randomness, no node-local state.

use serde::{Deserialize, Serialize};

/// A change proposed to the lease table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Grant `lease` to `holder` if it is free; idempotent for the current holder.
    Acquire {
        /// The lease name (validated before proposing).
        lease: String,
        /// Who asks.
        holder: String,
        /// How long the grant lasts without renewal.
        ttl_ms: u64,
    },
    /// Free `lease` if `holder` holds it with `token`.
    Release {
        /// The lease name.
        lease: String,
        /// Who asks.
        holder: String,
        /// The token of the grant being released.
        token: u64,
        /// The `grant_index` of the handle releasing it, if known: a release
        /// from a handle older than the latest (repeated) acquire frees
        /// nothing.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        grant_index: Option<u64>,
    },
    /// Free `lease` if its current grant is still `token`. Proposed only by the
    /// Raft leader, when its deadline for that grant has passed.
    Expire {
        /// The lease name.
        lease: String,
        /// The grant that expired; a newer grant is left alone.
        token: u64,
    },
    /// Install the cluster's signing key, if it has none yet. Proposed by the
    /// first leader; the key travels in the log so every node can sign.
    InstallKey {
        /// The key id published in the JWKS and in token headers.
        kid: String,
        /// The Ed25519 secret key (32 bytes).
        secret: Vec<u8>,
    },
}

/// What applying a [`Command`] answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandResult {
    /// The lease is held by the requester with this token.
    Granted {
        /// The fencing token of the grant.
        token: u64,
        /// The lease's ttl, as granted.
        ttl_ms: u64,
        /// False when the requester already held the lease (idempotent acquire).
        new_grant: bool,
        /// The index of this acquire (see `LeaseRecord::grant_index`).
        grant_index: u64,
    },
    /// The lease is held by someone else.
    Held {
        /// The current holder.
        holder: String,
        /// Its token.
        token: u64,
    },
    /// The lease was released or expired.
    Freed,
    /// The requester does not hold the lease with that token (any more).
    Lost,
    /// Nothing to answer (blank or membership entries, key installs).
    None,
}

impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Acquire {
                lease,
                holder,
                ttl_ms,
            } => {
                write!(f, "acquire {lease} for {holder} ({ttl_ms} ms)")
            }
            Command::Release {
                lease,
                holder,
                token,
                ..
            } => {
                write!(f, "release {lease} by {holder} (token {token})")
            }
            Command::Expire { lease, token } => write!(f, "expire {lease} (token {token})"),
            // Never print the secret.
            Command::InstallKey { kid, .. } => write!(f, "install signing key {kid}"),
        }
    }
}
