//! One principal's rights: which lease-name prefixes it may acquire, read
//! or administer, and whether it may change the cluster.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What a call needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Right {
    /// Acquire, renew, release; gateway writes.
    Acquire,
    /// Reads, lists, watches; gateway reads.
    Read,
    /// Revoke.
    Admin,
}

impl fmt::Display for Right {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Acquire => "acquire",
            Self::Read => "read",
            Self::Admin => "admin",
        })
    }
}

/// One principal's rights, as written in the policy file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rules {
    /// `sha256:<hex>` digests of the principal's API keys (several, so a key
    /// can be rotated without downtime). May be empty if `certificates` is
    /// not.
    #[serde(default)]
    pub keys: Vec<String>,
    /// DNS names (subject alternative names) of client certificates that
    /// are this principal, over client TLS: a client that sends no API key
    /// but a certificate from the servers' CA naming one of these is it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub certificates: Vec<String>,
    /// Lease-name prefixes it may acquire.
    #[serde(default)]
    pub acquire: Vec<String>,
    /// Lease-name prefixes it may read.
    #[serde(default)]
    pub read: Vec<String>,
    /// Lease-name prefixes whose grants it may revoke.
    #[serde(default)]
    pub admin: Vec<String>,
    /// Whether it may change the cluster (keys, membership).
    #[serde(default)]
    pub cluster: bool,
    /// Leases it may own on an election cluster (held, or freed and not yet
    /// reclaimed); unset: the node's `--max-leases-per-principal`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_leases: Option<u64>,
}

impl Rules {
    /// Prefixes that do not end in a separator (`.`, `-`, `_`, `/`): `orders`
    /// also matches `orders-archive`, which is rarely what was meant.
    pub fn loose_prefixes(&self) -> Vec<&str> {
        let mut loose: Vec<&str> = [&self.acquire, &self.read, &self.admin]
            .into_iter()
            .flatten()
            .map(String::as_str)
            .filter(|p| !p.is_empty() && !p.ends_with(['.', '-', '_', '/']))
            .collect();
        loose.sort_unstable();
        loose.dedup();
        loose
    }

    pub(crate) fn prefixes(&self, right: Right) -> &[String] {
        match right {
            Right::Acquire => &self.acquire,
            Right::Read => &self.read,
            Right::Admin => &self.admin,
        }
    }
}

/// Everything, for a principal that operates the whole cluster.
pub fn operator() -> Rules {
    Rules {
        keys: Vec::new(),
        acquire: vec![String::new()],
        read: vec![String::new()],
        admin: vec![String::new()],
        cluster: true,
        max_leases: None,
        certificates: Vec::new(),
    }
}
