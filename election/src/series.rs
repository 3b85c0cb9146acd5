//! What the status page plots: every [`EVERY`] the sampler records what
//! this node saw over the interval — renewals and grants per second, the
//! gateway's refused writes per second, leases held, waiters, the renewal
//! p99 — and who led; the last [`KEPT`] samples (15 minutes) stay in
//! memory. A node counts what it served (renewals: only as leader) and
//! what it applied (grants: every node), as `/metrics` does; a restarted
//! node starts with an empty plot. `api/ui/sampler.rs` takes the samples;
//! peers ask for them (`peer/figures.rs`), so any node's status page plots
//! the whole cluster's.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use crate::raft::NodeId;

/// How often a sample is taken.
pub(crate) const EVERY: Duration = Duration::from_secs(5);

/// Samples kept: 15 minutes.
pub(crate) const KEPT: usize = 180;

/// One interval of this node's life.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Sample {
    /// When it was taken, ms since the Unix epoch.
    pub at_ms: u64,
    /// Renewals answered per second (as leader).
    pub renewals: f64,
    /// New grants applied per second.
    pub grants: f64,
    /// Writes the gateway refused for a stale token, per second; `None`
    /// without a gateway or when it could not be read.
    pub refused: Option<f64>,
    /// Leases with a holder, at the end.
    pub held: u64,
    /// Blocking calls waiting on this node, at the end.
    pub waiters: u64,
    /// The renewals' 99th percentile, ms; `None` if none were answered.
    pub renew_p99_ms: Option<f64>,
    /// The leader at the end.
    pub leader: Option<NodeId>,
    /// The leader changed during the interval.
    pub leader_changed: bool,
}

/// The kept samples, oldest first.
#[derive(Debug, Default)]
pub struct Series(Mutex<VecDeque<Sample>>);

impl Series {
    /// Keeps `sample`, dropping the oldest past [`KEPT`].
    pub(crate) fn push(&self, sample: Sample) {
        let mut samples = palisade_plumbing::sync::lock(&self.0);
        if samples.len() == KEPT {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    /// A copy of the kept samples, oldest first.
    pub(crate) fn samples(&self) -> Vec<Sample> {
        palisade_plumbing::sync::lock(&self.0)
            .iter()
            .copied()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_series_keeps_the_newest_fifteen_minutes() {
        let series = Series::default();
        for at_ms in 0..(KEPT as u64 + 20) {
            series.push(Sample {
                at_ms,
                ..Sample::default()
            });
        }
        let kept = series.samples();
        assert_eq!(kept.len(), KEPT);
        assert_eq!(kept.first().map(|s| s.at_ms), Some(20));
        assert_eq!(kept.last().map(|s| s.at_ms), Some(KEPT as u64 + 19));
    }
}
