//! Per-lease wakeups and the queue of blocking acquirers (by priority, then arrival).
//!
//! A watch or a blocking acquire subscribes to its own lease ([`Bells::subscribe`]);
//! apply rings only the leases it changed, so a change to one lease wakes
//! only the calls waiting on it (not every waiter on the node). Blocking
//! acquirers of a held lease also take a place in its queue
//! ([`Bell::queue`]): when the lease frees, only the head proposes an
//! `Acquire`, so one log entry hands the lease to the longest waiter, as
//! etcd's and ZooKeeper's lock recipes do, instead of every waiter racing
//! with its own entry. A place is given up when its call ends for any reason
//! (granted, timed out, client gone), which wakes the next one.
//!
//! Queues live on the node that runs the acquires, the leader (followers
//! forward them); a new leader starts with empty queues and the waiting
//! calls, answered 503 by the old one, retry there.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use palisade_names::LeaseName;
use tokio::sync::watch;

/// One lease's wakeup channel and queue.
#[derive(Debug)]
struct Entry {
    /// Bumped on every change to the lease and every change of its queue.
    ring: watch::Sender<u64>,
    /// Blocking acquirers, highest priority first, then in arrival order:
    /// `(ticket, holder, priority)`.
    queue: VecDeque<(u64, String, u32)>,
}

/// Per-lease wakeups and acquire queues.
#[derive(Debug, Default)]
pub struct Bells {
    entries: Mutex<HashMap<LeaseName, Entry>>,
    next_ticket: std::sync::atomic::AtomicU64,
}

impl Bells {
    fn entries(&self) -> MutexGuard<'_, HashMap<LeaseName, Entry>> {
        palisade_plumbing::sync::lock(&self.entries)
    }

    /// Subscribes to changes of `lease`. Subscribe before reading the state
    /// you wait on, so no change between the read and the wait is missed.
    pub fn subscribe(self: &Arc<Self>, lease: &LeaseName) -> Bell {
        let mut entries = self.entries();
        let entry = entries.entry(lease.clone()).or_insert_with(|| Entry {
            ring: watch::channel(0).0,
            queue: VecDeque::new(),
        });
        Bell {
            rx: entry.ring.subscribe(),
            lease: lease.clone(),
            bells: self.clone(),
            ticket: None,
        }
    }

    /// Wakes the calls waiting on `lease` (apply changed it).
    pub fn ring(&self, lease: &LeaseName) {
        if let Some(entry) = self.entries().get(lease) {
            entry.ring.send_modify(|n| *n += 1);
        }
    }

    /// Wakes every waiting call (a snapshot replaced the whole table).
    pub fn ring_all(&self) {
        for entry in self.entries().values() {
            entry.ring.send_modify(|n| *n += 1);
        }
    }

    /// How many leases have waiting calls (for tests and metrics).
    pub fn leases_waited_on(&self) -> usize {
        self.entries().len()
    }
}

/// A subscription to one lease's changes, and perhaps a place in its queue.
/// Dropping it gives up the place (waking the next in line) and, with the
/// last subscriber, forgets the lease.
#[derive(Debug)]
pub struct Bell {
    rx: watch::Receiver<u64>,
    lease: LeaseName,
    bells: Arc<Bells>,
    ticket: Option<u64>,
}

impl Bell {
    /// Waits for the next ring (or returns at once if one came since the
    /// last wait).
    pub async fn rung(&mut self) {
        // The sender lives while this receiver is subscribed (an entry is
        // removed only when its last subscriber drops), so this cannot fail
        // for long; treat a closed channel as a ring.
        let _ = self.rx.changed().await;
    }

    /// Takes a place in the lease's queue, as `holder` (named to other
    /// waiters whose wait ends while the lease is handed to this one): behind
    /// every waiter of the same or a higher `priority`, ahead of lower ones.
    /// Idempotent.
    pub fn queue(&mut self, holder: &str, priority: u32) {
        if self.ticket.is_some() {
            return;
        }
        let ticket = self
            .bells
            .next_ticket
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut entries = self.bells.entries();
        if let Some(entry) = entries.get_mut(&self.lease) {
            let at = entry
                .queue
                .iter()
                .position(|(_, _, p)| *p < priority)
                .unwrap_or(entry.queue.len());
            entry
                .queue
                .insert(at, (ticket, holder.to_owned(), priority));
            self.ticket = Some(ticket);
            if at == 0 && entry.queue.len() > 1 {
                // A new head: the one it displaced must look again.
                entry.ring.send_modify(|n| *n += 1);
            }
        }
    }

    /// Whether this call may propose now: it holds the queue's head, or the
    /// queue is empty and it has no place in it.
    pub fn may_propose(&self) -> bool {
        let entries = self.bells.entries();
        let head = entries
            .get(&self.lease)
            .and_then(|e| e.queue.front())
            .map(|(ticket, _, _)| *ticket);
        head.is_none() || head == self.ticket
    }

    /// The holder at the head of the queue, if another call holds it.
    pub fn head_holder(&self) -> Option<String> {
        let entries = self.bells.entries();
        let (ticket, holder, _) = entries.get(&self.lease)?.queue.front()?;
        (Some(*ticket) != self.ticket).then(|| holder.clone())
    }
}

impl Drop for Bell {
    fn drop(&mut self) {
        let mut entries = self.bells.entries();
        let Some(entry) = entries.get_mut(&self.lease) else {
            return;
        };
        if let Some(ticket) = self.ticket {
            let was_head = entry.queue.front().is_some_and(|(t, _, _)| *t == ticket);
            entry.queue.retain(|(t, _, _)| *t != ticket);
            if was_head {
                entry.ring.send_modify(|n| *n += 1);
            }
        }
        // This receiver still counts: it is the last one when the count is 1.
        if entry.ring.receiver_count() <= 1 {
            entries.remove(&self.lease);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn name(lease: &str) -> LeaseName {
        LeaseName::new(lease).expect("lease name")
    }

    async fn rings_within(bell: &mut Bell, ms: u64) -> bool {
        tokio::time::timeout(Duration::from_millis(ms), bell.rung())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_change_wakes_only_its_own_lease() {
        let bells = Arc::new(Bells::default());
        let mut a = bells.subscribe(&name("a"));
        let mut b = bells.subscribe(&name("b"));
        bells.ring(&name("a"));
        assert!(rings_within(&mut a, 100).await);
        assert!(!rings_within(&mut b, 50).await, "b was not changed");
        bells.ring_all();
        assert!(rings_within(&mut b, 100).await);
        drop((a, b));
        assert_eq!(bells.leases_waited_on(), 0, "forgotten with the last bell");
    }

    #[tokio::test]
    async fn the_queue_is_first_come_first_served_and_a_leaver_wakes_the_next() {
        let bells = Arc::new(Bells::default());
        let lease = name("jobs");
        let mut first = bells.subscribe(&lease);
        let mut second = bells.subscribe(&lease);
        let mut third = bells.subscribe(&lease);
        assert!(first.may_propose(), "an empty queue lets anyone propose");
        first.queue("w1", 0);
        second.queue("w2", 0);
        third.queue("w3", 0);
        first.queue("w1", 0);
        assert!(first.may_propose());
        assert!(!second.may_propose() && !third.may_propose());
        assert_eq!(second.head_holder().as_deref(), Some("w1"));
        assert_eq!(
            first.head_holder(),
            None,
            "the head is not told about itself"
        );
        let outsider = bells.subscribe(&lease);
        assert!(!outsider.may_propose(), "no barging past a queue");
        // The head leaves (granted, timed out or gone): the next wakes.
        let _ = rings_within(&mut second, 10).await;
        drop(first);
        assert!(rings_within(&mut second, 100).await);
        assert!(second.may_propose());
        // A waiter leaving from the middle wakes nobody, and keeps the order.
        drop(third);
        assert!(!rings_within(&mut second, 50).await);
        drop(second);
        assert!(outsider.may_propose());
        drop(outsider);
        assert_eq!(bells.leases_waited_on(), 0);
    }

    #[tokio::test]
    async fn a_higher_priority_goes_ahead_of_lower_ones_only() {
        let bells = Arc::new(Bells::default());
        let lease = name("jobs");
        let mut low = bells.subscribe(&lease);
        let mut same = bells.subscribe(&lease);
        let mut high = bells.subscribe(&lease);
        let mut high_later = bells.subscribe(&lease);
        low.queue("low", 1);
        same.queue("same", 1);
        let _ = rings_within(&mut low, 10).await;
        high.queue("high", 5);
        assert!(
            rings_within(&mut low, 100).await,
            "the displaced head looks again"
        );
        high_later.queue("high-later", 5);
        assert!(high.may_propose() && !low.may_propose());
        drop(high);
        assert!(
            high_later.may_propose(),
            "equal priorities keep arrival order"
        );
        drop(high_later);
        assert!(low.may_propose() && !same.may_propose());
    }
}
