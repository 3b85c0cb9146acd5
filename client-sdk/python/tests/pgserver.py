"""A throwaway PostgreSQL server for the tests: initdb in a temp dir, started
on a free loopback port, stopped (``-m immediate``) and removed at the end.

postgres refuses to run as root: as root it runs as the ``postgres`` user
(the Debian package makes it), with the data dir owned by that user and
every directory above it traversable. Binaries: ``PALISADE_PG_BIN`` (a
bin dir), else the newest ``/usr/lib/postgresql/*/bin``, else ``pg_config
--bindir``, else ``PATH``. ``client-sdk/python/ci.sh`` installs PostgreSQL
when it is missing and it runs as root."""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import List, Optional


def find_bindir() -> Optional[Path]:
    candidates: List[Path] = []
    if os.environ.get("PALISADE_PG_BIN"):
        candidates.append(Path(os.environ["PALISADE_PG_BIN"]))

    def version(path: str) -> float:
        try:
            return float(Path(path).parent.name)
        except ValueError:
            return 0.0

    candidates += [Path(p).parent for p in sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: version(str(Path(p).parent)))[::-1]]
    try:
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, timeout=10)
        if out.returncode == 0:
            candidates.append(Path(out.stdout.strip()))
    except OSError:
        pass
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).parent)
    for bindir in candidates:
        if (bindir / "initdb").exists() and (bindir / "pg_ctl").exists():
            return bindir
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """One PostgreSQL server; ``dsn(dbname)`` connects as ``postgres`` with
    no password (trust, loopback only)."""

    def __init__(self, bindir: Path, settings: Optional[List[str]] = None) -> None:
        self.bindir = bindir
        self.as_root = os.geteuid() == 0
        # As root the server runs as `postgres`, which must reach the data dir:
        # under /tmp (world-traversable) rather than a private TMPDIR.
        self.dir = Path(tempfile.mkdtemp(prefix="palisade-pg-", dir="/tmp" if self.as_root else None))
        self.dir.chmod(0o755)
        if self.as_root:
            user = pwd.getpwnam("postgres")
            os.chown(self.dir, user.pw_uid, user.pw_gid)
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.port = 0
        self.started = False
        atexit.register(self.remove)
        self._run([str(bindir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                   "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"])
        options = [
            "-c", "listen_addresses=127.0.0.1",
            "-c", f"unix_socket_directories={self.dir}",
            "-c", "max_connections=200",
            "-c", "track_commit_timestamp=on",  # the tests compare commit order
            "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
        ] + (settings or [])
        last = ""
        for _ in range(3):  # a port can be taken between the check and the bind
            self.port = free_port()
            opts = " ".join(["-p", str(self.port)] + options)
            proc = self._run([str(bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                              "-w", "-t", "60", "-o", opts, "start"], check=False)
            if proc.returncode == 0:
                self.started = True
                return
            last = proc.stdout + proc.stderr + (self.log.read_text(errors="replace") if self.log.exists() else "")
        raise RuntimeError(f"PostgreSQL did not start:\n{last[-3000:]}")

    def _run(self, argv: List[str], check: bool = True) -> "subprocess.CompletedProcess[str]":
        if self.as_root:
            argv = ["runuser", "-u", "postgres", "--"] + argv
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=str(self.dir))
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed:\n{proc.stdout}{proc.stderr}")
        return proc

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname} connect_timeout=10"

    def stop(self) -> None:
        if self.started:
            self.started = False
            self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w",
                       "-t", "30", "stop"], check=False)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
