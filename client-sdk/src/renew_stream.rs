//! The renewal stream: a client's renewal batches as frames of one
//! long-lived HTTP/2 request to the leader (`POST /v1/renew/stream`, etcd's
//! LeaseKeepAlive pattern), each answered on its own line, instead of a
//! request each.
//!
//! [`Streams`] keeps at most one open per client, opening it in the
//! background when a batch finds none (and, after a refusal or a failure,
//! not again for a while: meanwhile batches go as requests).
//! [`RenewStream::send`] writes a batch as a frame; the reader answers each
//! renewal from the frame's answer line. A frame that fails whole (503:
//! leadership not confirmed, 429) and every frame still out when the stream
//! ends go again as requests, which retry across nodes: a renewal may be
//! repeated, never lost to a broken stream. A frame unanswered for its
//! slice of the time its leases have left (`hedge::slice`) ends the stream
//! (a frozen or cut-off leader): its renewals go again as requests, to
//! another node, and the next batch opens a stream on whichever node is
//! preferred then (the leader, once an answer named it).
//!
//! With several partitions a client keeps one stream per node that leads
//! partitions it renews ([`Streams::usable`] with that node's endpoint),
//! each carrying only those partitions' leases (`renew_queue.rs` splits
//! the batches): a frame is renewed by the node it reaches, with no hop.
//! A stream that breaks or falls silent forgets that node as every
//! partition's leader and asks for the partition map again; its frames go
//! again as requests, each part to its partition's leader first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use palisade_plumbing::sync::lock;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::hedge::slice;
use crate::renew_batch::{answer_all, earliest, send_batch, BatchEntry, BatchResult, Pending};
use crate::transport::answer::Answer;
use crate::transport::Transport;

/// Frames out at once on one stream (the server answers as many at once).
pub(crate) const MAX_FRAMES: usize = 8;
/// How long one stream may live on this side: past the server's hour (it
/// ends the stream first, cleanly); the next batch then opens another.
const LIFETIME: Duration = Duration::from_secs(3660);
/// After a refused or failed open, how long batches go as requests.
const REOPEN_AFTER: Duration = Duration::from_secs(1);
/// ... when the server has no stream route (an older version), or refuses
/// this client one (401, 403).
const REOPEN_REFUSED_AFTER: Duration = Duration::from_secs(300);
/// The stream's media type, both ways.
const NDJSON: &str = "application/x-ndjson";
/// How often the watchdog looks whether its stream is still there, when
/// no frame is out.
const WATCH_IDLE: Duration = Duration::from_secs(1);

/// One client's renewal streams, if open, and when to try opening each:
/// the one on the preferred node (key `None`: one partition, or the map
/// unknown), or one per partition leader's endpoint (key `Some(index)`).
#[derive(Debug)]
pub(crate) struct Streams {
    slots: Mutex<HashMap<Option<usize>, Slot>>,
}

#[derive(Debug)]
struct Slot {
    current: Option<Arc<RenewStream>>,
    opening: bool,
    next_try: Instant,
}

impl Streams {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            slots: Mutex::new(HashMap::new()),
        })
    }

    /// The open stream on endpoint `at` (`None`: the preferred one);
    /// without one, starts opening it in the background (when it is time
    /// to try) and answers `None`.
    pub(crate) fn usable(
        self: &Arc<Self>,
        transport: &Weak<Transport>,
        at: Option<usize>,
    ) -> Option<Arc<RenewStream>> {
        let mut slots = lock(&self.slots);
        let slot = slots.entry(at).or_insert_with(|| Slot {
            current: None,
            opening: false,
            next_try: Instant::now(),
        });
        if let Some(stream) = &slot.current {
            if stream.is_open() {
                return Some(stream.clone());
            }
            slot.current = None;
        }
        if !slot.opening && Instant::now() >= slot.next_try {
            slot.opening = true;
            let (this, transport) = (self.clone(), transport.clone());
            tokio::spawn(async move {
                let opened = match transport.upgrade() {
                    Some(strong) => RenewStream::open(&strong, at).await,
                    None => Err(REOPEN_AFTER),
                };
                let mut slots = lock(&this.slots);
                let Some(slot) = slots.get_mut(&at) else {
                    return;
                };
                slot.opening = false;
                match opened {
                    Ok(stream) => slot.current = Some(stream),
                    Err(after) => slot.next_try = Instant::now() + after,
                }
            });
        }
        None
    }

    /// Ends the stream keyed `at`, if open (its frames out go again as
    /// requests).
    pub(crate) fn end(&self, at: Option<usize>) {
        let stream = lock(&self.slots)
            .get_mut(&at)
            .and_then(|slot| slot.current.take());
        if let Some(stream) = stream {
            stream.end();
        }
    }
}

impl Drop for Streams {
    fn drop(&mut self) {
        // The client is gone: end the requests, so the server ends the
        // streams.
        let streams: Vec<_> = lock(&self.slots)
            .values_mut()
            .filter_map(|slot| slot.current.take())
            .collect();
        for stream in streams {
            stream.end();
        }
    }
}

/// The frames of one stream still waiting for their answer, by id (`None`
/// once the stream has ended), and the next frame's id.
#[derive(Debug, Default)]
struct Frames {
    out: Option<HashMap<u64, Out>>,
    next_id: u64,
}

/// A frame out: its renewals, its place among the frames out, and when it
/// is late (sent, plus its slice of the time its leases have left).
type Out = (Vec<Pending>, OwnedSemaphorePermit, tokio::time::Instant);

/// One open renewal stream.
#[derive(Debug)]
pub(crate) struct RenewStream {
    /// The request body's frames (`None` once ended).
    body: Mutex<Option<mpsc::Sender<Bytes>>>,
    frames: Mutex<Frames>,
    /// Frames that may be out at once; closed when the stream ends.
    permits: Arc<Semaphore>,
    transport: Weak<Transport>,
    /// Which endpoint it is open on (passed over when the stream fails:
    /// the requests that take over its renewals go elsewhere).
    at: usize,
    /// Whether it was opened on a partition leader's endpoint (then a
    /// failure also forgets that node as every partition's leader).
    routed: bool,
    /// The client's request timeout, the longest slice a frame gets.
    request_timeout: Duration,
    /// Cancelled when the stream ends: the reader drops the answer (the
    /// request is reset), whatever the server does, and the watchdog stops.
    ended: CancellationToken,
    /// Wakes the watchdog when a frame goes out (it may fall late first).
    frame_sent: Arc<Notify>,
}

/// One frame of the request.
#[derive(Serialize)]
struct Frame<'a> {
    id: u64,
    renewals: Vec<BatchEntry<'a>>,
}

/// One line of the answer: a frame's results, or how it (or, without an
/// id, the whole stream) failed.
#[derive(Deserialize)]
struct FrameAnswer {
    #[serde(default)]
    id: Option<u64>,
    status: u16,
    #[serde(default)]
    results: Option<Vec<BatchResult>>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

impl RenewStream {
    /// Opens a stream on endpoint `at` (`None`: the preferred node); on
    /// a refusal or failure, how long to wait before trying again (a
    /// refusing node is passed over).
    async fn open(transport: &Arc<Transport>, at: Option<usize>) -> Result<Arc<Self>, Duration> {
        let (preferred, url) = match at {
            Some(index) => (index, transport.url(index, "/v1/renew/stream")),
            None => transport
                .preferred_url("/v1/renew/stream")
                .ok_or(REOPEN_REFUSED_AFTER)?,
        };
        let (body, frames) = mpsc::channel::<Bytes>(MAX_FRAMES);
        let frames = futures::stream::unfold(frames, |mut frames| async move {
            let frame = frames.recv().await?;
            Some((Ok::<_, std::io::Error>(frame), frames))
        });
        let sent = transport
            .http()
            .post(&url)
            .header(reqwest::header::CONTENT_TYPE, NDJSON)
            .timeout(LIFETIME)
            .body(reqwest::Body::wrap_stream(frames))
            .send();
        let sent = tokio::time::timeout(transport.config.request_timeout, sent).await;
        let response = match sent {
            Ok(Ok(response)) if response.status() == 200 => response,
            Ok(Ok(response)) => match response.status().as_u16() {
                401 | 403 | 404 | 405 => return Err(REOPEN_REFUSED_AFTER),
                // A follower (or a node without a quorum): try the next.
                503 => {
                    transport.pass_over(preferred);
                    return Err(REOPEN_AFTER);
                }
                _ => return Err(REOPEN_AFTER),
            },
            // Unreachable, or no answer in time.
            _ => {
                match at {
                    Some(index) => transport.node_failed(index),
                    None => transport.pass_over(preferred),
                }
                return Err(REOPEN_AFTER);
            }
        };
        let stream = Arc::new(Self {
            body: Mutex::new(Some(body)),
            frames: Mutex::new(Frames {
                out: Some(HashMap::new()),
                next_id: 0,
            }),
            permits: Arc::new(Semaphore::new(MAX_FRAMES)),
            transport: Arc::downgrade(transport),
            at: preferred,
            routed: at.is_some(),
            request_timeout: transport.config.request_timeout,
            ended: CancellationToken::new(),
            frame_sent: Arc::new(Notify::new()),
        });
        tokio::spawn(stream.clone().read(response));
        tokio::spawn(watch(
            Arc::downgrade(&stream),
            stream.ended.clone(),
            stream.frame_sent.clone(),
        ));
        Ok(stream)
    }

    fn is_open(&self) -> bool {
        !self.permits.is_closed()
    }

    /// A place for one more frame, once one is free; `None` if the stream
    /// ended meanwhile.
    pub(crate) async fn permit(&self) -> Option<OwnedSemaphorePermit> {
        self.permits.clone().acquire_owned().await.ok()
    }

    /// Sends `batch` as one frame, answered by the reader; gives the batch
    /// back if the stream has ended.
    pub(crate) async fn send(
        &self,
        batch: Vec<Pending>,
        permit: OwnedSemaphorePermit,
    ) -> Result<(), Vec<Pending>> {
        let Some(body) = lock(&self.body).clone() else {
            return Err(batch);
        };
        let id = {
            let mut frames = lock(&self.frames);
            frames.next_id += 1;
            frames.next_id
        };
        let renewals = batch.iter().map(|p| (&p.id).into()).collect();
        let mut line = serde_json::to_vec(&Frame { id, renewals }).unwrap_or_default();
        line.push(b'\n');
        let now = tokio::time::Instant::now();
        let left = earliest(&batch).saturating_duration_since(now);
        let late = now + slice(self.request_timeout, left);
        match lock(&self.frames).out.as_mut() {
            Some(out) => out.insert(id, (batch, permit, late)),
            None => return Err(batch),
        };
        self.frame_sent.notify_one();
        if body.send(line.into()).await.is_ok() {
            return Ok(());
        }
        let taken = lock(&self.frames)
            .out
            .as_mut()
            .and_then(|out| out.remove(&id));
        // Not there: the reader's end took it and sends it again itself.
        taken.map_or(Ok(()), |(batch, _, _)| Err(batch))
    }

    /// Reads answer lines until the stream ends, then ends it.
    async fn read(self: Arc<Self>, mut response: reqwest::Response) {
        let mut buffer = BytesMut::new();
        'read: loop {
            while let Some(at) = buffer.iter().position(|b| *b == b'\n') {
                let line = buffer.split_to(at + 1);
                if !self.answer(&line[..at]) {
                    break 'read;
                }
            }
            let chunk = tokio::select! {
                chunk = response.chunk() => chunk,
                // Ended here (a late frame): stop reading a silent node.
                () = self.ended.cancelled() => break,
            };
            match chunk {
                Ok(Some(chunk)) => buffer.extend_from_slice(&chunk),
                Ok(None) => break,
                Err(_) => {
                    self.pass_over();
                    break;
                }
            }
        }
        self.end();
    }

    /// Answers the renewals of one answer line's frame; whether the stream
    /// goes on.
    fn answer(&self, line: &[u8]) -> bool {
        let Ok(answer) = serde_json::from_slice::<FrameAnswer>(line) else {
            return false;
        };
        // Without an id: the server's last line, naming why it ended.
        let Some(id) = answer.id else {
            if answer.status == 503 {
                self.pass_over();
            }
            return false;
        };
        let Some((batch, _permit, _)) = lock(&self.frames).out.as_mut().and_then(|o| o.remove(&id))
        else {
            return true;
        };
        match (answer.status, answer.results) {
            (200, Some(results)) if results.len() == batch.len() => {
                for (pending, result) in batch.into_iter().zip(results) {
                    if result.is_unavailable() && self.routed {
                        // The node could not reach the lease's partition
                        // leader: it is not that leader (any more), so the
                        // partition forgets it and the retry goes as a
                        // request, hedged across the nodes.
                        if let Some(transport) = self.transport.upgrade() {
                            transport.partition_unavailable(&pending.id.lease);
                        }
                    }
                    let _ = pending.reply.send(result.answer());
                }
                true
            }
            (503 | 429, _) => {
                // Leadership moved (or not confirmed), or over the share:
                // as requests, which retry; a 503 also ends this stream.
                if answer.status == 503 {
                    self.pass_over();
                }
                self.again(batch);
                answer.status == 429
            }
            (200, _) => {
                // Not one result per renewal: ask again, as requests.
                self.again(batch);
                false
            }
            (status, _) => {
                let body = json!({ "error": answer.error, "message": answer.message });
                answer_all(batch, &Err(Answer { status, body }.error()));
                true
            }
        }
    }

    /// Prefers the next node for the client's requests (and, on a
    /// partition leader's stream, forgets that node as a leader).
    fn pass_over(&self) {
        if let Some(transport) = self.transport.upgrade() {
            if self.routed {
                transport.node_failed(self.at);
            } else {
                transport.pass_over(self.at);
            }
        }
    }

    /// Sends `batch` again as a request.
    fn again(&self, batch: Vec<Pending>) {
        match self.transport.upgrade() {
            Some(transport) => {
                tokio::spawn(async move { send_batch(&transport, batch).await });
            }
            None => answer_all(batch, &Err(gone())),
        }
    }

    /// Ends the stream: no more frames (the request's body ends), and every
    /// frame still out goes again as a request.
    fn end(&self) {
        self.ended.cancel();
        self.permits.close();
        lock(&self.body).take();
        let out = lock(&self.frames).out.take();
        for (batch, _permit, _) in out.into_iter().flat_map(HashMap::into_values) {
            self.again(batch);
        }
    }
}

/// Ends `stream` when a frame goes unanswered past its slice (a frozen or
/// cut-off leader): its renewals go again as requests, hedged, and the
/// silent node is passed over. Sleeps until the first frame out falls
/// late, or another goes out, or the stream ends.
async fn watch(stream: Weak<RenewStream>, ended: CancellationToken, frame_sent: Arc<Notify>) {
    loop {
        let Some(strong) = stream.upgrade() else {
            return;
        };
        let first_late = match lock(&strong.frames).out.as_ref() {
            Some(out) => out.values().map(|(_, _, late)| *late).min(),
            None => return,
        };
        let now = tokio::time::Instant::now();
        if first_late.is_some_and(|late| late <= now) {
            strong.pass_over();
            return strong.end();
        }
        drop(strong);
        let wake = first_late.unwrap_or(now + WATCH_IDLE);
        tokio::select! {
            () = tokio::time::sleep_until(wake) => {}
            () = frame_sent.notified() => {}
            () = ended.cancelled() => return,
        }
    }
}

/// The client was dropped with renewals in flight.
fn gone() -> crate::error::Error {
    crate::error::Error::Unavailable {
        attempts: 0,
        elapsed: Duration::ZERO,
        last: "the client was dropped".into(),
    }
}
