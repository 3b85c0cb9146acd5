//! Many renewals share one quorum confirmation (ReadIndex round).
//!
//! A renewal must be answered only by a leader that a quorum still follows,
//! confirmed *after* the renewal arrived. So, as with group commit: a caller
//! waits for a round that started after it called; one task runs rounds back
//! to back while anybody waits, and every caller that arrived while a round
//! ran is served by the next one. Under load one round serves many renewals.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::LinearizerOption;
use tokio::sync::{watch, Notify};

use super::Raft;

/// The outcome of the last finished round: its number and whether it
/// confirmed leadership (the error text otherwise).
type Round = (u64, Result<(), String>);

/// Batches leadership confirmations.
#[derive(Debug)]
pub struct ReadBatcher {
    started: AtomicU64,
    finished: watch::Sender<Round>,
    wanted: Notify,
}

impl ReadBatcher {
    /// Starts the task that runs rounds on `raft`, each bounded by `timeout`.
    /// The task stops when `raft` shuts down and the batcher is dropped.
    pub fn start(raft: Arc<Raft>, timeout: Duration) -> (Arc<Self>, tokio::task::JoinHandle<()>) {
        let (finished, _) = watch::channel((0, Ok(())));
        let this = Arc::new(Self {
            started: AtomicU64::new(0),
            finished,
            wanted: Notify::new(),
        });
        let shared = this.clone();
        // ReadIndex: a quorum must acknowledge a heartbeat sent after the
        // round began (sent at once). openraft's `ReadPolicy::ReadIndex`
        // waits only one leader lease (the election timeout's maximum, 60-120
        // ms) for it; a follower acknowledges only once its own log fsync in
        // flight is done, so on a loaded machine rounds failed and renewals
        // (and the holder's news of a preemption) were 503s: the fault
        // suite's late preemptions (TESTING.md). Waiting longer changes no
        // guarantee, only the patience.
        let read_index =
            LinearizerOption::new(Some(Duration::ZERO), true).with_wait_timeout(timeout);
        let task = tokio::spawn(async move {
            loop {
                shared.wanted.notified().await;
                let number = shared.started.fetch_add(1, Ordering::SeqCst) + 1;
                let outcome = match tokio::time::timeout(
                    timeout,
                    raft.ensure_linearizable(read_index.clone()),
                )
                .await
                {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(err)) => Err(format!("cannot confirm leadership: {err}")),
                    Err(_) => Err("cannot confirm leadership: no quorum".to_owned()),
                };
                let _previous = shared.finished.send_replace((number, outcome));
            }
        });
        (this, task)
    }

    /// Waits for a round that started after this call; its outcome.
    ///
    /// # Errors
    /// The round's failure (not leader, no quorum).
    pub async fn confirm(&self) -> Result<(), String> {
        let needed = self.started.load(Ordering::SeqCst) + 1;
        let mut finished = self.finished.subscribe();
        self.wanted.notify_one();
        let round = finished
            .wait_for(|(number, _)| *number >= needed)
            .await
            .map_err(|_| "leadership confirmation stopped".to_owned())?;
        round.1.clone()
    }
}
