//! Heartbeats of every partition to one peer, carried together.
//!
//! With partitions, every group's leader sends each follower its own
//! heartbeat (an append with no entries) every heartbeat interval: N
//! partitions cost N requests per peer per interval. [`Beats`] gives each
//! peer one carrier task: a heartbeat is queued, and the carrier sends all
//! that are queued in one `POST /raft/beats` over the connections the
//! node keeps to that peer for heartbeats, then hands each group its own
//! answer. A batch waits [`GATHER`] (2 ms) after its first beat for the
//! others, unless others already queued (behind a batch in flight).
//!
//! A busy partition never delays another's heartbeat: appends that carry
//! entries (and snapshots) go on their own connections, never in a batch;
//! the receiver answers each beat its group answered within the sender's
//! wait and says of a late one that it was late (a group writing a big
//! append to disk answers no heartbeat until the write is done). A batch
//! may take as long as its latest beat may wait; a beat whose sender gave
//! up (openraft's timeout) is dropped before sending. At most two batches
//! to a peer are in flight, so a slow one does not hold up the next.
//!
//! The receiving side (`server.rs::beats`) checks each beat as the single
//! append route does: the sender speaks only for itself, in a group that
//! exists.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use openraft::error::{NetworkError, RPCError, Unreachable};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::group_id::GroupId;
use crate::raft::{NodeId, TypeConfig};

/// The route that carries a batch.
pub const BEATS_ROUTE: &str = "/raft/beats";

/// How long a carrier waits after a batch's first beat for others. At 64
/// partitions on 3 nodes (default timing, heartbeat 20 ms), waiting 2 ms
/// carried 4.6 beats a request instead of 1.8, and cut each node's idle
/// CPU from 55% of a core to 37% (BENCHMARKS.md); it costs each heartbeat
/// 2 ms of the election timeout's margin.
const GATHER: Duration = Duration::from_millis(2);

/// At most this many beats in one batch (one per partition is the most a
/// leader of every partition queues per interval).
pub const MAX_BEATS: usize = crate::group_id::MAX_PARTITIONS as usize;

/// One group's heartbeat in a batch.
#[derive(Debug, Serialize, Deserialize)]
pub struct Beat {
    pub group: u32,
    pub rpc: AppendEntriesRequest<TypeConfig>,
}

/// What one beat's group answered, in the batch's order; `Err` says why
/// it did not (its group failed, or did not answer within the batch's
/// wait: a group whose log is busy on disk answers no heartbeat until the
/// write is done, and must not hold up the others' answers).
pub type BeatAnswer = Result<AppendEntriesResponse<TypeConfig>, String>;

/// The header that tells the receiver how long it may take over a batch
/// (milliseconds): a beat not answered by then is answered `Err`.
pub const BEATS_WAIT_HEADER: &str = "x-palisade-beats-wait-ms";

/// At most this many batches to one peer in flight at once (each on its
/// own connection): a slow batch does not make every later beat wait.
const IN_FLIGHT: usize = 2;

type Answer = Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>>;

/// A beat waiting for its carrier.
pub(super) struct Queued {
    beat: Beat,
    addr: String,
    deadline: Instant,
    answer: oneshot::Sender<Answer>,
}

/// The carriers, one per peer, started on a peer's first beat.
#[derive(Debug, Default)]
pub struct Beats {
    carriers: Mutex<HashMap<NodeId, mpsc::UnboundedSender<Queued>>>,
}

/// What sends a batch to a peer (the dialer, in `client.rs`): kept apart
/// so that this file names no transport.
pub(super) trait Carry: Clone + Send + Sync + 'static {
    /// This carrier without the heartbeat carriers it belongs to (so a
    /// carrier task does not keep its own queue alive).
    fn detached(&self) -> Self;

    /// Sends `beats` to `target` at `addr`, waiting at most `wait`; their
    /// answers in order.
    fn carry(
        &self,
        target: NodeId,
        addr: &str,
        beats: &[Beat],
        wait: Duration,
    ) -> impl std::future::Future<Output = Result<Vec<BeatAnswer>, Failed>> + Send;
}

impl Beats {
    /// Sends `group`'s heartbeat `rpc` to `target` (at `addr`) with the
    /// other groups' beats to it, through `carrier`, waiting at most `ttl`.
    pub(super) async fn beat(
        &self,
        carrier: &impl Carry,
        (target, addr): (NodeId, &str),
        group: GroupId,
        (rpc, ttl): (AppendEntriesRequest<TypeConfig>, Duration),
    ) -> Answer {
        let (answer, answered) = oneshot::channel();
        let queued = Queued {
            beat: Beat {
                group: group.0,
                rpc,
            },
            addr: addr.to_owned(),
            deadline: Instant::now() + ttl,
            answer,
        };
        {
            let mut carriers = palisade_plumbing::sync::lock(&self.carriers);
            let queue = carriers.entry(target).or_insert_with(|| {
                let (queue, queued) = mpsc::unbounded_channel();
                tokio::spawn(carry(carrier.detached(), target, queued));
                queue
            });
            if let Err(mpsc::error::SendError(queued)) = queue.send(queued) {
                // The carrier ended (its runtime is shutting down): the
                // next beat starts another.
                carriers.remove(&target);
                let _ = queued
                    .answer
                    .send(Err(stopped("the heartbeat carrier stopped")));
            }
        }
        match tokio::time::timeout(ttl, answered).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(stopped("the heartbeat carrier stopped")),
            Err(_) => Err(RPCError::Network(NetworkError::from_string(format!(
                "no heartbeat answer from node {target} within {ttl:?}"
            )))),
        }
    }
}

fn stopped(why: &str) -> RPCError<TypeConfig> {
    RPCError::Network(NetworkError::from_string(why.to_owned()))
}

/// The carrier of `target`'s beats: gathers what is queued into batches
/// and sends them, at most [`IN_FLIGHT`] at once, until the node's
/// carriers are dropped.
async fn carry(carrier: impl Carry, target: NodeId, mut queue: mpsc::UnboundedReceiver<Queued>) {
    let seats = std::sync::Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    while let Some(first) = queue.recv().await {
        let mut batch = vec![first];
        gather(&mut queue, &mut batch);
        if batch.len() == 1 {
            // The other groups' beats of this interval arrive one by one,
            // as their timers fire: a moment's wait carries several in one
            // request. (Beats that queued behind a batch go at once.)
            tokio::time::sleep(GATHER).await;
            gather(&mut queue, &mut batch);
        }
        batch.retain(|queued| !queued.answer.is_closed());
        // The batch may take as long as its latest beat may wait: a beat
        // whose caller gave up earlier just loses its answer.
        let Some(deadline) = batch.iter().map(|queued| queued.deadline).max() else {
            continue;
        };
        let Ok(seat) = seats.clone().acquire_owned().await else {
            return;
        };
        let carrier = carrier.clone();
        tokio::spawn(async move {
            send(&carrier, target, batch, deadline).await;
            drop(seat);
        });
    }
}

/// Moves what `queue` holds now into `batch`, up to [`MAX_BEATS`].
fn gather(queue: &mut mpsc::UnboundedReceiver<Queued>, batch: &mut Vec<Queued>) {
    while batch.len() < MAX_BEATS {
        match queue.try_recv() {
            Ok(next) => batch.push(next),
            Err(_) => break,
        }
    }
}

/// Sends one batch (by `carrier`, within `deadline`) and hands each beat
/// its answer.
async fn send(carrier: &impl Carry, target: NodeId, batch: Vec<Queued>, deadline: Instant) {
    let Some(addr) = batch.last().map(|queued| queued.addr.clone()) else {
        return;
    };
    let (beats, answers): (Vec<Beat>, Vec<_>) = batch
        .into_iter()
        .map(|queued| (queued.beat, queued.answer))
        .unzip();
    let wait = deadline.saturating_duration_since(Instant::now());
    match carrier.carry(target, &addr, &beats, wait).await {
        Ok(answered) => {
            for (answer, got) in answers.into_iter().zip(answered) {
                let got = got.map_err(|why| RPCError::Network(NetworkError::from_string(why)));
                let _ = answer.send(got);
            }
        }
        Err(failed) => {
            for answer in answers {
                let _ = answer.send(Err(failed.again()));
            }
        }
    }
}

/// Why a batch failed, to give every beat of it the same error.
pub(super) enum Failed {
    Unreachable(String),
    Network(String),
}

impl Failed {
    fn again(&self) -> RPCError<TypeConfig> {
        match self {
            Failed::Unreachable(why) => {
                RPCError::Unreachable(Unreachable::from_string(why.clone()))
            }
            Failed::Network(why) => RPCError::Network(NetworkError::from_string(why.clone())),
        }
    }
}
