//! Acquire, renew and release: the calls that change who holds a lease.
//!
//! An acquire proposes `Acquire` and, once it applies, starts the grant's
//! deadline in the lessor and signs the JWT. A renewal writes nothing: it
//! confirms leadership with a quorum, then [`extend`]s the deadline. A
//! repeated acquire by the holder extends like a renewal. Release proposes
//! `Release`.

use std::time::Duration;

use axum::extract::State;
use axum::Json;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use palisade_names::{FencingToken, GrantSecret, LeaseName};
use rand::RngCore;
use serde::{Deserialize, Serialize};

use palisade_serve::policy::{Policy, Principal, Right};

use super::extract::{check_holder, check_token, check_wait, Checked, CheckedJson, LeaseCall};
use super::openapi::{ErrorBody, HolderParam, LeaseNameParam};
use super::state::ApiState;
use crate::command::{Command, CommandResult, SecretHash, Terms};
use crate::error::ApiError;
use crate::lease_table::LeaseRecord;
use crate::lessor::RenewRefused;
use crate::waiters::Bell;
use crate::ElectionConfig;

/// `POST /v1/leases/{name}/acquire`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct AcquireRequest {
    /// Who asks: 1..=256 characters, no control characters.
    #[schema(value_type = HolderParam)]
    holder: String,
    /// How long the grant lasts without renewal: within the node's
    /// `--min-ttl-ms..=--max-ttl-ms` (the schema states the defaults).
    #[schema(minimum = 500, maximum = 3_600_000)]
    ttl_ms: u64,
    /// Wait up to this long for a held lease (at most the node's max wait,
    /// 60 s).
    #[schema(maximum = 60_000)]
    wait_ms: Option<u64>,
    /// The grant's secret, chosen by the client (so that a retried acquire
    /// is recognised as the same client); the node makes one when absent.
    #[schema(value_type = Option<String>, pattern = "^[A-Za-z0-9_-]{32,128}$")]
    secret: Option<GrantSecret>,
    /// 0..=1000 (default 0). A waiting acquire of a higher priority than a
    /// preemptible holder's preempts it, and waiters queue by priority
    /// (then arrival). Equal priority never preempts.
    #[schema(maximum = 1000)]
    priority: Option<u32>,
    /// Whether a waiting acquire of a higher priority may preempt this
    /// grant (default false).
    preemptible: Option<bool>,
    /// After this grant expires (not after a release), the lease stays
    /// unavailable this long: 0..=60 000 (default 0).
    #[schema(maximum = 60_000)]
    lock_delay_ms: Option<u64>,
    /// The grant is renewed for at most this long after it was granted:
    /// 0 (default: no cap)..=86 400 000.
    #[schema(maximum = 86_400_000)]
    max_hold_ms: Option<u64>,
}

/// The highest acquire priority.
pub const MAX_PRIORITY: u32 = 1000;
/// The longest lock-delay.
pub const MAX_LOCK_DELAY_MS: u64 = 60_000;
/// The longest max-hold.
pub const MAX_HOLD_MS: u64 = 86_400_000;

impl AcquireRequest {
    fn terms(&self) -> Terms {
        Terms {
            priority: self.priority.unwrap_or(0),
            preemptible: self.preemptible.unwrap_or(false),
            lock_delay_ms: self.lock_delay_ms.unwrap_or(0),
            max_hold_ms: self.max_hold_ms.unwrap_or(0),
        }
    }
}

impl Checked for AcquireRequest {
    fn check(&self, config: &ElectionConfig) -> Result<(), ApiError> {
        check_holder(&self.holder)?;
        let terms = self.terms();
        if terms.priority > MAX_PRIORITY {
            return Err(ApiError::BadRequest(format!(
                "priority must be in 0..={MAX_PRIORITY}"
            )));
        }
        if terms.lock_delay_ms > MAX_LOCK_DELAY_MS {
            return Err(ApiError::BadRequest(format!(
                "lock_delay_ms must be in 0..={MAX_LOCK_DELAY_MS}"
            )));
        }
        if terms.max_hold_ms > MAX_HOLD_MS {
            return Err(ApiError::BadRequest(format!(
                "max_hold_ms must be in 0..={MAX_HOLD_MS}"
            )));
        }
        let (min, max) = config.ttl_range;
        let ttl = u128::from(self.ttl_ms);
        if ttl < min.as_millis() || ttl > max.as_millis() {
            return Err(ApiError::BadRequest(format!(
                "ttl_ms must be in {}..={}",
                min.as_millis(),
                max.as_millis()
            )));
        }
        check_wait(self.wait_ms.unwrap_or(0), config).map(|_| ())
    }
}

/// `POST /v1/leases/{name}/renew` and `.../release`: names one grant.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct HolderToken {
    /// The holder the grant was made to.
    #[schema(value_type = HolderParam)]
    holder: String,
    #[schema(value_type = u64)]
    token: FencingToken,
    /// The grant's `grant_index` as the holder's handle knows it (release
    /// only; see `LeaseRecord::grant_index`).
    #[serde(default)]
    grant_index: Option<u64>,
    /// The secret the acquire answered (required for grants that have one).
    #[schema(value_type = Option<String>, pattern = "^[A-Za-z0-9_-]{32,128}$")]
    secret: Option<GrantSecret>,
}

impl HolderToken {
    fn secret_hash(&self) -> Option<SecretHash> {
        self.secret.as_ref().map(SecretHash::of)
    }
}

impl Checked for HolderToken {
    fn check(&self, _config: &ElectionConfig) -> Result<(), ApiError> {
        check_holder(&self.holder)?;
        check_token(self.token)
    }
}

/// A grant, as acquire and renew answer it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct Grant {
    #[schema(value_type = String)]
    lease: LeaseName,
    holder: String,
    #[schema(value_type = u64)]
    token: FencingToken,
    ttl_ms: u64,
    /// The lease token: a JWT signed by the cluster's key.
    jwt: String,
    /// The id of the key that signed `jwt`.
    kid: String,
    /// The log index of the acquire this grant answers (release names it).
    grant_index: u64,
    /// The grant's secret: only in the answer to the acquire, never in a
    /// renewal, a read or an error.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    secret: Option<GrantSecret>,
}

/// A fresh grant secret: 256 bits from the OS RNG, base64url.
fn generate_secret() -> Result<GrantSecret, ApiError> {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    GrantSecret::new(&URL_SAFE_NO_PAD.encode(bytes))
        .map_err(|e| ApiError::Internal(format!("generated secret refused: {e}")))
}

/// What release answers.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct Released {
    #[schema(value_type = String)]
    lease: LeaseName,
    released: bool,
    #[schema(value_type = u64)]
    token: FencingToken,
}

/// Builds the answer for `lease`'s grant to `holder`, with a JWT that
/// covers its deadline (signed, or reused: [`crate::signing::TokenCache`]),
/// and `secret` for an acquire.
fn grant(
    state: &ApiState,
    lease: LeaseName,
    holder: String,
    token: FencingToken,
    ttl_ms: u64,
    grant_index: u64,
    secret: Option<GrantSecret>,
) -> Result<Json<Grant>, ApiError> {
    let signer = state.signer()?;
    let (jwt, signed) = state
        .jwts
        .jwt(&signer, &lease, &holder, token, ttl_ms)
        .map_err(|e| ApiError::Internal(format!("signing failed: {e}")))?;
    if signed {
        state.shared.metrics.jwt_signatures.inc();
    }
    Ok(Json(Grant {
        lease,
        holder,
        token,
        ttl_ms,
        jwt: jwt.to_string(),
        kid: signer.kid().to_owned(),
        grant_index,
        secret,
    }))
}

/// 409 `lost`: `request` does not name the current grant of `lease`.
fn not_held(request: &HolderToken, lease: &LeaseName) -> ApiError {
    ApiError::Lost(format!(
        "{} does not hold {} with token {}",
        request.holder, lease, request.token
    ))
}

/// The lessor found this node no longer leading between the commit and the
/// answer.
fn stopped_leading() -> ApiError {
    ApiError::NoQuorum("this node stopped leading; retry".into())
}

/// Grants the lease if it is free (or waits `wait_ms` for it).
#[utoipa::path(post, path = "/v1/leases/{name}/acquire", tag = "leases",
    params(("name" = LeaseNameParam, Path, description = "The lease")),
    request_body = AcquireRequest,
    responses((status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 429, body = ErrorBody), (status = 503, body = ErrorBody), (status = 200, body = Grant)))]
pub(super) async fn acquire(
    State(state): State<ApiState>,
    LeaseCall { lease, body }: LeaseCall<AcquireRequest>,
) -> Result<Json<Grant>, ApiError> {
    // Refuse before proposing anything when the cluster cannot sign yet, or
    // when a waiting call would go over this node's cap.
    state.signer()?;
    let _waiting = match body.wait_ms {
        Some(wait) if wait > 0 => Some(state.waiter()?),
        _ => None,
    };
    let terms = body.terms();
    let secret = match body.secret {
        Some(secret) => secret,
        None => generate_secret()?,
    };
    let hash = SecretHash::of(&secret);
    let waits = body.wait_ms.is_some_and(|w| w > 0);
    let deadline = tokio::time::Instant::now()
        + Duration::from_millis(body.wait_ms.unwrap_or(0)).min(state.config.max_wait);
    // A new name must fit under the cap on the table's size.
    let full = state.shared.read(|s| {
        !s.table.leases.contains_key(&lease) && s.table.leases.len() >= state.config.max_leases
    });
    if full {
        return Err(ApiError::TooManyLeases(format!(
            "the cluster holds {} leases, its cap; free leases are reclaimed {} s after they end",
            state.config.max_leases,
            state.config.reclaim_after.as_secs()
        )));
    }
    // Subscribed before the first look at the table, so no change is missed.
    let mut bell = state.shared.bells.subscribe(&lease);
    loop {
        // Blocking acquirers queue: while others are ahead and the lease is
        // free (being handed to the head), wait; a call that does not wait
        // is told who the lease is going to.
        if !bell.may_propose() && is_free(&state, &lease) {
            if !waits {
                return Err(handed_to_earlier_waiter(&state, &lease, &bell));
            }
            if !wait_until(
                &state,
                &lease,
                &body.holder,
                &mut bell,
                Turn::Mine,
                deadline,
            )
            .await
            {
                return Err(handed_to_earlier_waiter(&state, &lease, &bell));
            }
        }
        // A lease freed by the expiry of a grant with a lock-delay is held
        // back until the delay has passed on this leader's clock.
        let delay_seen = match lock_delay_left(&state, &lease) {
            Ok(seen) => seen,
            Err(left) => {
                if !waits || tokio::time::Instant::now() + left > deadline {
                    return Err(ApiError::LockDelay {
                        message: format!(
                            "{lease} expired with a lock-delay; free in {} ms",
                            left.as_millis()
                        ),
                        retry_after_ms: u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
                    });
                }
                tokio::time::sleep(left).await;
                continue;
            }
        };
        let command = Command::Acquire {
            lease: lease.clone(),
            holder: body.holder.clone(),
            ttl_ms: body.ttl_ms,
            secret: Some(hash),
            terms,
            preempt: waits && terms.priority > 0,
            delay_seen: Some(delay_seen),
        };
        match state.proposer.propose(command).await? {
            // An expiry with a lock-delay applied between the look above
            // and this entry: look again (wait it out, or answer 409).
            CommandResult::LockDelayed => continue,
            CommandResult::Granted {
                token,
                ttl_ms,
                new_grant: true,
                grant_index,
            } => {
                state
                    .lessor
                    .granted(&lease, token, Duration::from_millis(ttl_ms));
                let secret = Some(secret);
                return grant(
                    &state,
                    lease,
                    body.holder,
                    token,
                    ttl_ms,
                    grant_index,
                    secret,
                );
            }
            // The holder asked again for the grant it has: that extends it
            // like a renewal, and like a renewal it must not revive a grant
            // whose deadline has passed, for the `Expire` of that same token
            // may already be on its way through the log, or have applied since
            // this acquire did (found by the fault suite: the holder was told
            // it held a lease that was freed and granted to another 15 ms
            // later).
            CommandResult::Granted { token, .. } => {
                match extend(&state, &lease, &body.holder, token, Some(&hash)) {
                    Extended::Yes {
                        ttl_ms,
                        grant_index,
                    } => {
                        let secret = Some(secret);
                        let holder = body.holder;
                        return grant(&state, lease, holder, token, ttl_ms, grant_index, secret);
                    }
                    Extended::No(RenewRefused::NotLeader) => return Err(stopped_leading()),
                    Extended::NotHeld
                    | Extended::Revoked
                    | Extended::Preempted(_)
                    | Extended::No(RenewRefused::Expired | RenewRefused::MaxHold) => {
                        // Wait for the Expire to free the lease, then ask
                        // for a fresh grant (with a new token).
                        // (The loop's first check sends it to the queue
                        // if others queued meanwhile.)
                        let settle = tokio::time::Instant::now() + state.config.quorum_timeout;
                        if !wait_until(
                            &state,
                            &lease,
                            &body.holder,
                            &mut bell,
                            Turn::Any,
                            settle.max(deadline),
                        )
                        .await
                        {
                            return Err(ApiError::NoQuorum(format!(
                                "the previous grant of {lease} is expiring; retry"
                            )));
                        }
                    }
                }
            }
            // Preempting: the holder learns it on its next renewal and lets
            // go (or its grant runs out); this call waits at the head of the
            // queue, as the highest priority.
            CommandResult::Held { holder, token } | CommandResult::Preempting { holder, token } => {
                if !waits {
                    return Err(ApiError::Held { holder, token });
                }
                bell.queue(&body.holder, terms.priority);
                if !wait_until(
                    &state,
                    &lease,
                    &body.holder,
                    &mut bell,
                    Turn::Mine,
                    deadline,
                )
                .await
                {
                    return Err(held_now(&state, &lease, &bell, holder, token));
                }
            }
            other => return Err(ApiError::Internal(format!("acquire answered {other:?}"))),
        }
    }
}

fn is_free(state: &ApiState, lease: &LeaseName) -> bool {
    state
        .shared
        .read(|s| s.table.leases.get(lease).is_none_or(|r| r.holder.is_none()))
}

/// Whether `lease` is free, and whether it is reserved for `holder` by a
/// handover (which `holder` takes whatever the queue).
fn free_or_reserved_for(state: &ApiState, lease: &LeaseName, holder: &str) -> (bool, bool) {
    state.shared.read(|s| match s.table.leases.get(lease) {
        None => (true, false),
        Some(r) => (r.holder.is_none(), r.reserved_for(holder)),
    })
}

/// Whether `lease` is held back by the lock-delay of the grant whose expiry
/// freed it: `Err(time left)`, or `Ok(what the acquire's `delay_seen`
/// carries)` — the freeing change's `modify_index` when it was lock-delayed
/// and the delay has passed, 0 when there was none. One read, so the two
/// agree.
fn lock_delay_left(state: &ApiState, lease: &LeaseName) -> Result<u64, Duration> {
    let delayed = state.shared.read(|s| {
        s.table
            .leases
            .get(lease)
            .filter(|r| r.holder.is_none() && r.lock_delayed)
            .map(|r| (r.modify_index, r.terms.lock_delay_ms))
    });
    let Some((modify_index, delay)) = delayed else {
        return Ok(0);
    };
    let left = state
        .lessor
        .lock_delay_left(lease, modify_index, Duration::from_millis(delay));
    if left.is_zero() {
        Ok(modify_index)
    } else {
        Err(left)
    }
}

/// Waits until `lease` is free and, with `Turn::Mine`, this call may
/// propose (it heads the queue, or nobody queues), or until it is reserved
/// for `holder`; or until `deadline`.
/// True if that came. Wakes only for changes to this lease and its queue.
async fn wait_until(
    state: &ApiState,
    lease: &LeaseName,
    holder: &str,
    bell: &mut Bell,
    turn: Turn,
    deadline: tokio::time::Instant,
) -> bool {
    loop {
        let (free, reserved_for_me) = free_or_reserved_for(state, lease, holder);
        if reserved_for_me || (free && (turn == Turn::Any || bell.may_propose())) {
            return true;
        }
        if tokio::time::timeout_at(deadline, bell.rung())
            .await
            .is_err()
        {
            return false;
        }
    }
}

/// Whose turn a waiting acquire waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// Its own place in the queue.
    Mine,
    /// Anyone's: just the lease being free.
    Any,
}

/// 409 `held` for a call whose wait ended: the holder now, or (the lease
/// being free) the earlier waiter it is being handed to — never a holder
/// that has already left.
fn held_now(
    state: &ApiState,
    lease: &LeaseName,
    bell: &Bell,
    holder: String,
    token: FencingToken,
) -> ApiError {
    let record = state.shared.read(|s| s.table.leases.get(lease).cloned());
    match record {
        Some(LeaseRecord {
            holder: Some(holder),
            token,
            ..
        }) => ApiError::Held { holder, token },
        Some(record) => ApiError::Held {
            holder: bell.head_holder().unwrap_or(holder),
            token: record.token,
        },
        None => ApiError::Held {
            holder: bell.head_holder().unwrap_or(holder),
            token,
        },
    }
}

/// 409 `held` for a call that found the lease free but others queued first.
fn handed_to_earlier_waiter(state: &ApiState, lease: &LeaseName, bell: &Bell) -> ApiError {
    let token = state
        .shared
        .read(|s| s.table.leases.get(lease).map(|r| r.token))
        .unwrap_or_default();
    held_now(state, lease, bell, String::new(), token)
}

/// Extends a grant by its ttl (leader confirmed with a quorum).
#[utoipa::path(post, path = "/v1/leases/{name}/renew", tag = "leases",
    params(("name" = LeaseNameParam, Path, description = "The lease")),
    request_body = HolderToken,
    responses((status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 429, body = ErrorBody), (status = 503, body = ErrorBody), (status = 200, body = Grant)))]
pub(super) async fn renew(
    State(state): State<ApiState>,
    LeaseCall { lease, body }: LeaseCall<HolderToken>,
) -> Result<Json<Grant>, ApiError> {
    let started = std::time::Instant::now();
    let answer = renew_now(&state, lease, body).await;
    if answer.is_ok() {
        let metrics = &state.shared.metrics;
        metrics.renewals.inc();
        metrics
            .renew_seconds
            .observe(started.elapsed().as_secs_f64());
    }
    answer
}

async fn renew_now(
    state: &ApiState,
    lease: LeaseName,
    body: HolderToken,
) -> Result<Json<Grant>, ApiError> {
    // A renewal writes nothing, but only a confirmed leader may answer it.
    state.confirm_leadership().await?;
    renew_confirmed(state, lease, body)
}

/// Renews `body`'s grant of `lease` on a leader that confirmed its
/// leadership after the renewal arrived.
fn renew_confirmed(
    state: &ApiState,
    lease: LeaseName,
    body: HolderToken,
) -> Result<Json<Grant>, ApiError> {
    let presented = body.secret_hash();
    match extend(state, &lease, &body.holder, body.token, presented.as_ref()) {
        Extended::Yes {
            ttl_ms,
            grant_index,
        } => grant(
            state,
            lease,
            body.holder,
            body.token,
            ttl_ms,
            grant_index,
            None,
        ),
        Extended::NotHeld => Err(not_held(&body, &lease)),
        Extended::Revoked => Err(ApiError::Lost(format!(
            "the grant of {lease} was revoked; it ends at its deadline"
        ))),
        Extended::No(RenewRefused::Expired) => Err(ApiError::Lost(format!(
            "the lease {lease} expired before this renewal"
        ))),
        Extended::Preempted(by) => Err(ApiError::Preempted(format!(
            "{by} preempted the grant of {lease}: stop, and release it (it ends at its deadline)"
        ))),
        Extended::No(RenewRefused::MaxHold) => Err(ApiError::MaxHold(format!(
            "the grant of {lease} reached its max-hold; it ends at its deadline"
        ))),
        Extended::No(RenewRefused::NotLeader) => Err(stopped_leading()),
    }
}

/// The most renewals one batch may carry (its body, like every body, is
/// at most 64 KiB: about 400 renewals with typical names, 100 with the
/// longest; the SDK splits by both).
pub const MAX_BATCH_RENEWALS: usize = 256;

/// `POST /v1/renew`: many renewals in one request.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RenewBatch {
    /// 1..=256 renewals, answered in this order.
    #[schema(min_items = 1, max_items = 256)]
    renewals: Vec<BatchRenewal>,
}

/// One renewal of a batch: a lease and the grant it names.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct BatchRenewal {
    #[schema(value_type = LeaseNameParam)]
    lease: LeaseName,
    /// The holder the grant was made to.
    #[schema(value_type = HolderParam)]
    holder: String,
    #[schema(value_type = u64)]
    token: FencingToken,
    /// The secret the acquire answered (required for grants that have one).
    #[schema(value_type = Option<String>, pattern = "^[A-Za-z0-9_-]{32,128}$")]
    secret: Option<GrantSecret>,
}

/// A batch is checked whole: one malformed renewal (a bad name, holder or
/// token) refuses it all with 400, as the schema says, and renews nothing.
impl Checked for RenewBatch {
    fn check(&self, _config: &ElectionConfig) -> Result<(), ApiError> {
        if self.renewals.is_empty() || self.renewals.len() > MAX_BATCH_RENEWALS {
            return Err(ApiError::BadRequest(format!(
                "renewals must hold 1..={MAX_BATCH_RENEWALS} entries"
            )));
        }
        for (i, renewal) in self.renewals.iter().enumerate() {
            check_holder(&renewal.holder)
                .and_then(|()| check_token(renewal.token))
                .map_err(|e| ApiError::BadRequest(format!("renewals[{i}]: {e}")))?;
        }
        Ok(())
    }
}

/// What a batch renewal answers: one result per renewal, in order.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct RenewResults {
    results: Vec<RenewResult>,
}

/// One renewal's answer: the status a single renewal would have had, and
/// the grant (200) or the error's fields.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct RenewResult {
    #[schema(value_type = String)]
    lease: LeaseName,
    status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    grant: Option<Grant>,
    /// The error code (`lost`, `forbidden`).
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
}

/// Renews many grants with one quorum confirmation (a client's "session"
/// of leases, like the many keys of one etcd lease). Each renewal is
/// answered on its own, exactly as `/v1/leases/{name}/renew` would answer
/// it; the request fails as a whole only when it is malformed or
/// leadership cannot be confirmed. Under a policy each renewal needs the
/// `acquire` right on its lease (a refused one is that renewal's 403).
#[utoipa::path(post, path = "/v1/renew", tag = "leases",
    request_body = RenewBatch,
    responses((status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 429, body = ErrorBody), (status = 503, body = ErrorBody), (status = 200, body = RenewResults)))]
pub(super) async fn renew_batch(
    State(state): State<ApiState>,
    principal: Option<axum::Extension<Principal>>,
    CheckedJson(body): CheckedJson<RenewBatch>,
) -> Result<Json<RenewResults>, ApiError> {
    let started = std::time::Instant::now();
    state.confirm_leadership().await?;
    let policy = state.config.policy.as_deref();
    let mut renewed = 0;
    let results = body
        .renewals
        .into_iter()
        .map(|renewal| {
            let BatchRenewal {
                lease: name,
                holder,
                token,
                secret,
            } = renewal;
            let grant = HolderToken {
                holder,
                token,
                grant_index: None,
                secret,
            };
            let answer = batch_renewal(&state, policy, principal.as_deref(), name.clone(), grant);
            match answer {
                Ok(Json(grant)) => {
                    renewed += 1;
                    RenewResult {
                        lease: name,
                        status: 200,
                        grant: Some(grant),
                        error: None,
                        message: None,
                    }
                }
                Err(err) => {
                    let (status, body) = err.status_and_body();
                    let field = |f: &str| body[f].as_str().map(str::to_owned);
                    RenewResult {
                        status: status.as_u16(),
                        error: field("error"),
                        message: field("message"),
                        lease: name,
                        grant: None,
                    }
                }
            }
        })
        .collect();
    let metrics = &state.shared.metrics;
    metrics.renew_batches.inc();
    metrics.renewals.inc_by(renewed);
    metrics
        .renew_seconds
        .observe(started.elapsed().as_secs_f64());
    Ok(Json(RenewResults { results }))
}

/// One renewal of a (checked) batch, authorized as its own request would
/// be.
fn batch_renewal(
    state: &ApiState,
    policy: Option<&Policy>,
    principal: Option<&Principal>,
    lease: LeaseName,
    grant: HolderToken,
) -> Result<Json<Grant>, ApiError> {
    if let Some(policy) = policy {
        let principal = principal
            .ok_or_else(|| ApiError::Internal("a policy without an authenticated caller".into()))?;
        policy.allow(principal, Right::Acquire, lease.as_str())?;
    }
    renew_confirmed(state, lease, grant)
}

/// How [`extend`] went.
enum Extended {
    Yes {
        ttl_ms: u64,
        grant_index: u64,
    },
    NotHeld,
    /// The grant was revoked: it runs out at its deadline.
    Revoked,
    /// The grant was preempted (by this holder): it runs out at its
    /// deadline.
    Preempted(String),
    No(RenewRefused),
}

/// Extends `holder`'s grant `token` of `lease` by its ttl (a renewal, or a
/// repeated acquire), if `presented` opens it. The table check and the lessor's decision happen in
/// one step under the applied state's read lock, so no `Expire` can apply
/// in between: otherwise the lessor, which stops tracking a grant once the
/// table shows it freed, would start that freed grant afresh and the holder
/// would be told it holds a lease another may be granted next (found by a
/// targeted test under CPU load).
fn extend(
    state: &ApiState,
    lease: &LeaseName,
    holder: &str,
    token: FencingToken,
    presented: Option<&SecretHash>,
) -> Extended {
    state.shared.read(|s| match s.table.leases.get(lease) {
        Some(r)
            if r.holder.as_deref() == Some(holder) && r.token == token && r.opens(presented) =>
        {
            if let Some(by) = &r.preempted_by {
                return Extended::Preempted(by.clone());
            }
            if r.revoked {
                return Extended::Revoked;
            }
            let ttl = Duration::from_millis(r.ttl_ms);
            let max_hold =
                (r.terms.max_hold_ms > 0).then(|| Duration::from_millis(r.terms.max_hold_ms));
            match state.lessor.renew(lease, token, ttl, max_hold) {
                Ok(()) => Extended::Yes {
                    ttl_ms: r.ttl_ms,
                    grant_index: r.grant_index,
                },
                Err(refused) => Extended::No(refused),
            }
        }
        _ => Extended::NotHeld,
    })
}

/// Frees a grant.
#[utoipa::path(post, path = "/v1/leases/{name}/release", tag = "leases",
    params(("name" = LeaseNameParam, Path, description = "The lease")),
    request_body = HolderToken,
    responses((status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 429, body = ErrorBody), (status = 503, body = ErrorBody), (status = 200, body = Released)))]
pub(super) async fn release(
    State(state): State<ApiState>,
    LeaseCall { lease, body }: LeaseCall<HolderToken>,
) -> Result<Json<Released>, ApiError> {
    let command = Command::Release {
        lease: lease.clone(),
        holder: body.holder.clone(),
        token: body.token,
        grant_index: body.grant_index,
        secret: body.secret_hash(),
    };
    match state.proposer.propose(command).await? {
        CommandResult::Freed => Ok(Json(Released {
            lease,
            released: true,
            token: body.token,
        })),
        CommandResult::Lost => Err(not_held(&body, &lease)),
        other => Err(ApiError::Internal(format!("release answered {other:?}"))),
    }
}

/// `POST /v1/leases/{name}/handover`: the holder names its successor.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct HandoverRequest {
    /// The current holder.
    #[schema(value_type = HolderParam)]
    holder: String,
    /// Its grant's token.
    #[schema(value_type = u64)]
    token: FencingToken,
    /// Its grant's secret.
    #[schema(value_type = Option<String>, pattern = "^[A-Za-z0-9_-]{32,128}$")]
    secret: Option<GrantSecret>,
    /// The successor: another holder name.
    #[schema(value_type = HolderParam)]
    to: String,
    /// How long the lease waits for the successor's acquire:
    /// 500..=60 000 (default 10 000). Unclaimed, the reservation expires
    /// and the lease is free.
    #[schema(minimum = 500, maximum = 60_000)]
    window_ms: Option<u64>,
}

/// The default and bounds of a handover's reservation window.
const HANDOVER_WINDOW_MS: (u64, u64, u64) = (500, 10_000, 60_000);

impl Checked for HandoverRequest {
    fn check(&self, _config: &ElectionConfig) -> Result<(), ApiError> {
        check_holder(&self.holder)?;
        check_token(self.token)?;
        check_holder(&self.to).map_err(|e| ApiError::BadRequest(format!("to: {e}")))?;
        if self.to == self.holder {
            // Well-formed, but not a change this lease can make: 409.
            return Err(ApiError::Conflict(
                "a handover names another holder than the current one".into(),
            ));
        }
        let (min, _, max) = HANDOVER_WINDOW_MS;
        if self.window_ms.is_some_and(|w| !(min..=max).contains(&w)) {
            return Err(ApiError::BadRequest(format!(
                "window_ms must be in {min}..={max}"
            )));
        }
        Ok(())
    }
}

/// What a handover answers.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct HandedOver {
    #[schema(value_type = String)]
    lease: LeaseName,
    /// The successor.
    to: String,
    /// The successor's fencing token (higher than the old holder's): its
    /// acquire is granted with it.
    #[schema(value_type = u64)]
    token: FencingToken,
    /// How long the lease is reserved for the successor.
    window_ms: u64,
}

/// Hands the lease to a named successor: the caller's grant ends at once
/// (its renewals are refused from now on), and a grant with a higher token
/// is reserved for the successor, which takes it with an acquire (waiting
/// or not) within `window_ms`; nobody else can take the lease in between.
/// Under a policy the caller needs `acquire` on the lease.
#[utoipa::path(post, path = "/v1/leases/{name}/handover", tag = "leases",
    params(("name" = LeaseNameParam, Path, description = "The lease")),
    request_body = HandoverRequest,
    responses((status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 429, body = ErrorBody), (status = 503, body = ErrorBody), (status = 200, body = HandedOver)))]
pub(super) async fn handover(
    State(state): State<ApiState>,
    LeaseCall { lease, body }: LeaseCall<HandoverRequest>,
) -> Result<Json<HandedOver>, ApiError> {
    let window_ms = body.window_ms.unwrap_or(HANDOVER_WINDOW_MS.1);
    let command = Command::Handover {
        lease: lease.clone(),
        holder: body.holder.clone(),
        token: body.token,
        secret: body.secret.as_ref().map(SecretHash::of),
        to: body.to.clone(),
        window_ms,
    };
    match state.proposer.propose(command).await? {
        CommandResult::HandedOver { token } => {
            state
                .lessor
                .granted(&lease, token, Duration::from_millis(window_ms));
            Ok(Json(HandedOver {
                lease,
                to: body.to,
                token,
                window_ms,
            }))
        }
        CommandResult::Lost => Err(ApiError::Lost(format!(
            "{} does not hold {lease} with token {} (or it was revoked)",
            body.holder, body.token
        ))),
        other => Err(ApiError::Internal(format!("handover answered {other:?}"))),
    }
}

/// `POST /v1/leases/{name}/revoke`: names the grant by its token.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RevokeRequest {
    #[schema(value_type = u64)]
    token: FencingToken,
}

impl Checked for RevokeRequest {
    fn check(&self, _config: &ElectionConfig) -> Result<(), ApiError> {
        check_token(self.token)
    }
}

/// What revoke answers.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct Revoked {
    #[schema(value_type = String)]
    lease: LeaseName,
    revoked: bool,
    #[schema(value_type = u64)]
    token: FencingToken,
    /// When the grant runs out, as the leader sees it.
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_in_ms: Option<u64>,
}

/// An operator's way to end a grant without its secret (etcd's
/// `LeaseRevoke`): renewals stop at once, and the lease is free once the
/// grant's current deadline passes — never earlier, so a holder that still
/// believes it holds is never overlapped (S3).
#[utoipa::path(post, path = "/v1/leases/{name}/revoke", tag = "leases",
    params(("name" = LeaseNameParam, Path, description = "The lease")),
    request_body = RevokeRequest,
    responses((status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 429, body = ErrorBody), (status = 503, body = ErrorBody), (status = 200, body = Revoked)))]
pub(super) async fn revoke(
    State(state): State<ApiState>,
    LeaseCall { lease, body }: LeaseCall<RevokeRequest>,
) -> Result<Json<Revoked>, ApiError> {
    let command = Command::Revoke {
        lease: lease.clone(),
        token: body.token,
    };
    match state.proposer.propose(command).await? {
        CommandResult::Revoked => Ok(Json(Revoked {
            expires_in_ms: state.lessor.remaining_ms(&lease, body.token),
            lease,
            revoked: true,
            token: body.token,
        })),
        CommandResult::Lost => Err(ApiError::Lost(format!(
            "{lease} is not held with token {}",
            body.token
        ))),
        other => Err(ApiError::Internal(format!("revoke answered {other:?}"))),
    }
}
