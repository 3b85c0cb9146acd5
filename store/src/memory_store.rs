//! [`FencedStore`] in memory: the reference behaviour, for tests above the store.

use std::collections::HashMap;
use std::sync::Mutex;

use palisade_names::{FencingToken, LeaseName, ObjectKey};

use crate::error::StoreError;
use crate::fenced_store::{Deleted, FencedStore, StoredObject, Written};

/// A store that forgets everything when dropped. One mutex makes every
/// operation atomic.
#[derive(Debug, Default)]
pub struct MemoryStore {
    state: Mutex<State>,
    max_value_bytes: Option<usize>,
}

#[derive(Debug, Default)]
struct State {
    objects: HashMap<String, StoredObject>,
    fences: HashMap<String, FencingToken>,
    next_version: u64,
}

impl MemoryStore {
    /// An empty store with a value limit.
    pub fn with_max_value_bytes(max: usize) -> Self {
        Self {
            max_value_bytes: Some(max),
            ..Self::default()
        }
    }

    fn fenced<T>(
        &self,
        lease: &LeaseName,
        token: FencingToken,
        effect: impl FnOnce(&mut State) -> T,
    ) -> Result<T, StoreError> {
        let mut state = self
            .state
            .lock()
            .map_err(|_| StoreError::Engine("memory store lock poisoned".into()))?;
        let fence = state
            .fences
            .get(lease.as_str())
            .copied()
            .unwrap_or_default();
        if token < fence {
            return Err(StoreError::Stale { token, fence });
        }
        state.fences.insert(lease.as_str().to_owned(), token);
        Ok(effect(&mut state))
    }

    fn read<T>(&self, f: impl FnOnce(&State) -> T) -> Result<T, StoreError> {
        let state = self
            .state
            .lock()
            .map_err(|_| StoreError::Engine("memory store lock poisoned".into()))?;
        Ok(f(&state))
    }
}

impl FencedStore for MemoryStore {
    async fn put(
        &self,
        key: &ObjectKey,
        value: Vec<u8>,
        token: FencingToken,
    ) -> Result<Written, StoreError> {
        if let Some(max) = self.max_value_bytes.filter(|&max| value.len() > max) {
            return Err(StoreError::ValueTooLarge {
                size: value.len(),
                max,
            });
        }
        self.fenced(key.lease(), token, |state| {
            state.next_version += 1;
            let version = state.next_version;
            state.objects.insert(
                key.as_str().to_owned(),
                StoredObject {
                    value,
                    version,
                    token,
                },
            );
            Written {
                version,
                fence: token,
            }
        })
    }

    async fn delete(&self, key: &ObjectKey, token: FencingToken) -> Result<Deleted, StoreError> {
        self.fenced(key.lease(), token, |state| Deleted {
            existed: state.objects.remove(key.as_str()).is_some(),
            fence: token,
        })
    }

    async fn bump_fence(
        &self,
        lease: &LeaseName,
        token: FencingToken,
    ) -> Result<FencingToken, StoreError> {
        self.fenced(lease, token, |_| token)
    }

    async fn get(&self, key: &ObjectKey) -> Result<Option<StoredObject>, StoreError> {
        self.read(|state| state.objects.get(key.as_str()).cloned())
    }

    async fn fence(&self, lease: &LeaseName) -> Result<FencingToken, StoreError> {
        self.read(|state| {
            state
                .fences
                .get(lease.as_str())
                .copied()
                .unwrap_or_default()
        })
    }
}
