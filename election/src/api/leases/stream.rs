//! `POST /v1/renew/stream`: a client's renewals over one long-lived
//! stream (etcd's LeaseKeepAlive pattern), for clients that hold leases and
//! renew all the time (the Rust SDK).
//!
//! The request body is a sequence of frames, one JSON object per line:
//! `{"id": 7, "renewals": [...]}`, with the entries of `POST /v1/renew`.
//! The answer is one line per frame, sent as each is done:
//! `{"id": 7, "status": 200, "results": [...]}`, or the status, error and
//! message the whole frame failed with (503 when leadership cannot be
//! confirmed, 429 over the caller's share, 400 for a frame outside the
//! rules). Frames are answered in the order their confirmations finish,
//! each naming its id. Every frame is answered on the leader lease, exactly
//! as a batch request is (`raft::lease`: at once while a quorum
//! acknowledged the leader recently enough, after the next acknowledgement
//! otherwise), so a deposed leader renews nothing; a stream saves the
//! per-request work (headers, routing, admission, a request's
//! bookkeeping).
//!
//! Bounds: only the leader serves a stream, over HTTP/2 only (elsewhere a
//! 503 at once: the client renews through `POST /v1/renew`, which is
//! forwarded; over HTTP/1.1 a 400); a stream holds a seat of the caller's
//! share of the `stream` pool for as long as its answer is open, and each
//! frame a `renew` seat while it is answered; at most
//! [`MAX_FRAMES_IN_FLIGHT`] frames of a stream are answered at once (the
//! next is read only then), so at most that many answers wait for a client
//! that does not read them; a stream whose lines are not taken within the
//! body deadline (an HTTP/2 window the client never opens, however little
//! it sent: `outbox.rs`) is ended and its seat freed at once (hyper never
//! polls an answer it cannot send again, so a seat held by the answer would
//! stay taken for as long as the client kept its connection up; the
//! connection itself is left alone: other requests share it); a frame is
//! at most 64 KiB and must arrive whole within the body deadline; a stream
//! ends after [`IDLE`] without a frame (blank lines do not count), after
//! [`LIFETIME`] in any case, when its node stops leading, and when a policy
//! reload revokes the key (or the principal) it was opened with
//! (`revocation.rs`). A stream that ends early, for an unreadable frame or
//! any of these, sends a last line naming why (no `id`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, BodyDataStream, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use bytes::BytesMut;
use futures::StreamExt;
use http::{header, HeaderMap, Version};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, Semaphore};

use palisade_serve::admission::Pool;
use palisade_serve::policy::Principal;

use super::super::admit::{seat, Flow};
use super::super::extract::{has_media_type, parse_json, MAX_BODY_BYTES};
use super::super::partitions::Caller;
use super::super::revocation::{revoked, Revocation};
use super::super::state::ApiState;
use super::batch::across_partitions;
use super::bodies::{check_renewals, BatchRenewal, RenewResult};
use super::outbox::{watchdog, Answer, Outbox};
use super::renew::{all_ended, renew_each};
use crate::error::ApiError;
use crate::raft::Acting;

/// Frames of one stream answered at once.
pub const MAX_FRAMES_IN_FLIGHT: usize = 8;
/// A stream that sends no frame for this long ends (the client opens a new
/// one when it next renews).
pub const IDLE: Duration = Duration::from_secs(120);
/// The longest a stream is read; then it ends (the client opens another).
pub const LIFETIME: Duration = Duration::from_secs(3600);
/// The media type of both directions.
pub const NDJSON: &str = "application/x-ndjson";

/// One frame of the request: renewals, answered together.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RenewFrame {
    /// The client's name for the frame, repeated in its answer.
    id: u64,
    renewals: Vec<BatchRenewal>,
}

/// A frame's renewals' answers: renewed here (one partition), or put
/// together from several partitions' leaders (`renew.rs`,
/// `across_partitions`).
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum FrameResults {
    Here(Vec<RenewResult>),
    Across(Vec<serde_json::Value>),
}

/// One line of the answer.
#[derive(Debug, Serialize)]
struct FrameAnswer {
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<u64>,
    status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    results: Option<FrameResults>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
}

impl FrameAnswer {
    /// The whole frame `id` (or the stream, without one) failed with `err`.
    fn failed(id: Option<u64>, err: &ApiError) -> Self {
        let body = err.body();
        Self {
            id,
            status: err.status().as_u16(),
            results: None,
            error: Some(body.error),
            message: Some(body.message),
        }
    }

    /// The answer as one line (its newline goes apart: `outbox.rs`).
    fn line(&self) -> Bytes {
        serde_json::to_vec(self).unwrap_or_default().into()
    }
}

/// Opens a renewal stream (see the module's doc).
pub(in crate::api) async fn renew_stream(
    State(state): State<ApiState>,
    principal: Option<Extension<Principal>>,
    flow: Option<Extension<Flow>>,
    revocation: Option<Extension<Revocation>>,
    version: Version,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    if !has_media_type(&headers, NDJSON) {
        return Err(ApiError::BadRequest(format!(
            "Content-Type must be {NDJSON}: one JSON frame per line"
        )));
    }
    if version != Version::HTTP_2 {
        // Only HTTP/2 shows whether the client takes its answers (its
        // flow-control window) and finds a peer gone (pings).
        return Err(ApiError::BadRequest(
            "the renewal stream is served over HTTP/2 only; renew through POST /v1/renew".into(),
        ));
    }
    // One partition: the leader's alone. Several: any node, which
    // renews each partition's leases itself when it leads the partition,
    // else asks its leader (`renew.rs`, `across_partitions`).
    if state.partitions() == 1 {
        match state.group_zero().acting_now().await {
            Acting::Leads => {}
            Acting::Follows => return Err(not_leading()),
            Acting::Lapsed { since } => return Err(crate::group::lapsed(since)),
        }
    }
    let Some(Extension(flow)) = flow else {
        return Err(ApiError::Internal(
            "a stream admitted without a flow".into(),
        ));
    };
    // A stream counts until its client has its whole answer, or until it is
    // given up on (`Outbox::give_up`).
    let seat = seat(&state, &state.admission, &flow, Pool::Stream)?;
    let ends = Instant::now() + LIFETIME;
    let deadline = state.config.body_deadline;
    let first_idle = (Instant::now() + IDLE).min(ends);
    let outbox = Arc::new(Outbox::new(seat, flow.label(), deadline, first_idle));
    state.metrics.renew_streams.inc();
    let (lines, answers) = mpsc::channel::<Bytes>(1);
    let revocation = revocation.map(|Extension(r)| r);
    let session = Arc::new(StreamSession {
        state,
        principal: principal.map(|Extension(p)| p),
        flow,
        revocation: revocation.clone(),
        outbox: outbox.clone(),
        ends,
    });
    tokio::spawn(watchdog(Arc::downgrade(&outbox)));
    tokio::spawn(session.read(body.into_data_stream(), lines, revocation));
    let answer = Body::from_stream(Answer::new(answers, outbox));
    Ok(([(header::CONTENT_TYPE, NDJSON)], answer).into_response())
}

/// 503: this node does not lead (or stopped leading).
fn not_leading() -> ApiError {
    ApiError::NoQuorum(
        "this node does not lead: open the renewal stream on the leader, or renew through \
         POST /v1/renew (forwarded to it)"
            .into(),
    )
}

/// What the frames of one stream share.
struct StreamSession {
    state: ApiState,
    principal: Option<Principal>,
    /// Whose seats its frames take.
    flow: Flow,
    /// What let the stream through, under a policy: each frame is checked
    /// against the policy in force before it renews anything.
    revocation: Option<Revocation>,
    /// The answer's lines and the stream's seat.
    outbox: Arc<Outbox>,
    /// When the stream stops reading in any case ([`LIFETIME`]).
    ends: Instant,
}

impl StreamSession {
    /// Reads and answers frames (see [`StreamSession::read_frames`]); then,
    /// however the stream ended, waits for the frames being answered. The
    /// seat goes with the answer once its client has taken every line, or
    /// is freed by the watchdog (`outbox.rs`) when lines wait untaken for
    /// the body deadline.
    async fn read(
        self: Arc<Self>,
        data: BodyDataStream,
        lines: mpsc::Sender<Bytes>,
        revocation: Option<Revocation>,
    ) {
        let frames = Arc::new(Semaphore::new(MAX_FRAMES_IN_FLIGHT));
        self.read_frames(&frames, data, lines, revocation).await;
        let all = u32::try_from(MAX_FRAMES_IN_FLIGHT).unwrap_or(u32::MAX);
        let _answered = frames.acquire_many(all).await;
        self.outbox.reading_until(None);
    }

    /// Reads frames until the body ends, idles, breaks, outlives
    /// [`LIFETIME`], is told to stop, the node stops leading, or a reload
    /// revokes what let the stream through, answering each on its own task
    /// into `lines`.
    async fn read_frames(
        self: &Arc<Self>,
        frames: &Arc<Semaphore>,
        mut data: BodyDataStream,
        lines: mpsc::Sender<Bytes>,
        mut revocation: Option<Revocation>,
    ) {
        let mut buffer = BytesMut::new();
        let deadline = self.state.config.body_deadline;
        let mut idle_until = (Instant::now() + IDLE).min(self.ends);
        loop {
            let next = async {
                let permit = frames.clone().acquire_owned().await.ok()?;
                let frame = next_frame(&mut data, &mut buffer, deadline, idle_until).await;
                Some((permit, frame))
            };
            let (permit, bytes) = tokio::select! {
                next = next => match next {
                    Some((permit, Ok(Some(bytes)))) => (permit, bytes),
                    Some((_, Err(err))) => return self.last_line(&lines, &err, deadline).await,
                    _ => return,
                },
                () = self.outbox.stop.notified() => return,
                err = revoked(revocation.as_mut()) => {
                    return self.last_line(&lines, &err, deadline).await;
                }
            };
            idle_until = (Instant::now() + IDLE).min(self.ends);
            self.outbox.reading_until(Some(idle_until));
            if self.state.partitions() == 1 && !self.state.group_zero().is_leader() {
                return self.last_line(&lines, &not_leading(), deadline).await;
            }
            let frame: RenewFrame = match parse_json(&bytes) {
                Ok(frame) => frame,
                Err(err) => return self.last_line(&lines, &err, deadline).await,
            };
            let (session, lines) = (self.clone(), lines.clone());
            tokio::spawn(async move {
                let answer = session.answer(frame).await;
                session.send(&lines, answer.line(), deadline).await;
                drop(permit);
            });
        }
    }

    /// Sends one line of the answer; a client that leaves it unsent for
    /// `deadline` (the answer holds one line and hyper another) is given
    /// up on.
    async fn send(&self, lines: &mpsc::Sender<Bytes>, line: Bytes, deadline: Duration) {
        self.outbox.handed();
        if tokio::time::timeout(deadline, lines.send(line))
            .await
            .is_err()
        {
            self.outbox.give_up("its answers were not taken");
        }
    }

    /// Sends the line that ends a stream early.
    async fn last_line(&self, lines: &mpsc::Sender<Bytes>, err: &ApiError, deadline: Duration) {
        self.send(lines, FrameAnswer::failed(None, err).line(), deadline)
            .await;
    }

    /// Answers one frame: a renewal seat, the leader lease, then each
    /// renewal as `POST /v1/renew` would.
    async fn answer(&self, frame: RenewFrame) -> FrameAnswer {
        let started = Instant::now();
        let id = Some(frame.id);
        if let Err(err) = check_renewals(&frame.renewals) {
            return FrameAnswer::failed(id, &err);
        }
        let state = &self.state;
        let _seat = match seat(state, &state.admission, &self.flow, Pool::Renew) {
            Ok(seat) => seat,
            Err(err) => return FrameAnswer::failed(id, &err),
        };
        if let Some(Err(err)) = self.revocation.as_ref().map(Revocation::check_now) {
            return FrameAnswer::failed(id, &err);
        }
        let results = if state.partitions() == 1 {
            if !all_ended(state, &frame.renewals) {
                if let Err(err) = state.group_zero().confirm_lease().await {
                    return FrameAnswer::failed(id, &err);
                }
            }
            FrameResults::Here(renew_each(
                state,
                self.principal.as_ref(),
                frame.renewals,
                started,
            ))
        } else {
            let caller = Caller {
                principal: self.principal.clone(),
                flow: Some(self.flow.clone()),
            };
            FrameResults::Across(
                across_partitions(state, &caller, frame.renewals, (started, true)).await,
            )
        };
        FrameAnswer {
            id,
            status: 200,
            results: Some(results),
            error: None,
            message: None,
        }
    }
}

/// The next frame of `data` (a line, without its newline; blank lines
/// skipped): `None` when the body ends, or reaches `idle_until` between
/// frames. A frame over 64 KiB, or one that starts but does not arrive
/// whole within `deadline`, is an error.
async fn next_frame(
    data: &mut BodyDataStream,
    buffer: &mut BytesMut,
    deadline: Duration,
    idle_until: Instant,
) -> Result<Option<Bytes>, ApiError> {
    let mut searched = 0;
    let mut started: Option<Instant> = None;
    loop {
        if let Some(at) = buffer[searched..].iter().position(|b| *b == b'\n') {
            let line = buffer.split_to(searched + at + 1).freeze();
            searched = 0;
            started = None;
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            if line.len() > MAX_BODY_BYTES + 1 {
                return Err(too_large());
            }
            return Ok(Some(line.slice(..line.len() - 1)));
        }
        searched = buffer.len();
        if buffer.len() > MAX_BODY_BYTES {
            return Err(too_large());
        }
        let partial = !buffer.iter().all(u8::is_ascii_whitespace);
        if partial && started.is_none() {
            started = Some(Instant::now());
        }
        let wait = started.map_or_else(
            || idle_until.saturating_duration_since(Instant::now()),
            |at| deadline.saturating_sub(at.elapsed()),
        );
        match tokio::time::timeout(wait, data.next()).await {
            Ok(Some(Ok(chunk))) => buffer.extend_from_slice(&chunk),
            Ok(Some(Err(err))) => {
                return Err(ApiError::BadRequest(format!("the stream broke: {err}")));
            }
            Ok(None) if partial => return Ok(Some(buffer.split().freeze())),
            Ok(None) => return Ok(None),
            Err(_) if partial => {
                return Err(ApiError::RequestTimeout(format!(
                    "a frame did not arrive whole within {} ms",
                    deadline.as_millis()
                )));
            }
            Err(_) => return Ok(None),
        }
    }
}

fn too_large() -> ApiError {
    ApiError::BadRequest(format!("a frame is larger than {MAX_BODY_BYTES} bytes"))
}
