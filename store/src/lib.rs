//! The fenced object store: the storage half of Palisade's fencing promise.
//!
//! Objects live under keys whose first segment names a lease. Each lease has one
//! *fence*: the highest fencing token the store has accepted for it. A write
//! (put, delete, or a bare fence bump) is accepted iff its token is at least the
//! fence, and it raises the fence to its token **in the same atomic step** as the
//! write. A refused write changes nothing. An acknowledged write is on disk.
//!
//! - [`FencedStore`] is the narrow trait the gateway programs against.
//! - [`SledStore`] implements it on sled, with group commit ([`group_commit`]).
//! - [`MemoryStore`] implements it in memory, for tests of code above the store.
//! - [`names`] (the `palisade-names` crate) holds the validated newtypes every
//!   operation takes.
//!
//! The same conformance suite (`conformance.rs`) runs against every backend.

mod error;
mod group_commit;
mod memory_store;
mod sled_store;

#[cfg(test)]
mod conformance;

use std::future::Future;

pub use error::StoreError;
pub use memory_store::MemoryStore;
pub use palisade_names as names;
pub use palisade_names::{FencingToken, LeaseName, NameError, ObjectKey, MAX_KEY_LEN, MAX_TOKEN};
pub use sled_store::{SledStore, SledStoreConfig, StoreHooks};

/// An object as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredObject {
    /// The bytes written.
    pub value: Vec<u8>,
    /// Unique per write across the store's life (restarts included): an
    /// ETag. Increases in the commit order of one lease's writes.
    pub version: u64,
    /// The token of the write that stored this value.
    pub token: FencingToken,
}

/// What an accepted put reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// The new object's version.
    pub version: u64,
    /// The lease's fence after the write (equal to the write's token).
    pub fence: FencingToken,
}

/// What an accepted delete reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deleted {
    /// Whether there was an object to delete. The fence is raised either way.
    pub existed: bool,
    /// The lease's fence after the delete.
    pub fence: FencingToken,
}

/// A store that fences writes per lease.
///
/// Every mutating method accepts iff `token >= fence(lease)`, raises the fence
/// to `token` atomically with its effect, and returns only once that effect is
/// durable. Every refusal leaves the store unchanged.
pub trait FencedStore: Send + Sync + 'static {
    /// Stores `value` under `key`.
    ///
    /// # Errors
    /// [`StoreError::Stale`] if `token` is below the fence;
    /// [`StoreError::ValueTooLarge`] over the configured limit;
    /// [`StoreError::Engine`] if the engine failed (the write may or may not
    /// have reached disk).
    fn put(
        &self,
        key: &ObjectKey,
        value: Vec<u8>,
        token: FencingToken,
    ) -> impl Future<Output = Result<Written, StoreError>> + Send;

    /// Deletes `key` (which need not exist) and raises the fence.
    ///
    /// # Errors
    /// As [`FencedStore::put`], without the size limit.
    fn delete(
        &self,
        key: &ObjectKey,
        token: FencingToken,
    ) -> impl Future<Output = Result<Deleted, StoreError>> + Send;

    /// Raises the fence of `lease` to `token`, writing nothing else. Returns the
    /// fence after the call.
    ///
    /// # Errors
    /// [`StoreError::Stale`] if `token` is below the fence; [`StoreError::Engine`].
    fn bump_fence(
        &self,
        lease: &LeaseName,
        token: FencingToken,
    ) -> impl Future<Output = Result<FencingToken, StoreError>> + Send;

    /// Reads `key`. Only durable data is returned.
    ///
    /// # Errors
    /// [`StoreError::Engine`].
    fn get(
        &self,
        key: &ObjectKey,
    ) -> impl Future<Output = Result<Option<StoredObject>, StoreError>> + Send;

    /// The fence of `lease`: 0 when never fenced.
    ///
    /// # Errors
    /// [`StoreError::Engine`].
    fn fence(
        &self,
        lease: &LeaseName,
    ) -> impl Future<Output = Result<FencingToken, StoreError>> + Send;
}
