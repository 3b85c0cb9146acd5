"""A held lease that renews itself in a background thread and knows when to
stop."""

from __future__ import annotations

import logging
import threading
import time
import weakref
from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Type, Union

from ._errors import BadRequest, Fenced, LeaseLost, PalisadeError, Preempted
from ._gateway import IfMatch, precondition
from ._model import Deleted, Grant, GrantId, JsonObject, Object, Written, encode_key
from ._transport import Transport

if TYPE_CHECKING:  # psycopg is optional: only palisade.postgres imports it
    import psycopg

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


def _renew_loop(shared: _Shared) -> None:
    """Renews every ``ttl * renew_ratio`` (the ttl the leader answered);
    retries failures every 50 ms until the deadline; marks the lease lost on
    refusal or when the deadline passes."""
    config = shared.transport.config
    ratio = min(max(config.renew_ratio, 0.05), 0.9)
    every = shared.ttl * ratio
    next_at = time.monotonic() + every
    while True:
        with shared.lock:
            deadline = shared.deadline
        now = time.monotonic()
        if shared.stop.wait(max(0.0, min(next_at, deadline) - now)):
            return
        now = time.monotonic()
        if now >= deadline:
            shared.mark_lost(_DEADLINE_PASSED)
            return
        if now < next_at:
            continue
        sent = time.monotonic()
        try:
            # Retries end at the deadline, and each attempt's timeout is cut
            # to it: a renewal stuck on a frozen node cannot hide the loss.
            grant = shared.transport.renew_grant(shared.id, until=deadline)
        except Preempted as err:
            # Let go at once: the preemptor waits for this release, not for
            # the grant's deadline (and the cluster keeps the lease for the
            # preemptor, so a new acquire by this holder waits behind it).
            # Marked lost (no more writes) before the release, and on_lost
            # called after it, so a slow callback does not hold the
            # preemptor up.
            with shared.lock:
                shared.preempted = True
            reason = f"preempted: {err.reason}"
            first = shared.mark_lost(reason, quiet=True)
            try:
                shared.transport.release_grant(shared.id)
            except PalisadeError as release_err:
                log.debug("release of preempted %s failed: %s", shared.id.lease, release_err)
            if first:
                shared.notify_lost(reason)
            return
        except LeaseLost as err:
            shared.mark_lost(f"renewal refused: {err.reason}")
            return
        except PalisadeError as err:
            if time.monotonic() >= deadline:
                shared.mark_lost(_DEADLINE_PASSED)
                return
            log.debug("renewal of %s failed; retrying: %s", shared.id.lease, err)
            next_at = time.monotonic() + 0.05
            continue
        except Exception:  # never die silently while the lease looks held
            log.exception("renew thread of lease %s failed", shared.id.lease)
            shared.mark_lost("the renew thread failed")
            return
        ttl = grant.ttl_ms / 1000.0
        margin = margin_for(config.drift_margin_ratio, ttl)
        with shared.lock:
            if shared.lost_reason is not None:
                return
            passed = time.monotonic() >= shared.deadline
            if not passed:
                # The leader extended the grant by the ttl it answered: that,
                # from the send time, bounds the deadline; never move it back.
                shared.deadline = max(shared.deadline, sent + ttl - margin)
                shared.jwt = grant.jwt
        if passed:
            # Once the deadline has passed the lease stays lost, even if the
            # renewal made it in time at the leader.
            shared.mark_lost(_DEADLINE_PASSED)
            return
        every = ttl * ratio
        next_at = sent + every


def _finalize(shared: _Shared) -> None:
    """When a handle is garbage-collected: stop renewing and release a lease
    still held, in the background."""
    held = shared.is_held()
    shared.mark_lost(_DROPPED)
    if held:
        def release() -> None:
            try:
                shared.transport.release_grant(shared.id)
            except Exception:
                pass

        try:
            threading.Thread(target=release, name="palisade-release", daemon=True).start()
        except RuntimeError:  # interpreter shutting down
            pass


class Lease:
    """A held lease. While :meth:`is_held` is true no other holder has been
    granted it: the local safe deadline is the *send* time of the last
    acknowledged acquire or renew, plus the ttl the leader answered, minus a
    drift margin (10% of the ttl by default), on :func:`time.monotonic` —
    which the leader's own deadline always exceeds.

    A daemon thread renews every ``ttl * renew_ratio`` (a third of the ttl by
    default). The lease is lost when a renewal is refused, when the deadline
    passes without one (even if this process was frozen: :meth:`is_held`
    compares with the clock, not with a flag), or when a write is fenced;
    :attr:`lost` is set then, and ``on_lost`` called (just after, on the
    thread that noticed). Writes are refused
    locally, with nothing sent, once the lease is not held.

    Used as a context manager it releases the lease on exit (if still held).
    Get one from :meth:`palisade.Client.acquire` or
    :meth:`palisade.Client.lease`.
    """

    def __init__(
        self,
        transport: Transport,
        grant: Grant,
        sent: float,
        on_lost: Optional[OnLost] = None,
    ) -> None:
        """Starts renewing ``grant``, acquired by a request sent at ``sent``
        (a :func:`time.monotonic` time). Internal: use ``Client.acquire``."""
        self._shared = _Shared(transport, grant, sent, on_lost)
        self._released = False
        self._thread = threading.Thread(
            target=_renew_loop,
            args=(self._shared,),
            name=f"palisade-renew-{grant.lease}",
            daemon=True,
        )
        self._thread.start()
        self._finalizer = weakref.finalize(self, _finalize, self._shared)
        setattr(self._finalizer, "atexit", False)  # not at exit: threads are gone

    def __repr__(self) -> str:
        return (
            f"Lease(name={self.name!r}, holder={self.holder!r}, token={self.token}, "
            f"held={self.is_held()})"
        )

    @property
    def name(self) -> str:
        """The lease name."""
        return self._shared.id.lease

    @property
    def holder(self) -> str:
        """The holder this lease was granted to."""
        return self._shared.id.holder

    @property
    def token(self) -> int:
        """The fencing token of this grant."""
        return self._shared.id.token

    @property
    def id(self) -> GrantId:
        """What names this grant, with its secret (as powerful as the
        handle: hand it only to a process that must renew or release it)."""
        return self._shared.id

    @property
    def lost(self) -> threading.Event:
        """Set once the lease is lost or released."""
        return self._shared.lost

    @property
    def lost_reason(self) -> Optional[str]:
        """Why the lease was lost (or ``"released"``); ``None`` while it has
        not been marked lost."""
        with self._shared.lock:
            return self._shared.lost_reason

    @property
    def jwt(self) -> Optional[str]:
        """The current lease JWT while held, else ``None``."""
        try:
            return self._shared.held_jwt()
        except LeaseLost:
            return None

    @property
    def deadline(self) -> float:
        """The safe local deadline, a :func:`time.monotonic` time."""
        with self._shared.lock:
            return self._shared.deadline

    def is_held(self) -> bool:
        """Whether the lease is held now (see the class docs)."""
        return self._shared.is_held()

    def _write(
        self,
        method: str,
        path: str,
        content: Optional[bytes],
        headers: Optional[Dict[str, str]] = None,
    ) -> JsonObject:
        jwt = self._shared.held_jwt()
        try:
            return self._shared.transport.gateway.write(jwt, method, path, content, headers)
        except Fenced as err:
            self._shared.mark_lost(
                f"fenced at the gateway: token {err.token} is below fence {err.fence}"
            )
            raise

    def put(
        self,
        key: str,
        value: Union[bytes, str],
        *,
        if_match: IfMatch = None,
        if_none_match: bool = False,
    ) -> Written:
        """Writes ``value`` at ``key`` (whose first segment must be this
        lease's name) through the gateway, stamped with the lease JWT.
        Answers a :class:`Written` (``.key``, ``.version``, ``.token``).

        ``if_match`` (a version, or ``"*"``: an object must exist) or
        ``if_none_match=True`` (no object may exist) make the write
        conditional, checked in the same step as the fence.

        Raises :class:`LeaseLost` locally, with nothing sent, once the lease
        is not held; :class:`Fenced` (a ``LeaseLost``) when the gateway
        refuses the token as stale, whatever the condition — the lease is
        marked lost; :class:`PreconditionFailed` when the condition does not
        hold (nothing changed, the lease still held); :class:`BadRequest`
        for a bad condition (before sending); :class:`Unavailable` on
        transport failure."""
        headers = precondition(if_match, if_none_match)
        content = value.encode() if isinstance(value, str) else bytes(value)
        answer = self._write("PUT", f"/v1/objects/{encode_key(key)}", content, headers)
        return Written.from_json(answer)

    def delete(self, key: str, *, if_match: IfMatch = None) -> Deleted:
        """Deletes ``key`` through the gateway, fenced like :meth:`put`
        (it raises the fence even if nothing was there). ``if_match`` (a
        version, or ``"*"``) makes it conditional: errors as :meth:`put`.
        Answers a :class:`Deleted` (``.key``, ``.deleted``: whether there
        was an object, ``.token``)."""
        headers = precondition(if_match)
        answer = self._write("DELETE", f"/v1/objects/{encode_key(key)}", None, headers)
        return Deleted.from_json(answer)

    def fence(self) -> int:
        """Raises the gateway fence of this lease to its token; answers the
        fence. Errors as :meth:`put`."""
        answer = self._write("POST", f"/v1/fences/{self.name}", None)
        fence = answer.get("fence")
        return fence if isinstance(fence, int) else 0

    def fenced(
        self, conn: "psycopg.Connection[Any]", *, idle_timeout: Optional[float] = None
    ) -> "AbstractContextManager[psycopg.Cursor[Any]]":
        """A transaction on ``conn`` (psycopg 3, not in a transaction) fenced
        with this lease's token in PostgreSQL (``palisade.postgres``)::

            with lease.fenced(conn) as cur:
                cur.execute("UPDATE orders SET ...")

        Begins the transaction and calls ``palisade.fence(name, jwt)``
        before the block (each new JWT is first proven once with
        ``palisade.prove``, outside the transaction, so the database checks
        its signature once); commits when the block ends, rolls back if it
        raises. Raises :class:`LeaseLost` locally, touching nothing, once the
        lease is not held (and rolls back instead of committing if it stopped
        being held during the block); :class:`Fenced` (a ``LeaseLost``) when
        the database's fence is above the token — the lease is marked lost,
        as for a refused gateway write; :class:`Unauthorized` when the
        database refuses the JWT (``PF007``: e.g. signed by a key it does not
        know yet — run ``palisade sql keys``). ``idle_timeout`` (seconds; default the
        lease's ttl, 0 to leave the session's setting) bounds how long this
        transaction may sit idle: a holder frozen inside it loses its session,
        so the next holder's raise does not wait for it forever. Needs the
        ``postgres`` extra (psycopg)."""
        from . import postgres  # psycopg is optional

        def stale(err: Fenced) -> None:
            self._shared.mark_lost(f"fenced in PostgreSQL: token {self.token} is below the fence")

        return postgres._fenced(
            conn,
            self.name,
            self._shared.held_jwt,
            idle_timeout=self._shared.ttl if idle_timeout is None else idle_timeout,
            check=self._shared.held_jwt,
            on_stale=stale,
        )

    def get(self, key: str) -> Optional[Object]:
        """Reads ``key`` through the gateway (reads are not fenced); ``None``
        if there is no object."""
        return self._shared.transport.gateway.get_object(key)

    def handover_to(self, successor: str) -> int:
        """Hands the lease to ``successor``: this handle stops holding it at
        once (writes through it raise :class:`LeaseLost`, and it is not
        renewed), the leader ends the grant and reserves one with a higher
        token for ``successor``, whose acquire (waiting or not) takes it
        within the reservation window (10 s). Returns the successor's token.
        If the handover cannot be made the lease is released instead (this
        handle has let go either way).

        Raises :class:`BadRequest` for yourself or an empty name (nothing
        changed, the lease is still held); :class:`LeaseLost` if the lease
        was no longer held; :class:`Unavailable`."""
        if not successor or successor == self.holder:
            raise BadRequest(f"a handover names another holder than {self.holder!r}")
        if self._released:
            raise LeaseLost(_RELEASED)
        was_held = self._shared.is_held()
        self._released = True
        self._finalizer.detach()
        self._shared.mark_lost(f"handed over to {successor!r}", quiet=True)
        if not was_held:
            raise LeaseLost("the lease was no longer held")
        try:
            return self._shared.transport.handover(self._shared.id, successor)
        except PalisadeError:
            # Let go instead: a grant preempted meanwhile (the handover
            # answers `lost` for it) must be released for its preemptor.
            try:
                self._shared.transport.release_grant(self._shared.id)
            except PalisadeError:
                pass
            raise

    def release(self) -> None:
        """Stops renewing and releases the lease. Idempotent.

        Raises :class:`LeaseLost` if it was held locally but the cluster no
        longer knew the grant; :class:`Unavailable` if no node answered."""
        if self._released:
            return
        self._released = True
        self._finalizer.detach()
        was_held = self._shared.is_held()
        self._shared.mark_lost(_RELEASED)
        try:
            self._shared.transport.release_grant(self._shared.id)
        except LeaseLost:
            if was_held:
                raise

    def __enter__(self) -> "Lease":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        """Releases the lease if it is still held; a failure to release is
        logged, not raised (the lease then ends at its ttl)."""
        if self._released:
            return
        if not self.is_held():
            # Past its deadline the leader is expiring it anyway.
            self._released = True
            self._finalizer.detach()
            self._shared.mark_lost(_RELEASED)
            return
        try:
            self.release()
        except PalisadeError as err:
            log.warning("releasing lease %s failed: %s", self.name, err)
