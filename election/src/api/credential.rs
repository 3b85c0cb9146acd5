//! Who a caller is and what its call needs, as two rules the policy is
//! asked: [`identify`] (the caller's API key, or the principal a forwarding
//! peer named, or its client certificate) and [`Check::allows`] (its right
//! on the call's lease, prefix or the cluster). `authorize.rs` asks them of
//! every call; `revocation.rs` asks them again, with what the call
//! presented ([`Credential`]), of a call that stays open whenever a reload
//! puts a new policy in force.

use http::HeaderMap;
use palisade_serve::policy::{Policy, Principal, Right, KEY_HEADER};
use palisade_serve::PeerCertificate;

use crate::error::ApiError;
use crate::peer::gate::PeerId;

/// The header a follower names the principal it identified by client
/// certificate in, when it forwards a keyless request (trusted only from
/// an authenticated peer: the leader cannot see the client's certificate).
pub const PRINCIPAL_HEADER: &str = "x-palisade-principal";

/// The caller: by API key; else, on a request a peer forwarded, the
/// principal that peer identified (by certificate; the peer's own
/// certificate is not the caller's); else by the client certificate the
/// connection verified.
pub(super) fn identify(
    policy: &Policy,
    headers: &HeaderMap,
    from_peer: bool,
    certificate: Option<&PeerCertificate>,
) -> Result<Principal, ApiError> {
    let keyless = !headers.contains_key(KEY_HEADER);
    if from_peer {
        let named = headers
            .get(PRINCIPAL_HEADER)
            .and_then(|v| v.to_str().ok())
            .filter(|_| keyless)
            .and_then(|name| policy.principal(name));
        return match named {
            Some(principal) => Ok(principal),
            None => Ok(policy.authenticate(headers)?),
        };
    }
    Ok(policy.identify(headers, certificate.map(|c| c.0.as_ref()))?)
}

/// What a call presented to be identified, kept for as long as it stays
/// open: the two headers [`identify`] reads (not the rest of the request),
/// whether a peer forwarded it, and the client certificate.
#[derive(Debug, Clone)]
pub(super) struct Credential {
    headers: HeaderMap,
    from_peer: bool,
    certificate: Option<PeerCertificate>,
}

impl Credential {
    /// What `parts` presented.
    pub(super) fn of(parts: &http::request::Parts) -> Self {
        let mut headers = HeaderMap::new();
        for name in [KEY_HEADER, PRINCIPAL_HEADER] {
            if let Some(value) = parts.headers.get(name) {
                headers.insert(name, value.clone());
            }
        }
        Self {
            headers,
            from_peer: parts.extensions.get::<PeerId>().is_some(),
            certificate: parts.extensions.get::<PeerCertificate>().cloned(),
        }
    }

    /// The caller this credential is under `policy`.
    pub(super) fn identify(&self, policy: &Policy) -> Result<Principal, ApiError> {
        identify(
            policy,
            &self.headers,
            self.from_peer,
            self.certificate.as_ref(),
        )
    }
}

/// What one call needs of its principal, its lease or prefix resolved from
/// the request.
#[derive(Debug, Clone)]
pub(super) enum Check {
    /// `right` on the lease named.
    Lease(Right, String),
    /// `right` on every lease starting with the prefix.
    Prefix(Right, String),
    /// Cluster changes.
    Cluster,
    /// Any known principal.
    Known,
}

impl Check {
    /// Whether `policy` lets `principal` make a call that needs this.
    pub(super) fn allows(&self, policy: &Policy, principal: &Principal) -> Result<(), ApiError> {
        match self {
            Check::Lease(right, lease) => Ok(policy.allow(principal, *right, lease)?),
            Check::Prefix(right, prefix) => Ok(policy.allow_prefix(principal, *right, prefix)?),
            Check::Cluster => Ok(policy.allow_cluster(principal)?),
            // Identified under `policy`, it is known there.
            Check::Known => Ok(()),
        }
    }
}
