//! Who may call a server: principals, their API keys and what each may do
//! with which lease names. Both servers load the same policy file.
//!
//! A principal is known by an API key sent as `x-palisade-key` on every
//! request (a header of its own, so it never clashes with the lease JWT in
//! `Authorization`). The policy file holds only SHA-256 digests of the keys,
//! so it is not a secret; the keys are (`palisade policy init` writes each to
//! a 0600 file).
//!
//! ```json
//! {
//!   "principals": {
//!     "orders-svc": {
//!       "keys": ["sha256:<64 hex digits>"],
//!       "acquire": ["orders."],
//!       "read": ["orders.", "shared."],
//!       "admin": [],
//!       "cluster": false
//!     }
//!   }
//! }
//! ```
//!
//! A right names lease-name prefixes (`""` is every lease):
//! - `acquire`: acquire, renew and release those leases, and write their
//!   objects and fences on the gateway (with the lease's JWT as well);
//! - `read`: read, list (the listed prefix must lie inside one) and watch
//!   them, and read their objects and fences on the gateway;
//! - `admin`: revoke their grants;
//! - `cluster: true`: rotate the signing key, add and remove members.
//!
//! Any known principal may read the cluster view and an election node's
//! `/metrics` (its labels name principals); `/healthz`, `/livez`, `/readyz`,
//! the gateway's `/metrics`, `/openapi.json` and `/v1/jwks` stay open. An unknown or missing key is 401, a known principal outside
//! its rights 403.
//!
//! Files: `rules.rs` a principal's rights ([`Rules`], [`Right`]),
//! `policy_file.rs` the JSON document, `principals.rs` the loaded
//! [`Policy`] and its decisions, `live.rs` the policy in force, reloaded on
//! SIGHUP ([`LivePolicy`]), `api_key.rs` API keys and their digests,
//! `add.rs` adding a principal to a policy file, `error.rs` the errors.

mod add;
mod api_key;
mod error;
mod live;
mod policy_file;
mod principals;
mod rules;

#[cfg(test)]
mod tests;

pub use add::add;
pub use api_key::{key_digest, new_key, read_key, KEY_HEADER};
pub use error::{Denied, PolicyError};
pub use live::LivePolicy;
pub use principals::{Policy, Principal};
pub use rules::{operator, Right, Rules};
