"""Leases against a real ``palisade dev`` cluster: the takeover scenario,
fence-on-acquire, renewal, release, JWT verification, the API key."""

from __future__ import annotations

import threading
import time
from typing import Any, List

import httpx
import pytest

import palisade
from conftest import DevCluster


def fence_of(cluster: DevCluster, lease: str) -> Any:
    response = httpx.get(
        f"{cluster.gateway}/v1/fences/{lease}", headers={"x-palisade-key": cluster.api_key}
    )
    assert response.status_code == 200, response.text
    return response.json()


def pause_renewals(client: palisade.Client) -> threading.Event:
    """Makes ``client``'s renew threads hang (as a stuck thread or a
    network that swallows requests would) until the returned event is set."""
    resume = threading.Event()
    transport: Any = client._transport

    def stuck(*args: Any, **kwargs: Any) -> palisade.Grant:
        resume.wait(60)
        raise palisade.Unavailable(1, 0.0, "paused by the test")

    transport.renew_grant = stuck
    return resume


def blocking_acquire(client: palisade.Client, name: str, holder: str, **kw: Any) -> Any:
    """Starts an acquire in a thread; (thread, results, errors)."""
    results: List[palisade.Lease] = []
    errors: List[BaseException] = []

    def run() -> None:
        try:
            results.append(client.acquire(name, holder, **kw))
        except BaseException as err:  # reported by the test
            errors.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, results, errors


def test_takeover_then_the_late_write_is_refused(cluster: DevCluster, name: str) -> None:
    """acquire → put → a second client blocks → the first stops renewing →
    the second gets a higher token → the first's late write raises LeaseLost
    and the object holds the second's value."""
    key = f"{name}/state"
    first, second = cluster.client(), cluster.client()
    lost: List[str] = []
    a = first.acquire(name, "A", ttl=2.5, wait=5.0, on_lost=lost.append)
    assert a.is_held()
    written = a.put(key, b"from A")
    assert written == palisade.Written(key, written.version, a.token) and written.version > 0
    assert fence_of(cluster, name)["fence"] == a.token  # fence-on-acquire

    thread, results, errors = blocking_acquire(second, name, "B", ttl=5.0, wait=30.0)
    time.sleep(3.0)  # over a ttl: only renewals keep A's lease
    assert thread.is_alive() and not results and not errors
    assert a.is_held() and not a.lost.is_set()

    resume = pause_renewals(first)
    try:
        thread.join(15)
        assert not errors, errors
        assert results, "the second client did not get the lease"
        b = results[0]
        assert b.token > a.token
        assert fence_of(cluster, name)["fence"] == b.token  # B raised the fence
        from_b = b.put(key, b"from B")

        assert not a.is_held()
        with pytest.raises(palisade.LeaseLost):
            a.put(key, b"late A")
        assert a.lost.is_set()
        assert lost and "deadline" in lost[0]
        obj = b.get(key)
        assert obj is not None and obj.value == b"from B" and obj.token == b.token
        assert obj.version == from_b.version  # the ETag, as an int
        b.release()
        assert not b.is_held() and b.lost.is_set()
    finally:
        resume.set()
    a.release()  # no longer held: nothing raised


def test_a_late_write_that_reaches_the_gateway_is_fenced(cluster: DevCluster, name: str) -> None:
    """When the local deadline cannot help (a clock that ran slow beyond the
    drift margin, or a write delayed in the network), the gateway's fence
    refuses the stale token: 409 stale_token → Fenced, a LeaseLost."""
    key = f"{name}/state"
    first, second = cluster.client(), cluster.client()
    lost: List[str] = []
    a = first.acquire(name, "A", ttl=3.0, on_lost=lost.append)
    a.put(key, b"from A")
    resume = pause_renewals(first)
    try:
        with second.lease(name, "B", ttl=5.0, wait=10.0) as b:
            b.put(key, b"from B")
            # A's clock lies: its deadline looks far away, so the write goes out.
            a._shared.deadline = time.monotonic() + 60
            with pytest.raises(palisade.LeaseLost) as err:
                a.put(key, b"late A")
            assert isinstance(err.value, palisade.Fenced)
            assert (err.value.token, err.value.fence) == (a.token, b.token)
            assert a.lost.is_set() and not a.is_held()
            assert lost and "fenced" in lost[0]
            with pytest.raises(palisade.LeaseLost):  # now refused locally
                a.put(key, b"later A")
            obj = second.get_object(key)
            assert obj is not None and obj.value == b"from B"
            refused = fence_of(cluster, name)["refused"]
            assert refused["count"] == 1 and refused["last"]["holder"] == "A"
    finally:
        resume.set()


def test_renewals_keep_the_lease_and_release_frees_it(cluster: DevCluster, name: str) -> None:
    client = cluster.client()
    with client.lease(name, "A", ttl=2.0) as lease:
        first_jwt = lease.jwt
        # A JWT is signed for two ttls (exp rounded up to the second) and
        # reused while it covers the renewed deadline: by then + a second, a
        # renewal (every ttl/3) must have brought a fresh one.
        time.sleep(5.5)
        assert lease.is_held() and not lease.lost.is_set()
        assert lease.jwt != first_jwt
        info = client.get(name)
        assert (info.holder, info.token) == ("A", lease.token)
        lease.put(f"{name}/k", "v")
        lease.delete(f"{name}/k")
        assert lease.get(f"{name}/k") is None
    assert lease.lost.is_set() and lease.lost_reason == "released"
    assert client.get(name).holder is None
    with client.lease(name, "B", ttl=1.0) as again:  # free at once, no wait
        assert again.token > lease.token


def test_held_without_wait_raises_held(cluster: DevCluster, name: str) -> None:
    client = cluster.client()
    with client.lease(name, "A", ttl=5.0) as lease:
        with pytest.raises(palisade.Held) as err:
            client.acquire(name, "B", ttl=5.0)
        assert (err.value.holder, err.value.token) == ("A", lease.token)
        started = time.monotonic()
        with pytest.raises(palisade.Held):
            client.acquire(name, "B", ttl=5.0, wait=1.5)
        assert 1.3 < time.monotonic() - started < 5.0


def test_jwts_verify_against_the_jwks(cluster: DevCluster, name: str) -> None:
    client = cluster.client()
    with client.lease(name, "A", ttl=5.0) as lease:
        jwt = lease.jwt
        assert jwt is not None
        claims = client.verify_jwt(palisade.Grant(name, "A", lease.token, 5000, jwt))
        assert (claims["lease"], claims["sub"], claims["token"]) == (name, "A", lease.token)
        with pytest.raises(palisade.ProtocolError):  # another token: refused
            client.verify_jwt(palisade.Grant(name, "A", lease.token + 1, 5000, jwt))
        forged = jwt[:-4] + ("AAAA" if not jwt.endswith("AAAA") else "BBBB")
        with pytest.raises(palisade.ProtocolError):
            client.verify_jwt(palisade.Grant(name, "A", lease.token, 5000, forged))


def test_without_the_api_key_calls_are_refused_once(cluster: DevCluster, name: str) -> None:
    client = palisade.Client(cluster.election, cluster.gateway)
    started = time.monotonic()
    with pytest.raises(palisade.Unauthorized):
        client.acquire(name, "A", ttl=5.0)
    assert time.monotonic() - started < 2.5  # not retried (the budget is 5 s)
    with pytest.raises(palisade.Unauthorized):
        client.get_object(f"{name}/x")


def test_bad_names_are_refused_locally(cluster: DevCluster) -> None:
    client = cluster.client()
    for bad in ("", ".", "..", "a/b", "x" * 129, "sp ace"):
        with pytest.raises(palisade.BadRequest):
            client.acquire(bad, "A")


def test_from_env(cluster: DevCluster, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for var, value in cluster.env().items():
        if var.startswith("PALISADE_"):
            monkeypatch.setenv(var, value)
    monkeypatch.delenv("PALISADE_API_KEY", raising=False)
    client = palisade.Client.from_env()
    assert client.config.election == cluster.election
    assert client.config.gateway == cluster.gateway
    assert client.config.api_key == cluster.api_key
    with client.lease(name, "env", ttl=2.0) as lease:
        assert lease.is_held()
    monkeypatch.setenv("PALISADE_API_KEY", "pal_other")
    assert palisade.Client.from_env().config.api_key == "pal_other"
    # Both variables set: the key beats the key file, as in the CLI and Go.
    monkeypatch.setenv("PALISADE_API_KEY_FILE", cluster.env()["PALISADE_API_KEY_FILE"])
    assert palisade.Client.from_env().config.api_key == "pal_other"
    # An option beats both variables.
    assert palisade.Client.from_env(api_key="pal_opt").config.api_key == "pal_opt"
    chosen = palisade.Client.from_env(api_key_file=cluster.env()["PALISADE_API_KEY_FILE"])
    assert chosen.config.api_key == cluster.api_key
    monkeypatch.setenv("PALISADE_API_KEY_FILE", "/nonexistent/key")
    monkeypatch.delenv("PALISADE_API_KEY")
    with pytest.raises(palisade.BadRequest):
        palisade.Client.from_env()


def test_elector_hands_over(cluster: DevCluster, name: str) -> None:
    events: List[str] = []
    lock = threading.Lock()

    def record(event: str) -> None:
        with lock:
            events.append(event)

    def elector(holder: str) -> palisade.Elector:
        return palisade.Elector(
            cluster.client(),
            name,
            holder,
            ttl=2.0,
            on_started=lambda lease: record(f"{holder} started {lease.token}"),
            on_stopped=lambda reason: record(f"{holder} stopped: {reason}"),
            on_leader_changed=lambda h: record(f"leader {h}"),
            campaign_wait=0.5,
        )

    def wait_for(predicate: Any) -> None:
        for _ in range(200):
            with lock:
                if predicate():
                    return
            time.sleep(0.05)
        raise AssertionError(f"timed out; events: {events}")

    one, two = elector("one"), elector("two")
    one.start()
    wait_for(lambda: any(e.startswith("one started") for e in events))
    two.start()
    time.sleep(1.5)
    assert one.is_leader() and not two.is_leader()
    one.stop(10)
    wait_for(lambda: any(e.startswith("two started") for e in events))
    two.stop(10)
    with lock:
        started = [e for e in events if " started " in e]
        assert "one stopped: shutting down" in events
        assert "two stopped: shutting down" in events
        assert "leader one" in events and "leader two" in events
    # (Under heavy load leadership may also flap; the order must still hold.)
    tokens = [int(e.rsplit(" ", 1)[1]) for e in started]
    assert started[0].startswith("one ") and started[-1].startswith("two ")
    assert tokens == sorted(set(tokens)), started
    assert not one.is_leader() and not two.is_leader()


def test_renewals_verify_jwts_signed_by_a_rotated_key(cluster: DevCluster, name: str) -> None:
    import jwt as pyjwt

    client = cluster.client()
    with client.lease(name, "A", ttl=2.0) as lease:
        before = pyjwt.get_unverified_header(lease.jwt or "")["kid"]
        kid = client.rotate_key()
        assert kid and kid != before
        for _ in range(50):  # the next renewal (every ttl/3) is signed with the new key
            if pyjwt.get_unverified_header(lease.jwt or "")["kid"] == kid:
                break
            time.sleep(0.1)
        assert pyjwt.get_unverified_header(lease.jwt or "")["kid"] == kid
        assert lease.is_held()
        lease.put(f"{name}/k", b"after rotation")


def test_history_shows_each_grant_and_its_end(cluster: DevCluster, name: str) -> None:
    client = cluster.client()
    with client.lease(name, "A", ttl=5.0) as first:
        pass
    with client.lease(name, "B", ttl=5.0) as second:
        pass
    history = client.history(name)
    assert [(t.cause, t.holder, t.token) for t in history] == [
        ("acquire", "A", first.token),
        ("release", "A", first.token),
        ("acquire", "B", second.token),
        ("release", "B", second.token),
    ]
    now_ms = time.time() * 1000
    assert all(t.at_ms is not None and now_ms - 60_000 < t.at_ms <= now_ms + 5_000 for t in history)
    assert [t.index for t in history] == sorted(t.index for t in history)
    with pytest.raises(palisade.NotFound):
        client.history(f"{name}-never")
