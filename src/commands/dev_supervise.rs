//! [`Supervisor`]: `palisade dev` notices a process of its cluster that
//! died (an election node or a gateway), says so on stderr and starts it
//! again on the same ports and data dir — at most [`RESTARTS`] times within
//! the restart window per process; after that it says it gives up on that
//! process and leaves it down.

use crate::output::complain;
use std::collections::{HashMap, HashSet, VecDeque};
use std::path::Path;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use palisade_local_cluster::{Cluster, Node};

/// How many restarts of one process the window allows.
pub const RESTARTS: usize = 3;

/// Restarts per process, and the processes given up on.
#[derive(Debug)]
pub struct Supervisor {
    /// The window [`RESTARTS`] counts over (a minute, unless
    /// `--restart-window-secs` says otherwise).
    window: Duration,
    /// When each process (by name) was restarted, within the window.
    restarts: HashMap<String, VecDeque<Instant>>,
    /// Processes that died once more after [`RESTARTS`] restarts in the
    /// window: left down.
    given_up: HashSet<String>,
}

impl Supervisor {
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            restarts: HashMap::new(),
            given_up: HashSet::new(),
        }
    }

    /// Whether `name` may be restarted now (and counts the restart if so).
    fn may_restart(&mut self, name: &str, now: Instant) -> bool {
        let times = self.restarts.entry(name.to_owned()).or_default();
        while times
            .front()
            .is_some_and(|t| now.duration_since(*t) >= self.window)
        {
            times.pop_front();
        }
        if times.len() >= RESTARTS {
            self.given_up.insert(name.to_owned());
            return false;
        }
        times.push_back(now);
        true
    }

    /// Checks every election node and gateway once: a process that exited
    /// is reported and restarted, or given up on.
    pub fn check(&mut self, exe: &Path, root: &Path, cluster: &mut Cluster, gateways: &mut [Node]) {
        for (id, status) in cluster.exited_nodes() {
            let name = format!("election node {id}");
            let log = root.join(format!("election-{id}.log"));
            if self.decide(&name, status, &log) {
                if let Err(err) = cluster.start_node(id) {
                    complain!("palisade dev: cannot restart {name}: {err}");
                }
            } else {
                // Reaped and left down: not reported again.
                cluster.kill(id);
            }
        }
        for (i, gateway) in gateways.iter_mut().enumerate() {
            let name = match i {
                0 => "the gateway".to_owned(),
                _ => format!("gateway {}", i + 1),
            };
            if self.given_up.contains(&name) {
                continue;
            }
            let Some(status) = gateway.exited() else {
                continue;
            };
            let log = match i {
                0 => root.join("gateway.log"),
                _ => root.join(format!("gateway-{}.log", i + 1)),
            };
            if self.decide(&name, status, &log) {
                match Node::start(exe, gateway.spec().clone()) {
                    Ok(node) => *gateway = node,
                    Err(err) => complain!("palisade dev: cannot restart {name}: {err}"),
                }
            } else {
                gateway.kill();
            }
        }
    }

    /// Says on stderr that `name` exited and what happens now; whether to
    /// restart it.
    fn decide(&mut self, name: &str, status: ExitStatus, log: &Path) -> bool {
        let restart = self.may_restart(name, Instant::now());
        if restart {
            complain!(
                "palisade dev: {name} exited ({status}); restarting it \
                 (at most {RESTARTS} restarts per {} s; its log: {})",
                self.window.as_secs(),
                log.display()
            );
        } else {
            complain!(
                "palisade dev: {name} exited ({status}) after {RESTARTS} restarts within {} s; \
                 not restarting it again (its log: {}); restart palisade dev to try again",
                self.window.as_secs(),
                log.display()
            );
        }
        restart
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{Supervisor, RESTARTS};

    #[test]
    fn a_process_is_restarted_at_most_three_times_a_window() {
        let mut supervisor = Supervisor::new(Duration::from_secs(60));
        let start = Instant::now();
        for i in 0..RESTARTS {
            let at = start + Duration::from_secs(i as u64);
            assert!(supervisor.may_restart("node", at));
        }
        assert!(!supervisor.may_restart("node", start + Duration::from_secs(10)));
        // Another process has its own count.
        assert!(supervisor.may_restart("gateway", start));
        // Once the first restart is a window old, one more is allowed.
        let later = Instant::now() + Duration::from_secs(61);
        let mut fresh = Supervisor::new(Duration::from_secs(60));
        for _ in 0..RESTARTS {
            assert!(fresh.may_restart("node", start));
        }
        assert!(fresh.may_restart("node", later));
    }
}
