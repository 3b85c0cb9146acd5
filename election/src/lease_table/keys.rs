//! Apply of the signing-key commands: `InstallKey` (the first key),
//! `RotateKey` (a new signing key; the old one stays published) and
//! `RetireKey` (a rotated-out key is no longer published).

use super::command::{CommandResult, KeySecret};
use super::table::{LeaseTable, SigningKeyRecord};

impl LeaseTable {
    /// Makes `kid` the signing key, keeping the current one published, unless
    /// the table knows `kid` already (a repeated entry).
    pub(super) fn rotate_key(&mut self, kid: &str, secret: &KeySecret) -> CommandResult {
        let known = self.published_keys().any(|k| k.kid == kid);
        if !known {
            let new = SigningKeyRecord {
                kid: kid.to_owned(),
                secret: secret.0.clone(),
            };
            if let Some(old) = self.signing_key.replace(new) {
                self.previous_keys.push(old);
            }
        }
        CommandResult::None
    }

    /// Stops publishing the rotated-out key `kid`.
    pub(super) fn retire_key(&mut self, kid: &str) -> CommandResult {
        self.previous_keys.retain(|k| k.kid != kid);
        CommandResult::None
    }

    /// Installs the cluster's first signing key; a later install changes
    /// nothing (the first key stays).
    pub(super) fn install_key(&mut self, kid: &str, secret: &KeySecret) -> CommandResult {
        if self.signing_key.is_none() {
            self.signing_key = Some(SigningKeyRecord {
                kid: kid.to_owned(),
                secret: secret.0.clone(),
            });
        }
        CommandResult::None
    }
}
