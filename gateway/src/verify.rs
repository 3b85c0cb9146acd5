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
//! the cache still checks `exp` and the key's trust on every hit, and when
//! full it drops the expired, the untrusted and then the soonest to expire
//! ([`VerifiedCache`]), never the tokens in use all at once.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, Validation};
use palisade_plumbing::sync::lock;
use palisade_store::{FencingToken, LeaseName};

use crate::error::ApiError;
use crate::jwks::{KeyLookup, KeySource};

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
    /// Tokens already verified. A hit counts only while its key is still
    /// trusted (a retired key's tokens stop).
    verified: Mutex<VerifiedCache>,
}

/// Entries in the verified-token cache before it sweeps.
const VERIFIED_CACHE_CAPACITY: usize = 10_000;

/// JWT text -> (claims, `kid`), for tokens already verified. Bounded: an
/// insert into a full cache first sweeps it — the expired and those of
/// keys no longer trusted go, then, while more than half remain, those that
/// expire first (a holder's newest JWT expires last, so the tokens writers
/// use now stay). A sweep frees at least half, so its cost is spread over
/// as many inserts.
#[derive(Debug)]
struct VerifiedCache {
    entries: HashMap<String, (LeaseClaims, Option<String>)>,
    capacity: usize,
}

impl VerifiedCache {
    fn new(capacity: usize) -> Self {
        Self {
            entries: HashMap::new(),
            capacity,
        }
    }

    fn get(&self, jwt: &str) -> Option<&(LeaseClaims, Option<String>)> {
        self.entries.get(jwt)
    }

    /// Keeps `jwt`'s claims; `live(claims, kid)`: whether an entry may stay.
    fn insert(
        &mut self,
        jwt: String,
        entry: (LeaseClaims, Option<String>),
        live: impl Fn(&LeaseClaims, Option<&str>) -> bool,
    ) {
        if self.entries.len() >= self.capacity && !self.entries.contains_key(&jwt) {
            self.sweep(live);
        }
        self.entries.insert(jwt, entry);
    }

    fn sweep(&mut self, live: impl Fn(&LeaseClaims, Option<&str>) -> bool) {
        self.entries
            .retain(|_, (claims, kid)| live(claims, kid.as_deref()));
        let keep = self.capacity / 2;
        if self.entries.len() > keep {
            let mut by_exp: Vec<(u64, String)> = self
                .entries
                .iter()
                .map(|(jwt, (claims, _))| (claims.exp, jwt.clone()))
                .collect();
            by_exp.sort_unstable();
            let surplus = by_exp.len() - keep;
            for (_, jwt) in by_exp.into_iter().take(surplus) {
                self.entries.remove(&jwt);
            }
        }
    }
}

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
            verified: Mutex::new(VerifiedCache::new(VERIFIED_CACHE_CAPACITY)),
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
        let now = now_secs();
        lock(&self.verified).insert(
            jwt.to_owned(),
            (lease_token.claims.clone(), header.kid),
            |claims, kid| {
                claims.exp.saturating_add(self.leeway_secs) >= now && self.keys.trusts(kid)
            },
        );
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

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(lease: &str, exp: u64) -> LeaseClaims {
        LeaseClaims {
            iss: palisade_store::names::ISSUER.to_owned(),
            sub: "h".to_owned(),
            lease: lease.to_owned(),
            token: 7,
            iat: 0,
            exp,
        }
    }

    #[test]
    fn a_full_cache_drops_the_dead_then_the_soonest_to_expire_never_all() {
        let mut cache = VerifiedCache::new(10);
        let now = 1_000;
        let live = |c: &LeaseClaims, kid: Option<&str>| c.exp >= now && kid != Some("retired");
        // Three expired, two of a retired key, five live expiring 1001..=1005.
        for i in 0..3 {
            cache.insert(format!("old{i}"), (claims("l", 900 + i), None), live);
        }
        for i in 0..2 {
            cache.insert(
                format!("ret{i}"),
                (claims("l", 2_000), Some("retired".into())),
                live,
            );
        }
        for i in 1..=5 {
            cache.insert(format!("live{i}"), (claims("l", 1_000 + i), None), live);
        }
        assert_eq!(cache.entries.len(), 10);
        // Full: the sweep drops the five dead; five left is not over half.
        cache.insert("new".into(), (claims("l", 1_100), None), live);
        assert_eq!(cache.entries.len(), 6);
        assert!(cache.get("old0").is_none() && cache.get("ret1").is_none());
        assert!(cache.get("live1").is_some() && cache.get("new").is_some());
        // Fill with live entries: the next sweep keeps the half that
        // expires last.
        for i in 6..=9 {
            cache.insert(format!("live{i}"), (claims("l", 1_000 + i), None), live);
        }
        cache.insert("newest".into(), (claims("l", 1_200), None), live);
        assert_eq!(cache.entries.len(), 6);
        for gone in ["live1", "live2", "live3", "live4", "live5"] {
            assert!(cache.get(gone).is_none(), "{gone} expires first");
        }
        for kept in ["live6", "live9", "new", "newest"] {
            assert!(cache.get(kept).is_some(), "{kept} expires last");
        }
        // A token already cached is replaced without a sweep.
        let before = cache.entries.len();
        cache.insert("new".into(), (claims("l", 1_300), None), live);
        assert_eq!(cache.entries.len(), before);
    }
}
