//! The fenced object store: the storage half of Palisade's fencing promise.
//!
//! Objects live under keys whose first segment names a lease. Each lease has one
//! *fence*: the highest fencing token the store has accepted for it. A write
//! (put, delete, or a bare fence bump) is accepted iff its token is at least the
//! fence, and it raises the fence to its token **in the same atomic step** as the
//! write. A refused write changes nothing. An acknowledged write is on disk.
//!
//! - `fenced_store.rs`: [`FencedStore`], the narrow trait the gateway
//!   programs against, and what its operations report ([`Written`],
//!   [`Deleted`], [`StoredObject`]).
//! - `sled_store.rs`: [`SledStore`], the trait on sled; `sled_store/`
//!   holds its [`SledStoreConfig`] (with [`StoreHooks`]) and its group
//!   commit. Nothing outside these names sled.
//! - `postgres_store.rs`: [`PostgresStore`], the trait on PostgreSQL for
//!   many gateways sharing one database; `postgres_store/` holds its
//!   [`PostgresStoreConfig`], its pool, its versioned schema and its
//!   [`FencingAudit`], shared by every gateway on the database.
//!   Nothing outside these names PostgreSQL.
//! - `audit.rs`: the fencing audit as a capability: [`FencingAudit`], its
//!   record ([`Refusal`], [`LeaseRefusals`]) and [`MemoryAudit`], a
//!   process's own.
//! - `hooks.rs`: [`StoreHooks`], what an engine tells its owner.
//! - `memory_store.rs`: [`MemoryStore`], the trait in memory, for tests of
//!   code above the store.
//! - `error.rs`: [`StoreError`].
//! - [`names`] (the `palisade-names` crate) holds the validated newtypes every
//!   operation takes.
//!
//! The same conformance suite (`conformance.rs`) runs against every backend,
//! and its audit checks (`conformance/audit.rs`) against every audit.

mod audit;
mod error;
mod fenced_store;
mod hooks;
mod memory_store;
mod postgres_store;
mod sled_store;

#[cfg(test)]
mod conformance;

pub use audit::{AuditAnswer, FencingAudit, LeaseRefusals, MemoryAudit, Refusal, AUDITED_LEASES};
pub use error::StoreError;
pub use fenced_store::{
    Deleted, FencedStore, ObjectPage, ObjectSummary, Precondition, StoredObject, Written,
    MAX_LIST_PAGE,
};
pub use hooks::StoreHooks;
pub use memory_store::MemoryStore;
pub use palisade_names as names;
pub use palisade_names::{FencingToken, LeaseName, NameError, ObjectKey, MAX_KEY_LEN, MAX_TOKEN};
pub use postgres_store::config::PostgresStoreConfig;
pub use postgres_store::connect_once as connect_postgres;
pub use postgres_store::schema::{LEASE_LOCK_CLASS, SCHEMA_VERSION};
pub use postgres_store::PostgresStore;
pub use sled_store::config::SledStoreConfig;
pub use sled_store::SledStore;
