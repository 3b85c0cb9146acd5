//! Renewals that a silent node cannot cost a lease (L2). Each attempt gets
//! a slice of the time the lease has left before its safe deadline
//! ([`slice`]: a third of it, at least [`MIN_SLICE`], at most the request
//! timeout); one that has not answered within its slice is joined by
//! another attempt on another node, the first left out (hedged), and the
//! first definitive answer wins. A node that refuses (503, 429) or cannot
//! be reached is passed over at once. A renewal is idempotent for one
//! grant (holder, token, secret), so asking two nodes is harmless, and a
//! 409 is final wherever it comes from. A follower forwards to the leader,
//! so any live node can answer; its answer names the leader
//! ([`Transport::note_answer`]), which is asked first next time. A renewal
//! of one partition's leases (a [`Target`]) asks that partition's leader
//! first, and its answer or failure moves that partition's leader alone.

use std::time::Duration;

use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use serde_json::Value;
use tokio::time::Instant;

use crate::error::Error;
use crate::transport::{Target, Transport};

/// The shortest slice: below it, renewals that are merely slow (a loaded
/// host) would be asked twice.
pub(crate) const MIN_SLICE: Duration = Duration::from_millis(100);
/// The slice is this share of the time the lease has left.
const SHARE: u32 = 3;
/// Attempts of one renewal out at once on one endpoint (a second one on a
/// node whose first is stuck forwarding to a frozen leader: it may lead
/// by now).
const PER_ENDPOINT: usize = 2;
/// The first and the longest pause after every node failed in a row.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(20), Duration::from_millis(200));

/// How long an attempt sent `left` before the safe deadline may go
/// unanswered before another node is asked too: a third of `left`, at
/// least [`MIN_SLICE`], never more than `request_timeout`.
pub(crate) fn slice(request_timeout: Duration, left: Duration) -> Duration {
    (left / SHARE).max(MIN_SLICE).min(request_timeout)
}

/// Sends a renewal (`POST path` with `body`) to the nodes, `target`'s
/// leader first, hedged as the module says, until an answer other than a
/// refusal (its status and body), or [`Error::Unavailable`] at `deadline`.
pub(crate) async fn renewal<B: serde::Serialize + ?Sized>(
    transport: &Transport,
    target: Option<Target>,
    path: &str,
    body: &B,
    deadline: Instant,
) -> Result<(u16, Bytes), Error> {
    let count = transport.endpoint_count();
    if count == 0 {
        return Err(Error::BadRequest("no election endpoints configured".into()));
    }
    let timeout = transport.config.request_timeout;
    let started = Instant::now();
    let mut hedge = Hedge::new(count);
    let mut out = FuturesUnordered::new();
    let mut next = started;
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(hedge.unavailable(started));
        }
        if now >= next {
            let left = deadline - now;
            next = match hedge.pick(transport.first_for(target)) {
                Some(index) => {
                    let to = (index, target);
                    out.push(attempt(transport, to, path, body, left.min(timeout)));
                    now + slice(timeout, left)
                }
                // As many out as allowed: the next goes when one ends.
                None => deadline,
            };
        }
        tokio::select! {
            Some((index, outcome)) = out.next(), if !out.is_empty() => match outcome {
                Ok(answer) => return Ok(answer),
                Err(failure) => {
                    transport.failed(target, index);
                    next = next.min(Instant::now() + hedge.failed(index, failure));
                }
            },
            () = tokio::time::sleep_until(next.min(deadline)) => {
                // A slice passed unanswered: the node asked first is silent
                // (or slow), so this client's next calls go elsewhere.
                let first = transport.first_for(target);
                if hedge.is_out(first) {
                    transport.failed(target, first);
                }
            }
        }
    }
}

/// What one attempt on endpoint `index` came to: a definitive answer's
/// status and body, or why it was none.
type Outcome = (usize, Result<(u16, Bytes), String>);

/// One attempt on endpoint `index`, for `target`, given `timeout` in all.
async fn attempt<B: serde::Serialize + ?Sized>(
    transport: &Transport,
    (index, target): (usize, Option<Target>),
    path: &str,
    body: &B,
    timeout: Duration,
) -> Outcome {
    let url = transport.url(index, path);
    let sent = transport
        .http()
        .post(&url)
        .timeout(timeout)
        .json(body)
        .send()
        .await;
    let response = match sent {
        Ok(response) => response,
        Err(err) => return (index, Err(format!("{url}: {err}"))),
    };
    let status = response.status().as_u16();
    if matches!(status, 408 | 429 | 502 | 503 | 504) {
        let body: Value = response.json().await.unwrap_or(Value::Null);
        let message = body["message"].as_str().unwrap_or("");
        return (index, Err(format!("{url}: {status} {message}")));
    }
    let headers = response.headers().clone();
    match response.bytes().await {
        Ok(bytes) => {
            if target.is_none() || matches!(status, 200 | 409) {
                transport.note_answer(target, index, &headers);
            }
            (index, Ok((status, bytes)))
        }
        // Cut mid-body: a transport failure, not a bad answer.
        Err(err) => (
            index,
            Err(format!("{url}: {status}, then the answer was cut: {err}")),
        ),
    }
}

/// The bookkeeping of one hedged renewal.
struct Hedge {
    /// Attempts out, by endpoint.
    out: Vec<usize>,
    /// Attempts that failed since the last pause.
    failures: usize,
    /// The next pause after every node failed in a row.
    backoff: Duration,
    /// Attempts sent.
    attempts: u32,
    /// Why the last failed attempt failed.
    last: String,
}

impl Hedge {
    fn new(count: usize) -> Self {
        Self {
            out: vec![0; count],
            failures: 0,
            backoff: BACKOFF.0,
            attempts: 0,
            last: "no node answered in time".into(),
        }
    }

    /// The endpoint for the next attempt, counted as out: of those with
    /// the fewest attempts out, the first from `preferred` on; `None` when
    /// each has as many out as allowed.
    fn pick(&mut self, preferred: usize) -> Option<usize> {
        let count = self.out.len();
        let index = (0..count)
            .map(|k| (preferred + k) % count)
            .min_by_key(|index| self.out[*index])?;
        if self.out[index] >= PER_ENDPOINT {
            return None;
        }
        self.out[index] += 1;
        self.attempts += 1;
        Some(index)
    }

    fn is_out(&self, index: usize) -> bool {
        self.out.get(index).is_some_and(|out| *out > 0)
    }

    /// Counts the failure of an attempt on `index`; how long to wait
    /// before the next: nothing, unless every node failed in a row since
    /// the last pause (then a jittered backoff, doubling).
    fn failed(&mut self, index: usize, failure: String) -> Duration {
        if let Some(out) = self.out.get_mut(index) {
            *out = out.saturating_sub(1);
        }
        self.last = failure;
        self.failures += 1;
        if self.failures < self.out.len() {
            return Duration::ZERO;
        }
        self.failures = 0;
        let half = self.backoff.as_millis() as u64 / 2;
        let wait = Duration::from_millis(half + rand::random::<u64>() % (half + 1));
        self.backoff = (self.backoff * 2).min(BACKOFF.1);
        wait
    }

    fn unavailable(self, started: Instant) -> Error {
        Error::Unavailable {
            attempts: self.attempts,
            elapsed: started.elapsed(),
            last: self.last,
        }
    }
}

#[cfg(test)]
mod tests;
