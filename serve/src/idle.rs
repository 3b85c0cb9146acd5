//! Closing connections that say nothing: an [`Activity`] wrapper notes when
//! bytes last moved on a connection, and [`idle`] resolves once none have
//! moved for the idle timeout while no request of the connection is in
//! flight — whether it never sent a byte, stalled after a TLS handshake, or
//! was left open between requests. A request that waits (a watch, a
//! blocking acquire) keeps its connection open, whatever it sends.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// What the watchdog of one connection reads: when bytes last moved, and
/// how many of its requests are in flight.
#[derive(Debug)]
pub(crate) struct Liveness {
    started: Instant,
    /// Milliseconds after `started` when bytes last moved.
    last_ms: AtomicU64,
    in_flight: AtomicUsize,
    /// Whether a whole request (its headers) has arrived on it yet: a
    /// connection that never sent one may give way to a newer connection
    /// of its address at the cap (`server.rs`).
    requested: std::sync::atomic::AtomicBool,
}

impl Liveness {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            started: Instant::now(),
            last_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            requested: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn touch(&self) {
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(now, Ordering::Relaxed);
    }

    /// Counts a request in flight until the guard drops.
    pub(crate) fn request(self: &Arc<Self>) -> InFlight {
        self.requested.store(true, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(self.clone())
    }
}

impl Liveness {
    /// Its requests in flight now.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Whether a whole request has arrived on the connection yet.
    pub(crate) fn has_requested(&self) -> bool {
        self.requested.load(Ordering::Relaxed)
    }
}

/// A request of the connection in flight.
#[derive(Debug)]
pub(crate) struct InFlight(Arc<Liveness>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.0.touch();
    }
}

/// Resolves once `liveness` has seen no bytes for `timeout` with no request
/// in flight.
pub(crate) async fn idle(liveness: Arc<Liveness>, timeout: Duration) {
    loop {
        let last = Duration::from_millis(liveness.last_ms.load(Ordering::Relaxed));
        let quiet_until = liveness.started + last + timeout;
        if Instant::now() >= quiet_until && liveness.in_flight.load(Ordering::SeqCst) == 0 {
            return;
        }
        let next = quiet_until.max(Instant::now() + timeout / 4);
        tokio::time::sleep_until(next).await;
    }
}

/// An IO that notes every read or write of bytes in its [`Liveness`].
#[derive(Debug)]
pub(crate) struct Activity<I> {
    pub(crate) io: I,
    pub(crate) liveness: Arc<Liveness>,
}

impl<I: AsyncRead + Unpin> AsyncRead for Activity<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.liveness.touch();
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Activity<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.liveness.touch();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
