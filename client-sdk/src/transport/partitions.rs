//! [`PartitionMap`]: which partition (Raft group) each lease belongs to and
//! which node leads each partition, as far as this client knows. A cluster
//! started with `--partitions N` runs N groups, each with its own leader;
//! a lease's partition is the 64-bit FNV-1a hash of its name modulo N
//! ([`partition_of`], the server's `GroupId::of`). `GET /v1/cluster` on any
//! node lists every partition's leader and term; the answer with the
//! higher term for a partition is the fresher one. An answer to a lease
//! call that a node forwarded names the partition leader that answered
//! (`x-palisade-leader`), which moves that partition alone.
//!
//! With one partition, or before any node has answered, the map knows
//! nothing and the client routes as it always did (its preferred
//! endpoint).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use palisade_plumbing::sync::lock;
use serde_json::Value;

/// A map older than this is asked for again at the next routed call (a
/// renewal stream forwards what its node no longer leads without saying
/// so: only a fresh map moves those leases).
pub(crate) const REFRESH_EVERY: Duration = Duration::from_secs(3);

/// The partition `lease` belongs to in a cluster of `count` partitions:
/// 64-bit FNV-1a of its UTF-8 bytes, modulo `count`.
pub(crate) fn partition_of(lease: &str, count: usize) -> usize {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let hash = lease
        .bytes()
        .fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME));
    usize::try_from(hash % count.max(1) as u64).unwrap_or(0)
}

/// What a client knows of the cluster's partitions
/// ([`crate::Client::partitions`]): a diagnostic, to see where its calls go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partitions {
    /// How many partitions the cluster has (1 until a node said more).
    pub count: usize,
    /// Each partition's leader (a node id), as far as known; empty with
    /// one partition.
    pub leaders: Vec<Option<u64>>,
    /// Answers to this client's calls that a node forwarded to the leader
    /// (they named it in `x-palisade-leader`) since the client was made:
    /// each one a hop a direct call would not have taken. Frames of a
    /// renewal stream are not counted (a stream's node forwards without
    /// saying so).
    pub forwarded: u64,
}

/// What the client knows of the cluster's partitions.
#[derive(Debug, Default)]
pub(crate) struct PartitionMap {
    state: Mutex<MapState>,
}

#[derive(Debug, Default)]
struct MapState {
    /// Each partition's leader (a node id) and the term it was seen in;
    /// empty until a node told the count.
    leaders: Vec<(Option<u64>, u64)>,
    /// When a node last told the whole map.
    learned: Option<Instant>,
}

impl PartitionMap {
    /// How many partitions the cluster has, once known (1 until then).
    pub(crate) fn count(&self) -> usize {
        lock(&self.state).leaders.len().max(1)
    }

    /// The partition of `lease`, when the cluster has more than one.
    pub(crate) fn partition(&self, lease: &str) -> Option<usize> {
        let count = self.count();
        (count > 1).then(|| partition_of(lease, count))
    }

    /// Partition `partition`'s leader, if known.
    pub(crate) fn leader(&self, partition: usize) -> Option<u64> {
        lock(&self.state)
            .leaders
            .get(partition)
            .and_then(|(leader, _)| *leader)
    }

    /// Every partition's leader, as known (empty with one partition).
    pub(crate) fn leaders(&self) -> Vec<Option<u64>> {
        let state = lock(&self.state);
        if state.leaders.len() < 2 {
            return Vec::new();
        }
        state.leaders.iter().map(|(leader, _)| *leader).collect()
    }

    /// Whether the map should be asked for again: never told, or (with
    /// several partitions) told longer than [`REFRESH_EVERY`] ago.
    pub(crate) fn is_stale(&self) -> bool {
        let state = lock(&self.state);
        match state.learned {
            None => true,
            Some(at) => state.leaders.len() > 1 && at.elapsed() >= REFRESH_EVERY,
        }
    }

    /// Takes what a `GET /v1/cluster` answer says: the partition count and,
    /// for each partition, its leader if the answer's term is not older
    /// than what is known. An answer without `partitions` (an older
    /// server) is one partition.
    pub(crate) fn learn(&self, cluster: &Value) {
        let Some(partitions) = cluster["partitions"].as_array() else {
            let mut state = lock(&self.state);
            state.leaders.clear();
            state.learned = Some(Instant::now());
            return;
        };
        let mut state = lock(&self.state);
        if state.leaders.len() != partitions.len() {
            state.leaders = vec![(None, 0); partitions.len()];
        }
        for (k, partition) in partitions.iter().enumerate() {
            let id = partition["id"]
                .as_u64()
                .and_then(|id| usize::try_from(id).ok())
                .unwrap_or(k);
            let term = partition["term"].as_u64().unwrap_or(0);
            let leader = partition["leader"].as_u64();
            if let Some(known) = state.leaders.get_mut(id) {
                if term > known.1 || (term == known.1 && leader.is_some()) {
                    *known = (leader, term);
                }
            }
        }
        state.learned = Some(Instant::now());
    }

    /// Notes that node `leader` answered a call of `partition` as its
    /// leader (its own answer, or one a follower forwarded to it).
    pub(crate) fn answered_by(&self, partition: usize, leader: u64) {
        if let Some(known) = lock(&self.state).leaders.get_mut(partition) {
            known.0 = Some(leader);
        }
    }

    /// Forgets `partition`'s leader (it failed, or stopped leading) and
    /// marks the map stale.
    pub(crate) fn forget(&self, partition: usize) {
        let mut state = lock(&self.state);
        if let Some(known) = state.leaders.get_mut(partition) {
            known.0 = None;
        }
        state.learned = None;
    }

    /// Forgets every partition node `node` leads (it failed) and marks
    /// the map stale.
    pub(crate) fn forget_node(&self, node: u64) {
        let mut state = lock(&self.state);
        for known in &mut state.leaders {
            if known.0 == Some(node) {
                known.0 = None;
            }
        }
        state.learned = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_hash_is_fnv1a_64_as_the_server_computes_it() {
        // FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c; of "" the offset basis.
        assert_eq!(partition_of("a", 64) as u64, 0xaf63_dc4c_8601_ec8c_u64 % 64);
        assert_eq!(partition_of("", 7) as u64, 0xcbf2_9ce4_8422_2325_u64 % 7);
        assert_eq!(partition_of("anything", 1), 0);
    }

    #[test]
    fn the_fresher_term_wins_per_partition() {
        let map = PartitionMap::default();
        assert_eq!((map.count(), map.partition("x")), (1, None));
        map.learn(&json!({"node_id": 1, "partitions": [
            {"id": 0, "leader": 1, "term": 4},
            {"id": 1, "leader": 2, "term": 2},
        ]}));
        assert_eq!(map.count(), 2);
        // A lagging node: partition 0 at an older term, 1 newer.
        map.learn(&json!({"node_id": 3, "partitions": [
            {"id": 0, "leader": 3, "term": 3},
            {"id": 1, "leader": 3, "term": 5},
        ]}));
        assert_eq!(map.leaders(), vec![Some(1), Some(3)]);
        map.forget_node(3);
        assert_eq!(map.leaders(), vec![Some(1), None]);
        assert!(map.is_stale());
        map.answered_by(1, 2);
        assert_eq!(map.leader(1), Some(2));
        map.learn(&json!({"node_id": 1}));
        assert_eq!((map.count(), map.leaders()), (1, vec![]));
    }
}
