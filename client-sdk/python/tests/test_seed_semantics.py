"""Leadership semantics against a real ``palisade dev`` cluster: preemption
by priority, a directed handover, lock-delay after an expiry, max-hold, and
the bad options the client refuses before sending."""

from __future__ import annotations

import threading
import time
from typing import List

import pytest

import palisade
from conftest import DevCluster


def test_a_higher_priority_preempts_a_preemptible_holder(cluster: DevCluster, name: str) -> None:
    """Low (preemptible) writes; high (priority 5) waits for the lease: low's
    next renewal says ``preempted``, its writes raise Preempted (a
    LeaseLost), it lets go, and high is granted on that release with a
    higher token. Low campaigning again at once does not slip in."""
    key = f"{name}/state"
    first, second = cluster.client(), cluster.client()
    low = first.acquire(
        name, "low", ttl=1.5, options=palisade.AcquireOptions(priority=1, preemptible=True)
    )
    low.put(key, b"from low")
    # An equal priority preempts nothing (stickiness).
    with pytest.raises(palisade.Held):
        second.acquire(name, "same", ttl=1.5, wait=0.8, options=palisade.AcquireOptions(priority=1))
    assert low.is_held()

    granted: List[palisade.Lease] = []
    granted_at: List[float] = []

    def campaign() -> None:
        granted.append(
            second.acquire(name, "high", ttl=3.0, wait=10.0, options=palisade.AcquireOptions(priority=5))
        )
        granted_at.append(time.monotonic())

    thread = threading.Thread(target=campaign, daemon=True)
    thread.start()
    assert low.lost.wait(5.0), "low was never told it was preempted"
    lost_at = time.monotonic()
    with pytest.raises(palisade.Preempted):
        low.put(key, b"late low")
    # Low campaigns again at once, without waiting: the lease is high's.
    with pytest.raises(palisade.Held):
        first.acquire(name, "low", ttl=1.5, options=palisade.AcquireOptions(preemptible=True))
    thread.join(10.0)
    assert granted, "high was not granted"
    high = granted[0]
    assert high.token > low.token
    assert granted_at[0] - lost_at < 1.0, "high waited for low's deadline, not its release"
    high.put(key, b"from high")
    obj = high.get(key)
    assert obj is not None and obj.value == b"from high"
    high.release()


def test_a_handover_goes_to_the_named_successor(cluster: DevCluster, name: str) -> None:
    """A hands the lease to B: A stops at once, nobody else can take it, B's
    acquire gets the handed-over (higher) token at once."""
    key = f"{name}/state"
    first, second = cluster.client(), cluster.client()
    a = first.acquire(name, "A", ttl=5.0)
    a.put(key, b"from A")
    with pytest.raises(palisade.BadRequest):
        a.handover_to("A")
    assert a.is_held(), "a refused handover changes nothing"
    token = a.handover_to("B")
    assert token > a.token
    assert not a.is_held()
    with pytest.raises(palisade.LeaseLost):
        a.put(key, b"late A")
    with pytest.raises(palisade.Held):
        second.acquire(name, "C", ttl=5.0)
    b = second.acquire(name, "B", ttl=5.0)
    assert b.token == token
    b.put(key, b"from B")
    b.release()


def test_an_expired_grant_leaves_its_lock_delay(cluster: DevCluster, name: str) -> None:
    """A grant with a lock-delay that is not renewed expires; the lease is
    then held back (LockDelay with retry_after) and a waiting acquire gets
    it once the delay has passed."""
    client = cluster.client()
    options = palisade.AcquireOptions(lock_delay=2.0)
    client.acquire_grant(name, "crashed", ttl=0.6, options=options)
    seen = None
    deadline = time.monotonic() + 10.0
    while seen is None and time.monotonic() < deadline:
        try:
            client.acquire_grant(name, "next", ttl=2.0)
        except palisade.LockDelay as err:
            seen = err
        except palisade.Held:
            time.sleep(0.05)
        else:
            pytest.fail("granted inside the lock-delay")
    assert seen is not None and 0 < seen.retry_after <= 2.0, seen
    started = time.monotonic()
    lease = client.acquire(name, "next", ttl=2.0, wait=5.0)
    assert time.monotonic() - started >= seen.retry_after - 0.3
    lease.release()


def test_max_hold_ends_a_grant_that_keeps_renewing(cluster: DevCluster, name: str) -> None:
    lost: List[str] = []
    client = cluster.client()
    lease = client.acquire(
        name, "rotating", ttl=0.6, on_lost=lost.append, options=palisade.AcquireOptions(max_hold=1.0)
    )
    assert lease.lost.wait(5.0), "max-hold never ended the grant"
    for _ in range(100):  # the event is set before the callback runs
        if lost:
            break
        time.sleep(0.02)
    assert lost and "max" in lost[0].lower(), lost
    # Past the cap the lease is free again (at the deadline) for anyone.
    other = client.acquire(name, "next", ttl=2.0, wait=5.0)
    assert other.token > lease.token
    other.release()


@pytest.mark.parametrize(
    "options",
    [
        palisade.AcquireOptions(priority=1001),
        palisade.AcquireOptions(priority=-1),
        palisade.AcquireOptions(priority=True),
        palisade.AcquireOptions(lock_delay=-1.0),
        palisade.AcquireOptions(lock_delay=float("inf")),
        palisade.AcquireOptions(lock_delay=float("nan")),
        palisade.AcquireOptions(max_hold=0.0),
        palisade.AcquireOptions(max_hold=float("inf")),
    ],
)
def test_bad_options_are_refused_before_sending(
    cluster: DevCluster, name: str, options: palisade.AcquireOptions
) -> None:
    client = cluster.client()
    with pytest.raises(palisade.BadRequest):
        client.acquire(name, "x", ttl=2.0, options=options)
    with pytest.raises(palisade.NotFound):
        client.get(name)  # nothing was created
