//! Palisade's shared vocabulary: what a lease name, an object key and a fencing
//! token may be. The election cluster, the store, the gateway and the SDK all
//! validate through these constructors, so they agree on every edge case.

use std::fmt;

mod holder;
pub mod text;
pub mod time;

pub use holder::{Holder, InvalidHolder, MAX_HOLDER_LEN};

/// Why a name or token was refused; the text says what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// A lease name or object key breaks the grammar.
    #[error("{0}")]
    InvalidKey(String),
    /// A write token outside `1..=MAX_TOKEN`.
    #[error("token {0} is out of range (1..=2^63-1)")]
    InvalidToken(u64),
}

/// A grant secret that is too short, too long or not URL-safe text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("secret must be {MIN_SECRET_LEN}..={MAX_SECRET_LEN} characters of A-Z a-z 0-9 - _")]
pub struct InvalidSecret;

/// The longest lease name, in bytes (from the contract: `[A-Za-z0-9._-]{1,128}`).
pub const MAX_LEASE_NAME_LEN: usize = 128;
/// The longest object key, in bytes, lease segment included.
pub const MAX_KEY_LEN: usize = 1024;
/// The largest fencing token a write may carry.
///
/// Tokens are Raft log indexes, so they never come close; the bound keeps them
/// representable as a signed 64-bit integer in every client language, and stops
/// a single forged or corrupted token from raising a fence beyond any future
/// grant (which would lock the lease out forever).
pub const MAX_TOKEN: u64 = i64::MAX as u64;

/// A lease name: one path segment of `[A-Za-z0-9._-]{1,128}`, not `.` or `..`.
///
/// Serialized as the bare string; deserializing checks the grammar again, so a
/// name read from a log, a snapshot or a peer is as valid as one a client sent.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct LeaseName(String);

impl TryFrom<String> for LeaseName {
    type Error = NameError;

    fn try_from(name: String) -> Result<Self, NameError> {
        Self::new(&name)
    }
}

impl From<LeaseName> for String {
    fn from(name: LeaseName) -> String {
        name.0
    }
}

impl std::borrow::Borrow<str> for LeaseName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl LeaseName {
    /// Checks `name` against the contract's grammar.
    ///
    /// # Errors
    /// [`NameError::InvalidKey`] naming what is wrong with it.
    pub fn new(name: &str) -> Result<Self, NameError> {
        if name.is_empty() {
            return Err(NameError::InvalidKey("lease name is empty".into()));
        }
        if name.len() > MAX_LEASE_NAME_LEN {
            return Err(NameError::InvalidKey(format!(
                "lease name is longer than {MAX_LEASE_NAME_LEN} bytes"
            )));
        }
        if name == "." || name == ".." {
            return Err(NameError::InvalidKey(format!(
                "lease name may not be {name:?}"
            )));
        }
        if name.contains('/') {
            return Err(NameError::InvalidKey(format!(
                "lease name {name:?} has '/': a lease name is one segment \
                 (A-Z a-z 0-9 . _ -); keys under a lease, such as orders/state, \
                 name objects at the gateway, not leases"
            )));
        }
        if let Some(bad) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(NameError::InvalidKey(format!(
                "lease name has {bad:?}; allowed are A-Z a-z 0-9 . _ -"
            )));
        }
        Ok(Self(name.to_owned()))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LeaseName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LeaseName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// An object key: `{lease}` or `{lease}/{rest}`.
///
/// `rest` is any UTF-8 made of non-empty segments that are not `.` or `..`
/// and hold no control character and no bidirectional control
/// ([`text::BIDI_CONTROLS`]);
/// the whole key is at most [`MAX_KEY_LEN`] bytes. The first segment names the
/// lease whose fence covers the object.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ObjectKey {
    /// The whole key, as stored.
    full: String,
    /// The lease segment, kept apart so callers never re-split the key.
    lease: LeaseName,
}

impl ObjectKey {
    /// Checks an already percent-decoded key.
    ///
    /// # Errors
    /// [`NameError::InvalidKey`] naming what is wrong with it.
    pub fn new(key: &str) -> Result<Self, NameError> {
        if key.is_empty() {
            return Err(NameError::InvalidKey("key is empty".into()));
        }
        if key.len() > MAX_KEY_LEN {
            return Err(NameError::InvalidKey(format!(
                "key is longer than {MAX_KEY_LEN} bytes"
            )));
        }
        let mut segments = key.split('/');
        let lease = LeaseName::new(segments.next().unwrap_or_default())?;
        for segment in segments {
            match segment {
                "" => return Err(NameError::InvalidKey("key has an empty segment".into())),
                "." | ".." => {
                    return Err(NameError::InvalidKey(format!(
                        "key has a {segment:?} segment"
                    )))
                }
                s if s.chars().any(char::is_control) => {
                    return Err(NameError::InvalidKey("key has a control character".into()))
                }
                s if text::bidi_control(s).is_some() => {
                    return Err(NameError::InvalidKey(
                        text::refuse_bidi("key", key).err().unwrap_or_default(),
                    ))
                }
                _ => {}
            }
        }
        Ok(Self {
            full: key.to_owned(),
            lease,
        })
    }

    /// The whole key.
    pub fn as_str(&self) -> &str {
        &self.full
    }

    /// The lease whose fence covers this key.
    pub fn lease(&self) -> &LeaseName {
        &self.lease
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full)
    }
}

impl fmt::Debug for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.full, f)
    }
}

/// A fencing token: strictly increasing over the grants of one lease.
///
/// `FencingToken(0)` is the fence of a lease never written; no grant carries 0.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Debug,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(transparent)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// A token a write may carry: `1..=MAX_TOKEN`.
    ///
    /// # Errors
    /// [`NameError::InvalidToken`] for 0 or anything above [`MAX_TOKEN`].
    pub fn for_write(token: u64) -> Result<Self, NameError> {
        if token == 0 || token > MAX_TOKEN {
            return Err(NameError::InvalidToken(token));
        }
        Ok(Self(token))
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The shortest grant secret: 32 characters are at least 128 bits whether
/// they are hex or base64url.
pub const MIN_SECRET_LEN: usize = 32;
/// The longest grant secret.
pub const MAX_SECRET_LEN: usize = 128;

/// The secret of one grant: only the client that acquired it knows it, and
/// renew, release and a repeated acquire must present it. The cluster keeps
/// only a hash. `Debug` never shows it; `Display` does not exist — use
/// [`GrantSecret::expose`] where the text must leave the process (the wire).
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct GrantSecret(String);

impl GrantSecret {
    /// Checks `secret`: [`MIN_SECRET_LEN`]..=[`MAX_SECRET_LEN`] characters of
    /// `[A-Za-z0-9_-]` (hex or base64url).
    ///
    /// # Errors
    /// [`InvalidSecret`].
    pub fn new(secret: &str) -> Result<Self, InvalidSecret> {
        let url_safe = secret
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !url_safe || secret.len() < MIN_SECRET_LEN || secret.len() > MAX_SECRET_LEN {
            return Err(InvalidSecret);
        }
        Ok(Self(secret.to_owned()))
    }

    /// The secret text, for the request that must carry it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for GrantSecret {
    type Error = InvalidSecret;

    fn try_from(secret: String) -> Result<Self, InvalidSecret> {
        Self::new(&secret)
    }
}

impl From<GrantSecret> for String {
    fn from(secret: GrantSecret) -> String {
        secret.0
    }
}

impl fmt::Debug for GrantSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("GrantSecret(<redacted>)")
    }
}

/// The claims of a lease JWT (the contract's token format). The cluster signs
/// them with EdDSA; gateways verify them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LeaseClaims {
    /// Always [`ISSUER`].
    pub iss: String,
    /// The holder.
    pub sub: String,
    /// The lease name.
    pub lease: String,
    /// The fencing token.
    pub token: u64,
    /// Issued at, seconds since the Unix epoch.
    pub iat: u64,
    /// The lease's expiry, seconds since the Unix epoch.
    pub exp: u64,
}

/// The `iss` of every lease token.
pub const ISSUER: &str = "palisade";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_long_url_safe_and_never_debug_printed() {
        let good = "0123456789abcdef0123456789abcdef";
        let secret = GrantSecret::new(good).expect("32 hex characters");
        assert!(!format!("{secret:?}").contains("0123"));
        assert_eq!(secret.expose(), good);
        for bad in [
            &good[1..],
            "0123456789abcdef0123456789abcde=",
            &"a".repeat(129),
            "",
        ] {
            assert!(GrantSecret::new(bad).is_err(), "{bad:?}");
        }
        let parsed: Result<GrantSecret, _> = serde_json::from_str("\"short\"");
        assert!(parsed.is_err());
    }

    #[test]
    fn lease_names_follow_the_contract() {
        for good in ["a", "A.b_c-9", &"x".repeat(128), "..."] {
            assert!(LeaseName::new(good).is_ok(), "{good:?}");
        }
        for bad in ["", ".", "..", "a/b", "a b", "é", &"x".repeat(129), "a%2F"] {
            assert!(LeaseName::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn keys_are_bounded_and_have_no_dot_segments() {
        let key = ObjectKey::new("jobs/2026/ü.txt").expect("valid");
        assert_eq!(key.lease().as_str(), "jobs");
        assert!(ObjectKey::new("jobs").is_ok());
        for bad in [
            "",
            "/a",
            "a/",
            "a//b",
            "a/./b",
            "a/../b",
            "../a",
            "a/b\n",
            "a/invoice\u{202E}fdp.exe",
            "a/\u{2066}b",
            &format!("a/{}", "x".repeat(MAX_KEY_LEN)),
        ] {
            assert!(ObjectKey::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn write_tokens_exclude_zero_and_huge() {
        assert!(FencingToken::for_write(0).is_err());
        assert!(FencingToken::for_write(u64::MAX).is_err());
        assert!(FencingToken::for_write(MAX_TOKEN + 1).is_err());
        assert_eq!(
            FencingToken::for_write(MAX_TOKEN).expect("max"),
            FencingToken(MAX_TOKEN)
        );
    }
}
