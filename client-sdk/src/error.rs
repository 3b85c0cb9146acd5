use std::time::Duration;

/// What can go wrong, kept apart by what the caller should do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The lease is held by someone else (acquire without waiting, or the
    /// wait ran out). Never retried.
    #[error("lease is held by {holder:?} (token {token})")]
    Held {
        /// The current holder.
        holder: String,
        /// Its token.
        token: u64,
    },
    /// This holder no longer holds the lease: a renewal was refused, the safe
    /// deadline passed, or the lease was released. Stop acting as leader.
    #[error("lease lost: {0}")]
    LeaseLost(String),
    /// A waiting acquire of a higher priority preempted this (preemptible)
    /// grant: stop acting as leader. The SDK releases it at once, so the
    /// candidate is granted without waiting for the grant's deadline.
    #[error("preempted: {0}")]
    Preempted(String),
    /// The lease is free but held back by the lock-delay of a grant that
    /// expired (acquire without waiting, or the wait ran out). Never
    /// retried.
    #[error("lease is held back by a lock-delay for {retry_after:?}")]
    LockDelay {
        /// How long the delay lasts yet.
        retry_after: Duration,
    },
    /// The gateway refused a write because a newer token has been used on
    /// this lease: another holder took over. Stop acting as leader.
    #[error("fenced: token {token} is below the fence {fence}")]
    Fenced {
        /// The token the write carried.
        token: u64,
        /// The fence that refused it.
        fence: u64,
    },
    /// A conditional write (`Lease::put_if`, `Lease::delete_if`) found the
    /// object not as required; nothing changed. Not a lost lease.
    #[error("precondition failed at {key:?}: {}", match current_version {
        Some(v) => format!("the object is at version {v}"),
        None => "there is no object".to_owned(),
    })]
    PreconditionFailed {
        /// The key written.
        key: String,
        /// The object's version now; `None` when there is no object.
        current_version: Option<u64>,
    },
    /// The server refused the request as malformed; retrying will not help.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// 401: the server has an access policy and this client's API key
    /// ([`crate::ClientConfig::with_api_key`]) is missing or unknown; or the
    /// gateway could not verify a lease JWT. Never retried.
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    /// 403: this client's principal may not do this to this lease (outside
    /// its rights), or a JWT was used for another lease. Never retried.
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// Nothing there (a lease never granted, an object that does not exist).
    #[error("not found: {0}")]
    NotFound(String),
    /// No node answered usefully within the retry budget (connection refused,
    /// timeouts, 503 no quorum). Safe to retry later.
    #[error("unavailable after {attempts} attempts over {elapsed:?}: {last}")]
    Unavailable {
        /// Attempts made.
        attempts: u32,
        /// Time spent.
        elapsed: Duration,
        /// The last failure.
        last: String,
    },
    /// PostgreSQL refused a statement (feature `postgres`): SQLSTATE and
    /// message on one line. A stale token is [`Error::Fenced`] instead, and a
    /// connection that failed [`Error::Unavailable`].
    #[error("database: {0}")]
    Database(String),
    /// The server answered something this SDK does not understand.
    #[error("unexpected answer {status}: {message}")]
    Protocol {
        /// HTTP status.
        status: u16,
        /// What was wrong.
        message: String,
    },
}

impl Error {
    /// Whether this error means "you are not the leader any more".
    pub fn is_lease_lost(&self) -> bool {
        matches!(
            self,
            Error::LeaseLost(_) | Error::Preempted(_) | Error::Fenced { .. }
        )
    }
}
