//! How to open a [`SledStore`](super::SledStore), and the hooks it calls.

use std::path::PathBuf;

use crate::hooks::StoreHooks;

/// How to open a [`SledStore`](super::SledStore).
#[derive(Debug, Clone)]
pub struct SledStoreConfig {
    /// The directory sled owns.
    pub path: PathBuf,
    /// The largest value a put accepts, in bytes. Default 1 MiB.
    pub max_value_bytes: usize,
    /// sled's page cache, in bytes. Default 64 MiB.
    pub cache_capacity_bytes: u64,
    /// Told of every flush and every fence raised (for metrics).
    pub hooks: StoreHooks,
}

impl SledStoreConfig {
    /// Defaults for a store in `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            max_value_bytes: 1024 * 1024,
            cache_capacity_bytes: 64 * 1024 * 1024,
            hooks: StoreHooks::default(),
        }
    }
}
