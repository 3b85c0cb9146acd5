//! The status page's session cookie: its name, its attributes, and reading
//! it from a request. It holds a session id (`sessions.rs`), never a key.

use http::HeaderMap;

/// The cookie a browser's session id travels in on node `id`'s pages.
/// Browsers send a host's cookies to every port of it, so each node's has
/// its own name: signing in on one node leaves the others' sessions be
/// (each node keeps its own sessions; another node's id means nothing
/// here).
pub(super) fn name(id: u64) -> String {
    format!("palisade_session_{id}")
}

/// The cookie an earlier version set: it held the API key itself. Any
/// status page a browser still sends it to clears it.
pub(super) const LEGACY_KEY_COOKIE: &str = "palisade_key";

/// The value of cookie `name` in `headers`, if sent.
pub(super) fn find(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, value)| value.trim().to_owned())
}

/// `Set-Cookie` for `name=value` on the status pages: `HttpOnly` (no
/// script reads it), `SameSite=Strict` (no other site's page sends it),
/// `Path=/ui` (no API route receives it), `Secure` when clients speak TLS
/// to this node, and `Max-Age` (0 clears it).
pub(super) fn set(name: &str, value: &str, max_age_secs: u64, tls: bool) -> String {
    let secure = if tls { "; Secure" } else { "" };
    format!("{name}={value}; Max-Age={max_age_secs}; Path=/ui; HttpOnly; SameSite=Strict{secure}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cookie_is_found_among_others_and_set_with_its_attributes() {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::COOKIE,
            "theme=dark; palisade_session_1=abc; palisade_session_2=def"
                .parse()
                .expect("header"),
        );
        assert_eq!(find(&headers, &name(2)).as_deref(), Some("def"));
        assert_eq!(find(&headers, &name(3)), None);
        assert_eq!(
            set(&name(1), "abc", 60, true),
            "palisade_session_1=abc; Max-Age=60; Path=/ui; HttpOnly; SameSite=Strict; Secure"
        );
    }
}
