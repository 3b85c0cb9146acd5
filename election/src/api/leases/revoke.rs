//! `POST /v1/leases/{name}/revoke`: an operator ends a grant at its deadline.

use axum::extract::State;
use axum::Json;

use super::super::extract::LeaseCall;
use super::super::schema::{LeaseCallErrors, LeaseNameParam};
use super::super::state::ApiState;
use super::bodies::*;
use crate::error::ApiError;
use crate::lease_table::command::{Command, CommandResult};

/// An operator's way to end a grant without its secret (etcd's
/// `LeaseRevoke`): renewals stop at once, and the lease is free once the
/// grant's current deadline passes — never earlier, so a holder that still
/// believes it holds is never overlapped (S3).
#[utoipa::path(post, path = "/v1/leases/{name}/revoke", tag = "leases",
    params(("name" = LeaseNameParam, Path, description = "The lease")),
    request_body = RevokeRequest,
    responses(LeaseCallErrors, (status = 200, body = Revoked)))]
pub(in crate::api) async fn revoke(
    State(state): State<ApiState>,
    LeaseCall { lease, body }: LeaseCall<RevokeRequest>,
) -> Result<Json<Revoked>, ApiError> {
    let group = state.group(&lease);
    let command = Command::Revoke {
        lease: lease.clone(),
        token: body.token,
    };
    match group.proposer.propose(command).await? {
        CommandResult::Revoked => Ok(Json(Revoked {
            expires_in_ms: group.lessor.remaining_ms(&lease, body.token),
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
