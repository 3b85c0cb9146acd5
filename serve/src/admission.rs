//! Admission per flow: no caller can take more than its share of a server's
//! request seats (Kubernetes' API Priority and Fairness, cut down).
//!
//! A *flow* is a principal (its policy name) or, without a key, the remote
//! address. Requests are admitted into one of three pools of seats, each
//! with its own capacity:
//! - [`Pool::Renew`]: renewals. Their pool is theirs alone, so a lease
//!   holder that renews on time always finds a seat whatever else the
//!   server does; a renewal may also borrow a short seat.
//! - [`Pool::Short`]: every other call that answers at once.
//! - [`Pool::Long`]: calls that may wait (watches, blocking acquires), which
//!   hold a seat for seconds.
//! - [`Pool::Stream`]: long-lived streams (a client's renewal stream), which
//!   hold a seat for their life; their pool is apart, so open streams never
//!   crowd out watches, nor watches streams.
//!
//! Within a pool, a flow below its *fair share* — the capacity divided among
//! the flows holding seats, one more counted for a newcomer — takes any free
//! seat. A flow at or above it may still borrow an idle pool's seats, but
//! never the last quarter (the *headroom*), which waits for newcomers: so
//! one flow alone can use three quarters of a pool, and as soon as another
//! flow arrives it finds seats, and the first one's share shrinks as its
//! requests end. Over its share a request is refused at once (the server
//! answers 429 with `Retry-After`), never queued without end.
//!
//! A seat whose holder knows when it will give it back at the latest (a
//! renewal stream: at its idle or stall deadline) says so
//! ([`Seat::free_by`]); a refusal in its pool then carries the earliest of
//! those times ([`OverShare::retry_after`]), so `Retry-After` says when a
//! seat will really be free rather than a guess.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use palisade_plumbing::sync::lock;

/// Which pool a request takes a seat in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pool {
    /// A renewal (single or batch).
    Renew,
    /// A call that answers at once.
    Short,
    /// A call that may wait (a watch, a blocking acquire).
    Long,
    /// A stream open for as long as its client likes (a renewal stream).
    Stream,
}

/// The capacity of each pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seats {
    /// Seats for renewals only.
    pub renew: usize,
    /// Seats for short calls (renewals may borrow them).
    pub short: usize,
    /// Seats for calls that may wait.
    pub long: usize,
    /// Seats for long-lived streams (counted apart from requests: a stream
    /// answers its headers at once).
    pub stream: usize,
}

impl Seats {
    /// Pools that fit under a server's cap on requests in flight
    /// (`max_requests`), using half of it: the other half absorbs requests
    /// on their way to a refusal (a flood over its share still arrives,
    /// and counts against the cap until answered) and calls outside
    /// admission (health, metrics, keys).
    pub fn within(max_requests: usize) -> Self {
        Self::of(max_requests / 2)
    }

    /// `total` seats split among the pools: a quarter for calls that wait,
    /// an eighth for renewals alone, the rest for short calls; and, apart,
    /// an eighth as many streams. For a cap that a refusal never reaches (a
    /// follower's forwarding streams: a call over its share is refused
    /// before a stream is opened), all of it.
    pub fn of(total: usize) -> Self {
        let long = total / 4;
        let renew = total / 8;
        let short = total - long - renew;
        Self {
            renew: renew.max(1),
            short: short.max(1),
            long: long.max(1),
            stream: (total / 8).max(1),
        }
    }
}

/// Why a request was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{flow} is over its share of this server's {kind} seats ({held} held of {capacity}); retry in {} s", retry_after.as_secs())]
pub struct OverShare {
    /// The flow refused.
    pub flow: String,
    /// The pool it asked in (`renew`, `short`, `long`, `stream`).
    pub kind: &'static str,
    /// Seats it held in that pool.
    pub held: usize,
    /// The pool's capacity.
    pub capacity: usize,
    /// When to ask again, in whole seconds (at least 1): when the first
    /// seat of the pool whose holder said when it gives it back
    /// ([`Seat::free_by`]) is due, rounded up; 1 s when none said.
    pub retry_after: Duration,
}

/// One pool of seats and who holds them.
#[derive(Debug, Default)]
struct PoolState {
    capacity: usize,
    in_use: usize,
    by_flow: HashMap<String, usize>,
    /// When seats that said so will be given back at the latest, by seat
    /// (milliseconds after the admission's epoch, updated by the holder).
    due: HashMap<u64, Arc<AtomicU64>>,
}

impl PoolState {
    fn new(capacity: usize) -> Self {
        Self {
            capacity,
            ..Self::default()
        }
    }

    /// Whether `flow` may take one more seat now.
    fn admits(&self, flow: &str) -> bool {
        if self.in_use >= self.capacity {
            return false;
        }
        let held = self.by_flow.get(flow).copied().unwrap_or(0);
        let others = self.by_flow.len() - usize::from(held > 0);
        // The share if one more flow came: the caller, the others, a newcomer.
        let fair = self.capacity / (others + 2);
        let headroom = self.capacity / 4;
        held < fair.max(1) || self.in_use < self.capacity - headroom
    }

    fn take(&mut self, flow: &str) {
        self.in_use += 1;
        *self.by_flow.entry(flow.to_owned()).or_default() += 1;
    }

    fn give_back(&mut self, flow: &str) {
        self.in_use = self.in_use.saturating_sub(1);
        if let Some(held) = self.by_flow.get_mut(flow) {
            *held -= 1;
            if *held == 0 {
                self.by_flow.remove(flow);
            }
        }
    }

    fn held(&self, flow: &str) -> usize {
        self.by_flow.get(flow).copied().unwrap_or(0)
    }

    /// When the first seat that said when it is given back is due, in
    /// milliseconds after the epoch.
    fn first_due(&self) -> Option<u64> {
        self.due.values().map(|at| at.load(Ordering::Relaxed)).min()
    }
}

#[derive(Debug)]
struct Pools {
    renew: PoolState,
    short: PoolState,
    long: PoolState,
    stream: PoolState,
    /// The id of the last seat that said when it is given back.
    next_id: u64,
}

impl Pools {
    fn pool(&mut self, kind: Pool) -> &mut PoolState {
        match kind {
            Pool::Renew => &mut self.renew,
            Pool::Short => &mut self.short,
            Pool::Long => &mut self.long,
            Pool::Stream => &mut self.stream,
        }
    }
}

/// A server's admission: cheap to clone, shared by every request.
#[derive(Debug, Clone)]
pub struct Admission {
    pools: Arc<Mutex<Pools>>,
    /// What seats' due times count from.
    epoch: Instant,
}

/// `at` in milliseconds after `epoch`.
fn millis(epoch: Instant, at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(epoch).as_millis()).unwrap_or(u64::MAX)
}

/// A seat held by an admitted request; given back on drop.
#[derive(Debug)]
pub struct Seat {
    pools: Arc<Mutex<Pools>>,
    /// Its admission's epoch (a copy: no shared count to bump per seat).
    epoch: Instant,
    /// The pool it was taken from (a renewal may sit in a short seat).
    kind: Pool,
    flow: String,
    /// Its id and due time in its pool, once its holder said when it gives
    /// it back ([`Seat::free_by`]).
    due: OnceLock<(u64, Arc<AtomicU64>)>,
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut pools = lock(&self.pools);
        let pool = pools.pool(self.kind);
        pool.give_back(&self.flow);
        if let Some((id, _)) = self.due.get() {
            pool.due.remove(id);
        }
    }
}

impl Seat {
    /// Says that this seat will be given back by `at` at the latest (its
    /// holder ends then whatever happens, unless it says a later time
    /// again): refusals in its pool tell their callers to retry when the
    /// first such seat is due. The first call registers the seat in its
    /// pool; later ones are one atomic store.
    pub fn free_by(&self, at: Instant) {
        let millis = millis(self.epoch, at);
        let (_, due) = self.due.get_or_init(|| {
            let due = Arc::new(AtomicU64::new(millis));
            let mut pools = lock(&self.pools);
            pools.next_id += 1;
            let id = pools.next_id;
            pools.pool(self.kind).due.insert(id, due.clone());
            (id, due)
        });
        due.store(millis, Ordering::Relaxed);
    }
}

impl Admission {
    /// Admission with pools of `seats`.
    pub fn new(seats: Seats) -> Self {
        Self {
            pools: Arc::new(Mutex::new(Pools {
                renew: PoolState::new(seats.renew),
                short: PoolState::new(seats.short),
                long: PoolState::new(seats.long),
                stream: PoolState::new(seats.stream),
                next_id: 0,
            })),
            epoch: Instant::now(),
        }
    }

    /// Admits a `kind` request of `flow`, or refuses it at once.
    ///
    /// # Errors
    /// [`OverShare`] when the flow is over its share of the pool (for a
    /// renewal: of its own pool and of the short one).
    pub fn admit(&self, flow: &str, kind: Pool) -> Result<Seat, OverShare> {
        let mut pools = lock(&self.pools);
        let chosen = [kind, Pool::Short]
            .into_iter()
            .take(if kind == Pool::Renew { 2 } else { 1 })
            .find(|k| pools.pool(*k).admits(flow));
        match chosen {
            Some(pool) => {
                pools.pool(pool).take(flow);
                Ok(Seat {
                    pools: self.pools.clone(),
                    epoch: self.epoch,
                    kind: pool,
                    flow: flow.to_owned(),
                    due: OnceLock::new(),
                })
            }
            None => {
                let pool = pools.pool(kind);
                let retry_after = pool.first_due().map_or(1, |due| {
                    let left = due.saturating_sub(millis(self.epoch, Instant::now()));
                    left.div_ceil(1000).max(1)
                });
                let retry_after = Duration::from_secs(retry_after);
                Err(OverShare {
                    flow: flow.to_owned(),
                    kind: match kind {
                        Pool::Renew => "renew",
                        Pool::Short => "short",
                        Pool::Long => "long",
                        Pool::Stream => "stream",
                    },
                    held: pool.held(flow),
                    capacity: pool.capacity,
                    retry_after,
                })
            }
        }
    }

    /// Seats `flow` holds in each pool: (renew, short, long).
    pub fn held(&self, flow: &str) -> (usize, usize, usize) {
        let pools = lock(&self.pools);
        (
            pools.renew.held(flow),
            pools.short.held(flow),
            pools.long.held(flow),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(capacity: usize) -> Admission {
        Admission::new(Seats {
            renew: capacity,
            short: capacity,
            long: capacity,
            stream: capacity,
        })
    }

    fn fill(admission: &Admission, flow: &str, kind: Pool) -> Vec<Seat> {
        std::iter::from_fn(|| admission.admit(flow, kind).ok()).collect()
    }

    #[test]
    fn one_flow_alone_uses_all_but_the_headroom() {
        let admission = admission(100);
        let seats = fill(&admission, "a", Pool::Long);
        assert_eq!(seats.len(), 75);
        drop(seats);
        assert_eq!(admission.held("a"), (0, 0, 0), "seats come back on drop");
    }

    #[test]
    fn a_newcomer_finds_seats_and_the_hog_shrinks_to_its_share() {
        let admission = admission(100);
        let mut hog = fill(&admission, "hog", Pool::Short);
        assert_eq!(hog.len(), 75);
        // The newcomer gets up to its share (100 / 3 with a further
        // newcomer counted), from the headroom.
        let newcomer = fill(&admission, "victim", Pool::Short);
        assert_eq!(newcomer.len(), 25, "the whole headroom");
        // Some of the hog's requests end: over its share, it may borrow back
        // only up to the headroom mark; the victim grows to its share.
        hog.truncate(40);
        let again = fill(&admission, "hog", Pool::Short);
        assert_eq!(
            hog.len() + again.len(),
            50,
            "the hog borrows up to 75 in use"
        );
        let more = fill(&admission, "victim", Pool::Short);
        assert_eq!(
            newcomer.len() + more.len(),
            33,
            "the victim reaches 100 / 3"
        );
    }

    #[test]
    fn many_flows_each_get_a_seat_while_one_holds_its_maximum() {
        let admission = admission(64);
        let _hog = fill(&admission, "hog", Pool::Long);
        let others: Vec<Seat> = (0..16)
            .map(|i| {
                admission
                    .admit(&format!("f{i}"), Pool::Long)
                    .expect("a seat")
            })
            .collect();
        assert_eq!(others.len(), 16);
    }

    #[test]
    fn renewals_have_their_own_pool_and_may_borrow_short_seats() {
        let admission = Admission::new(Seats {
            renew: 8,
            short: 8,
            long: 8,
            stream: 8,
        });
        let _shorts = fill(&admission, "hog", Pool::Short);
        let _longs = fill(&admission, "hog", Pool::Long);
        // The hog fills what it may of short and long; the victim's
        // renewals still find seats.
        let renewals = fill(&admission, "victim", Pool::Renew);
        assert!(renewals.len() >= 6, "{}", renewals.len());
        // A hog renewing cannot take the renew pool whole either.
        let hog_renewals = fill(&admission, "hog", Pool::Renew);
        assert!(hog_renewals.len() < 8, "{}", hog_renewals.len());
    }

    #[test]
    fn a_refusal_says_who_and_where() {
        let admission = admission(4);
        let _seats = fill(&admission, "a", Pool::Long);
        let refused = admission.admit("a", Pool::Long).expect_err("over");
        assert_eq!(refused.kind, "long");
        assert_eq!(refused.capacity, 4);
        assert_eq!(refused.held, 3);
    }

    #[test]
    fn a_refusal_says_when_the_first_seat_is_due() {
        let admission = admission(4);
        let seats = fill(&admission, "a", Pool::Stream);
        let refused = admission.admit("a", Pool::Stream).expect_err("over");
        assert_eq!(
            refused.retry_after,
            Duration::from_secs(1),
            "no seat said: 1 s"
        );
        let now = Instant::now();
        seats[0].free_by(now + Duration::from_secs(100));
        seats[1].free_by(now + Duration::from_millis(2_300));
        seats[2].free_by(now + Duration::from_secs(50));
        let refused = admission.admit("a", Pool::Stream).expect_err("over");
        assert_eq!(
            refused.retry_after,
            Duration::from_secs(3),
            "the first due, rounded up"
        );
        seats[1].free_by(now + Duration::from_secs(40));
        let refused = admission.admit("a", Pool::Stream).expect_err("over");
        assert_eq!(refused.retry_after, Duration::from_secs(40), "moved");
        assert_eq!(
            admission.admit("a", Pool::Long).map(|_| ()),
            Ok(()),
            "other pools are not affected"
        );
        let mut seats = seats;
        seats.remove(1);
        let _again = admission
            .admit("a", Pool::Stream)
            .expect("the seat given back");
        let refused = admission.admit("a", Pool::Stream).expect_err("over");
        assert_eq!(
            refused.retry_after,
            Duration::from_secs(50),
            "a seat given back no longer counts"
        );
    }

    #[test]
    fn pools_fit_under_the_request_cap() {
        let seats = Seats::within(4096);
        assert!(seats.renew + seats.short + seats.long <= 2048);
        assert_eq!((seats.long, seats.renew, seats.short), (512, 256, 1280));
        assert_eq!(Seats::of(256), Seats::within(512));
    }
}
