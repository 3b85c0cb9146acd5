//! The storage gateway: HTTP in front of a [`FencedStore`](palisade_store::FencedStore).
//!
//! A request flows: request id and tracing ([`router`]) → deadline
//! ([`request_deadline`]) → the caller's rights under the policy, if any
//! (`policy.rs`) → the handler of its resource ([`objects`],
//! [`fences`]) → lease-token check ([`LeaseToken`], keys from [`jwks`]) →
//! the store, which checks the fence and writes in one atomic, durable step.
//! [`ApiError`] is the only place a status is chosen.
//!
//! The gateway never calls the election cluster except to fetch its public
//! keys: it trusts the signed token and nothing else.
//!
//! Files:
//! - `router.rs`: [`router`], the routes and their middleware, and
//!   [`request_deadline`]; `server.rs`: [`serve`] on `palisade_serve`'s loop.
//! - `objects.rs`, `fences.rs`: one per resource, `listing.rs` the objects
//!   under a prefix; `precondition.rs`: `If-Match`/`If-None-Match` as the
//!   store's precondition; `health.rs`: the probes and `/metrics`.
//! - `schema.rs`: every type the OpenAPI document (`openapi.rs`) names, and
//!   the error lists the routes share.
//! - `extract.rs`: the [`LeaseToken`] extractor; `verify.rs`: the
//!   [`Verifier`] behind it; `jwks.rs`: the keys it checks with.
//! - `policy.rs`: the policy middleware; `paths.rs`: keys and lease
//!   names from paths; `body.rs`: a body under a size limit.
//! - `audit.rs`: a stale write into the fencing audit; `observe.rs`: the
//!   metrics and the audit, which the store keeps
//!   ([`FencingAudit`](palisade_store::FencingAudit)): this process's, or
//!   the one every gateway on one PostgreSQL database shares. The gateway
//!   names no engine.
//! - `error.rs`: [`ApiError`]; `config.rs`: [`GatewayConfig`]; `state.rs`:
//!   [`AppState`].

pub mod fences;
pub mod jwks;
pub mod objects;
pub mod observe;
pub mod openapi;
pub mod paths;
pub mod verify;

mod admit;
mod audit;
mod body;
mod config;
mod error;
mod extract;
mod health;
mod listing;
mod policy;
mod precondition;
mod router;
mod schema;
mod server;
mod state;

pub use config::GatewayConfig;
pub use error::ApiError;
pub use jwks::{JwksCache, KeySource};
pub use router::{request_deadline, router};
pub use server::serve;
pub use state::{AppParts, AppState};
pub use verify::{LeaseClaims, LeaseToken, Verifier};
