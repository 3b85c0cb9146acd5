"""The errors the client raises, kept apart by what the caller should do.

Every error is a :class:`PalisadeError`. The ones that mean "stop acting as
leader" are :class:`LeaseLost` and its subclasses :class:`Fenced` and
:class:`Preempted`; transport
trouble is :class:`Unavailable`; someone else holding the lease is
:class:`Held`.
"""

from __future__ import annotations

from typing import Optional


class PalisadeError(Exception):
    """The base of every error this package raises."""


class Held(PalisadeError):
    """The lease is held by someone else (an acquire without waiting, or the
    wait ran out). Never retried."""

    def __init__(self, holder: str, token: int) -> None:
        super().__init__(f"lease is held by {holder!r} (token {token})")
        #: The current holder.
        self.holder = holder
        #: Its fencing token.
        self.token = token


class LeaseLost(PalisadeError):
    """This holder no longer holds the lease: a renewal was refused, the safe
    deadline passed, the lease was released, or a write was fenced. Stop
    acting as leader."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"lease lost: {reason}")
        #: Why.
        self.reason = reason


class Fenced(LeaseLost):
    """The gateway refused a write (409 ``stale_token``), or PostgreSQL's
    ``palisade.fence`` a transaction (SQLSTATE ``PF001``), because a newer
    token has been used on this lease: another holder took over. A
    :class:`LeaseLost`, so ``except LeaseLost`` catches it."""

    def __init__(self, token: int, fence: int) -> None:
        if fence > 0:
            super().__init__(f"fenced: token {token} is below the fence {fence}")
        else:
            super().__init__(f"fenced: token {token} is below the fence (raised concurrently)")
        #: The token the refused write carried.
        self.token = token
        #: The fence that refused it; 0 when it is not known (PostgreSQL saw
        #: a raise through a REPEATABLE READ/SERIALIZABLE snapshot).
        self.fence = fence


class Preempted(LeaseLost):
    """A waiting acquire of a higher priority preempted this (preemptible)
    grant (409 ``preempted`` on a renewal). The lease is released at once,
    so the preemptor need not wait for the deadline. A :class:`LeaseLost`."""


class LockDelay(PalisadeError):
    """409 ``lock_delay``: the lease's last grant expired with a lock-delay,
    and the lease is held back for ``retry_after`` seconds more (longer than
    the acquire's wait)."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(f"lock-delay: {message}")
        #: Seconds until the lease is free.
        self.retry_after = retry_after


class BadRequest(PalisadeError):
    """The request is malformed (400/413, or refused before sending); retrying
    will not help."""


class Unauthorized(PalisadeError):
    """401: the API key is missing or unknown, or the gateway could not
    verify a lease JWT. Never retried."""


class Forbidden(PalisadeError):
    """403: the API key's principal may not do this to this lease, or a JWT
    was used for another lease. Never retried."""


class NotFound(PalisadeError):
    """404: nothing there (a lease never granted, an object that does not
    exist)."""


class Unavailable(PalisadeError):
    """No node answered usefully within the retry budget (connection refused,
    timeouts, 503 no quorum, 429 over a node's cap), or a single gateway
    request failed in transport. Safe to retry later."""

    def __init__(self, attempts: int, elapsed: float, last: str) -> None:
        super().__init__(f"unavailable after {attempts} attempts over {elapsed:.3f}s: {last}")
        #: Requests sent.
        self.attempts = attempts
        #: Seconds spent.
        self.elapsed = elapsed
        #: The last failure.
        self.last = last


class ProtocolError(PalisadeError):
    """The server answered something this client does not understand (or a
    lease JWT that does not verify)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"unexpected answer {status}: {message}")
        #: The HTTP status (0 when the problem is not an HTTP status).
        self.status = status
        #: What was wrong.
        self.message = message


class PreconditionFailed(PalisadeError):
    """412 ``precondition_failed``: a conditional write's ``if_match`` /
    ``if_none_match`` did not hold, and nothing was changed. Not a
    :class:`LeaseLost`: the lease is still held (a stale token is
    :class:`Fenced` whatever the condition)."""

    def __init__(self, key: str, current_version: Optional[int], message: str = "") -> None:
        now = "no object" if current_version is None else f"version {current_version}"
        super().__init__(f"precondition failed on {key!r} ({now}){': ' + message if message else ''}")
        #: The key written.
        self.key = key
        #: The object's version now; ``None`` when there is no object.
        self.current_version = current_version
        #: The gateway's message.
        self.message = message
