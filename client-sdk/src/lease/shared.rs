//! [`Shared`]: what a lease's handle, its renewer and its release share.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade_plumbing::sync::lock;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::Error;
use crate::model::GrantId;
use crate::renew_queue::RenewQueue;
use crate::transport::Transport;

/// A held lease's state, shared by its handle, its renewer and its release.
#[derive(Debug)]
pub(super) struct Shared {
    /// The client's HTTP client: gateway writes, releases, handovers.
    pub(super) transport: Arc<Transport>,
    /// The client's renewal queue.
    pub(super) renewals: Arc<RenewQueue>,
    /// The grant this handle holds, with its secret and the acquire's index.
    pub(super) id: GrantId,
    /// The ttl of the grant as first acquired (renewals follow the
    /// leader's answer).
    pub(super) ttl: Duration,
    /// Taken with a lock-delay: a lapsed grant is left to expire (a
    /// release would clear the delay the holder asked for).
    pub(super) lock_delayed: bool,
    pub(super) state: Mutex<State>,
    /// The last JWT `palisade.prove` accepted (cached in the database), so
    /// fenced transactions prove each JWT once.
    #[cfg(feature = "postgres")]
    pub(super) proven: Mutex<Option<String>>,
    /// Flips to true once, when the lease is lost or released.
    pub(super) lost: watch::Sender<bool>,
}

#[derive(Debug, Clone)]
pub(super) struct State {
    pub(super) jwt: String,
    pub(super) deadline: Instant,
    /// Why the lease is lost ([`Error::LeaseLost`] or [`Error::Preempted`]).
    pub(super) lost: Option<Error>,
}

impl Shared {
    pub(super) fn state(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.state)
    }

    pub(super) fn mark_lost(&self, reason: String) {
        self.mark_lost_as(Error::LeaseLost(reason));
    }

    /// Marks the lease lost with `error` as what later calls answer.
    pub(super) fn mark_lost_as(&self, error: Error) {
        self.mark_gone(error, false);
    }

    /// Marks the lease let go on purpose (`released`, `dropped`, `handed
    /// over`): later calls answer it as lost, but it is said at INFO, not
    /// warned about as a loss.
    pub(super) fn mark_let_go(&self, reason: String) {
        self.mark_gone(Error::LeaseLost(reason), true);
    }

    pub(super) fn mark_gone(&self, error: Error, on_purpose: bool) {
        let mut state = self.state();
        if state.lost.is_none() {
            let (lease, token) = (&self.id.lease, self.id.token);
            match (on_purpose, &error) {
                (true, Error::LeaseLost(how)) => tracing::info!(%lease, token, "lease {how}"),
                _ => tracing::warn!(%lease, token, %error, "lease lost"),
            }
            state.lost = Some(error);
        }
        drop(state);
        self.lost.send_replace(true);
    }

    /// Its safe deadline passed and nothing marked it lost yet (the
    /// renewer has not noticed): a handle dropped now gives the grant back.
    pub(super) fn lapsed_unmarked(&self) -> bool {
        let state = self.state();
        state.lost.is_none() && Instant::now() >= state.deadline
    }

    /// The JWT if the lease is held now; the reason otherwise.
    pub(super) fn held_jwt(&self) -> Result<String, Error> {
        let state = self.state();
        if let Some(error) = &state.lost {
            return Err(error.clone());
        }
        if Instant::now() >= state.deadline {
            return Err(Error::LeaseLost("the safe deadline has passed".into()));
        }
        Ok(state.jwt.clone())
    }
}
