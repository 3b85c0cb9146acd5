//! Reading leases: one lease and the list (the leader's state, confirmed with
//! a quorum), and the watch (a blocking query on any node's applied state).

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use http::HeaderValue;
use palisade_names::{FencingToken, Holder, LeaseName};
use serde::{Deserialize, Serialize};

use super::admit::Flow;
use super::extract::{check_wait, LeasePath};
use super::forward::ask_leader;
use super::partitions::{merge_pages, Caller};
use super::revocation::{unless_revoked, Revocation};
use super::schema::{LeaseNameParam, ReadErrors};
use super::state::ApiState;
use crate::error::ApiError;
use crate::group::Group;
use crate::group_id::GroupId;
use crate::lease_table::record::LeaseRecord;
use crate::raft::Acting;
use http::Method;
use palisade_serve::policy::Principal;
use serde_json::Value;

/// The index a watcher passes as `index` next time.
const INDEX_HEADER: &str = "x-palisade-index";

/// One lease, as reads and watches show it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct LeaseView {
    #[schema(value_type = String)]
    lease: LeaseName,
    /// `None` when free.
    #[schema(value_type = Option<String>)]
    holder: Option<Holder>,
    #[schema(value_type = u64)]
    token: FencingToken,
    ttl_ms: u64,
    transitions: u64,
    modify_index: u64,
    /// Time left on the leader's deadline; only on the leader, for a held
    /// lease whose deadline it tracks.
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_in_ms: Option<u64>,
    /// The current grant was revoked and ends at its deadline.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    revoked: bool,
    /// Who preempted the current grant (it is then revoked too).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    preempted_by: Option<Holder>,
    /// The holder is a handover's successor that has not taken the lease
    /// yet (it is reserved for it until `ttl_ms` runs out).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    reserved: bool,
    /// The grant's priority (0 when not set).
    #[serde(skip_serializing_if = "crate::lease_table::command::is_zero_u64")]
    priority: u64,
    /// A higher priority may preempt the grant.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    preemptible: bool,
    /// The grant's lock-delay: after it expires the lease stays unavailable
    /// this long.
    #[serde(skip_serializing_if = "crate::lease_table::command::is_zero_u64")]
    lock_delay_ms: u64,
    /// The grant's max-hold.
    #[serde(skip_serializing_if = "crate::lease_table::command::is_zero_u64")]
    max_hold_ms: u64,
    /// Free, but held back by the lock-delay of the grant that expired.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    lock_delayed: bool,
    /// When the current grant began (RFC 3339 UTC, ms): the stamped time
    /// of the acquire, claim or handover entry that made it, from the
    /// replicated history, so the same on every node. Absent when free, or
    /// when that entry is unstamped or no longer in the kept history.
    #[serde(skip_serializing_if = "Option::is_none")]
    acquire_time: Option<String>,
    /// When the current grant was last renewed, as the leader's lessor
    /// knows it (RFC 3339 UTC, ms, on the answering leader's clock):
    /// renewals ride the leader lease and write no log entry, so only the
    /// leader knows. Its last renewal or repeated acquire, else when this
    /// leader started tracking the grant (applied it, or took it over).
    /// Absent when free and from a node that does not lead (a watch or a
    /// prefix watch a follower serves).
    #[serde(skip_serializing_if = "Option::is_none")]
    renew_time: Option<String>,
    /// The partition the lease belongs to, for ever (only from a cluster
    /// of more than one, `--partitions`).
    #[serde(skip_serializing_if = "Option::is_none")]
    partition: Option<u32>,
}

impl LeaseView {
    pub(super) fn new(state: &ApiState, lease: &LeaseName, record: &LeaseRecord) -> Self {
        let expires_in_ms = record
            .holder
            .as_ref()
            .and_then(|_| state.group(lease).lessor.remaining_ms(lease, record.token));
        let renewed_ago = record
            .holder
            .as_ref()
            .and_then(|_| state.group(lease).lessor.renewed_ago(lease, record.token));
        let renew_time = renewed_ago.map(|ago| {
            let ago_ms = u64::try_from(ago.as_millis()).unwrap_or(u64::MAX);
            palisade_names::time::rfc3339_ms(crate::signing::unix_ms().saturating_sub(ago_ms))
        });
        Self {
            lease: lease.clone(),
            holder: record.holder.clone(),
            token: record.token,
            ttl_ms: record.ttl_ms,
            transitions: record.transitions,
            modify_index: record.modify_index,
            expires_in_ms,
            revoked: record.revoked,
            preempted_by: record.preempted_by.clone(),
            reserved: record.reserved,
            priority: u64::from(record.terms.priority),
            preemptible: record.terms.preemptible,
            lock_delay_ms: record.terms.lock_delay_ms,
            max_hold_ms: record.terms.max_hold_ms,
            lock_delayed: record.lock_delayed && record.holder.is_none(),
            acquire_time: record
                .grant_began_ms()
                .map(palisade_names::time::rfc3339_ms),
            renew_time,
            partition: (state.partitions() > 1).then(|| state.group(lease).id.0),
        }
    }
}

/// `GET /v1/leases`: one page, in name order.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct LeaseList {
    leases: Vec<LeaseView>,
    /// Pass as `after` for the next page; `None` on the last one.
    #[schema(value_type = Option<String>)]
    next: Option<LeaseName>,
}

/// The most leases one page holds, and the default page size.
pub const MAX_PAGE: usize = 1000;

/// `GET /v1/leases?prefix=&after=&limit=`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    /// Only names starting with this.
    prefix: Option<String>,
    /// Only names after this one (the `next` of the previous page).
    after: Option<String>,
    /// At most this many (1..=1000; default 1000).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
    /// Only this partition's leases (with `--partitions` > 1; a node
    /// answering a list asks each partition's leader so); 404 beyond the
    /// cluster's count.
    #[param(maximum = 63)]
    partition: Option<u32>,
}

fn never_granted(lease: &LeaseName) -> ApiError {
    ApiError::NotFound(format!(
        "lease {lease} has no record: never granted, or free and reclaimed"
    ))
}

#[utoipa::path(get, path = "/v1/leases/{name}", tag = "leases",
    params(("name" = LeaseNameParam, Path, description = "The lease")),
    responses(ReadErrors, (status = 200, body = LeaseView)))]
pub(super) async fn get_lease(
    State(state): State<ApiState>,
    LeasePath(lease): LeasePath,
) -> Result<Json<LeaseView>, ApiError> {
    state.group(&lease).confirm_leadership().await?;
    let record = state
        .group(&lease)
        .applied
        .read(|s| s.table.leases.get(&lease).cloned());
    let record = record.ok_or_else(|| never_granted(&lease))?;
    Ok(Json(LeaseView::new(&state, &lease, &record)))
}

#[utoipa::path(get, path = "/v1/leases", tag = "leases", params(ListQuery),
    responses(ReadErrors, (status = 200, body = LeaseList)))]
pub(super) async fn list_leases(
    State(state): State<ApiState>,
    principal: Option<Extension<Principal>>,
    flow: Option<Extension<Flow>>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::BadRequest(format!("bad query: {e}")))?;
    let limit = query.limit.unwrap_or(MAX_PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return Err(ApiError::BadRequest(format!(
            "limit must be in 1..={MAX_PAGE}"
        )));
    }
    let page = Page {
        prefix: query.prefix.unwrap_or_default(),
        after: query.after,
        limit,
    };
    let one = match query.partition {
        Some(k) if k >= state.partitions() => {
            return Err(ApiError::NotFound(format!(
                "no partition {k}: this cluster has {} (0..{})",
                state.partitions(),
                state.partitions()
            )))
        }
        Some(k) => Some(state.group_of(GroupId(k))),
        None if state.partitions() == 1 => Some(state.group_zero()),
        None => None,
    };
    if let Some(group) = one {
        group.confirm_leadership().await?;
        return Ok(Json(page.of(&state, group)).into_response());
    }
    let caller = Caller {
        principal: principal.map(|Extension(p)| p),
        flow: flow.map(|Extension(f)| f),
    };
    let parts = state
        .groups()
        .iter()
        .map(|group| page.across(&state, group, &caller));
    let pages = futures::future::try_join_all(parts).await?;
    Ok(Json(merge_pages(pages, limit)).into_response())
}

/// What one list call asks for.
#[derive(Debug)]
struct Page {
    prefix: String,
    after: Option<String>,
    limit: usize,
}

impl Page {
    /// This page of `group`'s leases, from this node's applied state.
    fn of(&self, state: &ApiState, group: &Group) -> LeaseList {
        let (prefix, limit) = (self.prefix.as_str(), self.limit);
        group.applied.read(|s| {
            use std::ops::Bound;
            // Start at the later of `after` and `prefix`, so an `after` that
            // sorts before the prefix cannot make the scan walk every name in
            // between (a whole-table scan under the lock apply needs).
            let start = match &self.after {
                Some(after) if after.as_str() >= prefix => Bound::Excluded(after.as_str()),
                _ => Bound::Included(prefix),
            };
            let mut names = s
                .table
                .leases
                .range::<str, _>((start, Bound::Unbounded))
                .take_while(|(name, _)| name.as_str().starts_with(prefix));
            let leases: Vec<LeaseView> = names
                .by_ref()
                .take(limit)
                .map(|(name, record)| LeaseView::new(state, name, record))
                .collect();
            let more = names.next().is_some();
            let next = more
                .then(|| leases.last().map(|l| l.lease.clone()))
                .flatten();
            LeaseList { leases, next }
        })
    }

    /// This page of `group`'s leases as JSON: read here (leadership
    /// confirmed) when this node leads the group, else asked of its leader.
    async fn across(
        &self,
        state: &ApiState,
        group: &Group,
        caller: &Caller,
    ) -> Result<Value, ApiError> {
        if group.acting() == Acting::Leads {
            group.confirm_leadership().await?;
            return serde_json::to_value(self.of(state, group))
                .map_err(|e| ApiError::Internal(format!("a lease page: {e}")));
        }
        let mut query = vec![
            ("prefix", self.prefix.clone()),
            ("limit", self.limit.to_string()),
        ];
        if let Some(after) = &self.after {
            query.push(("after", after.clone()));
        }
        let query = serde_urlencoded::to_string(&query)
            .map_err(|e| ApiError::Internal(format!("a lease page's query: {e}")))?;
        let path = format!("/v1/leases?{query}");
        ask_leader(state, group, caller, (Method::GET, &path), (None, None)).await
    }
}

/// `GET /v1/leases/{name}/watch?index=&wait_ms=`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct WatchQuery {
    /// Answer once the lease's `modify_index` exceeds this.
    index: Option<u64>,
    /// Wait at most this long (default 30 000, at most the node's max wait).
    #[param(maximum = 60000)]
    wait_ms: Option<u64>,
}

/// A blocking query: answers as soon as the lease's `modify_index` exceeds
/// `index` (at once if it already does), or after `wait_ms` with the current
/// state. Served from this node's applied state. The answer's
/// `X-Palisade-Index` header is the `index` for the next call. A policy
/// reload that would refuse the call ends it at once (401 or 403).
#[utoipa::path(get, path = "/v1/leases/{name}/watch", tag = "leases",
    params(("name" = LeaseNameParam, Path, description = "The lease"), WatchQuery),
    responses(ReadErrors, (status = 200, body = LeaseView, headers(("x-palisade-index" = u64, description = "The index for the next watch")))))]
pub(super) async fn watch(
    State(state): State<ApiState>,
    revocation: Option<Extension<Revocation>>,
    LeasePath(lease): LeasePath,
    query: Result<Query<WatchQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let mut revocation = revocation.map(|Extension(r)| r);
    let Query(query) = query.map_err(|e| ApiError::BadRequest(format!("bad query: {e}")))?;
    let wait_ms = query.wait_ms.unwrap_or(30_000);
    let wait = check_wait(wait_ms, &state.config)?;
    let _waiting = state.waiter()?;
    let after = query.index.unwrap_or(0);
    let deadline = tokio::time::Instant::now() + wait;
    let mut bell = state.group(&lease).applied.bells.subscribe(&lease);
    loop {
        let record = state
            .group(&lease)
            .applied
            .read(|s| s.table.leases.get(&lease).cloned());
        let index = record.as_ref().map_or(0, |r| r.modify_index);
        let timed_out = tokio::time::Instant::now() >= deadline;
        if index > after || timed_out {
            let record = record.ok_or_else(|| never_granted(&lease))?;
            let mut response = Json(LeaseView::new(&state, &lease, &record)).into_response();
            response
                .headers_mut()
                .insert(INDEX_HEADER, HeaderValue::from(index));
            return Ok(response);
        }
        let rung = tokio::time::timeout_at(deadline, bell.rung());
        let _ = unless_revoked(revocation.as_mut(), rung).await?;
    }
}
