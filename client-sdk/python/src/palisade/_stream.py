"""Renewals over one long-lived HTTP/2 stream to the leader
(``POST /v1/renew/stream``: etcd's LeaseKeepAlive pattern), as the Rust SDK
does.

httpx sends a request's whole body before it reads the answer, so it cannot
hold a stream that carries renewals one way and answers the other. This
module keeps its own HTTP/2 connection (the ``h2`` package, sans-IO) driven
by one I/O thread: the lease threads hand it renewals, it packs those that
arrive together into one frame (a line ``{"id", "renewals": [...]}``), and
each answer line wakes the renewals of its frame.

The stream is a fast path, never the only one. Whenever it cannot carry a
renewal — no stream can be opened (every node refused or is not the leader:
a follower answers 503), the stream ended (the leader stepped down, the
connection broke, its hour is up), the frame failed whole (503 no quorum,
429 over the share), or no answer came within the renewal's slice of the
time left to its deadline — the renewal is given back to the caller, which
renews through ``POST /v1/leases/{name}/renew`` (hedged across the nodes),
within the same safe deadline. A renewal unanswered for its whole slice,
with nothing heard from the server meanwhile (a PING goes with every
frame), ends the stream (a frozen or cut-off leader), and that node is
tried last for a while; the next renewal opens a stream on the node that
leads now (the client's preferred endpoint first). After a failed open,
streams are not tried again for a few seconds.
"""

from __future__ import annotations

import json
import logging
import selectors
import socket
import ssl
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import urlsplit

import h2.config
import h2.connection
import h2.events
import h2.exceptions

from ._endpoints import SLICE_FLOOR, Endpoints, attempt_slice

log = logging.getLogger("palisade")

PATH = "/v1/renew/stream"
NDJSON = "application/x-ndjson"
#: Entries per frame (the server's limit, as for ``POST /v1/renew``).
MAX_ENTRIES = 256
#: Bytes per frame, under the server's 64 KiB.
MAX_FRAME_BYTES = 60 * 1024
#: After a failed open, renew by requests this long before trying again.
RETRY_OPEN_AFTER = 5.0
#: The longest a TCP connect to a node may take (httpx's connect timeout).
CONNECT_TIMEOUT = 0.5
#: An HTTP/2 PING this often keeps the connection out of the server's idle
#: close between renewals that are far apart.
PING_EVERY = 1.0
#: The most answer bytes buffered without a line end.
MAX_LINE_BYTES = 1 << 20

#: The answer of one renewal: its status and result document.
Result = Tuple[int, Mapping[str, Any]]


class StreamClosed(Exception):
    """The stream cannot carry a renewal (the caller renews by request)."""


class _Waiter:
    """One renewal handed to the stream, until its answer comes."""

    __slots__ = ("entry", "line", "done", "result")

    def __init__(self, entry: Mapping[str, Any]) -> None:
        self.entry = entry
        self.line = json.dumps(entry, separators=(",", ":")).encode()
        self.done = threading.Event()
        #: Set with ``done``: the result, or ``None`` when the stream failed it.
        self.result: Optional[Result] = None


class _Stream:
    """One HTTP/2 connection carrying one renewal stream. Only its I/O
    thread touches the socket and the h2 state; callers hand it renewals
    through ``pending`` (under ``lock``) and wake it through a socket pair."""

    def __init__(
        self, url: str, tls: Callable[[], ssl.SSLContext], headers: Sequence[Tuple[str, str]],
        until: float,
    ) -> None:
        """Connects (TCP, then TLS with ALPN h2 for https) and sends the
        request's headers; raises when that cannot be done by ``until`` (a
        :func:`time.monotonic` time). The answer's status comes later
        (``opened``, ``status``)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise StreamClosed(f"{url}: not an http(s) URL")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        left = until - time.monotonic()
        sock = socket.create_connection(
            (parts.hostname, port), timeout=max(0.001, min(left, CONNECT_TIMEOUT))
        )
        self.sock = sock
        self.wake_r, self.wake_w = socket.socketpair()
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if parts.scheme == "https":
                sock.settimeout(max(0.001, until - time.monotonic()))
                self.sock = sock = tls().wrap_socket(sock, server_hostname=parts.hostname)
                if sock.selected_alpn_protocol() != "h2":
                    raise StreamClosed(f"{url}: the server did not agree to HTTP/2")
                if time.monotonic() >= until:
                    raise StreamClosed(f"{url}: the TLS handshake took too long")
            sock.setblocking(False)
            self._start(parts.scheme, parts.netloc, headers)
        except BaseException:
            for s in (self.sock, self.wake_r, self.wake_w):
                s.close()
            raise

    def _start(self, scheme: str, authority: str, headers: Sequence[Tuple[str, str]]) -> None:
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.conn.initiate_connection()
        self.id = self.conn.get_next_available_stream_id()
        self.conn.send_headers(self.id, [
            (":method", "POST"), (":scheme", scheme), (":authority", authority),
            (":path", PATH), ("content-type", NDJSON), ("accept", NDJSON), *headers,
        ])
        self.out = bytearray(self.conn.data_to_send())
        self.lock = threading.Lock()
        self.pending: List[_Waiter] = []
        self.frames: Dict[int, List[_Waiter]] = {}
        self.unsent: List[bytes] = []
        self.next_frame = 0
        self.received = b""
        self.status: Optional[int] = None
        self.opened = threading.Event()
        self.closed: Optional[str] = None
        self.started = time.monotonic()
        self.pinged = self.started
        self.ping_out = False
        #: When the server last sent anything (a PING's answer included).
        self.heard = self.started
        #: The endpoint index it was opened on (set by the renewer).
        self.index = 0
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)
        self.thread = threading.Thread(target=self._run, name="palisade-renew-stream", daemon=True)
        self.thread.start()

    # -- what callers do --------------------------------------------------

    def submit(self, waiter: _Waiter) -> None:
        """Hands a renewal to the I/O thread; raises :class:`StreamClosed`
        once the stream has ended."""
        with self.lock:
            if self.closed is not None:
                raise StreamClosed(self.closed)
            self.pending.append(waiter)
        self._wake()

    def close(self, reason: str) -> None:
        """Ends the stream; every renewal still waiting is given back."""
        with self.lock:
            if self.closed is not None:
                return
            self.closed = reason
        self._wake()

    def _wake(self) -> None:
        try:
            self.wake_w.send(b"\0")
        except OSError:  # full (already woken) or closed
            pass

    # -- the I/O thread ---------------------------------------------------

    def _run(self) -> None:
        reason = "the stream ended"
        selector = selectors.DefaultSelector()
        selector.register(self.sock, selectors.EVENT_READ)
        selector.register(self.wake_r, selectors.EVENT_READ)
        try:
            while True:
                with self.lock:
                    if self.closed is not None:
                        reason = self.closed
                        break
                    waiters, self.pending = self.pending, []
                self._pack(waiters)
                self._feed()
                self._ping(force=bool(waiters))
                events = selectors.EVENT_READ | (selectors.EVENT_WRITE if self.out else 0)
                selector.modify(self.sock, events)
                for key, mask in selector.select(timeout=1.0):
                    if key.fileobj is self.wake_r:
                        self._drain_wake()
                        continue
                    if mask & selectors.EVENT_WRITE:
                        self._write()
                    if mask & selectors.EVENT_READ:
                        self._read()
        except StreamClosed as err:
            reason = str(err)
        except (OSError, ValueError, h2.exceptions.ProtocolError) as err:
            reason = f"the stream broke: {type(err).__name__}: {err}"
        finally:
            self._finish(reason, selector)

    def _finish(self, reason: str, selector: selectors.BaseSelector) -> None:
        with self.lock:
            if self.closed is None:
                self.closed = reason
            waiting = [w for frame in self.frames.values() for w in frame] + self.pending
            self.frames.clear()
            self.pending = []
        log.debug("renewal stream closed: %s", reason)
        for waiter in waiting:
            waiter.done.set()
        self.opened.set()
        selector.close()
        for sock in (self.sock, self.wake_r, self.wake_w):
            try:
                sock.close()
            except OSError:
                pass

    def _drain_wake(self) -> None:
        try:
            while self.wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def _pack(self, waiters: List[_Waiter]) -> None:
        """Packs renewals into frames (lines) of at most MAX_ENTRIES and
        MAX_FRAME_BYTES."""
        start = 0
        while start < len(waiters):
            end, size = start, 40
            while end < len(waiters) and end - start < MAX_ENTRIES:
                size += len(waiters[end].line) + 1
                if end > start and size > MAX_FRAME_BYTES:
                    break
                end += 1
            frame, start = waiters[start:end], end
            self.next_frame += 1
            with self.lock:
                self.frames[self.next_frame] = frame
            entries = b",".join(w.line for w in frame)
            self.unsent.append(b'{"id":%d,"renewals":[%s]}\n' % (self.next_frame, entries))

    def _feed(self) -> None:
        """Moves unsent lines into h2 as far as its flow control allows."""
        while self.unsent:
            window = self.conn.local_flow_control_window(self.id)
            size = min(window, self.conn.max_outbound_frame_size, len(self.unsent[0]))
            if size <= 0:
                break
            line = self.unsent[0]
            self.conn.send_data(self.id, line[:size])
            if size == len(line):
                self.unsent.pop(0)
            else:
                self.unsent[0] = line[size:]
        self.out += self.conn.data_to_send()

    def _ping(self, force: bool) -> None:
        """A PING every PING_EVERY, and one with renewals sent (unless one
        is out): a live server answers it at once, however slow its
        renewals, so a renewal unanswered with nothing heard is a stall."""
        now = time.monotonic()
        if now - self.pinged >= PING_EVERY or (force and not self.ping_out):
            self.pinged = now
            self.ping_out = True
            self.conn.ping(b"palisade")
            self.out += self.conn.data_to_send()

    def _write(self) -> None:
        try:
            sent = self.sock.send(self.out)
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError, InterruptedError):
            return
        del self.out[:sent]

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(65536)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError, InterruptedError):
                return
            if not data:
                raise StreamClosed("the server closed the connection")
            self.heard = time.monotonic()
            for event in self.conn.receive_data(data):
                self._on(event)
            self.out += self.conn.data_to_send()
            if not isinstance(self.sock, ssl.SSLSocket) or not self.sock.pending():
                return

    def _on(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ResponseReceived):
            status = dict(event.headers).get(b":status", b"0")
            self.status = int(status) if status.isdigit() else 0
            self.opened.set()
            if self.status != 200:
                raise StreamClosed(f"the stream was refused: {self.status}")
        elif isinstance(event, h2.events.DataReceived):
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            self.received += event.data
            *lines, self.received = self.received.split(b"\n")
            if len(self.received) > MAX_LINE_BYTES:
                raise StreamClosed("an answer line without its end")
            for line in lines:
                if line.strip():
                    self._answer(line)
        elif isinstance(event, h2.events.PingAckReceived):
            self.ping_out = False
        elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
            raise StreamClosed("the server ended the stream")
        elif isinstance(event, h2.events.ConnectionTerminated):
            raise StreamClosed("the server closed the connection (GOAWAY)")

    def _answer(self, line: bytes) -> None:
        """Wakes the renewals of the frame an answer line names."""
        try:
            doc = json.loads(line)
        except ValueError as err:
            raise StreamClosed(f"an unreadable answer line: {err}") from err
        frame_id = doc.get("id") if isinstance(doc, dict) else None
        if not isinstance(frame_id, int) or isinstance(frame_id, bool):
            message = doc.get("message") if isinstance(doc, dict) else None
            raise StreamClosed(f"the server ended the stream: {message or line[:200]!r}")
        with self.lock:
            frame = self.frames.pop(frame_id, [])
        results = doc.get("results")
        if doc.get("status") == 200 and isinstance(results, list) and len(results) == len(frame):
            for waiter, result in zip(frame, results):
                # A result is taken only for the lease it names (else the
                # renewal goes by request).
                if (
                    isinstance(result, dict)
                    and isinstance(result.get("status"), int)
                    and result.get("lease") == waiter.entry.get("lease")
                ):
                    waiter.result = (result["status"], result)
        # A frame failed whole (503, 429, 400): its renewals go by request.
        for waiter in frame:
            waiter.done.set()


class StreamRenewer:
    """The renewal stream of one client: opened on first use on the node
    that leads, reopened when it ends, bypassed for a while when it cannot
    be opened."""

    def __init__(
        self,
        endpoints: Endpoints,
        tls: Callable[[], ssl.SSLContext],
        headers: Sequence[Tuple[str, str]],
        request_timeout: float,
        identify: Optional[Callable[[], None]] = None,
    ) -> None:
        """``identify`` asks the nodes which of them leads (in the
        background), after a follower refused a stream."""
        self._endpoints = endpoints
        self._identify = identify
        self._tls = tls
        self._headers = list(headers)
        self._timeout = request_timeout
        self._lock = threading.Lock()
        self._stream: Optional[_Stream] = None
        self._retry_at = 0.0
        self._closed = False
        #: Streams opened (for tests and logs).
        self.opened = 0

    def renew(self, entry: Mapping[str, Any], until: float) -> Optional[Result]:
        """The answer of one renewal (``{"lease","holder","token","secret"}``)
        over the stream, or ``None`` when the stream could not carry it in
        time: renew by request then (with the time left before ``until``, a
        :func:`time.monotonic` time, the renewal's deadline). Opening a
        stream may take two thirds of the time left (at most a request
        timeout); the answer, its :func:`attempt_slice` of what is left
        then."""
        left = until - time.monotonic()
        if left <= 0:
            return None
        opening = min(self._timeout, max(attempt_slice(left, self._timeout), left * 2 / 3))
        stream = self._current(time.monotonic() + opening)
        if stream is None:
            return None
        waiter = _Waiter(entry)
        submitted = time.monotonic()
        try:
            stream.submit(waiter)
        except StreamClosed:
            return None
        waited = attempt_slice(until - submitted, self._timeout)
        if not waiter.done.wait(waited):
            if (
                waited >= min(SLICE_FLOOR, self._timeout)
                and stream.heard < submitted
                and stream.closed is None
            ):
                # No answer within the renewal's whole slice, and not a
                # byte since it was sent (not even the answer to the PING
                # sent with it): a frozen or cut-off leader. End the stream
                # so that the renewals on it go by request now, and try that
                # node last for a while. (A slow leader that answers PINGs
                # keeps its stream: this renewal goes by request; and a
                # renewal whose own deadline cut its wait below the floor
                # proves nothing.)
                stream.close(f"nothing heard for {waited:.3f} s")
                self._endpoints.avoid(stream.index, self._timeout)
            return None
        return waiter.result

    def close(self) -> None:
        with self._lock:
            self._closed = True
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.close("the client closed")

    def _current(self, deadline: float) -> Optional[_Stream]:
        """The open stream, or a new one on the first node that serves it."""
        stream = self._stream
        if stream is not None and stream.closed is None:
            return stream
        # While another renewal opens a stream, this one goes by request.
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return self._current_locked(deadline)
        finally:
            self._lock.release()

    def _current_locked(self, deadline: float) -> Optional[_Stream]:
        stream = self._stream
        if stream is not None and stream.closed is None:
            return stream
        self._stream = None
        if stream is not None and time.monotonic() - stream.started < 1.0:
            # It ended as soon as it opened: do not reopen on every renewal.
            self._retry_at = stream.started + RETRY_OPEN_AFTER
        if self._closed or time.monotonic() < self._retry_at:
            return None
        # The preferred node (the leader, when known) first; never one that
        # stalled lately.
        for index in self._endpoints.order():
            if self._endpoints.avoided(index):
                continue
            url = self._endpoints.urls[index]
            started = time.monotonic()
            until = min(started + self._timeout, deadline)
            if until <= started:
                break
            try:
                stream = _Stream(url, self._tls, self._headers, until)
            except Exception as err:  # any failure to open: renew by request
                log.debug("renewal stream to %s: %s", url, err)
                continue
            stream.opened.wait(max(0.0, until - time.monotonic()))
            if stream.status == 200:
                stream.index = index
                self._stream = stream
                self._endpoints.answered(index, None)  # it leads
                self.opened += 1
                return stream
            # A follower (503), a refusal, or no answer in time: the next node.
            stream.close("not opened")
            log.debug("renewal stream to %s: not opened (%s)", url, stream.status)
            if stream.status == 503 and self._identify is not None:
                self._identify()  # which node leads, for the next open
            if stream.status is None and until - started >= min(SLICE_FLOOR, self._timeout):
                self._endpoints.avoid(index, self._timeout)  # it did not answer
        self._retry_at = time.monotonic() + RETRY_OPEN_AFTER
        return None
