//! The HTTP server loop every Palisade server runs ([`serve`]).
//!
//! axum's own `serve` has no TLS, no connection cap and no header timeout;
//! this loop adds them around the same `Router`:
//! - optional TLS ([`tls`]), with or without client certificates; a
//!   verified client certificate reaches handlers as a [`PeerCertificate`]
//!   request extension, the remote address as axum's `ConnectInfo`;
//! - at most `max_connections` at once: one more is closed at once (the
//!   client retries elsewhere) instead of exhausting file descriptors;
//! - HTTP/1.1 and HTTP/2 (h2c by prior knowledge, h2 by ALPN over TLS) on
//!   the same port; an HTTP/2 connection carries at most
//!   `max_streams_per_connection` requests at once, and the server at most
//!   `max_requests` across all connections: one more is a fast 503
//!   `overloaded` (so HTTP/2's multiplexing cannot raise what one node
//!   buffers above what `max_connections` HTTP/1.1 connections could);
//! - a slow client gets `header_timeout` to send its headers and
//!   `handshake_timeout` to finish TLS, then is dropped;
//! - on shutdown, no new connection is accepted and open ones get `drain` to
//!   finish their requests.
//!
//! Handshake failures are logged once per remote address (not per attempt),
//! so a scanner cannot flood the log.
//!
//! Files: `server.rs` the accept loop ([`serve`]), `connection.rs` one
//! connection (TLS handshake, [`PeerCertificate`], the request cap),
//! `config.rs` [`ServeConfig`], `logged_once.rs` the once-per-address log.
//! Beside the loop: [`tls`] (PEM in, rustls configs out), [`certs`] (the
//! cluster CA and its certificates), [`policy`] (who may call a server) and
//! [`checked_in`] (a generated file kept in the repository is current).

pub mod admission;
pub mod certs;
pub mod checked_in;
pub mod policy;
pub mod tls;

mod config;
mod connection;
mod idle;
mod logged_once;
mod server;

pub use config::ServeConfig;
pub use connection::PeerCertificate;
pub use rustls;
pub use server::serve;
