"""Fixtures: a real ``palisade dev`` cluster (binary from ``PALISADE_BIN``),
started once per session in a temp dir on free ports, and a tiny scriptable
HTTP server for what a real cluster cannot be made to answer on cue."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

import palisade

BIN = os.environ.get("PALISADE_BIN", "/work/main/target/debug/palisade")
PORT_RANGE = (27000, 28800)


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_ports() -> Tuple[int, int]:
    """An election base port P (P..P+2 and the peer ports P+100..P+102 free)
    and a free gateway port, in 27000-28800."""
    for _ in range(200):
        base = random.randrange(PORT_RANGE[0], PORT_RANGE[1] - 110)
        gateway = random.randrange(PORT_RANGE[0], PORT_RANGE[1])
        wanted = [base, base + 1, base + 2, base + 100, base + 101, base + 102]
        if gateway in wanted or gateway in range(base, base + 103):
            continue
        if all(port_free(p) for p in wanted + [gateway]):
            return base, gateway
    raise RuntimeError("no free ports in 27000-28800")


def children_of(pid: int) -> List[Tuple[int, str]]:
    """(pid, command line) of the live children of ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid != pid:
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            continue
        found.append((int(entry.name), cmdline))
    return found


class DevCluster:
    """One ``palisade dev``: 3 election nodes and a gateway, with a policy."""

    def __init__(
        self,
        tls: bool = False,
        prepare: Optional[Callable[[Path], None]] = None,
        partitions: int = 1,
    ) -> None:
        """``tls``: ``palisade dev --tls`` (https, client TLS, the CA in
        ``certs/ca.pem``); ``prepare`` runs on the data dir before the
        first start (a policy of the test's own, say); ``partitions`` > 1:
        ``palisade dev --partitions N``."""
        if not os.access(BIN, os.X_OK):
            pytest.fail(f"no palisade binary at {BIN} (set PALISADE_BIN)")
        self.dir = Path(tempfile.mkdtemp(prefix="palisade-pytest-"))
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.children: List[int] = []
        last = ""
        for _ in range(3):  # ports can be taken between the check and the bind
            self.base, self.gateway_port = pick_ports()
            data = self.dir / f"data-{self.base}"
            self.log = self.dir / f"dev-{self.base}.out"
            if prepare is not None:
                data.mkdir(parents=True)
                prepare(data)
            with open(self.log, "wb") as out:
                self.proc = subprocess.Popen(
                    [
                        BIN, "dev", "--data-dir", str(data),
                        "--election-port", str(self.base),
                        "--gateway-port", str(self.gateway_port),
                    ]
                    + (["--tls"] if tls else [])
                    + (
                        ["--partitions", str(partitions), "--slow-elections"]
                        if partitions > 1
                        else []
                    ),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and self.proc.poll() is None:
                if "cluster is up" in self.log.read_text(errors="replace"):
                    break
                time.sleep(0.1)
            text = self.log.read_text(errors="replace")
            if self.proc.poll() is None and "cluster is up" in text:
                self.data = data
                break
            last = text[-3000:]
            self.stop()
        else:
            shutil.rmtree(self.dir, ignore_errors=True)
            pytest.fail(f"palisade dev did not come up:\n{last}")
        self.children = [pid for pid, _ in children_of(self.proc.pid)]
        scheme = "https" if tls else "http"
        self.election = [f"{scheme}://127.0.0.1:{self.base + i}" for i in range(3)]
        self.gateway = f"{scheme}://127.0.0.1:{self.gateway_port}"
        self.key_file = str(self.data / "admin.key")
        self.api_key = Path(self.key_file).read_text().strip()

    def env(self) -> Dict[str, str]:
        """The environment a client process needs (``Client.from_env``)."""
        env = dict(os.environ)
        for name in ("PALISADE_API_KEY", "PALISADE_CA"):
            env.pop(name, None)
        env.update(
            PALISADE_ELECTION=",".join(self.election),
            PALISADE_GATEWAY=self.gateway,
            PALISADE_API_KEY_FILE=self.key_file,
        )
        return env

    def client(self, **options: Any) -> palisade.Client:
        options.setdefault("api_key", self.api_key)
        return palisade.Client(self.election, self.gateway, **options)

    def node_pid(self, node: int) -> int:
        """The pid of election node ``node`` (1..3)."""
        assert self.proc is not None
        needle = f"--listen 127.0.0.1:{self.base + node - 1} "
        for pid, cmdline in children_of(self.proc.pid):
            if needle in cmdline + " " and " election " in f" {cmdline} ":
                return pid
        raise LookupError(f"election node {node} is not running")

    def leader(self) -> int:
        """The id of the current leader (waits up to 10 s for one)."""
        with self.client() as client:
            for _ in range(100):
                leader = client.cluster().get("leader")
                if isinstance(leader, int) and leader > 0:
                    return leader
                time.sleep(0.1)
        raise RuntimeError("no leader")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL (the whole process group) after 10 s."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(5)
        for pid in self.children:  # never left behind, even if dev was killed
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                if str(self.dir).encode() in cmdline:  # still ours, not a reused pid
                    os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass
        self.proc = None

    def remove(self) -> None:
        """Stops the cluster and removes its temp dir."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster() -> Iterator[DevCluster]:
    dev = DevCluster()
    try:
        yield dev
    finally:
        dev.remove()


@pytest.fixture
def fresh_cluster() -> Iterator[DevCluster]:
    """A cluster of its own, for tests that kill nodes."""
    dev = DevCluster()
    try:
        yield dev
    finally:
        dev.remove()


@pytest.fixture
def name() -> str:
    """A lease name no other test uses."""
    return f"py-{uuid.uuid4().hex[:12]}"


# -- a scriptable fake server --------------------------------------------------

Reply = Tuple[int, Any]
Route = Callable[[str, str, Any], Reply]


class FakeServer:
    """An HTTP server on a free loopback port whose answers come from
    ``route(method, path, json_body) -> (status, json)``; it records every
    request. A ``(status, json)`` with status ``-1`` closes the connection
    without answering; ``("sleep", seconds)`` bodies delay the answer;
    ``("headers", {name: value}, json)`` bodies add headers (a
    ``content-length`` among them replaces the body's: for HEAD);
    ``("raw", bytes)`` bodies are sent as they are. A HEAD is answered
    without its body."""

    def __init__(self, route: Route) -> None:
        self.route = route
        self.requests: List[Tuple[str, str, Any, Dict[str, str]]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def handle_any(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw
                fake.requests.append((self.command, self.path, body, dict(self.headers)))
                status, answer = fake.route(self.command, self.path, body)
                headers: Dict[str, str] = {}
                if isinstance(answer, tuple) and answer and answer[0] == "headers":
                    headers, answer = answer[1], answer[2]
                if isinstance(answer, tuple) and answer and answer[0] == "sleep":
                    time.sleep(answer[1])
                    answer = answer[2] if len(answer) > 2 else {}
                if status == -1:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                content_type = "application/json"
                if isinstance(answer, tuple) and answer and answer[0] == "raw":
                    data, content_type = answer[1], "application/octet-stream"
                else:
                    data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("content-type", content_type)
                if "content-length" not in {h.lower() for h in headers}:
                    self.send_header("content-length", str(len(data)))
                for header, value in headers.items():
                    self.send_header(header, value)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = handle_any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def paths(self) -> List[str]:
        return [path for _, path, _, _ in self.requests]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_server() -> Iterator[Callable[[Route], FakeServer]]:
    servers: List[FakeServer] = []

    def make(route: Route) -> FakeServer:
        server = FakeServer(route)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


def closed_port_url() -> str:
    """A loopback URL nothing listens on (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# -- a throwaway PostgreSQL (the fenced-transaction tests) ---------------------


@pytest.fixture(scope="session")
def pg() -> Iterator[Any]:
    """A PostgreSQL server of the session's own (tests/pgserver.py)."""
    from pgserver import PgServer, find_bindir

    bindir = find_bindir()
    if bindir is None:
        pytest.fail(
            "no PostgreSQL binaries (initdb, pg_ctl): apt-get install postgresql "
            "(ci.sh does, as root), or set PALISADE_PG_BIN to their directory"
        )
    server = PgServer(bindir)
    try:
        yield server
    finally:
        server.remove()


@pytest.fixture(scope="session")
def pgdsn(pg: Any, cluster: DevCluster) -> str:
    """The DSN of a database with the fence schema and the session
    cluster's keys installed (connections are the schema's owner). Proofs
    get an hour of leeway on their ``exp``: the paused-leader test uses a
    JWT long expired to show the database refuses its token as stale."""
    import psycopg

    from palisade import postgres

    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute("CREATE DATABASE fencing")
    dsn: str = pg.dsn("fencing")
    with psycopg.connect(dsn) as conn, cluster.client() as client:
        postgres.install(conn)
        assert postgres.set_keys(conn, client.jwks()) >= 1
        with conn.transaction():
            conn.execute("UPDATE palisade.settings SET exp_leeway_secs = 3600")
    return dsn


def record_renew_requests(client: palisade.Client) -> List[str]:
    """Wraps the client's election calls: the renew calls made by request
    are listed (the stream's renewals never go through it)."""
    transport = client._transport
    calls: List[str] = []
    inner = transport.election

    def election(method: str, path: str, body: Optional[Any] = None, **kw: Any) -> Any:
        if path.endswith("/renew"):
            calls.append(path)
        return inner(method, path, body, **kw)

    transport.election = election  # type: ignore[method-assign]
    return calls
