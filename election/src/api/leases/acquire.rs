//! `POST /v1/leases/{name}/acquire`: grant a free lease, or wait for it in
//! the queue (by priority, then arrival), or preempt a lower priority.

use std::time::Duration;

use axum::extract::State;
use axum::{Extension, Json};
use http::HeaderMap;
use palisade_serve::admission::{Pool, Seat};
use palisade_serve::policy::Principal;

use super::super::admit::{seat, Flow, OVER_SHARE_HEADER};
use super::super::extract::{parse_json, LeaseCall};
use super::super::revocation::{unless_revoked, Revocation};
use super::super::schema::{LeaseCallErrors, LeaseNameParam};
use super::super::state::ApiState;
use super::answer::*;
use super::bodies::*;
use super::extend::*;
use super::queue::*;
use crate::error::ApiError;
use crate::leader::lessor::RenewRefused;
use crate::lease_table::command::{Command, CommandResult, SecretHash, Terms};
use crate::peer::gate::PeerId;
use crate::waiters::Bell;
use palisade_names::{FencingToken, GrantSecret, LeaseName};

/// Grants the lease if it is free (or waits `wait_ms` for it).
#[utoipa::path(post, path = "/v1/leases/{name}/acquire", tag = "leases",
    params(("name" = LeaseNameParam, Path, description = "The lease")),
    request_body = AcquireRequest,
    responses(LeaseCallErrors, (status = 200, body = Grant)))]
pub(in crate::api) async fn acquire(
    State(state): State<ApiState>,
    principal: Option<Extension<Principal>>,
    revocation: Option<Extension<Revocation>>,
    flow: Option<Extension<Flow>>,
    peer: Option<Extension<PeerId>>,
    headers: HeaderMap,
    LeaseCall { lease, body }: LeaseCall<AcquireRequest>,
) -> Result<Json<Grant>, ApiError> {
    // Refuse before proposing anything when the cluster cannot sign yet.
    state.group(&lease).signer()?;
    // A waiting call takes a seat of calls that wait (this node's cap and
    // its flow's share). Without one — refused here, or by the follower
    // that forwarded it — it is still answered if it can be at once: a
    // holder asking again for a grant whose answer it lost gets it back,
    // else it would hold the lease while those queued behind it hold every
    // seat, and nobody would be served until the waits ran out.
    let (_waiting, refused) = match body.wait_ms {
        Some(wait) if wait > 0 => match over_share_upstream(peer.is_some(), &headers) {
            Some(refused) => (None, Some(refused)),
            None => match waiting_seat(&state, flow.as_ref().map(|f| &f.0)) {
                Ok(seats) => (Some(seats), None),
                Err(refused) => (None, Some(refused)),
            },
        },
        _ => (None, None),
    };
    check_room(&state, &lease)?;
    if let Some(Extension(principal)) = &principal {
        check_quota(&state, &lease, principal)?;
    }
    let secret = match body.secret.clone() {
        Some(secret) => secret,
        None => generate_secret()?,
    };
    let hash = SecretHash::of(&secret);
    // Refused a waiting seat, a call for a lease that is not the caller's
    // grant (another holder, or another secret) is answered 429 at once,
    // without an entry in the log.
    let refused = match refused {
        Some(refused) if !answerable_at_once(&state, &lease, body.holder.as_str(), Some(&hash)) => {
            return Err(refused)
        }
        refused => refused,
    };
    // A call refused its seat waits no more than one that does not wait.
    let waits = body.wait_ms.is_some_and(|w| w > 0) && refused.is_none();
    let wait = match waits {
        true => Duration::from_millis(body.wait_ms.unwrap_or(0)).min(state.config.max_wait),
        false => Duration::ZERO,
    };
    // Subscribed before the first look at the table, so no change is missed.
    let bell = state.group(&lease).applied.bells.subscribe(&lease);
    let call = Acquisition {
        hash,
        secret,
        terms: body.terms(),
        waits,
        deadline: tokio::time::Instant::now() + wait,
        state,
        lease,
        body,
        bell,
        principal: principal.map(|Extension(Principal(name))| name),
        revocation: revocation.map(|Extension(r)| r),
    };
    match (call.run().await, refused) {
        // It would have had to wait: the refusal of its seat is the answer.
        (Err(ApiError::Held { .. } | ApiError::LockDelay { .. }), Some(refused)) => Err(refused),
        (answer, _) => answer,
    }
}

/// Whether this node's table says an acquire of `lease` by `holder` under
/// the secret whose hash is `hash` may be answered at once: the lease is
/// free, or it is the caller's own grant.
fn answerable_at_once(
    state: &ApiState,
    lease: &LeaseName,
    holder: &str,
    hash: Option<&SecretHash>,
) -> bool {
    state.group(lease).applied.read(|s| {
        let Some(record) = s.table.leases.get(lease) else {
            return true;
        };
        match &record.holder {
            None => true,
            Some(held_by) => {
                *held_by == *holder && hash.is_some() && record.secret.as_ref() == hash
            }
        }
    })
}

/// What a node forwarding an acquire to the leader needs to know of it
/// ([`super::super::forward`]): how long it may wait there, and whether
/// this node's table says it may be answered at once (only those go on
/// without a waiting seat).
#[derive(Debug, Clone, Copy, Default)]
pub(in crate::api) struct Forwarding {
    /// Its `wait_ms`, at most this node's `max_wait`.
    pub(in crate::api) wait: Duration,
    /// [`answerable_at_once`] for its lease, holder and secret.
    pub(in crate::api) at_once: bool,
}

/// Reads an acquire of `lease` as its handler will (the same body type and
/// JSON rules): a body that does not parse waits nothing and is not
/// answerable at once — the leader refuses it with the handler's 400.
pub(in crate::api) fn forwarding(state: &ApiState, lease: &LeaseName, body: &[u8]) -> Forwarding {
    let Ok(ask) = parse_json::<AcquireRequest>(body) else {
        return Forwarding::default();
    };
    let hash = ask.secret.as_ref().map(SecretHash::of);
    Forwarding {
        wait: Duration::from_millis(ask.wait_ms.unwrap_or(0)).min(state.config.max_wait),
        at_once: answerable_at_once(state, lease, ask.holder.as_str(), hash.as_ref()),
    }
}

/// The seats a waiting call holds while it waits: one of this node's
/// waiters, and one of its flow's share of the seats of calls that wait.
fn waiting_seat(
    state: &ApiState,
    flow: Option<&Flow>,
) -> Result<(tokio::sync::OwnedSemaphorePermit, Option<Seat>), ApiError> {
    let permit = state.waiter()?;
    let seat = flow
        .map(|flow| seat(state, &state.admission, flow, Pool::Long))
        .transpose()?;
    Ok((permit, seat))
}

/// The refusal of a call that a forwarding follower had no waiting seat
/// for (it forwarded it to be answered at once), if this is one; only a
/// peer's word counts.
fn over_share_upstream(from_peer: bool, headers: &HeaderMap) -> Option<ApiError> {
    (from_peer && headers.contains_key(OVER_SHARE_HEADER)).then(|| {
        ApiError::over_share(
            "over its share of the forwarding node's seats for calls that wait; \
             retry shortly",
        )
    })
}

/// A new name must fit under the cap on the table's size.
fn check_room(state: &ApiState, lease: &LeaseName) -> Result<(), ApiError> {
    // Over every partition, as this node has applied each (a partition it
    // follows may lag by the entries in flight).
    let known = state
        .group(lease)
        .applied
        .read(|s| s.table.leases.contains_key(lease));
    let full = !known
        && state
            .groups()
            .iter()
            .map(|g| g.applied.read(|s| s.table.leases.len()))
            .sum::<usize>()
            >= state.config.max_leases;
    if full {
        return Err(ApiError::TooManyLeases(format!(
            "the cluster holds {} leases, its cap; free leases are reclaimed {} s after they end",
            state.config.max_leases,
            state.config.reclaim_after.as_secs()
        )));
    }
    Ok(())
}

/// Under a policy, a grant that would make the caller own one more lease
/// must fit under its quota (its policy entry's `max_leases`, else the
/// node's `--max-leases-per-principal`). A lease it already owns is not one
/// more.
fn check_quota(state: &ApiState, lease: &LeaseName, principal: &Principal) -> Result<(), ApiError> {
    let quota = state
        .config
        .policy
        .as_ref()
        .and_then(|policy| policy.current().max_leases(principal))
        .unwrap_or(state.config.max_leases_per_principal as u64);
    let Principal(name) = principal;
    let adds = state.group(lease).applied.read(|s| {
        s.table
            .leases
            .get(lease)
            .is_none_or(|r| r.owner.as_deref() != Some(name.as_str()))
    });
    let owned = adds.then(|| {
        state
            .groups()
            .iter()
            .map(|g| g.applied.read(|s| s.table.owned_by(name)))
            .sum::<u64>()
    });
    match owned {
        Some(owned) if owned >= quota => Err(ApiError::OverQuota(format!(
            "{name} owns {owned} leases, its quota; a free lease stops counting once \
             reclaimed ({} s after it ends)",
            state.config.reclaim_after.as_secs()
        ))),
        _ => Ok(()),
    }
}

/// One acquire call, from its first look at the table to its answer.
struct Acquisition {
    state: ApiState,
    lease: LeaseName,
    body: AcquireRequest,
    /// The grant's secret (the caller's, or a fresh one) and its hash.
    secret: GrantSecret,
    hash: SecretHash,
    terms: Terms,
    /// Whether the call waits (`wait_ms` > 0), and until when.
    waits: bool,
    deadline: tokio::time::Instant,
    /// This lease's wakeups and the call's place in its queue.
    bell: Bell,
    /// The caller's principal, under a policy.
    principal: Option<String>,
    /// What let the call through, under a policy: a reload that revokes it
    /// ends the call's waits, and it proposes nothing after.
    revocation: Option<Revocation>,
}

/// What to do after a step of the call.
enum Step {
    /// Look at the table again.
    Again,
    /// Answer.
    Answer(Result<Json<Grant>, ApiError>),
}

impl Acquisition {
    async fn run(mut self) -> Result<Json<Grant>, ApiError> {
        loop {
            self.wait_for_turn().await?;
            let Some(delay_seen) = self.wait_out_lock_delay().await? else {
                continue;
            };
            if let Some(revocation) = &self.revocation {
                revocation.check_now()?;
            }
            let command = Command::Acquire {
                lease: self.lease.clone(),
                holder: self.body.holder.clone(),
                ttl_ms: self.body.ttl_ms,
                secret: Some(self.hash),
                terms: self.terms,
                preempt: self.waits && self.terms.priority > 0,
                delay_seen: Some(delay_seen),
                principal: self.principal.clone(),
            };
            let step = match self
                .state
                .group(&self.lease)
                .proposer
                .propose(command)
                .await?
            {
                // An expiry with a lock-delay applied between the look and
                // this entry: look again (wait it out, or answer 409).
                CommandResult::LockDelayed => Step::Again,
                CommandResult::Granted {
                    token,
                    ttl_ms,
                    new_grant: true,
                    grant_index,
                } => Step::Answer(self.new_grant(token, ttl_ms, grant_index)),
                CommandResult::Granted { token, .. } => self.repeated(token).await,
                CommandResult::Held { holder, token }
                | CommandResult::Preempting { holder, token } => {
                    self.queue(holder.to_string(), token).await
                }
                other => Step::Answer(Err(ApiError::Internal(format!(
                    "acquire answered {other:?}"
                )))),
            };
            if let Step::Answer(answer) = step {
                return answer;
            }
        }
    }

    /// Blocking acquirers queue: while others are ahead and the lease is
    /// free (being handed to the head), wait; a call that does not wait is
    /// told who the lease is going to.
    async fn wait_for_turn(&mut self) -> Result<(), ApiError> {
        let state = &self.state;
        if self.bell.may_propose() || !is_free(state, &self.lease) {
            return Ok(());
        }
        let lease = &self.lease;
        let who = Claimant {
            holder: &self.body.holder,
            principal: self.principal.as_deref(),
        };
        if self.waits {
            let turn = wait_until(state, lease, who, &mut self.bell, Turn::Mine, self.deadline);
            if unless_revoked(self.revocation.as_mut(), turn).await?? {
                return Ok(());
            }
        }
        Err(handed_to_earlier_waiter(state, lease, &self.bell))
    }

    /// A lease freed by the expiry of a grant with a lock-delay is held back
    /// until the delay has passed on this leader's clock: the `delay_seen`
    /// to propose, or `None` after sleeping the delay out (look again).
    async fn wait_out_lock_delay(&mut self) -> Result<Option<u64>, ApiError> {
        match lock_delay_left(&self.state, &self.lease) {
            Ok(seen) => Ok(Some(seen)),
            Err(left) => {
                if !self.waits || tokio::time::Instant::now() + left > self.deadline {
                    return Err(ApiError::LockDelay {
                        message: format!(
                            "{} expired with a lock-delay; free in {} ms",
                            self.lease,
                            left.as_millis()
                        ),
                        retry_after_ms: u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
                    });
                }
                unless_revoked(self.revocation.as_mut(), tokio::time::sleep(left)).await?;
                Ok(None)
            }
        }
    }

    /// A new grant: its deadline starts now, on the leader's clock.
    fn new_grant(
        &self,
        token: FencingToken,
        ttl_ms: u64,
        index: u64,
    ) -> Result<Json<Grant>, ApiError> {
        self.state.group(&self.lease).lessor.track_grant(
            &self.lease,
            token,
            Duration::from_millis(ttl_ms),
        );
        let (lease, holder) = (self.lease.clone(), self.body.holder.clone());
        let secret = Some(self.secret.clone());
        answer_grant(&self.state, lease, holder, token, ttl_ms, index, secret)
    }

    /// The holder asked again for the grant it has: that extends it like a
    /// renewal, and like a renewal it must not revive a grant whose deadline
    /// has passed, for the `Expire` of that same token may already be on its
    /// way through the log, or have applied since this acquire did.
    async fn repeated(&mut self, token: FencingToken) -> Step {
        let state = &self.state;
        let (lease, holder) = (&self.lease, &self.body.holder);
        match extend(state, lease, holder, token, Some(&self.hash)) {
            Extended::Yes {
                ttl_ms,
                grant_index,
            } => {
                let secret = Some(self.secret.clone());
                let (lease, holder) = (lease.clone(), holder.clone());
                Step::Answer(answer_grant(
                    state,
                    lease,
                    holder,
                    token,
                    ttl_ms,
                    grant_index,
                    secret,
                ))
            }
            Extended::No(RenewRefused::NotLeader) => Step::Answer(Err(stopped_leading())),
            ended => {
                // A revoked, preempted or maxed-out grant runs to its
                // deadline, which may be far: if it has not ended by the
                // end of the wait, say why (409), as a renewal would; an
                // expired one is freed by its Expire within a commit.
                let lasting = match ended {
                    Extended::Revoked => Some(ApiError::Lost(format!(
                        "the grant of {lease} was revoked; it ends at its deadline"
                    ))),
                    Extended::Preempted(by) => Some(ApiError::Preempted(format!(
                        "{by} preempted the grant of {lease}; it ends at its deadline"
                    ))),
                    Extended::No(RenewRefused::MaxHold) => Some(ApiError::MaxHold(format!(
                        "the grant of {lease} reached its max-hold; it ends at its deadline"
                    ))),
                    _ => None,
                };
                // Wait for the Expire to free the lease, then ask for a fresh
                // grant (with a new token); the next look sends the call to
                // the queue if others queued meanwhile.
                let settle = tokio::time::Instant::now() + state.config.quorum_timeout;
                let until = settle.max(self.deadline);
                let who = Claimant {
                    holder,
                    principal: self.principal.as_deref(),
                };
                let expired = wait_until(state, lease, who, &mut self.bell, Turn::Any, until);
                match unless_revoked(self.revocation.as_mut(), expired)
                    .await
                    .and_then(|waited| waited)
                {
                    Ok(true) => Step::Again,
                    Ok(false) => Step::Answer(Err(lasting.unwrap_or_else(|| {
                        ApiError::NoQuorum(format!(
                            "the previous grant of {lease} is expiring; retry"
                        ))
                    }))),
                    Err(deposed) => Step::Answer(Err(deposed)),
                }
            }
        }
    }

    /// Held (or being preempted for this call: the holder learns it on its
    /// next renewal and lets go, or its grant runs out): a waiting call
    /// queues by priority; the highest waits at the head.
    async fn queue(&mut self, holder: String, token: FencingToken) -> Step {
        if !self.waits {
            return Step::Answer(Err(ApiError::Held { holder, token }));
        }
        self.bell.queue(&self.body.holder, self.terms.priority);
        let (state, lease) = (&self.state, &self.lease);
        let deadline = self.deadline;
        let who = Claimant {
            holder: &self.body.holder,
            principal: self.principal.as_deref(),
        };
        let turn = wait_until(state, lease, who, &mut self.bell, Turn::Mine, deadline);
        match unless_revoked(self.revocation.as_mut(), turn)
            .await
            .and_then(|waited| waited)
        {
            Ok(true) => Step::Again,
            Ok(false) => Step::Answer(Err(held_now(state, lease, &self.bell, holder, token))),
            Err(deposed) => Step::Answer(Err(deposed)),
        }
    }
}
