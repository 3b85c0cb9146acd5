//! [`FencedStore`] in memory: the reference behaviour, for tests above the store.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use palisade_names::{FencingToken, LeaseName, ObjectKey};

use crate::error::StoreError;
use crate::fenced_store::{
    Deleted, FencedStore, ObjectPage, ObjectSummary, Precondition, StoredObject, Written,
    MAX_LIST_PAGE,
};

/// A store that forgets everything when dropped. One mutex makes every
/// operation atomic.
#[derive(Debug, Default)]
pub struct MemoryStore {
    state: Mutex<State>,
    max_value_bytes: Option<usize>,
}

#[derive(Debug, Default)]
struct State {
    objects: BTreeMap<String, StoredObject>,
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
        when: Option<(&ObjectKey, Precondition)>,
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
        if let Some((key, when)) = when {
            let current = state.objects.get(key.as_str()).map(|o| o.version);
            if !when.admits(current) {
                return Err(StoreError::PreconditionFailed { current });
            }
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
    async fn put_if(
        &self,
        key: &ObjectKey,
        value: Vec<u8>,
        token: FencingToken,
        when: Precondition,
    ) -> Result<Written, StoreError> {
        if let Some(max) = self.max_value_bytes.filter(|&max| value.len() > max) {
            return Err(StoreError::ValueTooLarge {
                size: value.len(),
                max,
            });
        }
        self.fenced(key.lease(), token, Some((key, when)), |state| {
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

    async fn delete_if(
        &self,
        key: &ObjectKey,
        token: FencingToken,
        when: Precondition,
    ) -> Result<Deleted, StoreError> {
        self.fenced(key.lease(), token, Some((key, when)), |state| Deleted {
            existed: state.objects.remove(key.as_str()).is_some(),
            fence: token,
        })
    }

    async fn bump_fence(
        &self,
        lease: &LeaseName,
        token: FencingToken,
    ) -> Result<FencingToken, StoreError> {
        self.fenced(lease, token, None, |_| token)
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

    async fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<ObjectPage, StoreError> {
        let limit = limit.min(MAX_LIST_PAGE);
        self.read(|state| {
            let mut found = state
                .objects
                .range::<str, _>((list_start(prefix, after), std::ops::Bound::Unbounded))
                .take_while(|(key, _)| key.starts_with(prefix))
                .map(|(key, object)| ObjectSummary {
                    key: key.clone(),
                    version: object.version,
                    token: object.token,
                    size: object.value.len() as u64,
                });
            let objects: Vec<_> = found.by_ref().take(limit).collect();
            ObjectPage {
                objects,
                more: found.next().is_some(),
            }
        })
    }
}

/// Where a listing starts: after `after` when it is past `prefix`, else at
/// `prefix`.
pub(crate) fn list_start<'a>(prefix: &'a str, after: Option<&'a str>) -> std::ops::Bound<&'a str> {
    match after {
        Some(after) if after >= prefix => std::ops::Bound::Excluded(after),
        _ => std::ops::Bound::Included(prefix),
    }
}
