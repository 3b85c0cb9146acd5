//! `POST /v1/leases/{name}/handover`: the holder lets go in favour of a
//! named successor.

use std::time::Duration;

use axum::extract::State;
use axum::{Extension, Json};
use palisade_serve::policy::Principal;

use super::super::extract::LeaseCall;
use super::super::schema::{LeaseCallErrors, LeaseNameParam};
use super::super::state::ApiState;
use super::bodies::*;
use crate::error::ApiError;
use crate::lease_table::command::{Command, CommandResult, SecretHash};

/// Hands the lease to a named successor: the caller's grant ends at once
/// (its renewals are refused from now on), and a grant with a higher token
/// is reserved for the successor, which takes it with an acquire (waiting
/// or not) within `window_ms`; nobody else can take the lease in between.
/// Under a policy the caller needs `acquire` on the lease, and the
/// reservation opens only to the successor's principal (`to_principal`,
/// by default the caller's): a holder name alone does not take it.
#[utoipa::path(post, path = "/v1/leases/{name}/handover", tag = "leases",
    params(("name" = LeaseNameParam, Path, description = "The lease")),
    request_body = HandoverRequest,
    responses(LeaseCallErrors, (status = 200, body = HandedOver)))]
pub(in crate::api) async fn handover(
    State(state): State<ApiState>,
    principal: Option<Extension<Principal>>,
    LeaseCall { lease, body }: LeaseCall<HandoverRequest>,
) -> Result<Json<HandedOver>, ApiError> {
    let group = state.group(&lease);
    let window_ms = body.window_ms.unwrap_or(HANDOVER_WINDOW_MS.1);
    let caller = principal.map(|Extension(Principal(name))| name);
    if body.to_principal.is_some() && caller.is_none() {
        return Err(ApiError::BadRequest(
            "to_principal needs a server with a policy (there are no principals here)".into(),
        ));
    }
    let command = Command::Handover {
        lease: lease.clone(),
        holder: body.holder.clone(),
        token: body.token,
        secret: body.secret.as_ref().map(SecretHash::of),
        to: body.to.clone(),
        to_principal: body.to_principal.clone().or(caller),
        window_ms,
    };
    match group.proposer.propose(command).await? {
        CommandResult::HandedOver { token } => {
            group
                .lessor
                .track_grant(&lease, token, Duration::from_millis(window_ms));
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
