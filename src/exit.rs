//! Exit codes a script can trust: one table for every command (README,
//! "Exit codes"), chosen here from what the server or the SDK said.

use std::process::ExitCode;

use palisade_client::Error;

/// A failure none of the codes below names (a protocol error, a local
/// file that cannot be read, an internal error).
pub(crate) const FAILED: u8 = 1;
/// A bad flag, or a request the server refused as bad (400).
pub(crate) const USAGE: u8 = 2;
/// The lease is lost: a renewal or release of a grant that is not current,
/// a preemption, or a held lease lost under `--hold`, `run` or `proxy`.
pub(crate) const LOST: u8 = 3;
/// Nothing there: a lease never granted, an object, a principal (404).
pub(crate) const NOT_FOUND: u8 = 4;
/// Held by another holder, or held back by a lock-delay (409 `held`,
/// `lock_delay`, `conflict`).
pub(crate) const HELD: u8 = 5;
/// A write or fence refused for a stale token (409 `stale_token`).
pub(crate) const STALE: u8 = 6;
/// A conditional write whose condition failed (412).
pub(crate) const PRECONDITION: u8 = 7;
/// No or a wrong API key, certificate or JWT (401), or not allowed (403).
pub(crate) const DENIED: u8 = 8;
/// No quorum, no node answered, or the server is over its limits (503,
/// 429, transport errors): retry later.
pub(crate) const UNAVAILABLE: u8 = 9;

/// The exit code for `err`.
pub(crate) fn of(err: &Error) -> ExitCode {
    ExitCode::from(match err {
        Error::LeaseLost(_) | Error::Preempted(_) => LOST,
        Error::Held { .. } | Error::LockDelay { .. } => HELD,
        Error::Fenced { .. } => STALE,
        Error::PreconditionFailed { .. } => PRECONDITION,
        Error::BadRequest(_) => USAGE,
        Error::Unauthorized(_) | Error::Forbidden(_) => DENIED,
        Error::NotFound(_) => NOT_FOUND,
        Error::Unavailable { .. } => UNAVAILABLE,
        Error::Database(_) | Error::Protocol { .. } => FAILED,
    })
}

/// The exit code for an HTTP answer with `status` and error `code` (the
/// commands that speak HTTP themselves: objects, fences, the cluster's
/// operator calls).
pub(crate) fn of_status(status: u16, code: &str) -> ExitCode {
    ExitCode::from(match (status, code) {
        (400, _) | (413, _) => USAGE,
        (401 | 403, _) => DENIED,
        (404, _) => NOT_FOUND,
        (409, "stale_token") => STALE,
        (409, "lost" | "preempted" | "max_hold") => LOST,
        (409, _) => HELD,
        (412, _) => PRECONDITION,
        (429 | 502 | 503 | 504, _) => UNAVAILABLE,
        _ => FAILED,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_has_its_own_code() {
        let codes = [
            of_status(400, "bad_request"),
            of_status(401, "unauthorized"),
            of_status(404, "not_found"),
            of_status(409, "held"),
            of_status(409, "stale_token"),
            of_status(409, "lost"),
            of_status(412, "precondition_failed"),
            of_status(503, "no_quorum"),
            of_status(500, "internal"),
        ];
        let wanted = [
            USAGE,
            DENIED,
            NOT_FOUND,
            HELD,
            STALE,
            LOST,
            PRECONDITION,
            UNAVAILABLE,
            FAILED,
        ];
        for (code, wanted) in codes.iter().zip(wanted) {
            assert_eq!(*code, ExitCode::from(wanted));
        }
        assert_eq!(
            of(&Error::Fenced { token: 1, fence: 2 }),
            ExitCode::from(STALE)
        );
        assert_eq!(
            of(&Error::Held {
                holder: "a".into(),
                token: 1
            }),
            ExitCode::from(HELD)
        );
    }
}
