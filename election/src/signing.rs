//! Lease tokens: signing grants as EdDSA JWTs and publishing the JWKS.
//!
//! The key is generated once by the first leader and replicated through the
//! Raft log ([`crate::command::Command::InstallKey`]), so every node can sign
//! and a restarted node signs with the same key. The trade-off: the private key
//! sits in every node's log and snapshots, so a data dir is as sensitive as the
//! key itself; in exchange there is no key file to distribute and no node can
//! sign with a key the others do not publish.

use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ed25519_dalek::{Signer as _, SigningKey};
use palisade_names::{FencingToken, LeaseClaims, LeaseName, ISSUER};
use serde_json::{json, Value};

use crate::lease_table::SigningKeyRecord;

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

/// A fresh key for [`crate::command::Command::InstallKey`]: `(kid, secret)`.
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

    /// Signs a token for `holder` on `lease` with `token`, expiring `ttl_ms`
    /// from now (rounded up to whole seconds, as JWT `exp` is in seconds).
    ///
    /// # Errors
    /// The claims could not be serialized (they always can).
    pub fn sign(
        &self,
        lease: &LeaseName,
        holder: &str,
        token: FencingToken,
        ttl_ms: u64,
    ) -> Result<String, serde_json::Error> {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let claims = LeaseClaims {
            iss: ISSUER.into(),
            sub: holder.into(),
            lease: lease.as_str().into(),
            token: token.0,
            iat: now_ms / 1000,
            exp: (now_ms + ttl_ms).div_ceil(1000),
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

    #[test]
    fn a_short_secret_is_refused() {
        assert!(Signer::from_record(&SigningKeyRecord {
            kid: "k".into(),
            secret: vec![1; 31]
        })
        .is_none());
    }
}
