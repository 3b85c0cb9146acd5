//! What the cluster and the gateway answer, as the SDK hands it out.

use bytes::Bytes;
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
