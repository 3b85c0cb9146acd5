//! [`AppState`]: what every handler and middleware of the gateway shares.

use std::sync::Arc;

use palisade_serve::policy::LivePolicy;

use crate::auth::Verifier;
use crate::config::GatewayConfig;
use crate::observe::Observer;

/// What every handler shares.
#[derive(Debug)]
pub struct AppState<S> {
    /// The fenced store.
    pub store: Arc<S>,
    /// Checks lease JWTs.
    pub verifier: Arc<Verifier>,
    /// Limits.
    pub config: Arc<GatewayConfig>,
    /// Who may read and write which leases' objects (reloaded on SIGHUP);
    /// `None`: everyone.
    pub policy: Option<Arc<LivePolicy>>,
    /// Metrics and the fencing audit.
    pub observer: Arc<Observer>,
}

impl<S> Clone for AppState<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            verifier: self.verifier.clone(),
            config: self.config.clone(),
            policy: self.policy.clone(),
            observer: self.observer.clone(),
        }
    }
}
