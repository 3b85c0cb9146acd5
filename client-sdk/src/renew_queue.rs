//! Renewals of one client's leases share batches: frames of the client's
//! renewal stream (`renew_stream.rs`), or requests (`POST /v1/renew`,
//! `renew_batch.rs`) while no stream is open.
//!
//! A lease's renewal task (or a caller of `Client::renew_grant`) hands its
//! renewal to [`RenewQueue::renew`] and waits for its own answer. One task
//! per client sends them, through the client's [`Transport`]: it takes
//! every renewal queued at that moment (up to [`MAX_BATCH`] entries and
//! [`MAX_BATCH_BYTES`] of body) as one batch, with at most
//! `renew_stream::MAX_FRAMES` frames or [`MAX_IN_FLIGHT`] requests out at
//! once — so, as with group commit, a quiet client sends each renewal at
//! once and a busy one sends fewer, bigger batches. Each renewal is
//! answered on its own: one lost lease is that lease's
//! [`Error::LeaseLost`], the others renew.
//!
//! As a request, a batch of one goes to `/v1/leases/{name}/renew`; a server
//! without the batch route (404) gets each renewal of the batch on its own.
//!
//! With several partitions (once the client knows the partition map) each
//! partition's renewals queue in a lane of their own ([`send_lane`]),
//! batched as above: a batch goes as a frame of the stream on the node
//! leading the partition (one stream per node, shared by the partitions
//! it leads), or, while that stream is not open or the leader is unknown,
//! as a request (`POST /v1/renew?partition=k`, `renew_batch.rs`) to the
//! partition's leader first. A partition's failover holds up only its own
//! lane: its requests and frames out take none of the others' places.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::error::Error;
use crate::model::{Grant, GrantId};
use crate::renew_batch::{
    answer_all, entry_size, renew_one, send_batch, Pending, MAX_BATCH, MAX_BATCH_BYTES,
};
use crate::renew_stream::{RenewStream, Streams};
use crate::transport::partitions::partition_of;
use crate::transport::Transport;

/// Batch requests out at once per client (per partition, with several).
const MAX_IN_FLIGHT: usize = 4;

/// The queue of one client's renewals, above its transport; the sending
/// task starts with the first renewal and ends when the queue (the client
/// and its leases) is dropped.
#[derive(Debug)]
pub(crate) struct RenewQueue {
    /// What the batches are sent through.
    transport: Arc<Transport>,
    /// Where renewals wait for the sending task, once it runs.
    queue: std::sync::OnceLock<mpsc::UnboundedSender<Pending>>,
}

impl RenewQueue {
    /// A queue sending through `transport`.
    pub(crate) fn new(transport: Arc<Transport>) -> Self {
        Self {
            transport,
            queue: std::sync::OnceLock::new(),
        }
    }

    /// Renews `id`, whose lease is safe until `deadline` (each attempt
    /// gets a slice of the time left, `hedge.rs`): in the next batch of
    /// this client's renewals, or on its own when the client does not
    /// batch.
    pub(crate) async fn renew(&self, id: &GrantId, deadline: Instant) -> Result<Grant, Error> {
        if !self.transport.config.batch_renewals {
            return renew_one(&self.transport, id, deadline).await;
        }
        let queue = self
            .queue
            .get_or_init(|| start_sender(Arc::downgrade(&self.transport)));
        let (reply, answered) = oneshot::channel();
        let pending = Pending {
            id: id.clone(),
            deadline,
            reply,
        };
        if queue.send(pending).is_err() {
            return renew_one(&self.transport, id, deadline).await;
        }
        answered.await.unwrap_or_else(|_| {
            Err(Error::Unavailable {
                attempts: 0,
                elapsed: Duration::ZERO,
                last: "the renewal batch was dropped".into(),
            })
        })
    }
}

/// Where one batch goes: a frame of the renewal stream, or a request.
enum Out {
    Frame(Arc<RenewStream>, OwnedSemaphorePermit),
    Request(OwnedSemaphorePermit),
}

/// Starts the task that sends `transport`'s renewals; its queue. With
/// one partition (or before the map is known) every renewal goes down one
/// lane; with several, each partition's down a lane of its own
/// ([`lane`]), so a partition whose leader fails holds up only its own
/// renewals: its requests and frames out take none of the others' places.
fn start_sender(transport: Weak<Transport>) -> mpsc::UnboundedSender<Pending> {
    let (queue, mut queued) = mpsc::unbounded_channel::<Pending>();
    tokio::spawn(async move {
        let streams = Streams::new();
        let mut lanes: HashMap<Option<usize>, mpsc::UnboundedSender<Pending>> = HashMap::new();
        while let Some(pending) = queued.recv().await {
            let partitions = transport.upgrade().map_or(1, |t| {
                t.refresh_map();
                t.map().count()
            });
            let key = (partitions > 1).then(|| partition_of(&pending.id.lease, partitions));
            if key.is_some() {
                // The stream on the preferred node carried every
                // partition: its frames go again as requests.
                streams.end(None);
            }
            let lane = lanes.entry(key).or_insert_with(|| {
                let (lane, lane_queued) = mpsc::unbounded_channel();
                tokio::spawn(send_lane(
                    transport.clone(),
                    streams.clone(),
                    key,
                    lane_queued,
                ));
                lane
            });
            if let Err(unsent) = lane.send(pending) {
                answer_all(vec![unsent.0], &Err(dropped()));
            }
        }
    });
    queue
}

/// Sends the renewals of one lane: of partition `lane`, or of every
/// partition (`None`). Each batch goes as a frame of the stream on the
/// lane's node (the partition leader's endpoint, or the preferred one),
/// or as a request while no stream is open there; while all frames or
/// requests are out, renewals gather for the next.
async fn send_lane(
    transport: Weak<Transport>,
    streams: Arc<Streams>,
    lane: Option<usize>,
    mut queued: mpsc::UnboundedReceiver<Pending>,
) {
    let streaming = transport.upgrade().is_some_and(|t| {
        let config = &t.config;
        config.http2 && config.renew_stream
    });
    let requests = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut carried: Option<Pending> = None;
    loop {
        let first = match carried.take() {
            Some(pending) => pending,
            None => match queued.recv().await {
                Some(pending) => pending,
                None => return,
            },
        };
        let stream = match (streaming, lane) {
            (false, _) => None,
            (true, None) => streams.usable(&transport, None),
            (true, Some(partition)) => transport
                .upgrade()
                .and_then(|t| t.leader_endpoint(partition))
                .and_then(|at| streams.usable(&transport, Some(at))),
        };
        let frame = match stream {
            Some(stream) => stream.permit().await.map(|permit| (stream, permit)),
            None => None,
        };
        let out = match frame {
            Some((stream, permit)) => Out::Frame(stream, permit),
            None => match requests.clone().acquire_owned().await {
                Ok(permit) => Out::Request(permit),
                Err(_) => return,
            },
        };
        let (batch, rest) = gather(first, &mut queued);
        carried = rest;
        let Some(transport) = transport.upgrade() else {
            return answer_all(batch, &Err(dropped()));
        };
        match out {
            Out::Frame(stream, permit) => {
                if let Err(batch) = stream.send(batch, permit).await {
                    tokio::spawn(async move { send_batch(&transport, batch).await });
                }
            }
            Out::Request(permit) => {
                tokio::spawn(async move {
                    send_batch(&transport, batch).await;
                    drop(permit);
                });
            }
        }
    }
}

/// The client was dropped with renewals queued.
fn dropped() -> Error {
    Error::Unavailable {
        attempts: 0,
        elapsed: Duration::ZERO,
        last: "the client was dropped".into(),
    }
}

/// `first` and every renewal queued behind it, up to [`MAX_BATCH`] entries
/// and [`MAX_BATCH_BYTES`]; the first renewal that did not fit.
fn gather(
    first: Pending,
    queued: &mut mpsc::UnboundedReceiver<Pending>,
) -> (Vec<Pending>, Option<Pending>) {
    let mut bytes = entry_size(&first.id);
    let mut batch = vec![first];
    while batch.len() < MAX_BATCH {
        let Ok(pending) = queued.try_recv() else {
            break;
        };
        let size = entry_size(&pending.id);
        if bytes + size > MAX_BATCH_BYTES {
            return (batch, Some(pending));
        }
        bytes += size;
        batch.push(pending);
    }
    (batch, None)
}
