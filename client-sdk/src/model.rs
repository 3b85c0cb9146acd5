//! What the cluster and the gateway answer, as the SDK hands it out.

use bytes::Bytes;
use palisade_names::GrantSecret;
use serde::{Deserialize, Serialize};

/// A lease as the cluster reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseInfo {
    /// The lease name.
    pub lease: String,
    /// The holder, `None` when free.
    pub holder: Option<String>,
    /// The token of the latest grant.
    pub token: u64,
    /// The ttl of the latest grant.
    pub ttl_ms: u64,
    /// How many times the holder changed.
    pub transitions: u64,
    /// Log index of the last change (for [`crate::Client::watch`]).
    pub modify_index: u64,
    /// Time left until the leader's deadline for the current grant, when
    /// the lease is held and the answering leader tracks it (`None` for a
    /// free lease, or from a watch a follower answered).
    #[serde(default)]
    pub expires_in_ms: Option<u64>,
    /// The current grant was revoked (or preempted): renewals are refused
    /// and it ends at its deadline.
    #[serde(default)]
    pub revoked: bool,
    /// When the current grant began (RFC 3339 UTC with milliseconds, the
    /// proposing leader's clock): `None` when free, or when the cluster no
    /// longer keeps the transition that made it (or predates the field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquire_time: Option<String>,
    /// When the current grant was last renewed, as the leader knows it
    /// (RFC 3339 UTC with milliseconds): its last renewal or repeated
    /// acquire, else when that leader began tracking it. `None` when free
    /// and in answers of a node that does not lead (a watch a follower
    /// served).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_time: Option<String>,
    /// Every other field the server answered, kept whole (`reserved`,
    /// `priority`, `preemptible`, `preempted_by`, `lock_delay_ms`,
    /// `max_hold_ms`, `lock_delayed`, `partition`, and later ones), so what
    /// is printed as the server's document is that document.
    #[serde(flatten)]
    pub more: serde_json::Map<String, serde_json::Value>,
}

/// A grant as the cluster answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// The lease name.
    pub lease: String,
    /// The holder.
    pub holder: String,
    /// The fencing token.
    pub token: u64,
    /// The granted ttl.
    pub ttl_ms: u64,
    /// The signed lease token for the gateway.
    pub jwt: String,
    /// Which acquire this grant came from: a repeated acquire by the holder
    /// keeps the token but gets a new index, and a release naming an older
    /// index frees nothing. `None` from clusters that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant_index: Option<u64>,
    /// The grant's secret: renew, release and a repeated acquire present it.
    /// Only the acquire answers it (`None` in a renewal's answer, and from
    /// clusters that predate secrets). `Debug` does not show it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<GrantSecret>,
}

impl Grant {
    /// What names this grant in renew and release.
    pub fn id(&self) -> GrantId {
        GrantId {
            lease: self.lease.clone(),
            holder: self.holder.clone(),
            token: self.token,
            grant_index: self.grant_index,
            secret: self.secret.clone(),
        }
    }
}

/// Names one grant, with the secret that opens it: what
/// [`crate::Client::renew_grant`] and [`crate::Client::release_grant`] need.
/// Whoever has it can renew and release the grant; keep it like a password.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantId {
    /// The lease name.
    pub lease: String,
    /// The holder.
    pub holder: String,
    /// The fencing token.
    pub token: u64,
    /// The acquire the holder's handle came from (see [`Grant::grant_index`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant_index: Option<u64>,
    /// The grant's secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<GrantSecret>,
}

/// A stored object read through the gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    /// The bytes.
    pub value: Bytes,
    /// The version (ETag).
    pub version: String,
    /// The token of the write that stored it.
    pub token: u64,
}

/// Percent-encodes each segment of a key, keeping the `/` between them.
pub fn encode_key(key: &str) -> String {
    const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    key.split('/')
        .map(|segment| percent_encoding::utf8_percent_encode(segment, SEGMENT).to_string())
        .collect::<Vec<_>>()
        .join("/")
}

/// One transition of a lease ([`crate::Client::history`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transition {
    /// The log index of the entry that made it.
    pub index: u64,
    /// When it was proposed, on the proposer's clock (ms since the Unix
    /// epoch); `None` for entries older than stamps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<u64>,
    /// The same instant in RFC 3339 UTC with milliseconds
    /// (`2026-11-28T00:40:12.345Z`); `None` with `at_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// Why: `acquire`, `claim`, `handover`, `release`, `expire`, `preempt`
    /// or `revoke`.
    pub cause: String,
    /// The grant it is about: the new one (acquire, claim, handover) or the
    /// one that ended or was revoked.
    pub holder: Option<String>,
    /// That grant's token.
    pub token: u64,
}
