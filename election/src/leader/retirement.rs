//! [`KeyRetirer`]: when the leader retires a rotated-out signing key.
//!
//! A key rotated out at time T signed its last token just before T, and no
//! token lives longer than two of the longest ttl (renewals reuse a JWT
//! signed for two ttls: `signing::TokenCache`), plus the second `exp` is
//! rounded up to. So the key is retired once that long has passed since the
//! leader saw the rotation (`node.rs` sets it). Like lease deadlines, the clock restarts when
//! leadership changes: a new leader waits the whole time again, which only
//! publishes a key longer than needed, never shorter.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// Tracks rotated-out keys on the leader.
#[derive(Debug)]
pub struct KeyRetirer {
    /// How long a rotated-out key stays published.
    retire_after: Duration,
    /// The term this tracking belongs to.
    term: Option<u64>,
    /// Rotated-out kid -> when this leader first saw it so, and whether its
    /// retirement is being proposed.
    seen: HashMap<String, (Instant, bool)>,
}

impl KeyRetirer {
    /// Retires keys `retire_after` after the rotation.
    pub fn new(retire_after: Duration) -> Self {
        Self {
            retire_after,
            term: None,
            seen: HashMap::new(),
        }
    }

    /// Given the rotated-out keys the table publishes now, on the leader of
    /// `term`, the kids whose retirement is due (each returned once until
    /// [`KeyRetirer::failed`]).
    pub fn due<'a>(&mut self, term: u64, previous: impl Iterator<Item = &'a str>) -> Vec<String> {
        if self.term != Some(term) {
            self.term = Some(term);
            self.seen.clear();
        }
        let now = Instant::now();
        let previous: Vec<&str> = previous.collect();
        self.seen.retain(|kid, _| previous.contains(&kid.as_str()));
        let mut due = Vec::new();
        for kid in previous {
            let (since, proposing) = self.seen.entry(kid.to_owned()).or_insert((now, false));
            if !*proposing && now.duration_since(*since) >= self.retire_after {
                *proposing = true;
                due.push(kid.to_owned());
            }
        }
        due
    }

    /// The retirement of `kid` was not committed: try again later.
    pub fn failed(&mut self, kid: &str) {
        if let Some((_, proposing)) = self.seen.get_mut(kid) {
            *proposing = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_key_is_retired_after_the_longest_ttl_and_a_new_leader_waits_again() {
        let mut retirer = KeyRetirer::new(Duration::from_secs(10));
        assert!(retirer.due(1, ["k1"].into_iter()).is_empty());
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(retirer.due(1, ["k1"].into_iter()).is_empty());
        // Leadership moved: the clock restarts.
        assert!(retirer.due(2, ["k1"].into_iter()).is_empty());
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(retirer.due(2, ["k1"].into_iter()).is_empty());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(retirer.due(2, ["k1"].into_iter()), ["k1"]);
        assert!(
            retirer.due(2, ["k1"].into_iter()).is_empty(),
            "proposed once"
        );
        retirer.failed("k1");
        assert_eq!(retirer.due(2, ["k1"].into_iter()), ["k1"], "retried");
        assert!(retirer.due(2, std::iter::empty()).is_empty());
    }
}
