//! [`AppState`]: what every handler and middleware of the gateway shares.

use std::sync::Arc;

use palisade_serve::policy::LivePolicy;

use crate::config::GatewayConfig;
use crate::observe::Observer;
use crate::verify::Verifier;

/// What every handler shares: one `Arc`, so the clone axum makes for every
/// handler and middleware of every request is one atomic increment, as the
/// election's `ApiState`. (As five `Arc`s, its clones and drops were ~1.5%
/// of a fenced PUT's CPU samples; throughput did not measurably change with
/// one: 28.6k vs 28.7k PUT/s at c=64, three alternated runs each.)
#[derive(Debug)]
pub struct AppState<S>(Arc<AppParts<S>>);

impl<S> AppState<S> {
    /// Shares `parts` with every handler.
    pub fn new(parts: AppParts<S>) -> Self {
        Self(Arc::new(parts))
    }
}

impl<S> Clone for AppState<S> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<S> std::ops::Deref for AppState<S> {
    type Target = AppParts<S>;

    fn deref(&self) -> &AppParts<S> {
        &self.0
    }
}

/// The parts of [`AppState`].
#[derive(Debug)]
pub struct AppParts<S> {
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
