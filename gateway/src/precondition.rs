//! The conditional headers of a write (`If-Match`, `If-None-Match`) as a
//! store [`Precondition`]: the store checks it in the same atomic step as
//! the fence.
//!
//! Versions are the gateway's ETags. `GET` sends them bare (`ETag: 12`),
//! so `If-Match` takes `12` or the RFC 9110 form `"12"`; `*` asks for any
//! object, and `If-None-Match: *` (PUT only) for none. A weak tag, a list,
//! both headers at once, or `If-None-Match` with a tag are refused with 400
//! rather than guessed at.

use http::HeaderMap;
use palisade_store::Precondition;

use crate::error::ApiError;

/// What a write of this method asks of the object it replaces.
///
/// # Errors
/// [`ApiError::InvalidPrecondition`] for a header it cannot honour.
pub fn precondition(headers: &HeaderMap, delete: bool) -> Result<Precondition, ApiError> {
    let if_match = text(headers, http::header::IF_MATCH)?;
    let if_none_match = text(headers, http::header::IF_NONE_MATCH)?;
    match (if_match, if_none_match) {
        (None, None) => Ok(Precondition::Any),
        (Some(_), Some(_)) => Err(invalid("send If-Match or If-None-Match, not both")),
        (Some("*"), None) => Ok(Precondition::Exists),
        (Some(tag), None) => version(tag).map(Precondition::Version),
        (None, Some(_)) if delete => Err(invalid(
            "DELETE takes If-Match only (a version, or * for any object)",
        )),
        (None, Some("*")) => Ok(Precondition::Absent),
        (None, Some(_)) => Err(invalid(
            "If-None-Match takes * only (write only where no object is)",
        )),
    }
}

fn text(headers: &HeaderMap, name: http::HeaderName) -> Result<Option<&str>, ApiError> {
    let mut values = headers.get_all(&name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(invalid(&format!("{name} is sent more than once")));
    }
    let value = value
        .to_str()
        .map_err(|_| invalid(&format!("{name} is not visible ASCII")))?;
    Ok(Some(value.trim()))
}

/// A version from an entity tag: `12` or `"12"`.
fn version(tag: &str) -> Result<u64, ApiError> {
    if tag.starts_with("W/") {
        return Err(invalid(
            "If-Match compares strongly: a weak tag (W/...) never matches",
        ));
    }
    let bare = tag
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(tag);
    if bare.is_empty() || !bare.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(&format!(
            "If-Match takes one version (as ETag shows it) or *, not {tag:?}"
        )));
    }
    bare.parse()
        .map_err(|_| invalid(&format!("version {bare} is out of range")))
}

fn invalid(message: &str) -> ApiError {
    ApiError::InvalidPrecondition(message.to_owned())
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue};
    use palisade_store::Precondition;

    use super::precondition;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_static(value));
        }
        map
    }

    /// Headers sent, whether the write is a DELETE, the precondition (`None`:
    /// refused).
    type Case = (
        &'static [(&'static str, &'static str)],
        bool,
        Option<Precondition>,
    );

    #[test]
    fn conditional_headers_become_preconditions() {
        let cases: [Case; 12] = [
            (&[], false, Some(Precondition::Any)),
            (
                &[("if-match", "12")],
                false,
                Some(Precondition::Version(12)),
            ),
            (
                &[("if-match", "\"12\"")],
                true,
                Some(Precondition::Version(12)),
            ),
            (&[("if-match", "*")], true, Some(Precondition::Exists)),
            (&[("if-none-match", "*")], false, Some(Precondition::Absent)),
            (&[("if-none-match", "*")], true, None),
            (&[("if-none-match", "12")], false, None),
            (&[("if-match", "W/\"12\"")], false, None),
            (&[("if-match", "1, 2")], false, None),
            (&[("if-match", "")], false, None),
            (&[("if-match", "1"), ("if-match", "2")], false, None),
            (&[("if-match", "1"), ("if-none-match", "*")], false, None),
        ];
        for (pairs, delete, want) in cases {
            let got = precondition(&headers(pairs), delete).ok();
            assert_eq!(got, want, "{pairs:?} delete={delete}");
        }
        let huge = headers(&[("if-match", "99999999999999999999999")]);
        assert!(precondition(&huge, false).is_err());
    }
}
