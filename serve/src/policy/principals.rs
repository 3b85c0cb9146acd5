//! [`Policy`]: the loaded principals, found by the digest of their API key,
//! and the decisions the servers ask of it.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;

use ring::digest::{digest, SHA256};
use rustls::pki_types::CertificateDer;

use crate::policy::api_key::{parse_digest, KEY_HEADER};
use crate::policy::error::{Denied, PolicyError};
use crate::policy::policy_file::PolicyFile;
use crate::policy::rules::{Right, Rules};
use crate::tls::certificate_names;

/// A known caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal(pub String);

/// A loaded policy: principals by key digest and by certificate name.
#[derive(Clone)]
pub struct Policy {
    rules: BTreeMap<String, Rules>,
    by_digest: HashMap<[u8; 32], String>,
    /// (certificate DNS name, principal), in file order.
    by_certificate: Vec<(String, String)>,
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("principals", &self.rules.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Policy {
    /// Reads and checks a policy file.
    ///
    /// # Errors
    /// [`PolicyError`] naming the file and, for bad content, the line,
    /// column or principal at fault.
    pub fn load(path: &Path) -> Result<Self, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text).map_err(|message| PolicyError::Invalid {
            path: path.to_owned(),
            message,
        })
    }

    /// Each principal's prefixes that match more than whole segments
    /// ([`Rules::loose_prefixes`]), as `(principal, prefix)`.
    pub fn loose_prefixes(&self) -> Vec<(&str, &str)> {
        self.rules
            .iter()
            .flat_map(|(name, rules)| {
                rules
                    .loose_prefixes()
                    .into_iter()
                    .map(move |prefix| (name.as_str(), prefix))
            })
            .collect()
    }

    /// Parses a policy document.
    ///
    /// # Errors
    /// What is wrong and where, in one line.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: PolicyFile = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let mut by_digest = HashMap::new();
        let mut by_certificate: Vec<(String, String)> = Vec::new();
        for (name, rules) in &file.principals {
            if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
                return Err(format!(
                    "principal name {name:?}: must be 1..=128 printable bytes"
                ));
            }
            // Names are shown on status pages and in logs and metrics.
            palisade_names::text::refuse_bidi("principal name", name)
                .map_err(|e| format!("principal {name:?}: {e}"))?;
            if rules.keys.is_empty() && rules.certificates.is_empty() {
                return Err(format!(
                    "principal {name:?}: needs `keys` or `certificates`"
                ));
            }
            for subject in &rules.certificates {
                if rustls::pki_types::ServerName::try_from(subject.as_str()).is_err() {
                    return Err(format!(
                        "principal {name:?}: certificate name {subject:?} is not a DNS name"
                    ));
                }
                if let Some((_, other)) = by_certificate
                    .iter()
                    .find(|(s, _)| s.eq_ignore_ascii_case(subject))
                {
                    return Err(format!(
                        "principals {other:?} and {name:?} share the certificate name {subject:?}"
                    ));
                }
                by_certificate.push((subject.clone(), name.clone()));
            }
            for key in &rules.keys {
                let digest = parse_digest(key).ok_or_else(|| {
                    format!("principal {name:?}: key {key:?} is not sha256:<64 hex digits>")
                })?;
                if let Some(other) = by_digest.insert(digest, name.clone()) {
                    return Err(format!(
                        "principals {other:?} and {name:?} share the key {key:?}"
                    ));
                }
            }
        }
        Ok(Self {
            rules: file.principals,
            by_digest,
            by_certificate,
        })
    }

    /// The principals' names.
    pub fn principals(&self) -> impl Iterator<Item = &str> {
        self.rules.keys().map(String::as_str)
    }

    /// The principal whose key `headers` carry.
    ///
    /// # Errors
    /// [`Denied::Unauthenticated`] for no key or an unknown one.
    pub fn authenticate(&self, headers: &http::HeaderMap) -> Result<Principal, Denied> {
        let key = headers.get(KEY_HEADER).ok_or_else(|| {
            Denied::Unauthenticated(format!("this server needs an API key in `{KEY_HEADER}`"))
        })?;
        let digest: [u8; 32] = digest(&SHA256, key.as_bytes())
            .as_ref()
            .try_into()
            .map_err(|_| Denied::Unauthenticated("unreadable API key".into()))?;
        // The lookup is by digest of a high-entropy key: its timing says
        // nothing an attacker can use to guess a key.
        self.by_digest
            .get(&digest)
            .map(|name| Principal(name.clone()))
            .ok_or_else(|| Denied::Unauthenticated("unknown API key".into()))
    }

    /// The principal of a request: by its API key when it sends one, else
    /// by `certificate`, the client certificate its TLS connection
    /// verified against the servers' CA (the first principal one of whose
    /// `certificates` names it).
    ///
    /// # Errors
    /// [`Denied::Unauthenticated`]: an unknown key, or no key and no
    /// certificate a principal names.
    pub fn identify(
        &self,
        headers: &http::HeaderMap,
        certificate: Option<&CertificateDer<'_>>,
    ) -> Result<Principal, Denied> {
        let Some(certificate) = certificate.filter(|_| !headers.contains_key(KEY_HEADER)) else {
            return self.authenticate(headers);
        };
        self.by_certificate
            .iter()
            .find(|(subject, _)| certificate_names(certificate, subject))
            .map(|(_, name)| Principal(name.clone()))
            .ok_or_else(|| {
                Denied::Unauthenticated(format!(
                    "no principal has this client certificate; send an API key in `{KEY_HEADER}`"
                ))
            })
    }

    /// The principal of the API key `key`, and the key's SHA-256 digest:
    /// what a status-page session keeps instead of the key, to ask
    /// [`Policy::principal_of_digest`] on every later request.
    pub fn authenticate_key(&self, key: &str) -> Option<(Principal, [u8; 32])> {
        let digest: [u8; 32] = digest(&SHA256, key.as_bytes()).as_ref().try_into().ok()?;
        self.principal_of_digest(&digest)
            .map(|principal| (principal, digest))
    }

    /// The principal whose API key has the SHA-256 `digest`, while the
    /// policy lists that key (a reload that drops the key or the principal
    /// answers `None`).
    pub fn principal_of_digest(&self, digest: &[u8; 32]) -> Option<Principal> {
        self.by_digest
            .get(digest)
            .map(|name| Principal(name.clone()))
    }

    /// `principal`'s lease-name prefixes for `right` (none for a principal
    /// the policy does not know).
    pub fn prefixes(&self, principal: &Principal, right: Right) -> &[String] {
        self.rules
            .get(&principal.0)
            .map_or(&[], |rules| rules.prefixes(right))
    }

    /// The principal called `name`, if the policy has one (a forwarding
    /// peer names the principal it identified).
    pub fn principal(&self, name: &str) -> Option<Principal> {
        self.rules
            .contains_key(name)
            .then(|| Principal(name.to_owned()))
    }

    /// The quota of leases `principal`'s entry sets (`max_leases`), if any.
    pub fn max_leases(&self, principal: &Principal) -> Option<u64> {
        self.rules.get(&principal.0).and_then(|r| r.max_leases)
    }

    /// Whether `principal` has `right` on the lease `lease`.
    ///
    /// # Errors
    /// [`Denied::Forbidden`] naming the principal, the right and the lease.
    pub fn allow(&self, principal: &Principal, right: Right, lease: &str) -> Result<(), Denied> {
        let rules = self.rules_of(principal)?;
        if rules
            .prefixes(right)
            .iter()
            .any(|p| lease.starts_with(p.as_str()))
        {
            return Ok(());
        }
        Err(Denied::Forbidden(format!(
            "principal {:?} may not {right} lease {lease:?}",
            principal.0
        )))
    }

    /// Whether `principal` has `right` on every lease named `prefix...`:
    /// `prefix` must lie inside one of its prefixes (etcd's range rule).
    ///
    /// # Errors
    /// [`Denied::Forbidden`].
    pub fn allow_prefix(
        &self,
        principal: &Principal,
        right: Right,
        prefix: &str,
    ) -> Result<(), Denied> {
        let rules = self.rules_of(principal)?;
        if rules
            .prefixes(right)
            .iter()
            .any(|p| prefix.starts_with(p.as_str()))
        {
            return Ok(());
        }
        Err(Denied::Forbidden(format!(
            "principal {:?} may not {right} every lease starting with {prefix:?}; \
             ask for a prefix inside its rights",
            principal.0
        )))
    }

    /// Whether `principal` may change the cluster.
    ///
    /// # Errors
    /// [`Denied::Forbidden`].
    pub fn allow_cluster(&self, principal: &Principal) -> Result<(), Denied> {
        if self.rules_of(principal)?.cluster {
            return Ok(());
        }
        Err(Denied::Forbidden(format!(
            "principal {:?} may not change the cluster",
            principal.0
        )))
    }

    fn rules_of(&self, principal: &Principal) -> Result<&Rules, Denied> {
        self.rules
            .get(&principal.0)
            .ok_or_else(|| Denied::Unauthenticated("unknown principal".into()))
    }
}
