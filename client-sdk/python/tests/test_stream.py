"""The renewal stream (``POST /v1/renew/stream``): leases renew over it, by
request without it, and by request whenever it cannot carry a renewal (a
leader killed, a leader frozen: the watchdog ends the stream)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any, List

import pytest

import palisade
import palisade._stream
from conftest import DevCluster, record_renew_requests


def test_leases_renew_over_the_stream(cluster: DevCluster, name: str) -> None:
    with cluster.client() as client:
        by_request = record_renew_requests(client)
        stream = client._transport._stream
        assert stream is not None
        # The first renewal opens the stream. A renewal due while another
        # opens it goes by request (it never waits behind an open), so the
        # other leases are taken once the stream is open.
        leases = [client.acquire(f"{name}-0", "S", ttl=1.0)]
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and stream.opened == 0:
            time.sleep(0.05)
        assert stream.opened == 1, "the stream did not open"
        leases += [client.acquire(f"{name}-{i}", "S", ttl=1.0) for i in range(1, 20)]
        time.sleep(3.0)  # some 8 renewals each, every ttl/3
        assert all(lease.is_held() for lease in leases)
        assert stream.opened == 1
        assert by_request == [], "renewals went by request"
        tokens = [client.get(lease.name).token for lease in leases]
        assert tokens == [lease.token for lease in leases]
        for lease in leases:
            lease.release()
        assert client.get(f"{name}-0").holder is None


def test_without_the_stream_leases_renew_by_request(cluster: DevCluster, name: str) -> None:
    with cluster.client(renew_stream=False) as client:
        by_request = record_renew_requests(client)
        with client.lease(name, "R", ttl=1.0) as lease:
            time.sleep(1.5)
            assert lease.is_held()
        assert client._transport._stream is None
        assert len(by_request) >= 3, by_request


def test_a_frozen_leader_ends_the_stream_and_renewals_carry_on(
    fresh_cluster: DevCluster, name: str
) -> None:
    """The leader is SIGSTOPped under a stream: no answer comes, the watchdog
    ends the stream within the request timeout, renewals go by request to
    the other nodes (which elect a new leader) and the lease is never lost;
    a stream is opened again on the new leader."""
    cluster = fresh_cluster
    leader = cluster.leader()
    lost: List[str] = []
    with cluster.client(request_timeout=1.0) as client:
        by_request = record_renew_requests(client)
        lease = client.acquire(name, "F", ttl=8.0, on_lost=lost.append)
        time.sleep(3.0)
        stream = client._transport._stream
        assert stream is not None and stream.opened == 1 and by_request == []
        pid = cluster.node_pid(leader)
        os.kill(pid, signal.SIGSTOP)
        try:
            # Past two renewal periods: the stream's renewal went unanswered,
            # the next went by request to the new leader.
            deadline = time.monotonic() + 15.0
            while time.monotonic() < deadline and not by_request:
                time.sleep(0.1)
            assert by_request, "no renewal went by request after the freeze"
            # Still frozen (so the old stream cannot have been ended by its
            # node): a stream opens on the new leader; streams are tried
            # again a few seconds after a failed open.
            deadline = time.monotonic() + 20.0
            while time.monotonic() < deadline and stream.opened < 2:
                time.sleep(0.2)
            assert stream.opened >= 2, "the stream to the frozen leader was never ended"
            assert lease.is_held() and not lost, lost
            assert cluster.leader() != leader
        finally:
            os.kill(pid, signal.SIGCONT)
        time.sleep(3.0)
        assert lease.is_held() and not lost
        assert client.get(name).token == lease.token
        lease.release()


def test_a_killed_leader_loses_no_lease(fresh_cluster: DevCluster, name: str) -> None:
    """kill -9 of the leader under a stream carrying 10 leases' renewals."""
    cluster = fresh_cluster
    leader = cluster.leader()
    lost: List[str] = []
    with cluster.client() as client:
        leases = [
            client.acquire(f"{name}-{i}", "K", ttl=6.0, on_lost=lost.append) for i in range(10)
        ]
        time.sleep(2.5)
        os.kill(cluster.node_pid(leader), signal.SIGKILL)
        time.sleep(8.0)  # past the ttl: renewals went on through the other nodes
        assert all(lease.is_held() for lease in leases) and not lost, lost
        for lease in leases:
            assert client.get(lease.name).token == lease.token
            lease.release()


def test_a_stream_that_cannot_open_falls_back_to_requests(
    cluster: DevCluster, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any failure to open a stream (here: no thread can be started) leaves
    the renewals to requests, and the lease held."""

    def cannot_open(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(palisade._stream._Stream, "__init__", cannot_open)
    with cluster.client() as client:
        by_request = record_renew_requests(client)
        with client.lease(name, "N", ttl=1.0) as lease:
            time.sleep(1.5)
            assert lease.is_held() and not lease.lost.is_set()
        stream = client._transport._stream
        assert stream is not None and stream.opened == 0
        assert len(by_request) >= 3, by_request
