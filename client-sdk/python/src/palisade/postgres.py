"""Fenced transactions in your own PostgreSQL (psycopg 3).

The SQL side is ``palisade/sql/palisade_fence.sql`` (:func:`sql`), the same
file the Rust SDK installs: a ``palisade`` schema with a fence table and
``palisade.fence(lease, token)``. Called inside a transaction, before its
writes, it refuses a token below the lease's fence (SQLSTATE ``PF001``) and
otherwise raises the fence to the token, in that transaction: the fence and
the writes commit or roll back together, and once a newer token has raised the
fence no transaction with an older one commits.

::

    import psycopg, palisade
    from palisade import postgres

    conn = psycopg.connect(DSN)
    postgres.install(conn)                       # once; a no-op when installed
    with client.lease("orders", "worker-1", ttl=5.0) as lease:
        with lease.fenced(conn) as cur:          # BEGIN; palisade.fence(...)
            cur.execute("UPDATE orders SET ...")
        # committed; palisade.Fenced (a LeaseLost) if another holder took over

Without an SDK lease (a token from ``palisade run``'s ``PALISADE_TOKEN``, or
your own transaction code): :func:`transaction` and :func:`fence`.
:func:`guard` makes a table refuse writes from transactions that did not
fence its lease (``PF002``).

psycopg is an optional dependency (``pip install 'palisade-client[postgres]'``):
``import palisade`` works without it; importing this module does not.
"""

from __future__ import annotations

import contextlib
import logging
import re
from importlib import resources
from typing import Any, Callable, Iterator, Optional, Union

try:
    import psycopg
    from psycopg.pq import TransactionStatus
except ImportError as _missing:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "palisade.postgres needs psycopg 3: pip install 'palisade-client[postgres]' "
        "(or 'psycopg[binary]')"
    ) from _missing

from ._client import check_lease_name
from ._errors import BadRequest, Fenced, PalisadeError

__all__ = [
    "FENCE_RACED",
    "INVALID_LEASE",
    "INVALID_TOKEN",
    "NOT_FENCED",
    "SCHEMA_TOO_NEW",
    "SCHEMA_VERSION",
    "STALE_TOKEN",
    "FenceRaced",
    "SchemaTooNew",
    "fence",
    "guard",
    "install",
    "installed_version",
    "sql",
    "transaction",
    "unguard",
]

#: The schema version of the SQL file this package ships.
SCHEMA_VERSION = 1

#: SQLSTATE: the token is below the lease's fence (raised as :class:`palisade.Fenced`).
STALE_TOKEN = "PF001"
#: SQLSTATE: a write to a guarded table from a transaction that did not fence its lease.
NOT_FENCED = "PF002"
#: SQLSTATE: invalid lease name (raised as :class:`palisade.BadRequest`).
INVALID_LEASE = "PF003"
#: SQLSTATE: invalid token, below 1 (raised as :class:`palisade.BadRequest`).
INVALID_TOKEN = "PF004"
#: SQLSTATE: REPEATABLE READ/SERIALIZABLE only, the fence moved after the
#: transaction's snapshot while raising it (raised as :class:`FenceRaced`).
FENCE_RACED = "PF005"
#: SQLSTATE: the database holds a newer schema version (raised as :class:`SchemaTooNew`).
SCHEMA_TOO_NEW = "PF006"

log = logging.getLogger("palisade")

_MAX_TOKEN = 2**63 - 1
_DETAIL_FENCE = re.compile(r"\bfence=(\d+)")
#: A raise that raced with another one under REPEATABLE READ/SERIALIZABLE is
#: retried this many times by :func:`transaction` (before any of the caller's
#: statements ran).
_RACE_ATTEMPTS = 3

#: What :func:`fence` runs on: a connection or one of its cursors.
Target = Union["psycopg.Connection[Any]", "psycopg.Cursor[Any]"]


class SchemaTooNew(PalisadeError):
    """The database holds a newer version of the fence schema than this
    package's SQL file (``PF006``): upgrade the SDK; nothing was changed."""


class FenceRaced(PalisadeError):
    """``PF005``: under REPEATABLE READ or SERIALIZABLE, the fence was raised
    by a transaction that committed after this one's snapshot, while this one
    was raising it; its snapshot cannot tell whether the token is stale. Roll
    back and retry the transaction: the retry passes, or raises
    :class:`palisade.Fenced`. (:func:`transaction` and ``Lease.fenced`` retry
    by themselves.)"""


def sql() -> str:
    """The text of ``palisade_fence.sql``: one DO statement, for a migration
    tool or ``psql -f``."""
    return resources.files("palisade").joinpath("sql/palisade_fence.sql").read_text("utf-8")


def install(conn: "psycopg.Connection[Any]") -> int:
    """Installs (or leaves alone, when this version is there) the fence schema;
    answers its version. Runs in its own transaction (a savepoint if ``conn``
    is in one). Raises :class:`SchemaTooNew` if the database has a newer
    version."""
    text = sql()
    try:
        with conn.transaction():
            conn.execute(text.encode())
    except psycopg.Error as err:
        if err.sqlstate == SCHEMA_TOO_NEW:
            raise SchemaTooNew(err.diag.message_primary or str(err)) from err
        raise
    return SCHEMA_VERSION


def installed_version(conn: "psycopg.Connection[Any]") -> Optional[int]:
    """The fence schema version installed in the database, ``None`` if none."""
    row = conn.execute("SELECT pg_catalog.to_regclass('palisade.version') IS NOT NULL").fetchone()
    if row is None or not row[0]:
        return None
    row = conn.execute("SELECT version FROM palisade.version WHERE part = 'fence'").fetchone()
    return int(row[0]) if row is not None else None


def guard(
    conn: "psycopg.Connection[Any]",
    table: str,
    *,
    lease_column: Optional[str] = None,
    lease: Optional[str] = None,
) -> None:
    """Makes ``table`` (a name as SQL's ``regclass`` reads it: ``orders``,
    ``app.orders``, ``"Orders"``) refuse writes (``PF002``) from transactions
    that did not call ``palisade.fence`` for the lease: the row's
    ``lease_column`` (checked on the new row and on the old one; TRUNCATE is
    refused), or one ``lease`` for the whole table. Give exactly one.
    Replaces an earlier guard of the table. Runs in its own transaction (a
    savepoint if ``conn`` is in one).

    The check reads a transaction-local setting that ``palisade.fence``
    writes; a client can forge it: guard mode stops forgetting, not malice."""
    if (lease_column is None) == (lease is None):
        raise BadRequest("guard() takes exactly one of lease_column= and lease=")
    if lease is not None:
        check_lease_name(lease)
    with conn.transaction():
        if lease_column is not None:
            conn.execute("SELECT palisade.guard(%s::regclass, %s)", (table, lease_column))
        else:
            conn.execute("SELECT palisade.guard_table(%s::regclass, %s)", (table, lease))


def unguard(conn: "psycopg.Connection[Any]", table: str) -> None:
    """Removes the guard of ``table`` (if any)."""
    with conn.transaction():
        conn.execute("SELECT palisade.unguard(%s::regclass)", (table,))


def _check_token(token: int) -> None:
    if isinstance(token, bool) or not isinstance(token, int) or not 1 <= token <= _MAX_TOKEN:
        raise BadRequest(f"invalid fencing token {token!r}: an integer in 1..{_MAX_TOKEN}")


def _translate(err: "psycopg.Error", token: int) -> Optional[PalisadeError]:
    """The SDK error for a refusal of ``palisade.fence``, ``None`` for any
    other database error."""
    state = err.sqlstate
    message = err.diag.message_primary or str(err)
    if state == STALE_TOKEN:
        match = _DETAIL_FENCE.search(err.diag.message_detail or "")
        return Fenced(token, int(match.group(1)) if match else 0)
    if state in (INVALID_LEASE, INVALID_TOKEN):
        return BadRequest(message)
    if state == FENCE_RACED:
        return FenceRaced(message)
    return None


def fence(target: Target, lease: str, token: int) -> int:
    """``SELECT palisade.fence(lease, token)`` on ``target`` (a connection or a
    cursor), for code that manages its own transactions: call it in the
    transaction, before its writes. Answers the fence (the token).

    Raises :class:`palisade.Fenced` when the token is below the fence (another
    holder took over: stop acting as leader), :class:`FenceRaced` (retry the
    transaction), :class:`palisade.BadRequest` for a bad lease name or token
    (refused before anything is sent). After a refusal the transaction is
    aborted: roll it back."""
    check_lease_name(lease)
    _check_token(token)
    return _call_fence(target, lease, token, None)


def _call_fence(target: Target, lease: str, token: int, idle_ms: Optional[int]) -> int:
    """``palisade.fence(lease, token)``, with the transaction's idle timeout
    set in the same statement (one round trip) when ``idle_ms`` is given."""
    try:
        if idle_ms is None:
            row = target.execute("SELECT palisade.fence(%s, %s)", (lease, token)).fetchone()
        else:
            row = target.execute(
                "SELECT palisade.fence(%s, %s), pg_catalog.set_config("
                "'idle_in_transaction_session_timeout', %s, true)",
                (lease, token, str(idle_ms)),
            ).fetchone()
    except psycopg.Error as err:
        mapped = _translate(err, token)
        if mapped is None:
            raise
        raise mapped from err
    if row is None:  # pragma: no cover - a SELECT of a function answers one row
        raise PalisadeError("palisade.fence answered no row")
    return int(row[0])


def transaction(
    conn: "psycopg.Connection[Any]",
    lease: str,
    token: int,
    *,
    idle_timeout: Optional[float] = None,
) -> "contextlib.AbstractContextManager[psycopg.Cursor[Any]]":
    """A fenced transaction on ``conn`` (which must not be in a transaction):
    begins one, calls ``palisade.fence(lease, token)``, yields a cursor;
    commits when the block ends, rolls back if it raises. Raises
    :class:`palisade.Fenced` (nothing of the block ran) when the token is
    stale. ``idle_timeout`` (seconds) sets ``idle_in_transaction_session_timeout``
    for this transaction: a holder frozen inside it for longer loses its
    session, so a newer holder's raise does not wait for it forever.
    ``Lease.fenced`` is the same with the lease's own checks."""
    return _fenced(conn, lease, token, idle_timeout=idle_timeout, check=None, on_stale=None)


@contextlib.contextmanager
def _fenced(
    conn: "psycopg.Connection[Any]",
    lease: str,
    token: int,
    *,
    idle_timeout: Optional[float],
    check: Optional[Callable[[], object]],
    on_stale: Optional[Callable[[Fenced], None]],
) -> Iterator["psycopg.Cursor[Any]"]:
    """The fenced transaction behind :func:`transaction` and ``Lease.fenced``:
    ``check`` raises (a ``LeaseLost``) when the lease is not held, before the
    transaction and before its commit; ``on_stale`` hears of a stale token."""
    if check is not None:
        check()
    check_lease_name(lease)
    _check_token(token)
    if idle_timeout is not None and idle_timeout < 0:
        raise BadRequest("idle_timeout must be >= 0")
    status = conn.info.transaction_status
    if status != TransactionStatus.IDLE:
        raise BadRequest(
            "a fenced transaction begins its own, but the connection is "
            + ("in a transaction" if status != TransactionStatus.UNKNOWN else "broken")
            + f" ({status.name}): commit or roll back first"
        )
    attempt = 0
    while True:
        attempt += 1
        tx = conn.transaction()
        tx.__enter__()
        cur = conn.cursor()
        try:
            _call_fence(cur, lease, token, max(1, int(idle_timeout * 1000)) if idle_timeout else None)
            break
        except BaseException as err:
            cur.close()
            # Rolls back; the original error goes on (Fenced, FenceRaced,
            # a database error, KeyboardInterrupt...).
            _roll_back(tx, err)
            if isinstance(err, Fenced) and on_stale is not None:
                on_stale(err)
            if isinstance(err, FenceRaced) and attempt < _RACE_ATTEMPTS:
                log.debug("fence of %s raced with another raise; retrying: %s", lease, err)
                continue
            raise
    try:
        yield cur
    except BaseException as err:
        cur.close()
        if tx.__exit__(type(err), err, err.__traceback__):
            return  # psycopg.Rollback: rolled back, as asked
        raise
    cur.close()
    if check is not None:
        try:
            check()
        except BaseException as err:
            _roll_back(tx, err)  # no longer held: do not commit
            raise
    tx.__exit__(None, None, None)  # commits


def _roll_back(tx: "contextlib.AbstractContextManager[Any]", err: BaseException) -> None:
    """Rolls ``tx`` back because of ``err``, which the caller raises: a
    rollback that fails (a session the server ended, say: the server rolled
    it back) must not hide it."""
    try:
        tx.__exit__(type(err), err, err.__traceback__)
    except psycopg.Error as rollback_err:
        log.debug("rollback after %r failed: %s", err, rollback_err)
