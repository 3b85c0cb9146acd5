"""L2 against real processes: a holder keeps its lease through a frozen Raft
leader (SIGSTOP longer than the ttl, then SIGCONT), round after round.

A renewal stuck on the frozen leader may take only its slice of the time
left to the safe deadline; then it goes to the other nodes too (one of
which leads within an election timeout), the stream is ended and opened
again on the new leader, and the client follows the leader the answers
name. Without that, a 3 s lease was lost to a 4 s freeze every time."""

from __future__ import annotations

import os
import signal
import time
from typing import Any, List, Optional

import httpx

from conftest import DevCluster

TTL = 3.0
FREEZE = 4.0
ROUNDS = 5


def settled_leader(cluster: DevCluster, limit: float = 30.0) -> int:
    """The leader every node names once all three are ready (``/readyz``:
    a leader known, everything committed applied); waits up to ``limit``."""
    deadline = time.monotonic() + limit
    seen: List[Optional[Any]] = []
    while time.monotonic() < deadline:
        seen = []
        for url in cluster.election:
            try:
                answer = httpx.get(f"{url}/readyz", timeout=1.0)
                body = answer.json()
                seen.append(body.get("leader") if answer.status_code == 200 else None)
            except (httpx.HTTPError, ValueError):
                seen.append(None)
        first = seen[0]
        if isinstance(first, int) and first > 0 and all(s == first for s in seen):
            return first
        time.sleep(0.1)
    raise AssertionError(f"the nodes did not settle on a leader within {limit} s: {seen}")


def log_tails(cluster: DevCluster, lines: int = 12) -> str:
    """The last ``lines`` of each election node's log (for a failure)."""
    tails = []
    for node in (1, 2, 3):
        path = cluster.data / f"election-{node}.log"
        try:
            text = path.read_text(errors="replace").splitlines()[-lines:]
        except OSError as err:
            text = [str(err)]
        tails.append(f"--- node {node}\n" + "\n".join(text))
    return "\n".join(tails)


def freeze_at(lease: Any, phase: float) -> None:
    """Sleeps until ``phase`` seconds after the send time of the lease's
    last renewal (renewals go every ttl/3), at least 50 ms from now."""
    period = TTL / 3.0
    sent = lease.deadline - TTL * 0.9  # deadline = send time + ttl - 10%
    at = sent + phase
    while at < time.monotonic() + 0.05:
        at += period
    time.sleep(at - time.monotonic())


def test_a_lease_rides_out_a_frozen_leader_five_times(fresh_cluster: DevCluster, name: str) -> None:
    """Two 3 s leases held with the default configuration (2 s request
    timeout), one renewed over the renewal stream and one by request,
    through five 4 s freezes of whichever node leads, each at another point
    of the renewal period: never lost, their tokens unchanged."""
    cluster = fresh_cluster
    lost: List[str] = []
    with cluster.client() as streamed, cluster.client(renew_stream=False) as requested:
        leases = [
            streamed.acquire(f"{name}-stream", "rider", ttl=TTL, on_lost=lost.append),
            requested.acquire(f"{name}-request", "rider", ttl=TTL, on_lost=lost.append),
        ]
        for round_ in range(ROUNDS):
            leader = settled_leader(cluster)
            pid = cluster.node_pid(leader)
            freeze_at(leases[round_ % 2], phase=0.1 + 0.2 * round_)
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(FREEZE)
                # Past the ttl: held now means renewed through another node.
                held = [lease.is_held() for lease in leases]
            finally:
                os.kill(pid, signal.SIGCONT)
            if not all(held) or lost:
                raise AssertionError(
                    f"round {round_ + 1}, node {leader} frozen: held {held}, lost {lost}\n"
                    + log_tails(cluster)
                )
        settled_leader(cluster)
        assert all(lease.is_held() for lease in leases) and not lost, lost
        for lease in leases:
            info = streamed.get(lease.name)
            assert (info.holder, info.token) == ("rider", lease.token)
            lease.release()
