//! [`Standing`]: what a node says of itself to a peer that asks (the
//! leader's placement checks, every node meeting its peers, and a node
//! about to be added).

use serde::{Deserialize, Serialize};

use crate::config::ElectionConfig;

/// What a node says of itself to the leader (`POST /raft/standing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Standing {
    /// Its `--priority`.
    pub priority: u32,
    /// Whether it runs `--never-lead`.
    pub never_lead: bool,
    /// How many partitions it runs (a node from before partitions does not
    /// say, and runs one).
    #[serde(default = "one")]
    pub partitions: u32,
}

fn one() -> u32 {
    1
}

impl Standing {
    /// What a node started with `config` says of itself.
    pub fn of(config: &ElectionConfig) -> Self {
        Self {
            priority: config.placement.priority,
            never_lead: config.never_lead,
            partitions: config.partitions,
        }
    }
}
