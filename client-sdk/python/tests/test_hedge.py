"""Hedged renewals against scripted fakes: an attempt gets its slice of the
time left, then the next node is asked too; a 409 is final; Retry-After is
honoured within the lease's time; a leader named by a follower is asked
first once the client knows which endpoint it is."""

from __future__ import annotations

import time
from typing import Any, Callable, Tuple

import pytest

import palisade
from conftest import FakeServer, Reply, Route
from test_retries import client, grant_json, scripted

MakeServer = Callable[[Route], FakeServer]
GRANT_ID = palisade.GrantId("orders", "A", 7, 7, "s" * 64)


def renew_within(c: palisade.Client, left: float) -> Tuple[float, palisade.Grant]:
    """Renews with the deadline ``left`` seconds away: how long it took,
    and the grant."""
    started = time.monotonic()
    grant = c._transport.renew_grant(GRANT_ID, until=started + left)
    return time.monotonic() - started, grant


def renewals(server: FakeServer) -> int:
    return sum(1 for path in server.paths() if path.endswith("/renew"))


def test_a_renewal_stuck_on_a_hung_node_goes_to_the_next_within_its_slice(
    fake_server: MakeServer,
) -> None:
    hung = fake_server(scripted([(200, ("sleep", 5.0, grant_json(ttl_ms=3000)))]))
    good = fake_server(scripted([(200, grant_json(ttl_ms=3000))]))
    # The default request timeout (2 s) is longer than the 1.5 s left.
    c = client(hung.url, good.url, renew_stream=False)
    took, grant = renew_within(c, 1.5)
    assert grant.token == 7
    assert (renewals(hung), renewals(good)) == (1, 1), took
    # The hung node is tried last now: the next renewal goes to the other.
    renew_within(c, 1.5)
    assert (renewals(hung), renewals(good)) == (1, 2)


def test_a_409_lost_is_final_even_when_hedged(fake_server: MakeServer) -> None:
    hung = fake_server(scripted([(200, ("sleep", 5.0, grant_json(ttl_ms=3000)))]))
    lost = fake_server(scripted([(409, {"error": "lost", "message": "no such grant"})]))
    c = client(hung.url, lost.url, renew_stream=False)
    with pytest.raises(palisade.LeaseLost):
        renew_within(c, 1.5)
    time.sleep(0.3)
    assert (renewals(hung), renewals(lost)) == (1, 1), "a 409 must end the renewal"


def test_retry_after_on_a_renewal_is_honoured_within_the_lease_budget(
    fake_server: MakeServer,
) -> None:
    busy: Reply = (503, ("headers", {"Retry-After": "30"}, {"error": "no_quorum"}))
    server = fake_server(scripted([busy, (200, grant_json(ttl_ms=3000))]))
    c = client(server.url, renew_stream=False)
    # 30 s asked, 1.5 s left: asked again within the lease's time, not at once.
    started = time.monotonic()
    renew_within(c, 1.5)
    assert len(server.requests) == 2
    assert time.monotonic() - started >= 0.1


def test_the_leader_a_follower_names_is_asked_first(fake_server: MakeServer) -> None:
    def node(node_id: int, forwarded: bool) -> FakeServer:
        def route(method: str, path: str, body: Any) -> Reply:
            if path == "/v1/cluster":
                return 200, {"node_id": node_id, "leader": 2}
            if forwarded:
                return 200, ("headers", {"x-palisade-leader": "2"}, grant_json(ttl_ms=3000))
            return 200, grant_json(ttl_ms=3000)

        return fake_server(route)

    follower, other, leader = node(1, True), node(3, True), node(2, False)
    c = client(follower.url, other.url, leader.url, renew_stream=False)
    renew_within(c, 2.0)
    # The answer named node 2; the client asks the nodes who they are.
    for _ in range(250):
        if c._transport._preferred % 3 == 2:
            break
        time.sleep(0.02)
    assert c._transport._preferred % 3 == 2
    renew_within(c, 2.0)
    assert (renewals(follower), renewals(other), renewals(leader)) == (1, 0, 1)
