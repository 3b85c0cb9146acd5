"""Palisade's Python client: leases that are safe by default.

- :class:`Client` talks to the election cluster (any node; bounded retries
  with backoff and jitter on transport errors, 503 and 429, never on 409 or
  any other 4xx) and to a storage gateway.
- :meth:`Client.lease` / :meth:`Client.acquire` give a :class:`Lease` that
  raises the gateway fence first, renews itself in a background thread every
  third of its ttl, keeps a safe deadline on :func:`time.monotonic` from the
  *send* time of the request, refuses writes locally after it, stamps its JWT
  on every write, and turns a 409 ``stale_token`` into :class:`LeaseLost`
  (precisely :class:`Fenced`).
- :class:`AcquireOptions` asks for a priority (a waiting higher priority
  preempts a preemptible holder: :class:`Preempted`), a lock-delay after an
  expiry (:class:`LockDelay`) or a cap on how long a grant is renewed;
  :meth:`Lease.handover_to` hands a held lease to a named successor.
- :class:`Elector` runs work only while leading.
- :meth:`Client.watch_prefix` streams every change under a prefix
  (:class:`PrefixWatch` of :class:`WatchEvent`), across every partition,
  and resumes from its :class:`WatchCursor`.
- The gateway as a store: :meth:`Client.list_objects` /
  :meth:`Client.iter_objects` (:class:`ObjectPage` of :class:`ObjectInfo`),
  :meth:`Client.head_object`, and conditional writes
  (``lease.put(key, value, if_match=...)`` / ``if_none_match=True``,
  ``lease.delete(key, if_match=...)``) raising :class:`PreconditionFailed`;
  a write answers a :class:`Written`, a delete a :class:`Deleted`, and
  :class:`Object` (a read) carries its version as an int.
- :mod:`palisade.postgres` (the ``postgres`` extra, psycopg 3) fences
  transactions in your own PostgreSQL: ``with lease.fenced(conn) as cur``.

Errors are all :class:`PalisadeError`; :class:`LeaseLost` means "stop
leading", :class:`Unavailable` transport trouble, :class:`Held` someone else
holds the lease.
"""

from ._client import DEFAULT_ELECTION, DEFAULT_GATEWAY, Client
from ._elector import Elector, Task
from ._errors import (
    BadRequest,
    Fenced,
    Forbidden,
    Held,
    LeaseLost,
    LockDelay,
    NotFound,
    PalisadeError,
    PreconditionFailed,
    Preempted,
    ProtocolError,
    Unauthorized,
    Unavailable,
)
from ._lease import Lease
from ._shared import OnLost
from ._model import (
    Deleted,
    Grant,
    GrantId,
    LeaseInfo,
    Object,
    ObjectInfo,
    ObjectPage,
    Transition,
    Written,
    check_lease_name,
    encode_key,
)
from ._options import AcquireOptions
from ._transport import API_KEY_HEADER, ClientConfig
from ._watch import PrefixWatch, WatchCursor, WatchEvent

__version__ = "0.1.0"

__all__ = [
    "API_KEY_HEADER",
    "AcquireOptions",
    "DEFAULT_ELECTION",
    "DEFAULT_GATEWAY",
    "BadRequest",
    "Client",
    "ClientConfig",
    "Deleted",
    "Elector",
    "Fenced",
    "Forbidden",
    "Grant",
    "GrantId",
    "Held",
    "Lease",
    "LeaseInfo",
    "LeaseLost",
    "LockDelay",
    "NotFound",
    "Object",
    "ObjectInfo",
    "ObjectPage",
    "OnLost",
    "PalisadeError",
    "PreconditionFailed",
    "Preempted",
    "PrefixWatch",
    "ProtocolError",
    "Task",
    "Transition",
    "Unauthorized",
    "Unavailable",
    "WatchCursor",
    "WatchEvent",
    "Written",
    "check_lease_name",
    "encode_key",
]
