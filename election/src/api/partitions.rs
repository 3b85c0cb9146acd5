//! Calls that span partitions (`--partitions` > 1): the list of leases and
//! the batch renewal. The node that serves one asks each partition's
//! leader for that partition's part — itself when it leads the partition,
//! else the leader over the forwarding path, as the same caller, with
//! `?partition=k` — and puts the parts together. `?partition=k` is also
//! what routes such a call ([`partition_of`]): `forward::leader_only` sends
//! it to partition k's leader, whose handler answers for partition k alone.
//! A batch renewal gathers the parts of the partitions one other node leads
//! into one request to it (`leases/renew.rs::across_partitions`), which that
//! node answers for the partitions it leads and refuses for the others.

use std::collections::HashMap;

use axum::extract::Query;
use palisade_serve::policy::Principal;
use serde_json::Value;

use super::admit::Flow;
use super::state::ApiState;
use crate::error::ApiError;
use crate::group_id::GroupId;

/// The query parameter naming the one partition a spanning call is for.
pub(super) const PARTITION_PARAM: &str = "partition";

/// The partition a call's `?partition=k` names, if it names one: 400 for
/// one that is not a number, 404 for one beyond the cluster's count.
pub(super) fn partition_of(state: &ApiState, uri: &http::Uri) -> Result<Option<GroupId>, ApiError> {
    let Ok(Query(query)) = Query::<HashMap<String, String>>::try_from_uri(uri) else {
        return Ok(None);
    };
    let Some(value) = query.get(PARTITION_PARAM) else {
        return Ok(None);
    };
    match value.parse::<u32>() {
        Ok(k) if k < state.partitions() => Ok(Some(GroupId(k))),
        Ok(k) => Err(ApiError::NotFound(format!(
            "no partition {k}: this cluster has {} (0..{})",
            state.partitions(),
            state.partitions()
        ))),
        Err(_) => Err(ApiError::BadRequest(format!(
            "partition must be a number in 0..{}",
            state.partitions()
        ))),
    }
}

/// Who a spanning call is made for: what its parts carry to the other
/// leaders (the principal it was authorized as, its flow's seats).
#[derive(Debug, Clone, Default)]
pub(super) struct Caller {
    pub(super) principal: Option<Principal>,
    pub(super) flow: Option<Flow>,
}

/// How long one partition's part of a spanning call may take at its
/// leader, when shorter than the quorum timeout (a request extension
/// `forward.rs` reads): renewals are answered within a fraction of their
/// ttl, so a leader that froze costs its partition's renewals a quick 503,
/// which the client retries elsewhere, not the whole ttl.
#[derive(Debug, Clone, Copy)]
pub(super) struct PartDeadline(pub(super) std::time::Duration);

/// The leases of several partitions' pages as one page: the first `limit`
/// names of all of them in order, and a `next` when any page had more or
/// more than `limit` came together. Each page holds its partition's first
/// names after the same `after`, so these are the cluster's first.
pub(super) fn merge_pages(pages: Vec<Value>, limit: usize) -> Value {
    let mut more = false;
    let mut leases: Vec<Value> = Vec::new();
    for mut page in pages {
        more |= !page["next"].is_null();
        if let Value::Array(part) = page["leases"].take() {
            leases.extend(part);
        }
    }
    leases.sort_by(|a, b| a["lease"].as_str().cmp(&b["lease"].as_str()));
    if leases.len() > limit {
        leases.truncate(limit);
        more = true;
    }
    let next = match leases.last() {
        Some(last) if more => last["lease"].clone(),
        _ => Value::Null,
    };
    serde_json::json!({ "leases": leases, "next": next })
}

#[cfg(test)]
mod tests {
    use crate::api::partitions::merge_pages;
    use serde_json::json;

    /// Pages of two partitions make one page in name order, cut at the
    /// limit, with `next` when anything is left.
    #[test]
    fn pages_of_partitions_merge_in_name_order() {
        let page = |names: &[&str], next: Option<&str>| json!({"leases": names.iter().map(|n| json!({"lease": n})).collect::<Vec<_>>(), "next": next});
        let merged = merge_pages(vec![page(&["a", "d"], None), page(&["b", "c"], None)], 3);
        assert_eq!(merged["leases"].as_array().map(Vec::len), Some(3));
        assert_eq!(merged["leases"][2]["lease"], "c");
        assert_eq!(merged["next"], "c");
        let all = merge_pages(vec![page(&["a"], None), page(&["b"], None)], 3);
        assert_eq!(all["next"], serde_json::Value::Null);
        let more = merge_pages(vec![page(&["a"], Some("a")), page(&["b"], None)], 3);
        assert_eq!(more["next"], "b", "a partition with more: next is set");
    }
}
