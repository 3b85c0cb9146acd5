"""Retry rules against a scripted fake server: transport errors, 503 and 429
are retried (bounded, on the next endpoint); 409 and every other 4xx are
not. Plus the safe deadline's arithmetic, which needs answers on cue."""

from __future__ import annotations

import time
from typing import Any, Callable, List

import pytest

import palisade
from conftest import FakeServer, Reply, Route, closed_port_url

MakeServer = Callable[[Route], FakeServer]


def grant_json(lease: str = "orders", holder: str = "A", token: int = 7, ttl_ms: int = 5000) -> Any:
    return {
        "lease": lease,
        "holder": holder,
        "token": token,
        "ttl_ms": ttl_ms,
        "jwt": "not.a.jwt",
        "kid": "k",
        "grant_index": token,
        "secret": "s" * 64,
    }


def scripted(replies: List[Reply]) -> Route:
    """Answers ``replies`` in order, repeating the last."""
    state = {"i": 0}

    def route(method: str, path: str, body: Any) -> Reply:
        i = min(state["i"], len(replies) - 1)
        state["i"] += 1
        return replies[i]

    return route


def client(*urls: str, **options: Any) -> palisade.Client:
    options.setdefault("verify_jwt", False)
    options.setdefault("retry_budget", 2.0)
    return palisade.Client(list(urls), **options)


def test_503_is_retried_until_an_answer(fake_server: MakeServer) -> None:
    no_quorum = (503, {"error": "no_quorum", "message": "no quorum"})
    server = fake_server(scripted([no_quorum, no_quorum, (200, {"leader": 1})]))
    assert client(server.url).cluster() == {"leader": 1}
    assert len(server.requests) == 3


def test_429_is_retried(fake_server: MakeServer) -> None:
    server = fake_server(scripted([(429, {"error": "too_many_waiters"}), (200, {"leader": 2})]))
    assert client(server.url).cluster() == {"leader": 2}
    assert len(server.requests) == 2


def test_acquire_retries_503_with_the_same_secret(fake_server: MakeServer) -> None:
    server = fake_server(scripted([(503, {"error": "no_quorum"}), (200, grant_json())]))
    grant = client(server.url).acquire_grant("orders", "A", ttl=5.0)
    assert grant.token == 7
    secrets = [body["secret"] for _, _, body, _ in server.requests]
    assert len(secrets) == 2 and secrets[0] == secrets[1] and len(secrets[0]) == 64


def test_409_is_not_retried(fake_server: MakeServer) -> None:
    server = fake_server(
        scripted([(409, {"error": "held", "holder": "B", "token": 9, "message": "held"})])
    )
    with pytest.raises(palisade.Held) as err:
        client(server.url).acquire_grant("orders", "A", ttl=5.0)
    assert (err.value.holder, err.value.token) == ("B", 9)
    assert len(server.requests) == 1


def test_409_lost_on_renew_is_lease_lost_and_not_retried(fake_server: MakeServer) -> None:
    server = fake_server(scripted([(409, {"error": "lost", "message": "no such grant"})]))
    grant_id = palisade.GrantId("orders", "A", 7, 7, "s" * 64)
    with pytest.raises(palisade.LeaseLost):
        client(server.url).renew_grant(grant_id)
    assert len(server.requests) == 1
    _, path, body, _ = server.requests[0]
    assert path == "/v1/leases/orders/renew"
    assert body == {"holder": "A", "token": 7, "secret": "s" * 64}


@pytest.mark.parametrize(
    "status, error",
    [
        (400, palisade.BadRequest),
        (401, palisade.Unauthorized),
        (403, palisade.Forbidden),
        (404, palisade.NotFound),
        (413, palisade.BadRequest),
        (500, palisade.ProtocolError),
    ],
)
def test_other_errors_are_not_retried(
    fake_server: MakeServer, status: int, error: type
) -> None:
    server = fake_server(scripted([(status, {"error": "x", "message": "nope"})]))
    with pytest.raises(error):
        client(server.url).get("orders")
    assert len(server.requests) == 1


def test_retries_are_bounded_by_the_budget(fake_server: MakeServer) -> None:
    server = fake_server(scripted([(503, {"error": "no_quorum", "message": "no quorum"})]))
    started = time.monotonic()
    with pytest.raises(palisade.Unavailable) as err:
        client(server.url, retry_budget=0.6).cluster()
    elapsed = time.monotonic() - started
    assert 0.2 < elapsed < 3.0
    assert err.value.attempts == len(server.requests) >= 3
    assert "503" in err.value.last


def test_connection_refused_moves_to_the_next_endpoint(fake_server: MakeServer) -> None:
    server = fake_server(scripted([(200, {"leader": 3})]))
    c = client(closed_port_url(), server.url)
    assert c.cluster() == {"leader": 3}
    assert c.cluster() == {"leader": 3}  # the endpoint that answered is kept
    assert len(server.requests) == 2


def test_a_connection_cut_mid_call_is_retried(fake_server: MakeServer) -> None:
    server = fake_server(scripted([(-1, None), (200, {"leader": 1})]))
    assert client(server.url).cluster() == {"leader": 1}
    assert len(server.requests) == 2


def test_a_hung_node_costs_one_request_timeout(fake_server: MakeServer) -> None:
    hung = fake_server(scripted([(200, ("sleep", 3.0, {"leader": 9}))]))
    good = fake_server(scripted([(200, {"leader": 1})]))
    started = time.monotonic()
    assert client(hung.url, good.url, request_timeout=0.3).cluster() == {"leader": 1}
    assert time.monotonic() - started < 2.5


def test_the_api_key_is_sent_on_every_request(fake_server: MakeServer) -> None:
    server = fake_server(scripted([(200, {"leader": 1})]))
    client(server.url, api_key="pal_abc\n").cluster()
    assert server.requests[0][3].get("x-palisade-key") == "pal_abc"
    assert "pal_abc" not in repr(client(server.url, api_key="pal_abc").config)


def test_the_safe_deadline_starts_at_the_send_time(fake_server: MakeServer) -> None:
    # The acquire answer takes 0.5 s: the deadline is send + 1.0 - 0.1, so
    # about 0.4 s are left when acquire returns, not 0.9.
    def route(method: str, path: str, body: Any) -> Reply:
        if path.endswith("/acquire"):
            return 200, ("sleep", 0.5, grant_json(ttl_ms=1000))
        if path.endswith("/release"):
            return 200, {}
        return 503, {"error": "no_quorum"}

    server = fake_server(route)
    c = client(server.url, fence_on_acquire=False, retry_budget=0.2)
    lease = c.acquire("orders", "A", ttl=1.0)
    try:
        left = lease.deadline - time.monotonic()
        assert left < 0.45, left  # under load it may be even less
    finally:
        lease.release()


def test_renewals_follow_the_ttl_the_leader_answers(fake_server: MakeServer) -> None:
    # Asked for 0.9 s, the renewal answers 3 s (a longer grant): the
    # deadline moves to about send + 2.7 s.
    def route(method: str, path: str, body: Any) -> Reply:
        if path.endswith("/acquire"):
            return 200, grant_json(ttl_ms=900)
        if path.endswith("/renew"):
            return 200, grant_json(ttl_ms=3000)
        return 200, {"lease": "orders", "released": True, "token": 7}

    server = fake_server(route)
    lease = client(server.url, fence_on_acquire=False).acquire("orders", "A", ttl=0.9)
    try:
        for _ in range(100):
            if "/v1/leases/orders/renew" in server.paths():
                break
            time.sleep(0.02)
        time.sleep(0.1)
        left = lease.deadline - time.monotonic()
        assert 1.5 < left < 2.7, left
        assert lease.is_held()
    finally:
        lease.release()
    assert server.paths()[-1] == "/v1/leases/orders/release"
    assert server.requests[-1][2]["grant_index"] == 7


def test_writes_after_the_deadline_are_refused_locally(fake_server: MakeServer) -> None:
    def election(method: str, path: str, body: Any) -> Reply:
        if path.endswith("/acquire"):
            return 200, grant_json(ttl_ms=600)
        if path.endswith("/release"):
            return 409, {"error": "lost", "message": "expired"}
        return 503, {"error": "no_quorum"}  # renewals never succeed

    lost: List[str] = []
    server = fake_server(election)
    gateway = fake_server(scripted([(200, {"key": "orders/x", "version": 1, "token": 7})]))
    c = client(server.url, gateway=gateway.url, fence_on_acquire=False, retry_budget=0.2)
    lease = c.acquire("orders", "A", ttl=0.6, on_lost=lost.append)
    assert lease.put("orders/x", b"1") == palisade.Written("orders/x", 1, 7)
    assert lease.lost.wait(5.0)
    assert not lease.is_held()
    with pytest.raises(palisade.LeaseLost):
        lease.put("orders/x", b"2")
    assert len(gateway.requests) == 1  # nothing sent after the deadline
    for _ in range(100):  # the event is set before the callback runs
        if lost:
            break
        time.sleep(0.02)
    assert lost and "deadline" in lost[0]
    lease.release()  # not held any more: a 409 lost is no error


def test_a_stale_token_answer_marks_the_lease_lost(fake_server: MakeServer) -> None:
    def election(method: str, path: str, body: Any) -> Reply:
        if path.endswith("/acquire") or path.endswith("/renew"):
            return 200, grant_json(ttl_ms=5000)
        return 200, {}

    stale = {"error": "stale_token", "token": 7, "fence": 9, "message": "token 7 is below 9"}
    server = fake_server(election)
    gateway = fake_server(scripted([(409, stale)]))
    c = client(server.url, gateway=gateway.url, fence_on_acquire=False)
    lease = c.acquire("orders", "A", ttl=5.0)
    with pytest.raises(palisade.LeaseLost) as err:
        lease.put("orders/x", b"late")
    assert isinstance(err.value, palisade.Fenced) and err.value.fence == 9
    assert lease.lost.is_set() and not lease.is_held()
    assert len(gateway.requests) == 1  # not retried
    lease.release()
