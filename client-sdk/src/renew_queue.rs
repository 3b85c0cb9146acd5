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

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::error::Error;
use crate::model::{Grant, GrantId};
use crate::transport::answer::Answer;
use crate::transport::Transport;

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

/// One renewal in a batch request's body.
#[derive(Serialize)]
struct BatchEntry<'a> {
    lease: &'a str,
    holder: &'a str,
    token: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    secret: Option<&'a str>,
}

impl<'a> From<&'a GrantId> for BatchEntry<'a> {
    fn from(id: &'a GrantId) -> Self {
        Self {
            lease: &id.lease,
            holder: &id.holder,
            token: id.token,
            secret: id.secret.as_ref().map(|s| s.expose()),
        }
    }
}

/// A batch renewal's answer, parsed straight into its types (through
/// `serde_json::Value` it took a third of the client's CPU).
#[derive(Deserialize)]
struct BatchAnswer {
    results: Vec<BatchResult>,
}

/// One renewal's answer in a batch: the grant, or the error it would have
/// had on its own.
#[derive(Deserialize)]
struct BatchResult {
    status: u16,
    #[serde(default)]
    grant: Option<Grant>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

impl BatchResult {
    fn answer(self) -> Result<Grant, Error> {
        match (self.status, self.grant) {
            (200, Some(grant)) => Ok(grant),
            (status, _) => Err(Answer {
                status,
                body: json!({ "error": self.error, "message": self.message }),
            }
            .error()),
        }
    }
}

/// Sends one batch and answers each of its renewals.
async fn send_batch(transport: &Transport, batch: Vec<Pending>) {
    if let [(id, _)] = batch.as_slice() {
        let answer = transport.renew_grant(id).await;
        if let Some((_, reply)) = batch.into_iter().next() {
            let _ = reply.send(answer);
        }
        return;
    }
    let renewals: Vec<BatchEntry<'_>> = batch.iter().map(|(id, _)| id.into()).collect();
    let answer = transport
        .election_bytes(
            reqwest::Method::POST,
            "/v1/renew",
            Some(&BatchBody { renewals }),
            Duration::ZERO,
        )
        .await;
    let results = match answer {
        Ok((200, bytes)) => match serde_json::from_slice::<BatchAnswer>(&bytes) {
            Ok(answer) if answer.results.len() == batch.len() => answer.results,
            _ => {
                let error = Error::Protocol {
                    status: 200,
                    message: "a batch renewal answered the wrong number of results".into(),
                };
                return answer_all(batch, &Err(error));
            }
        },
        Ok((status, bytes)) => {
            let answer = Answer {
                status,
                body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            };
            if status == 404 && answer.body["error"] == "not_found" {
                // An older node without the batch route: one by one.
                for (id, reply) in batch {
                    let _ = reply.send(transport.renew_grant(&id).await);
                }
                return;
            }
            return answer_all(batch, &Err(answer.error()));
        }
        Err(err) => return answer_all(batch, &Err(err)),
    };
    for ((_, reply), result) in batch.into_iter().zip(results) {
        let _ = reply.send(result.answer());
    }
}

/// A batch request's body.
#[derive(Serialize)]
struct BatchBody<'a> {
    renewals: Vec<BatchEntry<'a>>,
}

fn answer_all(batch: Vec<Pending>, answer: &Result<Grant, Error>) {
    for (_, reply) in batch {
        let _ = reply.send(answer.clone());
    }
}

/// The size of `id`'s entry in a batch body, in bytes (serialized into a
/// counter, nothing kept).
fn entry_size(id: &GrantId) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(1);
    serde_json::to_writer(&mut count, &BatchEntry::from(id)).map_or(MAX_BATCH_BYTES, |()| count.0)
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
            let mut bytes = entry_size(&first.0);
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                let Ok((id, reply)) = queued.try_recv() else {
                    break;
                };
                let size = entry_size(&id);
                if bytes + size > MAX_BATCH_BYTES {
                    carried = Some((id, reply));
                    break;
                }
                bytes += size;
                batch.push((id, reply));
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
