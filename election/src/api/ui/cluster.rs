//! The cluster as the status page shows it, whichever node serves it:
//! every member's [`Figures`] — this node's own, the others' asked over
//! the peer listener at once, each within [`ASK_WITHIN`] — so the members
//! table says which answer and how far behind each is, and the plots show
//! the whole cluster's samples put together ([`combined`]), not what one
//! follower served (a follower answers no renewals).

use std::collections::BTreeMap;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;

use crate::api::state::ApiState;
use crate::peer::figures::Figures;
use crate::raft::NodeId;
use crate::series::{Sample, EVERY};

/// How long the page waits for a member's figures.
pub(super) const ASK_WITHIN: Duration = Duration::from_millis(500);

/// One member as the page shows it.
#[derive(Debug)]
pub(super) struct Member {
    pub id: NodeId,
    /// Its peer address.
    pub addr: String,
    pub voter: bool,
    /// What it said of itself, or why it said nothing.
    pub answer: Result<Figures, String>,
}

/// Every member, in id order: this node's figures and the others'.
pub(super) async fn gather(state: &ApiState) -> Vec<Member> {
    let metrics = state.group_zero().raft.metrics().borrow_watched().clone();
    let membership = metrics.membership_config.membership().clone();
    let voters: Vec<NodeId> = membership.voter_ids().collect();
    let me = state.config.id;
    let others: Vec<(NodeId, String)> = membership
        .nodes()
        .filter(|(id, _)| **id != me)
        .map(|(id, node)| (*id, node.addr.clone()))
        .collect();
    let answers = state.dialer.figures(&others, ASK_WITHIN).await;
    let mut members: Vec<Member> = others
        .into_iter()
        .zip(answers)
        .map(|((id, addr), answer)| Member {
            id,
            addr,
            voter: voters.contains(&id),
            answer,
        })
        .collect();
    let addr = membership
        .nodes()
        .find(|(id, _)| **id == me)
        .map_or_else(String::new, |(_, node)| node.addr.clone());
    members.push(Member {
        id: me,
        addr,
        voter: voters.contains(&me),
        answer: Ok(Figures::of(&state.group_zero().raft, &state.series)),
    });
    members.sort_by_key(|m| m.id);
    members
}

/// The highest commit index any member reported: what "behind" counts
/// from.
pub(super) fn committed(members: &[Member]) -> u64 {
    members
        .iter()
        .filter_map(|m| m.answer.as_ref().ok())
        .map(|f| f.commit_index)
        .max()
        .unwrap_or(0)
}

/// The cluster's samples, oldest first: one per interval of [`EVERY`] on
/// the wall clock, from each member's last sample in it. Renewals and
/// waiters are summed (each node counts the renewals it answered and the
/// calls waiting on it); grants, leases held, refused writes and the p99
/// are the highest any member saw (every node applies every grant and
/// holds the same table; they all read the same gateway); the leader is
/// the one most members named, and it changed if any member saw it change.
pub(super) fn combined(members: &[Member]) -> Vec<Sample> {
    let every = EVERY.as_millis() as u64;
    let mut buckets: BTreeMap<u64, BTreeMap<NodeId, Sample>> = BTreeMap::new();
    for figures in members.iter().filter_map(|m| m.answer.as_ref().ok()) {
        for sample in &figures.samples {
            buckets
                .entry(sample.at_ms / every)
                .or_default()
                .insert(figures.node, *sample);
        }
    }
    buckets
        .into_values()
        .map(|by_node| merge(&by_node))
        .collect()
}

fn merge(by_node: &BTreeMap<NodeId, Sample>) -> Sample {
    let samples: Vec<&Sample> = by_node.values().collect();
    let highest = |f: fn(&Sample) -> Option<f64>| {
        samples
            .iter()
            .filter_map(|s| f(s))
            .fold(None, |top: Option<f64>, v| {
                Some(top.map_or(v, |t| t.max(v)))
            })
    };
    let mut named: BTreeMap<Option<NodeId>, usize> = BTreeMap::new();
    for sample in &samples {
        *named.entry(sample.leader).or_default() += 1;
    }
    Sample {
        at_ms: samples.iter().map(|s| s.at_ms).max().unwrap_or(0),
        renewals: samples.iter().map(|s| s.renewals).sum(),
        grants: highest(|s| Some(s.grants)).unwrap_or(0.0),
        refused: highest(|s| s.refused),
        held: samples.iter().map(|s| s.held).max().unwrap_or(0),
        waiters: samples.iter().map(|s| s.waiters).sum(),
        renew_p99_ms: highest(|s| s.renew_p99_ms),
        leader: named
            .into_iter()
            .max_by_key(|(_, n)| *n)
            .and_then(|(leader, _)| leader),
        leader_changed: samples.iter().any(|s| s.leader_changed),
    }
}

/// With more than one partition: each partition's leader, term, commit
/// and applied index as this node sees them (`id="partitions"`, a row per
/// partition, `data-partition`), and how many each node leads.
pub(super) fn partitions_section(html: &mut String, state: &ApiState) {
    use std::fmt::Write as _;
    if state.partitions() <= 1 {
        return;
    }
    let mut led: BTreeMap<NodeId, usize> = BTreeMap::new();
    let mut rows = String::new();
    for group in state.groups() {
        let metrics = group.raft.metrics().borrow_watched().clone();
        if let Some(leader) = metrics.current_leader {
            *led.entry(leader).or_default() += 1;
        }
        let _ = write!(
            rows,
            "<tr data-partition=\"{}\"><td>{}</td><td class=\"leader\">{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td class=\"lag\">{}</td></tr>",
            group.id,
            group.id,
            metrics
                .current_leader
                .map_or_else(|| "none".to_owned(), |id| format!("node {id}")),
            metrics.current_term,
            metrics.cluster_committed.as_ref().map_or(0, |id| id.index),
            metrics.last_applied.as_ref().map_or(0, |id| id.index),
            lag(&metrics),
        );
    }
    let spread: Vec<String> = led
        .iter()
        .map(|(node, count)| format!("node {node} leads {count}"))
        .collect();
    let _ = write!(
        *html,
        "<h2>Partitions</h2><p>{} partitions; {}</p><table id=\"partitions\"><tr><th>partition</th>\
         <th>leader</th><th>term</th><th>commit</th><th>applied</th>\
         <th title=\"leading: entries the slowest follower lacks; following: entries \
         committed and not yet applied here\">lag</th></tr>{rows}</table>",
        state.partitions(),
        spread.join(", "),
    );
}

/// A partition's lag as this node sees it: leading, the entries of its log
/// the slowest follower has not acknowledged; following, the entries
/// committed that it has not applied yet.
fn lag(metrics: &openraft::RaftMetrics<crate::raft::TypeConfig>) -> u64 {
    let last = metrics.last_log_index.unwrap_or(0);
    match &metrics.replication {
        Some(followers) => followers
            .iter()
            .filter(|(id, _)| **id != metrics.id)
            .map(|(_, matched)| last.saturating_sub(matched.as_ref().map_or(0, |m| m.index)))
            .max()
            .unwrap_or(0),
        None => {
            let committed = metrics.cluster_committed.as_ref().map_or(0, |id| id.index);
            committed.saturating_sub(metrics.last_applied.as_ref().map_or(0, |id| id.index))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{combined, Member};
    use crate::peer::figures::Figures;
    use crate::series::Sample;

    fn member(node: u64, samples: Vec<Sample>) -> Member {
        Member {
            id: node,
            addr: String::new(),
            voter: true,
            answer: Ok(Figures {
                node,
                role: "Follower".into(),
                term: 1,
                leader: Some(1),
                applied_index: 0,
                commit_index: 0,
                at_ms: 0,
                samples,
            }),
        }
    }

    fn sample(at_ms: u64, renewals: f64, grants: f64, waiters: u64) -> Sample {
        Sample {
            at_ms,
            renewals,
            grants,
            waiters,
            held: 3,
            leader: Some(1),
            ..Sample::default()
        }
    }

    /// A follower answers no renewals: the cluster's are the sum, its
    /// grants the highest (each node applies each one), and a member that
    /// did not answer adds nothing.
    #[test]
    fn the_cluster_sums_what_nodes_served_and_keeps_the_highest_of_what_they_share() {
        let leader = member(
            1,
            vec![sample(10_001, 100.0, 4.0, 2), sample(15_002, 50.0, 1.0, 0)],
        );
        let follower = member(
            2,
            vec![sample(12_500, 0.0, 4.0, 5), sample(17_400, 0.0, 1.0, 1)],
        );
        let mut down = member(3, vec![]);
        down.answer = Err("refused or unreachable".into());
        let cluster = combined(&[leader, follower, down]);
        let seen: Vec<(f64, f64, u64)> = cluster
            .iter()
            .map(|s| (s.renewals, s.grants, s.waiters))
            .collect();
        assert_eq!(seen, [(100.0, 4.0, 7), (50.0, 1.0, 1)]);
        assert_eq!(cluster[0].at_ms, 12_500, "the interval's last sample");
        assert_eq!(cluster[0].held, 3);
    }
}
