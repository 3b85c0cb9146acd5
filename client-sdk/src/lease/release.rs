//! Giving a grant back: the release a dropped, preempted or lapsed lease
//! sends, holding the release gate of its lease and holder so this client's
//! next acquire of them waits for it.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::shared::Shared;
use crate::error::Error;

/// The release of `shared`'s grant, holding the release gate of its lease
/// and holder from this call on (taken now, not when the future first
/// runs), so this client's next acquire of them waits for it. Spawn it: it
/// must outlive the handle.
pub(super) fn gated_release(
    shared: Arc<Shared>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    gated_release_within(shared, Duration::ZERO)
}

/// [`gated_release`], retried while the cluster answers `Unavailable`
/// until `patience` has passed (once, with none).
fn gated_release_within(
    shared: Arc<Shared>,
    patience: Duration,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let until = Instant::now() + patience;
    let gate = shared
        .transport
        .release_gate(&shared.id.lease, &shared.id.holder);
    let taken = gate.clone().try_lock_owned().ok();
    async move {
        let _guard = match taken {
            Some(guard) => guard,
            None => gate.lock_owned().await,
        };
        let mut pause = Duration::from_millis(100);
        loop {
            let released = shared.transport.release_grant(&shared.id).await;
            if !matches!(released, Err(Error::Unavailable { .. })) || Instant::now() + pause > until
            {
                return;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }
}

/// The safe deadline passed with no renewal answered: the lease is lost
/// here, and its grant is given back (unless taken with a lock-delay).
///
/// Without the release, the grant stays in the table until the leader
/// expires it; but every new leader treats a live grant as renewed at its
/// takeover, so while leadership moves faster than the ttl (a loaded
/// machine's elections, a partition's failovers) an abandoned grant never
/// expires and no one else can be granted the lease. The release frees it
/// at the next commit instead. It is safe: this holder has stopped
/// believing it holds the lease before the release is sent, the release
/// names the grant by token, secret and grant index (a later grant is
/// never released by it), and it holds the release gate, taken before the
/// loss is known, so this client's next acquire of the lease waits for it.
///
/// The cluster may be unreachable at that moment (the loss is often why the
/// renewals failed): the release is retried while the answer is
/// `Unavailable`, for three ttls (at least 5 s, at most a minute), and this
/// client's next acquire of the lease waits for it meanwhile, as it could
/// not be granted while the old grant stands anyway.
pub(super) fn lapse(shared: &Arc<Shared>) {
    let patience = (shared.ttl * 3).clamp(Duration::from_secs(5), Duration::from_secs(60));
    let release = (!shared.lock_delayed).then(|| gated_release_within(shared.clone(), patience));
    shared.mark_lost("the safe deadline passed without a successful renewal".into());
    if let Some(release) = release {
        tokio::spawn(release);
    }
}
