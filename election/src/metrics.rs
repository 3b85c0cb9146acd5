//! Prometheus metrics of an election node (`GET /metrics`, text format).
//!
//! Counters move where the event happens: lease grants, releases, expiries,
//! revocations and reclaims in apply (so every node counts what it applied,
//! as etcd does), renewals in the renew handler, leader changes in the
//! leader's duty loop, proposal failures in the proposer, log fsyncs in the
//! flusher thread. Gauges (leader, term, indexes, leases held, waiters) are
//! read from Raft's metrics and the table when scraped. No per-lease labels.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use crate::lease_table::command::{Command, CommandResult};

/// Latency buckets in seconds: 50 µs .. ~1.6 s.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
}

/// The node's metrics. Cheap to share (`Arc`); every metric is itself a
/// handle.
#[derive(Debug)]
pub struct ElectionMetrics {
    registry: Registry,
    /// New grants applied.
    pub grants: Counter,
    /// Requests refused over their flow's share, by principal (`anonymous`
    /// without a key) and pool.
    pub admission_refusals: Family<Vec<(String, String)>, Counter>,
    /// Renewals answered (leader only).
    pub renewals: Counter,
    /// Batch renewal requests answered (leader only).
    pub renew_batches: Counter,
    /// Renewal streams opened (`POST /v1/renew/stream`, leader only).
    pub renew_streams: Counter,
    /// Renewals answered with a newly signed JWT (the rest reused one).
    pub jwt_signatures: Counter,
    /// Releases applied.
    pub releases: Counter,
    /// Expiries applied.
    pub expiries: Counter,
    /// Revocations applied.
    pub revocations: Counter,
    /// Free lease records reclaimed.
    pub reclaimed: Counter,
    /// Times this node saw the leader change (to another node or to none).
    pub leader_changes: Counter,
    /// Leadership transfers this node started as leader (placement).
    pub leader_transfers: Counter,
    /// Proposals that did not apply (no quorum, refused, fatal).
    pub proposal_failures: Counter,
    /// Requests this node sent its peers (each heartbeat batch is one).
    pub peer_requests: Counter,
    /// Heartbeats carried in batches (with partitions).
    pub heartbeats_carried: Counter,
    /// Renewal latency on the leader, in seconds.
    pub renew_seconds: Histogram,
    /// The same latencies since the status page's last sample.
    pub renew_window: LatencyWindow,
    /// Raft log fsync time, in seconds.
    pub log_fsync_seconds: Histogram,
    has_leader: Gauge,
    is_leader: Gauge,
    term: Gauge,
    commit_index: Gauge,
    applied_index: Gauge,
    leases_held: Gauge,
    leases_in_table: Gauge,
    waiters: Gauge,
    policy_generation: Gauge,
    /// Per partition (label `partition`, at most `MAX_PARTITIONS` values):
    /// this node acts as its leader (1/0), its term, commit and applied
    /// index, and its leases held.
    partition_gauges: [Family<Vec<(String, String)>, Gauge>; 5],
}

/// One partition as a scrape reads it ([`Snapshot::partitions`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct PartitionSnapshot {
    /// The partition.
    pub id: u32,
    /// This node acts as its leader.
    pub leading: bool,
    /// Its term.
    pub term: u64,
    /// Its committed index as this node knows it.
    pub commit_index: u64,
    /// Its last applied index.
    pub applied_index: u64,
    /// Its leases with a holder.
    pub leases_held: u64,
}

/// The per-partition gauges' names and help, in `partition_gauges` order.
const PARTITION_GAUGES: [(&str, &str); 5] = [
    (
        "palisade_partition_leading",
        "1 while this node acts as the partition's leader",
    ),
    ("palisade_partition_term", "The partition's Raft term"),
    (
        "palisade_partition_commit_index",
        "The partition's committed log index as this node knows it",
    ),
    (
        "palisade_partition_applied_index",
        "The partition's last applied log index",
    ),
    (
        "palisade_partition_leases_held",
        "The partition's leases with a holder",
    ),
];

/// What a scrape reads from the node at that moment.
#[derive(Debug, Default, Clone, Copy)]
pub struct Snapshot {
    /// A leader is known.
    pub has_leader: bool,
    /// This node is it.
    pub is_leader: bool,
    /// The current term.
    pub term: u64,
    /// The committed index as this node knows it.
    pub commit_index: u64,
    /// The last applied index.
    pub applied_index: u64,
    /// Leases with a holder.
    pub leases_held: u64,
    /// Records in the table (held and free, not yet reclaimed).
    pub leases_in_table: u64,
    /// Blocking calls waiting on this node.
    pub waiters: u64,
    /// Policies put in force since the start (1 + reloads that loaded; 0
    /// without a policy).
    pub policy_generation: u64,
}

impl Default for ElectionMetrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let this = Self {
            grants: Counter::default(),
            admission_refusals: Family::default(),
            renewals: Counter::default(),
            renew_batches: Counter::default(),
            renew_streams: Counter::default(),
            jwt_signatures: Counter::default(),
            releases: Counter::default(),
            expiries: Counter::default(),
            revocations: Counter::default(),
            reclaimed: Counter::default(),
            leader_changes: Counter::default(),
            leader_transfers: Counter::default(),
            proposal_failures: Counter::default(),
            peer_requests: Counter::default(),
            heartbeats_carried: Counter::default(),
            renew_seconds: latency(),
            renew_window: LatencyWindow::default(),
            log_fsync_seconds: latency(),
            has_leader: Gauge::default(),
            is_leader: Gauge::default(),
            term: Gauge::default(),
            commit_index: Gauge::default(),
            applied_index: Gauge::default(),
            leases_held: Gauge::default(),
            leases_in_table: Gauge::default(),
            waiters: Gauge::default(),
            policy_generation: Gauge::default(),
            partition_gauges: Default::default(),
            registry: Registry::default(),
        };
        for ((name, help), family) in PARTITION_GAUGES.iter().zip(&this.partition_gauges) {
            registry.register(*name, *help, family.clone());
        }
        this.register_counters(&mut registry);
        registry.register(
            "palisade_election_admission_refusals",
            "Requests refused because their principal (or address) held its share of seats",
            this.admission_refusals.clone(),
        );
        this.register_gauges(&mut registry);
        registry.register_with_unit(
            "palisade_lease_renew_duration",
            "Renewal latency on the leader",
            Unit::Seconds,
            this.renew_seconds.clone(),
        );
        registry.register_with_unit(
            "palisade_election_log_fsync_duration",
            "Raft log fsync time",
            Unit::Seconds,
            this.log_fsync_seconds.clone(),
        );
        Self { registry, ..this }
    }
}

impl ElectionMetrics {
    /// Registers the counters, each under its name and help text.
    fn register_counters(&self, registry: &mut Registry) {
        let counters = [
            (
                "palisade_lease_grants",
                "New lease grants applied",
                &self.grants,
            ),
            (
                "palisade_lease_renewals",
                "Lease renewals answered by this node as leader",
                &self.renewals,
            ),
            (
                "palisade_lease_renew_batches",
                "Renewal batches (POST /v1/renew, and stream frames) answered by this node as leader",
                &self.renew_batches,
            ),
            (
                "palisade_lease_renew_streams",
                "Renewal streams (POST /v1/renew/stream) opened on this node as leader",
                &self.renew_streams,
            ),
            (
                "palisade_lease_jwt_signatures",
                "Lease JWTs signed (grants, and renewals whose JWT no longer covered the deadline)",
                &self.jwt_signatures,
            ),
            (
                "palisade_lease_releases",
                "Lease releases applied",
                &self.releases,
            ),
            (
                "palisade_lease_expiries",
                "Lease expiries applied",
                &self.expiries,
            ),
            (
                "palisade_lease_revocations",
                "Lease revocations applied",
                &self.revocations,
            ),
            (
                "palisade_lease_reclaimed",
                "Free lease records reclaimed",
                &self.reclaimed,
            ),
            (
                "palisade_election_leader_changes",
                "Leader changes seen by this node",
                &self.leader_changes,
            ),
            (
                "palisade_election_leader_transfers",
                "Leadership transfers this node started to place leadership by priority",
                &self.leader_transfers,
            ),
            (
                "palisade_peer_requests",
                "Requests this node sent its peers: Raft RPCs, heartbeat batches, forwarded calls",
                &self.peer_requests,
            ),
            (
                "palisade_peer_heartbeats_carried",
                "Heartbeats this node sent in batches, every partition's to a peer together",
                &self.heartbeats_carried,
            ),
            (
                "palisade_election_proposal_failures",
                "Proposals that did not apply",
                &self.proposal_failures,
            ),
        ];
        for (name, help, counter) in counters {
            registry.register(name, help, counter.clone());
        }
    }

    /// Registers the gauges (read from Raft and the table at scrape time).
    fn register_gauges(&self, registry: &mut Registry) {
        let gauges = [
            (
                "palisade_election_has_leader",
                "1 if this node knows a leader",
                &self.has_leader,
            ),
            (
                "palisade_election_is_leader",
                "1 if this node is the leader",
                &self.is_leader,
            ),
            (
                "palisade_election_term",
                "The current Raft term",
                &self.term,
            ),
            (
                "palisade_election_commit_index",
                "The committed log index as this node knows it",
                &self.commit_index,
            ),
            (
                "palisade_election_applied_index",
                "The last applied log index",
                &self.applied_index,
            ),
            (
                "palisade_leases_held",
                "Leases with a holder",
                &self.leases_held,
            ),
            (
                "palisade_leases_in_table",
                "Lease records in the table, held or free",
                &self.leases_in_table,
            ),
            (
                "palisade_election_waiters",
                "Blocking acquires and watches waiting on this node",
                &self.waiters,
            ),
            (
                "palisade_policy_generation",
                "Access policies put in force since the start: 1, plus one per SIGHUP reload \
                 that loaded (0 without a policy)",
                &self.policy_generation,
            ),
        ];
        for (name, help, gauge) in gauges {
            registry.register(name, help, gauge.clone());
        }
    }
}

impl ElectionMetrics {
    /// Counts `count` renewals answered in one request that took `took`.
    pub fn renewed(&self, count: u64, took: std::time::Duration) {
        self.renewals.inc_by(count);
        self.renew_seconds.observe(took.as_secs_f64());
        self.renew_window.observe(took);
    }

    /// Counts what applying `command` did (`reclaimed`: records a `Reclaim`
    /// removed).
    pub fn applied(&self, command: &Command, result: &CommandResult, reclaimed: usize) {
        match (command.unstamped().1, result) {
            (
                Command::Acquire { .. },
                CommandResult::Granted {
                    new_grant: true, ..
                },
            ) => self.grants.inc(),
            (Command::Release { .. }, CommandResult::Freed) => self.releases.inc(),
            (Command::Expire { .. }, CommandResult::Freed) => self.expiries.inc(),
            (Command::Revoke { .. }, CommandResult::Revoked) => self.revocations.inc(),
            (Command::Reclaim { .. }, _) => self.reclaimed.inc_by(reclaimed as u64),
            _ => 0,
        };
    }

    /// The text exposition, with the gauges set from `now` and the
    /// per-partition ones from `partitions`.
    pub fn render(&self, now: Snapshot, partitions: &[PartitionSnapshot]) -> String {
        let set = |gauge: &Gauge, value: u64| {
            gauge.set(i64::try_from(value).unwrap_or(i64::MAX));
        };
        set(&self.has_leader, u64::from(now.has_leader));
        set(&self.is_leader, u64::from(now.is_leader));
        set(&self.term, now.term);
        set(&self.commit_index, now.commit_index);
        set(&self.applied_index, now.applied_index);
        set(&self.leases_held, now.leases_held);
        set(&self.leases_in_table, now.leases_in_table);
        set(&self.waiters, now.waiters);
        set(&self.policy_generation, now.policy_generation);
        for partition in partitions {
            let label = vec![("partition".to_owned(), partition.id.to_string())];
            let values = [
                u64::from(partition.leading),
                partition.term,
                partition.commit_index,
                partition.applied_index,
                partition.leases_held,
            ];
            for (family, value) in self.partition_gauges.iter().zip(values) {
                set(&family.get_or_create(&label), value);
            }
        }
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }
}

/// Buckets of a [`LatencyWindow`]: the first holds up to 50 µs, each next
/// twice the one before (the last holds the rest, from ~3.5 min).
const WINDOW_BUCKETS: usize = 24;

/// Latencies since they were last taken, for a percentile per interval
/// (the Prometheus histogram only ever grows). Lock-free: a renewal pays
/// one atomic add.
#[derive(Debug, Default)]
pub struct LatencyWindow {
    buckets: [AtomicU64; WINDOW_BUCKETS],
}

impl LatencyWindow {
    /// Upper bound of bucket `i`, in seconds.
    fn bound(i: usize) -> f64 {
        0.000_05 * f64::from(1_u32 << i.min(31))
    }

    /// Records one latency.
    pub fn observe(&self, took: std::time::Duration) {
        let secs = took.as_secs_f64();
        let i = (0..WINDOW_BUCKETS - 1)
            .find(|&i| secs <= Self::bound(i))
            .unwrap_or(WINDOW_BUCKETS - 1);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
    }

    /// The 99th percentile of what was recorded since the last call (the
    /// upper bound of its bucket, in seconds), and starts over; `None` if
    /// nothing was.
    pub fn take_p99(&self) -> Option<f64> {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.swap(0, Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        let rank = (total * 99).div_ceil(100).max(1);
        let mut seen = 0;
        counts.iter().enumerate().find_map(|(i, count)| {
            seen += count;
            (total > 0 && seen >= rank).then(|| Self::bound(i))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_window_gives_the_p99_bucket_and_starts_over() {
        let window = LatencyWindow::default();
        assert_eq!(window.take_p99(), None);
        for _ in 0..99 {
            window.observe(Duration::from_micros(40));
        }
        window.observe(Duration::from_millis(30));
        // 99 of 100 at or under 50 µs: the p99 is that bucket's bound.
        assert_eq!(window.take_p99(), Some(0.000_05));
        assert_eq!(window.take_p99(), None, "taken: starts over");
        for _ in 0..200 {
            window.observe(Duration::from_millis(30));
        }
        window.observe(Duration::from_secs(3600));
        // 199 of 201 needed: 30 ms falls in the bucket up to 51.2 ms; an hour in the last.
        assert_eq!(window.take_p99(), Some(0.000_05 * 1024.0));
        window.observe(Duration::from_secs(3600));
        assert_eq!(window.take_p99(), Some(0.000_05 * f64::from(1_u32 << 23)));
    }
}
