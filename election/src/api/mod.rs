//! The client API of an election node (see README): one file per resource.
//!
//! - [`leases`]: acquire, renew, release — the leader's, forwarded to it by
//!   [`forward::leader_only`] from any other node;
//! - [`reads`]: one lease and the list (leader, quorum-confirmed), and the
//!   watch (any node, its applied state);
//! - [`cluster`]: the cluster view, JWKS and health (any node);
//! - [`extract`]: the shared preamble (lease name, bounded checked JSON body);
//! - [`state`]: [`ApiState`], what every handler shares.
//!
//! Handlers return [`ApiError`], the one place a status is chosen.

mod cluster;
mod extract;
mod forward;
mod leases;
mod reads;
mod state;
#[cfg(test)]
mod tests;

use axum::routing::{delete, get, post};
use axum::Router;

pub use extract::{MAX_BODY_BYTES, MAX_HOLDER_LEN};
pub use forward::MAX_HOPS;
pub use state::ApiState;

use crate::error::ApiError;

/// The client API routes. Raft RPC is not among them (see
/// [`crate::network::raft_routes`]).
pub fn router(state: ApiState) -> Router {
    let leader_routes = Router::new()
        .route("/v1/leases/{name}/acquire", post(leases::acquire))
        .route("/v1/leases/{name}/renew", post(leases::renew))
        .route("/v1/leases/{name}/release", post(leases::release))
        .route("/v1/leases/{name}/revoke", post(leases::revoke))
        .route("/v1/leases/{name}", get(reads::get_lease))
        .route("/v1/leases", get(reads::list_leases))
        .route("/v1/cluster/rotate-key", post(cluster::rotate_key))
        .route("/v1/cluster/members", post(cluster::add_member))
        .route("/v1/cluster/members/{id}", delete(cluster::remove_member))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            forward::leader_only,
        ));
    Router::new()
        .merge(leader_routes)
        .route("/v1/leases/{name}/watch", get(reads::watch))
        .route("/v1/cluster", get(cluster::cluster))
        .route("/v1/jwks", get(cluster::jwks))
        .route("/healthz", get(cluster::healthz))
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .with_state(state)
}
