"""Partitions (issue 46) against real processes: ``palisade dev
--partitions 3``. Leases spread over the three partitions are acquired and
kept by their renew threads; each renewal goes to its partition's leader
(``POST /v1/renew?partition=k``, seen by a wrapper that records every
request's URL); a kill -9 of the node leading one partition costs no lease,
and the other partitions' renewals go on at their leaders meanwhile."""

from __future__ import annotations

import os
import signal
import time
import uuid
from typing import Any, Dict, Iterator, List, Optional, Tuple
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

import palisade
from conftest import DevCluster
from palisade._partitions import fnv1a64, partition_of

TTL = 5.0
PARTITIONS = 3


@pytest.fixture
def partitioned() -> Iterator[DevCluster]:
    """A ``palisade dev --partitions 3`` of the test's own (it kills a node)."""
    dev = DevCluster(partitions=PARTITIONS)
    try:
        yield dev
    finally:
        dev.remove()


def test_fnv1a64_and_partition_of() -> None:
    assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a64(b"") == 0xCBF29CE484222325
    assert partition_of("a", 3) == 0xAF63DC4C8601EC8C % 3
    assert partition_of("anything", 1) == 0


Seen = Tuple[float, str, str, bool]


def record_requests(client: palisade.Client) -> List[Seen]:
    """Wraps the client's HTTP client: every request answered is listed as
    (monotonic send time, method, URL, forwarded: the answer names the
    partition leader it came from in ``x-palisade-leader``, so the node
    asked did not lead)."""
    http = client._transport._http
    seen: List[Seen] = []
    inner = http.request

    def request(method: str, url: Any, **kw: Any) -> httpx.Response:
        at = time.monotonic()
        response = inner(method, url, **kw)
        seen.append((at, method, str(url), "x-palisade-leader" in response.headers))
        return response

    http.request = request  # type: ignore[method-assign]
    return seen


Found = Dict[int, List[Tuple[str, bool]]]


def renewals_by_partition(seen: List[Seen], since: float) -> Found:
    """The base URLs each partition's renewals went to, after ``since``,
    and whether each was forwarded."""
    found: Found = {k: [] for k in range(PARTITIONS)}
    for at, method, url, forwarded in list(seen):
        parts = urlsplit(url)
        if at < since or method != "POST" or parts.path != "/v1/renew":
            continue
        k = int(parse_qs(parts.query)["partition"][0])
        found[k].append((f"{parts.scheme}://{parts.netloc}", forwarded))
    return found


def partition_leaders(
    cluster: DevCluster, live: List[int], spread_within: float = 0.0, limit: float = 60.0
) -> List[int]:
    """Each partition's leader once every live node names the same live
    one (``GET /v1/cluster``), unchanged for a second; for the first
    ``spread_within`` seconds only leaders spread over the live nodes will
    do (each partition has a home node that leadership moves to, when
    the cluster gets to it). Waits up to ``limit`` seconds."""
    started = time.monotonic()
    last: Optional[List[int]] = None
    since = started
    while time.monotonic() < started + limit:
        now = partition_leaders_now(cluster, live)
        spread = now is not None and len(set(now)) == min(len(live), PARTITIONS)
        if now is None or now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= 1.0 and (
            spread or time.monotonic() > started + spread_within
        ):
            return now
        time.sleep(0.1)
    raise AssertionError(f"the live nodes {live} did not settle partition leaders: {last}")


def partition_leaders_now(cluster: DevCluster, live: List[int]) -> Optional[List[int]]:
    """Each partition's leader if every live node names the same live one."""
    terms = partition_terms_now(cluster, live)
    return None if terms is None else [leader for leader, _ in terms]


def partition_terms_now(cluster: DevCluster, live: List[int]) -> Optional[List[Tuple[int, int]]]:
    """Each partition's (leader, term) if every live node names the same
    live leader in the same term."""
    views: List[Optional[List[Any]]] = []
    for node in live:
        try:
            answer = httpx.get(
                f"{cluster.election[node - 1]}/v1/cluster",
                headers={"x-palisade-key": cluster.api_key},
                timeout=1.0,
            )
            views.append([(p.get("leader"), p.get("term")) for p in answer.json()["partitions"]])
        except (httpx.HTTPError, ValueError, KeyError):
            views.append(None)
    first = views[0]
    if first is not None and all(v == first for v in views) and all(l in live for l, _ in first):
        return [(int(l), int(t)) for l, t in first]
    return None


def leaders_of(terms: List[Tuple[int, int]]) -> List[int]:
    return [leader for leader, _ in terms]


def still_window(cluster: DevCluster, seen: List[Seen], seconds: float) -> Found:
    """The renewals of a window of ``seconds`` at whose start and end every
    node named the same leader of each partition (leadership also moves
    between healthy nodes, to each partition's home, and by elections on a
    starved machine; there a leader re-elected in a newer term counts as
    the same); up to three tries."""
    views: List[Optional[List[Tuple[int, int]]]] = []
    for _ in range(3):
        before = partition_terms_now(cluster, [1, 2, 3])
        since = time.monotonic()
        time.sleep(seconds)
        after = partition_terms_now(cluster, [1, 2, 3])
        if before is not None and after is not None and leaders_of(before) == leaders_of(after):
            return renewals_by_partition(seen, since)
        views += [before, after]
    raise AssertionError(f"leadership did not hold still for {seconds} s, three times: {views}")


def spread_names(prefix: str, per_partition: int) -> List[str]:
    """Lease names, ``per_partition`` in each partition."""
    names: List[str] = []
    counts = [0] * PARTITIONS
    i = 0
    while min(counts) < per_partition:
        name = f"{prefix}-{i}"
        i += 1
        k = partition_of(name, PARTITIONS)
        if counts[k] < per_partition:
            counts[k] += 1
            names.append(name)
    return names


def assert_direct(found: Found, at_least: int, most: float = 0.5) -> None:
    """Each partition had ``at_least`` renewals, and at most a ``most``
    share of them were forwarded; the others were served by the node they
    were sent to: the partition's leader then (a
    node that does not lead it forwards, and says so). Leadership moves
    between healthy nodes too (to each partition's home node, and by
    elections on a starved machine): a renewal sent just before a move is
    forwarded, and the client follows the leader the answer names."""
    for k, sent in found.items():
        assert len(sent) >= at_least, f"partition {k}: only {len(sent)} renewals: {found}"
        forwarded = [url for url, fwd in sent if fwd]
        assert len(forwarded) <= most * len(sent), f"partition {k}: forwarded {forwarded} of {sent}"


def test_leases_over_three_partitions_renew_at_their_leaders_through_a_leader_kill(
    partitioned: DevCluster,
) -> None:
    cluster = partitioned
    lost: List[str] = []
    names = spread_names(f"py-part-{uuid.uuid4().hex[:8]}", per_partition=2)
    leaders = partition_leaders(cluster, [1, 2, 3], spread_within=15.0)
    with cluster.client() as client:
        seen = record_requests(client)
        assert client.cluster()["partitions"], "a partitioned cluster lists its partitions"
        transport = client._transport
        assert transport.partitions.count == PARTITIONS
        # Every lease call goes first to the endpoint of the node its
        # partition's answer named (the map filled in by the background
        # identify: bounded wait).
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            firsts = [transport._first(f"/v1/leases/{n}") for n in names]
            if None not in firsts:
                break
            time.sleep(0.05)
        for n, first in zip(names, firsts):
            leader = transport.partitions.leader(partition_of(n, PARTITIONS))
            assert first is not None and leader == first + 1, (n, first, leader)
        leases = [client.acquire(n, "keeper", ttl=TTL, on_lost=lost.append) for n in names]
        for lease in leases:
            info = client.get(lease.name)
            assert (info.holder, info.partition) == ("keeper", partition_of(lease.name, PARTITIONS))

        # Steady state: each partition's renewals go to its leader (in a
        # window where leadership held still: a third forwarded at most,
        # renewals sent as a starved node lost and won its leadership
        # again, or just before the window began).
        assert_direct(still_window(cluster, seen, 2 * TTL), at_least=6, most=1 / 3)

        # kill -9 a node leading a partition (the fewest, when they are not
        # spread): every lease is kept, and the partitions it did not lead
        # renew on at their leaders meanwhile. (palisade dev restarts the
        # node half a second later; its partition has failed over by then,
        # and comes back to it, its home, a few seconds later.) Leaders
        # spread over their homes first, if they get there within 20 s: a
        # partition away from its home may move while the node is away.
        leaders = partition_leaders(cluster, [1, 2, 3], spread_within=20.0)
        before = partition_terms_now(cluster, [1, 2, 3])
        victim = min(set(leaders), key=leaders.count)
        os.kill(cluster.node_pid(victim), signal.SIGKILL)
        killed = time.monotonic()
        time.sleep(3 * TTL)  # three ttls: held now means renewed past the kill
        assert all(lease.is_held() for lease in leases) and not lost, lost
        found = renewals_by_partition(seen, killed)
        after = partition_terms_now(cluster, [n for n in (1, 2, 3) if n != victim])
        for k in range(PARTITIONS):
            if leaders[k] == victim:
                continue
            # Renewals went on at the normal pace (one per lease every
            # ttl/3: 18 expected); and straight to the leader, when its
            # leadership held still meanwhile.
            still = before is not None and after is not None and before[k][0] == after[k][0]
            assert_direct({k: found[k]}, at_least=12, most=1 / 3 if still else 0.5)

        # The failed-over partitions' renewals have found their new leader
        # (once the restarted node has its partitions back, if it gets them
        # within 20 s).
        partition_leaders(cluster, [1, 2, 3], spread_within=20.0)
        assert_direct(still_window(cluster, seen, TTL), at_least=2, most=1 / 3)
        assert all(lease.is_held() for lease in leases) and not lost, lost
        for lease in leases:
            info = client.get(lease.name)
            assert (info.holder, info.token) == ("keeper", lease.token)
            lease.release()


def next_change(watch: palisade.PrefixWatch) -> palisade.WatchEvent:
    """The next event that is not a keep-alive (the stream's own 35 s
    silence bound ends a hung one)."""
    for event in watch:
        if event.kind != "progress":
            return event
    raise AssertionError("the watch ended")


def test_one_prefix_watch_follows_every_partition_and_resumes_from_its_cursor(
    partitioned: DevCluster,
) -> None:
    prefix = f"py-watch-{uuid.uuid4().hex[:8]}"
    names = spread_names(prefix, per_partition=2)
    with partitioned.client() as client:
        grants = {name: client.acquire_grant(name, "watcher", ttl=600.0) for name in names}
        client.acquire_grant(f"other-{prefix}", "watcher", ttl=600.0)
        seen: Dict[str, int] = {}
        with client.watch_prefix(prefix) as watch:
            while len(seen) < len(names):
                event = next_change(watch)
                assert event.kind == "changed" and event.lease is not None, event
                name = event.lease.lease
                assert name.startswith(prefix), f"only the prefix: {name}"
                assert event.partition == partition_of(name, PARTITIONS), event
                assert event.index == event.lease.modify_index, event
                seen[name] = event.index
            cursor = watch.cursor
        assert len(cursor.indexes) == PARTITIONS and cursor.partitioned, cursor
        assert palisade.WatchCursor.parse(str(cursor)) == cursor

        # While no stream is open: a grant in one partition, a release in
        # another; resumed, the stream brings those two and nothing older.
        fresh = spread_names(f"{prefix}-late", per_partition=1)[0]
        client.acquire_grant(fresh, "watcher", ttl=600.0)
        freed = next(n for n in names if partition_of(n, PARTITIONS) != partition_of(fresh, PARTITIONS))
        client.release_grant(grants[freed].id())
        after: Dict[str, int] = {}
        with client.watch_prefix(prefix, cursor) as watch:
            while len(after) < 2:
                event = next_change(watch)
                assert event.lease_name in (fresh, freed), f"only what changed after {cursor}: {event}"
                assert event.lease_name is not None
                after[event.lease_name] = event.index

        # A cursor of more partitions than the cluster has is refused.
        with pytest.raises(palisade.BadRequest):
            client.watch_prefix(prefix, palisade.WatchCursor([0, 0, 0, 0], True))


def test_watch_cursor_text_and_query() -> None:
    assert str(palisade.WatchCursor.parse("9,3,6")) == "9,3,6"
    assert palisade.WatchCursor.parse("9,3,6").query() == "&indexes=9,3,6"
    assert palisade.WatchCursor.parse("7").query() == "&index=7"
    assert palisade.WatchCursor.parse("").query() == ""
    with pytest.raises(ValueError):
        palisade.WatchCursor.parse("9,x")
