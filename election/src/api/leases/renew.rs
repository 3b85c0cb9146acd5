//! `POST /v1/leases/{name}/renew` and `POST /v1/renew` (a batch): no log
//! write and no quorum round of their own: answered on the leader lease
//! (`raft::lease`), then the grant is extended by the renewal rule
//! (`extend.rs`).

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::Method;
use palisade_names::{GrantSecret, LeaseName};

use palisade_serve::policy::{Policy, Principal, Right};

use super::super::admit::Flow;
use super::super::extract::{CheckedJson, LeaseCall};
use super::super::forward::{ask_leader, ask_node, Asked};
use super::super::partitions::{partition_of, Caller, PartDeadline};
use super::super::schema::{BatchErrors, LeaseCallErrors, LeaseNameParam};
use super::super::state::ApiState;
use super::answer::*;
use super::bodies::*;
use super::extend::*;
use crate::error::ApiError;
use crate::group_id::GroupId;
use crate::leader::lessor::RenewRefused;
use crate::lease_table::command::SecretHash;
use crate::peer::gate::PeerId;
use crate::raft::{Acting, NodeId};

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

/// Renews many grants with one look at the leader lease (a client's "session"
/// of leases, like the many keys of one etcd lease). Each renewal is
/// answered on its own, exactly as `/v1/leases/{name}/renew` would answer
/// it; the request fails as a whole only when it is malformed or
/// leadership cannot be confirmed. Under a policy each renewal needs the
/// `acquire` right on its lease (a refused one is that renewal's 403).
#[utoipa::path(post, path = "/v1/renew", tag = "leases",
    request_body = RenewBatch,
    responses(BatchErrors, (status = 200, body = RenewResults)))]
pub(in crate::api) async fn renew_batch(
    State(state): State<ApiState>,
    principal: Option<axum::Extension<Principal>>,
    flow: Option<axum::Extension<Flow>>,
    peer: Option<axum::Extension<PeerId>>,
    uri: http::Uri,
    CheckedJson(body): CheckedJson<RenewBatch>,
) -> Result<Response, ApiError> {
    let started = std::time::Instant::now();
    let one = match partition_of(&state, &uri)? {
        Some(id) => Some(state.group_of(id)),
        None if state.partitions() == 1 => Some(state.group_zero()),
        None => None,
    };
    let Some(group) = one else {
        let caller = Caller {
            principal: principal.map(|p| p.0),
            flow: flow.map(|f| f.0),
        };
        // Gathered per node once, where the client's call landed.
        let gather = peer.is_none();
        let results = across_partitions(&state, &caller, body.renewals, (started, gather)).await;
        return Ok(Json(serde_json::json!({ "results": results })).into_response());
    };
    // Asked for one partition: renewals of another are refused here, for
    // this node's confirmation of `group`'s lease says nothing of theirs.
    let (ours, theirs): (Vec<_>, Vec<_>) = body
        .renewals
        .into_iter()
        .enumerate()
        .partition(|(_, r)| state.group(&r.lease).id == group.id);
    let ours_only: Vec<BatchRenewal> = ours.iter().map(|(_, r)| r.clone()).collect();
    if !all_ended(&state, &ours_only) {
        group.confirm_lease().await?;
    }
    let mut results: Vec<(usize, RenewResult)> = ours
        .iter()
        .map(|(i, _)| *i)
        .zip(renew_each(&state, principal.as_deref(), ours_only, started))
        .collect();
    results.extend(theirs.into_iter().map(|(i, r)| {
        let home = state.group(&r.lease).id;
        let err = ApiError::BadRequest(format!(
            "{} belongs to partition {home}, not {}",
            r.lease, group.id
        ));
        (i, refused(r.lease, &err))
    }));
    results.sort_by_key(|(i, _)| *i);
    let results = results.into_iter().map(|(_, r)| r).collect();
    Ok(Json(RenewResults { results }).into_response())
}

/// A renewal's answer when `err` refused it.
fn refused(lease: LeaseName, err: &ApiError) -> RenewResult {
    let body = err.body();
    RenewResult {
        status: err.status().as_u16(),
        error: Some(body.error),
        message: Some(body.message),
        lease,
        grant: None,
    }
}

/// The renewals of one partition, each with its place in the batch.
type Part = Vec<(usize, BatchRenewal)>;

/// A batch over several partitions (`--partitions` > 1): each partition's
/// renewals are renewed here when this node leads it (on its leader
/// lease), else asked of its leader. With `gather` (the node a client
/// reached, not one a peer asked), the parts of the partitions another
/// node leads go to that node as one batch, which it splits again without
/// gathering: a batch costs each leader node one call and one of the
/// caller's seats, not one per partition it leads. The answers come back
/// in the batch's order. A partition without a reachable leader fails only
/// its own renewals (503), a node that does not answer the parts sent to
/// it.
pub(in crate::api) async fn across_partitions(
    state: &ApiState,
    caller: &Caller,
    renewals: Vec<BatchRenewal>,
    (started, gather): (std::time::Instant, bool),
) -> Vec<serde_json::Value> {
    let mut by_group: std::collections::BTreeMap<GroupId, Part> = std::collections::BTreeMap::new();
    for (i, renewal) in renewals.into_iter().enumerate() {
        let id = state.group(&renewal.lease).id;
        by_group.entry(id).or_default().push((i, renewal));
    }
    let mut alone: Vec<(GroupId, Part)> = Vec::new();
    let mut by_node: std::collections::BTreeMap<NodeId, (String, Vec<(GroupId, Part)>)> =
        std::collections::BTreeMap::new();
    for (id, part) in by_group {
        let group = state.group_of(id);
        match group.leader().filter(|(l, _)| *l != state.config.id) {
            Some((leader, addr)) if gather && group.acting() != Acting::Leads => {
                by_node
                    .entry(leader)
                    .or_insert((addr, Vec::new()))
                    .1
                    .push((id, part));
            }
            _ => alone.push((id, part)),
        }
    }
    let mut gathered = Vec::new();
    for (leader, (addr, parts)) in by_node {
        match <[_; 1]>::try_from(parts) {
            // One partition's part goes as that partition's (hop-limited).
            Ok([one]) => alone.push(one),
            Err(parts) => gathered.push(renew_at(state, caller, (leader, addr), parts)),
        }
    }
    let alone = alone.into_iter().map(|(id, part)| async move {
        let (places, part): (Vec<usize>, Vec<BatchRenewal>) = part.into_iter().unzip();
        let leases: Vec<LeaseName> = part.iter().map(|r| r.lease.clone()).collect();
        let answered = renew_in(state, state.group_of(id), caller, part, started).await;
        places
            .into_iter()
            .zip(answers(leases, answered))
            .collect::<Vec<_>>()
    });
    let (alone, gathered) = futures::join!(
        futures::future::join_all(alone),
        futures::future::join_all(gathered)
    );
    let mut results: Vec<(usize, serde_json::Value)> =
        alone.into_iter().chain(gathered).flatten().collect();
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

/// Each renewal's answer: `answered`'s, or the error that failed them all.
fn answers(
    leases: Vec<LeaseName>,
    answered: Result<Vec<serde_json::Value>, ApiError>,
) -> Vec<serde_json::Value> {
    answered.unwrap_or_else(|err| {
        leases
            .into_iter()
            .map(|lease| serde_json::to_value(refused(lease, &err)).unwrap_or_default())
            .collect()
    })
}

/// The parts of several partitions that node `leader` leads, asked of it as
/// one batch (it renews those it still leads and asks the others' leaders
/// itself); each renewal's answer with its place.
async fn renew_at(
    state: &ApiState,
    caller: &Caller,
    (leader, addr): (NodeId, String),
    parts: Vec<(GroupId, Part)>,
) -> Vec<(usize, serde_json::Value)> {
    let ids: Vec<String> = parts.iter().map(|(id, _)| id.to_string()).collect();
    let deadline = parts
        .iter()
        .filter_map(|(id, part)| part_deadline(state.group_of(*id), part.iter().map(|(_, r)| r)))
        .map(|PartDeadline(limit)| limit)
        .min()
        .map(PartDeadline);
    let (places, part): (Vec<usize>, Vec<BatchRenewal>) =
        parts.into_iter().flat_map(|(_, part)| part).unzip();
    let leases: Vec<LeaseName> = part.iter().map(|r| r.lease.clone()).collect();
    let what = format!("node {leader}, the leader of partitions {}", ids.join(", "));
    let answered = async {
        let body = batch_body(&part)?;
        let asked = Asked {
            node: (leader, &addr),
            what: &what,
        };
        let answer = ask_node(
            state,
            caller,
            asked,
            (Method::POST, "/v1/renew"),
            (Some(body), deadline),
        )
        .await?;
        results_of(&answer, part.len(), &what)
    }
    .await;
    places.into_iter().zip(answers(leases, answered)).collect()
}

/// `part` (all of `group`) renewed here, or by `group`'s leader.
async fn renew_in(
    state: &ApiState,
    group: &crate::group::Group,
    caller: &Caller,
    part: Vec<BatchRenewal>,
    started: std::time::Instant,
) -> Result<Vec<serde_json::Value>, ApiError> {
    if group.acting() == Acting::Leads {
        if !all_ended(state, &part) {
            group.confirm_lease().await?;
        }
        let results = renew_each(state, caller.principal.as_ref(), part, started);
        return serde_json::to_value(results)
            .ok()
            .and_then(|v| v.as_array().cloned())
            .ok_or_else(|| ApiError::Internal("renewal results".into()));
    }
    let body = batch_body(&part)?;
    let deadline = part_deadline(group, part.iter());
    let answer = ask_leader(
        state,
        group,
        caller,
        (Method::POST, "/v1/renew"),
        (Some(body), deadline),
    )
    .await?;
    results_of(
        &answer,
        part.len(),
        &format!("partition {}'s leader", group.id),
    )
}

/// A batch request's body of `part`.
fn batch_body(part: &[BatchRenewal]) -> Result<Vec<u8>, ApiError> {
    let renewals: Vec<serde_json::Value> = part
        .iter()
        .map(|r| {
            serde_json::json!({
                "lease": r.lease.as_str(),
                "holder": r.holder.as_str(),
                "token": r.token.0,
                "secret": r.secret.as_ref().map(GrantSecret::expose),
            })
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({ "renewals": renewals }))
        .map_err(|e| ApiError::Internal(format!("a partition's batch: {e}")))
}

/// How long a part may take at its leader: a quarter of the shortest ttl
/// among its renewals (as this node has applied `group`), at least 100 ms:
/// a frozen leader costs them a quick 503, retried elsewhere, not their
/// grants.
fn part_deadline<'a>(
    group: &crate::group::Group,
    part: impl Iterator<Item = &'a BatchRenewal>,
) -> Option<PartDeadline> {
    let shortest = group.applied.read(|s| {
        part.filter_map(|r| s.table.leases.get(&r.lease).map(|l| l.ttl_ms))
            .min()
    });
    shortest.map(|ttl| PartDeadline(std::time::Duration::from_millis((ttl / 4).max(100))))
}

/// The `results` of a batch answer of `count` renewals from `what`.
fn results_of(
    answer: &serde_json::Value,
    count: usize,
    what: &str,
) -> Result<Vec<serde_json::Value>, ApiError> {
    match answer["results"].as_array() {
        Some(results) if results.len() == count => Ok(results.clone()),
        _ => Err(ApiError::NoQuorum(format!(
            "{what} answered a batch of {count} with another count"
        ))),
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
