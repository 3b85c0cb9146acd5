"""A client certificate is a principal (issue 31), from Python: a
``palisade dev --tls`` cluster whose policy names the certificate
``palisade certs init`` issued (``client.palisade``) as principal ``svc``,
allowed the ``pycert-`` leases only. The client presents it (no API key)
and gets exactly ``svc``'s rights, on the election nodes and the gateway;
without it, nothing."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

import palisade
from conftest import BIN, DevCluster, record_renew_requests


def policy_with_certificate(data: Path) -> None:
    for args in (
        ["policy", "init", "--dir", str(data)],
        [
            "policy", "add", "--dir", str(data), "svc",
            "--acquire", "pycert-", "--read", "pycert-",
            "--certificate", "client.palisade",
        ],
    ):
        subprocess.run([BIN, *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def tls_cluster() -> Iterator[DevCluster]:
    dev = DevCluster(tls=True, prepare=policy_with_certificate)
    try:
        yield dev
    finally:
        dev.remove()


def certs(dev: DevCluster) -> Path:
    return dev.data / "certs"


def cert_client(dev: DevCluster) -> palisade.Client:
    """A client presenting the certificate the policy names as ``svc``."""
    c = certs(dev)
    return palisade.Client(
        dev.election,
        dev.gateway,
        ca=str(c / "ca.pem"),
        client_cert=str(c / "client.pem"),
        client_key=str(c / "client-key.pem"),
    )


def test_the_certificate_is_its_principal_with_exactly_its_rights(
    tls_cluster: DevCluster,
) -> None:
    with cert_client(tls_cluster) as client:
        with client.lease("pycert-1", "py-holder", ttl=5.0) as lease:
            lease.put("pycert-1/k", "v")
            assert client.get("pycert-1").holder == "py-holder"
        with pytest.raises(palisade.Forbidden):
            client.acquire("other-1", "py-holder", ttl=5.0)


def test_without_the_certificate_nothing_is_allowed(tls_cluster: DevCluster) -> None:
    c = certs(tls_cluster)
    with palisade.Client(tls_cluster.election, tls_cluster.gateway, ca=str(c / "ca.pem")) as client:
        with pytest.raises(palisade.Unauthorized):
            client.acquire("pycert-2", "py-holder", ttl=5.0)


def test_half_a_certificate_is_a_bad_request(tls_cluster: DevCluster) -> None:
    c = certs(tls_cluster)
    with pytest.raises(palisade.BadRequest):
        palisade.Client(tls_cluster.election, client_cert=str(c / "client.pem"))
    with pytest.raises(palisade.BadRequest):
        palisade.Client(
            tls_cluster.election,
            client_cert=str(c / "ca.pem"),
            client_key=str(c / "ca.pem"),
        )


def test_leases_renew_over_a_tls_stream_as_the_certificate(tls_cluster: DevCluster) -> None:
    """The renewal stream over TLS (ALPN h2), with the client certificate
    as its principal: no renewal goes by request."""
    with cert_client(tls_cluster) as client:
        by_request = record_renew_requests(client)
        with client.lease("pycert-stream", "py-holder", ttl=1.0) as lease:
            time.sleep(1.6)
            assert lease.is_held()
        stream = client._transport._stream
        assert stream is not None and stream.opened == 1
        assert by_request == []
