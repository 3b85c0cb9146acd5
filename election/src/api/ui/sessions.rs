//! [`Sessions`]: the status page's sign-ins, kept in this node's memory.
//!
//! Signing in (`login.rs`) trades an API key for a session: a random id of
//! 256 bits from the OS's CSPRNG, which is all the browser's cookie holds.
//! The key itself is never stored: a session keeps its principal and the
//! SHA-256 digest of the key it was opened with, and every use asks the
//! policy in force whether that key still names that principal, so a
//! principal (or a key) removed by a SIGHUP reload ends its sessions at
//! their next request. A session id is honoured on the status pages alone
//! (`mod.rs::session_from_cookie`); the API never reads a cookie.
//!
//! A session ends when it is unused for `idle`, `lifetime` after sign-in,
//! at sign-out, or when the table is full: at most `max_per_principal` per
//! principal and `max_sessions` in all, a new sign-in ending the oldest, so
//! a flood of sign-ins never grows memory. Sessions belong to the node
//! that opened them: another node does not know them, and a restart
//! forgets them all. Ids are kept only as their SHA-256 digests, looked up
//! by digest. Time is tokio's clock, so tests run it paused.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use palisade_serve::policy::{Policy, Principal};
use rand::RngCore;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::config::UiAccess;

/// The principal a valid session cookie stands for, put in the request's
/// extensions by the status pages' middleware (and read by
/// `authorize.rs`, on those routes only).
#[derive(Debug, Clone)]
pub struct SessionPrincipal(pub Principal);

/// The status page's sessions on this node.
#[derive(Debug)]
pub struct Sessions {
    /// Lifetimes and caps.
    limits: UiAccess,
    /// The sessions, under one lock (a sign-in or a page load holds it for
    /// a map lookup; an eviction walks at most the whole table once).
    table: Mutex<Table>,
}

/// One session.
#[derive(Debug)]
struct Session {
    /// Its place in sign-in order (the oldest is evicted first).
    seq: u64,
    principal: Principal,
    /// The SHA-256 digest of the API key it was opened with.
    key_digest: [u8; 32],
    opened: Instant,
    used: Instant,
}

/// The sessions by id digest, and in sign-in order.
#[derive(Debug, Default)]
struct Table {
    by_id: HashMap<[u8; 32], Session>,
    /// seq → id digest, oldest first.
    order: BTreeMap<u64, [u8; 32]>,
    /// Sessions per principal name.
    per_principal: HashMap<String, usize>,
    next_seq: u64,
}

impl Table {
    fn remove(&mut self, id: &[u8; 32]) {
        let Some(session) = self.by_id.remove(id) else {
            return;
        };
        self.order.remove(&session.seq);
        let name = &session.principal.0;
        if let Some(count) = self.per_principal.get_mut(name) {
            *count -= 1;
            if *count == 0 {
                self.per_principal.remove(name);
            }
        }
    }

    /// The oldest session, of `principal` if given.
    fn oldest(&self, principal: Option<&str>) -> Option<[u8; 32]> {
        self.order
            .values()
            .find(|id| {
                principal
                    .is_none_or(|name| self.by_id.get(*id).is_some_and(|s| s.principal.0 == name))
            })
            .copied()
    }
}

impl Sessions {
    /// An empty table with `limits`.
    pub fn new(limits: UiAccess) -> Self {
        Self {
            limits,
            table: Mutex::new(Table::default()),
        }
    }

    /// Opens a session for `principal`, signed in with the key whose digest
    /// is `key_digest`; its id (64 hex digits), for the cookie. Ends the
    /// principal's oldest session when it has `max_per_principal`, and the
    /// node's oldest when the table has `max_sessions`.
    pub fn open(&self, principal: Principal, key_digest: [u8; 32]) -> String {
        let mut raw = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut raw);
        let id: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let now = Instant::now();
        let mut table = palisade_plumbing::sync::lock(&self.table);
        let name = principal.0.clone();
        if table.per_principal.get(&name).copied().unwrap_or(0) >= self.limits.max_per_principal {
            if let Some(oldest) = table.oldest(Some(&name)) {
                table.remove(&oldest);
            }
        }
        if table.by_id.len() >= self.limits.max_sessions {
            self.drop_expired(&mut table, now);
        }
        while table.by_id.len() >= self.limits.max_sessions {
            let Some(oldest) = table.oldest(None) else {
                break;
            };
            table.remove(&oldest);
        }
        let seq = table.next_seq;
        table.next_seq += 1;
        let digest = digest_of(&id);
        table.order.insert(seq, digest);
        *table.per_principal.entry(name).or_default() += 1;
        table.by_id.insert(
            digest,
            Session {
                seq,
                principal,
                key_digest,
                opened: now,
                used: now,
            },
        );
        id
    }

    /// The principal of session `id` if it is open, within its limits, and
    /// `policy` still gives its key to its principal; the use counts as
    /// activity. A session that fails any of these is ended.
    pub fn check(&self, id: &str, policy: &Policy) -> Option<Principal> {
        let digest = digest_of(id);
        let now = Instant::now();
        let mut table = palisade_plumbing::sync::lock(&self.table);
        let session = table.by_id.get_mut(&digest)?;
        let live = !self.expired(session, now)
            && policy.principal_of_digest(&session.key_digest).as_ref() == Some(&session.principal);
        if !live {
            table.remove(&digest);
            return None;
        }
        session.used = now;
        Some(session.principal.clone())
    }

    /// Ends session `id` (sign-out); nothing if there is none.
    pub fn close(&self, id: &str) {
        palisade_plumbing::sync::lock(&self.table).remove(&digest_of(id));
    }

    /// Sessions kept now.
    pub fn len(&self) -> usize {
        palisade_plumbing::sync::lock(&self.table).by_id.len()
    }

    /// Whether no session is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The longest a session lasts (the cookie's `Max-Age`).
    pub fn lifetime(&self) -> std::time::Duration {
        self.limits.lifetime
    }

    fn expired(&self, session: &Session, now: Instant) -> bool {
        now.duration_since(session.used) >= self.limits.idle
            || now.duration_since(session.opened) >= self.limits.lifetime
    }

    fn drop_expired(&self, table: &mut Table, now: Instant) {
        let expired: Vec<[u8; 32]> = table
            .by_id
            .iter()
            .filter(|(_, s)| self.expired(s, now))
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            table.remove(&id);
        }
    }
}

/// The SHA-256 digest a session id is kept and looked up by.
fn digest_of(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

#[cfg(test)]
mod tests;
