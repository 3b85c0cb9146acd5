//! [`Elector`]: run a task only while holding a lease (what client-go's
//! leader election gives Go users, with fencing).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::client::Client;
use crate::error::Error;
use crate::lease::Lease;

/// What an [`Elector`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ElectorEvent {
    /// This process leads, with this fencing token.
    StartedLeading {
        /// The token of the grant.
        token: u64,
    },
    /// This process stopped leading; the task was cancelled.
    StoppedLeading {
        /// Why.
        reason: String,
    },
    /// The lease changed hands (seen through the watch API).
    LeaderChanged {
        /// The new holder, `None` when free.
        holder: Option<String>,
    },
}

/// Campaigns for a lease, runs the task while leading, cancels it the moment
/// leadership is lost, and campaigns again.
///
/// The callback rules (client-go users trip on exactly these):
/// - `StoppedLeading` comes once after each `StartedLeading`, and never
///   without one: a process that never led gets no `StoppedLeading`.
/// - It is sent after the task has returned (its token is cancelled first
///   and the elector waits for it), so no task code runs after it.
/// - The reason is `lease lost`, `shutting down`, or `task finished` (the
///   task returned by itself: the lease is released and the elector
///   campaigns again).
/// - `LeaderChanged` comes from a separate watch and is not ordered with
///   the other two: it may name this holder before or after
///   `StartedLeading`, and it is sent for other holders and for a free
///   lease (`None`).
///
/// ```no_run
/// # async fn demo() {
/// use std::time::Duration;
/// use palisade_client::{CancellationToken, Client, ClientConfig, Elector};
///
/// let client = Client::new(ClientConfig::new(["http://127.0.0.1:7001"]));
/// let shutdown = CancellationToken::new();
/// Elector::new(client, "scheduler", "replica-1", Duration::from_secs(3))
///     .run(None, shutdown, |lease, cancelled| async move {
///         while !cancelled.is_cancelled() && lease.is_held() {
///             // ... lead ...
///             tokio::time::sleep(Duration::from_millis(100)).await;
///         }
///     })
///     .await;
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Elector {
    client: Client,
    lease: String,
    holder: String,
    ttl: Duration,
}

impl Elector {
    /// An elector for `lease` as `holder`.
    pub fn new(
        client: Client,
        lease: impl Into<String>,
        holder: impl Into<String>,
        ttl: Duration,
    ) -> Self {
        Self {
            client,
            lease: lease.into(),
            holder: holder.into(),
            ttl,
        }
    }

    /// Runs until `shutdown` is cancelled: campaign, lead (running `task`
    /// with a token cancelled on loss), repeat. Events go to `events`.
    pub async fn run<F, Fut>(
        self,
        events: Option<mpsc::UnboundedSender<ElectorEvent>>,
        shutdown: CancellationToken,
        mut task: F,
    ) where
        F: FnMut(Arc<Lease>, CancellationToken) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let emit = |event: ElectorEvent| {
            if let Some(events) = &events {
                let _ = events.send(event);
            }
        };
        let watcher = events.clone().map(|events| {
            tokio::spawn(watch_holder(
                self.client.clone(),
                self.lease.clone(),
                events,
            ))
        });
        while !shutdown.is_cancelled() {
            let acquired = tokio::select! {
                () = shutdown.cancelled() => break,
                acquired = self.client.acquire(&self.lease, &self.holder, self.ttl, Some(Duration::from_secs(10))) => acquired,
            };
            let lease = match acquired {
                Ok(lease) => Arc::new(lease),
                Err(Error::Held { .. }) => continue,
                Err(err) => {
                    tracing::debug!(%err, "campaign failed; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            emit(ElectorEvent::StartedLeading {
                token: lease.token(),
            });
            let cancelled = CancellationToken::new();
            let mut running = tokio::spawn(task(lease.clone(), cancelled.clone()));
            let reason = tokio::select! {
                () = lease.lost() => "lease lost".to_owned(),
                () = shutdown.cancelled() => "shutting down".to_owned(),
                _ = &mut running => "task finished".to_owned(),
            };
            cancelled.cancel();
            let _ = running.await;
            emit(ElectorEvent::StoppedLeading { reason });
            if let Ok(lease) = Arc::try_unwrap(lease) {
                let _ = lease.release().await;
            }
        }
        if let Some(watcher) = watcher {
            watcher.abort();
        }
    }
}

/// Reports every change of holder, through the watch API.
async fn watch_holder(client: Client, lease: String, events: mpsc::UnboundedSender<ElectorEvent>) {
    let mut index = 0;
    let mut last: Option<Option<String>> = None;
    loop {
        match client.watch(&lease, index, Duration::from_secs(30)).await {
            Ok(info) => {
                index = info.modify_index;
                if last.as_ref() != Some(&info.holder) {
                    last = Some(info.holder.clone());
                    if events
                        .send(ElectorEvent::LeaderChanged {
                            holder: info.holder,
                        })
                        .is_err()
                    {
                        return;
                    }
                }
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}
