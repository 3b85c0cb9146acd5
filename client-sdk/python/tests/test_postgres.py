"""Fenced transactions in a real PostgreSQL (palisade_fence.sql and
palisade.postgres), started by the session's ``pg`` fixture.

Commit order is read from the server itself: it runs with
``track_commit_timestamp``, so ``pg_xact_commit_timestamp(xmin)`` is when a
row's transaction committed, and the fence row's is when its last raise
committed."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import psycopg
import pytest

import palisade
from conftest import DevCluster
from palisade import postgres

Conn = psycopg.Connection[Any]


def unique(prefix: str = "pg") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def connect(dsn: str, autocommit: bool = True, **kwargs: Any) -> Conn:
    return psycopg.connect(dsn, autocommit=autocommit, **kwargs)


@pytest.fixture
def table(pgdsn: str) -> Iterator[str]:
    """A table of its own: (id, lease, writer, token, n), with the commit
    time of each row's transaction readable through xmin."""
    name = "t_" + uuid.uuid4().hex[:10]
    with connect(pgdsn) as conn:
        conn.execute(
            f"CREATE TABLE {name} (id bigserial PRIMARY KEY, lease text, writer text, token bigint, n int)"
        )
    yield name


def rows_by_commit(dsn: str, table: str) -> List[Tuple[str, int, int, Any]]:
    """(writer, token, n, commit time) of every row, in commit order."""
    with connect(dsn) as conn:
        return [
            (w, t, n, ts)
            for w, t, n, ts in conn.execute(
                f"SELECT writer, token, n, pg_xact_commit_timestamp(xmin) AS ts FROM {table} "
                "ORDER BY ts, id"
            ).fetchall()
        ]


def fence_row(dsn: str, lease: str) -> Tuple[int, Any]:
    """(fence, commit time of its last raise)."""
    with connect(dsn) as conn:
        row = conn.execute(
            "SELECT fence, pg_xact_commit_timestamp(xmin) FROM palisade.fences WHERE lease = %s",
            (lease,),
        ).fetchone()
    assert row is not None
    return int(row[0]), row[1]


def wait_until_waiting(dsn: str, pid: int, timeout: float = 10.0) -> Tuple[str, str]:
    """Polls until backend ``pid`` waits on a heavyweight lock; its
    (wait_event_type, wait_event)."""
    deadline = time.monotonic() + timeout
    seen: Optional[Tuple[str, str]] = None
    with connect(dsn) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchone()
            if row is not None and row[0] == "Lock":
                return str(row[0]), str(row[1])
            seen = row
            time.sleep(0.02)
    raise AssertionError(f"backend {pid} never waited on a lock (last seen: {seen})")


class Background:
    """Runs ``fn`` in a thread; ``result()`` waits (bounded) for its outcome."""

    def __init__(self, fn: Any) -> None:
        self.outcome: Dict[str, Any] = {}

        def run() -> None:
            try:
                self.outcome["value"] = fn()
            except BaseException as err:  # handed to the test
                self.outcome["error"] = err
            self.outcome["at"] = time.monotonic()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def result(self, timeout: float = 20.0) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "still blocked"
        if "error" in self.outcome:
            raise self.outcome["error"]
        return self.outcome.get("value")


# -- the paused leader ---------------------------------------------------------

LEADER = textwrap.dedent(
    """
    import json, sys, time
    import psycopg
    import palisade
    from palisade import postgres

    name, dsn, table, ttl = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    client = palisade.Client.from_env()
    lease = client.acquire(name, "A", ttl=ttl, wait=10.0)
    jwt = lease.jwt
    conn = psycopg.connect(dsn, autocommit=True)
    print("ACQUIRED", lease.token, flush=True)
    n, outcome = 0, None
    end = time.monotonic() + 60.0
    while time.monotonic() < end and outcome is None:
        try:
            with lease.fenced(conn) as cur:
                cur.execute(f"INSERT INTO {table} (lease, writer, token, n) VALUES (%s, 'A', %s, %s)",
                            (name, lease.token, n))
                if n == 5:  # to be frozen inside this open transaction
                    print("OPEN", flush=True)
                    time.sleep(1.0)
            n += 1
        except palisade.LeaseLost as err:
            outcome = type(err).__name__
        except psycopg.OperationalError as err:
            # Frozen inside the transaction past the idle timeout: the server
            # ended the session (and rolled the transaction back).
            outcome = "session ended: " + str(err).splitlines()[0]
        time.sleep(0.005)
    # The database's own refusal, past the SDK's local check: the old token.
    with psycopg.connect(dsn, autocommit=True) as raw:
        try:
            with postgres.transaction(raw, name, jwt) as cur:
                cur.execute(f"INSERT INTO {table} (lease, writer, token, n) VALUES (%s, 'A-raw', %s, -1)",
                            (name, lease.token))
            direct = "committed"
        except palisade.Fenced as err:
            direct = f"Fenced {err.token} {err.fence}"
    print(json.dumps({"outcome": outcome, "direct": direct, "lost": lease.lost.is_set(),
                      "written": n}), flush=True)
    """
)


def test_a_paused_leader_is_fenced_in_postgres(
    cluster: DevCluster, pgdsn: str, table: str, name: str, tmp_path: Path
) -> None:
    """A writes in fenced transactions and is SIGSTOPped past its ttl inside
    one; B takes the lease, its raise waits until the server ends A's idle
    session (rolling A's transaction back), B commits; A wakes and is
    refused (locally: its deadline passed), and the database refuses A's
    token too; the last row is B's."""
    ttl = 2.0
    script = tmp_path / "leader.py"
    script.write_text(LEADER)
    child = subprocess.Popen(
        [sys.executable, str(script), name, pgdsn, table, str(ttl)],
        env=cluster.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("ACQUIRED"), line + (child.stderr.read() if child.stderr else "")
        token_a = int(line.split()[1])
        assert child.stdout.readline().startswith("OPEN")
        os.kill(child.pid, signal.SIGSTOP)  # in a fenced transaction, which holds the fence
        try:
            with cluster.client() as client:
                lease_b = client.acquire(name, "B", ttl=10.0, wait=15.0)
                assert lease_b.token > token_a
                # The raise waits for A's open transaction: until the server
                # ends A's idle session (A's idle_timeout is its ttl).
                with connect(pgdsn, options="-c statement_timeout=20000") as conn_b:
                    with lease_b.fenced(conn_b) as cur:
                        cur.execute(
                            f"INSERT INTO {table} (lease, writer, token, n) VALUES (%s, 'B', %s, 0)",
                            (name, lease_b.token),
                        )
                lease_b.release()
        finally:
            os.kill(child.pid, signal.SIGCONT)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    report = json.loads(out.strip().splitlines()[-1])
    assert report["outcome"] is not None, report
    assert report["outcome"] in ("LeaseLost", "Fenced") or report["outcome"].startswith(
        "session ended"
    ), (report, err)
    assert report["direct"] == f"Fenced {token_a} 0", report  # the fence is not told
    rows = rows_by_commit(pgdsn, table)
    writers = [w for w, _, _, _ in rows]
    assert writers.count("B") == 1 and "A-raw" not in writers
    assert writers[-1] == "B", rows  # nothing of A committed after B
    # A's frozen transaction (n = 5) was rolled back: its session was ended.
    assert sorted(n for w, _, n, _ in rows if w == "A") == [0, 1, 2, 3, 4]
    assert report["written"] == 5
    fence, raised_at = fence_row(pgdsn, name)
    assert fence == lease_b.token
    assert all(ts < raised_at for w, _, _, ts in rows if w == "A")


# -- a raise waits for the older token's open transaction ----------------------


def test_a_raise_waits_for_an_open_older_transaction_which_commits_first(
    pgdsn: str, table: str
) -> None:
    lease = unique()
    insert = f"INSERT INTO {table} (lease, writer, token, n) VALUES (%s, %s, %s, %s)"
    with connect(pgdsn) as admin:
        postgres.fence_unverified(admin, lease, 5)
    conn_a, conn_b = connect(pgdsn), connect(pgdsn)
    try:
        tx_a = postgres.transaction_unverified(conn_a, lease, 5)
        cur_a = tx_a.__enter__()
        cur_a.execute(insert, (lease, "A", 5, 1))

        def raise_b() -> float:
            with postgres.transaction_unverified(conn_b, lease, 7) as cur:
                cur.execute(insert, (lease, "B", 7, 1))
            return time.monotonic()

        b = Background(raise_b)
        kind, event = wait_until_waiting(pgdsn, conn_b.info.backend_pid)
        assert (kind, event) == ("Lock", "transactionid")  # A's row lock on the fence
        time.sleep(0.2)
        assert b.thread.is_alive()  # still waiting for A
        cur_a.execute(insert, (lease, "A", 5, 2))  # A goes on writing meanwhile
        committed_a = time.monotonic()
        tx_a.__exit__(None, None, None)
        assert b.result() > committed_a
        # A's next transaction is refused; nothing of it is written.
        with pytest.raises(palisade.Fenced) as refused:
            with postgres.transaction_unverified(conn_a, lease, 5) as cur:
                cur.execute(insert, (lease, "A", 5, 3))
        assert (refused.value.token, refused.value.fence) == (5, 0)  # the fence is not told
    finally:
        conn_a.close()
        conn_b.close()
    rows = rows_by_commit(pgdsn, table)
    assert [(w, n) for w, _, n, _ in rows] == [("A", 1), ("A", 2), ("B", 1)]
    fence, raised_at = fence_row(pgdsn, lease)
    assert fence == 7 and rows[-1][3] == raised_at  # B's write and raise: one commit


HOLDER = textwrap.dedent(
    """
    import sys, time
    import psycopg
    from palisade import postgres

    dsn, table, lease = sys.argv[1], sys.argv[2], sys.argv[3]
    conn = psycopg.connect(dsn, autocommit=True)
    with postgres.transaction_unverified(conn, lease, 5) as cur:
        cur.execute(f"INSERT INTO {table} (lease, writer, token, n) VALUES (%s, 'A', 5, 1)", (lease,))
        print("OPEN", conn.info.backend_pid, flush=True)
        time.sleep(60)
    """
)


def test_a_raise_waits_for_an_open_older_transaction_whose_holder_is_killed(
    pgdsn: str, table: str, tmp_path: Path
) -> None:
    lease = unique()
    with connect(pgdsn) as admin:
        postgres.fence_unverified(admin, lease, 5)
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    child = subprocess.Popen(
        [sys.executable, str(script), pgdsn, table, lease],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("OPEN"), line + (child.stderr.read() if child.stderr else "")
        with connect(pgdsn) as conn_b:

            def raise_b() -> None:
                with postgres.transaction_unverified(conn_b, lease, 7) as cur:
                    cur.execute(
                        f"INSERT INTO {table} (lease, writer, token, n) VALUES (%s, 'B', 7, 1)",
                        (lease,),
                    )

            b = Background(raise_b)
            assert wait_until_waiting(pgdsn, conn_b.info.backend_pid) == ("Lock", "transactionid")
            time.sleep(0.2)
            assert b.thread.is_alive()
            child.kill()  # SIGKILL: the server sees the connection close and rolls A back
            child.wait(10)
            b.result()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    rows = rows_by_commit(pgdsn, table)
    assert [w for w, _, _, _ in rows] == ["B"]
    assert fence_row(pgdsn, lease)[0] == 7


# -- many transactions of one holder, then a new holder ------------------------


def test_64_concurrent_transactions_of_a_holder_then_a_raise_no_stale_commit_after(
    cluster: DevCluster, pgdsn: str, table: str
) -> None:
    """64 threads of an old holder (unverified, token new - 1) keep writing;
    the new holder's ``lease.fenced`` proves its JWT (which refuses the old
    token's new transactions at once), then raises past those in flight."""
    lease = unique()
    client = cluster.client()
    holder = client.acquire(lease, "new", ttl=30.0)
    new, workers = holder.token, 64
    old = new - 1
    with connect(pgdsn) as admin:
        postgres.fence_unverified(admin, lease, old)
    insert = f"INSERT INTO {table} (lease, writer, token, n) VALUES (%s, %s, %s, %s)"
    committed: List[Tuple[str, int]] = []
    refused: List[str] = []
    errors: List[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(workers + 1)
    stop = threading.Event()  # set if the test fails: no worker outlives it
    stop_at = time.monotonic() + 30.0

    def worker(i: int) -> None:
        try:
            with connect(pgdsn, application_name=lease) as conn:
                start.wait(30)
                n = 0
                while time.monotonic() < stop_at and not stop.is_set():
                    try:
                        with postgres.transaction_unverified(conn, lease, old) as cur:
                            cur.execute(insert, (lease, f"w{i}", old, n))
                            time.sleep(0.002)  # hold the fence a little
                    except palisade.Fenced:
                        with lock:
                            refused.append(f"w{i}")
                        return
                    with lock:
                        committed.append((f"w{i}", n))
                    n += 1
        except BaseException as err:
            with lock:
                errors.append(err)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    try:
        start.wait(30)
        # Many of the holder's transactions are open at once (no serializing).
        most_at_once = 0
        with connect(pgdsn) as watcher:
            deadline = time.monotonic() + 20.0
            while time.monotonic() < deadline and (len(committed) < 200 or most_at_once < 8):
                # Fenced and writing (the insert follows the fence), not yet committed.
                row = watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                    "AND state = 'idle in transaction' AND backend_xid IS NOT NULL",
                    (lease,),
                ).fetchone()
                most_at_once = max(most_at_once, int(row[0]) if row else 0)
                time.sleep(0.005)
        with connect(pgdsn) as conn:
            with holder.fenced(conn) as cur:
                cur.execute(insert, (lease, "new", new, 0))
        holder.release()
        client.close()
        for t in threads:
            t.join(30)
    finally:
        stop.set()
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[:3]
    assert len(refused) == workers  # every worker was refused, none went on
    rows = rows_by_commit(pgdsn, table)
    fence, raised_at = fence_row(pgdsn, lease)
    assert fence == new
    stale = [r for r in rows if r[1] == old]
    assert len(stale) == len(committed) >= 200  # what the workers saw committed, no more
    assert {(w, n) for w, _, n, _ in stale} == set(committed)
    assert all(ts < raised_at for _, _, _, ts in stale)
    assert rows[-1][0] == "new"
    assert most_at_once >= 8, most_at_once


def test_a_holders_transactions_do_not_wait_for_each_other(pgdsn: str, table: str) -> None:
    lease = unique()
    with connect(pgdsn) as admin:
        postgres.fence_unverified(admin, lease, 5)
    # lock_timeout: a wait for a lock would fail the test, not hang it.
    conns = [connect(pgdsn, options="-c lock_timeout=2000") for _ in range(2)]
    try:
        txs = [postgres.transaction_unverified(c, lease, 5) for c in conns]
        began = time.monotonic()
        curs = [tx.__enter__() for tx in txs]  # both fenced, both open
        assert time.monotonic() - began < 1.0
        for i, cur in enumerate(curs):
            cur.execute(
                f"INSERT INTO {table} (lease, writer, token, n) VALUES (%s, %s, 5, 1)", (lease, f"c{i}")
            )
        with connect(pgdsn) as watcher:  # both hold the fence row FOR SHARE
            row = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s) AND state = 'idle in transaction'",
                ([c.info.backend_pid for c in conns],),
            ).fetchone()
        assert row is not None and row[0] == 2
        for tx in reversed(txs):
            tx.__exit__(None, None, None)
    finally:
        for c in conns:
            c.close()
    assert sorted(w for w, _, _, _ in rows_by_commit(pgdsn, table)) == ["c0", "c1"]


def test_first_use_of_a_lease_is_race_free(pgdsn: str) -> None:
    """Eight first uses at once: the same token all pass; mixed tokens end at
    the highest, and a lower one passes only before it."""
    same, mixed = unique(), unique()
    barrier = threading.Barrier(8)

    def use(lease: str, token: int) -> str:
        with connect(pgdsn) as conn:
            barrier.wait(10)
            try:
                with postgres.transaction_unverified(conn, lease, token):
                    time.sleep(0.01)
                return "ok"
            except palisade.Fenced:
                return "fenced"

    runs = [Background(lambda: use(same, 3)) for _ in range(8)]
    assert [r.result() for r in runs] == ["ok"] * 8
    assert fence_row(pgdsn, same)[0] == 3
    runs = [Background(lambda i=i: use(mixed, i + 1)) for i in range(8)]
    results = [r.result() for r in runs]
    assert results[7] == "ok" and fence_row(pgdsn, mixed)[0] == 8
    assert set(results) <= {"ok", "fenced"}


# -- the SDK's lease.fenced ----------------------------------------------------


def test_lease_fenced_maps_a_stale_token_to_fenced_and_marks_the_lease_lost(
    cluster: DevCluster, pgdsn: str, table: str, name: str
) -> None:
    insert = f"INSERT INTO {table} (lease, writer, token, n) VALUES (%s, %s, %s, %s)"
    with cluster.client() as client, connect(pgdsn, autocommit=False) as conn:
        lease = client.acquire(name, "A", ttl=10.0)
        with lease.fenced(conn) as cur:
            cur.execute(insert, (name, "A", lease.token, 1))
            # A frozen holder loses its session after its ttl idle in here.
            assert cur.execute("SHOW idle_in_transaction_session_timeout").fetchone() == ("10s",)
        assert conn.execute("SHOW idle_in_transaction_session_timeout").fetchone() == ("0",)
        conn.rollback()
        # The block's error rolls back; so does psycopg.Rollback, silently.
        with pytest.raises(RuntimeError):
            with lease.fenced(conn) as cur:
                cur.execute(insert, (name, "A", lease.token, 2))
                raise RuntimeError("boom")
        with lease.fenced(conn) as cur:
            cur.execute(insert, (name, "A", lease.token, 3))
            raise psycopg.Rollback()
        # A connection already in a transaction is refused.
        conn.execute("SELECT 1")
        with pytest.raises(palisade.BadRequest):
            with lease.fenced(conn):
                pass
        conn.rollback()
        # A newer token raises the fence (as a new holder would).
        with connect(pgdsn) as other:
            postgres.fence_unverified(other, name, lease.token + 1000)
        with pytest.raises(palisade.Fenced) as refused:
            with lease.fenced(conn) as cur:
                cur.execute(insert, (name, "A", lease.token, 4))
        assert (refused.value.token, refused.value.fence) == (lease.token, 0)  # the fence is not told
        assert lease.lost.is_set() and not lease.is_held()
        assert "PostgreSQL" in (lease.lost_reason or "")
        # Lost: refused locally, without touching the database (it is closed).
        conn.close()
        with pytest.raises(palisade.LeaseLost):
            with lease.fenced(conn):
                pass
    assert [n for _, _, n, _ in rows_by_commit(pgdsn, table)] == [1]


def test_lease_fenced_refuses_locally_once_the_deadline_passed(
    cluster: DevCluster, pgdsn: str, name: str
) -> None:
    with cluster.client() as client:
        lease = client.acquire(name, "A", ttl=1.0)
        lease._shared.stop.set()  # stop renewing: the deadline passes
        time.sleep(1.1)
        conn = connect(pgdsn)
        conn.close()  # touching it would raise OperationalError
        with pytest.raises(palisade.LeaseLost) as lost:
            with lease.fenced(conn):
                pass
        assert not isinstance(lost.value, palisade.Fenced)


# -- isolation levels ----------------------------------------------------------


@pytest.mark.parametrize("isolation", ["REPEATABLE_READ", "SERIALIZABLE"])
def test_snapshot_isolation_surfaces_our_codes_not_40001(
    pgdsn: str, isolation: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="palisade")
    level = getattr(psycopg.IsolationLevel, isolation)
    lease = unique()
    with connect(pgdsn) as admin:
        postgres.fence_unverified(admin, lease, 5)
    with connect(pgdsn) as conn, connect(pgdsn) as other:
        conn.isolation_level = level
        # The holder's token, with a raise committed after its snapshot: stale.
        with conn.transaction():
            conn.execute("SELECT 1")  # the snapshot
            postgres.fence_unverified(other, lease, 7)
            with pytest.raises(palisade.Fenced) as stale:
                postgres.fence_unverified(conn, lease, 5)
            assert isinstance(stale.value.__cause__, psycopg.Error)
            assert stale.value.__cause__.sqlstate == postgres.STALE_TOKEN
            assert stale.value.fence == 0  # above 5, but not visible from this snapshot
            raise psycopg.Rollback()
        # A raise of its own racing with another raise: our PF005, retryable.
        with conn.transaction():
            conn.execute("SELECT 1")
            postgres.fence_unverified(other, lease, 8)
            with pytest.raises(postgres.FenceRaced) as raced:
                postgres.fence_unverified(conn, lease, 9)
            assert isinstance(raced.value.__cause__, psycopg.Error)
            assert raced.value.__cause__.sqlstate == postgres.FENCE_RACED
            raise psycopg.Rollback()
        # postgres.transaction retries that by itself: a raise to 10 waits for
        # an open raise to 9, which commits; the retry raises to 10.
        tx = postgres.transaction_unverified(other, lease, 9)
        tx.__enter__()

        def raise_10() -> int:
            with postgres.transaction_unverified(conn, lease, 10):
                pass
            return fence_row(pgdsn, lease)[0]

        b = Background(raise_10)
        wait_until_waiting(pgdsn, conn.info.backend_pid)
        tx.__exit__(None, None, None)
        assert b.result() == 10
        assert "raced with another raise; retrying" in caplog.text


# -- guard mode ----------------------------------------------------------------


def expect_sqlstate(state: str, conn: Conn, query: str, params: Any = None) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as caught:
        with conn.transaction():
            conn.execute(query, params)
    assert caught.value.sqlstate == state, caught.value
    return caught.value


def test_guard_by_lease_column(pgdsn: str) -> None:
    guarded, plain = "g_" + uuid.uuid4().hex[:8], "p_" + uuid.uuid4().hex[:8]
    a, b = unique(), unique()
    with connect(pgdsn) as conn:
        for t in (guarded, plain):
            conn.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, lease text, v int)")
        postgres.guard(conn, guarded, lease_column="lease")
        postgres.guard(conn, guarded, lease_column="lease")  # again: replaces, same guard
        postgres.fence_unverified(conn, a, 3)
        postgres.fence_unverified(conn, b, 4)
        # Unfenced: refused.
        err = expect_sqlstate("PF002", conn, f"INSERT INTO {guarded} VALUES (1, %s, 0)", (a,))
        assert "did not call palisade.fence" in str(err)
        # Fenced for the row's lease: passes; for another lease: refused.
        with postgres.transaction_unverified(conn, a, 3) as cur:
            cur.execute(f"INSERT INTO {guarded} VALUES (1, %s, 0)", (a,))
        with pytest.raises(psycopg.Error) as other_lease:
            with postgres.transaction_unverified(conn, b, 4) as cur:
                cur.execute(f"INSERT INTO {guarded} VALUES (2, %s, 0)", (a,))
        assert other_lease.value.sqlstate == postgres.NOT_FENCED
        # UPDATE checks the old and the new row's lease; DELETE the old one.
        with pytest.raises(psycopg.Error) as moved:
            with postgres.transaction_unverified(conn, a, 3) as cur:
                cur.execute(f"UPDATE {guarded} SET lease = %s WHERE id = 1", (b,))
        assert moved.value.sqlstate == postgres.NOT_FENCED
        with pytest.raises(psycopg.Error) as taken:
            with postgres.transaction_unverified(conn, b, 4) as cur:
                cur.execute(f"UPDATE {guarded} SET lease = %s WHERE id = 1", (b,))
        assert taken.value.sqlstate == postgres.NOT_FENCED
        with conn.transaction():
            postgres.fence_unverified(conn, a, 3)
            postgres.fence_unverified(conn, b, 4)
            conn.execute(f"UPDATE {guarded} SET lease = %s, v = 1 WHERE id = 1", (b,))
        expect_sqlstate("PF002", conn, f"DELETE FROM {guarded} WHERE id = 1")
        expect_sqlstate("PF002", conn, f"UPDATE {guarded} SET v = 2")
        expect_sqlstate("PF002", conn, f"TRUNCATE {guarded}")
        with postgres.transaction_unverified(conn, a, 3) as cur:  # a row without a lease is refused
            with pytest.raises(psycopg.Error) as null_lease:
                with conn.transaction():
                    cur.execute(f"INSERT INTO {guarded} VALUES (3, NULL, 0)")
            assert null_lease.value.sqlstate == postgres.NOT_FENCED
        # The fence is transaction-local: the next transaction is unfenced.
        expect_sqlstate("PF002", conn, f"DELETE FROM {guarded} WHERE id = 1")
        with postgres.transaction_unverified(conn, b, 4) as cur:
            cur.execute(f"DELETE FROM {guarded} WHERE id = 1")
        # The unguarded table is untouched by all this.
        conn.execute(f"INSERT INTO {plain} VALUES (1, %s, 0)", (a,))
        conn.execute(f"UPDATE {plain} SET v = 1")
        conn.execute(f"TRUNCATE {plain}")
        # The mark cannot be forged: it is keyed by a secret only the owner reads.
        with pytest.raises(psycopg.Error) as forged:
            with conn.transaction():
                conn.execute("SELECT set_config('palisade.fenced', %s, true)", (f",{a}:3:{'0' * 32}",))
                conn.execute(f"INSERT INTO {guarded} VALUES (4, %s, 0)", (a,))
        assert forged.value.sqlstate == postgres.NOT_FENCED
        # Unguarded: plain writes pass.
        postgres.unguard(conn, guarded)
        postgres.unguard(conn, guarded)
        conn.execute(f"INSERT INTO {guarded} VALUES (5, %s, 0)", (a,))
        # A guard needs a text column that exists.
        expect_sqlstate("42703", conn, "SELECT palisade.guard(%s::regclass, 'nope')", (guarded,))
        expect_sqlstate("42804", conn, "SELECT palisade.guard(%s::regclass, 'v')", (guarded,))
        with pytest.raises(palisade.BadRequest):
            postgres.guard(conn, guarded)


def test_guard_of_a_whole_table(pgdsn: str) -> None:
    guarded = "w_" + uuid.uuid4().hex[:8]
    a, b = unique(), unique()
    with connect(pgdsn) as conn:
        conn.execute(f"CREATE TABLE {guarded} (id int, v int)")
        postgres.guard(conn, guarded, lease=a)
        postgres.fence_unverified(conn, a, 3)
        postgres.fence_unverified(conn, b, 4)
        expect_sqlstate("PF002", conn, f"INSERT INTO {guarded} VALUES (1, 0)")
        with pytest.raises(psycopg.Error) as other_lease:
            with postgres.transaction_unverified(conn, b, 4) as cur:
                cur.execute(f"INSERT INTO {guarded} VALUES (1, 0)")
        assert other_lease.value.sqlstate == postgres.NOT_FENCED
        with postgres.transaction_unverified(conn, a, 3) as cur:
            cur.execute(f"INSERT INTO {guarded} VALUES (1, 0), (2, 0)")
            cur.execute(f"UPDATE {guarded} SET v = 1 WHERE id = 1")
            cur.execute(f"DELETE FROM {guarded} WHERE id = 2")
        expect_sqlstate("PF002", conn, f"UPDATE {guarded} SET v = 2")
        expect_sqlstate("PF002", conn, f"DELETE FROM {guarded}")
        expect_sqlstate("PF002", conn, f"TRUNCATE {guarded}")
        with postgres.transaction_unverified(conn, a, 3) as cur:
            cur.execute(f"TRUNCATE {guarded}")
        # Switching to a column guard replaces the table guard.
        with pytest.raises(palisade.BadRequest):
            postgres.guard(conn, guarded, lease="a/b")
        expect_sqlstate("PF003", conn, "SELECT palisade.guard_table(%s::regclass, 'a/b')", (guarded,))
        postgres.unguard(conn, guarded)
        conn.execute(f"INSERT INTO {guarded} VALUES (3, 0)")
        rows = conn.execute(f"SELECT id FROM {guarded}").fetchall()
        assert rows == [(3,)]


# -- bad input, install, versions ----------------------------------------------


@pytest.mark.parametrize(
    "lease",
    ["", ".", "..", "a/b", "a b", "x" * 129, "é", "a\nb", "a\n", "a,b", "a:b", None],
)
def test_bad_lease_names_are_refused(pgdsn: str, lease: Optional[str]) -> None:
    with connect(pgdsn) as conn:
        err = expect_sqlstate("PF003", conn, "SELECT palisade.fence_unverified(%s::text, 1)", (lease,))
        assert "invalid lease name" in str(err)
        if lease is not None:
            with pytest.raises(palisade.BadRequest):  # refused before anything is sent
                postgres.fence_unverified(conn, lease, 1)


def test_bad_tokens_are_refused(pgdsn: str) -> None:
    lease = unique()
    with connect(pgdsn) as conn:
        for token in (0, -1, -(2**63), None):
            err = expect_sqlstate("PF004", conn, "SELECT palisade.fence_unverified(%s, %s::bigint)", (lease, token))
            assert "invalid fencing token" in str(err)
        # Above the bigint range: the type refuses it.
        expect_sqlstate("22003", conn, "SELECT palisade.fence_unverified(%s, '9223372036854775808')", (lease,))
        expect_sqlstate("42883", conn, "SELECT palisade.fence_unverified(%s, 9223372036854775808)", (lease,))
        for bad in (0, -1, 2**63, True, 1.5, "3"):
            with pytest.raises(palisade.BadRequest):
                postgres.fence_unverified(conn, lease, bad)  # type: ignore[arg-type]
        assert postgres.fence_unverified(conn, lease, 2**63 - 1) == 2**63 - 1
        assert postgres.fence_unverified(conn, "x" * 128, 1) == 1


def test_install_is_idempotent_versioned_and_refuses_a_newer_schema(pg: Any) -> None:
    db = "install_" + uuid.uuid4().hex[:8]
    with connect(pg.dsn()) as admin:
        admin.execute(f"CREATE DATABASE {db}")
    dsn = pg.dsn(db)
    assert "v_file CONSTANT integer := %d;" % postgres.SCHEMA_VERSION in postgres.sql()
    with connect(dsn) as conn:
        assert postgres.installed_version(conn) is None
    # Installers at once: one creates, the others find it done.
    def install() -> int:
        with connect(dsn) as conn:
            return postgres.install(conn)

    results = [Background(install) for _ in range(4)]
    assert [r.result() for r in results] == [postgres.SCHEMA_VERSION] * 4
    catalog = (
        "SELECT array_agg(p.oid::text || ':' || p.xmin::text ORDER BY p.oid) FROM pg_proc p "
        "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'palisade'"
    )
    with connect(dsn) as conn:
        assert postgres.installed_version(conn) == postgres.SCHEMA_VERSION
        before = conn.execute(catalog).fetchone()
        version_row = conn.execute("SELECT xmin::text FROM palisade.version").fetchone()
        postgres.install(conn)  # again: nothing changes, not even a function's row
        assert conn.execute(catalog).fetchone() == before
        assert conn.execute("SELECT xmin::text FROM palisade.version").fetchone() == version_row
        # psql runs the same file.
        psql = subprocess.run(
            [str(pg.bindir / "psql"), "-X", "-v", "ON_ERROR_STOP=1", "-q", "-d", dsn, "-f", "-"],
            input=postgres.sql(), capture_output=True, text=True, timeout=60,
        )
        assert psql.returncode == 0, psql.stderr
        # A newer version in the database: refused with its own code, nothing changed.
        conn.execute("UPDATE palisade.version SET version = version + 1 WHERE part = 'fence'")
        with pytest.raises(postgres.SchemaTooNew) as newer:
            postgres.install(conn)
        assert "newer" in str(newer.value)
        assert isinstance(newer.value.__cause__, psycopg.Error)
        assert newer.value.__cause__.sqlstate == postgres.SCHEMA_TOO_NEW
        assert postgres.installed_version(conn) == postgres.SCHEMA_VERSION + 1
    with connect(pg.dsn()) as admin:
        admin.execute(f"DROP DATABASE {db} WITH (FORCE)")


def test_import_palisade_works_without_psycopg() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["psycopg"] = None  # as if not installed
        import palisade
        assert hasattr(palisade.Lease, "fenced")
        try:
            import palisade.postgres
        except ImportError as err:
            print("ImportError:", err)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ImportError: palisade.postgres needs psycopg 3" in out.stdout
