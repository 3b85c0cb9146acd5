//! Errors of the layers below (sled, openraft, TLS) as `std::io::Error`, the
//! error type of openraft's storage traits and of node startup.

/// Wraps any displayable error as an `io::Error` carrying its text.
pub fn io_err(err: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(err.to_string())
}
