//! Renewals of one client's leases share requests (`POST /v1/renew`).
//!
//! A lease's renewal task (or a caller of `Client::renew_grant`) hands its
//! renewal to [`RenewQueue::renew`] and waits for its own answer. One task
//! per client sends them, through the client's [`Transport`]: it takes
//! every renewal queued at that moment (up to [`MAX_BATCH`] entries and
//! [`MAX_BATCH_BYTES`] of body) as one request, with at most
//! [`MAX_IN_FLIGHT`] requests out at once — so, as with group commit, a
//! quiet client sends each renewal at once and a busy one sends fewer,
//! bigger requests. Each renewal is answered on its own: one lost lease is
//! that lease's [`Error::LeaseLost`], the others renew.
//!
//! A batch of one goes to `/v1/leases/{name}/renew`; a server without the
//! batch route (404) gets each renewal of the batch on its own.

use std::sync::{Arc, Weak};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::error::Error;
use crate::model::{Grant, GrantId};
use crate::transport::answer::Answer;
use crate::transport::{grant_body, Transport};

/// The most renewals in one request (the server's cap).
pub(crate) const MAX_BATCH: usize = 256;
/// The largest batch body: under the server's 64 KiB body limit.
pub(crate) const MAX_BATCH_BYTES: usize = 60 * 1024;
/// Batch requests out at once per client.
const MAX_IN_FLIGHT: usize = 4;

/// Where a renewal's answer goes.
type Reply = oneshot::Sender<Result<Grant, Error>>;
/// A renewal waiting to be sent, and where its answer goes.
type Pending = (GrantId, Reply);
/// A renewal in a batch: with its body entry.
type Entry = (GrantId, Value, Reply);

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

    /// Renews `id`: in the next batch of this client's renewals, or on its
    /// own when the client does not batch.
    pub(crate) async fn renew(&self, id: &GrantId) -> Result<Grant, Error> {
        if !self.transport.config.batch_renewals {
            return self.transport.renew_grant(id).await;
        }
        let queue = self
            .queue
            .get_or_init(|| start_sender(Arc::downgrade(&self.transport)));
        let (answer, answered) = oneshot::channel();
        if queue.send((id.clone(), answer)).is_err() {
            return self.transport.renew_grant(id).await;
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

/// Sends one batch and answers each of its renewals.
async fn send_batch(transport: &Transport, batch: Vec<Entry>) {
    if let [(id, _, _)] = batch.as_slice() {
        let answer = transport.renew_grant(id).await;
        if let Some((_, _, reply)) = batch.into_iter().next() {
            let _ = reply.send(answer);
        }
        return;
    }
    let entries: Vec<&Value> = batch.iter().map(|(_, entry, _)| entry).collect();
    let body = json!({ "renewals": entries });
    let answer = transport
        .election(
            reqwest::Method::POST,
            "/v1/renew",
            Some(&body),
            Duration::ZERO,
        )
        .await;
    let results = match answer {
        Ok(Answer { status: 200, body }) => match body["results"].as_array() {
            Some(results) if results.len() == batch.len() => results.clone(),
            _ => {
                let error = Error::Protocol {
                    status: 200,
                    message: "a batch renewal answered the wrong number of results".into(),
                };
                return answer_all(batch, &Err(error));
            }
        },
        Ok(answer) if answer.status == 404 && answer.body["error"] == "not_found" => {
            // An older node without the batch route: one by one.
            for (id, _, reply) in batch {
                let _ = reply.send(transport.renew_grant(&id).await);
            }
            return;
        }
        Ok(answer) => return answer_all(batch, &Err(answer.error())),
        Err(err) => return answer_all(batch, &Err(err)),
    };
    for ((_, _, reply), result) in batch.into_iter().zip(results) {
        let status = result["status"].as_u64().unwrap_or(0);
        let answer = if status == 200 {
            Answer {
                status: 200,
                body: result["grant"].clone(),
            }
            .parse()
        } else {
            Err(Answer {
                status: u16::try_from(status).unwrap_or(0),
                body: result,
            }
            .error())
        };
        let _ = reply.send(answer);
    }
}

fn answer_all(batch: Vec<Entry>, answer: &Result<Grant, Error>) {
    for (_, _, reply) in batch {
        let _ = reply.send(answer.clone());
    }
}

/// The body entry of `id` and its size in bytes.
fn entry(id: &GrantId) -> (Value, usize) {
    let mut entry = grant_body(id, false);
    entry["lease"] = json!(id.lease);
    let size = serde_json::to_vec(&entry).map_or(MAX_BATCH_BYTES, |bytes| bytes.len() + 1);
    (entry, size)
}

/// Starts the task that sends `transport`'s renewals; its queue.
fn start_sender(transport: Weak<Transport>) -> mpsc::UnboundedSender<Pending> {
    let (queue, mut queued) = mpsc::unbounded_channel::<Pending>();
    tokio::spawn(async move {
        let permits = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
        let mut carried: Option<Pending> = None;
        loop {
            let first = match carried.take() {
                Some(pending) => pending,
                None => match queued.recv().await {
                    Some(pending) => pending,
                    None => return,
                },
            };
            // While all requests are out, renewals gather for the next.
            let Ok(permit) = permits.clone().acquire_owned().await else {
                return;
            };
            let (value, mut bytes) = entry(&first.0);
            let mut batch = vec![(first.0, value, first.1)];
            while batch.len() < MAX_BATCH {
                let Ok((id, reply)) = queued.try_recv() else {
                    break;
                };
                let (value, size) = entry(&id);
                if bytes + size > MAX_BATCH_BYTES {
                    carried = Some((id, reply));
                    break;
                }
                bytes += size;
                batch.push((id, value, reply));
            }
            let Some(transport) = transport.upgrade() else {
                return;
            };
            tokio::spawn(async move {
                send_batch(&transport, batch).await;
                drop(permit);
            });
        }
    });
    queue
}
