//! A policy reload reaches the calls that stay open. A renewal stream, a
//! watch and a waiting acquire were let through by the policy in force when
//! they arrived, and may stay open for up to an hour (a stream) or a
//! minute (a wait). Each carries a [`Revocation`]: what let it through (its
//! principal, what it presented, what it needed) and a subscription to the
//! policy in force (`LivePolicy::subscribe`). At every reload it is checked
//! again, at once, against the new policy; a call whose key (or
//! certificate) the new policy no longer knows, or whose principal lost the
//! right the call needed, ends with [`Revocation::revoked`]'s answer: 401
//! `unauthorized` ("the key was revoked") or 403 `forbidden`, in the call's
//! own framing (a watch's or acquire's answer, a stream's last line).
//!
//! (This is about the caller's rights; revoking a lease's grant is
//! `leases/revoke.rs`.)

use std::future::Future;
use std::sync::Arc;

use palisade_serve::policy::{Policy, Principal};
use tokio::sync::watch;

use super::credential::{Check, Credential};
use crate::error::ApiError;

/// What let an open call through, and the policies put in force since.
#[derive(Debug, Clone)]
pub(in crate::api) struct Revocation {
    granted: Arc<Granted>,
    /// The policy in force; its current value was seen when the call was
    /// let through (or checked since).
    changes: watch::Receiver<Arc<Policy>>,
}

/// What let a call through.
#[derive(Debug)]
struct Granted {
    principal: Principal,
    credential: Credential,
    check: Check,
}

impl Revocation {
    /// A call let through as `principal`, presenting `credential`, needing
    /// `check`, under the policy `changes` holds now.
    pub(super) fn new(
        principal: Principal,
        credential: Credential,
        check: Check,
        changes: watch::Receiver<Arc<Policy>>,
    ) -> Self {
        Self {
            granted: Arc::new(Granted {
                principal,
                credential,
                check,
            }),
            changes,
        }
    }

    /// Whether the call would still be let through under `policy`, as the
    /// same principal.
    fn holds(&self, policy: &Policy) -> Result<(), ApiError> {
        let Granted {
            principal,
            credential,
            check,
        } = self.granted.as_ref();
        match credential.identify(policy) {
            Ok(now) if now == *principal => {}
            _ => return Err(key_revoked()),
        }
        check.allows(policy, principal).map_err(|err| match err {
            ApiError::Forbidden(message) => ApiError::Forbidden(format!(
                "{message}: a policy reload took away the right this call was opened with"
            )),
            _ => key_revoked(),
        })
    }

    /// Whether the call is still let through by the policy in force now
    /// (before a step that changes something, such as a waiting acquire's
    /// proposal).
    pub(in crate::api) fn check_now(&self) -> Result<(), ApiError> {
        let policy = self.changes.borrow().clone();
        self.holds(&policy)
    }

    /// Resolves, with the answer the call ends with, once a reload puts in
    /// force a policy that would not let the call through; never before.
    pub(in crate::api) async fn revoked(&mut self) -> ApiError {
        loop {
            if self.changes.changed().await.is_err() {
                // The policy can no longer change.
                return std::future::pending().await;
            }
            let policy = self.changes.borrow_and_update().clone();
            if let Err(err) = self.holds(&policy) {
                tracing::debug!(
                    principal = %self.granted.principal.0,
                    %err,
                    "an open call ends: a policy reload revoked what let it through"
                );
                return err;
            }
        }
    }
}

/// 401: the call's key (or certificate) is no longer known, or names
/// another principal now.
fn key_revoked() -> ApiError {
    ApiError::Unauthorized(
        "the key was revoked: a policy reload no longer knows the API key (or client \
         certificate) this call was opened with"
            .into(),
    )
}

/// [`Revocation::revoked`] of a call that may carry none (a node without a
/// policy): never resolves without one.
pub(in crate::api) async fn revoked(revocation: Option<&mut Revocation>) -> ApiError {
    match revocation {
        Some(revocation) => revocation.revoked().await,
        None => std::future::pending().await,
    }
}

/// Runs `call` unless a reload revokes what let it through first (then
/// `call` is dropped, and the revocation's answer returned). Only for what
/// may be cut at any point: a wait, or a forwarded call.
pub(in crate::api) async fn unless_revoked<T>(
    revocation: Option<&mut Revocation>,
    call: impl Future<Output = T>,
) -> Result<T, ApiError> {
    tokio::select! {
        biased;
        err = revoked(revocation) => Err(err),
        done = call => Ok(done),
    }
}
