"""Which election node to ask first, and how long one attempt may take.

Every node answers every call (a follower forwards to the leader), but a
renewal answered by the leader itself takes one hop less, and a renewal
stuck on a frozen or cut-off node must not eat the lease's time. So the
client keeps, per endpoint:

- which one to try first (``preferred``): the one that served the last call
  itself; after an answer a follower forwarded (``x-palisade-leader: <node
  id>``), the leader it names if the client knows which endpoint that node
  is (node ids are learned from ``GET /v1/cluster``'s ``node_id``), else
  the next endpoint;
- which ones to try last for a while (``avoid``): one that left an attempt
  unanswered for its whole slice, or refused with ``Retry-After``.

:func:`attempt_slice` is the rule for how long one attempt may go unanswered
before the same call is sent to the next node: a share of the time left to
the lease's safe deadline, never more than a request timeout.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

#: No attempt is given less than this before the next node is tried too
#: (unless less than this is left before the deadline).
SLICE_FLOOR = 0.1
#: One attempt's share of the time left before the deadline.
SLICE_SHARE = 1.0 / 3.0
#: The header a follower adds to an answer it forwarded from the leader.
LEADER_HEADER = "x-palisade-leader"
#: Node ids are asked of the endpoints at most this often.
IDENTIFY_EVERY = 5.0


def attempt_slice(left: float, request_timeout: float) -> float:
    """How long one attempt may go unanswered, ``left`` seconds before the
    deadline: a third of it (at least :data:`SLICE_FLOOR`), at most a
    request timeout, never past the deadline."""
    return max(0.0, min(left, request_timeout, max(SLICE_FLOOR, left * SLICE_SHARE)))


def leader_hint(value: Optional[str]) -> Optional[int]:
    """The node id an ``x-palisade-leader`` header names, if it is one."""
    if value is None:
        return None
    value = value.strip()
    return int(value) if value.isdigit() else None


class Endpoints:
    """The election endpoints and what the client learned of them
    (thread-safe)."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = [url.rstrip("/") for url in urls]
        self._lock = threading.Lock()
        self._preferred = 0
        self._avoid: Dict[int, float] = {}
        self._ids: Dict[int, int] = {}  # node id -> endpoint index
        self._wanted: Optional[int] = None  # a leader named, not yet placed
        self._identified_at: Optional[float] = None
        self._identifying = False

    @property
    def preferred(self) -> int:
        """The endpoint tried first (modulo the number of endpoints)."""
        with self._lock:
            return self._preferred

    def order(self, first: Optional[int] = None) -> List[int]:
        """Every endpoint index, in the order to try them: from the
        preferred one (or ``first``: a partition leader's endpoint) round
        the ring, the avoided ones last (the one avoided longest last of
        all)."""
        n = len(self.urls)
        now = time.monotonic()
        with self._lock:
            start = (self._preferred if first is None else first) % n if n else 0
            avoid = dict(self._avoid)
        ring = [(start + i) % n for i in range(n)]
        good = [i for i in ring if avoid.get(i, 0.0) <= now]
        bad = sorted((i for i in ring if avoid.get(i, 0.0) > now), key=lambda i: avoid[i])
        return good + bad

    def index_of(self, node_id: int) -> Optional[int]:
        """The endpoint of node ``node_id``, if the client knows it."""
        with self._lock:
            return self._ids.get(node_id)

    def node_at(self, index: int) -> Optional[int]:
        """The node id of endpoint ``index``, if the client knows it."""
        with self._lock:
            for node_id, at in self._ids.items():
                if at == index:
                    return node_id
            return None

    def avoided(self, index: int) -> bool:
        """Whether ``index`` is tried last for now."""
        with self._lock:
            return self._avoid.get(index, 0.0) > time.monotonic()

    def answered(self, index: int, leader: Optional[int]) -> bool:
        """``index`` gave a definitive answer; ``leader`` is the node its
        ``x-palisade-leader`` header named (``None``: it served the call
        itself). Whether that leader is a node the client cannot place
        yet (then :meth:`identify` is worth calling)."""
        with self._lock:
            self._avoid.pop(index, None)
            if leader is None:
                self._preferred = index
                return False
            placed = self._ids.get(leader)
            if placed is not None:
                self._preferred = placed
                return False
            self._wanted = leader
            if self._preferred % len(self.urls) == index % len(self.urls):
                self._preferred = index + 1
            return True

    def heard(self, index: int) -> None:
        """``index`` answered (in time or late): it is not tried last for
        having stalled."""
        with self._lock:
            self._avoid.pop(index, None)

    def failed(self, index: int) -> None:
        """``index`` did not answer, or answered 503/429: the next endpoint
        is preferred."""
        with self._lock:
            if self._preferred % len(self.urls) == index % len(self.urls):
                self._preferred = index + 1

    def avoid(self, index: int, seconds: float) -> None:
        """Tries ``index`` last for ``seconds`` (a stalled node, or one that
        asked to be left alone with ``Retry-After``)."""
        until = time.monotonic() + seconds
        with self._lock:
            self._avoid[index] = max(self._avoid.get(index, 0.0), until)
            if self._preferred % len(self.urls) == index % len(self.urls):
                self._preferred = index + 1

    def learn(self, index: int, node_id: int) -> None:
        """Endpoint ``index`` is node ``node_id`` (its ``/v1/cluster``
        said so); a leader named earlier and placed now is preferred."""
        with self._lock:
            for other, at in list(self._ids.items()):
                if at == index and other != node_id:
                    del self._ids[other]
            self._ids[node_id] = index
            if self._wanted == node_id:
                self._wanted = None
                if self._avoid.get(index, 0.0) <= time.monotonic():
                    self._preferred = index

    def follow(self, leader: int) -> None:
        """Prefers node ``leader``'s endpoint, if the client knows it (and
        it is not avoided); else waits to learn it."""
        with self._lock:
            placed = self._ids.get(leader)
            if placed is None:
                self._wanted = leader
            elif self._avoid.get(placed, 0.0) <= time.monotonic():
                self._preferred = placed

    def identify(self, node_id_of: Callable[[int], Tuple[Optional[int], Optional[int]]]) -> None:
        """Learns the node id of every endpoint and the leader they name,
        ``node_id_of(index)`` (one ``GET /v1/cluster`` each; ``None`` for
        what it did not say), on a thread of its own, and prefers that
        leader; at most one at a time, and at most every
        :data:`IDENTIFY_EVERY` seconds."""
        now = time.monotonic()
        with self._lock:
            if self._identifying or (
                self._identified_at is not None and now - self._identified_at < IDENTIFY_EVERY
            ):
                return
            self._identifying = True
            self._identified_at = now

        def run() -> None:
            try:
                leaders = []
                for index in range(len(self.urls)):
                    node_id, leader = node_id_of(index)
                    if node_id is not None:
                        self.learn(index, node_id)
                    if leader is not None and leader > 0:
                        leaders.append(leader)
                if leaders:  # the leader most of them name
                    self.follow(max(set(leaders), key=leaders.count))
            finally:
                with self._lock:
                    self._identifying = False

        try:
            threading.Thread(target=run, name="palisade-identify", daemon=True).start()
        except RuntimeError:  # no thread now (interpreter shutting down)
            with self._lock:
                self._identifying = False
