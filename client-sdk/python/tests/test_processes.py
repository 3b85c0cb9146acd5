"""Real processes: a holder SIGSTOPped past its ttl, and an election node
killed in the middle of a call."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, List

import palisade
from conftest import DevCluster

CHILD = textwrap.dedent(
    """
    import json, sys, time
    import palisade

    name, ttl = sys.argv[1], float(sys.argv[2])
    lost = []
    client = palisade.Client.from_env()
    lease = client.acquire(name, "child", ttl=ttl, wait=10.0, on_lost=lost.append)
    lease.put(name + "/state", b"from child")
    print("ACQUIRED", lease.token, flush=True)
    samples = []  # (monotonic before, is_held(), monotonic after)
    end = time.monotonic() + 30.0
    woke = None
    while time.monotonic() < end:
        before = time.monotonic()
        held = lease.is_held()
        samples.append((before, held, time.monotonic()))
        if len(samples) > 1 and samples[-1][0] - samples[-2][0] > ttl and woke is None:
            woke = before
        if woke is not None and before - woke > 1.0:
            break
        time.sleep(0.002)
    try:
        lease.put(name + "/state", b"late child")
        late = "written"
    except palisade.LeaseLost as err:
        late = type(err).__name__
    print(json.dumps({"samples": samples, "late": late, "lost": lost,
                      "lost_set": lease.lost.is_set()}), flush=True)
    lease.release()
    """
)


def test_a_holder_stopped_past_its_ttl_is_never_held_after_waking(
    cluster: DevCluster, name: str, tmp_path: Path
) -> None:
    ttl = 2.0
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    child = subprocess.Popen(
        [sys.executable, str(script), name, str(ttl)],
        env=cluster.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()  # bounded: the child acquires within 10 s or exits
        assert line.startswith("ACQUIRED"), line + (child.stderr.read() if child.stderr else "")
        child_token = int(line.split()[1])
        time.sleep(1.0)
        os.kill(child.pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            # While it sleeps, another holder takes over and writes.
            client = cluster.client()
            lease = client.acquire(name, "parent", ttl=10.0, wait=15.0)
            assert lease.token > child_token
            lease.put(f"{name}/state", b"from parent")
            time.sleep(max(0.0, stopped_at + ttl + 1.0 - time.monotonic()))
        finally:
            os.kill(child.pid, signal.SIGCONT)
        out, err = child.communicate(timeout=40)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(5)
    assert child.returncode == 0, err
    report: Any = json.loads(out.strip().splitlines()[-1])
    samples: List[List[Any]] = report["samples"]
    gaps = [samples[i + 1][0] - samples[i][0] for i in range(len(samples) - 1)]
    stop = max(range(len(gaps)), key=gaps.__getitem__)
    assert gaps[stop] > ttl, "the child was not stopped past its ttl"
    before, after = samples[: stop + 1], samples[stop + 1 :]
    assert any(held for _, held, _ in before), "the child never held the lease"
    assert after, "no samples after waking"
    assert not any(held for _, held, _ in after), "is_held() was true after waking"
    assert report["late"] == "LeaseLost"
    assert report["lost_set"] and report["lost"]
    obj = client.get_object(f"{name}/state")
    assert obj is not None and obj.value == b"from parent"
    lease.release()


def test_an_election_node_killed_mid_call(fresh_cluster: DevCluster, name: str) -> None:
    """A blocking acquire is waiting on the leader when it is killed: the
    call carries on through another node (same secret, same call) and gets
    the lease once the old grant expires; other calls keep working."""
    cluster = fresh_cluster
    leader = cluster.leader()
    # The client talks to the leader first.
    order = [leader] + [n for n in (1, 2, 3) if n != leader]
    client = palisade.Client(
        [cluster.election[n - 1] for n in order], cluster.gateway, api_key=cluster.api_key
    )
    old = client.acquire_grant(name, "H", ttl=2.0)  # never renewed
    results: List[palisade.Lease] = []
    errors: List[BaseException] = []

    def wait_for_it() -> None:
        try:
            results.append(client.acquire(name, "C", ttl=5.0, wait=20.0))
        except BaseException as err:
            errors.append(err)

    thread = threading.Thread(target=wait_for_it, daemon=True)
    thread.start()
    time.sleep(0.5)
    assert thread.is_alive()
    os.kill(cluster.node_pid(leader), signal.SIGKILL)
    thread.join(30)
    assert not errors, errors
    assert results, "the acquire did not complete"
    lease = results[0]
    assert lease.token > old.token and lease.is_held()
    assert client.cluster()["leader"] != leader
    assert client._transport._preferred % 3 != 0  # moved off the dead node
    lease.put(f"{name}/x", b"after the kill")
    time.sleep(1.0)  # renewals go on without the dead node
    assert lease.is_held()
    lease.release()
    assert client.get(name).holder is None
