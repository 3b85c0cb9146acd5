//! API keys: the header that carries one, fresh keys, key files, and the
//! `sha256:<hex>` digests the policy file holds instead of the keys.

use std::path::{Path, PathBuf};

use ring::digest::{digest, SHA256};

use crate::policy::error::PolicyError;

/// The request header that carries a principal's API key.
pub const KEY_HEADER: &str = "x-palisade-key";

/// `sha256:<64 hex>` → the digest.
pub(crate) fn parse_digest(text: &str) -> Option<[u8; 32]> {
    let hex = text.strip_prefix("sha256:")?;
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The policy-file form of `key`'s digest: `sha256:<hex>`.
pub fn key_digest(key: &str) -> String {
    let digest = digest(&SHA256, key.as_bytes());
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// A fresh API key: `pal_` and 64 hex digits (256 bits from the OS RNG).
///
/// # Errors
/// The OS RNG failed.
pub fn new_key() -> Result<String, PolicyError> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| PolicyError::Io {
            path: PathBuf::from("/dev/urandom"),
            source: std::io::Error::other("the OS RNG failed"),
        })?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("pal_{hex}"))
}

/// Reads an API key file (the key is its first line).
///
/// # Errors
/// [`PolicyError::Io`].
pub fn read_key(path: &Path) -> Result<String, PolicyError> {
    let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Io {
        path: path.to_owned(),
        source,
    })?;
    Ok(text.lines().next().unwrap_or("").trim().to_owned())
}
