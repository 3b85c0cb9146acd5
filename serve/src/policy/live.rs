//! [`LivePolicy`]: the policy a server runs with, reloaded from its file on
//! SIGHUP without a restart. A file that does not load is refused with one
//! log line and the policy in force stays.
//!
//! The policy in force is kept in a [`watch`] channel, so a call that stays
//! open (a renewal stream, a watch, a waiting acquire) can
//! [`subscribe`](LivePolicy::subscribe) and be told of every reload the
//! moment it happens, to check its caller again against the new policy.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::watch;

use crate::policy::error::PolicyError;
use crate::policy::principals::Policy;

/// The policy in force, and the file it comes from.
#[derive(Debug)]
pub struct LivePolicy {
    /// Where reloads read from (`None`: fixed, e.g. in tests).
    path: Option<PathBuf>,
    /// The policy in force; every reload that loads sends the new one.
    current: watch::Sender<Arc<Policy>>,
    /// Reloads that loaded (and put a new policy in force).
    reloads: AtomicU64,
}

impl From<Policy> for LivePolicy {
    /// A policy that no reload changes.
    fn from(policy: Policy) -> Self {
        Self {
            path: None,
            current: watch::Sender::new(Arc::new(policy)),
            reloads: AtomicU64::new(0),
        }
    }
}

impl LivePolicy {
    /// Loads the policy file at `path`.
    ///
    /// # Errors
    /// As [`Policy::load`].
    pub fn load(path: &Path) -> Result<Self, PolicyError> {
        Ok(Self {
            path: Some(path.to_owned()),
            current: watch::Sender::new(Arc::new(Policy::load(path)?)),
            reloads: AtomicU64::new(0),
        })
    }

    /// The policy in force now (a request keeps the one it started with).
    pub fn current(&self) -> Arc<Policy> {
        self.current.borrow().clone()
    }

    /// The policy in force, and every one a reload puts in force after it:
    /// the receiver's current value is the policy in force now (seen), and
    /// `changed()` resolves at the next reload that loads.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Policy>> {
        self.current.subscribe()
    }

    /// How many policies were put in force since the start: 1, plus one per
    /// reload that loaded (`/metrics` shows it, so a reload can be seen to
    /// have happened).
    pub fn generation(&self) -> u64 {
        self.reloads.load(Ordering::Relaxed) + 1
    }

    /// Reads the file again and puts it in force; the policy in force
    /// stays if it does not load.
    ///
    /// # Errors
    /// As [`Policy::load`]; nothing changed.
    pub fn reload(&self) -> Result<Arc<Policy>, PolicyError> {
        let Some(path) = &self.path else {
            return Ok(self.current());
        };
        let fresh = Arc::new(Policy::load(path)?);
        // Counted before it is sent: whoever is told of the new policy
        // sees a generation that includes it.
        self.reloads.fetch_add(1, Ordering::Relaxed);
        self.current.send_replace(fresh.clone());
        Ok(fresh)
    }

    /// Reloads on every SIGHUP the process gets, logging what happened in
    /// one line; `server` names the server in the log.
    ///
    /// # Errors
    /// The signal handler could not be installed.
    pub fn reload_on_sighup(self: &Arc<Self>, server: &'static str) -> std::io::Result<()> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hangups = signal(SignalKind::hangup())?;
        let live = Arc::downgrade(self);
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                let Some(live) = live.upgrade() else { return };
                match live.reload() {
                    Ok(policy) => tracing::info!(
                        server,
                        principals = policy.principals().count(),
                        generation = live.generation(),
                        "SIGHUP: policy reloaded"
                    ),
                    Err(err) => tracing::error!(
                        server,
                        %err,
                        "SIGHUP: policy not reloaded, the one in force stays"
                    ),
                }
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::add::add;
    use crate::policy::api_key::{read_key, KEY_HEADER};
    use crate::policy::rules::{operator, Rules};

    fn headers(key: &str) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        headers.insert(KEY_HEADER, key.parse().expect("header"));
        headers
    }

    #[test]
    fn a_reload_adds_and_removes_principals_and_a_broken_file_changes_nothing() {
        let dir = tempfile::tempdir().expect("dir");
        add(dir.path(), "admin", &operator()).expect("admin");
        let path = dir.path().join("policy.json");
        let live = LivePolicy::load(&path).expect("load");
        let held = live.current();
        let mut changes = live.subscribe();
        add(dir.path(), "orders", &Rules::default()).expect("orders");
        let orders = read_key(&dir.path().join("orders.key")).expect("key");
        assert!(live.current().authenticate(&headers(&orders)).is_err());
        assert_eq!(live.generation(), 1);
        live.reload().expect("reload");
        assert_eq!(live.generation(), 2);
        assert!(live.current().authenticate(&headers(&orders)).is_ok());
        assert!(
            changes.has_changed().expect("open"),
            "a subscriber is told of the reload"
        );
        assert!(changes
            .borrow_and_update()
            .authenticate(&headers(&orders))
            .is_ok());
        assert!(
            held.authenticate(&headers(&orders)).is_err(),
            "a policy already taken is not changed under its holder"
        );
        std::fs::write(&path, "{ not json").expect("break");
        assert!(live.reload().is_err());
        assert!(
            !changes.has_changed().expect("open"),
            "a reload that did not load tells no one"
        );
        assert_eq!(live.generation(), 2);
        assert!(
            live.current().authenticate(&headers(&orders)).is_ok(),
            "the policy in force stays"
        );
    }
}
