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

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::error::Error;
use crate::model::{Grant, GrantId};
use crate::renew_batch::{entry_size, renew_one, send_batch, Pending, MAX_BATCH, MAX_BATCH_BYTES};
use crate::renew_stream::{RenewStream, Streams};
use crate::transport::Transport;

/// Batch requests out at once per client.
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

/// Starts the task that sends `transport`'s renewals; its queue.
fn start_sender(transport: Weak<Transport>) -> mpsc::UnboundedSender<Pending> {
    let (queue, mut queued) = mpsc::unbounded_channel::<Pending>();
    let streaming = transport.upgrade().is_some_and(|t| {
        let config = &t.config;
        config.http2 && config.renew_stream
    });
    tokio::spawn(async move {
        let requests = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
        let streams = Streams::new();
        let mut carried: Option<Pending> = None;
        loop {
            let first = match carried.take() {
                Some(pending) => pending,
                None => match queued.recv().await {
                    Some(pending) => pending,
                    None => return,
                },
            };
            // While all frames or requests are out, renewals gather for the
            // next.
            let stream = streaming.then(|| streams.usable(&transport)).flatten();
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
                return;
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
    });
    queue
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
