"""What a lease's handle and its renew thread share: :class:`_Shared`, the
drift margin, and the reasons a lease ends."""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional

from ._errors import LeaseLost, Preempted
from ._model import Grant, GrantId
from ._transport import Transport

log = logging.getLogger("palisade")

#: Called once, with the reason, when a lease is lost (not when released).
OnLost = Callable[[str], None]

_DEADLINE_PASSED = "the safe deadline passed without a successful renewal"
_RELEASED = "released"
_DROPPED = "dropped"


def margin_for(ratio: float, ttl: float) -> float:
    """The drift margin for ``ttl`` seconds: ``ttl * ratio`` (ratio clamped to
    0..0.9), at least 1 ms."""
    return max(ttl * min(max(ratio, 0.0), 0.9), 0.001)


class _Shared:
    """What the handle and its renew thread share (the thread holds no
    reference to the :class:`Lease`, so dropping the handle stops it)."""

    def __init__(
        self, transport: Transport, grant: Grant, sent: float, on_lost: Optional[OnLost]
    ) -> None:
        self.transport = transport
        #: Taken with a lock-delay: a lapsed grant is left to expire.
        self.lock_delayed = False
        self.id: GrantId = grant.id()
        self.ttl = grant.ttl_ms / 1000.0
        self.lock = threading.Lock()
        self.jwt = grant.jwt
        margin = margin_for(transport.config.drift_margin_ratio, self.ttl)
        self.deadline = sent + self.ttl - margin
        self.lost_reason: Optional[str] = None
        #: Lost to a preemption: writes raise :class:`Preempted`.
        self.preempted = False
        self.lost = threading.Event()
        self.stop = threading.Event()
        self.on_lost = on_lost

    def mark_lost(self, reason: str, quiet: bool = False) -> bool:
        """Marks the lease lost (once); calls ``on_lost`` for a real loss
        (not for a release, a drop or a ``quiet`` one: the holder's own
        doing, or one whose caller calls :meth:`notify_lost` itself).
        Whether this call marked it."""
        with self.lock:
            first = self.lost_reason is None
            if first:
                self.lost_reason = reason
        self.stop.set()
        self.lost.set()
        if first and not quiet and reason not in (_RELEASED, _DROPPED):
            self.notify_lost(reason)
        return first

    def notify_lost(self, reason: str) -> None:
        """Logs a real loss and calls ``on_lost``."""
        log.warning("lease %s (token %d) lost: %s", self.id.lease, self.id.token, reason)
        if self.on_lost is not None:
            try:
                self.on_lost(reason)
            except Exception:  # a callback's bug must not kill the renew thread
                log.exception("on_lost callback of lease %s failed", self.id.lease)

    def held_jwt(self) -> str:
        """The JWT if the lease is held now; raises :class:`LeaseLost`
        otherwise (and marks it lost once the deadline has passed: a lease
        whose deadline passed is never held again)."""
        with self.lock:
            reason = self.lost_reason
            expired = time.monotonic() >= self.deadline
            jwt = self.jwt
        if reason is not None:
            raise Preempted(reason) if self.preempted else LeaseLost(reason)
        if expired:
            self.mark_lost(_DEADLINE_PASSED)
            raise LeaseLost("the safe deadline has passed")
        return jwt

    def is_held(self) -> bool:
        try:
            self.held_jwt()
        except LeaseLost:
            return False
        return True
