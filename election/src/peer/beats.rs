//! Heartbeats of every partition to one peer, carried together.
//!
//! With partitions, every group's leader sends each follower its own
//! heartbeat (an append with no entries) every heartbeat interval: N
//! partitions cost N requests per peer per interval. [`Beats`] gives each
//! peer one carrier task: a heartbeat is queued, and the carrier sends all
//! that are queued in one `POST /raft/beats` over the one connection the
//! node keeps to that peer for heartbeats, then hands each group its own
//! answer. A batch waits [`GATHER`] (2 ms) after its first beat for the
//! others, and while one batch is in flight the next gathers.
//!
//! A busy partition never delays another's heartbeat: appends that carry
//! entries (and snapshots) go on their own connections, never in a batch.
//! A batch waits at most the shortest deadline among its beats; a beat
//! whose sender gave up (openraft's timeout) is dropped before sending.
//!
//! The receiving side (`server.rs::beats`) checks each beat as the single
//! append route does: the sender speaks only for itself, in a group that
//! exists.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use openraft::error::{NetworkError, RPCError, RaftError, Unreachable};
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

/// What one beat's group answered, in the batch's order.
pub type BeatAnswer = Result<AppendEntriesResponse<TypeConfig>, RaftError<TypeConfig>>;

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
                tokio::spawn(carry(carrier.clone(), target, queued));
                queue
            });
            if let Err(mpsc::error::SendError(queued)) = queue.send(queued) {
                // The carrier ended (its runtime is shutting down).
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

/// The carrier of `target`'s beats: sends what is queued, one batch at a
/// time, until the node's dialer is gone.
async fn carry(carrier: impl Carry, target: NodeId, mut queue: mpsc::UnboundedReceiver<Queued>) {
    while let Some(first) = queue.recv().await {
        // The other groups' beats of this interval arrive one by one, as
        // their timers fire: a moment's wait carries several in one request.
        tokio::time::sleep(GATHER).await;
        let mut batch = vec![first];
        while batch.len() < MAX_BEATS {
            match queue.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        batch.retain(|queued| !queued.answer.is_closed());
        let Some(deadline) = batch.iter().map(|queued| queued.deadline).min() else {
            continue;
        };
        let addr = batch[batch.len() - 1].addr.clone();
        let (beats, answers): (Vec<Beat>, Vec<_>) = batch
            .into_iter()
            .map(|queued| (queued.beat, queued.answer))
            .unzip();
        let wait = deadline.saturating_duration_since(Instant::now());
        match carrier.carry(target, &addr, &beats, wait).await {
            Ok(answered) => {
                for (answer, got) in answers.into_iter().zip(answered) {
                    let _ =
                        answer.send(got.map_err(|e| RPCError::Unreachable(Unreachable::new(&e))));
                }
            }
            Err(failed) => {
                for answer in answers {
                    let _ = answer.send(Err(failed.again()));
                }
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
