//! `palisade policy init|add`: a principal added to a policy file, with a
//! fresh key in a 0600 file beside it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::certs::{write_file, CertError};
use crate::policy::api_key::{key_digest, new_key};
use crate::policy::error::PolicyError;
use crate::policy::policy_file::PolicyFile;
use crate::policy::principals::Policy;
use crate::policy::rules::Rules;

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
        move |e: CertError| PolicyError::Io {
            path: at,
            source: std::io::Error::other(e.to_string()),
        }
    };
    let key = new_key()?;
    let key_path = dir.join(format!("{name}.key"));
    write_file(&key_path, &format!("{key}\n"), true).map_err(written(&key_path))?;
    let mut rules = rules.clone();
    rules.keys = vec![key_digest(&key)];
    file.principals.insert(name.to_owned(), rules);
    let text = serde_json::to_string_pretty(&file).map_err(|e| invalid(e.to_string()))?;
    write_file(&path, &format!("{text}\n"), false).map_err(written(&path))?;
    Ok(key_path)
}
