//! The conformance checks of conditional writes and listing: a condition is
//! checked in the fence's atomic step, a failed one changes nothing (the
//! fence neither), a stale token is refused as stale whatever the
//! condition, and a listing pages through keys in byte order.

use std::sync::Arc;

use palisade_names::{FencingToken, LeaseName, ObjectKey};

use crate::error::StoreError;
use crate::fenced_store::{FencedStore, Precondition};

fn key(s: &str) -> ObjectKey {
    ObjectKey::new(s).expect("test key is valid")
}

async fn fence_of(store: &impl FencedStore, lease: &str) -> FencingToken {
    let lease = LeaseName::new(lease).expect("test lease is valid");
    store.fence(&lease).await.expect("fence")
}

async fn version_of(store: &impl FencedStore, k: &str) -> Option<u64> {
    store.get(&key(k)).await.expect("get").map(|o| o.version)
}

fn unmet<T: std::fmt::Debug>(answer: Result<T, StoreError>) -> Option<u64> {
    match answer {
        Err(StoreError::PreconditionFailed { current }) => current,
        other => panic!("expected a failed precondition, got {other:?}"),
    }
}

pub(crate) async fn conditional_puts_change_nothing_when_unmet(store: impl FencedStore) {
    let k = key("jobs/a");
    let created = store
        .put_if(&k, b"1".to_vec(), FencingToken(5), Precondition::Absent)
        .await
        .expect("created where nothing was");
    let again = store
        .put_if(&k, b"x".to_vec(), FencingToken(5), Precondition::Absent)
        .await;
    assert_eq!(unmet(again), Some(created.version));
    // A raise whose condition fails raises nothing.
    let raise = store
        .put_if(
            &k,
            b"x".to_vec(),
            FencingToken(9),
            Precondition::Version(created.version + 100),
        )
        .await;
    assert_eq!(unmet(raise), Some(created.version));
    assert_eq!(fence_of(&store, "jobs").await, FencingToken(5));
    assert_eq!(version_of(&store, "jobs/a").await, Some(created.version));
    let missing = store
        .put_if(
            &key("jobs/b"),
            b"x".to_vec(),
            FencingToken(5),
            Precondition::Exists,
        )
        .await;
    assert_eq!(unmet(missing), None);
    assert_eq!(version_of(&store, "jobs/b").await, None);

    let replaced = store
        .put_if(
            &k,
            b"2".to_vec(),
            FencingToken(7),
            Precondition::Version(created.version),
        )
        .await
        .expect("the version matched");
    assert!(replaced.version > created.version);
    assert_eq!(fence_of(&store, "jobs").await, FencingToken(7), "raised");
    let old = store
        .put_if(
            &k,
            b"3".to_vec(),
            FencingToken(7),
            Precondition::Version(created.version),
        )
        .await;
    assert_eq!(unmet(old), Some(replaced.version));
    store
        .put_if(&k, b"3".to_vec(), FencingToken(7), Precondition::Exists)
        .await
        .expect("it exists");
    // Stale comes first: the condition would hold, the token does not.
    let stale = store
        .put_if(&k, b"4".to_vec(), FencingToken(6), Precondition::Exists)
        .await;
    assert!(matches!(stale, Err(StoreError::Stale { .. })), "{stale:?}");
}

pub(crate) async fn conditional_deletes_change_nothing_when_unmet(store: impl FencedStore) {
    let k = key("jobs/a");
    let written = store
        .put(&k, b"1".to_vec(), FencingToken(5))
        .await
        .expect("put");
    let wrong = store
        .delete_if(
            &k,
            FencingToken(8),
            Precondition::Version(written.version + 1),
        )
        .await;
    assert_eq!(unmet(wrong), Some(written.version));
    assert_eq!(
        fence_of(&store, "jobs").await,
        FencingToken(5),
        "not raised"
    );
    assert_eq!(version_of(&store, "jobs/a").await, Some(written.version));
    let deleted = store
        .delete_if(&k, FencingToken(8), Precondition::Version(written.version))
        .await
        .expect("the version matched");
    assert!(deleted.existed);
    assert_eq!(fence_of(&store, "jobs").await, FencingToken(8));
    assert_eq!(version_of(&store, "jobs/a").await, None);
    let gone = store
        .delete_if(&k, FencingToken(8), Precondition::Exists)
        .await;
    assert_eq!(unmet(gone), None);
    let stale = store
        .delete_if(&k, FencingToken(2), Precondition::Exists)
        .await;
    assert!(matches!(stale, Err(StoreError::Stale { .. })), "{stale:?}");
}

/// Writers of one token racing on one condition: exactly one wins (on
/// PostgreSQL they all hold the lease's lock shared, so the row decides).
pub(crate) async fn racing_conditional_writers_one_wins(store: impl FencedStore) {
    let store = Arc::new(store);
    let k = key("race/a");
    let seed = store
        .put(&k, b"0".to_vec(), FencingToken(3))
        .await
        .expect("seed");
    for when in [Precondition::Version(seed.version), Precondition::Absent] {
        let target = if when == Precondition::Absent {
            "race/b"
        } else {
            "race/a"
        };
        let tasks: Vec<_> = (0..8u8)
            .map(|i| {
                let store = Arc::clone(&store);
                let k = key(target);
                tokio::spawn(async move { store.put_if(&k, vec![i], FencingToken(3), when).await })
            })
            .collect();
        let mut won = 0;
        for task in tasks {
            match task.await.expect("task") {
                Ok(_) => won += 1,
                Err(StoreError::PreconditionFailed { current: Some(_) }) => {}
                Err(other) => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(won, 1, "exactly one writer of {when:?} wins");
    }
}

pub(crate) async fn listing_pages_in_key_order(store: impl FencedStore) {
    for (k, value) in [
        ("a/2", "bb"),
        ("a/1", "a"),
        ("ab/1", ""),
        ("a/3", "ccc"),
        ("b/1", "d"),
    ] {
        store
            .put(&key(k), value.as_bytes().to_vec(), FencingToken(1))
            .await
            .expect("put");
    }
    let keys = |page: &crate::fenced_store::ObjectPage| -> Vec<String> {
        page.objects.iter().map(|o| o.key.clone()).collect()
    };
    let first = store.list("a", None, 2).await.expect("list");
    assert_eq!(keys(&first), ["a/1", "a/2"]);
    assert!(first.more);
    assert_eq!(first.objects[1].size, 2);
    assert_eq!(first.objects[1].token, FencingToken(1));
    let second = store.list("a", Some("a/2"), 2).await.expect("list");
    assert_eq!(keys(&second), ["a/3", "ab/1"]);
    assert!(!second.more, "nothing under the prefix follows");
    let under = store.list("a/", None, 10).await.expect("list");
    assert_eq!(keys(&under), ["a/1", "a/2", "a/3"]);
    // `after` before the prefix starts at the prefix.
    let early = store.list("b", Some("a/9"), 10).await.expect("list");
    assert_eq!(keys(&early), ["b/1"]);
    let all = store.list("", None, 1000).await.expect("list");
    assert_eq!(all.objects.len(), 5);
    assert!(!all.more);
    store
        .delete(&key("a/2"), FencingToken(1))
        .await
        .expect("delete");
    let after_delete = store.list("a/", None, 10).await.expect("list");
    assert_eq!(keys(&after_delete), ["a/1", "a/3"]);
    assert!(store
        .list("zz", None, 10)
        .await
        .expect("list")
        .objects
        .is_empty());
}
