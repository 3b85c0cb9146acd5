//! [`StoreHooks`]: what an engine tells its owner, for metrics.

use std::sync::Arc;

/// Callbacks for what the store does, so its owner can count it without the
/// store knowing about metrics.
#[derive(Clone, Default)]
pub struct StoreHooks {
    /// After each flush (fsync), with its duration.
    pub on_flush: Option<Arc<dyn Fn(std::time::Duration) + Send + Sync>>,
    /// When a write raises a lease's fence.
    pub on_fence_raised: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl std::fmt::Debug for StoreHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreHooks")
            .field("on_flush", &self.on_flush.is_some())
            .field("on_fence_raised", &self.on_fence_raised.is_some())
            .finish()
    }
}
