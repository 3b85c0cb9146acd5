//! [`StatusPage`]: what the status pages keep on a node beside the API
//! state — the gateway they read and the sessions signed in here. Built
//! once by the node ([`crate::node`]), handed to the pages' routes as an
//! extension and to the sampler; the API state knows nothing of it.

use std::sync::Arc;

use super::gateway::GatewayReader;
use super::sessions::Sessions;
use crate::config::ElectionConfig;

/// The status pages' own state on this node.
#[derive(Debug)]
pub struct StatusPage {
    /// The gateway the status page reads (`--ui-gateway`), its client built
    /// once.
    pub gateway: Option<GatewayReader>,
    /// The status page's sign-ins on this node (`sessions.rs`).
    pub sessions: Sessions,
}

impl StatusPage {
    /// The status page of a node with `config`.
    pub fn new(config: &ElectionConfig) -> Arc<Self> {
        Arc::new(Self {
            gateway: config.ui_gateway.clone().map(GatewayReader::new),
            sessions: Sessions::new(config.ui.clone()),
        })
    }
}
