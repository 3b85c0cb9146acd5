//! Why a call was refused ([`Denied`]) and why a policy file was
//! ([`PolicyError`]).

use std::path::PathBuf;

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
