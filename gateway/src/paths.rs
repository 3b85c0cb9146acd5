//! Turning a raw request path into an [`ObjectKey`] or [`LeaseName`].
//!
//! We decode percent-escapes ourselves, strictly: `%` must be followed by two
//! hex digits and the result must be UTF-8. Lenient decoders pass `%zz` through,
//! which would make two spellings of one key.

use palisade_store::{LeaseName, ObjectKey};

use crate::error::ApiError;

/// Decodes `raw` (a path suffix as sent) strictly.
///
/// # Errors
/// [`ApiError::InvalidKey`] on a bad escape or non-UTF-8 result.
pub fn percent_decode_strict(raw: &str) -> Result<String, ApiError> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| ApiError::InvalidKey("key has a bad percent-escape".into()))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out)
        .map_err(|_| ApiError::InvalidKey("key is not UTF-8 after percent-decoding".into()))
}

/// The object key in `path` after `prefix`.
///
/// # Errors
/// [`ApiError::InvalidKey`].
pub fn object_key(path: &str, prefix: &str) -> Result<ObjectKey, ApiError> {
    let raw = path.strip_prefix(prefix).unwrap_or_default();
    Ok(ObjectKey::new(&percent_decode_strict(raw)?)?)
}

/// The lease name in `path` after `prefix`.
///
/// # Errors
/// [`ApiError::InvalidKey`].
pub fn lease_name(path: &str, prefix: &str) -> Result<LeaseName, ApiError> {
    let raw = path.strip_prefix(prefix).unwrap_or_default();
    Ok(LeaseName::new(&percent_decode_strict(raw)?)?)
}

#[cfg(test)]
mod tests {
    use crate::paths::{object_key, percent_decode_strict};

    #[test]
    fn decodes_strictly() {
        assert_eq!(percent_decode_strict("a%20b%2Fc").expect("ok"), "a b/c");
        assert_eq!(percent_decode_strict("%C3%BC").expect("ok"), "ü");
        for bad in ["%", "%2", "%zz", "%FF", "a%g0"] {
            assert!(percent_decode_strict(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn dot_segments_are_refused_even_when_escaped() {
        assert!(object_key("/v1/objects/a/%2E%2E/b", "/v1/objects/").is_err());
        assert_eq!(
            object_key("/v1/objects/a/b%20c", "/v1/objects/")
                .expect("ok")
                .as_str(),
            "a/b c"
        );
    }
}
