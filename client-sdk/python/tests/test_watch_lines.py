"""The prefix watch's reading, against one-shot servers on loopback (no
cluster): lines split on ``\\n`` alone (a holder with U+2028 is one line),
a malformed lease is a ProtocolError that leaves the cursor before it, a
last ``behind`` line is Unavailable with the cursor past it, a node that
accepts and never answers is given up after the request timeout, and a
stream quieter than the request timeout (but not than its silence bound)
is read on."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Iterator, List, Tuple

import pytest

import palisade

Script = List[Tuple[float, bytes]]


def serve_once(headers: bool, script: Script) -> Tuple[str, threading.Thread]:
    """A server that accepts one connection, reads its request, then (with
    ``headers``) answers 200 NDJSON and writes each ``(delay, bytes)`` of
    ``script`` in turn, then closes; without ``headers`` it answers nothing
    until the client goes away. Its URL and thread."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"

    def run() -> None:
        conn, _ = listener.accept()
        conn.settimeout(30.0)
        with conn, listener:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(4096)
            if not headers:
                conn.recv(1)  # until the client closes (or 30 s)
                return
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\nconnection: close\r\n\r\n")
            for delay, data in script:
                time.sleep(delay)
                conn.sendall(data)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return url, thread


def lease_line(index: int, holder: str) -> bytes:
    lease = {"lease": "jobs.a", "holder": holder, "token": index, "ttl_ms": 1000,
             "transitions": 1, "modify_index": index}
    return json.dumps({"index": index, "partition": 1, "lease": lease}, ensure_ascii=False).encode() + b"\n"


def watch(url: str) -> Iterator[palisade.PrefixWatch]:
    client = palisade.Client([url], request_timeout=0.5, renew_stream=False)
    try:
        with client.watch_prefix("jobs.") as w:
            yield w
    finally:
        client.close()


def test_lines_split_on_newline_alone_and_a_bad_lease_does_not_move_the_cursor() -> None:
    url, thread = serve_once(True, [
        (0.0, lease_line(4, "w\u2028x")),
        (0.0, b'{"index":6,"partition":1,"lease":{"lease":7}}\n'),
    ])
    for w in watch(url):
        event = next(w)
        assert event.lease is not None and event.lease.holder == "w\u2028x", event
        assert str(w.cursor) == "0,4"
        with pytest.raises(palisade.ProtocolError):
            next(w)
        assert str(w.cursor) == "0,4", "not past the line it could not read"
    thread.join(10)


def test_a_last_behind_line_is_unavailable_with_the_cursor_past_it() -> None:
    url, thread = serve_once(True, [(0.0, b'{"index":9,"partition":2,"error":"behind","message":"m"}\n')])
    for w in watch(url):
        with pytest.raises(palisade.Unavailable):
            next(w)
        assert str(w.cursor) == "0,0,9"
    thread.join(10)


def test_a_stream_quieter_than_the_request_timeout_is_read_on() -> None:
    # Headers at once, the first line after three request timeouts.
    url, thread = serve_once(True, [(1.5, b'{"index":3}\n')])
    for w in watch(url):
        event = next(w)
        assert (event.kind, event.index) == ("progress", 3)
        with pytest.raises(StopIteration):
            next(w)
    thread.join(10)


def test_a_node_that_never_answers_is_given_up_after_the_request_timeout() -> None:
    url, thread = serve_once(False, [])
    client = palisade.Client([url], request_timeout=0.5, renew_stream=False)
    started = time.monotonic()
    with pytest.raises(palisade.Unavailable):
        client.watch_prefix("jobs.")
    # Bounded by the request timeout, not the 35 s silence bound.
    assert time.monotonic() - started < 20.0
    client.close()
    thread.join(40)
