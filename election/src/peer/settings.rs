//! [`PeerSettings`]: the settings safety depends on across nodes, announced
//! on every peer request and answer and compared (CONTRACT C1).
//!
//! Two kinds of setting:
//! - **Must agree**: the partition count. A lease's partition is a hash of
//!   its name modulo the count, so two nodes that disagree put one lease in
//!   two Raft groups and grant it twice. A peer that announces another count
//!   is refused by the gate (its requests get 403) and its answers are
//!   discarded (no vote, no ack counts), so a node that disagrees with the
//!   voters can reach no quorum: it serves no grant and no renewal.
//! - **May differ during a rolling change**: the minimum election timeout
//!   (the vote lease every voter keeps) and the lease margin. A leader
//!   answers renewals only inside the *shortest* vote lease any voter has
//!   announced, less the margin the most pessimistic drift any node assumed
//!   asks of it (the largest margin-to-lease ratio, over the shortest
//!   lease; [`PeerSettings::renew_lease`]). Why that is safe: a renewal is
//!   answered only while a quorum acknowledged an append sent less than
//!   `lease − margin` ago; each acknowledging voter refuses every other
//!   candidate for at least its own minimum election timeout after it
//!   received that append, and a new leader needs the vote of at least one
//!   of them. Each voter's answer carries its settings, and the dialer
//!   records them before openraft sees the acknowledgement, so the value a
//!   renewal is judged by already covers every voter whose ack it rests on.
//!
//! A peer that announces nothing (a version before this check) is not
//! compared; its settings are taken to be this node's.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;
use std::time::Duration;

use crate::raft::lease::RenewLease;
use crate::raft::NodeId;

/// The header carrying the sender's settings on peer requests and answers.
pub const SETTINGS_HEADER: &str = "x-palisade-settings";

/// What one node announces of its settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// `--partitions` (as its data dir holds it).
    pub partitions: u32,
    /// Its minimum election timeout: the shortest vote lease it keeps.
    pub lease_ms: u64,
    /// Its lease margin.
    pub margin_ms: u64,
}

impl Settings {
    /// The header value: `partitions=3;lease-ms=300;margin-ms=30`.
    pub fn encode(&self) -> String {
        format!(
            "partitions={};lease-ms={};margin-ms={}",
            self.partitions, self.lease_ms, self.margin_ms
        )
    }

    /// Parses [`Settings::encode`]'s form; `None` for anything else.
    pub fn decode(text: &str) -> Option<Self> {
        let mut partitions = None;
        let mut lease_ms = None;
        let mut margin_ms = None;
        for field in text.split(';') {
            let (name, value) = field.split_once('=')?;
            match name.trim() {
                "partitions" => partitions = Some(value.trim().parse().ok()?),
                "lease-ms" => lease_ms = Some(value.trim().parse().ok()?),
                "margin-ms" => margin_ms = Some(value.trim().parse().ok()?),
                _ => {} // a later version's field
            }
        }
        Some(Self {
            partitions: partitions?,
            lease_ms: lease_ms?,
            margin_ms: margin_ms?,
        })
    }
}

/// This node's settings and the ones each peer announced last.
#[derive(Debug)]
pub struct PeerSettings {
    mine: Settings,
    /// The header value this node sends.
    header: http::HeaderValue,
    seen: RwLock<BTreeMap<NodeId, Settings>>,
    /// The shortest lease (high 32 bits) and the margin over it (low 32
    /// bits), in ms, of this node and every peer seen: one atomic, so a
    /// renewal never reads one peer's new lease with another's old margin.
    bound: AtomicU64,
}

/// `(lease_ms, margin_ms)` in one word (each clamped to 32 bits: 49 days).
fn pack(lease_ms: u64, margin_ms: u64) -> u64 {
    (lease_ms.min(u64::from(u32::MAX)) << 32) | margin_ms.min(u64::from(u32::MAX))
}

impl PeerSettings {
    /// A node whose own settings are `mine`.
    pub fn new(mine: Settings) -> Self {
        let header = http::HeaderValue::from_str(&mine.encode())
            .expect("digits, letters, '=', ';' and '-' make a header value");
        Self {
            mine,
            header,
            seen: RwLock::default(),
            bound: AtomicU64::new(pack(mine.lease_ms, mine.margin_ms)),
        }
    }

    /// This node's settings.
    pub fn mine(&self) -> Settings {
        self.mine
    }

    /// The header value announcing this node's settings.
    pub fn header(&self) -> http::HeaderValue {
        self.header.clone()
    }

    /// Records what `from` announced (`None`: it announced nothing, or
    /// nothing readable) and says whether it may be served or heard.
    ///
    /// # Errors
    /// The setting that must agree and does not, in one sentence.
    pub fn check(&self, from: NodeId, announced: Option<&str>) -> Result<(), String> {
        let Some(announced) = announced else {
            return Ok(());
        };
        let Some(theirs) = Settings::decode(announced) else {
            return Err(format!(
                "node {from} announced settings this node cannot read: {announced:?}"
            ));
        };
        let known = palisade_plumbing::sync::read(&self.seen)
            .get(&from)
            .copied();
        if known != Some(theirs) {
            let mut seen = palisade_plumbing::sync::write(&self.seen);
            seen.insert(from, theirs);
            self.recompute(&seen);
            if theirs.lease_ms != self.mine.lease_ms || theirs.margin_ms != self.mine.margin_ms {
                tracing::warn!(
                    node = from,
                    their_election_timeout_min_ms = theirs.lease_ms,
                    their_lease_margin_ms = theirs.margin_ms,
                    "a peer's election timing differs from this node's: renewals are answered \
                     inside the shortest vote lease any voter announced, less the margin the most drift asks"
                );
            }
        }
        self.disagreement(from, &theirs).map_or(Ok(()), Err)
    }

    fn recompute(&self, seen: &BTreeMap<NodeId, Settings>) {
        let lease = seen
            .values()
            .map(|s| s.lease_ms)
            .chain([self.mine.lease_ms])
            .min()
            .unwrap_or(self.mine.lease_ms);
        // Each node's margin covers the clock drift it assumes over its own
        // lease (m = 2·L·rate): the most pessimistic rate any node assumed,
        // over the shortest lease, rounded up.
        let margin = seen
            .values()
            .chain([&self.mine])
            .map(|s| {
                let scaled = u128::from(lease) * u128::from(s.margin_ms);
                let own = u128::from(s.lease_ms.max(1));
                u64::try_from(scaled.div_ceil(own)).unwrap_or(u64::MAX)
            })
            .max()
            .unwrap_or(self.mine.margin_ms);
        self.bound.store(pack(lease, margin), Ordering::Release);
    }

    fn disagreement(&self, from: NodeId, theirs: &Settings) -> Option<String> {
        (theirs.partitions != self.mine.partitions).then(|| {
            format!(
                "node {from} runs --partitions {}, this node {}: nodes that disagree on the \
                 partition count would place one lease in two Raft groups, so they do not serve \
                 together (start every node with one count)",
                theirs.partitions, self.mine.partitions
            )
        })
    }

    /// Forgets peers that are no longer `members` (their settings no
    /// longer bound the lease).
    pub fn forget_all_but(&self, members: &[NodeId]) {
        let mut seen = palisade_plumbing::sync::write(&self.seen);
        seen.retain(|id, _| members.contains(id));
        self.recompute(&seen);
    }

    /// `base` (this node's own rule) with the shortest lease any peer
    /// announced, and over it the margin of the most pessimistic drift any
    /// node assumed (the largest margin-to-lease ratio: a margin covers the
    /// drift over its own lease, so a 500 ms margin of a 5 s lease asks 30
    /// ms of a 300 ms one).
    pub fn renew_lease(&self, base: RenewLease) -> RenewLease {
        let bound = self.bound.load(Ordering::Acquire);
        let lease = Duration::from_millis(bound >> 32);
        let margin = Duration::from_millis(bound & u64::from(u32::MAX));
        RenewLease {
            lease: base.lease.min(lease),
            margin,
            ..base
        }
    }

    /// Every setting a known peer disagrees on, one sentence each, and
    /// every difference in timing, said as what the leader lease uses.
    pub fn differences(&self) -> Differences {
        let seen = palisade_plumbing::sync::read(&self.seen);
        let refused = seen
            .iter()
            .filter_map(|(id, theirs)| self.disagreement(*id, theirs))
            .collect();
        let timing = seen
            .iter()
            .filter(|(_, s)| s.lease_ms != self.mine.lease_ms || s.margin_ms != self.mine.margin_ms)
            .map(|(id, s)| {
                format!(
                    "node {id}: minimum election timeout {} ms, lease margin {} ms (this node {} \
                     ms, {} ms)",
                    s.lease_ms, s.margin_ms, self.mine.lease_ms, self.mine.margin_ms
                )
            })
            .collect();
        Differences { refused, timing }
    }
}

/// Logs every setting a peer disagrees on, one line a minute while any
/// does (the gate and the dialer log each refusal once).
pub async fn report_differences(settings: std::sync::Arc<PeerSettings>) {
    let mut every = tokio::time::interval(Duration::from_secs(60));
    loop {
        every.tick().await;
        let differences = settings.differences();
        if !differences.refused.is_empty() {
            tracing::error!(
                differences = %differences.refused.join("; "),
                "peers disagree on settings that must agree: this node serves no grant or \
                 renewal with them"
            );
        }
    }
}

/// What [`PeerSettings::differences`] finds.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Differences {
    /// Settings that must agree and do not: those peers are refused.
    pub refused: Vec<String>,
    /// Timing that differs (allowed: the leader lease takes the shortest).
    pub timing: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(partitions: u32, lease_ms: u64, margin_ms: u64) -> Settings {
        Settings {
            partitions,
            lease_ms,
            margin_ms,
        }
    }

    fn rule(lease_ms: u64, margin_ms: u64) -> RenewLease {
        RenewLease {
            lease: Duration::from_millis(lease_ms),
            margin: Duration::from_millis(margin_ms),
            patience: Duration::from_secs(1),
            first_ack: Duration::from_millis(lease_ms * 2),
        }
    }

    #[test]
    fn the_header_round_trips_and_refuses_garbage() {
        let s = settings(3, 300, 30);
        assert_eq!(Settings::decode(&s.encode()), Some(s));
        assert_eq!(
            Settings::decode("partitions=3;lease-ms=300;margin-ms=30;later=x"),
            Some(s)
        );
        assert_eq!(Settings::decode("partitions=3;lease-ms=300"), None);
        assert_eq!(
            Settings::decode("partitions=x;lease-ms=1;margin-ms=1"),
            None
        );
        assert_eq!(Settings::decode(""), None);
    }

    #[test]
    fn a_peer_with_another_partition_count_is_refused_and_named() {
        let peers = PeerSettings::new(settings(2, 300, 30));
        let err = peers
            .check(2, Some(&settings(3, 300, 30).encode()))
            .expect_err("refused");
        assert!(err.contains("--partitions 3, this node 2"), "{err}");
        assert_eq!(peers.differences().refused.len(), 1);
        // It agrees once restarted with the same count.
        peers
            .check(2, Some(&settings(2, 300, 30).encode()))
            .expect("agrees");
        assert!(peers.differences().refused.is_empty());
        // A peer that says nothing is not compared; garbage is refused.
        peers.check(3, None).expect("agrees");
        assert!(peers.check(3, Some("nonsense")).is_err());
    }

    #[test]
    fn the_leader_lease_takes_the_shortest_vote_lease_and_the_most_drift() {
        // Node 1 runs 5000 ms; a voter runs 300 ms: renewals are answered
        // inside 300 ms less its margin, never 5000.
        let peers = PeerSettings::new(settings(1, 5000, 500));
        assert_eq!(
            peers.renew_lease(rule(5000, 500)).usable(),
            Duration::from_millis(4500)
        );
        peers
            .check(2, Some(&settings(1, 300, 30).encode()))
            .expect("agrees");
        // Both assume the same drift (a tenth of the lease): 300 less 30.
        let usable = peers.renew_lease(rule(5000, 500)).usable();
        assert_eq!(usable, Duration::from_millis(270));
        // A voter assuming more drift (a fifth) raises the margin.
        peers
            .check(3, Some(&settings(1, 1000, 200).encode()))
            .expect("agrees");
        assert_eq!(
            peers.renew_lease(rule(5000, 500)).margin,
            Duration::from_millis(60)
        );
        peers
            .check(3, Some(&settings(1, 300, 600).encode()))
            .expect("agrees");
        assert_eq!(
            peers.renew_lease(rule(5000, 500)).margin,
            Duration::from_millis(600)
        );
        assert_eq!(peers.renew_lease(rule(5000, 500)).usable(), Duration::ZERO);
        // The other way round: a leader at 300 ms keeps its own.
        let short = PeerSettings::new(settings(1, 300, 30));
        short
            .check(2, Some(&settings(1, 5000, 500).encode()))
            .expect("agrees");
        assert_eq!(
            short.renew_lease(rule(300, 30)).lease,
            Duration::from_millis(300)
        );
        assert_eq!(short.differences().timing.len(), 1);
        // A rolled node announces its new, longer value: the bound follows
        // it, and a removed node no longer bounds it.
        peers
            .check(2, Some(&settings(1, 5000, 500).encode()))
            .expect("agrees");
        peers.forget_all_but(&[1, 2]);
        assert_eq!(
            peers.renew_lease(rule(5000, 500)).usable(),
            Duration::from_millis(4500)
        );
    }
}
