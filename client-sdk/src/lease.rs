//! [`Lease`]: a held lease that renews itself and knows when to stop.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
#[cfg(feature = "postgres")]
use palisade_plumbing::sync::lock;
use serde_json::Value;
use tokio::sync::watch;
use tokio::time::Instant;

mod release;
mod shared;

use crate::error::Error;
use crate::model::{Grant, GrantId, Object};
use crate::renew_queue::RenewQueue;
use crate::transport::config::ClientConfig;
use crate::transport::Transport;
use release::{gated_release, lapse};
use shared::{Shared, State};

/// A held lease. While [`Lease::is_held`] is true no other holder has been
/// granted it (S3): the local deadline is the send time of the last
/// acknowledged acquire or renew, plus the ttl, minus a drift margin, on this
/// process's monotonic clock — which the leader's deadline always exceeds.
///
/// A background task renews every `ttl * renew_ratio`. The lease is lost when a
/// renewal is refused, when the deadline passes without one (even if this
/// process was frozen: `is_held` compares with the clock, not with a flag), or
/// when a write is fenced. [`Lease::lost`] resolves then. Dropping the handle
/// stops renewing and releases the lease, best effort.
#[derive(Debug)]
pub struct Lease {
    shared: Arc<Shared>,
    renewer: tokio::task::JoinHandle<()>,
}

impl Lease {
    pub(crate) fn start(
        transport: Arc<Transport>,
        renewals: Arc<RenewQueue>,
        (grant, sent): (Grant, Instant),
        lock_delayed: bool,
    ) -> Self {
        let ttl = Duration::from_millis(grant.ttl_ms);
        let margin = margin_for(&transport.config, ttl);
        let (lost, _) = watch::channel(false);
        let jwt = grant.jwt.clone();
        let shared = Arc::new(Shared {
            transport,
            renewals,
            id: grant.id(),
            ttl,
            lock_delayed,
            #[cfg(feature = "postgres")]
            proven: Mutex::new(None),
            state: Mutex::new(State {
                jwt,
                deadline: sent + ttl - margin,
                lost: None,
            }),
            lost,
        });
        let renewer = tokio::spawn(renew_loop(shared.clone()));
        Self { shared, renewer }
    }

    /// The lease name.
    pub fn name(&self) -> &str {
        &self.shared.id.lease
    }

    /// The holder this lease was granted to.
    pub fn holder(&self) -> &str {
        &self.shared.id.holder
    }

    /// The fencing token of this grant.
    pub fn token(&self) -> u64 {
        self.shared.id.token
    }

    /// What names this grant, with its secret: hand it to another process
    /// that must renew or release it (it is as powerful as this handle).
    pub fn id(&self) -> GrantId {
        self.shared.id.clone()
    }

    /// The current lease JWT, while held.
    pub fn jwt(&self) -> Option<String> {
        self.shared.held_jwt().ok()
    }

    /// Whether the lease is held now (see the type's docs for the guarantee).
    pub fn is_held(&self) -> bool {
        self.shared.held_jwt().is_ok()
    }

    /// The safe local deadline.
    pub fn deadline(&self) -> Instant {
        self.shared.state().deadline
    }

    /// Resolves once the lease is lost (or released).
    pub async fn lost(&self) {
        let mut lost = self.shared.lost.subscribe();
        let _ = lost.wait_for(|&l| l).await;
    }

    /// Raises the gateway fence of this lease to its token.
    ///
    /// # Errors
    /// As [`Lease::put`].
    pub async fn fence(&self) -> Result<u64, Error> {
        let answer = self
            .gateway_write(
                reqwest::Method::POST,
                &format!("/v1/fences/{}", self.shared.id.lease),
                &[],
                None,
            )
            .await?;
        Ok(answer["fence"].as_u64().unwrap_or(0))
    }

    /// Reads `key` through the gateway (reads are not fenced); the same as
    /// [`crate::Client::get_object`].
    ///
    /// # Errors
    /// [`Error::Unavailable`].
    pub async fn get(&self, key: &str) -> Result<Option<Object>, Error> {
        self.shared.transport.get_object(key).await
    }

    /// One fenced gateway request with this lease's JWT (refused locally
    /// once it is not held); a stale token marks the lease lost.
    pub(crate) async fn gateway_write(
        &self,
        method: reqwest::Method,
        path: &str,
        headers: &[(&'static str, String)],
        body: Option<Bytes>,
    ) -> Result<Value, Error> {
        let jwt = self.shared.held_jwt()?;
        let written = self
            .shared
            .transport
            .gateway_write(&jwt, method, path, headers, body)
            .await;
        let Err(error) = written else {
            return written;
        };
        if let Error::Fenced { token, fence } = &error {
            self.shared.mark_lost(format!(
                "fenced at the gateway: token {token} is below fence {fence}"
            ));
        }
        Err(error)
    }

    /// Begins a transaction on `client` fenced in PostgreSQL with this
    /// lease's JWT (`palisade.fence(name, jwt)`, after
    /// [`crate::postgres::install`] and [`crate::postgres::set_keys`]), with
    /// `idle_in_transaction_session_timeout` set to the lease's ttl for it
    /// (SET LOCAL: a holder frozen inside the transaction loses its session,
    /// so the next holder's raise does not wait for it forever). Each new
    /// JWT (renewals bring new ones) is first proven once with
    /// `palisade.prove`, outside the transaction, so the database checks its
    /// signature once. Write, then commit it; check [`Lease::is_held`]
    /// before committing if the transaction ran long.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] locally, with nothing sent, once the lease is not
    /// held; [`Error::Fenced`] when the database's fence is above the token —
    /// a newer holder has fenced; the lease is marked lost, as for a fenced
    /// gateway write; [`Error::Unauthorized`] when the database refuses the
    /// JWT (`PF007`: e.g. signed by a key it does not know yet — run `palisade
    /// sql keys`); [`Error::BadRequest`] for a lease name PostgreSQL's fence
    /// refuses; [`Error::Database`], [`Error::Unavailable`]. Nothing is left
    /// open on an error (the transaction is rolled back).
    #[cfg(feature = "postgres")]
    pub async fn fenced_transaction<'c>(
        &self,
        client: &'c mut tokio_postgres::Client,
    ) -> Result<tokio_postgres::Transaction<'c>, Error> {
        let jwt = self.shared.held_jwt()?;
        let (lease, token) = (self.name(), self.token());
        crate::postgres::check(lease, token)?;
        let proven = lock(&self.shared.proven).as_deref() == Some(jwt.as_str());
        if !proven {
            crate::postgres::prove(client, &jwt).await?;
            *lock(&self.shared.proven) = Some(jwt.clone());
        }
        let tx = client
            .transaction()
            .await
            .map_err(crate::postgres::database)?;
        let proof = crate::postgres::Proof::Jwt(&jwt);
        let fenced = crate::postgres::call_fence(&tx, lease, proof, Some(self.shared.ttl)).await;
        match fenced {
            Ok(_) => Ok(tx),
            Err(error) => {
                // Rolled back by the drop as well; this waits for it.
                let _ = tx.rollback().await;
                if let Error::Fenced { .. } = &error {
                    self.shared.mark_lost(format!(
                        "fenced in PostgreSQL: token {token} is below the fence"
                    ));
                }
                Err(error)
            }
        }
    }

    /// Hands the lease to `successor`: this handle stops holding it at
    /// once (writes through it are refused from now on, and it is not
    /// renewed), the leader ends the grant and reserves one with a higher
    /// token for `successor`, whose acquire (waiting or not) takes it
    /// within the reservation window (10 s). Returns the successor's token.
    /// If the handover cannot be made the lease is released instead (this
    /// handle has let go either way).
    ///
    /// # Errors
    /// [`Error::BadRequest`] for yourself or a bad name (then nothing
    /// changed and the lease is still held); [`Error::LeaseLost`] if the
    /// lease was no longer held; [`Error::Unavailable`].
    pub async fn handover_to(&self, successor: &str) -> Result<u64, Error> {
        if successor == self.holder() || successor.is_empty() {
            return Err(Error::BadRequest(format!(
                "a handover names another holder than {:?}",
                self.holder()
            )));
        }
        let was_held = self.shared.held_jwt();
        self.renewer.abort();
        self.shared
            .mark_let_go(format!("handed over to {successor:?}"));
        was_held?;
        let handed = self
            .shared
            .transport
            .handover(&self.shared.id, successor)
            .await;
        // Any failure lets go instead: a grant preempted meanwhile (the
        // handover answers `lost` for it) must be released for its
        // preemptor, and a release of a grant that is gone changes nothing.
        if handed.is_err() {
            let _ = self.shared.transport.release_grant(&self.shared.id).await;
        }
        handed
    }

    /// Stops renewing and releases the lease.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if it was no longer held; [`Error::Unavailable`].
    pub async fn release(self) -> Result<(), Error> {
        // Drop then sees the lease marked lost and does not release again.
        self.release_shared().await
    }

    /// As [`Lease::release`], through a handle others share (an `Arc` a
    /// server's connections still hold): stops renewing and releases now;
    /// the handle answers as lost from then on, and dropping it later
    /// releases nothing.
    ///
    /// # Errors
    /// As [`Lease::release`].
    pub async fn release_shared(&self) -> Result<(), Error> {
        self.renewer.abort();
        let was_held = self.shared.held_jwt().is_ok();
        self.shared.mark_let_go("released".into());
        let released = self.shared.transport.release_grant(&self.shared.id).await;
        match released {
            Err(Error::LeaseLost(_)) if !was_held => Ok(()),
            other => other,
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.renewer.abort();
        // A lease whose deadline passed unnoticed (the holder saw the loss
        // first) is given back as its renewer would have (`lapse`).
        if self.shared.lapsed_unmarked() && tokio::runtime::Handle::try_current().is_ok() {
            lapse(&self.shared);
            return;
        }
        // Otherwise only a lease still held is released: one lost at its
        // safe deadline was given back by its renewer already, one refused
        // or released needs nothing.
        let held = self.shared.held_jwt().is_ok();
        self.shared.mark_let_go("dropped".into());
        if !held {
            return;
        }
        // Best effort: release if a runtime is still around. The gate, taken
        // now, makes the next acquire of this lease and holder wait for it.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(gated_release(self.shared.clone()));
        }
    }
}

/// The drift margin for `ttl`: `ttl * drift_margin_ratio`, at least 1 ms.
fn margin_for(config: &ClientConfig, ttl: Duration) -> Duration {
    ttl.mul_f64(config.drift_margin_ratio.clamp(0.0, 0.9))
        .max(Duration::from_millis(1))
}

/// Renews every `ttl * renew_ratio`; retries failures quickly until the
/// deadline; marks the lease lost on refusal or when the deadline passes.
async fn renew_loop(shared: Arc<Shared>) {
    let renew_every =
        |ttl: Duration| ttl.mul_f64(shared.transport.config.renew_ratio.clamp(0.05, 0.9));
    let mut every = renew_every(shared.ttl);
    let mut next = Instant::now() + every;
    loop {
        let deadline = shared.state().deadline;
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = tokio::time::sleep_until(deadline) => {
                if Instant::now() >= shared.state().deadline {
                    lapse(&shared);
                    return;
                }
                continue;
            }
        }
        let sent = Instant::now();
        if sent >= shared.state().deadline {
            lapse(&shared);
            return;
        }
        // Each attempt gets a slice of the time left, then another node is
        // asked too (`hedge.rs`); should every node stay silent, the
        // deadline wins the race, so loss is reported on time.
        let deadline = shared.state().deadline;
        let renewed = tokio::select! {
            renewed = shared.renewals.renew(&shared.id, deadline) => renewed,
            () = tokio::time::sleep_until(deadline) => {
                lapse(&shared);
                return;
            }
        };
        match renewed {
            Ok(grant) => {
                // The leader extended the grant by the ttl it answers (the
                // grant's, which a repeated acquire may have lengthened):
                // that, not the ttl first asked for, bounds the deadline.
                let ttl = Duration::from_millis(grant.ttl_ms);
                let margin = margin_for(&shared.transport.config, ttl);
                let mut state = shared.state();
                // Never move the deadline past what this renewal guarantees.
                state.deadline = state.deadline.max(sent + ttl - margin);
                state.jwt = grant.jwt;
                drop(state);
                every = renew_every(ttl);
                next = sent + every;
            }
            Err(Error::LeaseLost(reason)) => {
                shared.mark_lost(format!("renewal refused: {reason}"));
                return;
            }
            Err(Error::Preempted(reason)) => {
                // Let go at once: the candidate waits for this release, not
                // for the grant's deadline. The release runs on a task of
                // its own, so the holder dropping this handle on the loss
                // (this task is aborted then) does not cut it short; and it
                // holds the release gate, taken before the loss is known,
                // so the holder's next acquire of this lease waits for it.
                let release = gated_release(shared.clone());
                shared.mark_lost_as(Error::Preempted(reason));
                tokio::spawn(release);
                return;
            }
            Err(err) => {
                tracing::debug!(lease = %shared.id.lease, %err, "renewal failed; retrying");
                next = Instant::now() + Duration::from_millis(50);
            }
        }
    }
}
