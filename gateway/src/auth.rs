//! Lease-token verification: [`Verifier`] turns a JWT into a
//! [`LeaseToken`] (the extractor that hands it to handlers is in
//! `extract.rs`).
//!
//! Only EdDSA is accepted, whatever the header says: `none`, HS*, RS* and the
//! rest are refused before any key is looked at. Checks: signature, `iss`,
//! `exp` (with a leeway), a token in range. The `lease` claim is compared with
//! the key by the handler, which knows the key.
//!
//! Verified tokens are cached by their exact text (signature included), so a
//! writer that reuses its JWT pays for Ed25519 once per token, not per write;
//! the cache still checks `exp` on every hit.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, Validation};
use palisade_names::sync::lock;
use palisade_store::{FencingToken, LeaseName};

use crate::error::ApiError;
use crate::keys::{KeyLookup, KeySource};

pub use palisade_store::names::LeaseClaims;

/// A verified lease token, as a handler receives it.
#[derive(Debug, Clone)]
pub struct LeaseToken {
    /// The verified claims.
    pub claims: LeaseClaims,
    /// `claims.token`, range-checked.
    pub token: FencingToken,
}

/// Verifies lease JWTs against a [`KeySource`], with a cache.
#[derive(Debug)]
pub struct Verifier {
    keys: KeySource,
    validation: Validation,
    /// Seconds of clock skew tolerated on `exp`.
    leeway_secs: u64,
    /// JWT text -> (claims, `kid`), for tokens already verified. A hit counts
    /// only while its key is still trusted (a retired key's tokens stop).
    verified: Mutex<HashMap<String, (LeaseClaims, Option<String>)>>,
}

/// Entries in the verified-token cache before it is cleared.
const VERIFIED_CACHE_CAPACITY: usize = 10_000;

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Verifier {
    /// A verifier for tokens signed by `keys`.
    pub fn new(keys: KeySource, leeway_secs: u64) -> Self {
        let mut validation = Validation::new(Algorithm::EdDSA);
        validation.algorithms = vec![Algorithm::EdDSA];
        validation.leeway = leeway_secs;
        validation.set_issuer(&[palisade_store::names::ISSUER]);
        validation.set_required_spec_claims(&["exp", "iss", "sub"]);
        Self {
            keys,
            validation,
            leeway_secs,
            verified: Mutex::new(HashMap::new()),
        }
    }

    /// Where the keys come from.
    pub fn keys(&self) -> &KeySource {
        &self.keys
    }

    /// Verifies `jwt`.
    ///
    /// # Errors
    /// [`ApiError::Unauthorized`] saying what is wrong.
    pub async fn verify(&self, jwt: &str) -> Result<LeaseToken, ApiError> {
        if let Some(claims) = self.cached(jwt) {
            if claims.exp.saturating_add(self.leeway_secs) < now_secs() {
                return Err(ApiError::Unauthorized("token has expired".into()));
            }
            return to_lease_token(claims);
        }
        let header = jsonwebtoken::decode_header(jwt)
            .map_err(|e| ApiError::Unauthorized(format!("malformed token: {e}")))?;
        if header.alg != Algorithm::EdDSA {
            return Err(ApiError::Unauthorized(format!(
                "algorithm {:?} is not accepted; tokens are EdDSA",
                header.alg
            )));
        }
        let key = match self.keys.key_for(header.kid.as_deref()).await {
            KeyLookup::Found(key) => key,
            KeyLookup::Unknown => {
                return Err(match &header.kid {
                    Some(kid) => ApiError::Unauthorized(format!("unknown signing key {kid:?}")),
                    None => ApiError::Unauthorized("token has no kid".into()),
                })
            }
            KeyLookup::Unreachable(detail) => {
                return Err(ApiError::Unavailable(format!(
                    "cannot learn the signing key of this token: {detail}"
                )))
            }
        };
        let data = jsonwebtoken::decode::<LeaseClaims>(jwt, &key, &self.validation).map_err(
            |e| match e.kind() {
                jsonwebtoken::errors::ErrorKind::ExpiredSignature => {
                    ApiError::Unauthorized("token has expired".into())
                }
                jsonwebtoken::errors::ErrorKind::InvalidSignature => {
                    ApiError::Unauthorized("bad signature".into())
                }
                _ => ApiError::Unauthorized(format!("invalid token: {e}")),
            },
        )?;
        let lease_token = to_lease_token(data.claims)?;
        let mut cache = lock(&self.verified);
        if cache.len() >= VERIFIED_CACHE_CAPACITY {
            cache.clear();
        }
        cache.insert(jwt.to_owned(), (lease_token.claims.clone(), header.kid));
        drop(cache);
        Ok(lease_token)
    }

    fn cached(&self, jwt: &str) -> Option<LeaseClaims> {
        let (claims, kid) = lock(&self.verified).get(jwt).cloned()?;
        self.keys.trusts(kid.as_deref()).then_some(claims)
    }
}

fn to_lease_token(claims: LeaseClaims) -> Result<LeaseToken, ApiError> {
    let token = FencingToken::for_write(claims.token)?;
    Ok(LeaseToken { claims, token })
}

impl LeaseToken {
    /// Refuses with 403 unless this token is for `lease`.
    ///
    /// # Errors
    /// [`ApiError::Forbidden`].
    pub fn require_lease(&self, lease: &LeaseName) -> Result<(), ApiError> {
        if self.claims.lease == lease.as_str() {
            Ok(())
        } else {
            Err(ApiError::Forbidden(format!(
                "token is for lease {:?}, not {:?}",
                self.claims.lease,
                lease.as_str()
            )))
        }
    }
}
