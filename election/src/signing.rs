//! Lease tokens: signing grants as EdDSA JWTs and publishing the JWKS.
//!
//! The key is generated once by the first leader and replicated through the
//! Raft log ([`crate::lease_table::command::Command::InstallKey`]), so every node can sign
//! and a restarted node signs with the same key. The trade-off: the private key
//! sits in every node's log and snapshots, so a data dir is as sensitive as the
//! key itself; in exchange there is no key file to distribute and no node can
//! sign with a key the others do not publish.
//!
//! Renewals mostly sign nothing: [`TokenCache`] signs a grant's JWT to live
//! two ttls and answers renewals with it while it still covers the renewed
//! deadline (see there for why an `exp` past the lease's deadline is safe).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ed25519_dalek::{Signer as _, SigningKey};
use palisade_names::{FencingToken, LeaseClaims, LeaseName, ISSUER};
use serde_json::{json, Value};

use crate::lease_table::table::SigningKeyRecord;

/// A ready-to-use signing key.
///
/// Tokens are signed here directly with ed25519-dalek (standard JWS compact
/// form, verified by jsonwebtoken in the tests): jsonwebtoken's encoder
/// re-derives the key from PKCS#8 on every call, which doubled the cost of a
/// renewal (profiled: two thirds of the leader's CPU under renew load).
#[derive(Clone)]
pub struct Signer {
    kid: String,
    key: SigningKey,
    /// The base64url JWS header, the same for every token.
    header: String,
    public: [u8; 32],
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

/// A fresh key for [`crate::lease_table::command::Command::InstallKey`]: `(kid, secret)`.
pub fn generate_key() -> (String, Vec<u8>) {
    let secret: [u8; 32] = rand::random();
    let kid_bytes: [u8; 8] = rand::random();
    let kid = kid_bytes.iter().map(|b| format!("{b:02x}")).collect();
    (kid, secret.to_vec())
}

impl Signer {
    /// Builds a signer from the replicated key; `None` if the record is not a
    /// 32-byte Ed25519 secret.
    pub fn from_record(record: &SigningKeyRecord) -> Option<Self> {
        let secret: [u8; 32] = record.secret.as_slice().try_into().ok()?;
        let key = SigningKey::from_bytes(&secret);
        let header = json!({ "typ": "JWT", "alg": "EdDSA", "kid": record.kid });
        Some(Self {
            kid: record.kid.clone(),
            header: URL_SAFE_NO_PAD.encode(header.to_string()),
            public: key.verifying_key().to_bytes(),
            key,
        })
    }

    /// The key id.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// Signs a token for `holder` on `lease` with `token`, expiring
    /// `lifetime_ms` from now (rounded up to whole seconds, as JWT `exp` is
    /// in seconds).
    ///
    /// # Errors
    /// The claims could not be serialized (they always can).
    pub fn sign(
        &self,
        lease: &LeaseName,
        holder: &str,
        token: FencingToken,
        lifetime_ms: u64,
    ) -> Result<String, serde_json::Error> {
        let now_ms = unix_ms();
        self.sign_at(lease, holder, token, now_ms, now_ms + lifetime_ms)
    }

    /// Signs with `iat` at `now_ms` and `exp` at `exp_ms` rounded up to
    /// whole seconds.
    fn sign_at(
        &self,
        lease: &LeaseName,
        holder: &str,
        token: FencingToken,
        now_ms: u64,
        exp_ms: u64,
    ) -> Result<String, serde_json::Error> {
        let claims = LeaseClaims {
            iss: ISSUER.into(),
            sub: holder.into(),
            lease: lease.as_str().into(),
            token: token.0,
            iat: now_ms / 1000,
            exp: exp_ms.div_ceil(1000),
        };
        let mut jwt = format!(
            "{}.{}",
            self.header,
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims)?)
        );
        let signature = self.key.sign(jwt.as_bytes());
        jwt.push('.');
        jwt.push_str(&URL_SAFE_NO_PAD.encode(signature.to_bytes()));
        Ok(jwt)
    }

    /// The JWKS entry of this key.
    pub fn jwk(&self) -> Value {
        json!({
            "kty": "OKP",
            "crv": "Ed25519",
            "alg": "EdDSA",
            "use": "sig",
            "kid": self.kid,
            "x": URL_SAFE_NO_PAD.encode(self.public),
        })
    }
}

/// Milliseconds since the Unix epoch on this node's clock (JWT time, the
/// stamp on proposals, the status page's "ago").
pub(crate) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The JWT last signed for each lease's grant, so that a renewal does not
/// pay for an Ed25519 signature (profiled: most of a renewal's CPU on the
/// leader).
///
/// A JWT is signed to live [`TokenCache::LIFETIME_TTLS`] ttls and is
/// answered to renewals of the same grant (lease, holder, token, key) while
/// its `exp` still covers the renewed deadline (now + ttl); after that a
/// renewal signs a new one. So a holder always holds a JWT valid at least to
/// its lease's deadline, and a JWT outlives the deadline it was last
/// answered with by at most one ttl (plus the rounding of `exp` to seconds).
///
/// Why an `exp` past the lease is safe: fencing rests on the token, not on
/// `exp`. Once the lease passes to a new holder, its grant has a higher
/// token, and the gateway refuses the old token from the moment the new one
/// reaches the lease's fence (the SDKs raise the fence on acquire, before
/// handing the lease to the caller), whatever the old JWT's `exp`. `exp` is
/// the second line: it bounds how long a JWT lost by a holder that never
/// renews again can write while nobody has raised the fence — a window that
/// was already `exp`'s rounding to whole seconds plus the gateway's leeway
/// and is now up to one ttl more.
#[derive(Debug, Default)]
pub struct TokenCache {
    entries: Mutex<CacheState>,
}

#[derive(Debug, Default)]
struct CacheState {
    by_lease: HashMap<LeaseName, Cached>,
    /// Prune expired entries when the map grows past this many.
    prune_at: usize,
}

#[derive(Debug, Clone)]
struct Cached {
    holder: String,
    token: FencingToken,
    kid: String,
    exp_ms: u64,
    jwt: Arc<str>,
}

impl TokenCache {
    /// How many ttls a freshly signed JWT lives.
    pub const LIFETIME_TTLS: u64 = 2;

    fn state(&self) -> std::sync::MutexGuard<'_, CacheState> {
        palisade_plumbing::sync::lock(&self.entries)
    }

    /// A JWT for `holder`'s grant `token` of `lease`, valid at least
    /// `ttl_ms` from now: the cached one if it is, a fresh one otherwise
    /// (then `true`).
    ///
    /// # Errors
    /// The claims could not be serialized (they always can).
    pub fn jwt(
        &self,
        signer: &Signer,
        lease: &LeaseName,
        holder: &str,
        token: FencingToken,
        ttl_ms: u64,
    ) -> Result<(Arc<str>, bool), serde_json::Error> {
        let now_ms = unix_ms();
        let needed = now_ms.saturating_add(ttl_ms);
        if let Some(cached) = self.state().by_lease.get(lease) {
            if cached.token == token
                && cached.holder == holder
                && cached.kid == signer.kid()
                && cached.exp_ms >= needed
            {
                return Ok((cached.jwt.clone(), false));
            }
        }
        let exp_ms = now_ms.saturating_add(ttl_ms.saturating_mul(Self::LIFETIME_TTLS));
        let jwt: Arc<str> = signer.sign_at(lease, holder, token, now_ms, exp_ms)?.into();
        let mut state = self.state();
        if state.by_lease.len() >= state.prune_at {
            // Amortised: entries whose JWT has expired are of no use.
            state.by_lease.retain(|_, c| c.exp_ms > now_ms);
            state.prune_at = (2 * state.by_lease.len()).max(1024);
        }
        state.by_lease.insert(
            lease.clone(),
            Cached {
                holder: holder.to_owned(),
                token,
                kid: signer.kid().to_owned(),
                exp_ms: exp_ms.div_ceil(1000) * 1000,
                jwt: jwt.clone(),
            },
        );
        Ok((jwt, true))
    }

    /// How many JWTs are cached.
    pub fn len(&self) -> usize {
        self.state().by_lease.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use jsonwebtoken::Algorithm;

    use super::*;

    #[test]
    fn tokens_verify_with_the_published_key() {
        let (kid, secret) = generate_key();
        let signer = Signer::from_record(&SigningKeyRecord { kid, secret }).expect("key");
        let jwt = signer
            .sign(
                &LeaseName::new("jobs").expect("name"),
                "worker-1",
                FencingToken(42),
                1500,
            )
            .expect("sign");
        let jwk: jsonwebtoken::jwk::Jwk = serde_json::from_value(signer.jwk()).expect("jwk");
        let key = jsonwebtoken::DecodingKey::from_jwk(&jwk).expect("decoding key");
        let mut validation = jsonwebtoken::Validation::new(Algorithm::EdDSA);
        validation.set_issuer(&[ISSUER]);
        let data = jsonwebtoken::decode::<LeaseClaims>(&jwt, &key, &validation).expect("verifies");
        assert_eq!(data.claims.token, 42);
        assert_eq!(data.claims.lease, "jobs");
        assert_eq!(data.claims.sub, "worker-1");
        assert!(data.claims.exp > data.claims.iat);
        assert_eq!(data.header.kid.as_deref(), Some(signer.kid()));
    }

    fn decode(signer: &Signer, jwt: &str) -> LeaseClaims {
        let jwk: jsonwebtoken::jwk::Jwk = serde_json::from_value(signer.jwk()).expect("jwk");
        let key = jsonwebtoken::DecodingKey::from_jwk(&jwk).expect("decoding key");
        let validation = jsonwebtoken::Validation::new(Algorithm::EdDSA);
        jsonwebtoken::decode::<LeaseClaims>(jwt, &key, &validation)
            .expect("verifies")
            .claims
    }

    fn signer() -> Signer {
        let (kid, secret) = generate_key();
        Signer::from_record(&SigningKeyRecord { kid, secret }).expect("key")
    }

    #[test]
    fn renewals_reuse_a_jwt_while_it_covers_the_new_deadline() {
        let (signer, cache) = (signer(), TokenCache::default());
        let lease = LeaseName::new("jobs").expect("name");
        let first = cache
            .jwt(&signer, &lease, "w1", FencingToken(7), 10_000)
            .expect("sign")
            .0;
        let claims = decode(&signer, &first);
        // Lives two ttls (exp rounded up to seconds).
        assert!(claims.exp >= claims.iat + 20 && claims.exp <= claims.iat + 21);
        let again = cache
            .jwt(&signer, &lease, "w1", FencingToken(7), 10_000)
            .expect("sign")
            .0;
        assert!(Arc::ptr_eq(&first, &again), "a renewal reuses the JWT");
        // Not once it no longer covers now + ttl.
        let longer = cache
            .jwt(&signer, &lease, "w1", FencingToken(7), 30_000)
            .expect("sign")
            .0;
        assert!(!Arc::ptr_eq(&first, &longer));
        assert!(decode(&signer, &longer).exp >= claims.iat + 30);
        // Nor for another grant, holder or key.
        let other_token = cache
            .jwt(&signer, &lease, "w1", FencingToken(9), 10_000)
            .expect("sign")
            .0;
        assert_eq!(decode(&signer, &other_token).token, 9);
        let other_holder = cache
            .jwt(&signer, &lease, "w2", FencingToken(9), 10_000)
            .expect("sign")
            .0;
        assert_eq!(decode(&signer, &other_holder).sub, "w2");
        let rotated = self::signer();
        let new_key = cache
            .jwt(&rotated, &lease, "w2", FencingToken(9), 10_000)
            .expect("sign")
            .0;
        assert!(!Arc::ptr_eq(&other_holder, &new_key));
        assert_eq!(decode(&rotated, &new_key).token, 9);
        assert_eq!(cache.len(), 1, "one entry per lease");
    }

    #[test]
    fn a_short_secret_is_refused() {
        assert!(Signer::from_record(&SigningKeyRecord {
            kid: "k".into(),
            secret: vec![1; 31]
        })
        .is_none());
    }
}
