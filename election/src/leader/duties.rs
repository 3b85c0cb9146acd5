//! The leader's duties, run on every node every 10 ms and acted on only by
//! the leader: track lease deadlines (promote on taking over, demote on
//! losing it), propose `Expire` for passed deadlines, `Reclaim` for leases
//! free for `reclaim_after`, retire rotated-out keys, and install the
//! signing key if the cluster has none. Each proposal runs on its own task
//! ([`spawn_proposal`]), so a slow commit never delays the tick.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use openraft::RaftMetrics;
use palisade_names::{FencingToken, LeaseName};
use tokio::sync::mpsc;

use super::lessor::Lessor;
use super::retirement::KeyRetirer;
use crate::group::Group;
use crate::lease_table::command::{Command, CommandResult, KeySecret};
use crate::raft::applied::SharedState;
use crate::raft::propose::{ProposeError, Proposer};
use crate::raft::{applied_in_term, leads, NodeId, Raft, TypeConfig};
use crate::signing::generate_key;

/// The most free leases one `Reclaim` entry names (and at most
/// [`MAX_RECLAIM_BYTES`](crate::leader::lessor::MAX_RECLAIM_BYTES) of names).
const RECLAIM_BATCH: usize = 1000;

/// How often the duties look.
const TICK: Duration = Duration::from_millis(10);

/// The leader's duties and what they remember between ticks.
#[derive(Debug)]
pub struct LeaderDuties {
    /// The node's Raft, whose metrics say who leads.
    pub raft: Arc<Raft>,
    /// The path into the log.
    pub proposer: Proposer,
    /// The applied state (the table, the feed of touched leases).
    pub shared: SharedState,
    /// Lease deadlines, on the leader's clock.
    pub lessor: Arc<Lessor>,
    /// When each rotated-out key is due for retirement: group 0's duties
    /// alone keep the signing keys (install, retire); `None` elsewhere.
    pub retirer: Option<KeyRetirer>,
    /// How long a lease stays free before it is reclaimed.
    pub reclaim_after: Duration,
}

/// A kind of proposal of which at most one is in flight; cleared when the
/// proposal ends, whatever its outcome, so a failed one is tried again on a
/// later tick.
#[derive(Debug, Clone, Default)]
struct OneAtATime(Arc<AtomicBool>);

/// Proof that a [`OneAtATime`] proposal is in flight; ends it on drop.
#[derive(Debug)]
struct InFlight(Arc<AtomicBool>);

impl OneAtATime {
    fn start(&self) -> Option<InFlight> {
        (!self.0.swap(true, Ordering::SeqCst)).then(|| InFlight(self.0.clone()))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// Proposes `command` on its own task and hands the outcome to `done`.
fn spawn_proposal(
    proposer: &Proposer,
    command: Command,
    done: impl FnOnce(Result<CommandResult, ProposeError>) + Send + 'static,
) {
    let proposer = proposer.clone();
    tokio::spawn(async move { done(proposer.propose(command).await) });
}

/// What one tick found to do, read under one lock of the applied state.
struct Due {
    /// Passed deadlines: lease, token, and whether the lessor tracked it as
    /// a reservation nobody had claimed (a claim seen since is tracked
    /// afresh).
    expired: Vec<(LeaseName, FencingToken, bool)>,
    /// Leases free long enough, with the modify index they were seen at.
    reclaim: Vec<(LeaseName, u64)>,
    /// Whether the cluster has a signing key.
    has_key: bool,
    /// Rotated-out keys due for retirement.
    retiring: Vec<String>,
}

impl LeaderDuties {
    /// The duties of `group`'s leader, keeping the signing keys with
    /// `retirer` (group 0's) and reclaiming leases free for `reclaim_after`.
    pub fn of(group: &Group, retirer: Option<KeyRetirer>, reclaim_after: Duration) -> Self {
        Self {
            raft: group.raft.clone(),
            proposer: group.proposer.clone(),
            shared: group.applied.clone(),
            lessor: group.lessor.clone(),
            retirer,
            reclaim_after,
        }
    }

    /// Runs the duties until the task is aborted.
    pub async fn run(mut self) {
        let (failed_retirements, mut retirement_failures) = mpsc::unbounded_channel::<String>();
        let installing_key = OneAtATime::default();
        let reclaiming = OneAtATime::default();
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut seen_leader = None;
        loop {
            tick.tick().await;
            // Drained on every node, leader or not, so the feed stays small.
            let touched = self.shared.take_touched();
            let metrics = self.raft.metrics().borrow_watched().clone();
            self.count_leader_change(&metrics, &mut seen_leader);
            if !self.track_leadership(&metrics) {
                continue;
            }
            let reclaim = reclaiming.start();
            let due = self.shared.read(|s| {
                let expired = self
                    .lessor
                    .reconcile_changes(&s.table, &touched)
                    .into_iter()
                    .map(|(lease, token)| {
                        let unclaimed = self.lessor.is_reservation(&lease, token);
                        (lease, token, unclaimed)
                    })
                    .collect();
                let previous = s.table.previous_keys.iter().map(|k| k.kid.as_str());
                Due {
                    expired,
                    reclaim: if reclaim.is_some() {
                        self.lessor
                            .reclaimable(&s.table, self.reclaim_after, RECLAIM_BATCH)
                    } else {
                        Vec::new()
                    },
                    has_key: self.retirer.is_none() || s.table.signing_key.is_some(),
                    retiring: self
                        .retirer
                        .as_mut()
                        .map_or_else(Vec::new, |r| r.due(metrics.current_term, previous)),
                }
            });
            if let Some(in_flight) = reclaim.filter(|_| !due.reclaim.is_empty()) {
                self.reclaim(due.reclaim, in_flight);
            }
            while let Ok(kid) = retirement_failures.try_recv() {
                if let Some(retirer) = self.retirer.as_mut() {
                    retirer.failed(&kid);
                }
            }
            self.retire(due.retiring, &failed_retirements);
            self.expire(due.expired);
            if !due.has_key {
                if let Some(in_flight) = installing_key.start() {
                    self.install_key(in_flight);
                }
            }
        }
    }

    /// Counts a change of leader (not the first one seen).
    fn count_leader_change(
        &self,
        metrics: &RaftMetrics<TypeConfig>,
        seen_leader: &mut Option<NodeId>,
    ) {
        if metrics.current_leader != *seen_leader {
            if seen_leader.is_some() {
                self.shared.metrics.leader_changes.inc();
            }
            *seen_leader = metrics.current_leader;
        }
    }

    /// Promotes or demotes the lessor to match `metrics`
    /// ([`follow_leadership`]); true if this node leads and its lessor with
    /// it.
    fn track_leadership(&self, metrics: &RaftMetrics<TypeConfig>) -> bool {
        follow_leadership(&self.lessor, metrics)
    }

    /// Proposes one `Reclaim` of `leases`.
    fn reclaim(&self, leases: Vec<(LeaseName, u64)>, in_flight: InFlight) {
        let count = leases.len();
        spawn_proposal(
            &self.proposer,
            Command::Reclaim { leases },
            move |outcome| {
                match outcome {
                    Ok(_) => tracing::debug!(count, "reclaimed free leases"),
                    Err(err) => tracing::debug!(
                        %err,
                        "could not reclaim free leases; the next full scan finds them again"
                    ),
                }
                drop(in_flight);
            },
        );
    }

    /// Proposes a `RetireKey` for each key in `kids`; a failure is reported
    /// on `failures`, so the retirer tries again.
    fn retire(&self, kids: Vec<String>, failures: &mpsc::UnboundedSender<String>) {
        for kid in kids {
            let failures = failures.clone();
            let command = Command::RetireKey { kid: kid.clone() };
            spawn_proposal(&self.proposer, command, move |outcome| match outcome {
                Ok(_) => tracing::info!(%kid, "retired a rotated-out signing key"),
                Err(_) => {
                    let _ = failures.send(kid);
                }
            });
        }
    }

    /// Proposes an `Expire` for each passed deadline.
    fn expire(&self, expired: Vec<(LeaseName, FencingToken, bool)>) {
        for (lease, token, unclaimed) in expired {
            let lessor = self.lessor.clone();
            let command = Command::Expire {
                lease: lease.clone(),
                token,
                unclaimed,
            };
            spawn_proposal(&self.proposer, command, move |outcome| match outcome {
                Ok(CommandResult::Freed) => tracing::info!(%lease, %token, "lease expired"),
                // Not applied: released or replaced meanwhile (the feed
                // drops it), or a reservation claimed first (tracked
                // afresh). Re-armed in case the lessor still holds it.
                Ok(_) | Err(_) => lessor.expire_failed(&lease, token),
            });
        }
    }

    /// Proposes the cluster's first signing key.
    fn install_key(&self, in_flight: InFlight) {
        let (kid, secret) = generate_key();
        let command = Command::InstallKey {
            kid: kid.clone(),
            secret: KeySecret(secret),
        };
        spawn_proposal(&self.proposer, command, move |outcome| {
            match outcome {
                Ok(_) => tracing::info!(%kid, "installed the cluster signing key"),
                Err(err) => {
                    tracing::debug!(%err, "could not install a signing key yet; retrying")
                }
            }
            drop(in_flight);
        });
    }
}

/// Promotes or demotes `lessor` to match `metrics`; true if the node leads
/// and its lessor with it. A new leader's lessor is promoted only once the
/// node applied an entry of its term: the promotion's first scan must find
/// every grant earlier leaders committed, each of which gets the takeover's
/// grace (a grant applied after the scan would get its ttl alone, short of
/// what the old leader may have renewed it to on its lease). Until then the
/// node proposes no expiry.
fn follow_leadership(lessor: &Lessor, metrics: &RaftMetrics<TypeConfig>) -> bool {
    if !leads(metrics) {
        if lessor.leading().is_some() {
            tracing::info!(
                term = metrics.current_term,
                "no longer leader: lease expiry stops here"
            );
        }
        lessor.demote();
        return false;
    }
    if lessor.leading() != Some(metrics.current_term) {
        if !applied_in_term(metrics) {
            // An earlier term's tracking means nothing now.
            lessor.demote();
            return false;
        }
        tracing::info!(
            term = metrics.current_term,
            "became leader: every held lease gets a full ttl from now"
        );
        lessor.promote(metrics.current_term);
    }
    true
}

#[cfg(test)]
mod tests {
    use openraft::testing::log_id;
    use openraft::ServerState;

    use super::*;

    /// Node 1's metrics: leading `term` (or not), its last applied entry
    /// of `applied_term`.
    fn metrics(leads: bool, term: u64, applied_term: u64) -> RaftMetrics<TypeConfig> {
        let mut m = RaftMetrics::new_initial(1);
        m.current_term = term;
        if leads {
            m.state = ServerState::Leader;
            m.current_leader = Some(1);
        }
        m.last_applied = Some(log_id::<TypeConfig>(applied_term, 1, 7));
        m
    }

    #[test]
    fn a_new_leader_promotes_its_lessor_only_once_it_applied_an_entry_of_its_term() {
        let lessor = Lessor::default();
        assert!(!follow_leadership(&lessor, &metrics(true, 3, 2)));
        assert_eq!(lessor.leading(), None, "not before its blank entry applied");
        assert!(follow_leadership(&lessor, &metrics(true, 3, 3)));
        assert_eq!(lessor.leading(), Some(3));
        // Leading again in a later term, not yet applied there: the old
        // term's tracking is dropped, not kept.
        assert!(!follow_leadership(&lessor, &metrics(true, 5, 3)));
        assert_eq!(lessor.leading(), None);
        assert!(!follow_leadership(&lessor, &metrics(false, 6, 6)));
        assert_eq!(lessor.leading(), None);
    }
}
