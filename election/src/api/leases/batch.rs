//! `POST /v1/renew`: a batch of renewals, each answered as its own
//! renewal would be (`renew.rs`); with several partitions, split by
//! partition and gathered per leader node (`across_partitions`).

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::Method;
use palisade_names::{GrantSecret, LeaseName};
use palisade_serve::policy::Principal;

use super::super::admit::Flow;
use super::super::extract::CheckedJson;
use super::super::forward::{ask_leader, ask_node, Asked};
use super::super::partitions::{partition_of, Caller, PartDeadline};
use super::super::schema::BatchErrors;
use super::super::state::ApiState;
use super::bodies::*;
use super::renew::{all_ended, refused, renew_each};
use crate::error::ApiError;
use crate::group_id::GroupId;
use crate::peer::gate::PeerId;
use crate::raft::{Acting, NodeId};

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

/// The renewals of one partition, each with its place in the batch.
type Part = Vec<(usize, BatchRenewal)>;

/// A batch over several partitions (`--partitions` > 1): each partition's
/// renewals are renewed here when this node leads it (on its leader
/// lease), else asked of its leader. With `gather` (the node a client
/// reached, not one a peer asked), the parts of the partitions another
/// node leads go to that node as one batch, which it splits again without
/// gathering: a batch costs each leader node one call and one of the
/// caller's seats, not one per partition it leads. That node renews the
/// partitions it leads and refuses the others (`renew_in`): it never
/// passes a part on. The answers come back in the batch's order. A
/// partition without a reachable leader fails only its own renewals (503),
/// a node that does not answer the parts sent to it.
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
        let group = state.group_of(id);
        let answered = renew_in(state, group, caller, part, (started, gather)).await;
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
/// one batch (it renews those it still leads, each within its own
/// deadline, and refuses the others: `renew_in`); each renewal's
/// answer with its place.
async fn renew_at(
    state: &ApiState,
    caller: &Caller,
    (leader, addr): (NodeId, String),
    parts: Vec<(GroupId, Part)>,
) -> Vec<(usize, serde_json::Value)> {
    let ids: Vec<String> = parts.iter().map(|(id, _)| id.to_string()).collect();
    // The node bounds each partition's work by that partition's own
    // deadline (`renew_in`) and answers the late ones in their
    // places: waiting for the longest lets it answer the rest.
    let deadline = parts
        .iter()
        .filter_map(|(id, part)| part_deadline(state.group_of(*id), part.iter().map(|(_, r)| r)))
        .map(|PartDeadline(limit)| limit + GATHERED_GRACE)
        .max()
        .map(PartDeadline);
    let (places, part): (Vec<usize>, Vec<BatchRenewal>) =
        parts.into_iter().flat_map(|(_, part)| part).unzip();
    let leases: Vec<LeaseName> = part.iter().map(|r| r.lease.clone()).collect();
    let what = format!("node {leader}, the leader of partitions {}", ids.join(", "));
    let answered = async {
        let asked = Asked {
            node: (leader, &addr),
            what: &what,
        };
        let body = Some(batch_body(&part)?);
        let answer = ask_node(
            state,
            caller,
            asked,
            (Method::POST, "/v1/renew"),
            (body, deadline),
        );
        results_of(&answer.await?, part.len(), &what)
    };
    places
        .into_iter()
        .zip(answers(leases, answered.await))
        .collect()
}

/// How much longer than its longest part's deadline a node waits for a
/// gathered batch's answer (the way back, and the asked node's own timer).
const GATHERED_GRACE: std::time::Duration = std::time::Duration::from_millis(200);

/// `part` (all of `group`) renewed here, or by `group`'s leader. A part of
/// a batch another node gathered for this one (`gather` false) is renewed
/// here within the part's own deadline, or refused at once when this node
/// no longer leads its partition (the client renews again, through a node
/// that knows the new leader): a gathered batch is never passed on, so a
/// renewal takes at most the hops of the per-partition path, and a late
/// partition fails only its own places.
async fn renew_in(
    state: &ApiState,
    group: &crate::group::Group,
    caller: &Caller,
    part: Vec<BatchRenewal>,
    (started, gather): (std::time::Instant, bool),
) -> Result<Vec<serde_json::Value>, ApiError> {
    let id = group.id;
    if group.acting() == Acting::Leads {
        if !all_ended(state, &part) {
            let confirmed = group.confirm_lease();
            match part_deadline(group, part.iter()) {
                // Only the confirmation waits: a part cut here renewed nothing.
                Some(PartDeadline(limit)) if !gather => {
                    tokio::time::timeout(limit, confirmed).await.map_err(|_| {
                        ApiError::NoQuorum(format!(
                            "partition {id}'s leadership was not confirmed within {limit:?}"
                        ))
                    })??
                }
                _ => confirmed.await?,
            }
        }
        let results = renew_each(state, caller.principal.as_ref(), part, started);
        return serde_json::to_value(results)
            .ok()
            .and_then(|v| v.as_array().cloned())
            .ok_or_else(|| ApiError::Internal("renewal results".into()));
    }
    if !gather {
        return Err(ApiError::NoQuorum(format!(
            "node {} does not lead partition {id} (any more): renew again",
            state.config.id
        )));
    }
    let deadline = part_deadline(group, part.iter());
    let body = batch_body(&part)?;
    let route = (Method::POST, "/v1/renew");
    let answer = ask_leader(state, group, caller, route, (Some(body), deadline)).await?;
    results_of(&answer, part.len(), &format!("partition {id}'s leader"))
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
        .map_err(|e| ApiError::Internal(format!("a batch of renewals: {e}")))
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
