//! A batch of renewals sent as one request (`POST /v1/renew`), each
//! answered on its own: the request form of the renewal queue's batches
//! (`renew_queue.rs`), and where the renewal stream (`renew_stream.rs`)
//! sends a frame's renewals again when the stream fails them. Every
//! renewal request is hedged (`hedge.rs`), bounded by the earliest safe
//! deadline among its renewals. With several partitions a batch is split
//! by partition, each part sent as `POST /v1/renew?partition=k` to that
//! partition's leader first, so one partition's failover delays only its
//! own part.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::error::Error;
use crate::hedge;
use crate::model::{Grant, GrantId};
use crate::transport::answer::Answer;
use crate::transport::partitions::partition_of;
use crate::transport::{grant_body, Target, Transport};

/// The most renewals in one request (the server's cap).
pub(crate) const MAX_BATCH: usize = 256;
/// The largest batch body: under the server's 64 KiB body limit.
pub(crate) const MAX_BATCH_BYTES: usize = 60 * 1024;

/// Where a renewal's answer goes.
pub(crate) type Reply = oneshot::Sender<Result<Grant, Error>>;

/// A renewal waiting to be sent, and where its answer goes.
#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) id: GrantId,
    /// The lease's safe deadline: what each attempt's slice is cut from.
    pub(crate) deadline: Instant,
    pub(crate) reply: Reply,
}

/// The earliest safe deadline among `batch`'s renewals (the one the
/// batch must beat).
pub(crate) fn earliest(batch: &[Pending]) -> Instant {
    batch
        .iter()
        .map(|pending| pending.deadline)
        .min()
        .unwrap_or_else(Instant::now)
}

/// One renewal as its own request (`/v1/leases/{name}/renew`), hedged,
/// until `deadline`.
pub(crate) async fn renew_one(
    transport: &Transport,
    id: &GrantId,
    deadline: Instant,
) -> Result<Grant, Error> {
    let body = grant_body(id, false);
    let path = format!("/v1/leases/{}/renew", id.lease);
    let target = transport.target(&id.lease, true);
    let (status, bytes) = hedge::renewal(transport, target, &path, &body, deadline).await?;
    Answer {
        status,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    }
    .parse()
}

/// One renewal in a batch request's body.
#[derive(Serialize)]
pub(crate) struct BatchEntry<'a> {
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
pub(crate) struct BatchResult {
    status: u16,
    #[serde(default)]
    grant: Option<Grant>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

impl BatchResult {
    /// Whether the renewal failed for want of its partition's leader (503).
    pub(crate) fn is_unavailable(&self) -> bool {
        self.status == 503
    }

    pub(crate) fn answer(self) -> Result<Grant, Error> {
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

/// Sends one batch and answers each of its renewals: split by partition
/// when the cluster has several (each part on its own, at once), whole
/// otherwise.
pub(crate) async fn send_batch(transport: &Transport, batch: Vec<Pending>) {
    transport.refresh_map();
    let count = transport.map().count();
    if count < 2 {
        return send_part(transport, None, batch).await;
    }
    let mut parts: std::collections::BTreeMap<usize, Vec<Pending>> = Default::default();
    for pending in batch {
        let partition = partition_of(&pending.id.lease, count);
        parts.entry(partition).or_default().push(pending);
    }
    let sends = parts.into_iter().map(|(partition, part)| {
        let target = Target {
            partition,
            leader_only: true,
        };
        send_part(transport, Some(target), part)
    });
    futures::future::join_all(sends).await;
}

/// Sends `batch` (all of `target`'s partition, if it has one) as one
/// request and answers each of its renewals.
async fn send_part(transport: &Transport, target: Option<Target>, batch: Vec<Pending>) {
    if let [one] = batch.as_slice() {
        let answer = renew_one(transport, &one.id, one.deadline).await;
        if let Some(one) = batch.into_iter().next() {
            let _ = one.reply.send(answer);
        }
        return;
    }
    let renewals: Vec<BatchEntry<'_>> = batch.iter().map(|p| (&p.id).into()).collect();
    let body = BatchBody { renewals };
    let path = match target {
        Some(target) => format!("/v1/renew?partition={}", target.partition),
        None => "/v1/renew".to_owned(),
    };
    let answer = hedge::renewal(transport, target, &path, &body, earliest(&batch)).await;
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
                for pending in batch {
                    let answer = renew_one(transport, &pending.id, pending.deadline).await;
                    let _ = pending.reply.send(answer);
                }
                return;
            }
            return answer_all(batch, &Err(answer.error()));
        }
        Err(err) => return answer_all(batch, &Err(err)),
    };
    for (pending, result) in batch.into_iter().zip(results) {
        let _ = pending.reply.send(result.answer());
    }
}

/// A batch request's body.
#[derive(Serialize)]
struct BatchBody<'a> {
    renewals: Vec<BatchEntry<'a>>,
}

pub(crate) fn answer_all(batch: Vec<Pending>, answer: &Result<Grant, Error>) {
    for pending in batch {
        let _ = pending.reply.send(answer.clone());
    }
}

/// The size of `id`'s entry in a batch body, in bytes (serialized into a
/// counter, nothing kept).
pub(crate) fn entry_size(id: &GrantId) -> usize {
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
