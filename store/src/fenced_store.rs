//! [`FencedStore`], the narrow trait every engine implements and the gateway
//! programs against, and what its operations report.

use std::future::Future;

use palisade_names::{FencingToken, LeaseName, ObjectKey};

use crate::error::StoreError;

/// An object as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredObject {
    /// The bytes written.
    pub value: Vec<u8>,
    /// Unique per write across the store's life (restarts included): an
    /// ETag. Increases in the commit order of one key's writes, and a write
    /// with a higher token than the lease's fence gets a higher version
    /// than every write accepted before it (sled: in the commit order of all
    /// of a lease's writes).
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
