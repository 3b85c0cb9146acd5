//! Which page a status-page form was posted from: only this node's own.
//!
//! A browser names the page that sent a POST in `Origin` (scheme, host and
//! port), and sends it on every form POST. A form is accepted only when
//! `Origin` is one of this node's configured origins
//! ([`crate::config::UiAccess::origins`]: its `--public-url`s, or its
//! `--listen` address), never by comparing it with the request's `Host`:
//! a page of `http://attacker.example:7001` that DNS rebinding points at
//! this node sends `Host: attacker.example:7001` and a matching `Origin`,
//! and must still be refused. A POST without `Origin` is refused too: no
//! browser sends a form without one, and a script (curl) needs no form.
//! This stops another site signing a visitor in under the attacker's key
//! (login CSRF) or out.

use http::HeaderMap;

use crate::config::ElectionConfig;

/// Why a form from elsewhere is refused (shown above the sign-in form).
pub(super) const CROSS_SITE: &str = "refused: this form was posted from another site's page \
     (its Origin is not one of this node's --public-url)";

/// Why a form without `Origin` is refused.
pub(super) const NO_ORIGIN: &str =
    "refused: a form must be posted from this node's page (the request has no Origin)";

/// `Ok` when `headers` carry an `Origin` that is one of this node's;
/// otherwise the reason ([`CROSS_SITE`], [`NO_ORIGIN`]).
pub(super) fn from_own_page(
    config: &ElectionConfig,
    headers: &HeaderMap,
) -> Result<(), &'static str> {
    let Some(origin) = headers.get(http::header::ORIGIN) else {
        return Err(NO_ORIGIN);
    };
    let origin = origin
        .to_str()
        .map_err(|_| CROSS_SITE)?
        .to_ascii_lowercase();
    let ours = config
        .ui
        .origins(config.listen, config.client_tls.is_some());
    if ours.contains(&origin) {
        Ok(())
    } else {
        Err(CROSS_SITE)
    }
}
