//! [`ServeConfig`]: how a server runs, with its documented defaults.

use std::sync::Arc;
use std::time::Duration;

/// How a server runs. [`ServeConfig::new`] gives the documented defaults.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// What the server is, for log lines ("client API", "peer RPC", ...).
    pub name: &'static str,
    /// TLS, when set; plain HTTP otherwise.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Connections served at once; more are closed on accept. Default 4096.
    pub max_connections: usize,
    /// Requests served at once over all connections; more get a 503.
    /// Default 4096.
    pub max_requests: usize,
    /// Requests one HTTP/2 connection may have open at once. Default 256.
    pub max_streams_per_connection: u32,
    /// Time to finish the TLS handshake. Default 5 s.
    pub handshake_timeout: Duration,
    /// Time to send a request's headers (HTTP/1). Default 10 s.
    pub header_timeout: Duration,
    /// Time open connections get after shutdown starts. Default 5 s.
    pub drain: Duration,
    /// A connection that moves no byte for this long with no request in
    /// flight — silent from the start, after its TLS handshake, or between
    /// requests — is closed. Default 20 s (under HTTP/2's 30 s keep-alive
    /// ping, so pings alone do not keep an idle connection open).
    pub idle_timeout: Duration,
    /// Connections one remote address may hold at once; more are closed on
    /// accept. Default a quarter of `max_connections`.
    pub max_connections_per_address: usize,
}

impl ServeConfig {
    /// Plain HTTP with the default limits.
    pub fn new(name: &'static str) -> Self {
        Self {
            name,
            tls: None,
            max_connections: 4096,
            max_requests: 4096,
            max_streams_per_connection: 256,
            handshake_timeout: Duration::from_secs(5),
            header_timeout: Duration::from_secs(10),
            drain: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(20),
            max_connections_per_address: 1024,
        }
    }

    /// The same, over TLS.
    #[must_use]
    pub fn with_tls(mut self, tls: Arc<rustls::ServerConfig>) -> Self {
        self.tls = Some(tls);
        self
    }
}
