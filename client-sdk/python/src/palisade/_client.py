"""The :class:`Client`: the election cluster (and a gateway) over HTTP, with
bounded retries."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from types import TracebackType
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Type, Union
from urllib.parse import quote

from ._errors import BadRequest, Held, LockDelay, PalisadeError, ProtocolError
from ._lease import Lease
from ._shared import OnLost
from ._model import (
    Grant,
    GrantId,
    LeaseInfo,
    Object,
    ObjectInfo,
    ObjectPage,
    Transition,
    check_lease_name,
)
from ._options import AcquireOptions, new_secret
from ._transport import ClientConfig, Transport
from ._watch import PrefixWatch, WatchCursor, silence_bound

#: The ``palisade dev`` election nodes, the default of :meth:`Client.from_env`.
DEFAULT_ELECTION = "http://127.0.0.1:7001,http://127.0.0.1:7002,http://127.0.0.1:7003"
#: The ``palisade dev`` gateway, the default of :meth:`Client.from_env`.
DEFAULT_GATEWAY = "http://127.0.0.1:8080"

def _check_api_key(key: str) -> str:
    key = key.strip()
    if not key or any(not 0x21 <= ord(c) <= 0x7E for c in key):
        raise BadRequest("an API key must be non-empty visible ASCII")
    return key


class Client:
    """The election cluster (and gateway) client. Thread-safe; share one per
    process and :meth:`close` it (or use it as a context manager) at the end.

    >>> client = Client(["http://127.0.0.1:7001", "http://127.0.0.1:7002"],
    ...                 gateway="http://127.0.0.1:8080", api_key="pal_...")  # doctest: +SKIP
    >>> with client.lease("cron", "worker-1", ttl=5.0, wait=30.0) as lease:  # doctest: +SKIP
    ...     lease.put("cron/last-run", b"2026-11-22")
    """

    def __init__(
        self,
        election: Union[str, Sequence[str]],
        gateway: Optional[str] = None,
        *,
        ca: Optional[str] = None,
        client_cert: Optional[str] = None,
        client_key: Optional[str] = None,
        api_key: Optional[str] = None,
        api_key_file: Optional[str] = None,
        request_timeout: float = 2.0,
        retry_budget: float = 5.0,
        drift_margin_ratio: float = 0.1,
        renew_ratio: float = 1.0 / 3.0,
        fence_on_acquire: bool = True,
        verify_jwt: bool = True,
        renew_stream: bool = True,
    ) -> None:
        """A client of the election nodes ``election`` (base URLs, a list or
        one comma-separated string; any node will do) and the gateway
        ``gateway``.

        ``ca`` is a PEM file: the only CA trusted for ``https://`` URLs
        (without it, certifi's CAs, as httpx uses). ``client_cert`` and
        ``client_key`` (PEM files, both or neither) are presented over client
        TLS: a certificate a policy names is that principal, no API key
        needed. ``api_key`` (or the
        first line of ``api_key_file``) is sent as ``x-palisade-key`` on every
        request. ``request_timeout`` bounds one HTTP request (a renewal
        attempt gets less when its lease cannot afford it: a third of the
        time left to the safe deadline, at least 0.1 s, then the renewal
        goes to the next node too) and ``retry_budget`` one election
        call's retries (seconds). A lease's safe
        deadline is ``send time + ttl - ttl * drift_margin_ratio``; it is
        renewed every ``ttl * renew_ratio``; with ``fence_on_acquire`` (and a
        gateway) the fence is raised right after acquiring; with
        ``verify_jwt`` every grant's JWT is checked against ``/v1/jwks``. With
        ``renew_stream`` the leases renew over one HTTP/2 stream to the
        leader (``/v1/renew/stream``), by request whenever it cannot carry
        a renewal; without it, one request per renewal.

        Raises :class:`BadRequest` for an unusable key, key file, CA file or
        client certificate.
        """
        if isinstance(election, str):
            endpoints = [e.strip() for e in election.split(",") if e.strip()]
        else:
            endpoints = [e.strip() for e in election if e.strip()]
        if (client_cert is None) != (client_key is None):
            raise BadRequest("client_cert and client_key go together: give both or neither")
        if api_key is None and api_key_file is not None:
            try:
                with open(api_key_file, encoding="utf-8") as f:
                    lines = f.read().splitlines()
            except OSError as err:
                raise BadRequest(f"{api_key_file}: {err}") from err
            api_key = lines[0] if lines else ""
        if api_key is not None:
            api_key = _check_api_key(api_key)
        if not request_timeout > 0 or not retry_budget >= 0:
            raise BadRequest(
                f"bad timeouts: request_timeout={request_timeout!r}, retry_budget={retry_budget!r}"
            )
        self._transport = Transport(
            ClientConfig(
                election=endpoints,
                gateway=gateway,
                ca=ca,
                client_cert=client_cert,
                client_key=client_key,
                api_key=api_key,
                request_timeout=request_timeout,
                retry_budget=retry_budget,
                drift_margin_ratio=drift_margin_ratio,
                renew_ratio=renew_ratio,
                fence_on_acquire=fence_on_acquire,
                verify_jwt=verify_jwt,
                renew_stream=renew_stream,
            )
        )

    @classmethod
    def from_env(cls, **options: Any) -> "Client":
        """The client the environment describes, as the CLI and the Rust SDK
        read it: ``PALISADE_ELECTION`` (comma-separated URLs; default the
        ``palisade dev`` nodes on 127.0.0.1:7001-7003), ``PALISADE_GATEWAY``
        (default ``http://127.0.0.1:8080``), ``PALISADE_CA`` (a CA file),
        ``PALISADE_CLIENT_CERT`` and ``PALISADE_CLIENT_KEY`` (a client
        certificate), ``PALISADE_API_KEY`` or ``PALISADE_API_KEY_FILE`` (the
        API key; with both set the key wins).
        Keyword ``options`` are passed on to the constructor and win: an
        ``api_key`` or ``api_key_file`` option beats both variables."""

        def var(name: str) -> Optional[str]:
            value = os.environ.get(name)
            return value if value is not None and value.strip() else None

        kwargs: Dict[str, Any] = {
            "gateway": var("PALISADE_GATEWAY") or DEFAULT_GATEWAY,
            "ca": var("PALISADE_CA"),
            "client_cert": var("PALISADE_CLIENT_CERT"),
            "client_key": var("PALISADE_CLIENT_KEY"),
        }
        # A key given as an option (api_key or api_key_file) beats both
        # variables; of the variables, the key beats the key file (as the
        # CLI and the Rust and Go SDKs read them).
        key = var("PALISADE_API_KEY")
        if "api_key" in options or "api_key_file" in options:
            pass
        elif key is not None:
            kwargs["api_key"] = key.splitlines()[0] if key.strip() else key
        else:
            kwargs["api_key_file"] = var("PALISADE_API_KEY_FILE")
        kwargs.update(options)
        election = kwargs.pop("election", None) or var("PALISADE_ELECTION") or DEFAULT_ELECTION
        return cls(election, **kwargs)

    @property
    def config(self) -> ClientConfig:
        """The configuration."""
        return self._transport.config

    def close(self) -> None:
        """Closes the connection pool (held leases keep their own renew
        threads until released, and need the pool: release them first)."""
        self._transport.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    # -- leases -------------------------------------------------------------

    def acquire(
        self,
        lease: str,
        holder: str,
        ttl: float = 5.0,
        wait: Optional[float] = None,
        on_lost: Optional[OnLost] = None,
        *,
        options: Optional[AcquireOptions] = None,
    ) -> Lease:
        """Acquires ``lease`` for ``holder`` with ``ttl`` seconds, waiting up to
        ``wait`` seconds for it to be free (``None``: try once). Raises the
        gateway fence to the new token first (fence-on-acquire) and returns a
        :class:`Lease` that renews itself in a background thread until
        released or lost; ``on_lost(reason)`` is called once on loss.
        ``options`` asks for a priority, preemptibility, lock-delay or
        max-hold.

        Raises :class:`Held` if someone else holds it (after ``wait``),
        :class:`LockDelay` if a lock-delay outlasts ``wait``,
        :class:`Unavailable` if no quorum answered, :class:`BadRequest` for a
        bad name, holder, ttl or option, :class:`Unauthorized`/
        :class:`Forbidden` under a policy."""
        grant, sent = self._acquire(lease, holder, ttl, wait, options)
        lock_delayed = options is not None and options.lock_delay > 0
        handle = Lease(self._transport, grant, sent, on_lost, lock_delayed=lock_delayed)
        if self.config.fence_on_acquire and self.config.gateway:
            try:
                handle.fence()
            except BaseException:
                # Give the lease back: the caller never saw it.
                try:
                    handle.release()
                except PalisadeError:
                    pass
                raise
        return handle

    @contextlib.contextmanager
    def lease(
        self,
        lease: str,
        holder: str,
        ttl: float = 5.0,
        wait: Optional[float] = None,
        on_lost: Optional[OnLost] = None,
        *,
        options: Optional[AcquireOptions] = None,
    ) -> Iterator[Lease]:
        """``with client.lease(name, holder, ttl=5.0, wait=30.0) as lease:``
        — :meth:`acquire` on entry, release on exit (if still held)."""
        with self.acquire(lease, holder, ttl, wait, on_lost, options=options) as handle:
            yield handle

    def acquire_grant(
        self,
        lease: str,
        holder: str,
        ttl: float = 5.0,
        wait: Optional[float] = None,
        *,
        options: Optional[AcquireOptions] = None,
    ) -> Grant:
        """One acquire, without a renewing handle or a fence (for tools that
        manage renewals themselves). Errors as :meth:`acquire`."""
        return self._acquire(lease, holder, ttl, wait, options)[0]

    def _acquire(
        self,
        lease: str,
        holder: str,
        ttl: float,
        wait: Optional[float],
        options: Optional[AcquireOptions],
    ) -> Tuple[Grant, float]:
        """Acquires, waiting up to ``wait``; the grant and the send time of
        the request that got it (where its safe deadline starts)."""
        check_lease_name(lease)
        if not holder:
            raise BadRequest("the holder must not be empty")
        if not ttl > 0:
            raise BadRequest(f"bad ttl {ttl!r}")
        terms = (options or AcquireOptions()).body()
        # Our own secret, the same for every request of this call, so that a
        # retry (its answer lost, or a slice that timed out here but was
        # granted there) is recognised as the same client: the same grant.
        secret = new_secret()
        path = f"/v1/leases/{lease}/acquire"
        config = self.config
        deadline = time.monotonic() + max(wait or 0.0, 0.0)
        while True:
            # A long wait is asked for in slices of half a request timeout, so
            # each request (timeout: request_timeout = slice + a margin) stuck
            # on a leader that died or froze costs one request timeout, not
            # the whole wait.
            body: Dict[str, Any] = {
                "holder": holder,
                "ttl_ms": int(round(ttl * 1000)),
                "secret": secret,
                **terms,
            }
            if wait is not None:
                remaining = max(deadline - time.monotonic(), 0.0)
                body["wait_ms"] = int(min(remaining, config.request_timeout / 2) * 1000)
            # Before the first attempt: if a retry is what gets the answer,
            # the grant may date from the first one.
            sent = time.monotonic()
            answer = self._transport.election("POST", path, body)
            if answer.status == 200:
                grant = Grant.from_json(answer.ok_object())
                if grant.secret is None:  # a cluster that predates secrets
                    grant = dataclasses.replace(grant, secret=secret)
                self._transport.verify_grant(grant)
                return grant, sent
            error = answer.error()
            if isinstance(error, Held) and time.monotonic() < deadline:
                continue
            if isinstance(error, LockDelay) and time.monotonic() < deadline:
                # The node waits out a lock-delay only within the slice.
                time.sleep(max(0.0, min(error.retry_after, deadline - time.monotonic())))
                continue
            raise error

    def renew_grant(self, grant_id: GrantId) -> Grant:
        """Renews a grant once (a :class:`Lease` does it by itself). Raises
        :class:`LeaseLost` if the grant is gone, revoked or the secret
        wrong."""
        return self._transport.renew_grant(grant_id)

    def handover_grant(self, grant_id: GrantId, successor: str) -> int:
        """Hands a grant to ``successor`` (:meth:`Lease.handover_to` is the
        way for a held lease); the successor's token. Raises
        :class:`LeaseLost` if ``grant_id`` does not name the current grant,
        :class:`BadRequest` for a bad successor."""
        return self._transport.handover(grant_id, successor)

    def release_grant(self, grant_id: GrantId) -> None:
        """Releases a grant (``grant_id`` carries the secret and the grant
        index, so a late release never frees a newer grant). Raises
        :class:`LeaseLost` if it does not name the current grant."""
        self._transport.release_grant(grant_id)

    def revoke(self, lease: str, token: int) -> None:
        """Revokes ``lease``'s grant ``token`` without its secret (an
        operator's call): renewals stop at once, and the lease is free when
        the grant's current deadline passes. Raises :class:`LeaseLost` if
        ``token`` is not the current grant."""
        answer = self._transport.election("POST", f"/v1/leases/{lease}/revoke", {"token": token})
        if answer.status != 200:
            raise answer.error()

    def get(self, lease: str) -> LeaseInfo:
        """The lease as the leader sees it. Raises :class:`NotFound` if it
        has no record."""
        answer = self._transport.election("GET", f"/v1/leases/{lease}")
        return LeaseInfo.from_json(answer.ok_object())

    def history(self, lease: str) -> List[Transition]:
        """The lease's last transitions, oldest first (the cluster keeps a
        few per lease). Raises :class:`NotFound` if it has no record."""
        answer = self._transport.election("GET", f"/v1/leases/{lease}/history")
        entries = answer.ok_object().get("history")
        if not isinstance(entries, list):
            raise ProtocolError(200, "a history answer without its history")
        return [Transition.from_json(e) for e in entries if isinstance(e, dict)]

    def list(self, prefix: str = "") -> List[LeaseInfo]:
        """Every lease (under ``prefix``) in name order, page by page."""
        leases: List[LeaseInfo] = []
        after: Optional[str] = None
        for _ in range(1_000_000):
            params = [f"prefix={prefix}"] if prefix else []
            if after is not None:
                params.append(f"after={after}")
            path = "/v1/leases" + ("?" + "&".join(params) if params else "")
            page = self._transport.election("GET", path).ok_object()
            entries = page.get("leases")
            if not isinstance(entries, list):
                raise ProtocolError(200, "the lease list has no leases")
            leases.extend(LeaseInfo.from_json(e) for e in entries)
            nxt = page.get("next")
            if not isinstance(nxt, str):
                break
            after = nxt
        return leases

    def watch(self, lease: str, index: int, wait: float = 30.0) -> LeaseInfo:
        """Waits (up to ``wait`` seconds) for ``lease`` to change after
        ``index``; returns its state. Pass the returned ``modify_index`` as
        the next ``index``. Raises :class:`NotFound` if it has no record."""
        path = f"/v1/leases/{lease}/watch?index={index}&wait_ms={int(wait * 1000)}"
        answer = self._transport.election("GET", path, extra=wait)
        return LeaseInfo.from_json(answer.ok_object())

    def watch_prefix(
        self, prefix: str = "", cursor: Optional[WatchCursor] = None, keepalive: float = 10.0
    ) -> PrefixWatch:
        """Opens one stream of the changes to every lease whose name starts
        with ``prefix``: first each such lease as it is now (after
        ``cursor``; ``None``: all of them), then every change, and a
        keep-alive per partition every ``keepalive`` seconds (0.1..60).
        Iterate it for :class:`WatchEvent` objects; on a cluster of several
        partitions one stream follows all of them, each event naming its
        partition. Once it ends, pass its ``cursor`` here again to resume.
        Raises :class:`Forbidden` outside the caller's ``read`` right,
        :class:`BadRequest` for a bad cursor, :class:`Unavailable` when no
        node opens it, and nothing on the stream for 35 s (or 25 s past
        ``keepalive``) ends it with :class:`Unavailable`."""
        start = WatchCursor(list(cursor.indexes), cursor.partitioned) if cursor else WatchCursor()
        query = f"prefix={quote(prefix, safe='')}&keepalive_ms={int(keepalive * 1000)}"
        if not 0.1 <= keepalive <= 60.0:
            raise BadRequest(f"keepalive must be 0.1..60 seconds, not {keepalive}")
        path = f"/v1/watch?{query}{start.query()}"
        return self._transport.open_watch(path, start, silence_bound(keepalive))

    # -- cluster ------------------------------------------------------------

    def cluster(self) -> Dict[str, Any]:
        """``/v1/cluster`` of the first node that answers."""
        return self._transport.election("GET", "/v1/cluster").ok_object()

    def jwks(self) -> Dict[str, Any]:
        """The cluster's JWKS (``/v1/jwks``)."""
        return self._transport.election("GET", "/v1/jwks").ok_object()

    def verify_jwt(self, grant: Grant) -> Dict[str, Any]:
        """Verifies a grant's JWT against the JWKS (signature, issuer, lease,
        holder, token); its claims. Raises :class:`ProtocolError`."""
        return self._transport._verifier.verify(grant)

    def rotate_key(self) -> str:
        """Rotates the cluster's signing key; the new key's id."""
        answer = self._transport.election("POST", "/v1/cluster/rotate-key", {})
        kid = answer.ok_object().get("kid")
        return kid if isinstance(kid, str) else ""

    def add_member(self, node_id: int, addr: str) -> Dict[str, Any]:
        """Adds node ``node_id`` (peer address ``addr``): a learner until
        caught up, then a voter. Waits up to a minute."""
        body = {"id": node_id, "addr": addr}
        return self._transport.election("POST", "/v1/cluster/members", body, extra=60.0).ok_object()

    def remove_member(self, node_id: int) -> Dict[str, Any]:
        """Removes node ``node_id`` from the cluster (never the last voter)."""
        answer = self._transport.election("DELETE", f"/v1/cluster/members/{node_id}", extra=10.0)
        return answer.ok_object()

    # -- gateway ------------------------------------------------------------

    def get_object(self, key: str) -> Optional[Object]:
        """Reads ``key`` through the gateway; ``None`` if there is none.
        Reads are not fenced and need no lease."""
        return self._transport.gateway.get_object(key)

    def head_object(self, key: str) -> Optional[ObjectInfo]:
        """``key``'s version, token and size (``HEAD``, without its bytes);
        ``None`` if there is no object."""
        return self._transport.gateway.head_object(key)

    def list_objects(
        self, prefix: str = "", after: Optional[str] = None, limit: int = 100
    ) -> ObjectPage:
        """One page of the objects whose keys start with ``prefix`` (a plain
        string prefix: it may span leases), in byte order of their keys,
        after the key ``after`` (exclusive), at most ``limit`` (1..=1000) of
        them. Pass the page's ``next`` as ``after`` while it is not
        ``None``. Under a policy, objects of leases the API key may not read
        are left out (a page may then be short while ``next`` is set).
        Raises :class:`BadRequest` for a bad limit (before sending)."""
        return self._transport.gateway.list_objects(prefix, after, limit)

    def iter_objects(self, prefix: str = "", *, limit: int = 100) -> Iterator[ObjectInfo]:
        """Every object under ``prefix``, page by page (``limit`` a page),
        in key order: :meth:`list_objects` until ``next`` is ``None``."""
        after: Optional[str] = None
        while True:
            page = self.list_objects(prefix, after, limit)
            yield from page.objects
            if page.next is None:
                return
            if after is not None and page.next.encode() <= after.encode():
                raise ProtocolError(200, f"a listing's next {page.next!r} does not move past {after!r}")
            after = page.next
