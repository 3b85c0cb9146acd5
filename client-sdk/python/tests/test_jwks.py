"""The JWKS rule against fake election nodes on loopback: the newest key
set (``applied_index``) wins, and an older one never replaces it — a
lagging first endpoint can neither hide a new key nor revive a retired one."""

from __future__ import annotations

import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Iterator, List, Tuple

import jwt as pyjwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from palisade._errors import ProtocolError
from palisade._model import Grant
from palisade._transport import ClientConfig, JwtVerifier, Transport


class FakeNode:
    """A node answering ``/v1/jwks`` with whatever ``answer`` holds."""

    def __init__(self) -> None:
        self.answer: Tuple[int, Dict[str, Any]] = (503, {})
        node = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                status, body = node.answer
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def nodes() -> Iterator[List[FakeNode]]:
    made = [FakeNode(), FakeNode()]
    yield made
    for node in made:
        node.server.shutdown()


def key(kid: str) -> Tuple[Ed25519PrivateKey, Dict[str, Any]]:
    private = Ed25519PrivateKey.generate()
    raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    x = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    return private, {"kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "kid": kid, "x": x}


def grant(private: Ed25519PrivateKey, kid: str) -> Grant:
    claims = {"iss": "palisade", "sub": "h", "lease": "l", "token": 7, "exp": int(time.time()) + 60}
    token = pyjwt.encode(claims, private, algorithm="EdDSA", headers={"kid": kid})
    return Grant(lease="l", holder="h", token=7, ttl_ms=5000, jwt=token, kid=kid)


def published(jwks: List[Dict[str, Any]], index: int) -> Tuple[int, Dict[str, Any]]:
    return 200, {"keys": jwks, "applied_index": index}


def test_a_lagging_node_neither_hides_a_new_key_nor_revives_a_retired_one(
    nodes: List[FakeNode],
) -> None:
    lagging, current = nodes
    old, old_jwk = key("old")
    new, new_jwk = key("new")
    retired, retired_jwk = key("retired")
    lagging.answer = published([old_jwk], 5)
    current.answer = published([new_jwk], 9)
    config = ClientConfig(election=[lagging.url, current.url], request_timeout=1.0)
    transport = Transport(config)
    verifier = JwtVerifier(transport.published_keys, len(config.election))
    # The lagging node is asked first, but the newer set wins.
    verifier.verify(grant(new, "new"))
    with pytest.raises(ProtocolError):
        verifier.verify(grant(old, "old"))
    # The current node is down; the lagging one still publishes a key the
    # cluster has since retired: it is not trusted again.
    current.answer = (503, {})
    lagging.answer = published([old_jwk, retired_jwk], 6)
    time.sleep(JwtVerifier.REFETCH_EVERY)
    with pytest.raises(ProtocolError):
        verifier.verify(grant(retired, "retired"))
    verifier.verify(grant(new, "new"))
