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
//! Inside, each file uses only the ones below it (by type, not only by
//! path): `elector` → `admin` → `client` → `acquire`, `watch` → `watch_cursor`, `lease` → `postgres`, `lease` → `renew_queue` →
//! `renew_stream` → `renew_batch` → `hedge` → `transport` (with
//! `transport/config`, `transport/answer`, `transport/release_gates`,
//! `transport/nodes`, `transport/partitions`, `transport/routes` beneath
//! it) → `model`; `error` is used by all.
//! - `transport.rs`: the HTTP client, the one retry loop, the calls on one
//!   grant, gateway calls, the endpoint tried first (the leader a
//!   follower's answer names, `transport/nodes.rs`); built from a
//!   [`ClientConfig`] (`transport/config.rs`). With several partitions a
//!   call on one lease goes to its partition's leader first
//!   (`transport/partitions.rs`, `transport/routes.rs`).
//! - `hedge.rs`: every renewal attempt bounded by a slice of the time its
//!   lease has left, then another node asked too; the first answer wins.
//! - `renew_queue.rs`: the queue that gathers a client's renewals into batch
//!   requests or stream frames (`renew_stream.rs`), split per partition
//!   leader with several partitions; a [`Lease`] renews through it.
//! - `lease.rs`: [`Lease`], background renewal and the safe deadline.
//! - `acquire.rs`: [`AcquireOptions`] and the acquire loop.
//! - `client.rs`: [`Client`], the public calls (the operator's in
//!   `admin.rs`); `elector.rs`: [`Elector`]; `watch.rs`: [`PrefixWatch`],
//!   one stream of a prefix's changes (of every partition, resumed from a
//!   [`WatchCursor`], `watch_cursor.rs`).
//! - `model.rs`: the wire types; `error.rs`: [`Error`].
//! - `postgres.rs` (feature `postgres`): fenced transactions in your own
//!   PostgreSQL; beside `lease.rs`, which uses it for
//!   `Lease::fenced_transaction`.

mod acquire;
mod admin;
mod client;
mod elector;
mod error;
mod hedge;
mod lease;
mod model;
mod objects;
#[cfg(feature = "postgres")]
pub mod postgres;
mod renew_batch;
mod renew_queue;
mod renew_stream;
mod transport;
mod watch;
mod watch_cursor;

pub use acquire::AcquireOptions;
pub use client::Client;
pub use elector::{Elector, ElectorEvent};
pub use error::Error;
pub use lease::Lease;
pub use model::{encode_key, Grant, GrantId, LeaseInfo, Object, Transition};
pub use objects::{Deleted, ObjectInfo, ObjectPage, Precondition, Written};
pub use palisade_names::GrantSecret;
pub use tokio_util::sync::CancellationToken;
pub use transport::config::{ApiKey, ClientConfig, ClientIdentity, API_KEY_HEADER};
pub use transport::partitions::Partitions;
pub use watch::{PrefixWatch, WatchEvent};
pub use watch_cursor::WatchCursor;
