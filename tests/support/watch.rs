//! Reading a prefix watch in tests.

use std::time::{Duration, Instant};

use palisade_client::{PrefixWatch, WatchEvent};

/// The next change event of `watch` (keep-alives skipped), within
/// `patience` (a bound against a hang, not a timing assertion).
pub async fn next_change(watch: &mut PrefixWatch, patience: Duration) -> WatchEvent {
    let started = Instant::now();
    loop {
        let left = patience.saturating_sub(started.elapsed());
        let event = tokio::time::timeout(left, watch.next())
            .await
            .expect("an event in time")
            .expect("the stream is open")
            .expect("an event");
        if !matches!(event, WatchEvent::Progress { .. }) {
            return event;
        }
    }
}
