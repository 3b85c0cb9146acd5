//! `GET /v1/leases/{name}/history`: a lease's last transitions, from the
//! replicated record (so the same on every node, through failovers and
//! restarts), read on the leader like `GET /v1/leases/{name}`.

use axum::extract::State;
use axum::Json;
use palisade_names::{FencingToken, Holder, LeaseName};
use serde::Serialize;

use super::extract::LeasePath;
use super::schema::{LeaseNameParam, ReadErrors};
use super::state::ApiState;
use crate::error::ApiError;
use crate::lease_table::history::{Cause, Transition};

/// A lease's history, oldest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct HistoryView {
    #[schema(value_type = String)]
    lease: LeaseName,
    /// At most this many transitions are kept (the oldest drop out): this
    /// node's `--history-len`, which its entries carry while it leads.
    kept: usize,
    history: Vec<TransitionView>,
}

/// One transition.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct TransitionView {
    /// The log index of the entry that made it.
    index: u64,
    /// When it was proposed, on the proposer's clock (ms since the Unix
    /// epoch); absent for entries written before commands were stamped.
    #[serde(skip_serializing_if = "Option::is_none")]
    at_ms: Option<u64>,
    /// The same instant as `at_ms`, in RFC 3339 UTC with milliseconds
    /// (`2026-11-28T00:40:12.345Z`); absent with it.
    #[serde(skip_serializing_if = "Option::is_none")]
    at: Option<String>,
    cause: Cause,
    /// The grant it is about: the new one (acquire, claim, handover) or the
    /// one that ended or was revoked (release, expire, preempt, revoke).
    #[schema(value_type = Option<String>)]
    holder: Option<Holder>,
    #[schema(value_type = u64)]
    token: FencingToken,
}

impl From<&Transition> for TransitionView {
    fn from(t: &Transition) -> Self {
        Self {
            index: t.index,
            at_ms: t.at_ms,
            at: t.at_ms.map(palisade_names::time::rfc3339_ms),
            cause: t.cause,
            holder: t.holder.clone(),
            token: t.token,
        }
    }
}

#[utoipa::path(get, path = "/v1/leases/{name}/history", tag = "leases",
    params(("name" = LeaseNameParam, Path, description = "The lease")),
    responses(ReadErrors, (status = 200, body = HistoryView)))]
pub(super) async fn history(
    State(state): State<ApiState>,
    LeasePath(lease): LeasePath,
) -> Result<Json<HistoryView>, ApiError> {
    state.group(&lease).confirm_leadership().await?;
    let history = state.group(&lease).applied.read(|s| {
        let record = s.table.leases.get(&lease)?;
        Some(record.history.iter().map(TransitionView::from).collect())
    });
    let history = history.ok_or_else(|| {
        ApiError::NotFound(format!(
            "lease {lease} has no record: never granted, or free and reclaimed (its history goes with it)"
        ))
    })?;
    Ok(Json(HistoryView {
        lease,
        kept: usize::from(state.config.history_len),
        history,
    }))
}
