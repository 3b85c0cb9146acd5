//! The suite every [`FencedStore`] backend must pass.
//!
//! `backend_suite!` instantiates each check for one backend; add a backend by
//! adding one invocation at the bottom.

mod audit;
mod conditional;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use proptest::prelude::*;

use palisade_names::{FencingToken, LeaseName, ObjectKey};

use crate::error::StoreError;
use crate::fenced_store::FencedStore;
use crate::sled_store::config::SledStoreConfig;
use crate::sled_store::SledStore;

fn key(s: &str) -> ObjectKey {
    ObjectKey::new(s).expect("test key is valid")
}

fn lease(s: &str) -> LeaseName {
    LeaseName::new(s).expect("test lease is valid")
}

pub(crate) async fn put_then_get_round_trips(store: impl FencedStore) {
    let written = store
        .put(&key("jobs/a"), b"hello".to_vec(), FencingToken(5))
        .await
        .expect("put");
    assert_eq!(written.fence, FencingToken(5));
    let object = store
        .get(&key("jobs/a"))
        .await
        .expect("get")
        .expect("found");
    assert_eq!(object.value, b"hello");
    assert_eq!(object.version, written.version);
    assert_eq!(object.token, FencingToken(5));
    assert_eq!(
        store.fence(&lease("jobs")).await.expect("fence"),
        FencingToken(5)
    );
    assert!(store.get(&key("jobs/b")).await.expect("get").is_none());
    assert_eq!(
        store.fence(&lease("other")).await.expect("fence"),
        FencingToken(0)
    );

    let again = store
        .put(&key("jobs/a"), b"again".to_vec(), FencingToken(5))
        .await
        .expect("equal token is accepted");
    assert!(again.version > written.version, "versions increase");
}

pub(crate) async fn stale_writes_change_nothing(store: impl FencedStore) {
    store
        .put(&key("jobs/a"), b"new".to_vec(), FencingToken(10))
        .await
        .expect("put");
    let before = store.get(&key("jobs/a")).await.expect("get");

    let stale = store
        .put(&key("jobs/a"), b"old".to_vec(), FencingToken(9))
        .await;
    assert!(
        matches!(
            stale,
            Err(StoreError::Stale {
                token: FencingToken(9),
                fence: FencingToken(10)
            })
        ),
        "{stale:?}"
    );
    let stale = store
        .put(&key("jobs/other"), b"old".to_vec(), FencingToken(3))
        .await;
    assert!(
        matches!(stale, Err(StoreError::Stale { .. })),
        "the fence covers every key of the lease"
    );
    let stale = store.delete(&key("jobs/a"), FencingToken(1)).await;
    assert!(matches!(stale, Err(StoreError::Stale { .. })), "{stale:?}");
    let stale = store.bump_fence(&lease("jobs"), FencingToken(2)).await;
    assert!(matches!(stale, Err(StoreError::Stale { .. })), "{stale:?}");

    assert_eq!(store.get(&key("jobs/a")).await.expect("get"), before);
    assert!(store.get(&key("jobs/other")).await.expect("get").is_none());
    assert_eq!(
        store.fence(&lease("jobs")).await.expect("fence"),
        FencingToken(10)
    );
}

pub(crate) async fn delete_and_bump_raise_the_fence(store: impl FencedStore) {
    store
        .put(&key("a/x"), b"1".to_vec(), FencingToken(1))
        .await
        .expect("put");
    let deleted = store
        .delete(&key("a/x"), FencingToken(4))
        .await
        .expect("delete");
    assert!(deleted.existed);
    assert_eq!(
        store.fence(&lease("a")).await.expect("fence"),
        FencingToken(4)
    );
    assert!(store.get(&key("a/x")).await.expect("get").is_none());
    let deleted = store
        .delete(&key("a/x"), FencingToken(4))
        .await
        .expect("delete");
    assert!(!deleted.existed);

    assert_eq!(
        store
            .bump_fence(&lease("a"), FencingToken(7))
            .await
            .expect("bump"),
        FencingToken(7)
    );
    assert_eq!(
        store.fence(&lease("a")).await.expect("fence"),
        FencingToken(7)
    );
    assert_eq!(
        store.fence(&lease("b")).await.expect("fence"),
        FencingToken(0),
        "fences are per lease"
    );
    assert!(
        store.get(&key("a/x")).await.expect("get").is_none(),
        "a bump writes no object"
    );
}

pub(crate) async fn oversized_values_are_refused(store: impl FencedStore, max: usize) {
    let refused = store
        .put(&key("big"), vec![0; max + 1], FencingToken(1))
        .await;
    assert!(
        matches!(refused, Err(StoreError::ValueTooLarge { .. })),
        "{refused:?}"
    );
    assert_eq!(
        store.fence(&lease("big")).await.expect("fence"),
        FencingToken(0)
    );
    store
        .put(&key("big"), vec![0; max], FencingToken(1))
        .await
        .expect("exactly the limit is accepted");
}

/// One completed operation of the concurrent check, with logical times.
#[derive(Debug, Clone)]
struct Op {
    lease: usize,
    token: u64,
    invoked: u64,
    completed: u64,
    accepted: bool,
    /// An accepted put's version.
    version: Option<u64>,
}

/// One writer's plan: `(lease index, token, kind)` per operation; the kind
/// modulo 3 picks put, delete or fence bump.
type Plan = Vec<(usize, u64, u8)>;

/// Concurrent writers with random tokens on a few leases. Checks, per lease:
/// an accepted op never carries a token below one whose acceptance completed
/// before it was invoked; a refused op was refused because some op with a higher
/// token was accepted and invoked before the refusal; the final fence is the
/// highest accepted token.
pub(crate) async fn concurrent_writers_never_go_back(store: impl FencedStore, plans: Vec<Plan>) {
    let store = Arc::new(store);
    let history = run_writers(&store, plans).await;
    check_no_step_back(&history);
    for lease_index in 0..3 {
        check_commit_order_and_fence(&*store, &history, lease_index).await;
    }
}

/// Runs one task per plan at once; every operation, with logical times.
async fn run_writers<S: FencedStore>(store: &Arc<S>, plans: Vec<Plan>) -> Vec<Op> {
    let clock = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for (writer, plan) in plans.into_iter().enumerate() {
        let store = store.clone();
        let clock = clock.clone();
        tasks.push(tokio::spawn(async move {
            let mut ops = Vec::new();
            for (i, (lease_index, token, kind)) in plan.into_iter().enumerate() {
                let invoked = clock.fetch_add(1, Ordering::SeqCst);
                let result =
                    one_op(&*store, writer, i, lease_index, FencingToken(token), kind).await;
                let completed = clock.fetch_add(1, Ordering::SeqCst);
                let (accepted, version) = match result {
                    Ok(version) => (true, version),
                    Err(StoreError::Stale { .. }) => (false, None),
                    Err(err) => panic!("unexpected error {err}"),
                };
                ops.push(Op {
                    lease: lease_index,
                    token,
                    invoked,
                    completed,
                    accepted,
                    version,
                });
            }
            ops
        }));
    }
    let mut history = Vec::new();
    for task in tasks {
        history.extend(task.await.expect("writer task"));
    }
    history
}

/// Operation `i` of `writer`: a put (answering its version), a delete or
/// a fence bump on lease `l{lease_index}`.
async fn one_op(
    store: &impl FencedStore,
    writer: usize,
    i: usize,
    lease_index: usize,
    token: FencingToken,
    kind: u8,
) -> Result<Option<u64>, StoreError> {
    let name = format!("l{lease_index}");
    match kind % 3 {
        0 => store
            .put(&key(&format!("{name}/w{writer}/{i}")), vec![kind; 8], token)
            .await
            .map(|w| Some(w.version)),
        1 => store
            .delete(&key(&format!("{name}/w{writer}/0")), token)
            .await
            .map(|_| None),
        _ => store.bump_fence(&lease(&name), token).await.map(|_| None),
    }
}

/// No accepted op goes below a token accepted before it began, and every
/// refusal has a higher accepted token invoked before it ended.
fn check_no_step_back(history: &[Op]) {
    for a in history {
        for b in history {
            if a.lease != b.lease || !a.accepted || a.completed >= b.invoked {
                continue;
            }
            assert!(
                !b.accepted || b.token >= a.token,
                "accepted {b:?} after accepted {a:?} with a higher token"
            );
        }
        if !a.accepted {
            assert!(
                history.iter().any(|c| c.lease == a.lease
                    && c.accepted
                    && c.token > a.token
                    && c.invoked < a.completed),
                "{a:?} was refused without a higher accepted token"
            );
        }
    }
}

/// In the commit (version) order of lease `l{lease_index}`'s puts, tokens
/// never go down, and its final fence is its highest accepted token.
async fn check_commit_order_and_fence(
    store: &impl FencedStore,
    history: &[Op],
    lease_index: usize,
) {
    // Versions follow the commit order, so the gateway's order of a
    // lease's puts is visible: their tokens never go down in it.
    let mut puts: Vec<&Op> = history
        .iter()
        .filter(|op| op.lease == lease_index && op.version.is_some())
        .collect();
    puts.sort_by_key(|op| op.version);
    for pair in puts.windows(2) {
        assert!(
            pair[1].token >= pair[0].token && pair[1].version > pair[0].version,
            "in commit (version) order {:?} came after {:?}",
            pair[1],
            pair[0]
        );
    }
    let highest = history
        .iter()
        .filter(|op| op.lease == lease_index && op.accepted)
        .map(|op| op.token)
        .max()
        .unwrap_or(0);
    let fence = store
        .fence(&lease(&format!("l{lease_index}")))
        .await
        .expect("fence");
    assert_eq!(
        fence,
        FencingToken(highest),
        "final fence of l{lease_index}"
    );
}

fn plans() -> impl Strategy<Value = Vec<Plan>> {
    plans_of_tokens(1..40)
}

/// Plans whose tokens are drawn from `tokens`: a narrow range makes many
/// writers carry a lease's current fence at once (one holder writing from
/// many tasks) while others raise it.
fn plans_of_tokens(tokens: std::ops::Range<u64>) -> impl Strategy<Value = Vec<Plan>> {
    prop::collection::vec(
        prop::collection::vec((0usize..3, tokens, any::<u8>()), 1..12),
        2..6,
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

macro_rules! backend_suite {
    ($module:ident, $make:expr, $max:expr) => {
        mod $module {
            use proptest::prelude::*;

            use crate::conformance::{plans, plans_of_tokens, runtime};

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn put_then_get_round_trips() {
                let Some((store, _dir)) = $make else { return };
                crate::conformance::put_then_get_round_trips(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn stale_writes_change_nothing() {
                let Some((store, _dir)) = $make else { return };
                crate::conformance::stale_writes_change_nothing(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn delete_and_bump_raise_the_fence() {
                let Some((store, _dir)) = $make else { return };
                crate::conformance::delete_and_bump_raise_the_fence(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn oversized_values_are_refused() {
                let Some((store, _dir)) = $make else { return };
                crate::conformance::oversized_values_are_refused(store, $max).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn conditional_puts_change_nothing_when_unmet() {
                let Some((store, _dir)) = $make else { return };
                crate::conformance::conditional::conditional_puts_change_nothing_when_unmet(store)
                    .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn conditional_deletes_change_nothing_when_unmet() {
                let Some((store, _dir)) = $make else { return };
                crate::conformance::conditional::conditional_deletes_change_nothing_when_unmet(
                    store,
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn racing_conditional_writers_one_wins() {
                let Some((store, _dir)) = $make else { return };
                crate::conformance::conditional::racing_conditional_writers_one_wins(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn listing_pages_in_key_order() {
                let Some((store, _dir)) = $make else { return };
                crate::conformance::conditional::listing_pages_in_key_order(store).await;
            }

            proptest! {
                #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
                #[test]
                fn concurrent_writers_never_go_back(plans in plans()) {
                    runtime().block_on(async {
                        let Some((store, _dir)) = $make else { return };
                        crate::conformance::concurrent_writers_never_go_back(store, plans).await;
                    });
                }

                #[test]
                fn concurrent_writers_of_few_tokens_never_go_back(plans in plans_of_tokens(1..4)) {
                    runtime().block_on(async {
                        let Some((store, _dir)) = $make else { return };
                        crate::conformance::concurrent_writers_never_go_back(store, plans).await;
                    });
                }
            }
        }
    };
}

fn sled_store(max: usize) -> (SledStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = SledStoreConfig::new(dir.path());
    config.max_value_bytes = max;
    (SledStore::open(&config).expect("open sled"), dir)
}

backend_suite!(sled, Some(crate::conformance::sled_store(4096)), 4096);
backend_suite!(
    memory,
    Some((
        crate::memory_store::MemoryStore::with_max_value_bytes(4096),
        ()
    )),
    4096
);
// Skipped (with a message) without PostgreSQL's binaries, unless
// PALISADE_PG_STRICT is set.
backend_suite!(
    postgres,
    crate::postgres_store::test_server::store(4096).await,
    4096
);
