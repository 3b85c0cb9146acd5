//! Palisade's Rust SDK: leases that are safe by default.
//!
//! - [`Client`] talks to the election cluster (any node; retries with backoff
//!   and jitter, never retries a 409) and, optionally, to a storage gateway.
//! - [`Client::acquire`] returns a [`Lease`] that renews itself, keeps a safe
//!   local deadline, raises the gateway fence right after acquiring, and
//!   stamps its token on every write; a write after the deadline is refused
//!   locally, and a fenced write means the lease is lost.
//! - [`Elector`] runs a task only while leading, for services with replicas.
//!
//! Errors keep transport trouble ([`Error::Unavailable`]) apart from what
//! means "stop leading" ([`Error::LeaseLost`], [`Error::Fenced`]) and from
//! [`Error::Held`].

//!
//! Inside: `client` and `lease` both build on `transport` (HTTP, the one
//! retry loop, release gates) and `model` (the wire types); neither imports
//! the other's internals, so the dependency runs one way:
//! `elector → client → lease → transport → model`. `batch` adds to the
//! transport the queue that gathers a client's renewals into batch requests.

mod batch;
mod client;
mod elector;
mod error;
mod lease;
mod model;
mod transport;

pub use client::{AcquireOptions, ApiKey, Client, ClientConfig};
pub use elector::{Elector, ElectorEvent};
pub use error::Error;
pub use lease::Lease;
pub use model::{encode_key, Grant, GrantId, LeaseInfo, Object};
pub use palisade_names::GrantSecret;
pub use tokio_util::sync::CancellationToken;

/// The request header that carries a client's API key (the servers'
/// `palisade_serve::policy::KEY_HEADER`).
pub const API_KEY_HEADER: &str = "x-palisade-key";
