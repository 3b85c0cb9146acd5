//! The client API of an election node (see README): one file per resource.
//!
//! - [`leases`]: acquire, renew, release — the leader's, forwarded to it by
//!   [`forward::leader_only`] from any other node;
//! - [`reads`]: one lease and the list (leader, quorum-confirmed), and the
//!   watch (any node, its applied state);
//! - [`cluster`]: the cluster view, JWKS and health (any node);
//! - [`authorize`]: who may call what (the policy file), before forwarding;
//! - [`extract`]: the shared preamble (lease name, bounded checked JSON body);
//! - [`state`]: [`ApiState`], what every handler shares.
//!
//! Handlers return [`ApiError`], the one place a status is chosen.

mod authorize;
mod cluster;
mod extract;
mod forward;
mod leases;
pub mod openapi;
mod reads;
mod state;
#[cfg(test)]
mod tests;
mod ui;

use axum::middleware::from_fn_with_state;
use axum::routing::{delete, get, post, MethodRouter};
use axum::Router;
use palisade_serve::policy::Right;

use authorize::{authorize, Need};

pub use extract::{MAX_BODY_BYTES, MAX_HOLDER_LEN};
pub use forward::MAX_HOPS;
pub use leases::MAX_BATCH_RENEWALS;
pub use state::ApiState;

use crate::error::ApiError;

/// The client API routes. Raft RPC is not among them (see
/// [`crate::network::raft_routes`]). Each route names what its caller needs
/// ([`authorize`], outermost: checked before forwarding) and whether only
/// the leader serves it ([`forward::leader_only`]).
pub fn router(state: ApiState) -> Router {
    let needs = |route: MethodRouter<ApiState>, need: Need| {
        route.route_layer(from_fn_with_state((state.clone(), need), authorize))
    };
    let leader_needs = |route: MethodRouter<ApiState>, need: Need| {
        needs(
            route.route_layer(from_fn_with_state(state.clone(), forward::leader_only)),
            need,
        )
    };
    Router::new()
        .route(
            "/v1/leases/{name}/acquire",
            leader_needs(post(leases::acquire), Need::Lease(Right::Acquire)),
        )
        .route(
            "/v1/leases/{name}/renew",
            leader_needs(post(leases::renew), Need::Lease(Right::Acquire)),
        )
        .route(
            "/v1/renew",
            // Each renewal's right is checked in the handler.
            leader_needs(post(leases::renew_batch), Need::Known),
        )
        .route(
            "/v1/leases/{name}/release",
            leader_needs(post(leases::release), Need::Lease(Right::Acquire)),
        )
        .route(
            "/v1/leases/{name}/handover",
            leader_needs(post(leases::handover), Need::Lease(Right::Acquire)),
        )
        .route(
            "/v1/leases/{name}/revoke",
            leader_needs(post(leases::revoke), Need::Lease(Right::Admin)),
        )
        .route(
            "/v1/leases/{name}",
            leader_needs(get(reads::get_lease), Need::Lease(Right::Read)),
        )
        .route(
            "/v1/leases",
            leader_needs(get(reads::list_leases), Need::Prefix(Right::Read)),
        )
        .route(
            "/v1/cluster/rotate-key",
            leader_needs(post(cluster::rotate_key), Need::Cluster),
        )
        .route(
            "/v1/cluster/members",
            leader_needs(post(cluster::add_member), Need::Cluster),
        )
        .route(
            "/v1/cluster/members/{id}",
            leader_needs(delete(cluster::remove_member), Need::Cluster),
        )
        .route(
            "/v1/leases/{name}/watch",
            needs(get(reads::watch), Need::Lease(Right::Read)),
        )
        .route("/v1/cluster", needs(get(cluster::cluster), Need::Known))
        .route("/v1/jwks", get(cluster::jwks))
        .route("/healthz", get(cluster::healthz))
        .route("/livez", get(cluster::healthz))
        .route("/readyz", get(cluster::readyz))
        .route("/metrics", get(cluster::metrics))
        .route("/openapi.json", get(openapi::serve))
        .route(
            "/ui",
            needs(get(ui::page), Need::Prefix(Right::Read))
                .route_layer(axum::middleware::from_fn(ui::key_from_cookie)),
        )
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .with_state(state)
}
