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

/// What a conditional write requires of the object it replaces, checked in
/// the same atomic step as the fence (HTTP's `If-Match` and
/// `If-None-Match`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precondition {
    /// Nothing: the write replaces whatever is there.
    #[default]
    Any,
    /// The object exists at this version (`If-Match: <version>`).
    Version(u64),
    /// The object exists, at any version (`If-Match: *`).
    Exists,
    /// No object exists (`If-None-Match: *`).
    Absent,
}

impl Precondition {
    /// Whether an object at `current` (`None`: no object) satisfies it.
    pub fn admits(self, current: Option<u64>) -> bool {
        match self {
            Precondition::Any => true,
            Precondition::Version(version) => current == Some(version),
            Precondition::Exists => current.is_some(),
            Precondition::Absent => current.is_none(),
        }
    }
}

/// One object of a listing: its key and what describes its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectSummary {
    /// The object's key.
    pub key: String,
    /// Its version (as [`StoredObject::version`]).
    pub version: u64,
    /// The token of the write that stored it.
    pub token: FencingToken,
    /// The value's length in bytes.
    pub size: u64,
}

/// One page of a listing, in key order (bytes, as UTF-8 compares).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ObjectPage {
    /// At most the limit asked for.
    pub objects: Vec<ObjectSummary>,
    /// More keys under the prefix follow the last one.
    pub more: bool,
}

/// The most objects one listing page holds.
pub const MAX_LIST_PAGE: usize = 1000;

/// A store that fences writes per lease.
///
/// Every mutating method accepts iff `token >= fence(lease)`, raises the fence
/// to `token` atomically with its effect, and returns only once that effect is
/// durable. Every refusal leaves the store unchanged.
pub trait FencedStore: Send + Sync + 'static {
    /// Stores `value` under `key` if the object there satisfies `when`,
    /// checked under the same lock (or in the same statement) as the fence.
    ///
    /// # Errors
    /// [`StoreError::Stale`] if `token` is below the fence, whatever `when`;
    /// [`StoreError::PreconditionFailed`] if the token passes but the object
    /// does not satisfy `when` (the fence is not raised);
    /// [`StoreError::ValueTooLarge`] over the configured limit;
    /// [`StoreError::Engine`] if the engine failed (the write may or may not
    /// have reached disk).
    fn put_if(
        &self,
        key: &ObjectKey,
        value: Vec<u8>,
        token: FencingToken,
        when: Precondition,
    ) -> impl Future<Output = Result<Written, StoreError>> + Send;

    /// Stores `value` under `key`: [`FencedStore::put_if`] with no
    /// precondition.
    ///
    /// # Errors
    /// As [`FencedStore::put_if`].
    fn put(
        &self,
        key: &ObjectKey,
        value: Vec<u8>,
        token: FencingToken,
    ) -> impl Future<Output = Result<Written, StoreError>> + Send {
        self.put_if(key, value, token, Precondition::Any)
    }

    /// Deletes `key` if the object there satisfies `when` (with
    /// [`Precondition::Any`] it need not exist) and raises the fence.
    ///
    /// # Errors
    /// As [`FencedStore::put_if`], without the size limit.
    fn delete_if(
        &self,
        key: &ObjectKey,
        token: FencingToken,
        when: Precondition,
    ) -> impl Future<Output = Result<Deleted, StoreError>> + Send;

    /// Deletes `key` (which need not exist) and raises the fence.
    ///
    /// # Errors
    /// As [`FencedStore::delete_if`].
    fn delete(
        &self,
        key: &ObjectKey,
        token: FencingToken,
    ) -> impl Future<Output = Result<Deleted, StoreError>> + Send {
        self.delete_if(key, token, Precondition::Any)
    }

    /// Up to `limit` (at most [`MAX_LIST_PAGE`]) objects whose keys start
    /// with `prefix` and sort after `after`, in key order. Only durable data
    /// is listed; the work is bounded by `limit`, not by how many keys
    /// there are.
    ///
    /// # Errors
    /// [`StoreError::Engine`], [`StoreError::Unavailable`].
    fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = Result<ObjectPage, StoreError>> + Send;

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
