//! Routing by partition: which endpoint a call on one lease asks first,
//! and what its answer (or failure) teaches the [`PartitionMap`]
//! (`partitions.rs`). With one partition, or before the map is known, a
//! call has no [`Target`] and these fall back to the preferred endpoint.

use std::sync::atomic::Ordering;

use super::partitions::{PartitionMap, Partitions};
use super::{Target, Transport, ASK_ID_TIMEOUT, FORWARDED_BY_FOLLOWER};

impl Transport {
    /// The target of a call on `lease`: its partition, when the cluster
    /// has several (as far as known); asks the nodes for the partition map
    /// when it is stale.
    pub(crate) fn target(&self, lease: &str, leader_only: bool) -> Option<Target> {
        self.refresh_map();
        let partition = self.nodes.map.partition(lease)?;
        Some(Target {
            partition,
            leader_only,
        })
    }

    /// What the client knows of the partitions, for
    /// [`crate::Client::partitions`].
    pub(crate) fn partitions(&self) -> Partitions {
        Partitions {
            count: self.nodes.map.count(),
            leaders: self.nodes.map.leaders(),
            forwarded: self.forwarded.load(Ordering::Relaxed),
        }
    }

    /// The partition map (its count, each partition's leader).
    pub(crate) fn map(&self) -> &PartitionMap {
        &self.nodes.map
    }

    /// Asks the nodes for their ids and the partition map, in the
    /// background, if the map is stale (at most once a second).
    pub(crate) fn refresh_map(&self) {
        if self.nodes.map.is_stale() {
            self.learn_nodes();
        }
    }

    pub(super) fn learn_nodes(&self) {
        let timeout = self.config.request_timeout.min(ASK_ID_TIMEOUT);
        self.nodes
            .learn(&self.http, &self.config.endpoints, timeout);
    }

    /// The endpoint of `partition`'s leader, if known.
    pub(crate) fn leader_endpoint(&self, partition: usize) -> Option<usize> {
        let leader = self.nodes.map.leader(partition)?;
        self.nodes.endpoint_of(leader)
    }

    /// The endpoint to ask first for a call to `target`: its partition's
    /// leader when known, else the preferred endpoint.
    pub(crate) fn first_for(&self, target: Option<Target>) -> usize {
        target
            .and_then(|t| self.leader_endpoint(t.partition))
            .unwrap_or_else(|| self.preferred())
    }

    /// Notes that a call to `target` failed on endpoint `index` (refused,
    /// unreachable, silent): the preferred endpoint moves on, and the
    /// partition forgets its leader if that was it.
    pub(crate) fn failed(&self, target: Option<Target>, index: usize) {
        self.pass_over(index);
        if let Some(target) = target {
            if self.leader_endpoint(target.partition) == Some(index) {
                self.nodes.map.forget(target.partition);
                self.learn_nodes();
            }
        }
    }

    /// Notes that a renewal of `lease` found no leader of its partition
    /// where it was sent: the partition forgets its leader, and the map is
    /// asked for again.
    pub(crate) fn partition_unavailable(&self, lease: &str) {
        if let Some(partition) = self.nodes.map.partition(lease) {
            self.nodes.map.forget(partition);
            self.learn_nodes();
        }
    }

    /// Notes that the node at endpoint `index` failed (its renewal stream
    /// broke): every partition it led forgets it, and the map is asked for
    /// again.
    pub(crate) fn node_failed(&self, index: usize) {
        self.pass_over(index);
        if let Some(id) = self.nodes.id_of(index) {
            self.nodes.map.forget_node(id);
        }
        self.learn_nodes();
    }

    /// Notes an answer to a call to `target` from endpoint `index`
    /// (`headers` are its answer's): without a target (one partition, or
    /// a call of the whole cluster) as [`Transport::note_leader_answer`];
    /// with one, the leader that answered leads that partition (the node
    /// named by a forwarding follower, or the endpoint itself for a call
    /// only the leader serves), and nothing else moves.
    pub(crate) fn note_answer(
        &self,
        target: Option<Target>,
        index: usize,
        headers: &reqwest::header::HeaderMap,
    ) {
        if headers.contains_key(FORWARDED_BY_FOLLOWER) {
            self.forwarded.fetch_add(1, Ordering::Relaxed);
        }
        let Some(target) = target else {
            return self.note_leader_answer(index, headers);
        };
        let named = headers
            .get(FORWARDED_BY_FOLLOWER)
            .and_then(|hint| hint.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let leader = match named {
            Some(id) => Some(id),
            None if target.leader_only => self.nodes.id_of(index),
            None => None,
        };
        match leader {
            Some(id) => {
                self.nodes.map.answered_by(target.partition, id);
                if self.nodes.endpoint_of(id).is_none() {
                    self.learn_nodes();
                }
            }
            None => self.learn_nodes(),
        }
    }
}
