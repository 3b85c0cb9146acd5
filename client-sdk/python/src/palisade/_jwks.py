"""Verifying lease JWTs against the cluster's ``/v1/jwks``."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Dict, List, Optional

import jwt as pyjwt

from ._errors import ProtocolError, Unavailable
from ._model import Grant, JsonObject

log = logging.getLogger("palisade")


class JwtVerifier:
    """Verifies lease JWTs (EdDSA) against the cluster's ``/v1/jwks``,
    fetched on first use and again when a token names an unknown ``kid``
    (after a key rotation), at most every 100 ms.

    A fetch asks every endpoint and keeps the newest key set
    (``applied_index``, the log index a node's set is as of), and never
    replaces the cached set with an older one: a lagging node can neither
    hide a key the cluster committed nor bring back one it retired."""

    REFETCH_EVERY = 0.1

    def __init__(self, published_keys: Callable[[], List[JsonObject]], nodes: int) -> None:
        """``published_keys`` asks every one of the ``nodes`` election
        nodes for its key set once (the transport's ``published_keys``)."""
        self._published_keys = published_keys
        self._nodes = nodes
        self._lock = threading.Lock()
        self._keys: Dict[str, pyjwt.PyJWK] = {}
        self._applied_index = -1
        self._fetched_at: Optional[float] = None

    def _fetch(self) -> None:
        self._fetched_at = time.monotonic()
        answers = self._published_keys()
        if not answers:
            raise Unavailable(self._nodes, 0.0, "no node answered /v1/jwks")
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
