//! The client API of an election node (see README): one file per resource.
//!
//! - [`leases`]: acquire, renew, release — the leader's, forwarded to it by
//!   [`forward::leader_only`] from any other node;
//! - [`reads`]: one lease and the list (leader, quorum-confirmed), and the
//!   watch (any node, its applied state); [`prefix_watch`]: one stream of
//!   every change under a prefix (any node);
//! - [`cluster`]: the cluster view, JWKS and health (any node);
//! - [`authorize`]: who may call what (the policy file), before forwarding,
//!   with [`credential`] (identifying the caller, checking its right) and
//!   [`revocation`] (a reload ends the open calls it would refuse);
//! - [`extract`]: the shared preamble (lease name, bounded checked JSON body);
//! - [`state`]: [`ApiState`], what every handler shares.
//!
//! Handlers return [`ApiError`], the one place a status is chosen.

mod admit;
mod authorize;
mod cluster;
mod credential;
mod extract;
mod forward;
mod history;
mod leases;
mod members;
pub mod openapi;
mod partitions;
mod prefix_watch;
mod reads;
mod revocation;
mod schema;
pub mod state;
#[cfg(test)]
mod tests;
mod ui;
mod whole_numbers;

use std::sync::Arc;

use axum::middleware::from_fn_with_state;
use axum::routing::{delete, get, post, MethodRouter};
use axum::{Extension, Router};
use palisade_serve::policy::Right;

use authorize::{authorize, Lasting, Need};
use forward::Route;
use palisade_serve::admission::Pool;

pub use extract::MAX_BODY_BYTES;
pub use forward::MAX_HOPS;
pub use leases::bodies::MAX_BATCH_RENEWALS;
pub use state::ApiState;
pub use ui::gateway::GatewayReader;
pub use ui::sampler::sample as sample_status;
pub use ui::status::StatusPage;

use crate::error::ApiError;

/// The layers of a route, outermost first: `authorize` (who may call it,
/// checked before forwarding; a call that may stay open, `lasting`, is
/// checked again at every reload), `admit` (the caller's share of seats in
/// `kind`'s pool), then, for a route the `leader` serves,
/// `forward::leader_only` (run here, or forwarded to the leader).
fn guarded(
    state: &ApiState,
    route: MethodRouter<ApiState>,
    need: Need,
    kind: Pool,
    leader: Option<Route>,
    lasting: Lasting,
) -> MethodRouter<ApiState> {
    let route = match leader {
        Some(forwarded) => route.route_layer(from_fn_with_state(
            (state.clone(), forwarded),
            forward::leader_only,
        )),
        None => route,
    };
    route
        .route_layer(from_fn_with_state((state.clone(), kind), admit::admit))
        .route_layer(from_fn_with_state(
            (state.clone(), need, lasting),
            authorize,
        ))
}

/// The lease routes whose calls may stay open (a waiting acquire, the
/// renewal stream, the watch): a reload that would refuse such a call
/// ends it (`revocation.rs`).
fn open_routes(state: &ApiState) -> Router<ApiState> {
    let open = |route, need, kind, leader| guarded(state, route, need, kind, leader, Lasting::Open);
    Router::new()
        .route(
            "/v1/leases/{name}/acquire",
            open(
                post(leases::acquire::acquire),
                Need::Lease(Right::Acquire),
                Pool::Short,
                Some(Route::Acquire),
            ),
        )
        .route(
            "/v1/renew/stream",
            // The leader's alone, but never forwarded: a follower refuses
            // it (503) and the client renews through `/v1/renew`.
            open(
                post(leases::stream::renew_stream),
                Need::Known,
                Pool::Renew,
                None,
            ),
        )
        .route(
            "/v1/leases/{name}/watch",
            open(
                get(reads::watch),
                Need::Lease(Right::Read),
                Pool::Long,
                None,
            ),
        )
        .route(
            // Not under /v1/leases/: "watch" is a valid lease name. The
            // handler takes its own `long` seat for as long as it streams.
            "/v1/watch",
            open(
                get(prefix_watch::watch_prefix),
                Need::Prefix(Right::Read),
                Pool::Short,
                None,
            ),
        )
}

/// The lease routes: every call on a lease, the batch renewal and the list.
fn lease_routes(state: &ApiState) -> Router<ApiState> {
    let leader_needs =
        |route, need, kind| guarded(state, route, need, kind, Some(Route::Call), Lasting::Brief);
    open_routes(state)
        .route(
            "/v1/leases/{name}/renew",
            leader_needs(
                post(leases::renew::renew),
                Need::Lease(Right::Acquire),
                Pool::Renew,
            ),
        )
        .route(
            "/v1/renew",
            // Each renewal's right is checked in the handler.
            guarded(
                state,
                post(leases::batch::renew_batch),
                Need::Known,
                Pool::Renew,
                Some(Route::Spanning),
                Lasting::Brief,
            ),
        )
        .route(
            "/v1/leases/{name}/release",
            leader_needs(
                post(leases::release::release),
                Need::Lease(Right::Acquire),
                Pool::Short,
            ),
        )
        .route(
            "/v1/leases/{name}/handover",
            leader_needs(
                post(leases::handover::handover),
                Need::Lease(Right::Acquire),
                Pool::Short,
            ),
        )
        .route(
            "/v1/leases/{name}/revoke",
            leader_needs(
                post(leases::revoke::revoke),
                Need::Lease(Right::Admin),
                Pool::Short,
            ),
        )
        .route(
            "/v1/leases/{name}",
            leader_needs(get(reads::get_lease), Need::Lease(Right::Read), Pool::Short),
        )
        .route(
            "/v1/leases/{name}/history",
            leader_needs(get(history::history), Need::Lease(Right::Read), Pool::Short),
        )
        .route(
            "/v1/leases",
            guarded(
                state,
                get(reads::list_leases),
                Need::Prefix(Right::Read),
                Pool::Short,
                Some(Route::Spanning),
                Lasting::Brief,
            ),
        )
}

/// The status pages: `/ui` and a lease's page read a session cookie
/// (`ui/signed_in.rs`, on these two routes alone) and need `read` like the
/// list; signing in and out take a seat of the address's share (no
/// principal yet). Every answer carries `ui/headers.rs`'s headers.
fn ui_routes(state: &ApiState, status: Arc<StatusPage>) -> Router<ApiState> {
    let needs = |route, need, kind| guarded(state, route, need, kind, None, Lasting::Brief);
    let session = || from_fn_with_state(state.clone(), ui::signed_in::session_from_cookie);
    let seat = || from_fn_with_state((state.clone(), Pool::Short), admit::admit);
    Router::new()
        .route(
            "/ui",
            needs(get(ui::page), Need::Prefix(Right::Read), Pool::Short).route_layer(session()),
        )
        .route(
            "/ui/leases/{name}",
            needs(get(ui::lease::page), Need::Lease(Right::Read), Pool::Short)
                .route_layer(session()),
        )
        .route(
            "/ui/login",
            get(ui::login::form).merge(post(ui::login::login).route_layer(seat())),
        )
        .route("/ui/logout", post(ui::login::logout).route_layer(seat()))
        .layer(Extension(status))
        .layer(axum::middleware::from_fn(ui::headers::secure))
}

/// The client API routes. Raft RPC is not among them (see
/// [`crate::peer::server::peer_router`]). Each route names what its caller
/// needs, the pool of seats it takes, and whether only the leader serves it
/// ([`guarded`]); health, keys and the document are open to all; under a
/// policy `/metrics` needs a known principal (its labels name principals).
pub fn router(state: ApiState, status: Arc<StatusPage>) -> Router {
    let leader_needs =
        |route, need, kind| guarded(&state, route, need, kind, Some(Route::Call), Lasting::Brief);
    let needs = |route, need, kind| guarded(&state, route, need, kind, None, Lasting::Brief);
    lease_routes(&state)
        .route(
            "/v1/cluster/rotate-key",
            leader_needs(post(cluster::rotate_key), Need::Cluster, Pool::Short),
        )
        .route(
            "/v1/cluster/members",
            leader_needs(post(members::add_member), Need::Cluster, Pool::Short),
        )
        .route(
            "/v1/cluster/members/{id}",
            leader_needs(delete(members::remove_member), Need::Cluster, Pool::Short),
        )
        .route(
            "/v1/cluster",
            needs(get(cluster::cluster), Need::Known, Pool::Short),
        )
        .route("/v1/jwks", get(cluster::jwks))
        .route("/healthz", get(cluster::healthz))
        .route("/livez", get(cluster::healthz))
        .route("/readyz", get(cluster::readyz))
        .route(
            "/metrics",
            needs(get(cluster::metrics), Need::Known, Pool::Short),
        )
        .route("/openapi.json", get(openapi::serve))
        .merge(ui_routes(&state, status))
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .with_state(state)
}
