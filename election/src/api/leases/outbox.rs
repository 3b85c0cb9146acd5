//! The answer side of a renewal stream (`stream.rs`): its lines on their
//! way out, whether its client takes them, and the seat the stream holds.
//!
//! hyper polls an HTTP/2 answer's body for its next chunk only once it has
//! handed the chunk before to h2 with room for it in the client's
//! flow-control window (hyper 1.x `PipeToSendStream` waits for send
//! capacity for the chunk it holds before it polls again). Each line goes
//! out as two chunks, the line and then its newline, so a poll after a
//! line's newline means the whole line fitted in the window the client
//! gave: the line was *taken*. A client that gives no window (an HTTP/2
//! window of 0, or one that never reads and so never opens more) takes
//! nothing, however little it sent; [`watchdog`] then ends its stream and
//! frees its seat once no line has been taken for the body deadline.
//!
//! The seat says when it will be given back at the latest
//! (`Seat::free_by`): at the stream's idle or lifetime end, or earlier at
//! the body deadline after its oldest untaken line; refusals of the stream
//! pool tell their callers to retry then.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use palisade_plumbing::sync::lock;
use palisade_serve::admission::Seat;
use tokio::sync::{mpsc, Notify};

/// What the lines of one stream and its seat share.
#[derive(Debug)]
pub(super) struct Outbox {
    /// Who the stream is, for log lines.
    flow: String,
    /// How long lines may wait untaken (the body deadline).
    deadline: Duration,
    /// Told when the stream is given up on: its reader stops.
    pub(super) stop: Notify,
    out: Mutex<Out>,
}

/// The seat and the lines' progress, under one lock.
#[derive(Debug)]
struct Out {
    /// The stream's seat; `None` once freed.
    seat: Option<Seat>,
    /// Lines handed to the answer, and how many of them the client took.
    handed: u64,
    taken: u64,
    /// While lines wait untaken: since when none was taken.
    since: Instant,
    /// Until when the stream reads frames (its idle or lifetime end);
    /// `None` once it stopped reading.
    reading_until: Option<Instant>,
}

impl Out {
    /// When the seat will be free at the latest, as things stand.
    fn due(&self, deadline: Duration) -> Instant {
        let stalled = (self.handed > self.taken).then(|| self.since + deadline);
        match (self.reading_until, stalled) {
            (Some(reading), Some(stalled)) => reading.min(stalled),
            (Some(reading), None) => reading,
            (None, Some(stalled)) => stalled,
            (None, None) => Instant::now(),
        }
    }

    fn tell_seat(&self, deadline: Duration) {
        if let Some(seat) = &self.seat {
            seat.free_by(self.due(deadline));
        }
    }
}

impl Outbox {
    /// The outbox of a stream holding `seat`, reading until `reading_until`.
    pub(super) fn new(seat: Seat, flow: &str, deadline: Duration, reading_until: Instant) -> Self {
        let out = Out {
            seat: Some(seat),
            handed: 0,
            taken: 0,
            since: Instant::now(),
            reading_until: Some(reading_until),
        };
        out.tell_seat(deadline);
        Self {
            flow: flow.to_owned(),
            deadline,
            stop: Notify::new(),
            out: Mutex::new(out),
        }
    }

    /// The stream reads frames until `until` (a frame came: its idle end
    /// moved), or, with `None`, has stopped reading.
    pub(super) fn reading_until(&self, until: Option<Instant>) {
        let mut out = lock(&self.out);
        out.reading_until = until;
        out.tell_seat(self.deadline);
    }

    /// A line is on its way to the answer.
    pub(super) fn handed(&self) {
        let mut out = lock(&self.out);
        if out.handed == out.taken {
            out.since = Instant::now();
            out.handed += 1;
            out.tell_seat(self.deadline);
        } else {
            out.handed += 1;
        }
    }

    /// The client took the first `taken` lines.
    fn taken(&self, taken: u64) {
        let mut out = lock(&self.out);
        if taken > out.taken {
            out.taken = taken;
            out.since = Instant::now();
            if out.taken == out.handed {
                out.tell_seat(self.deadline);
            }
        }
    }

    /// Since when lines have waited untaken, if any wait.
    fn stalled_since(&self) -> Option<Instant> {
        let out = lock(&self.out);
        (out.handed > out.taken).then_some(out.since)
    }

    /// Whether the seat was freed already.
    fn freed(&self) -> bool {
        lock(&self.out).seat.is_none()
    }

    /// Ends the stream (its reader stops) and frees its seat now, whatever
    /// its answer still holds: it goes when the client reads it or its
    /// connection closes.
    pub(super) fn give_up(&self, why: &str) {
        self.stop.notify_one();
        let seat = lock(&self.out).seat.take();
        if seat.is_some() {
            tracing::debug!(flow = %self.flow, why, "a renewal stream's seat is freed");
        }
        drop(seat);
    }
}

/// Gives up on the stream of `outbox` once no line has been taken for the
/// body deadline while some wait; ends when the stream's seat is freed or
/// the stream is gone. Wakes once a deadline while lines are taken.
pub(super) async fn watchdog(outbox: Weak<Outbox>) {
    loop {
        let Some(strong) = outbox.upgrade() else {
            return;
        };
        if strong.freed() {
            return;
        }
        let wake = match strong.stalled_since() {
            Some(since) if since.elapsed() >= strong.deadline => {
                return strong.give_up("its answers were not taken");
            }
            Some(since) => since + strong.deadline,
            None => Instant::now() + strong.deadline,
        };
        drop(strong);
        tokio::time::sleep_until(wake.into()).await;
    }
}

/// The answer's body: the lines as they come, each as two chunks (the line,
/// then its newline), noting in the outbox each line the client took.
#[derive(Debug)]
pub(super) struct Answer {
    lines: mpsc::Receiver<Bytes>,
    /// The newline of the line last yielded is yet to go.
    newline_due: bool,
    /// Lines whose newline was yielded, and how many of them the outbox
    /// was told were taken.
    yielded: u64,
    told: u64,
    /// Keeps the seat for as long as the answer is open.
    outbox: Arc<Outbox>,
}

impl Answer {
    pub(super) fn new(lines: mpsc::Receiver<Bytes>, outbox: Arc<Outbox>) -> Self {
        Self {
            lines,
            newline_due: false,
            yielded: 0,
            told: 0,
            outbox,
        }
    }
}

impl futures::Stream for Answer {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        // Polled again: every chunk yielded before fitted in the window.
        if this.told < this.yielded {
            this.told = this.yielded;
            this.outbox.taken(this.yielded);
        }
        if this.newline_due {
            this.newline_due = false;
            this.yielded += 1;
            return Poll::Ready(Some(Ok(Bytes::from_static(b"\n"))));
        }
        match this.lines.poll_recv(cx) {
            Poll::Ready(Some(line)) => {
                this.newline_due = true;
                Poll::Ready(Some(Ok(line)))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use palisade_serve::admission::{Admission, Pool, Seats};

    use super::*;

    fn outbox() -> Arc<Outbox> {
        let admission = Admission::new(Seats::of(64));
        let seat = admission.admit("f", Pool::Stream).expect("a seat");
        let reading = Instant::now() + Duration::from_secs(120);
        Arc::new(Outbox::new(seat, "f", Duration::from_secs(5), reading))
    }

    #[tokio::test]
    async fn a_line_is_taken_once_the_answer_is_polled_after_its_newline() {
        let outbox = outbox();
        let (lines, rx) = mpsc::channel(1);
        let mut answer = Answer::new(rx, outbox.clone());
        assert!(outbox.stalled_since().is_none(), "nothing waits yet");
        outbox.handed();
        lines.send(Bytes::from_static(b"{}")).await.expect("send");
        assert!(outbox.stalled_since().is_some(), "a line waits");
        let chunk = answer.next().await.expect("a chunk").expect("ok");
        assert_eq!(chunk, Bytes::from_static(b"{}"));
        let chunk = answer.next().await.expect("a chunk").expect("ok");
        assert_eq!(chunk, Bytes::from_static(b"\n"), "the newline apart");
        assert!(
            outbox.stalled_since().is_some(),
            "hyper holds the newline until the window has room for it"
        );
        assert!(futures::poll!(answer.next()).is_pending());
        assert!(
            outbox.stalled_since().is_none(),
            "polled again: the whole line fitted in the window"
        );
        drop(lines);
        assert!(answer.next().await.is_none(), "the answer ends");
    }

    #[tokio::test]
    async fn giving_up_frees_the_seat_and_stops_the_reader() {
        let outbox = outbox();
        let stopped = outbox.stop.notified();
        assert!(!outbox.freed());
        outbox.give_up("a test");
        assert!(outbox.freed());
        tokio::time::timeout(Duration::from_secs(1), stopped)
            .await
            .expect("the reader is told to stop");
    }
}
