//! [`Standing`]: what a node says of itself to a peer that asks (the
//! leader's placement checks, and every node meeting its peers).

use serde::{Deserialize, Serialize};

/// What a node says of itself to the leader (`POST /raft/standing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Standing {
    /// Its `--priority`.
    pub priority: u32,
    /// Whether it runs `--never-lead`.
    pub never_lead: bool,
}
