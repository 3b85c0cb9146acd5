//! [`LeaseTable`]: the whole replicated state, and [`LeaseTable::apply`],
//! pure and deterministic: a short dispatch to one function per kind of
//! command (`acquire.rs`, `ending.rs`, `keys.rs`).

use std::collections::{BTreeMap, HashMap};

use palisade_names::LeaseName;
use serde::{Deserialize, Serialize};

use super::command::{Ask, Command, CommandResult, Presented};
use super::history;
use super::record::LeaseRecord;

/// The cluster's signing key, as replicated.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SigningKeyRecord {
    /// Key id.
    pub kid: String,
    /// Ed25519 secret key bytes.
    pub secret: Vec<u8>,
}

impl std::fmt::Debug for SigningKeyRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKeyRecord")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

/// All leases and the signing key: the whole replicated state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseTable {
    /// Leases ever granted, by name.
    pub leases: BTreeMap<LeaseName, LeaseRecord>,
    /// The key that signs new tokens, once installed.
    pub signing_key: Option<SigningKeyRecord>,
    /// Keys rotated out: still published (tokens they signed verify) until
    /// retired. Oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub previous_keys: Vec<SigningKeyRecord>,
    /// How many records each principal owns (`LeaseRecord::owner`): derived
    /// from `leases`, kept by apply, rebuilt by [`LeaseTable::index_owners`]
    /// wherever a table is read back (the snapshot decoder).
    #[serde(skip)]
    owned: HashMap<String, u64>,
}

impl LeaseTable {
    /// The table without its leases (what a snapshot's header holds).
    pub fn clone_without_leases(&self) -> Self {
        Self {
            leases: BTreeMap::new(),
            signing_key: self.signing_key.clone(),
            previous_keys: self.previous_keys.clone(),
            owned: HashMap::new(),
        }
    }

    /// How many leases have a holder (a walk of the table: `/metrics` and
    /// the status page's sampler, not a hot path).
    pub fn held(&self) -> u64 {
        self.leases.values().filter(|r| r.holder.is_some()).count() as u64
    }

    /// How many records `principal` owns: leases it holds, and leases it
    /// held that are free but not yet reclaimed.
    pub fn owned_by(&self, principal: &str) -> u64 {
        self.owned.get(principal).copied().unwrap_or(0)
    }

    /// Rebuilds the count of records per owner from the records.
    pub fn index_owners(&mut self) {
        self.owned.clear();
        for owner in self.leases.values().filter_map(|r| r.owner.as_ref()) {
            *self.owned.entry(owner.clone()).or_default() += 1;
        }
    }

    /// Moves one record of the count from `before` to `after` (either may
    /// be none: a record created, or reclaimed).
    pub(super) fn recount(&mut self, before: Option<String>, after: Option<&String>) {
        if before.as_ref() == after {
            return;
        }
        if let Some(before) = before {
            if let Some(n) = self.owned.get_mut(&before) {
                *n -= 1;
                if *n == 0 {
                    self.owned.remove(&before);
                }
            }
        }
        if let Some(after) = after {
            *self.owned.entry(after.clone()).or_default() += 1;
        }
    }

    /// Every key the cluster publishes: the signing one first, then the
    /// rotated-out ones not yet retired.
    pub fn published_keys(&self) -> impl Iterator<Item = &SigningKeyRecord> {
        self.signing_key
            .iter()
            .chain(self.previous_keys.iter().rev())
    }
}

impl LeaseTable {
    /// Applies the command of the log entry at `index`, and keeps the
    /// lease's history of what it changed. Pure: the result depends only on
    /// the table, `index` and `command` (its stamp included).
    pub fn apply(&mut self, index: u64, command: &Command) -> CommandResult {
        let (stamp, command) = command.unstamped();
        let lease = command.lease();
        let before = lease
            .and_then(|l| self.leases.get(l))
            .map(LeaseRecord::standing);
        let result = self.dispatch(index, command);
        if let Some(record) = lease.and_then(|l| self.leases.get_mut(l)) {
            let after = record.standing();
            let made = history::transition(index, stamp.at_ms, command, before.as_ref(), &after);
            if let Some(t) = made {
                history::push(&mut record.history, t, stamp.history_len());
            }
        }
        result
    }

    /// One function per kind of command.
    fn dispatch(&mut self, index: u64, command: &Command) -> CommandResult {
        match command {
            Command::Acquire {
                lease,
                holder,
                ttl_ms,
                secret,
                terms,
                preempt,
                delay_seen,
                principal,
            } => self.acquire(
                index,
                lease,
                &Ask {
                    holder,
                    ttl_ms: *ttl_ms,
                    secret: *secret,
                    terms: *terms,
                    preempt: *preempt,
                    delay_seen: *delay_seen,
                    principal: principal.as_deref(),
                },
            ),
            Command::Handover {
                lease,
                holder,
                token,
                secret,
                to,
                to_principal,
                window_ms,
            } => {
                let grant = Presented {
                    holder,
                    token: *token,
                    secret: secret.as_ref(),
                };
                self.hand_over(index, lease, grant, (to, to_principal.as_ref()), *window_ms)
            }
            Command::Release {
                lease,
                holder,
                token,
                grant_index,
                secret,
            } => {
                let grant = Presented {
                    holder,
                    token: *token,
                    secret: secret.as_ref(),
                };
                self.release(index, lease, grant, *grant_index)
            }
            Command::Expire {
                lease,
                token,
                unclaimed,
            } => self.expire(index, lease, *token, *unclaimed),
            Command::Revoke { lease, token } => self.revoke(index, lease, *token),
            Command::Reclaim { leases } => self.reclaim(leases),
            Command::RotateKey { kid, secret } => self.rotate_key(kid, secret),
            Command::RetireKey { kid } => self.retire_key(kid),
            Command::InstallKey { kid, secret } => self.install_key(kid, secret),
            Command::Stamped { command, .. } => self.dispatch(index, command),
        }
    }
}
