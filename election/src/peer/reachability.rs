//! [`Reachability`]: what this node has seen of each peer's answers, so a
//! peer that is down costs a few log lines rather than one per heartbeat
//! (openraft's own per-heartbeat warnings are filtered by the binary's
//! default log filter), and is not dialed on every heartbeat.
//!
//! Each peer is up until a call to it fails; then one line says it is
//! unreachable, one line every [`SUMMARY_EVERY`] while it stays down sums up
//! the failed calls, and one line says when it answers again. While it is
//! down, heartbeats to it back off (doubling from [`FIRST_BACKOFF`] to
//! [`MAX_BACKOFF`]) — only while its calls are refused at connect (no
//! process listens: a dead node has no election timer that missed
//! heartbeats would fire; a slow or paused peer that merely times out is
//! never skipped, or it would start elections); votes and appends that
//! carry entries are always sent, so elections and catch-up never wait on
//! the backoff.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::raft::NodeId;

/// The first wait between heartbeats to a peer that stopped answering.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(20);
/// The longest: a peer that comes back hears a heartbeat within this,
/// below the shortest election timeout (60 ms by default), so a restarted
/// node's election timer does not fire for want of one.
pub const MAX_BACKOFF: Duration = Duration::from_millis(40);
/// How often a peer that stays down is summed up in the log.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(60);

/// Every peer's state, shared by the node's peer clients.
#[derive(Debug, Default)]
pub struct Reachability {
    peers: Mutex<HashMap<NodeId, Down>>,
}

/// A peer that stopped answering.
#[derive(Debug)]
struct Down {
    since: Instant,
    failures: u64,
    /// No heartbeat is sent before this (while `refused`).
    next_try: Instant,
    /// Its last call was refused at connect: nothing listens there.
    refused: bool,
    backoff: Duration,
    /// When the last line about it was written.
    logged: Instant,
}

/// What to log after a call, if anything.
#[derive(Debug, PartialEq, Eq)]
pub enum Said {
    /// The peer stopped answering (the first failure after an answer).
    Unreachable,
    /// Still down, `failures` calls failed in `for_`.
    StillDown { for_: Duration, failures: u64 },
    /// It answers again after `for_` and `failures` failed calls.
    Back { for_: Duration, failures: u64 },
}

impl Reachability {
    /// Whether a heartbeat to `peer` is to be skipped now: it is down and
    /// its backoff has not passed.
    pub fn backing_off(&self, peer: NodeId) -> bool {
        let peers = palisade_plumbing::sync::lock(&self.peers);
        peers
            .get(&peer)
            .is_some_and(|down| down.refused && Instant::now() < down.next_try)
    }

    /// A call to `peer` failed (`refused`: at connect, nothing listens):
    /// what to log.
    pub fn failed(&self, peer: NodeId, refused: bool) -> Option<Said> {
        let now = Instant::now();
        let mut peers = palisade_plumbing::sync::lock(&self.peers);
        let Some(down) = peers.get_mut(&peer) else {
            peers.insert(
                peer,
                Down {
                    since: now,
                    failures: 1,
                    next_try: now + FIRST_BACKOFF,
                    backoff: FIRST_BACKOFF,
                    refused,
                    logged: now,
                },
            );
            return Some(Said::Unreachable);
        };
        down.failures += 1;
        down.refused = refused;
        down.backoff = (down.backoff * 2).min(MAX_BACKOFF);
        down.next_try = now + down.backoff;
        if now.duration_since(down.logged) < SUMMARY_EVERY {
            return None;
        }
        down.logged = now;
        Some(Said::StillDown {
            for_: now.duration_since(down.since),
            failures: down.failures,
        })
    }

    /// `peer` answered: what to log.
    pub fn answered(&self, peer: NodeId) -> Option<Said> {
        let mut peers = palisade_plumbing::sync::lock(&self.peers);
        let down = peers.remove(&peer)?;
        Some(Said::Back {
            for_: down.since.elapsed(),
            failures: down.failures,
        })
    }
}

/// Writes what `said` of peer `peer` at `addr` (`error`: the last failure).
pub fn log(said: Option<Said>, peer: NodeId, addr: &str, error: &dyn std::fmt::Display) {
    match said {
        None => {}
        Some(Said::Unreachable) => tracing::warn!(
            peer, %addr, %error,
            "peer unreachable; one summary a minute until it answers"
        ),
        Some(Said::StillDown { for_, failures }) => tracing::warn!(
            peer, %addr, down_s = for_.as_secs(), failures, last_error = %error,
            "peer still unreachable"
        ),
        Some(Said::Back { for_, failures }) => tracing::info!(
            peer, %addr, down_ms = for_.as_millis() as u64, failures,
            "peer answers again"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_peer_down_for_minutes_is_three_lines_and_backs_off() {
        let seen = Reachability::default();
        assert_eq!(seen.answered(2), None);
        assert_eq!(seen.failed(2, false), Some(Said::Unreachable));
        assert!(
            !seen.backing_off(2),
            "a peer that times out is never skipped"
        );
        assert_eq!(seen.failed(2, true), None);
        assert!(seen.backing_off(2));
        assert!(!seen.backing_off(3));
        let mut lines = 1;
        // Heartbeats every 20 ms for 150 s, as openraft sends them; the
        // ones inside the backoff are not sent (no call, no failure).
        for _ in 0..7_500 {
            tokio::time::advance(Duration::from_millis(20)).await;
            if !seen.backing_off(2) && seen.failed(2, true).is_some() {
                lines += 1;
            }
        }
        assert_eq!(lines, 3, "one line, then one a minute");
        let back = seen.answered(2);
        let Some(Said::Back { for_, failures }) = back else {
            panic!("{back:?}")
        };
        assert!(for_ >= Duration::from_secs(150));
        // At most one call per MAX_BACKOFF once backed off.
        assert!(
            failures <= 150_000 / MAX_BACKOFF.as_millis() as u64 + 10,
            "{failures}"
        );
        assert!(!seen.backing_off(2));
        assert_eq!(seen.failed(2, true), Some(Said::Unreachable));
    }
}
