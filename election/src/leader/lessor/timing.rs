//! What the lessor tells readers about a tracked grant: the time it has
//! left, and when it was last renewed (the Lease JSON's `expires_in_ms` and
//! `renew_time`). Only the leader tracks grants; a follower answers `None`.

use std::time::Duration;

use palisade_names::{FencingToken, LeaseName};
use tokio::time::Instant;

use super::Lessor;

impl Lessor {
    /// Milliseconds until `lease`'s grant `token` expires, as the leader sees
    /// it; `None` on a follower or for an untracked grant.
    pub fn remaining_ms(&self, lease: &LeaseName, token: FencingToken) -> Option<u64> {
        let state = self.state();
        state.leading?;
        let tracked = state.deadlines.get(lease).filter(|t| t.token == token)?;
        Some(
            tracked
                .deadline
                .saturating_duration_since(Instant::now())
                .as_millis() as u64,
        )
    }

    /// How long ago this leader last set the deadline of `lease`'s grant
    /// `token` a full ttl ahead: its last renewal (a repeated acquire
    /// counts), else when this leader started tracking it (the grant
    /// applied here, or taken over from an earlier leader). `None` on a
    /// follower or for an untracked grant.
    pub fn renewed_ago(&self, lease: &LeaseName, token: FencingToken) -> Option<Duration> {
        let state = self.state();
        state.leading?;
        let tracked = state.deadlines.get(lease).filter(|t| t.token == token)?;
        Some(Instant::now().saturating_duration_since(tracked.renewed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(lease: &str) -> LeaseName {
        LeaseName::new(lease).expect("lease name")
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_resets_how_long_ago_the_grant_was_renewed() {
        let lessor = Lessor::default();
        let (lease, token) = (name("a"), FencingToken(3));
        lessor.track_grant(&lease, token, Duration::from_secs(10));
        assert_eq!(
            lessor.renewed_ago(&lease, token),
            None,
            "a follower knows nothing"
        );
        lessor.promote(1);
        lessor.track_grant(&lease, token, Duration::from_secs(10));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(
            lessor.renewed_ago(&lease, token),
            Some(Duration::from_secs(2))
        );
        lessor
            .renew(&lease, token, Duration::from_secs(10), None)
            .expect("renewed");
        assert_eq!(lessor.renewed_ago(&lease, token), Some(Duration::ZERO));
        assert_eq!(
            lessor.renewed_ago(&lease, FencingToken(4)),
            None,
            "another grant"
        );
    }
}
