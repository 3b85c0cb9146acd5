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

from ._errors import BadRequest, Fenced, LeaseLost, PalisadeError
from ._gateway import IfMatch, precondition
from ._model import Deleted, Grant, GrantId, JsonObject, Object, Written, encode_key
from ._renew import _renew_loop
from ._shared import _DROPPED, _RELEASED, OnLost, _Shared
from ._transport import Transport

if TYPE_CHECKING:  # psycopg is optional: only palisade.postgres imports it
    import psycopg

log = logging.getLogger("palisade")

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
        lock_delayed: bool = False,
    ) -> None:
        """Starts renewing ``grant``, acquired by a request sent at ``sent``
        (a :func:`time.monotonic` time). Internal: use ``Client.acquire``."""
        self._shared = _Shared(transport, grant, sent, on_lost)
        self._shared.lock_delayed = lock_delayed
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
