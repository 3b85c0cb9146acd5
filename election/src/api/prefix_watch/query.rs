//! The query of `GET /v1/watch` and what it asks for: the partitions to
//! follow, each from its index.

use serde::Deserialize;

use crate::error::ApiError;
use crate::group_id::GroupId;

/// `GET /v1/watch?prefix=&index=&keepalive_ms=`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(in crate::api) struct PrefixWatchQuery {
    /// Only leases whose names start with this (default: every lease).
    pub(super) prefix: Option<String>,
    /// Only changes after this index (the last line's `index`; default 0).
    /// On a watch of every partition only 0: resume that with `indexes`.
    index: Option<u64>,
    /// A keep-alive line at least this often (100..=60000; default 10000).
    #[param(minimum = 100, maximum = 60000)]
    pub(super) keepalive_ms: Option<u64>,
    /// The partition to watch alone; without it a cluster of several
    /// partitions is watched whole, every line naming its partition.
    partition: Option<u32>,
    /// Where a watch of every partition resumes: one index per partition,
    /// comma-separated, in partition order (default: all 0).
    indexes: Option<String>,
}

impl PrefixWatchQuery {
    /// The partitions to follow, each from its index, and whether lines
    /// name their partition (a watch of every partition).
    pub(super) fn plan(&self, partitions: u32) -> Result<(Vec<(GroupId, u64)>, bool), ApiError> {
        let bad = |message: String| Err(ApiError::BadRequest(message));
        let whole = self.indexes.is_some() || (self.partition.is_none() && partitions > 1);
        match (self.partition, whole) {
            (Some(_), _) if self.indexes.is_some() => bad(
                "indexes= resumes a watch of every partition; with partition=k use index=".into(),
            ),
            (Some(k), _) if k >= partitions => bad(format!(
                "no partition {k}: this cluster has {partitions} (0..{})",
                partitions - 1
            )),
            (Some(k), _) => Ok((vec![(GroupId(k), self.index.unwrap_or(0))], false)),
            (None, false) => Ok((vec![(GroupId::ZERO, self.index.unwrap_or(0))], false)),
            (None, true) if self.index.is_some() && self.indexes.is_some() => {
                bad("index= or indexes=, not both".into())
            }
            // From the start is the same in every partition.
            (None, true) if self.index.is_some_and(|index| index > 0) => bad(format!(
                "this cluster has {partitions} partitions, each with its own index: resume a \
                 watch of all of them with indexes=I0,...,I{} (one per partition), or watch one \
                 with partition=k&index=I (the CLI: --index I0,I1,...)",
                partitions - 1
            )),
            (None, true) => {
                let indexes = match &self.indexes {
                    Some(list) => parse_indexes(list, partitions)?,
                    None => vec![0; partitions as usize],
                };
                let plan = (0..partitions).map(GroupId).zip(indexes).collect();
                Ok((plan, true))
            }
        }
    }
}

/// `indexes=I0,I1,...`: one whole number per partition, in partition
/// order; partitions past the list's end are watched from 0 (a client that
/// has read nothing of them yet).
fn parse_indexes(list: &str, partitions: u32) -> Result<Vec<u64>, ApiError> {
    if list.trim().is_empty() {
        return Ok(vec![0; partitions as usize]);
    }
    let named = list.split(',').count();
    if named > partitions as usize {
        return Err(ApiError::BadRequest(format!(
            "indexes names {named} partitions; this cluster has {partitions}: one index each"
        )));
    }
    let indexes: Vec<u64> = list
        .split(',')
        .map(|index| index.trim().parse::<u64>())
        .collect::<Result<_, _>>()
        .map_err(|_| {
            ApiError::BadRequest(format!(
                "indexes must be whole numbers separated by commas, not {list:?}"
            ))
        })?;
    let mut indexes = indexes;
    indexes.resize(partitions as usize, 0);
    Ok(indexes)
}
