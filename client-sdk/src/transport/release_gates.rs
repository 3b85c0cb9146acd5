//! [`ReleaseGates`]: one gate per (lease, holder), held by a background
//! release until it is done, so an acquire of the same pair waits for it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use palisade_plumbing::sync::lock;

/// Held while a lease is being released in the background.
pub(crate) type ReleaseGate = Arc<tokio::sync::Mutex<()>>;

/// One gate per (lease, holder): held by a background release (a dropped
/// [`Lease`](crate::Lease)) until it is done; an acquire for the same pair
/// waits for it. Otherwise the acquire could be granted the very same token
/// again (acquire by the holder is idempotent) and the late release would
/// then free the new grant while its holder believes in it.
#[derive(Debug, Default)]
pub(crate) struct ReleaseGates(Mutex<HashMap<(String, String), ReleaseGate>>);

impl ReleaseGates {
    /// The gate of `lease` and `holder`; forgets gates nobody holds.
    pub(crate) fn gate(&self, lease: &str, holder: &str) -> ReleaseGate {
        let mut gates = lock(&self.0);
        gates.retain(|_, gate| Arc::strong_count(gate) > 1);
        gates
            .entry((lease.to_owned(), holder.to_owned()))
            .or_default()
            .clone()
    }
}
