//! `POST /v1/leases/{name}/release`.

use axum::extract::State;
use axum::Json;

use super::super::extract::LeaseCall;
use super::super::schema::{LeaseCallErrors, LeaseNameParam};
use super::super::state::ApiState;
use super::answer::*;
use super::bodies::*;
use crate::error::ApiError;
use crate::lease_table::command::{Command, CommandResult};

/// Frees a grant.
#[utoipa::path(post, path = "/v1/leases/{name}/release", tag = "leases",
    params(("name" = LeaseNameParam, Path, description = "The lease")),
    request_body = HolderToken,
    responses(LeaseCallErrors, (status = 200, body = Released)))]
pub(in crate::api) async fn release(
    State(state): State<ApiState>,
    LeaseCall { lease, body }: LeaseCall<HolderToken>,
) -> Result<Json<Released>, ApiError> {
    let group = state.group(&lease);
    let command = Command::Release {
        lease: lease.clone(),
        holder: body.holder.clone(),
        token: body.token,
        grant_index: body.grant_index,
        secret: body.secret_hash(),
    };
    match group.proposer.propose(command).await? {
        CommandResult::Freed => Ok(Json(Released {
            lease,
            released: true,
            token: body.token,
        })),
        CommandResult::Lost => Err(not_held(&body, &lease)),
        other => Err(ApiError::Internal(format!("release answered {other:?}"))),
    }
}
