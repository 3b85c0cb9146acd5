//! [`GatewayConfig`]: the HTTP layer's limits and timeouts, with their
//! defaults and the relations [`GatewayConfig::validate`] checks.

use std::time::Duration;

/// Limits and timeouts of the HTTP layer.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// The largest object body, in bytes. Default 1 MiB.
    pub max_value_bytes: usize,
    /// A request must be received and answered within this. Default 10 s.
    /// It is what stops a client that sends its body too slowly.
    pub request_timeout: Duration,
    /// On shutdown, in-flight requests get this long to finish. Default 10 s.
    pub drain_timeout: Duration,
    /// Requests in flight the server serves at once; half of them are
    /// shared out per principal (`admit.rs`). Default 4 096.
    pub max_requests: usize,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            max_value_bytes: 1024 * 1024,
            request_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(10),
            max_requests: 4096,
        }
    }
}

impl GatewayConfig {
    /// Checks the relations between settings.
    ///
    /// # Errors
    /// A sentence naming the broken relation.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_value_bytes == 0 {
            return Err("max value size must be at least 1 byte".into());
        }
        if self.max_value_bytes > 64 * 1024 * 1024 {
            return Err("max value size must be at most 64 MiB".into());
        }
        if !(64..=1_000_000).contains(&self.max_requests) {
            return Err("max requests must be between 64 and 1 000 000".into());
        }
        if self.request_timeout < Duration::from_millis(10) {
            return Err("request timeout must be at least 10 ms".into());
        }
        Ok(())
    }
}
