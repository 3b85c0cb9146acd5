//! `POST /v1/leases/{name}/renew`, and each renewal of a batch
//! (`batch.rs`): no log write and no quorum round of their own: answered on
//! the leader lease (`raft::lease`), then the grant is extended by the
//! renewal rule (`extend.rs`).

use axum::extract::State;
use axum::Json;
use palisade_names::LeaseName;

use palisade_serve::policy::{Policy, Principal, Right};

use super::super::extract::LeaseCall;
use super::super::schema::{LeaseCallErrors, LeaseNameParam};
use super::super::state::ApiState;
use super::answer::*;
use super::bodies::*;
use super::extend::*;
use crate::error::ApiError;
use crate::leader::lessor::RenewRefused;
use crate::lease_table::command::SecretHash;

/// Extends a grant by its ttl (on the leader lease).
#[utoipa::path(post, path = "/v1/leases/{name}/renew", tag = "leases",
    params(("name" = LeaseNameParam, Path, description = "The lease")),
    request_body = HolderToken,
    responses(LeaseCallErrors, (status = 200, body = Grant)))]
pub(in crate::api) async fn renew(
    State(state): State<ApiState>,
    LeaseCall { lease, body }: LeaseCall<HolderToken>,
) -> Result<Json<Grant>, ApiError> {
    let started = std::time::Instant::now();
    let answer = renew_now(&state, lease, body).await;
    if answer.is_ok() {
        state.metrics.renewed(1, started.elapsed());
    }
    answer
}

pub(in crate::api) async fn renew_now(
    state: &ApiState,
    lease: LeaseName,
    body: HolderToken,
) -> Result<Json<Grant>, ApiError> {
    let presented = body.secret_hash();
    if let Some(ended) = ended(state, &lease, &body.holder, body.token, presented.as_ref()) {
        return answer_extended(state, lease, body, ended);
    }
    // A renewal writes nothing, but only a leader whose lease holds may
    // answer it.
    state.group(&lease).confirm_lease().await?;
    renew_confirmed(state, lease, body)
}

/// Whether every one of `renewals` names a grant that ended for good
/// ([`ended`]): their answers need no leader lease.
pub(in crate::api) fn all_ended(state: &ApiState, renewals: &[BatchRenewal]) -> bool {
    renewals.iter().all(|r| {
        let presented = r.secret.as_ref().map(SecretHash::of);
        ended(state, &r.lease, &r.holder, r.token, presented.as_ref()).is_some()
    })
}

/// Renews `body`'s grant of `lease` on a leader whose lease held after the
/// renewal arrived.
pub(in crate::api) fn renew_confirmed(
    state: &ApiState,
    lease: LeaseName,
    body: HolderToken,
) -> Result<Json<Grant>, ApiError> {
    let presented = body.secret_hash();
    let extended = extend(state, &lease, &body.holder, body.token, presented.as_ref());
    answer_extended(state, lease, body, extended)
}

/// The answer to a renewal of `body`'s grant of `lease` that went as
/// `extended` says.
fn answer_extended(
    state: &ApiState,
    lease: LeaseName,
    body: HolderToken,
    extended: Extended,
) -> Result<Json<Grant>, ApiError> {
    match extended {
        Extended::Yes {
            ttl_ms,
            grant_index,
        } => answer_grant(
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

/// A renewal's answer when `err` refused it.
pub(super) fn refused(lease: LeaseName, err: &ApiError) -> RenewResult {
    let body = err.body();
    RenewResult {
        status: err.status().as_u16(),
        error: Some(body.error),
        message: Some(body.message),
        lease,
        grant: None,
    }
}

/// Answers each of `renewals` (leadership confirmed after they arrived, at
/// `started`) as its own request would be answered, and counts them.
pub(in crate::api) fn renew_each(
    state: &ApiState,
    principal: Option<&Principal>,
    renewals: Vec<BatchRenewal>,
    started: std::time::Instant,
) -> Vec<RenewResult> {
    let policy = state.config.policy.as_ref().map(|p| p.current());
    let policy = policy.as_deref();
    let mut renewed = 0;
    let results = renewals
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
            match batch_renewal(state, policy, principal, name.clone(), grant) {
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
                Err(err) => refused(name, &err),
            }
        })
        .collect();
    let metrics = &state.metrics;
    metrics.renew_batches.inc();
    metrics.renewed(renewed, started.elapsed());
    results
}

/// One renewal of a (checked) batch, authorized as its own request would
/// be.
pub(in crate::api) fn batch_renewal(
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
