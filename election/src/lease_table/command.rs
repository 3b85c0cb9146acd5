//! What goes through the Raft log, and what applying it answers.
//!
//! Every change to the lease table is a [`Command`] in a log entry;
//! [`crate::lease_table::table::LeaseTable::apply`] turns it into a [`CommandResult`]
//! deterministically. Commands carry everything apply needs: no clock, no
//! randomness, no node-local state (the proposer's clock travels in a
//! [`Command::Stamped`] entry, for the lease history only).

use palisade_names::{FencingToken, GrantSecret, Holder, LeaseName};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// A change proposed to the lease table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Grant `lease` to `holder` if it is free; idempotent for the current holder.
    Acquire {
        /// The lease name.
        lease: LeaseName,
        /// Who asks.
        holder: Holder,
        /// How long the grant lasts without renewal.
        ttl_ms: u64,
        /// The hash of the grant's secret: a new grant keeps it, and a
        /// repeated acquire must carry the same one (`None` only in entries
        /// written before grants had secrets).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        secret: Option<SecretHash>,
        /// Priority, preemptibility, lock-delay and max-hold of the grant.
        #[serde(default, skip_serializing_if = "Terms::is_default")]
        terms: Terms,
        /// The requester waits for the lease, so a higher priority than a
        /// preemptible holder's preempts it (a requester that does not wait
        /// would not be there to take the lease).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        preempt: bool,
        /// The `modify_index` of the free, lock-delayed record whose delay
        /// the leader saw pass before proposing this; 0 when the lease was
        /// not free with a lock-delay then. A lease that a later change
        /// (an expiry applied in between) left lock-delayed is not granted:
        /// the answer is [`CommandResult::LockDelayed`] and the leader
        /// waits the delay out first. `None` in entries written before
        /// this check existed (replayed as they were applied then).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        delay_seen: Option<u64>,
        /// The principal (API key) that asks, when the node runs a policy:
        /// a reservation for a named principal opens only to it, so a
        /// holder name alone cannot take another's handover or preemption.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        principal: Option<String>,
    },
    /// Hand `holder`'s grant `token` of `lease` to `to`: a new grant with a
    /// higher token, reserved for `to` for `window_ms` (only `to`'s acquire
    /// takes it, with its own secret and ttl; unclaimed, it expires).
    Handover {
        /// The lease name.
        lease: LeaseName,
        /// The current holder.
        holder: Holder,
        /// Its grant's token.
        token: FencingToken,
        /// The hash of the secret the holder presented.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        secret: Option<SecretHash>,
        /// The successor.
        to: Holder,
        /// The successor's principal: only its acquire takes the lease.
        /// `None` without a policy (then the holder name suffices).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        to_principal: Option<String>,
        /// How long the lease waits for the successor.
        window_ms: u64,
    },
    /// Free `lease` if `holder` holds it with `token`.
    Release {
        /// The lease name.
        lease: LeaseName,
        /// Who asks.
        holder: Holder,
        /// The token of the grant being released.
        token: FencingToken,
        /// The `grant_index` of the handle releasing it, if known: a release
        /// from a handle older than the latest (repeated) acquire frees
        /// nothing.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        grant_index: Option<u64>,
        /// The hash of the secret the releasing client presented.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        secret: Option<SecretHash>,
    },
    /// Free `lease` if its current grant is still `token`. Proposed only by the
    /// Raft leader, when its deadline for that grant has passed.
    Expire {
        /// The lease name.
        lease: LeaseName,
        /// The grant that expired; a newer grant is left alone.
        token: FencingToken,
        /// The grant was a reservation (a handover's or a preemption's) that
        /// nobody had claimed when the leader proposed this: if the claim
        /// applies first (it keeps the token), this leaves the claimed grant
        /// alone, so the claimant is never told it holds a lease that this
        /// entry then frees.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        unclaimed: bool,
    },
    /// Stop renewals of `lease`'s grant `token`: the holder learns it on its
    /// next renewal, and the grant expires at its current deadline, so no
    /// holder is cut short while its SDK still believes it holds (S3).
    Revoke {
        /// The lease name.
        lease: LeaseName,
        /// The grant to revoke; a newer grant is left alone.
        token: FencingToken,
    },
    /// Make a new key the one that signs; the current one keeps being
    /// published (tokens it signed stay valid) until a `RetireKey`.
    RotateKey {
        /// The new key's id.
        kid: String,
        /// The new Ed25519 secret key (32 bytes).
        secret: KeySecret,
    },
    /// Stop publishing a key that no longer signs. Proposed by the leader
    /// once every token the key signed has expired (the longest ttl after
    /// the rotation, on the leader's clock).
    RetireKey {
        /// The retired key's id.
        kid: String,
    },
    /// Forget free leases: each record leaves the table if it is still free
    /// and unchanged since `modify_index`. Proposed by the leader for leases
    /// free for longer than its reclaim delay, so a table of names used once
    /// does not grow forever. Tokens stay monotonic: they are log indexes,
    /// not counters kept in the record.
    Reclaim {
        /// The leases, each with the `modify_index` of the release or expiry
        /// that freed it (a lease changed since is left alone).
        leases: Vec<(LeaseName, u64)>,
    },
    /// Install the cluster's signing key, if it has none yet. Proposed by the
    /// first leader; the key travels in the log so every node can sign.
    InstallKey {
        /// The key id published in the JWKS and in token headers.
        kid: String,
        /// The Ed25519 secret key (32 bytes).
        secret: KeySecret,
    },
    /// `command`, stamped with the proposer's wall clock when it was
    /// proposed (ms since the Unix epoch): the time a lease's history shows,
    /// never a deadline. Entries written before stamps existed are bare.
    Stamped {
        /// The proposer's clock.
        at_ms: u64,
        /// How many transitions the lease keeps in its history, as the
        /// proposer was told (`--history-len`): carried in the entry so that
        /// every node trims alike, whatever its own flag. `None` in entries
        /// written before the bound was configurable: [`HISTORY_LEN`].
        ///
        /// [`HISTORY_LEN`]: super::history::HISTORY_LEN
        #[serde(default, skip_serializing_if = "Option::is_none")]
        history_len: Option<u16>,
        /// The command.
        command: Box<Command>,
    },
}

impl Command {
    /// The lease this command changes, if it is about one.
    pub fn lease(&self) -> Option<&LeaseName> {
        match self {
            Command::Acquire { lease, .. }
            | Command::Handover { lease, .. }
            | Command::Release { lease, .. }
            | Command::Expire { lease, .. }
            | Command::Revoke { lease, .. } => Some(lease),
            // A reclaimed lease was free and stays free: nobody waits on it.
            Command::Reclaim { .. }
            | Command::RotateKey { .. }
            | Command::RetireKey { .. }
            | Command::InstallKey { .. } => None,
            Command::Stamped { command, .. } => command.lease(),
        }
    }
}

/// What a grant asked for beyond holder and ttl (the seed systems'
/// leadership semantics). The default asks for nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Terms {
    /// A waiting acquire of a higher priority preempts a preemptible grant;
    /// equal priority never does (the holder stays: stickiness).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub priority: u32,
    /// Whether a higher priority may preempt this grant.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preemptible: bool,
    /// After this grant *expires* (not after a release), the lease stays
    /// unavailable this long (Chubby's and Consul's lock-delay), so a
    /// crashed holder's writes in flight drain first.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub lock_delay_ms: u64,
    /// The grant is renewed for at most this long after it was granted (0:
    /// no cap), for leases that must rotate.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub max_hold_ms: u64,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's signature
fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

/// Whether `n` is zero (for `skip_serializing_if`).
#[allow(clippy::trivially_copy_pass_by_ref)] // serde's signature
pub(crate) fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

impl Terms {
    /// Whether these are the default terms (nothing asked).
    pub fn is_default(&self) -> bool {
        *self == Terms::default()
    }
}

/// The SHA-256 of a [`GrantSecret`]: what the log, the table and snapshots
/// keep instead of the secret, so none of them can be used to take a grant
/// over. Serialized as hex.
#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SecretHash([u8; 32]);

impl SecretHash {
    /// The hash of `secret`.
    pub fn of(secret: &GrantSecret) -> Self {
        Self(Sha256::digest(secret.expose().as_bytes()).into())
    }

    /// The hash's bytes (for the snapshot encoding).
    pub(crate) fn bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A hash from its bytes (as the snapshot encoding stores them).
    pub(crate) fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// Whether `presented` is the secret of this hash; `false` for `None`.
    /// Compared in constant time.
    pub fn matches(&self, presented: Option<&SecretHash>) -> bool {
        presented.is_some_and(|other| bool::from(self.0.ct_eq(&other.0)))
    }
}

impl PartialEq for SecretHash {
    fn eq(&self, other: &Self) -> bool {
        self.matches(Some(other))
    }
}

impl Eq for SecretHash {}

impl std::fmt::Debug for SecretHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretHash(..)")
    }
}

impl TryFrom<String> for SecretHash {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        let bad = || format!("secret hash {text:?} is not 64 hex digits");
        if text.len() != 64 {
            return Err(bad());
        }
        let mut bytes = [0u8; 32];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2).ok_or_else(bad)?, 16)
                .map_err(|_| bad())?;
        }
        Ok(Self(bytes))
    }
}

impl From<SecretHash> for String {
    fn from(hash: SecretHash) -> String {
        hash.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Secret key bytes. Serialized as they are (the log must not change), never
/// shown by `Debug`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct KeySecret(pub Vec<u8>);

impl std::fmt::Debug for KeySecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeySecret(<{} bytes, redacted>)", self.0.len())
    }
}

/// What applying a [`Command`] answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandResult {
    /// The lease is held by the requester with this token.
    Granted {
        /// The fencing token of the grant.
        token: FencingToken,
        /// The lease's ttl, as granted.
        ttl_ms: u64,
        /// False when the requester already held the lease (idempotent acquire).
        new_grant: bool,
        /// The index of this acquire (see `LeaseRecord::grant_index`).
        grant_index: u64,
    },
    /// The lease is held by someone else of a lower priority, who was
    /// preempted by this acquire: its grant is revoked (it ends at its
    /// deadline, or sooner if released).
    Preempting {
        /// The preempted holder.
        holder: Holder,
        /// Its token.
        token: FencingToken,
    },
    /// The lease was handed over: a grant reserved for the successor.
    HandedOver {
        /// The successor's token.
        token: FencingToken,
    },
    /// The lease is free but held back by a lock-delay the proposer did not
    /// see pass (see `Command::Acquire::delay_seen`).
    LockDelayed,
    /// The lease is held by someone else.
    Held {
        /// The current holder.
        holder: Holder,
        /// Its token.
        token: FencingToken,
    },
    /// The lease was released or expired.
    Freed,
    /// The grant will not be renewed again.
    Revoked,
    /// The requester does not hold the lease with that token (any more).
    Lost,
    /// Nothing to answer (blank or membership entries, key installs).
    None,
}

impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Acquire {
                lease,
                holder,
                ttl_ms,
                ..
            } => {
                write!(f, "acquire {lease} for {holder} ({ttl_ms} ms)")
            }
            Command::Release {
                lease,
                holder,
                token,
                ..
            } => {
                write!(f, "release {lease} by {holder} (token {token})")
            }
            Command::Handover {
                lease,
                holder,
                token,
                to,
                ..
            } => write!(f, "hand {lease} from {holder} (token {token}) to {to}"),
            Command::Expire { lease, token, .. } => write!(f, "expire {lease} (token {token})"),
            Command::Revoke { lease, token } => write!(f, "revoke {lease} (token {token})"),
            Command::Reclaim { leases } => write!(f, "reclaim {} free leases", leases.len()),
            // Never print the secret.
            Command::InstallKey { kid, .. } => write!(f, "install signing key {kid}"),
            Command::RotateKey { kid, .. } => write!(f, "rotate to signing key {kid}"),
            Command::RetireKey { kid } => write!(f, "retire signing key {kid}"),
            Command::Stamped { command, .. } => command.fmt(f),
        }
    }
}

/// What an `Acquire` entry asks for.
#[derive(Debug)]
pub struct Ask<'a> {
    /// Who asks.
    pub holder: &'a Holder,
    /// The ttl asked for.
    pub ttl_ms: u64,
    /// The hash of the caller's grant secret.
    pub secret: Option<SecretHash>,
    /// Priority, preemptibility, lock-delay, max-hold.
    pub terms: Terms,
    /// The caller waits and may preempt a lower priority.
    pub preempt: bool,
    /// The modify index of the lock-delayed freeing the caller waited out.
    pub delay_seen: Option<u64>,
    /// The caller's principal, under a policy.
    pub principal: Option<&'a str>,
}

/// The grant a holder's call names: who, which token, and the hash of the
/// secret it presented.
#[derive(Debug, Clone, Copy)]
pub struct Presented<'a> {
    pub holder: &'a str,
    pub token: FencingToken,
    pub secret: Option<&'a SecretHash>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Entries written before the commands used `LeaseName` and
    /// `FencingToken` read back the same, and write out byte for byte the same.
    #[test]
    fn the_log_format_is_unchanged() {
        let old = [
            r#"{"Acquire":{"lease":"jobs","holder":"w-1","ttl_ms":1500}}"#,
            r#"{"Release":{"lease":"jobs","holder":"w-1","token":7}}"#,
            r#"{"Release":{"lease":"jobs","holder":"w-1","token":7,"grant_index":9}}"#,
            r#"{"Expire":{"lease":"jobs","token":7}}"#,
            r#"{"InstallKey":{"kid":"k1","secret":[1,2,3]}}"#,
        ];
        for text in old {
            let command: Command = serde_json::from_str(text).expect(text);
            assert_eq!(serde_json::to_string(&command).expect("encode"), text);
        }
        let result = CommandResult::Granted {
            token: FencingToken(7),
            ttl_ms: 1500,
            new_grant: true,
            grant_index: 7,
        };
        assert_eq!(
            serde_json::to_string(&result).expect("encode"),
            r#"{"Granted":{"token":7,"ttl_ms":1500,"new_grant":true,"grant_index":7}}"#
        );
    }

    #[test]
    fn secret_hashes_round_trip_and_match_only_their_secret() {
        let secret = GrantSecret::new(&"s".repeat(40)).expect("secret");
        let other = GrantSecret::new(&"t".repeat(40)).expect("secret");
        let hash = SecretHash::of(&secret);
        let text = String::from(hash);
        assert_eq!(text.len(), 64);
        assert!(!text.contains("ssss"));
        let back = SecretHash::try_from(text).expect("hex");
        assert!(back.matches(Some(&hash)));
        assert!(!back.matches(Some(&SecretHash::of(&other))));
        assert!(!back.matches(None));
        assert!(SecretHash::try_from("zz".repeat(32)).is_err());
        assert!(SecretHash::try_from("é".repeat(32)).is_err());
    }

    #[test]
    fn a_bad_lease_name_in_an_entry_is_refused() {
        let forged = r#"{"Expire":{"lease":"../x","token":7}}"#;
        assert!(serde_json::from_str::<Command>(forged).is_err());
    }

    #[test]
    fn debug_never_shows_the_key() {
        let command = Command::InstallKey {
            kid: "k1".into(),
            secret: KeySecret(vec![0xAB; 32]),
        };
        let shown = format!("{command:?} {command}");
        assert!(!shown.contains("171") && !shown.contains("ab"), "{shown}");
    }
}
