"""The storage gateway's calls: objects read, listed and written (fenced,
optionally conditional) and fences raised. Each is sent once: a write may
have landed, so it is never retried."""

from __future__ import annotations

import time
from typing import Dict, Optional, Union
from urllib.parse import quote

import httpx

from ._answer import Answer, error_for, json_of
from ._errors import BadRequest, ProtocolError, Unavailable
from ._model import JsonObject, Object, ObjectInfo, ObjectPage, encode_key

#: A write's ``if_match``: the version the object must have, or ``"*"``
#: (there must be an object); ``None`` for no condition.
IfMatch = Union[int, str, None]

#: The most objects one listing page may ask for.
MAX_LIST_LIMIT = 1000


def precondition(if_match: IfMatch, if_none_match: bool = False) -> Dict[str, str]:
    """The headers of a conditional write (none for an unconditional one).
    Raises :class:`BadRequest`, with nothing sent, for a bad ``if_match`` or
    for both conditions at once."""
    headers: Dict[str, str] = {}
    if if_match is not None:
        valid_version = isinstance(if_match, int) and not isinstance(if_match, bool) and if_match >= 0
        if not valid_version and if_match != "*":
            raise BadRequest(f"if_match is a version (an int >= 0) or '*', not {if_match!r}")
        headers["if-match"] = str(if_match)
    if if_none_match:
        if if_match is not None:
            raise BadRequest("if_match and if_none_match exclude each other")
        headers["if-none-match"] = "*"
    return headers


def version_of(etag: Optional[str]) -> Optional[int]:
    """The version an ``ETag`` names: a decimal, quoted or not (``W/``
    allowed); ``None`` when it names none."""
    value = (etag or "").strip()
    if value.startswith("W/"):
        value = value[2:]
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    return int(value) if value.isdigit() and value.isascii() else None


def _digits(value: Optional[str]) -> Optional[int]:
    value = (value or "").strip()
    return int(value) if value.isdigit() and value.isascii() else None


class Gateway:
    """The gateway's calls over the client's HTTP connection pool (so with
    its API key, CA and client certificate). Internal; thread-safe."""

    def __init__(self, http: httpx.Client, url: Optional[str]) -> None:
        self._http = http
        self._url = url.rstrip("/") if url else None

    def base(self) -> str:
        """The gateway's base URL; :class:`BadRequest` when none is
        configured."""
        if not self._url:
            raise BadRequest("no gateway configured")
        return self._url

    def _send(
        self,
        method: str,
        url: str,
        content: Optional[bytes] = None,
        headers: Optional[Dict[str, str]] = None,
    ) -> httpx.Response:
        """One request; :class:`Unavailable` on a transport failure."""
        started = time.monotonic()
        try:
            return self._http.request(method, url, content=content, headers=headers)
        except httpx.TransportError as err:
            raise Unavailable(1, time.monotonic() - started, f"{url}: {err}") from err

    def get_object(self, key: str) -> Optional[Object]:
        """Reads ``key``; ``None`` if there is no object."""
        response = self._send("GET", f"{self.base()}/v1/objects/{encode_key(key)}")
        if response.status_code == 200:
            version = version_of(response.headers.get("etag"))
            token = _digits(response.headers.get("fencing-token"))
            if version is None or token is None:
                raise ProtocolError(200, "an object without ETag or Fencing-Token")
            return Object(value=response.content, version=version, token=token)
        if response.status_code == 404:
            return None
        raise error_for(response.status_code, json_of(response))

    def head_object(self, key: str) -> Optional[ObjectInfo]:
        """``HEAD`` of ``key``: its version, token and size without its
        bytes; ``None`` if there is no object."""
        response = self._send("HEAD", f"{self.base()}/v1/objects/{encode_key(key)}")
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise error_for(response.status_code, json_of(response))
        version = version_of(response.headers.get("etag"))
        token = _digits(response.headers.get("fencing-token"))
        size = _digits(response.headers.get("content-length"))
        if version is None or token is None or size is None:
            raise ProtocolError(200, "a HEAD answer without ETag, Fencing-Token or Content-Length")
        return ObjectInfo(key=key, version=version, token=token, size=size)

    def list_objects(self, prefix: str, after: Optional[str], limit: int) -> ObjectPage:
        """One page of the keys starting with ``prefix`` after ``after``."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST_LIMIT:
            raise BadRequest(f"limit must be 1..={MAX_LIST_LIMIT}, not {limit!r}")
        query = [f"limit={limit}"]
        if prefix:
            query.append("prefix=" + quote(prefix, safe=""))
        if after is not None:
            query.append("after=" + quote(after, safe=""))
        response = self._send("GET", f"{self.base()}/v1/objects?" + "&".join(query))
        return ObjectPage.from_json(Answer(response.status_code, json_of(response)).ok_object())

    def write(
        self,
        jwt: str,
        method: str,
        path: str,
        content: Optional[bytes] = None,
        headers: Optional[Dict[str, str]] = None,
    ) -> JsonObject:
        """One fenced request stamped with ``jwt`` (plus ``headers``: a
        precondition); the answer's JSON object on 200, the mapped error
        raised otherwise (412: :class:`palisade.PreconditionFailed`)."""
        sent = {"authorization": f"Bearer {jwt}", **(headers or {})}
        response = self._send(method, self.base() + path, content, sent)
        return Answer(response.status_code, json_of(response)).ok_object()
