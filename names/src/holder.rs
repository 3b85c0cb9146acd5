//! [`Holder`]: who holds, or asks for, a lease.

use std::fmt;

/// The longest holder name, in characters (what JSON Schema's `maxLength`
/// counts; at most 4 bytes each).
pub const MAX_HOLDER_LEN: usize = 256;

/// A holder name that is empty, too long or holds a control character.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidHolder(String);

/// A holder name: 1..=[`MAX_HOLDER_LEN`] characters, no control characters,
/// and (for a new name, [`Holder::new`]) no bidirectional controls
/// ([`crate::text::BIDI_CONTROLS`]).
///
/// Serialized as the bare string; deserializing checks the length and the
/// control characters again, so a holder read from a log, a snapshot or a
/// peer is as valid as one a client sent. Deserializing does not refuse a
/// bidirectional control: a log or snapshot written before that rule must
/// still load. Every entry point that names a new holder (the election's
/// acquire and handover bodies, the SDKs) checks it with [`Holder::new`].
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Holder(String);

impl Holder {
    /// Checks a new holder name against the bounds every API and SDK
    /// enforces, bidirectional controls included.
    ///
    /// # Errors
    /// [`InvalidHolder`] saying what is wrong with it.
    pub fn new(holder: &str) -> Result<Self, InvalidHolder> {
        crate::text::refuse_bidi("holder", holder).map_err(InvalidHolder)?;
        Self::stored(holder)
    }

    /// Checks a holder name read back from storage or a peer: the length and
    /// the control characters, not the bidirectional controls (a name
    /// stored before that rule existed must still load).
    ///
    /// # Errors
    /// [`InvalidHolder`] saying what is wrong with it.
    pub fn stored(holder: &str) -> Result<Self, InvalidHolder> {
        if holder.is_empty() || holder.chars().count() > MAX_HOLDER_LEN {
            return Err(InvalidHolder(format!(
                "holder must be 1..={MAX_HOLDER_LEN} characters"
            )));
        }
        if holder.chars().any(char::is_control) {
            return Err(InvalidHolder(
                "holder must not contain control characters".into(),
            ));
        }
        Ok(Self(holder.to_owned()))
    }

    /// The holder as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Holder {
    type Error = InvalidHolder;

    fn try_from(holder: String) -> Result<Self, InvalidHolder> {
        Self::stored(&holder)
    }
}

impl From<Holder> for String {
    fn from(holder: Holder) -> String {
        holder.0
    }
}

impl std::ops::Deref for Holder {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<&str> for Holder {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

/// For tests only (the `test-support` feature): a holder from a literal.
///
/// # Panics
/// If `holder` is not a valid holder name.
#[cfg(feature = "test-support")]
impl From<&str> for Holder {
    fn from(holder: &str) -> Self {
        #[allow(clippy::expect_used)]
        Self::new(holder).expect("a valid holder name")
    }
}

impl PartialEq<str> for Holder {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_are_bounded_in_characters_and_free_of_control_characters() {
        assert!(Holder::new("worker-1").is_ok());
        assert!(Holder::new(&"é".repeat(MAX_HOLDER_LEN)).is_ok());
        assert!(Holder::new(&"é".repeat(MAX_HOLDER_LEN + 1)).is_err());
        assert!(Holder::new("").is_err());
        assert!(Holder::new("a\nb").is_err());
        assert!(Holder::new("a\u{85}b").is_err());
        assert!(Holder::new("admin\u{202E}gpj.exe").is_err());
        assert!(Holder::new("a\u{2066}b").is_err());
        // Read back from a log or snapshot written before the rule: loads.
        assert!(Holder::stored("admin\u{202E}gpj.exe").is_ok());
        let old: Holder = serde_json::from_str("\"a\\u202eb\"").expect("stored holder");
        assert_eq!(old.as_str(), "a\u{202E}b");
        let parsed: Result<Holder, _> = serde_json::from_str("\"\"");
        assert!(parsed.is_err());
        let round: Holder = serde_json::from_str("\"w\"").expect("holder");
        assert_eq!(serde_json::to_string(&round).expect("json"), "\"w\"");
    }
}
