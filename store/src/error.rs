use palisade_names::FencingToken;

/// Why the store refused or failed an operation.
///
/// Every refusal leaves the store unchanged.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The operation carried a token below the lease's fence.
    #[error("token {token} is below the fence {fence}")]
    Stale {
        /// The token the operation carried.
        token: FencingToken,
        /// The lease's fence when the operation was refused.
        fence: FencingToken,
    },
    /// The token passed the fence but the object did not satisfy the
    /// write's precondition; nothing changed (the fence neither).
    #[error("{}", precondition_message(*.current))]
    PreconditionFailed {
        /// The object's version now; `None` when there is no object.
        current: Option<u64>,
    },
    /// The key or lease name breaks the grammar; the text says how.
    #[error("invalid key: {0}")]
    InvalidKey(String),
    /// A write token outside `1..=MAX_TOKEN`.
    #[error("token {0} is out of range (1..=2^63-1)")]
    InvalidToken(u64),
    /// The value is larger than the store accepts.
    #[error("value of {size} bytes exceeds the limit of {max} bytes")]
    ValueTooLarge {
        /// The size of the refused value.
        size: usize,
        /// The configured maximum.
        max: usize,
    },
    /// The engine failed (I/O, corruption). After a failed flush the store
    /// refuses every later write: whether the failed batch reached disk is
    /// unknown, and restarting is the only way to find out.
    #[error("storage engine failure: {0}")]
    Engine(String),
    /// The engine cannot answer now but may soon: a database unreachable,
    /// restarting, slow or with every connection busy. Nothing is known to
    /// have been written; retrying is safe (a write carries its token).
    #[error("storage unavailable: {0}")]
    Unavailable(String),
}

impl From<palisade_names::NameError> for StoreError {
    fn from(err: palisade_names::NameError) -> Self {
        match err {
            palisade_names::NameError::InvalidKey(message) => StoreError::InvalidKey(message),
            palisade_names::NameError::InvalidToken(token) => StoreError::InvalidToken(token),
        }
    }
}

fn precondition_message(current: Option<u64>) -> String {
    match current {
        Some(version) => format!("the object is at version {version}"),
        None => "there is no object".to_owned(),
    }
}
