//! The conformance checks of a [`FencingAudit`]: it counts a lease's
//! refusals and keeps the last, lists the most recently refused first, and
//! keeps leases apart.

use crate::audit::{FencingAudit, Refusal};

fn refusal(token: u64, at_unix_ms: u64) -> Refusal {
    Refusal {
        token,
        fence: token + 1,
        holder: format!("holder-{token}"),
        key: format!("k/{token}"),
        peer: (token % 2 == 0).then(|| "127.0.0.1:5000".to_owned()),
        at_unix_ms,
    }
}

pub(crate) async fn an_audit_counts_and_keeps_the_last(audit: impl FencingAudit) {
    assert_eq!(audit.refusals("jobs").await.expect("read"), None);
    audit
        .record("jobs", &refusal(3, 1_000))
        .await
        .expect("record");
    audit
        .record("jobs", &refusal(4, 2_000))
        .await
        .expect("record");
    audit
        .record("other", &refusal(7, 1_500))
        .await
        .expect("record");
    let jobs = audit.refusals("jobs").await.expect("read").expect("kept");
    assert_eq!((jobs.lease.as_str(), jobs.count), ("jobs", 2));
    assert_eq!(jobs.last, refusal(4, 2_000));
    let other = audit.refusals("other").await.expect("read").expect("kept");
    assert_eq!((other.count, other.last.peer.as_deref()), (1, None));
    let recent = audit.recent(10).await.expect("recent");
    let leases: Vec<&str> = recent.iter().map(|r| r.lease.as_str()).collect();
    assert_eq!(leases, ["jobs", "other"], "the latest refused first");
    assert_eq!(audit.recent(1).await.expect("recent").len(), 1);
}

macro_rules! audit_suite {
    ($module:ident, $make:expr) => {
        mod $module {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn an_audit_counts_and_keeps_the_last() {
                let Some((audit, _keep)) = $make else { return };
                crate::conformance::audit::an_audit_counts_and_keeps_the_last(audit).await;
            }
        }
    };
}

audit_suite!(memory, Some((crate::audit::MemoryAudit::default(), ())));
// Skipped (with a message) without PostgreSQL's binaries, unless
// PALISADE_PG_STRICT is set.
audit_suite!(
    postgres,
    crate::postgres_store::test_server::store(4096).await
);

/// Past its capacity, the memory audit forgets the lease refused longest
/// ago, not the newest.
#[tokio::test]
async fn the_memory_audit_forgets_the_oldest_lease_first() {
    let audit = crate::audit::MemoryAudit::with_capacity(2);
    audit.record("a", &refusal(1, 100)).await.expect("record");
    audit.record("b", &refusal(2, 300)).await.expect("record");
    audit.record("a", &refusal(3, 400)).await.expect("record");
    audit.record("c", &refusal(4, 500)).await.expect("record");
    assert_eq!(
        audit.refusals("b").await.expect("read"),
        None,
        "b was the oldest"
    );
    assert_eq!(
        audit.refusals("a").await.expect("read").map(|r| r.count),
        Some(2)
    );
    assert!(audit.refusals("c").await.expect("read").is_some());
}
