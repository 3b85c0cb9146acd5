//! `GET /v1/watch?prefix=&index=&keepalive_ms=`: one stream of the changes
//! to every lease whose name starts with `prefix`, served from this node's
//! applied state (any node, as the single watch).
//!
//! The answer is `application/x-ndjson`, one JSON object per line:
//! - `{"index": I, "lease": {...}}`: a lease as `GET /v1/leases/{name}`
//!   shows it, changed by the entry at `I` (its `modify_index`);
//! - `{"index": I, "lease_name": "a.b", "deleted": true}`: the record was
//!   reclaimed by the entry at `I` (a free lease forgotten; one reclaim
//!   removes several at once, each a line with the same `I`);
//! - `{"index": I}`: a keep-alive, every `keepalive_ms` (default 10 000):
//!   every change up to `I` under the prefix has been sent, so `I` is where
//!   to resume from;
//! - `{"index": I, "error": CODE, "message": ...}`: the last line of a
//!   stream that ends early — `behind` (the client fell more than
//!   [`FEED_CAPACITY`] changes behind), `unauthorized` / `forbidden` (a
//!   policy reload took away what let it through). Resume from `I`.
//!
//! First come the leases changed after `index` (default 0: all of them),
//! in index order, each in its current state (a lease changed twice since
//! shows once, as it is now; records reclaimed meanwhile are not replayed),
//! then every change as it applies. `index` therefore works like a
//! single watch's: pass the last line's `index` to resume.
//!
//! Partitions: each partition has its own log, so its changes carry its
//! own indexes. With `partition=k` the stream follows partition `k` alone,
//! as above. Without it on a cluster of N > 1 partitions (or with
//! `indexes=` on any cluster) it follows every partition at once: every
//! line adds `"partition": k`, its `index` is partition `k`'s, each
//! partition sends its own keep-alives (partition 0 every `keepalive_ms`,
//! the others only when their index moved since their last: an idle
//! cluster of 64 partitions sends one line per period, not 64), and a
//! client resumes with
//! `indexes=I0,I1,...` (the last `index` it read of each partition, in
//! partition order; absent ones are 0; `index=0` is all 0 as well).
//! Within a partition lines come in index order; across partitions in no
//! set order. A last line (`behind`, a revocation) names its partition and
//! ends the whole stream.
//!
//! Bounds: the stream holds a seat of the caller's `long` pool (as a single
//! watch does) and one of the node's `max_waiters` permits for as long as it
//! is open; the node keeps at most one line per partition followed in
//! hand. A client that takes no line for the body deadline is dropped
//! without another line (it does not read them); one that reads but falls
//! more than [`FEED_CAPACITY`] changes behind gets the `behind` line.

use std::convert::Infallible;
use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use http::header;
use palisade_names::LeaseName;
use palisade_serve::admission::{Pool, Seat};
use serde_json::json;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, mpsc, watch, OwnedSemaphorePermit};

use super::admit::{seat, Flow};
use super::leases::stream::NDJSON;
use super::reads::LeaseView;
use super::revocation::{revoked, Revocation};
use super::schema::ReadErrors;
use super::state::ApiState;
use crate::error::ApiError;
use crate::group_id::GroupId;
use crate::raft::feed::{Change, FEED_CAPACITY};

mod query;
use query::PrefixWatchQuery;

/// The keep-alive period when the query names none.
pub const KEEPALIVE_MS: u64 = 10_000;

/// One line of the answer; a last line ends the stream (every partition's
/// watcher then finds the stream closed).
#[derive(Debug)]
struct Line {
    bytes: Bytes,
    last: bool,
}

/// One stream of every change to the leases under `prefix` after `index`.
///
/// Any node serves it from its applied state. First each lease under the
/// prefix changed after `index`, in index order, as it is now; then every
/// change as it applies; a keep-alive `{"index": N}` every `keepalive_ms`
/// (every change up to N was sent: resume from N). Pass the last line's
/// `index` to resume. The stream holds one of the caller's `long` seats
/// (as a single watch). `partition=k` follows partition `k` alone; without
/// it, on a cluster of several partitions, every partition is followed,
/// each line names its `partition`, and `indexes=I0,I1,...` (one per
/// partition) resumes. A client that falls more than 4096 changes behind
/// gets a last line `{"index", "error": "behind", "message"}`, one whose
/// right a policy reload removed a last `unauthorized` or `forbidden`
/// line, and one that takes no line for the body deadline is dropped.
#[utoipa::path(get, path = "/v1/watch", tag = "leases", params(PrefixWatchQuery),
    responses(ReadErrors, (status = 200, content_type = "application/x-ndjson",
        description = "One JSON object per line: {\"index\", \"lease\"} per change, \
        {\"index\", \"lease_name\", \"deleted\": true} per reclaimed record, {\"index\"} \
        as a keep-alive, {\"index\", \"error\", \"message\"} as the last line of a stream \
        that ends early; a watch of every partition adds \"partition\" to each line")))]
pub(super) async fn watch_prefix(
    State(state): State<ApiState>,
    flow: Option<Extension<Flow>>,
    revocation: Option<Extension<Revocation>>,
    query: Result<Query<PrefixWatchQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::BadRequest(format!("bad query: {e}")))?;
    let keepalive = query.keepalive_ms.unwrap_or(KEEPALIVE_MS);
    if !(100..=60_000).contains(&keepalive) {
        return Err(ApiError::BadRequest(
            "keepalive_ms must be in 100..=60000".into(),
        ));
    }
    let Some(Extension(flow)) = flow else {
        return Err(ApiError::Internal("a watch admitted without a flow".into()));
    };
    let (plan, tagged) = query.plan(state.partitions())?;
    let held = Arc::new((
        state.waiter()?,
        seat(&state, &state.admission, &flow, Pool::Long)?,
    ));
    let (lines, mut answer) = mpsc::channel::<Line>(plan.len());
    let prefix = query.prefix.unwrap_or_default();
    let stop = Arc::new(watch::channel(false).0);
    for (group, cursor) in plan {
        let watcher = Watcher {
            group,
            tagged,
            kept_alive_at: None,
            prefix: prefix.clone(),
            cursor,
            keepalive: Duration::from_millis(keepalive),
            deadline: state.config.body_deadline,
            // Subscribed before the table is read: no change falls in between.
            feed: state.group_of(group).applied.feed.subscribe(),
            state: state.clone(),
            lines: lines.clone(),
            stopped: stop.subscribe(),
            stop: stop.clone(),
            revocation: revocation.clone().map(|Extension(r)| r),
            _held: held.clone(),
        };
        tokio::spawn(watcher.run());
    }
    let mut ended = false;
    let body = futures::stream::poll_fn(move |cx| {
        if ended {
            return std::task::Poll::Ready(None);
        }
        answer.poll_recv(cx).map(|line| {
            line.map(|Line { bytes, last }| {
                if last {
                    // Every other partition's watcher finds the stream closed.
                    ended = true;
                    answer.close();
                }
                Ok::<_, Infallible>(bytes)
            })
        })
    });
    Ok(([(header::CONTENT_TYPE, NDJSON)], Body::from_stream(body)).into_response())
}

/// One open prefix watch: the task that writes its lines.
#[derive(Debug)]
struct Watcher {
    state: ApiState,
    /// The partition watched.
    group: GroupId,
    /// Whether each line names the partition (a watch of every partition).
    tagged: bool,
    /// The index the last keep-alive named.
    kept_alive_at: Option<u64>,
    prefix: String,
    /// Every change under the prefix up to here has been sent.
    cursor: u64,
    keepalive: Duration,
    /// How long one line may wait for the client to take it.
    deadline: Duration,
    feed: broadcast::Receiver<Arc<Change>>,
    lines: mpsc::Sender<Line>,
    /// Set by the first of a stream's watchers to end: a stream never goes
    /// on without one of its partitions (the client would miss its
    /// changes unawares), so the others end too.
    stop: Arc<watch::Sender<bool>>,
    stopped: watch::Receiver<bool>,
    revocation: Option<Revocation>,
    /// The node's waiting permit and the caller's seat, shared by every
    /// partition's watcher of one stream and given back when the last ends.
    _held: Arc<(OwnedSemaphorePermit, Seat)>,
}

/// Why a stream ended.
#[derive(Debug)]
enum End {
    /// The client went away, or took no line for the body deadline: no
    /// line can reach it.
    Gone,
    /// The client fell too far behind the feed.
    Behind,
    /// A policy reload took away what let the call through.
    Revoked(ApiError),
}

/// What the watcher does next.
enum Next {
    Change(Result<Arc<Change>, RecvError>),
    KeepAlive,
    Revoked(ApiError),
    Gone,
}

impl Watcher {
    async fn run(mut self) {
        let end = match self.stream().await {
            Ok(()) | Err(End::Gone) => return,
            Err(end) => end,
        };
        let line = match end {
            End::Behind => json!({
                "index": self.cursor,
                "error": "behind",
                "message": format!(
                    "this watch fell more than {FEED_CAPACITY} changes behind: \
                     resume from index {}", self.cursor
                ),
            }),
            End::Revoked(err) => {
                let mut body = serde_json::to_value(err.body()).unwrap_or_default();
                body["index"] = json!(self.cursor);
                body
            }
            End::Gone => return,
        };
        // The last line: no revocation cuts it short any more.
        self.revocation = None;
        let _ = self.send(line, true).await;
    }

    /// The catch-up, then the changes as they apply.
    async fn stream(&mut self) -> Result<(), End> {
        self.catch_up().await?;
        let mut keepalive =
            tokio::time::interval_at(tokio::time::Instant::now() + self.keepalive, self.keepalive);
        // A keep-alive late for a slow client is one line, not a burst.
        keepalive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let next = tokio::select! {
                biased;
                err = revoked(self.revocation.as_mut()) => Next::Revoked(err),
                () = self.lines.closed() => Next::Gone,
                () = stopped(&mut self.stopped) => Next::Gone,
                change = self.feed.recv() => Next::Change(change),
                _ = keepalive.tick() => Next::KeepAlive,
            };
            match next {
                Next::Change(Ok(change)) => self.deliver(&change).await?,
                Next::Change(Err(RecvError::Lagged(_))) => return Err(End::Behind),
                Next::Change(Err(RecvError::Closed)) | Next::Gone => return Err(End::Gone),
                Next::Revoked(err) => return Err(End::Revoked(err)),
                Next::KeepAlive => self.keep_alive().await?,
            }
        }
    }

    /// The leases under the prefix changed after the cursor, in index
    /// order, each as it is now; then the cursor is the applied index the
    /// table was read at. Only names are held: each record is read again
    /// as its line goes out, and one changed since is left to the feed.
    async fn catch_up(&mut self) -> Result<(), End> {
        let (applied, mut pending) = self.state.group_of(self.group).applied.read(|s| {
            let applied = s.last_applied.as_ref().map_or(0, |id| id.index);
            let pending: Vec<(u64, LeaseName)> = s
                .table
                .leases
                .range::<str, _>((Bound::Included(self.prefix.as_str()), Bound::Unbounded))
                .take_while(|(name, _)| name.as_str().starts_with(self.prefix.as_str()))
                .filter(|(_, record)| record.modify_index > self.cursor)
                .map(|(name, record)| (record.modify_index, name.clone()))
                .collect();
            (applied, pending)
        });
        pending.sort_unstable();
        for (index, lease) in pending {
            let view = self.state.group_of(self.group).applied.read(|s| {
                let record = s.table.leases.get(&lease)?;
                (record.modify_index == index).then(|| LeaseView::new(&self.state, &lease, record))
            });
            if let Some(view) = view {
                self.send_line(json!({ "index": index, "lease": view }))
                    .await?;
            }
            self.cursor = index;
        }
        self.cursor = self.cursor.max(applied);
        Ok(())
    }

    /// One change from the feed: its lines for the leases under the prefix,
    /// unless the catch-up covered it already.
    async fn deliver(&mut self, change: &Change) -> Result<(), End> {
        let under = |lease: &LeaseName| lease.as_str().starts_with(self.prefix.as_str());
        match change {
            Change::Lease { index, .. } | Change::Reclaimed { index, .. }
                if *index <= self.cursor => {}
            Change::Lease {
                index,
                lease,
                record,
            } => {
                if under(lease) {
                    let view = LeaseView::new(&self.state, lease, record);
                    self.send_line(json!({ "index": index, "lease": view }))
                        .await?;
                }
                self.cursor = *index;
            }
            Change::Reclaimed { index, leases } => {
                let gone: Vec<LeaseName> = leases.iter().filter(|l| under(l)).cloned().collect();
                for lease in gone {
                    let line = json!({ "index": index, "lease_name": lease, "deleted": true });
                    self.send_line(line).await?;
                }
                self.cursor = *index;
            }
            // The table was replaced: what changed in between is found by
            // reading it again.
            Change::Reset { .. } => self.catch_up().await?,
        }
        Ok(())
    }

    /// The keep-alive: the applied index, once every change up to it was
    /// sent. The feed sends an entry's changes before the applied index
    /// names it, so reading the index first and then finding the feed
    /// drained means every change up to it has gone out.
    async fn keep_alive(&mut self) -> Result<(), End> {
        let applied = *self.state.group_of(self.group).applied.changes.borrow();
        loop {
            match self.feed.try_recv() {
                Ok(change) => self.deliver(&change).await?,
                Err(broadcast::error::TryRecvError::Lagged(_)) => return Err(End::Behind),
                Err(_) => break,
            }
        }
        self.cursor = self.cursor.max(applied);
        // One partition's keep-alives keep the stream alive; the others'
        // say something only when their index moved.
        let quiet = self.tagged && self.group != GroupId::ZERO;
        if quiet && self.kept_alive_at == Some(self.cursor) {
            return Ok(());
        }
        self.kept_alive_at = Some(self.cursor);
        self.send_line(json!({ "index": self.cursor })).await
    }

    /// [`Watcher::send`], of a line that does not end the stream.
    async fn send_line(&mut self, line: serde_json::Value) -> Result<(), End> {
        self.send(line, false).await
    }

    /// Hands one line to the answer; a client that does not take it within
    /// the body deadline is given up on. A policy reload that revokes the
    /// call ends the wait at once, so a reload reaches a stream whose
    /// client reads slowly too (in the catch-up as later).
    async fn send(&mut self, mut line: serde_json::Value, last: bool) -> Result<(), End> {
        if self.tagged {
            line["partition"] = json!(self.group.0);
        }
        let mut bytes = serde_json::to_vec(&line).unwrap_or_default();
        bytes.push(b'\n');
        let line = Line {
            bytes: bytes.into(),
            last,
        };
        let sent = tokio::time::timeout(self.deadline, self.lines.send(line));
        let sent = tokio::select! {
            biased;
            err = revoked(self.revocation.as_mut()) => return Err(End::Revoked(err)),
            () = stopped(&mut self.stopped) => return Err(End::Gone),
            sent = sent => sent,
        };
        match sent {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(End::Gone),
            Err(_) => {
                tracing::debug!(prefix = %self.prefix, "a prefix watch's client took no line: dropped");
                Err(End::Gone)
            }
        }
    }
}

impl Drop for Watcher {
    /// However it ends (a panic included), a watcher ends its stream's
    /// other watchers: a stream never goes on without one of its
    /// partitions.
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

/// Resolves once another watcher of the stream has ended.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    // Every watcher holds the sender: it cannot be dropped under one.
    let _ = stop.wait_for(|stopped| *stopped).await;
}
