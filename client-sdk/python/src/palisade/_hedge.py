"""Hedged calls: a renewal that has not answered within its slice is sent to
the next node too, and the first definitive answer wins.

A renewal is idempotent (the same holder, token and secret extend the same
grant), so sending it twice is safe; waiting out a request timeout on a
frozen leader is not, when the lease has less than that left. The attempts
run on :class:`Workers`, threads that are reused while busy ones are stuck.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Set, Tuple

from ._endpoints import Endpoints, attempt_slice

log = logging.getLogger("palisade")

#: An idle worker thread ends after this long.
IDLE_EXIT = 30.0
#: Statuses an election call retries on the next endpoint.
RETRY_STATUSES = frozenset({503, 429})


class Workers:
    """Threads that run attempts: an idle one takes the next job, else a new
    one starts (so an attempt never waits behind stuck ones); a thread idle
    for :data:`IDLE_EXIT` seconds ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle = 0
        self._jobs: "queue.SimpleQueue[Callable[[], None]]" = queue.SimpleQueue()

    def run(self, job: Callable[[], None]) -> None:
        """Runs ``job`` on a worker thread."""
        with self._lock:
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1
        self._jobs.put(job)
        if spawn:
            try:
                threading.Thread(target=self._work, name="palisade-attempt", daemon=True).start()
            except RuntimeError:  # no thread now: run it here
                self._jobs.get_nowait()()

    def _work(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=IDLE_EXIT)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # nobody counts on this one: end
                        self._idle -= 1
                        return
                continue
            try:
                job()
            except BaseException:  # a job reports its own errors
                log.exception("a palisade attempt failed")
            with self._lock:
                self._idle += 1


@dataclass
class Outcome:
    """What one attempt brought: an answer (``status``, ``body``, the
    leader it names, its ``Retry-After``), or a transport failure."""

    index: int
    status: int = 0
    body: object = None
    leader: Optional[int] = None
    retry_after: Optional[float] = None
    failure: str = ""

    @property
    def transient(self) -> bool:
        """A transport failure, 503 or 429: worth another attempt."""
        return bool(self.failure) or self.status in RETRY_STATUSES

    def describe(self, url: str) -> str:
        """The failure, for logs and :class:`Unavailable`."""
        if self.failure:
            return self.failure
        message = self.body.get("message") if isinstance(self.body, dict) else None
        return f"{url}: {self.status} {message if isinstance(message, str) else ''}"


def retry_after(value: Optional[str]) -> Optional[float]:
    """A ``Retry-After`` in seconds (an HTTP date is not parsed: the
    servers send seconds), at most an hour; ``None`` when absent."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return min(seconds, 3600.0) if seconds > 0 else None


#: Sends one attempt to endpoint ``index`` with a timeout; never raises.
Send = Callable[[int, float], Outcome]


class GaveUp(Exception):
    """No definitive answer by the deadline: ``attempts`` made, ``last``
    failure."""

    def __init__(self, attempts: int, last: str) -> None:
        super().__init__(last)
        self.attempts = attempts
        self.last = last


def hedged(
    endpoints: Endpoints,
    workers: Workers,
    send: Send,
    until: float,
    request_timeout: float,
    first: Optional[int] = None,
) -> Outcome:
    """The first definitive answer (anything but a transport failure, 503
    or 429) of attempts sent by ``until``: one at once, to the first
    endpoint in :meth:`Endpoints.order`; another, to the next endpoint,
    whenever the last has gone unanswered for its :func:`attempt_slice`
    (that endpoint is then avoided for a request timeout), or soon after
    one failed (backoff 20 ms doubling, never longer than a slice). A
    ``Retry-After`` keeps this call off that endpoint for as long, but
    never longer than a slice. Each attempt's timeout ends at ``until``
    (and within a request timeout). ``first`` (a partition leader's
    endpoint) goes first in that order. Raises :class:`GaveUp`."""
    results: "queue.SimpleQueue[Outcome]" = queue.SimpleQueue()
    tries: Dict[int, int] = {}
    out: Set[int] = set()
    not_before: Dict[int, float] = {}
    attempts, last, backoff = 0, "no attempt made: the deadline had passed", 0.02
    launch_at = time.monotonic()
    latest: Optional[Tuple[int, float]] = None  # the last attempt: endpoint, when it is late
    while True:
        now = time.monotonic()
        if now >= until:
            raise GaveUp(attempts, last)
        if latest is not None and latest[0] in out and now >= latest[1]:
            endpoints.avoid(latest[0], request_timeout)  # it stalled
            latest = None
        if now >= launch_at:
            index, wait = _next_endpoint(endpoints.order(first), out, tries, not_before, now)
            if index is None:
                launch_at = now + min(wait, attempt_slice(until - now, request_timeout))
            else:
                attempts += 1
                tries[index] = tries.get(index, 0) + 1
                out.add(index)
                timeout = min(request_timeout, until - now)
                workers.run(_job(results, endpoints, send, index, timeout))
                launch_at = now + attempt_slice(until - now, request_timeout)
                latest = (index, launch_at)
        try:
            outcome = results.get(timeout=max(0.0, min(launch_at, until) - time.monotonic()))
        except queue.Empty:
            continue
        out.discard(outcome.index)
        if not outcome.transient:
            return outcome
        last = outcome.describe(endpoints.urls[outcome.index])
        endpoints.failed(outcome.index)
        now = time.monotonic()
        slice_ = attempt_slice(until - now, request_timeout)
        if outcome.retry_after:
            not_before[outcome.index] = now + min(outcome.retry_after, slice_)
            endpoints.avoid(outcome.index, outcome.retry_after)
        log.debug("renewal attempt failed; trying again: %s", last)
        launch_at = min(launch_at, now + min(backoff / 2 + random.uniform(0, backoff) / 2, slice_))
        backoff = min(backoff * 2, 0.5)


def _job(
    results: "queue.SimpleQueue[Outcome]",
    endpoints: Endpoints,
    send: Send,
    index: int,
    timeout: float,
) -> Callable[[], None]:
    def job() -> None:
        outcome = send(index, timeout)
        if not outcome.failure:
            # It answered, if only late or with a 503: slow, not stalled.
            endpoints.heard(index)
        results.put(outcome)

    return job


def _next_endpoint(
    order: List[int], out: Set[int], tries: Dict[int, int], not_before: Dict[int, float], now: float
) -> Tuple[Optional[int], float]:
    """The endpoint for the next attempt: of those with no attempt out and
    no ``Retry-After`` pending, the one tried least by this call (ties: in
    ``order``); else ``None`` and how long until one is free of its
    ``Retry-After`` (a long time if all have attempts out)."""
    free = [i for i in order if i not in out]
    ready = [i for i in free if not_before.get(i, 0.0) <= now]
    if ready:
        return min(ready, key=lambda i: (tries.get(i, 0), order.index(i))), 0.0
    if free:
        return None, min(not_before[i] for i in free) - now
    return None, 3600.0
