//! Who may call a server: principals, their API keys and what each may do
//! with which lease names. Both servers load the same policy file.
//!
//! A principal is known by an API key sent as `x-palisade-key` on every
//! request (a header of its own, so it never clashes with the lease JWT in
//! `Authorization`). The policy file holds only SHA-256 digests of the keys,
//! so it is not a secret; the keys are (`palisade policy init` writes each to
//! a 0600 file).
//!
//! ```json
//! {
//!   "principals": {
//!     "orders-svc": {
//!       "keys": ["sha256:<64 hex digits>"],
//!       "acquire": ["orders."],
//!       "read": ["orders.", "shared."],
//!       "admin": [],
//!       "cluster": false
//!     }
//!   }
//! }
//! ```
//!
//! A right names lease-name prefixes (`""` is every lease):
//! - `acquire`: acquire, renew and release those leases, and write their
//!   objects and fences on the gateway (with the lease's JWT as well);
//! - `read`: read, list (the listed prefix must lie inside one) and watch
//!   them, and read their objects and fences on the gateway;
//! - `admin`: revoke their grants;
//! - `cluster: true`: rotate the signing key, add and remove members.
//!
//! Any known principal may read the cluster view; `/healthz`, `/livez`, `/readyz`,
//! `/metrics`, `/openapi.json` and `/v1/jwks` stay open. An unknown or missing key is 401, a known principal outside
//! its rights 403.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};

use ring::digest::{digest, SHA256};
use serde::{Deserialize, Serialize};

/// The request header that carries a principal's API key.
pub const KEY_HEADER: &str = "x-palisade-key";

/// What a call needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Right {
    /// Acquire, renew, release; gateway writes.
    Acquire,
    /// Reads, lists, watches; gateway reads.
    Read,
    /// Revoke.
    Admin,
}

impl fmt::Display for Right {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Acquire => "acquire",
            Self::Read => "read",
            Self::Admin => "admin",
        })
    }
}

/// Why a call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// No key, or a key no principal has: 401.
    #[error("{0}")]
    Unauthenticated(String),
    /// A known principal without the right: 403.
    #[error("{0}")]
    Forbidden(String),
}

/// One principal's rights, as written in the policy file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rules {
    /// `sha256:<hex>` digests of the principal's API keys (several, so a key
    /// can be rotated without downtime).
    pub keys: Vec<String>,
    /// Lease-name prefixes it may acquire.
    #[serde(default)]
    pub acquire: Vec<String>,
    /// Lease-name prefixes it may read.
    #[serde(default)]
    pub read: Vec<String>,
    /// Lease-name prefixes whose grants it may revoke.
    #[serde(default)]
    pub admin: Vec<String>,
    /// Whether it may change the cluster (keys, membership).
    #[serde(default)]
    pub cluster: bool,
}

impl Rules {
    fn prefixes(&self, right: Right) -> &[String] {
        match right {
            Right::Acquire => &self.acquire,
            Right::Read => &self.read,
            Right::Admin => &self.admin,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(deserialize_with = "unique_principals")]
    principals: BTreeMap<String, Rules>,
}

/// The principals, refusing a name given twice (JSON maps would otherwise
/// keep the last silently, hiding the first one's rights from a reader of
/// the file).
fn unique_principals<'de, D>(deserializer: D) -> Result<BTreeMap<String, Rules>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct Unique;
    impl<'de> serde::de::Visitor<'de> for Unique {
        type Value = BTreeMap<String, Rules>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object of principals by name")
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut principals = BTreeMap::new();
            while let Some((name, rules)) = map.next_entry::<String, Rules>()? {
                if principals.contains_key(&name) {
                    return Err(serde::de::Error::custom(format!(
                        "principal {name:?} is named twice"
                    )));
                }
                principals.insert(name, rules);
            }
            Ok(principals)
        }
    }
    deserializer.deserialize_map(Unique)
}

/// A known caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal(pub String);

/// A loaded policy: principals by key digest.
#[derive(Clone)]
pub struct Policy {
    rules: BTreeMap<String, Rules>,
    by_digest: HashMap<[u8; 32], String>,
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("principals", &self.rules.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// Why a policy file was refused.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a valid policy (names the line and field).
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, and where.
        message: String,
    },
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

    /// Parses a policy document.
    ///
    /// # Errors
    /// What is wrong and where, in one line.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: PolicyFile = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let mut by_digest = HashMap::new();
        for (name, rules) in &file.principals {
            if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
                return Err(format!(
                    "principal name {name:?}: must be 1..=128 printable bytes"
                ));
            }
            if rules.keys.is_empty() {
                return Err(format!("principal {name:?}: `keys` is empty"));
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

/// `sha256:<64 hex>` → the digest.
fn parse_digest(text: &str) -> Option<[u8; 32]> {
    let hex = text.strip_prefix("sha256:")?;
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The policy-file form of `key`'s digest: `sha256:<hex>`.
pub fn key_digest(key: &str) -> String {
    let digest = digest(&SHA256, key.as_bytes());
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// A fresh API key: `pal_` and 64 hex digits (256 bits from the OS RNG).
///
/// # Errors
/// The OS RNG failed.
pub fn new_key() -> Result<String, PolicyError> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| PolicyError::Io {
            path: PathBuf::from("/dev/urandom"),
            source: std::io::Error::other("the OS RNG failed"),
        })?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("pal_{hex}"))
}

/// Adds the principal `name` with `rules` to `dir/policy.json` (made if
/// missing), with a fresh key written to `dir/<name>.key` (0600); `rules.keys`
/// is replaced by that key's digest. Returns the key file's path. The
/// servers read the policy at start: restart them to apply it.
///
/// # Errors
/// [`PolicyError::Invalid`] when the file exists and does not parse, or
/// already names `name`; [`PolicyError::Io`] when a file cannot be written.
pub fn add(dir: &Path, name: &str, rules: &Rules) -> Result<PathBuf, PolicyError> {
    let path = dir.join("policy.json");
    let invalid = |message: String| PolicyError::Invalid {
        path: path.clone(),
        message,
    };
    let mut file = match std::fs::read_to_string(&path) {
        Ok(text) => {
            Policy::parse(&text).map_err(invalid)?;
            serde_json::from_str::<PolicyFile>(&text).map_err(|e| invalid(e.to_string()))?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => PolicyFile {
            principals: BTreeMap::new(),
        },
        Err(source) => return Err(PolicyError::Io { path, source }),
    };
    if file.principals.contains_key(name) {
        return Err(invalid(format!("principal {name:?} exists already")));
    }
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
    {
        return Err(invalid(format!(
            "principal name {name:?}: use [A-Za-z0-9._-] (it names the key file)"
        )));
    }
    std::fs::create_dir_all(dir).map_err(|source| PolicyError::Io {
        path: dir.to_owned(),
        source,
    })?;
    let written = |at: &Path| {
        let at = at.to_owned();
        move |e: crate::certs::CertError| PolicyError::Io {
            path: at,
            source: std::io::Error::other(e.to_string()),
        }
    };
    let key = new_key()?;
    let key_path = dir.join(format!("{name}.key"));
    crate::certs::write_file(&key_path, &format!("{key}\n"), true).map_err(written(&key_path))?;
    let mut rules = rules.clone();
    rules.keys = vec![key_digest(&key)];
    file.principals.insert(name.to_owned(), rules);
    let text = serde_json::to_string_pretty(&file).map_err(|e| invalid(e.to_string()))?;
    crate::certs::write_file(&path, &format!("{text}\n"), false).map_err(written(&path))?;
    Ok(key_path)
}

/// Reads an API key file (the key is its first line).
///
/// # Errors
/// [`PolicyError::Io`].
pub fn read_key(path: &Path) -> Result<String, PolicyError> {
    let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Io {
        path: path.to_owned(),
        source,
    })?;
    Ok(text.lines().next().unwrap_or("").trim().to_owned())
}

/// Everything, for a principal that operates the whole cluster.
pub fn operator() -> Rules {
    Rules {
        keys: Vec::new(),
        acquire: vec![String::new()],
        read: vec![String::new()],
        admin: vec![String::new()],
        cluster: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(key: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert(KEY_HEADER, key.parse().expect("header"));
        h
    }

    fn policy(key: &str) -> Policy {
        let text = format!(
            r#"{{"principals": {{"orders": {{"keys": ["{}"], "acquire": ["orders."], "read": ["orders.", "shared"]}}}}}}"#,
            key_digest(key)
        );
        Policy::parse(&text).expect("policy")
    }

    #[test]
    fn a_known_key_is_its_principal_and_rights_are_prefixes() {
        let key = new_key().expect("key");
        let policy = policy(&key);
        let who = policy.authenticate(&headers(&key)).expect("known");
        assert_eq!(who, Principal("orders".into()));
        assert!(policy.allow(&who, Right::Acquire, "orders.eu").is_ok());
        assert!(matches!(
            policy.allow(&who, Right::Acquire, "payments"),
            Err(Denied::Forbidden(_))
        ));
        assert!(matches!(
            policy.allow(&who, Right::Acquire, "shared"),
            Err(Denied::Forbidden(_))
        ));
        assert!(policy.allow(&who, Right::Read, "shared.x").is_ok());
        assert!(policy.allow(&who, Right::Admin, "orders.eu").is_err());
        assert!(policy.allow_prefix(&who, Right::Read, "orders.e").is_ok());
        assert!(policy.allow_prefix(&who, Right::Read, "orders").is_err());
        assert!(policy.allow_prefix(&who, Right::Read, "").is_err());
        assert!(policy.allow_cluster(&who).is_err());
    }

    #[test]
    fn unknown_or_missing_keys_are_unauthenticated() {
        let key = new_key().expect("key");
        let policy = policy(&key);
        let other = new_key().expect("key");
        assert!(matches!(
            policy.authenticate(&headers(&other)),
            Err(Denied::Unauthenticated(_))
        ));
        assert!(matches!(
            policy.authenticate(&http::HeaderMap::new()),
            Err(Denied::Unauthenticated(_))
        ));
        // The digest is not the key.
        assert!(policy.authenticate(&headers(&key_digest(&key))).is_err());
    }

    #[test]
    fn bad_files_name_what_is_wrong() {
        let err = Policy::parse("{\"principals\": {\"a\": {\"keys\": [], \"acqire\": []}}}")
            .expect_err("typo");
        assert!(err.contains("acqire") && err.contains("line 1"), "{err}");
        let err = Policy::parse("{\"principals\": {\"a\": {\"keys\": [\"abc\"]}}}")
            .expect_err("bad digest");
        assert!(err.contains("sha256:"), "{err}");
        let digest = key_digest("k");
        let twice = format!(
            r#"{{"principals": {{"a": {{"keys": ["{digest}"]}}, "b": {{"keys": ["{digest}"]}}}}}}"#
        );
        assert!(Policy::parse(&twice).expect_err("shared").contains("share"));
        assert!(Policy::parse("{\"principals\": {\"a\": {\"keys\": []}}}").is_err());
        assert!(Policy::parse("not json").is_err());
    }

    #[test]
    fn add_writes_a_policy_that_loads_and_secret_key_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        add(dir.path(), "admin", &operator()).expect("add");
        let path = dir.path().join("policy.json");
        let policy = Policy::load(&path).expect("loads");
        let key = read_key(&dir.path().join("admin.key")).expect("key");
        let who = policy.authenticate(&headers(&key)).expect("admin");
        assert!(policy.allow_cluster(&who).is_ok());
        assert!(policy.allow_prefix(&who, Right::Read, "").is_ok());
        let text = std::fs::read_to_string(&path).expect("read");
        assert!(!text.contains(&key), "the policy holds digests only");
        assert!(
            add(dir.path(), "admin", &operator()).is_err(),
            "names are unique"
        );
        let orders = Rules {
            acquire: vec!["orders.".into()],
            ..Rules::default()
        };
        add(dir.path(), "orders", &orders).expect("a second principal");
        let policy = Policy::load(&path).expect("loads");
        let orders_key = read_key(&dir.path().join("orders.key")).expect("key");
        let who = policy.authenticate(&headers(&orders_key)).expect("orders");
        assert!(policy.allow(&who, Right::Acquire, "orders.x").is_ok());
        assert!(policy.allow_cluster(&who).is_err());
        assert!(policy.authenticate(&headers(&key)).is_ok(), "admin kept");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("admin.key"))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_principal_named_twice_is_refused() {
        let rules = format!(
            r#"{{"keys": ["sha256:{}"], "read": [""]}}"#,
            "ab".repeat(32)
        );
        let text = format!(r#"{{"principals": {{"ops": {rules}, "ops": {rules}}}}}"#);
        let err = Policy::parse(&text).expect_err("duplicate");
        assert!(err.contains("named twice"), "{err}");
    }
}
