"""What a :class:`palisade.Client` and its leases share: the HTTP client, the
one retry loop for election calls, the gateway calls and the JWT verifier.

Retry rules (the Rust SDK's): an election call is retried, on the next
endpoint, with exponential backoff and jitter, on transport failures
(connection refused, timeouts, a connection cut mid-call), 503 and 429, for
at most the retry budget. Every other answer (409 included, and every other
4xx) is returned to the caller as is, after exactly one request. Gateway
calls are sent once.

A renewal is hedged instead (``_hedge.py``): each attempt may go unanswered
for a share of the time left to the lease's safe deadline, then the same
renewal goes to the next node as well, and the first definitive answer wins.
"""

from __future__ import annotations

import logging
import random
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import certifi
import httpx

from ._endpoints import LEADER_HEADER, Endpoints, leader_hint
from ._answer import Answer, json_of
from ._errors import BadRequest, ProtocolError, Unavailable
from ._gateway import Gateway
from ._hedge import GaveUp, Outcome, Workers, hedged, retry_after
from ._jwks import JwtVerifier
from ._model import Grant, GrantId, JsonObject
from ._partitions import PartitionMap, lease_in_path
from ._stream import StreamRenewer
from ._watch import PrefixWatch, WatchCursor, open_watch

log = logging.getLogger("palisade")

#: The request header that carries a client's API key.
API_KEY_HEADER = "x-palisade-key"


@dataclass(frozen=True)
class ClientConfig:
    """How a :class:`palisade.Client` behaves (see its constructor)."""

    #: Election node base URLs (``http://host:port``); any node will do.
    election: List[str]
    #: The storage gateway's base URL, for fenced writes and reads.
    gateway: Optional[str] = None
    #: A PEM CA file: the only CA trusted for ``https://`` URLs.
    ca: Optional[str] = None
    #: A PEM client certificate and its key, presented over client TLS.
    client_cert: Optional[str] = None
    client_key: Optional[str] = None
    #: The API key sent as ``x-palisade-key`` (``repr`` hides it).
    api_key: Optional[str] = None
    #: Timeout of one HTTP request, in seconds (a renewal attempt's is cut
    #: to its slice of the time left to the lease's deadline: ``_hedge.py``).
    request_timeout: float = 2.0
    #: How long one election call keeps retrying transient failures, seconds.
    retry_budget: float = 5.0
    #: The safe deadline is ``send time + ttl - ttl * drift_margin_ratio``.
    drift_margin_ratio: float = 0.1
    #: Renew every ``ttl * renew_ratio``.
    renew_ratio: float = 1.0 / 3.0
    #: Raise the gateway fence right after acquiring (needs ``gateway``).
    fence_on_acquire: bool = True
    #: Verify every grant's JWT against the cluster's ``/v1/jwks``.
    verify_jwt: bool = True
    #: Renew over one HTTP/2 stream to the leader (``/v1/renew/stream``),
    #: falling back to one request per renewal when it cannot carry one.
    renew_stream: bool = True

    def __repr__(self) -> str:
        key = "<redacted>" if self.api_key else None
        return (
            f"ClientConfig(election={self.election!r}, gateway={self.gateway!r}, "
            f"ca={self.ca!r}, client_cert={self.client_cert!r}, api_key={key}, "
            f"request_timeout={self.request_timeout!r}, "
            f"retry_budget={self.retry_budget!r}, drift_margin_ratio={self.drift_margin_ratio!r}, "
            f"renew_ratio={self.renew_ratio!r}, fence_on_acquire={self.fence_on_acquire!r}, "
            f"verify_jwt={self.verify_jwt!r}, renew_stream={self.renew_stream!r})"
        )


class Transport:
    """The HTTP client and retry loop (internal; thread-safe)."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        verify: Union[ssl.SSLContext, bool] = True
        if config.ca is not None or config.client_cert is not None:
            verify = self.tls_context()
        headers: Dict[str, str] = {}
        if config.api_key is not None:
            headers[API_KEY_HEADER] = config.api_key
        self._http = httpx.Client(
            timeout=self._timeout(config.request_timeout),
            verify=verify,
            headers=headers,
            follow_redirects=False,
        )
        # Which node to ask first (the leader, when known), which to avoid.
        self._endpoints = Endpoints(config.election)
        #: The partition map (``_partitions.py``): a lease call goes to its
        #: partition's leader first, when known.
        self.partitions = PartitionMap()
        self._workers = Workers()
        self._verifier = JwtVerifier(self.published_keys, len(config.election))
        #: The gateway's object and fence calls (sent once each).
        self.gateway = Gateway(self._http, config.gateway)
        self._stream: Optional[StreamRenewer] = None
        if config.renew_stream:
            self._stream = StreamRenewer(
                self._endpoints,
                self._stream_tls,
                list(headers.items()),
                config.request_timeout,
                lambda: self._endpoints.identify(self._node_id_of),
            )

    @property
    def _preferred(self) -> int:
        """The endpoint tried first (modulo their number)."""
        return self._endpoints.preferred

    def tls_context(self) -> ssl.SSLContext:
        """A TLS context trusting ``ca`` (else certifi's CAs, as httpx
        does) and presenting the client certificate, if any."""
        config = self.config
        try:
            context = ssl.create_default_context(cafile=config.ca or certifi.where())
        except (OSError, ssl.SSLError) as err:
            raise BadRequest(f"{config.ca}: {err}") from err
        if config.client_cert is not None:
            try:
                context.load_cert_chain(config.client_cert, config.client_key)
            except (OSError, ssl.SSLError) as err:
                raise BadRequest(f"{config.client_cert}: {err}") from err
        return context

    def _stream_tls(self) -> ssl.SSLContext:
        context = self.tls_context()
        context.set_alpn_protocols(["h2"])
        return context

    @staticmethod
    def _timeout(seconds: float) -> httpx.Timeout:
        seconds = max(seconds, 0.001)
        return httpx.Timeout(seconds, connect=min(seconds, 0.5))

    def close(self) -> None:
        """Closes the renewal stream and the connection pool."""
        if self._stream is not None:
            self._stream.close()
        self._http.close()

    def election(
        self,
        method: str,
        path: str,
        body: Optional[Mapping[str, Any]] = None,
        extra: float = 0.0,
        until: Optional[float] = None,
        hedge: bool = False,
    ) -> Answer:
        """Sends one election request, retrying transport failures, 503s and
        429s on the next endpoint with backoff and jitter within the retry
        budget (lengthened by ``extra`` for calls that wait on purpose, as is
        each attempt's timeout). ``until`` (a :func:`time.monotonic` time)
        ends the retries earlier and cuts each attempt's timeout to it.
        Every other answer is returned as is. ``hedge`` (an idempotent call:
        a renewal) sends the call to the next node too whenever an attempt
        has gone unanswered for its slice of the time left (``_hedge.py``)."""
        endpoints = self._endpoints.urls
        if not endpoints:
            raise BadRequest("no election endpoints configured")
        if hedge:
            return self._hedged(method, path, body, until)
        first = self._first(path)
        started = time.monotonic()
        attempts = 0
        backoff = 0.02
        last = "no attempt made: the deadline had passed"
        order = self._endpoints.order(first)
        while True:
            now = time.monotonic()
            timeout = self.config.request_timeout + extra
            if until is not None:
                if now >= until:
                    raise Unavailable(attempts, now - started, last)
                timeout = min(timeout, until - now)
            index = order[attempts % len(order)]
            attempts += 1
            outcome = self._send(method, path, body, index, timeout)
            if not outcome.transient:
                self._answered(path, outcome, identify=False)
                return Answer(outcome.status, outcome.body)
            last = outcome.describe(endpoints[index] + path)
            self._endpoints.failed(index)
            self._missed(path, index)
            elapsed = time.monotonic() - started
            if elapsed + backoff > self.config.retry_budget + extra or (
                until is not None and time.monotonic() + backoff / 2 >= until
            ):
                raise Unavailable(attempts, elapsed, last)
            log.debug("retrying %s %s after %s", method, path, last)
            time.sleep(backoff / 2 + random.uniform(0, backoff) / 2)
            backoff = min(backoff * 2, 0.5)

    def _hedged(
        self, method: str, path: str, body: Optional[Mapping[str, Any]], until: Optional[float]
    ) -> Answer:
        """``election`` for an idempotent call: hedged attempts until
        ``until`` (default: the retry budget from now)."""
        started = time.monotonic()
        if until is None:
            until = started + self.config.retry_budget

        def send(index: int, timeout: float) -> Outcome:
            try:
                outcome = self._send(method, path, body, index, timeout)
            except BadRequest as err:  # not an http(s) URL
                return Outcome(index, failure=str(err))
            outcome = _entry_transient(path, outcome)
            if outcome.transient:
                self._missed(path, index)
            return outcome

        first = self._first(path)
        try:
            outcome = hedged(
                self._endpoints, self._workers, send, until, self.config.request_timeout, first
            )
        except GaveUp as err:
            raise Unavailable(err.attempts, time.monotonic() - started, err.last) from None
        self._answered(path, outcome, identify=True)
        return Answer(outcome.status, outcome.body)

    def _send(
        self, method: str, path: str, body: Optional[Mapping[str, Any]], index: int, timeout: float
    ) -> Outcome:
        """One attempt at endpoint ``index``; never raises but for a URL
        that is not http(s) (:class:`BadRequest`)."""
        url = self._endpoints.urls[index] + path
        try:
            response = self._http.request(method, url, json=body, timeout=self._timeout(timeout))
        except httpx.UnsupportedProtocol as err:
            raise BadRequest(f"{url}: {err}") from err
        except httpx.TransportError as err:
            return Outcome(index, failure=f"{url}: {type(err).__name__}: {err}")
        except Exception as err:  # never lose a renewal to a surprise here
            return Outcome(index, failure=f"{url}: {type(err).__name__}: {err}")
        return Outcome(
            index,
            status=response.status_code,
            body=json_of(response),
            leader=leader_hint(response.headers.get(LEADER_HEADER)),
            retry_after=retry_after(response.headers.get("retry-after")),
        )

    def _answered(self, path: str, outcome: Outcome, identify: bool) -> None:
        """Learns from a definitive answer: which node leads (an answer a
        follower forwarded names it; ``identify``, for a hedged call, asks
        the nodes their ids when that node cannot be placed yet), which
        node answered ``/v1/cluster`` and the partition map it gave. With
        several partitions, a call for one partition teaches that
        partition's leader only."""
        partition = self.partitions.of_path(path)
        if partition is not None:
            self._endpoints.heard(outcome.index)
            leader = outcome.leader
            if leader is None:  # it served the call itself: it leads
                leader = self._endpoints.node_at(outcome.index)
            if leader is not None:
                self.partitions.set_leader(partition, leader)
            if leader is None or self._endpoints.index_of(leader) is None:
                self._endpoints.identify(self._node_id_of)
        elif self._endpoints.answered(outcome.index, outcome.leader) and identify:
            self._endpoints.identify(self._node_id_of)
        elif (
            outcome.leader is not None
            and self.partitions.count is None
            and lease_in_path(path) is not None
        ):
            self._endpoints.identify(self._node_id_of)  # learn the partition map
        if path == "/v1/cluster" and isinstance(outcome.body, dict):
            node_id = _int_field(outcome.body, "node_id")
            if node_id is not None:
                self._endpoints.learn(outcome.index, node_id)
            self.partitions.learn(outcome.body)

    def _first(self, path: str) -> Optional[int]:
        """The endpoint to try first for a call: its partition leader's,
        when the cluster has several partitions and the client knows it;
        else ``None`` (the usual order)."""
        partition = self.partitions.of_path(path)
        if partition is None:
            return None
        leader = self.partitions.leader(partition)
        index = None if leader is None else self._endpoints.index_of(leader)
        if leader is not None and index is None:
            self._endpoints.identify(self._node_id_of)
        return index

    def _missed(self, path: str, index: int) -> None:
        """A call for a partition got no definitive answer from ``index``:
        if that is the partition's leader, it is forgotten (the next call
        tries the usual order) and the map is asked for again."""
        partition = self.partitions.of_path(path)
        if partition is None:
            return
        leader = self.partitions.leader(partition)
        if leader is not None and self._endpoints.index_of(leader) == index:
            self.partitions.set_leader(partition, None)
            self._endpoints.identify(self._node_id_of)

    def open_watch(self, path: str, cursor: WatchCursor, silent_for: float) -> PrefixWatch:
        """Opens the prefix watch ``path`` (``_watch.py``) on the first node
        that answers, the preferred one first; its lines may be
        ``silent_for`` apart."""
        urls = list(self._endpoints.urls)
        return open_watch(
            self._http,
            urls,
            self._preferred,
            path,
            (cursor, silent_for),
            self.config.request_timeout,
            self._endpoints.failed,
        )

    def _node_id_of(self, index: int) -> Tuple[Optional[int], Optional[int]]:
        """The node id endpoint ``index`` gives in ``/v1/cluster`` (one
        short request), and the leader it names (``None`` for either it
        did not give)."""
        url = self._endpoints.urls[index] + "/v1/cluster"
        timeout = self._timeout(min(self.config.request_timeout, 1.0))
        try:
            response = self._http.get(url, timeout=timeout)
        except (httpx.HTTPError, RuntimeError):  # RuntimeError: the client was closed
            return None, None
        body = json_of(response)
        doc: Mapping[str, Any] = body if isinstance(body, dict) else {}
        if response.status_code == 200:
            self.partitions.learn(doc)
        return _int_field(doc, "node_id"), _int_field(doc, "leader")

    def published_keys(self) -> List[JsonObject]:
        """Every election endpoint's ``/v1/jwks`` answer that came (one
        attempt each, at the same time budget): the newest of them is the
        key set to trust (``applied_index``)."""
        answers: List[JsonObject] = []
        for endpoint in self.config.election:
            url = endpoint.rstrip("/") + "/v1/jwks"
            try:
                response = self._http.request(
                    "GET", url, timeout=self._timeout(self.config.request_timeout)
                )
            except httpx.TransportError as err:
                log.debug("JWKS from %s: %s", url, err)
                continue
            body = json_of(response)
            if response.status_code == 200 and isinstance(body, dict):
                answers.append(body)
        return answers

    # -- grants -----------------------------------------------------------

    def verify_grant(self, grant: Grant) -> None:
        """Checks the grant's JWT against the cluster's JWKS (when enabled)."""
        if self.config.verify_jwt:
            self._verifier.verify(grant)

    def renew_grant(self, grant_id: GrantId, until: Optional[float] = None) -> Grant:
        """One renewal: over the renewal stream when it can carry it within
        its slice of the time left, else by renew calls (hedged across the
        nodes, up to ``until``)."""
        body = grant_body(grant_id, with_index=False)
        partition = self.partitions.of_path(f"/v1/leases/{grant_id.lease}")
        if partition is not None:
            grant = Grant.from_json(self._renew_in(partition, {"lease": grant_id.lease, **body}, until))
            self.verify_grant(grant)
            return grant
        answer = self._renew_on_stream(grant_id, body, until)
        if answer is None:
            path = f"/v1/leases/{grant_id.lease}/renew"
            answer = self.election("POST", path, body, until=until, hedge=True)
            grant = Grant.from_json(answer.ok_object())
        else:
            doc = answer.ok_object().get("grant")
            if not isinstance(doc, dict):
                raise ProtocolError(200, "a renewal result without its grant")
            grant = Grant.from_json(doc)
        self.verify_grant(grant)
        return grant

    def _renew_in(
        self, partition: int, entry: Mapping[str, Any], until: Optional[float]
    ) -> Mapping[str, Any]:
        """One renewal as ``POST /v1/renew?partition=k`` (hedged; its
        partition's leader first): the renewed grant's document. The
        renewal stream is not used with several partitions: its node would
        forward each partition's part to that partition's leader."""
        path = f"/v1/renew?partition={partition}"
        answer = self.election("POST", path, {"renewals": [entry]}, until=until, hedge=True)
        results = answer.ok_object().get("results")
        if not isinstance(results, list) or len(results) != 1 or not isinstance(results[0], dict):
            raise ProtocolError(200, "a batch renewal answered the wrong number of results")
        result = results[0]
        status = result.get("status")
        if status != 200:
            raise Answer(status if isinstance(status, int) else 500, result).error()
        grant = result.get("grant")
        if not isinstance(grant, dict):
            raise ProtocolError(200, "a renewal result without its grant")
        return grant

    def _renew_on_stream(
        self, grant_id: GrantId, body: Mapping[str, Any], until: Optional[float]
    ) -> Optional[Answer]:
        """The renewal's result over the stream (an answer as the renew call
        would give), or ``None``: renew by request."""
        if self._stream is None:
            return None
        if until is None:
            until = time.monotonic() + self.config.request_timeout
        try:
            result = self._stream.renew({"lease": grant_id.lease, **body}, until)
        except Exception:  # a bug of the stream must not cost the lease
            log.exception("the renewal stream failed; renewing by request")
            return None
        return None if result is None else Answer(result[0], result[1])

    def release_grant(self, grant_id: GrantId) -> None:
        """One release call, naming the grant's index when known."""
        body = grant_body(grant_id, with_index=True)
        answer = self.election("POST", f"/v1/leases/{grant_id.lease}/release", body)
        if answer.status != 200:
            raise answer.error()

    def handover(self, grant_id: GrantId, successor: str) -> int:
        """One handover call; the successor's token."""
        body = grant_body(grant_id, with_index=False)
        body["to"] = successor
        answer = self.election("POST", f"/v1/leases/{grant_id.lease}/handover", body)
        token = answer.ok_object().get("token")
        if not isinstance(token, int) or isinstance(token, bool):
            raise ProtocolError(200, "a handover answered no token")
        return token

def _entry_transient(path: str, outcome: Outcome) -> Outcome:
    """A one-partition batch of one (``POST /v1/renew?partition=k``)
    whose renewal the node could not carry (503: it stopped leading, 429)
    is a transient outcome of that node, as a whole 503 would be: the
    renewal goes to the next node."""
    if outcome.status != 200 or not path.startswith("/v1/renew?") or not isinstance(outcome.body, dict):
        return outcome
    results = outcome.body.get("results")
    if isinstance(results, list) and len(results) == 1 and isinstance(results[0], dict):
        status = results[0].get("status")
        if status in (503, 429):
            return Outcome(outcome.index, status=status, body=results[0], leader=outcome.leader)
    return outcome


def _int_field(doc: Mapping[str, Any], name: str) -> Optional[int]:
    value = doc.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def grant_body(grant_id: GrantId, with_index: bool) -> Dict[str, Any]:
    """The body of a renew (``with_index`` false) or release naming the grant."""
    body: Dict[str, Any] = {"holder": grant_id.holder, "token": grant_id.token}
    if grant_id.secret is not None:
        body["secret"] = grant_id.secret
    if with_index and grant_id.grant_index is not None:
        body["grant_index"] = grant_id.grant_index
    return body
