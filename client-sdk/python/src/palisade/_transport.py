"""What a :class:`palisade.Client` and its leases share: the HTTP client, the
one retry loop for election calls, the gateway calls and the JWT verifier.

Retry rules (the Rust SDK's): an election call is retried, on the next
endpoint, with exponential backoff and jitter, on transport failures
(connection refused, timeouts, a connection cut mid-call), 503 and 429, for
at most the retry budget. Every other answer (409 included, and every other
4xx) is returned to the caller as is, after exactly one request. Gateway
calls are sent once.
"""

from __future__ import annotations

import logging
import random
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Union

import certifi
import httpx
import jwt as pyjwt

from ._errors import (
    BadRequest,
    Fenced,
    Forbidden,
    Held,
    LeaseLost,
    LockDelay,
    NotFound,
    PalisadeError,
    Preempted,
    ProtocolError,
    Unauthorized,
    Unavailable,
)
from ._model import Grant, GrantId, JsonObject, Object, encode_key
from ._stream import StreamRenewer

log = logging.getLogger("palisade")

#: The request header that carries a client's API key.
API_KEY_HEADER = "x-palisade-key"

#: Statuses an election call retries on the next endpoint.
RETRY_STATUSES = frozenset({503, 429})


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
    #: Timeout of one HTTP request, in seconds.
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


@dataclass
class Answer:
    """One HTTP answer: its status and JSON body (``None`` when not JSON)."""

    status: int
    body: Any

    def message(self) -> str:
        """The error document's ``message``, or ``""``."""
        if isinstance(self.body, dict):
            message = self.body.get("message")
            if isinstance(message, str):
                return message
        return ""

    def error(self) -> PalisadeError:
        """Maps an error answer to an exception (the Rust SDK's mapping)."""
        return error_for(self.status, self.body)

    def ok_object(self) -> JsonObject:
        """The body if the status is 200 and the body a JSON object; the
        mapped error raised otherwise."""
        if self.status != 200:
            raise self.error()
        if not isinstance(self.body, dict):
            raise ProtocolError(200, "the answer is not a JSON object")
        return self.body


def _field_int(body: Mapping[str, Any], name: str) -> int:
    value = body.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def error_for(status: int, body: Any) -> PalisadeError:
    """The exception for an error answer ``status`` with JSON ``body``."""
    doc: Mapping[str, Any] = body if isinstance(body, dict) else {}
    code = doc.get("error")
    message = doc.get("message")
    text = message if isinstance(message, str) else ""
    if status == 409 and code == "held":
        holder = doc.get("holder")
        return Held(holder if isinstance(holder, str) else "", _field_int(doc, "token"))
    if status == 409 and code in ("lost", "max_hold"):
        return LeaseLost(text)
    if status == 409 and code == "preempted":
        return Preempted(text)
    if status == 409 and code == "lock_delay":
        return LockDelay(text, _field_int(doc, "retry_after_ms") / 1000.0)
    if status == 409 and code == "stale_token":
        return Fenced(_field_int(doc, "token"), _field_int(doc, "fence"))
    if status == 404:
        return NotFound(text)
    if status == 401:
        return Unauthorized(text)
    if status == 403:
        return Forbidden(text)
    if status in (400, 413):
        return BadRequest(text)
    return ProtocolError(status, text or (str(code) if code else ""))


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


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
        # The endpoint that answered last; tried first next time.
        self._preferred = 0
        self._verifier = JwtVerifier(self)
        self._stream: Optional[StreamRenewer] = None
        if config.renew_stream:
            self._stream = StreamRenewer(
                config.election, self._stream_tls, list(headers.items()), config.request_timeout
            )

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
    ) -> Answer:
        """Sends one election request, retrying transport failures, 503s and
        429s on the next endpoint with backoff and jitter within the retry
        budget (lengthened by ``extra`` for calls that wait on purpose, as is
        each attempt's timeout). ``until`` (a :func:`time.monotonic` time)
        ends the retries earlier and cuts each attempt's timeout to it.
        Every other answer is returned as is."""
        endpoints = self.config.election
        if not endpoints:
            raise BadRequest("no election endpoints configured")
        started = time.monotonic()
        attempts = 0
        backoff = 0.02
        last = "no attempt made: the deadline had passed"
        while True:
            now = time.monotonic()
            timeout = self.config.request_timeout + extra
            if until is not None:
                if now >= until:
                    raise Unavailable(attempts, now - started, last)
                timeout = min(timeout, until - now)
            index = self._preferred % len(endpoints)
            url = endpoints[index].rstrip("/") + path
            attempts += 1
            try:
                response = self._http.request(
                    method, url, json=body, timeout=self._timeout(timeout)
                )
            except httpx.UnsupportedProtocol as err:
                raise BadRequest(f"{url}: {err}") from err
            except httpx.TransportError as err:
                last = f"{url}: {type(err).__name__}: {err}"
            else:
                answer = Answer(response.status_code, _json(response))
                if answer.status not in RETRY_STATUSES:
                    self._preferred = index
                    return answer
                last = f"{url}: {answer.status} {answer.message()}"
            self._preferred = index + 1
            elapsed = time.monotonic() - started
            if elapsed + backoff > self.config.retry_budget + extra or (
                until is not None and time.monotonic() + backoff / 2 >= until
            ):
                raise Unavailable(attempts, elapsed, last)
            log.debug("retrying %s %s after %s", method, path, last)
            time.sleep(backoff / 2 + random.uniform(0, backoff) / 2)
            backoff = min(backoff * 2, 0.5)

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
            body = _json(response)
            if response.status_code == 200 and isinstance(body, dict):
                answers.append(body)
        return answers

    # -- grants -----------------------------------------------------------

    def verify_grant(self, grant: Grant) -> None:
        """Checks the grant's JWT against the cluster's JWKS (when enabled)."""
        if self.config.verify_jwt:
            self._verifier.verify(grant)

    def renew_grant(self, grant_id: GrantId, until: Optional[float] = None) -> Grant:
        """One renewal: over the renewal stream when it can carry it, else
        one renew call (retried as any election call, up to ``until``)."""
        body = grant_body(grant_id, with_index=False)
        answer = self._renew_on_stream(grant_id, body, until)
        if answer is None:
            path = f"/v1/leases/{grant_id.lease}/renew"
            answer = self.election("POST", path, body, until=until)
            grant = Grant.from_json(answer.ok_object())
        else:
            doc = answer.ok_object().get("grant")
            if not isinstance(doc, dict):
                raise ProtocolError(200, "a renewal result without its grant")
            grant = Grant.from_json(doc)
        self.verify_grant(grant)
        return grant

    def _renew_on_stream(
        self, grant_id: GrantId, body: Mapping[str, Any], until: Optional[float]
    ) -> Optional[Answer]:
        """The renewal's result over the stream (an answer as the renew call
        would give), or ``None``: renew by request."""
        if self._stream is None:
            return None
        timeout = self.config.request_timeout
        if until is not None:
            timeout = min(timeout, until - time.monotonic())
        if timeout <= 0:
            return None
        try:
            result = self._stream.renew({"lease": grant_id.lease, **body}, timeout)
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

    # -- gateway ----------------------------------------------------------

    def _gateway(self) -> str:
        if not self.config.gateway:
            raise BadRequest("no gateway configured")
        return self.config.gateway.rstrip("/")

    def get_object(self, key: str) -> Optional[Object]:
        """Reads ``key`` through the gateway (one request); ``None`` if
        there is no object."""
        url = f"{self._gateway()}/v1/objects/{encode_key(key)}"
        started = time.monotonic()
        try:
            response = self._http.get(url)
        except httpx.TransportError as err:
            raise Unavailable(1, time.monotonic() - started, f"{url}: {err}") from err
        if response.status_code == 200:
            token = response.headers.get("fencing-token", "0")
            return Object(
                value=response.content,
                version=response.headers.get("etag", ""),
                token=int(token) if token.isdigit() else 0,
            )
        if response.status_code == 404:
            return None
        raise error_for(response.status_code, _json(response))

    def gateway_write(
        self, jwt: str, method: str, path: str, content: Optional[bytes] = None
    ) -> JsonObject:
        """One fenced gateway request stamped with ``jwt``; the answer's JSON
        object on 200, the mapped error raised otherwise."""
        url = self._gateway() + path
        started = time.monotonic()
        try:
            response = self._http.request(
                method, url, content=content, headers={"authorization": f"Bearer {jwt}"}
            )
        except httpx.TransportError as err:
            raise Unavailable(1, time.monotonic() - started, f"{url}: {err}") from err
        return Answer(response.status_code, _json(response)).ok_object()


def grant_body(grant_id: GrantId, with_index: bool) -> Dict[str, Any]:
    """The body of a renew (``with_index`` false) or release naming the grant."""
    body: Dict[str, Any] = {"holder": grant_id.holder, "token": grant_id.token}
    if grant_id.secret is not None:
        body["secret"] = grant_id.secret
    if with_index and grant_id.grant_index is not None:
        body["grant_index"] = grant_id.grant_index
    return body


class JwtVerifier:
    """Verifies lease JWTs (EdDSA) against the cluster's ``/v1/jwks``,
    fetched on first use and again when a token names an unknown ``kid``
    (after a key rotation), at most every 100 ms.

    A fetch asks every endpoint and keeps the newest key set
    (``applied_index``, the log index a node's set is as of), and never
    replaces the cached set with an older one: a lagging node can neither
    hide a key the cluster committed nor bring back one it retired."""

    REFETCH_EVERY = 0.1

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        self._lock = threading.Lock()
        self._keys: Dict[str, pyjwt.PyJWK] = {}
        self._applied_index = -1
        self._fetched_at: Optional[float] = None

    def _fetch(self) -> None:
        self._fetched_at = time.monotonic()
        answers = self._transport.published_keys()
        if not answers:
            raise Unavailable(len(self._transport.config.election), 0.0, "no node answered /v1/jwks")
        newest = max(answers, key=_applied_index)
        if _applied_index(newest) < self._applied_index:
            return
        keys: Dict[str, pyjwt.PyJWK] = {}
        raw = newest.get("keys")
        for entry in raw if isinstance(raw, list) else []:
            if isinstance(entry, dict) and isinstance(entry.get("kid"), str):
                try:
                    keys[entry["kid"]] = pyjwt.PyJWK(entry)
                except pyjwt.PyJWTError as err:
                    log.warning("ignoring JWKS key %s: %s", entry["kid"], err)
        if keys:
            self._keys = keys
            self._applied_index = _applied_index(newest)

    def _key(self, kid: str) -> pyjwt.PyJWK:
        with self._lock:
            if kid not in self._keys and (
                self._fetched_at is None
                or time.monotonic() - self._fetched_at >= self.REFETCH_EVERY
            ):
                self._fetch()
            key = self._keys.get(kid)
        if key is None:
            raise ProtocolError(0, f"the lease JWT is signed by unknown key {kid!r}")
        return key

    def verify(self, grant: Grant) -> Dict[str, Any]:
        """Verifies ``grant.jwt``: EdDSA signature by a JWKS key, ``iss``,
        and ``lease``/``sub``/``token`` equal to the grant's. ``exp`` is not
        checked here (it is on the wall clock; the lease's safe deadline is
        kept on the monotonic clock instead). Raises :class:`ProtocolError`."""
        try:
            header = pyjwt.get_unverified_header(grant.jwt)
        except pyjwt.PyJWTError as err:
            raise ProtocolError(0, f"the lease JWT does not parse: {err}") from err
        kid = header.get("kid")
        if header.get("alg") != "EdDSA" or not isinstance(kid, str):
            raise ProtocolError(0, "the lease JWT is not EdDSA with a kid")
        key = self._key(kid)
        try:
            claims: Dict[str, Any] = pyjwt.decode(
                grant.jwt,
                key.key,
                algorithms=["EdDSA"],
                issuer="palisade",
                options={"verify_exp": False, "require": ["iss", "sub", "exp"]},
            )
        except pyjwt.PyJWTError as err:
            raise ProtocolError(0, f"the lease JWT does not verify: {err}") from err
        expected = {"lease": grant.lease, "sub": grant.holder, "token": grant.token}
        for name, value in expected.items():
            if claims.get(name) != value:
                raise ProtocolError(
                    0, f"the lease JWT's {name} is {claims.get(name)!r}, not {value!r}"
                )
        return claims


def _applied_index(document: JsonObject) -> int:
    """How current a ``/v1/jwks`` answer is (0 from a node that does not say)."""
    index = document.get("applied_index")
    return index if isinstance(index, int) else 0
