//! Leadership placement by priority, the way ICE server groups do it: each
//! node has a priority (`--priority`); the Raft leader checks its fellow
//! voters every [`Placement::every`], and hands leadership (openraft's
//! `transfer_leader`, about one round trip) to the member of highest
//! priority above its own that has, for [`Placement::checks`] checks in a
//! row, answered its standing and held the whole log the leader had at the
//! check. So a node that just restarted, is paused or lags does not
//! get leadership, and leadership moves at most once per `checks` checks:
//! after a transfer every streak starts again, on whichever node leads.
//! Equal priorities never move it (a sticky leader), and a `--never-lead`
//! node is never a candidate, whatever its priority.
//!
//! With partitions (`--partitions` > 1) each partition also has a home
//! ([`home`]): of the voters that may lead with the highest priority, by
//! id, the one at the partition's id modulo their count. Its leader hands
//! leadership to the home the same way (caught up for `checks` checks), so
//! with every node healthy no node leads more than ⌈partitions / such
//! voters⌉, and a node that comes back gets its partitions back. A node
//! whose standing is not known (it never answered this leader) counts as
//! one that may lead at the top priority: so a node going down moves no
//! home, and its partitions stay where their elections put them until it
//! is back.
//!
//! openraft's transfer makes the leader stop heartbeats and refuse writes
//! at once, and the target ignores it if its log is behind the leader's at
//! that instant; then leadership changes by an election instead (about one
//! election timeout and a round without a leader). Checking that the target
//! holds the whole log right before the transfer makes that rare, not
//! impossible, under a steady write load.
//!
//! Placement only ever *moves* leadership between healthy nodes; who wins an
//! election after a crash is still Raft's random timing. A transfer's vote
//! is granted inside the voters' leader lease, so the old leader stops
//! answering renewals on that lease *before* it asks for the transfer
//! ([`Handoff`]): every renewal it answered was sent before the new leader
//! took over, and the new leader gives every held lease a full ttl from its
//! own clock before it may expire one.

use std::collections::BTreeMap;
use std::sync::Arc;

use openraft::async_runtime::WatchReceiver;
use prometheus_client::metrics::counter::Counter;

use palisade_plumbing::sync::lock;

use crate::config::Placement;
use crate::group_id::GroupId;
use crate::peer::dialer::PeerDialer;
use crate::peer::standing::Standing;
use crate::raft::lease::Handoff;
use crate::raft::{NodeId, Raft};

/// One fellow voter as the leader saw it in one check.
#[derive(Debug, Clone, Copy)]
pub struct Seen {
    /// The voter.
    pub id: NodeId,
    /// Its answer; `None` if it did not answer in time.
    pub standing: Option<Standing>,
    /// The last log index the leader knows it holds (`None`: nothing yet).
    pub matched: Option<u64>,
}

/// The leader's streaks of good checks per candidate.
#[derive(Debug, Default)]
pub struct Tracker {
    streaks: BTreeMap<NodeId, u32>,
}

impl Tracker {
    /// Forgets everything (this node stopped leading).
    pub fn reset(&mut self) {
        self.streaks.clear();
    }

    /// Records one check by a leader of priority `mine` whose last log
    /// index is now `last_index`. A check is good for a voter that answered,
    /// may lead, has a higher priority and holds the whole log now (openraft
    /// ignores a transfer to a node whose log is behind the leader's, and the
    /// leader then refuses writes until an election). Returns the node to
    /// hand leadership to, if one has earned it: of those with `checks` good
    /// checks in a row, the highest priority (then the lowest id) — unless a
    /// node of a still higher priority is on its way there (good now, its
    /// streak not yet full), which is waited for, so leadership moves once,
    /// not twice. Every streak restarts after a pick.
    ///
    /// `home`: the partition's home ([`home`]), which is good at an equal
    /// priority too, and wins a tie.
    pub fn check(
        &mut self,
        mine: u32,
        seen: &[Seen],
        last_index: Option<u64>,
        (checks, home): (u32, Option<NodeId>),
    ) -> Option<NodeId> {
        let last_index = last_index.unwrap_or(0);
        let mut best: Option<(u32, bool, NodeId)> = None;
        let mut rising: Option<u32> = None;
        for voter in seen {
            let priority = voter.standing.map_or(0, |s| s.priority);
            let is_home = home == Some(voter.id);
            let good = voter.standing.is_some_and(|standing| {
                !standing.never_lead
                    && (standing.priority > mine || (is_home && standing.priority == mine))
                    && voter.matched.unwrap_or(0) >= last_index
            });
            let streak = self.streaks.entry(voter.id).or_insert(0);
            *streak = if good { *streak + 1 } else { 0 };
            if *streak >= checks {
                let beats = |(p, h, id): (u32, bool, NodeId)| {
                    (priority, is_home) > (p, h) || ((priority, is_home) == (p, h) && voter.id < id)
                };
                if best.is_none_or(beats) {
                    best = Some((priority, is_home, voter.id));
                }
            } else if good {
                rising = rising.max(Some(priority));
            }
        }
        // Nodes no longer voters lose their streaks.
        self.streaks
            .retain(|id, _| seen.iter().any(|voter| voter.id == *id));
        let (priority, _, to) = best?;
        if rising.is_some_and(|r| r > priority) {
            return None;
        }
        self.streaks.clear();
        Some(to)
    }
}

/// Partition `group`'s home among `partitions` (`None` with one: a
/// single group's leader is sticky): of the voters (`me`, leading, among
/// them) that may lead at the highest priority, by id, the one at the
/// group's id modulo their count. A voter whose standing `known` lacks
/// counts as one that may lead at the top priority.
pub fn home(
    (group, partitions): (GroupId, u32),
    voters: &[NodeId],
    known: &BTreeMap<NodeId, Standing>,
) -> Option<NodeId> {
    if partitions <= 1 {
        return None;
    }
    let top = known
        .values()
        .filter(|s| !s.never_lead)
        .map(|s| s.priority)
        .max()
        .unwrap_or(0);
    let eligible: Vec<NodeId> = voters
        .iter()
        .copied()
        .filter(|id| {
            known
                .get(id)
                .is_none_or(|s| !s.never_lead && s.priority == top)
        })
        .collect();
    if eligible.is_empty() {
        return None;
    }
    eligible.get(group.0 as usize % eligible.len()).copied()
}

/// Keeps `known` (every voter's standing, [`Placing::known`]) current
/// whether or not this node leads anything: every `every`, group 0's
/// voters are asked. So a node that has just begun to lead a partition
/// knows a voter that went down before it led, and gives no partition a
/// home that would not be its home with that voter up (which would move
/// a healthy partition's leadership). Run with more than one partition.
pub async fn learn_standings(
    raft: Arc<Raft>,
    dialer: PeerDialer,
    me: NodeId,
    known: Arc<std::sync::Mutex<BTreeMap<NodeId, Standing>>>,
    every: std::time::Duration,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let patience = (every / 2).min(std::time::Duration::from_secs(1));
    loop {
        tick.tick().await;
        let metrics = raft.metrics().borrow_watched().clone();
        let membership = metrics.membership_config.membership();
        let voters: Vec<(NodeId, String)> = membership
            .voter_ids()
            .filter(|id| *id != me)
            .filter_map(|id| membership.get_node(&id).map(|node| (id, node.addr.clone())))
            .collect();
        let answers = dialer.standings(&voters, patience).await;
        let mut known = lock(&known);
        for ((id, _), answer) in voters.iter().zip(answers) {
            if let Ok(standing) = answer {
                known.insert(*id, standing);
            }
        }
    }
}

/// What a group's placement duty works with.
#[derive(Debug, Clone)]
pub struct Placing {
    /// The group, and how many the cluster runs.
    pub group: (GroupId, u32),
    /// This node, and its own standing.
    pub me: (NodeId, Standing),
    /// The checks' settings.
    pub placement: Placement,
    /// Every standing a voter answered any of this node's groups, kept
    /// while it is down (`home`): shared by the node's groups, so a group
    /// this node has just begun to lead knows a voter that went down
    /// before it asked.
    pub known: Arc<std::sync::Mutex<BTreeMap<NodeId, Standing>>>,
}

/// The placement duty of one group, run on every node: while it leads the
/// group, one check every `placement.every`, and a transfer when
/// [`Tracker::check`] picks a node.
pub async fn place_leadership(
    raft: Arc<Raft>,
    handoff: Arc<Handoff>,
    dialer: PeerDialer,
    placing: Placing,
    transfers: Counter,
) {
    let Placing {
        group,
        me: (me, mine),
        placement,
        known,
    } = placing;
    let mut tick = tokio::time::interval(placement.every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tracker = Tracker::default();
    lock(&known).insert(me, mine);
    // An answer later than this misses the check (at most a second, so a
    // slow peer never stalls checks spaced further apart).
    let patience = (placement.every / 2).min(std::time::Duration::from_secs(1));
    loop {
        tick.tick().await;
        let metrics = raft.metrics().borrow_watched().clone();
        if !crate::raft::leads(&metrics) {
            tracker.reset();
            continue;
        }
        let membership = metrics.membership_config.membership();
        let all: Vec<NodeId> = membership.voter_ids().collect();
        let voters: Vec<(NodeId, String)> = all
            .iter()
            .filter(|id| **id != me)
            .filter_map(|id| membership.get_node(id).map(|node| (*id, node.addr.clone())))
            .collect();
        let answers = dialer.standings(&voters, patience).await;
        // The log positions as they are now, after the answers: the closer
        // to the transfer, the likelier the target still holds the whole log.
        let metrics = raft.metrics().borrow_watched().clone();
        if !crate::raft::leads(&metrics) {
            tracker.reset();
            continue;
        }
        let replication = metrics.replication.unwrap_or_default();
        let seen: Vec<Seen> = voters
            .iter()
            .zip(answers)
            .map(|((id, _), standing)| Seen {
                id: *id,
                standing: standing.ok(),
                matched: replication
                    .get(id)
                    .and_then(|matched| matched.as_ref().map(|log_id| log_id.index)),
            })
            .collect();
        let home = {
            let mut known = lock(&known);
            known.retain(|id, _| all.contains(id));
            known.extend(seen.iter().filter_map(|v| v.standing.map(|s| (v.id, s))));
            home(group, &all, &known).filter(|home| *home != me)
        };
        let Some(to) = tracker.check(
            placement.priority,
            &seen,
            metrics.last_log_index,
            (placement.checks, home),
        ) else {
            continue;
        };
        tracing::info!(
            to,
            group = %group.0,
            priority = placement.priority,
            checks = placement.checks,
            "handing Raft leadership to a caught-up member of higher priority, or the partition's home"
        );
        transfers.inc();
        hand_over(&raft, &handoff, metrics.current_term, to).await;
    }
}

/// Hands leadership of `raft` (leading `term`) to `to`.
async fn hand_over(raft: &Raft, handoff: &Handoff, term: u64, to: NodeId) {
    // Renewals stop here first: the target's vote is granted inside the
    // lease they are answered on.
    handoff.begin(term, to);
    if let Err(err) = raft.trigger().transfer_leader(to).await {
        tracing::warn!(%err, to, "leadership transfer failed");
    }
    // openraft runs the transfer on whatever leadership the node has when
    // its core takes the command: leading a newer term by then, renewals
    // stop for that one too.
    let now = raft.metrics().borrow_watched().clone();
    if crate::raft::leads(&now) && now.current_term != term {
        handoff.begin(now.current_term, to);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(id: NodeId, priority: u32, matched: u64) -> Seen {
        Seen {
            id,
            standing: Some(Standing {
                priority,
                never_lead: false,
                partitions: 1,
            }),
            matched: Some(matched),
        }
    }

    #[test]
    fn a_higher_priority_caught_up_member_wins_after_k_checks() {
        let mut tracker = Tracker::default();
        assert_eq!(
            tracker.check(1, &[seen(2, 5, 10)], Some(10), (3, None)),
            None
        );
        assert_eq!(
            tracker.check(1, &[seen(2, 5, 12)], Some(12), (3, None)),
            None
        );
        assert_eq!(
            tracker.check(1, &[seen(2, 5, 15)], Some(15), (3, None)),
            Some(2)
        );
        // After a pick the streaks start over: no second transfer before
        // another K checks.
        for _ in 0..2 {
            assert_eq!(
                tracker.check(1, &[seen(2, 5, 15)], Some(15), (3, None)),
                None
            );
        }
        assert_eq!(
            tracker.check(1, &[seen(2, 5, 15)], Some(15), (3, None)),
            Some(2)
        );
    }

    #[test]
    fn equal_or_lower_priority_never_takes_over() {
        let mut tracker = Tracker::default();
        for _ in 0..10 {
            let pick = tracker.check(5, &[seen(2, 5, 9), seen(3, 1, 9)], Some(9), (1, None));
            assert_eq!(pick, None);
        }
    }

    #[test]
    fn lagging_silent_or_never_lead_members_break_their_streak() {
        let mut tracker = Tracker::default();
        let silent = Seen {
            standing: None,
            ..seen(2, 9, 100)
        };
        let never = Seen {
            standing: Some(Standing {
                priority: 9,
                never_lead: true,
                partitions: 1,
            }),
            ..seen(3, 9, 100)
        };
        assert_eq!(
            tracker.check(0, &[seen(2, 9, 100)], Some(100), (2, None)),
            None
        );
        // One miss (one entry behind the leader's log now) resets the
        // streak: a transfer to it would be ignored.
        assert_eq!(
            tracker.check(0, &[seen(2, 9, 100)], Some(101), (2, None)),
            None
        );
        assert_eq!(
            tracker.check(0, &[seen(2, 9, 101)], Some(101), (2, None)),
            None
        );
        assert_eq!(tracker.check(0, &[silent], Some(101), (2, None)), None);
        assert_eq!(
            tracker.check(0, &[seen(2, 9, 101)], Some(101), (2, None)),
            None
        );
        assert_eq!(
            tracker.check(0, &[seen(2, 9, 101)], Some(101), (2, None)),
            Some(2)
        );
        for _ in 0..5 {
            assert_eq!(tracker.check(0, &[never], Some(100), (1, None)), None);
        }
    }

    #[test]
    fn the_highest_priority_of_the_ready_wins_then_the_lowest_id() {
        let mut tracker = Tracker::default();
        let all = [seen(2, 5, 7), seen(3, 8, 7), seen(4, 8, 7)];
        assert_eq!(tracker.check(0, &all, Some(7), (1, None)), Some(3));
    }

    /// A higher priority on its way (just back, its streak not full) is
    /// waited for rather than moving leadership twice.
    #[test]
    fn a_rising_higher_priority_is_waited_for() {
        let mut tracker = Tracker::default();
        let mid_only = [
            seen(2, 5, 7),
            Seen {
                standing: None,
                ..seen(3, 9, 7)
            },
        ];
        let both = [seen(2, 5, 7), seen(3, 9, 7)];
        assert_eq!(tracker.check(0, &mid_only, Some(7), (2, None)), None);
        // Node 2's streak is full, but node 3 is good now: wait.
        assert_eq!(tracker.check(0, &both, Some(7), (2, None)), None);
        assert_eq!(tracker.check(0, &both, Some(7), (2, None)), Some(3));
    }

    /// With partitions, each goes home: the voters at the top priority
    /// that may lead, by id, in turn; a voter not yet heard from counts as
    /// one of them (a node going down moves no home); one partition has no
    /// home (a sticky leader).
    #[test]
    fn partitions_spread_over_the_voters_at_the_top_priority() {
        let standing = |priority, never_lead| Standing {
            priority,
            never_lead,
            partitions: 6,
        };
        let known = BTreeMap::from([(1, standing(0, false)), (2, standing(0, false))]);
        let homes: Vec<_> = (0..6)
            .map(|g| home((GroupId(g), 6), &[1, 2, 3], &known))
            .collect();
        assert_eq!(homes, [1, 2, 3, 1, 2, 3].map(Some));
        assert_eq!(home((GroupId(0), 1), &[1, 2, 3], &known), None);
        let never = BTreeMap::from([(1, standing(0, false)), (2, standing(0, true))]);
        let homes: Vec<_> = (0..4)
            .map(|g| home((GroupId(g), 4), &[1, 2, 3], &never))
            .collect();
        assert_eq!(homes, [1, 3, 1, 3].map(Some));
        let high = BTreeMap::from([
            (1, standing(0, false)),
            (2, standing(0, false)),
            (3, standing(5, false)),
        ]);
        assert_eq!(home((GroupId(0), 2), &[1, 2, 3], &high), Some(3));
        // A home at the leader's priority is good; so is the tie it wins.
        let mut tracker = Tracker::default();
        let peers = [seen(2, 0, 7), seen(3, 0, 7)];
        assert_eq!(tracker.check(0, &peers, Some(7), (1, Some(3))), Some(3));
        assert_eq!(tracker.check(0, &peers, Some(7), (1, None)), None);
    }

    #[test]
    fn a_new_term_starts_from_nothing() {
        let mut tracker = Tracker::default();
        tracker.check(0, &[seen(2, 9, 5)], Some(5), (2, None));
        tracker.reset();
        assert_eq!(tracker.check(0, &[seen(2, 9, 5)], Some(5), (2, None)), None);
        assert_eq!(
            tracker.check(0, &[seen(2, 9, 5)], Some(5), (2, None)),
            Some(2)
        );
    }
}
