"""Fenced transactions in your own PostgreSQL (psycopg 3).

The SQL side is ``palisade/sql/palisade_fence.sql`` (:func:`sql`), the same
file the Rust SDK installs: a ``palisade`` schema with a fence table and
``palisade.fence(lease, proof)``. Called inside a transaction, before its
writes, with the lease's JWT as proof, it checks the JWT's signature against
the cluster's keys (:func:`set_keys`), refuses a token below the lease's fence
(SQLSTATE ``PF001``) and otherwise raises the fence to the token, in that
transaction: the fence and the writes commit or roll back together, and once a
newer token has raised the fence no transaction with an older one commits.

::

    import psycopg, palisade
    from palisade import postgres

    owner = psycopg.connect(OWNER_DSN)           # once per database, as its owner:
    postgres.install(owner)                      #   the schema (a no-op when installed)
    postgres.set_keys(owner, client.jwks())      #   the cluster's keys (again after a rotation)
    postgres.allow(owner, "app")                 #   the role that fences

    conn = psycopg.connect(APP_DSN)
    with client.lease("orders", "worker-1", ttl=5.0) as lease:
        with lease.fenced(conn) as cur:          # BEGIN; palisade.fence(name, jwt)
            cur.execute("UPDATE orders SET ...")
        # committed; palisade.Fenced (a LeaseLost) if another holder took over

Without an SDK lease (the JWT from ``palisade run``'s ``PALISADE_JWT_FILE``,
or your own transaction code): :func:`transaction` and :func:`fence`.
:func:`guard` makes a table refuse writes from transactions that did not
fence its lease (``PF002``). :func:`fence_unverified` and
:func:`transaction_unverified` take a bare token, for roles the database
trusts as it trusts the cluster (:func:`trust`).

psycopg is an optional dependency (``pip install 'palisade-client[postgres]'``):
``import palisade`` works without it; importing this module does not.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import weakref
from importlib import resources
from typing import Any, Callable, Dict, Iterator, Optional, Union

try:
    import psycopg
    from psycopg.pq import TransactionStatus
except ImportError as _missing:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "palisade.postgres needs psycopg 3: pip install 'palisade-client[postgres]' "
        "(or 'psycopg[binary]')"
    ) from _missing

from ._errors import BadRequest, Fenced, PalisadeError, Unauthorized
from ._model import check_lease_name

__all__ = [
    "FENCE_RACED",
    "INVALID_LEASE",
    "INVALID_TOKEN",
    "NOT_FENCED",
    "PROOF_REFUSED",
    "SCHEMA_TOO_NEW",
    "SCHEMA_VERSION",
    "STALE_TOKEN",
    "FenceRaced",
    "SchemaTooNew",
    "allow",
    "fence",
    "fence_unverified",
    "guard",
    "install",
    "installed_version",
    "prove",
    "set_keys",
    "sql",
    "transaction",
    "transaction_unverified",
    "trust",
    "unguard",
]

#: The schema version of the SQL file this package ships.
SCHEMA_VERSION = 3

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
#: SQLSTATE: the proof (the lease's JWT) is refused: malformed, a bad signature,
#: a key the database does not trust (run :func:`set_keys` after a rotation),
#: another lease's, or expired (raised as :class:`palisade.Unauthorized`).
PROOF_REFUSED = "PF007"

log = logging.getLogger("palisade")

_MAX_TOKEN = 2**63 - 1
_DETAIL_TOKEN = re.compile(r"\btoken=(\d+)")
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


def set_keys(conn: "psycopg.Connection[Any]", jwks: Dict[str, Any]) -> int:
    """Installs the cluster's signing keys (its JWKS, as ``GET /v1/jwks``
    answers it: ``client.jwks()``) as the keys proofs are checked against;
    keys missing from it are retired, with the proofs they signed. Run it
    after installing and after every key rotation or retirement (``palisade
    sql keys --follow`` keeps doing it). A set older than the installed one
    (a lower ``applied_index``) changes nothing. Answers the number of keys
    installed (0 when the set was older). The schema's owner only."""
    with conn.transaction():
        row = conn.execute("SELECT palisade.set_keys(%s::jsonb)", (json.dumps(jwks),)).fetchone()
    return int(row[0]) if row is not None else 0


def allow(conn: "psycopg.Connection[Any]", role: str) -> None:
    """Lets ``role`` fence with proof (``palisade.fence``, ``palisade.prove``):
    nothing in the schema is callable by other roles until then. The
    schema's owner only."""
    with conn.transaction():
        conn.execute("SELECT palisade.allow(%s)", (role,))


def trust(conn: "psycopg.Connection[Any]", role: str) -> None:
    """Lets ``role`` also call ``palisade.fence_unverified``, which believes
    any token: such a role can write past any guard and raise any fence.
    Only for roles trusted as much as the cluster."""
    with conn.transaction():
        conn.execute("SELECT palisade.trust(%s)", (role,))


def _translate(err: "psycopg.Error", token: int) -> Optional[PalisadeError]:
    """The SDK error for a refusal of ``palisade.fence`` (``token`` 0: read
    it from the refusal), ``None`` for any other database error."""
    state = err.sqlstate
    message = err.diag.message_primary or str(err)
    if state == STALE_TOKEN:
        if token == 0:
            match = _DETAIL_TOKEN.search(err.diag.message_detail or "")
            token = int(match.group(1)) if match else 0
        return Fenced(token, 0)  # the database does not tell the fence
    if state == PROOF_REFUSED:
        return Unauthorized(f"postgres: {message}")
    if state in (INVALID_LEASE, INVALID_TOKEN):
        return BadRequest(message)
    if state == FENCE_RACED:
        return FenceRaced(message)
    return None


def prove(conn: Target, proof: str) -> int:
    """``SELECT palisade.prove(proof)``: checks the JWT's signature and caches
    it in the database (committed at once on a connection in autocommit, or
    with its transaction), so ``palisade.fence`` with it costs a hash and a
    lookup instead of a signature check (~20 ms of the database's CPU).
    Answers its token. ``Lease.fenced`` and :func:`transaction` do this once
    per JWT. Raises :class:`palisade.Unauthorized` when the proof is refused."""
    try:
        row = conn.execute("SELECT palisade.prove(%s)", (proof,)).fetchone()
    except psycopg.Error as err:
        mapped = _translate(err, 0)
        if mapped is None:
            raise
        raise mapped from err
    return int(row[0]) if row is not None else 0


def fence(target: Target, lease: str, proof: str) -> int:
    """``SELECT palisade.fence(lease, proof)`` on ``target`` (a connection or
    a cursor), for code that manages its own transactions: call it in the
    transaction, before its writes, with the lease's JWT. Answers the token.

    Raises :class:`palisade.Fenced` when the token is below the fence (another
    holder took over: stop acting as leader), :class:`palisade.Unauthorized`
    when the proof is refused (``PF007``), :class:`FenceRaced` (retry the
    transaction), :class:`palisade.BadRequest` for a bad lease name (refused
    before anything is sent). After a refusal the transaction is aborted:
    roll it back."""
    check_lease_name(lease)
    return _call_fence(target, lease, proof, None)


def fence_unverified(target: Target, lease: str, token: int) -> int:
    """``SELECT palisade.fence_unverified(lease, token)``: :func:`fence` without
    proof, for a role the database trusts (:func:`trust`)."""
    check_lease_name(lease)
    _check_token(token)
    return _call_fence(target, lease, token, None)


def _call_fence(target: Target, lease: str, proof: Union[str, int], idle_ms: Optional[int]) -> int:
    """``palisade.fence(lease, proof)`` (``fence_unverified`` for an int
    token), with the transaction's idle timeout set in the same statement
    (one round trip) when ``idle_ms`` is given."""
    call = "palisade.fence_unverified(%s, %s)" if isinstance(proof, int) else "palisade.fence(%s, %s)"
    try:
        if idle_ms is None:
            row = target.execute(f"SELECT {call}", (lease, proof)).fetchone()
        else:
            row = target.execute(
                f"SELECT {call}, pg_catalog.set_config('idle_in_transaction_session_timeout', %s, true)",
                (lease, proof, str(idle_ms)),
            ).fetchone()
    except psycopg.Error as err:
        mapped = _translate(err, proof if isinstance(proof, int) else 0)
        if mapped is None:
            raise
        raise mapped from err
    if row is None:  # pragma: no cover - a SELECT of a function answers one row
        raise PalisadeError("palisade.fence answered no row")
    return int(row[0])


#: Per connection, the last JWT :func:`prove` accepted on it.
_proven: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()


def _prove_once(conn: "psycopg.Connection[Any]", proof: str) -> None:
    """Proves ``proof`` on ``conn`` (outside any transaction: the cache entry
    commits at once) unless it was the last one proven there."""
    if _proven.get(conn) == proof:
        return
    with conn.transaction():
        prove(conn, proof)
    _proven[conn] = proof


def transaction(
    conn: "psycopg.Connection[Any]",
    lease: str,
    proof: str,
    *,
    idle_timeout: Optional[float] = None,
) -> "contextlib.AbstractContextManager[psycopg.Cursor[Any]]":
    """A fenced transaction on ``conn`` (which must not be in a transaction):
    proves the JWT once per connection (:func:`prove`), begins a transaction,
    calls ``palisade.fence(lease, proof)``, yields a cursor; commits when the
    block ends, rolls back if it raises. Raises :class:`palisade.Fenced`
    (nothing of the block ran) when the token is stale,
    :class:`palisade.Unauthorized` when the proof is refused.
    ``idle_timeout`` (seconds) sets ``idle_in_transaction_session_timeout``
    for this transaction: a holder frozen inside it for longer loses its
    session, so a newer holder's raise does not wait for it forever.
    ``Lease.fenced`` is the same with the lease's own checks."""
    return _fenced(conn, lease, lambda: proof, idle_timeout=idle_timeout, check=None, on_stale=None)


def transaction_unverified(
    conn: "psycopg.Connection[Any]",
    lease: str,
    token: int,
    *,
    idle_timeout: Optional[float] = None,
) -> "contextlib.AbstractContextManager[psycopg.Cursor[Any]]":
    """:func:`transaction` with a bare token (``palisade.fence_unverified``),
    for a role the database trusts (:func:`trust`)."""
    _check_token(token)
    return _fenced(conn, lease, lambda: token, idle_timeout=idle_timeout, check=None, on_stale=None)


@contextlib.contextmanager
def _fenced(
    conn: "psycopg.Connection[Any]",
    lease: str,
    proof: Callable[[], Union[str, int]],
    *,
    idle_timeout: Optional[float],
    check: Optional[Callable[[], object]],
    on_stale: Optional[Callable[[Fenced], None]],
) -> Iterator["psycopg.Cursor[Any]"]:
    """The fenced transaction behind :func:`transaction` and ``Lease.fenced``:
    ``proof`` answers the JWT (or, unverified, the token) and raises (a
    ``LeaseLost``) when the lease is not held; ``check`` raises likewise
    before the commit; ``on_stale`` hears of a stale token."""
    current = proof()
    check_lease_name(lease)
    if idle_timeout is not None and idle_timeout < 0:
        raise BadRequest("idle_timeout must be >= 0")
    status = conn.info.transaction_status
    if status != TransactionStatus.IDLE:
        raise BadRequest(
            "a fenced transaction begins its own, but the connection is "
            + ("in a transaction" if status != TransactionStatus.UNKNOWN else "broken")
            + f" ({status.name}): commit or roll back first"
        )
    if isinstance(current, str):
        _prove_once(conn, current)
    attempt = 0
    while True:
        attempt += 1
        tx = conn.transaction()
        tx.__enter__()
        cur = conn.cursor()
        try:
            _call_fence(cur, lease, current, max(1, int(idle_timeout * 1000)) if idle_timeout else None)
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
