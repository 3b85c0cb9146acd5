"""A prefix watch (``GET /v1/watch``): one stream of the changes to every
lease under a prefix, read as :class:`WatchEvent` objects. On a cluster of
several partitions one stream follows all of them: each event names its
partition, and a :class:`WatchCursor` (one index per partition) says where
to resume. The Rust SDK's ``PrefixWatch`` and ``WatchCursor``, in Python."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import httpx

from ._answer import error_for, json_of
from ._errors import PalisadeError, ProtocolError, Unavailable
from ._model import LeaseInfo

#: A stream silent this long is taken for dead: the server sends a
#: keep-alive every 10 s by default.
SILENT_FOR = 35.0
#: The longest line accepted (a lease with its fields is far less).
MAX_LINE = 1 << 20
#: A partition number past this in a line is the server's error (a cluster
#: runs at most 64).
MAX_PARTITIONS = 4096


@dataclass(frozen=True)
class WatchEvent:
    """One event of a :class:`PrefixWatch`: ``kind`` is ``"changed"`` (a
    lease under the prefix changed: ``lease`` as the change at ``index``
    left it), ``"deleted"`` (a free lease's record ``lease_name`` was
    reclaimed at ``index``) or ``"progress"`` (a keep-alive: every change of
    ``partition`` up to ``index`` has been sent)."""

    kind: str
    #: The partition whose log ``index`` is of (0 on a cluster of one).
    partition: int
    index: int
    lease: Optional[LeaseInfo] = None
    #: The lease's name (for every kind but ``"progress"``).
    lease_name: Optional[str] = None


@dataclass
class WatchCursor:
    """Where a watch resumes: the last index read of each partition, in
    partition order (empty: from the start). ``str()`` gives ``I0,I1,...``,
    the form of ``GET /v1/watch?indexes=``; :meth:`parse` reads it back. A
    cursor of one index that no partitioned stream moved (a cluster of one
    partition) resumes as ``index=I``, which every node understands."""

    indexes: List[int] = field(default_factory=list)
    partitioned: bool = False

    @classmethod
    def parse(cls, text: str) -> "WatchCursor":
        """``I0,I1,...``; raises :class:`ValueError` otherwise."""
        if not text.strip():
            return cls()
        indexes = [int(part) for part in text.split(",")]
        if any(index < 0 for index in indexes):
            raise ValueError(f"{text!r} has a negative index")
        return cls(indexes, len(indexes) > 1)

    def index_of(self, partition: int) -> int:
        """The last index read of ``partition`` (0: none)."""
        return self.indexes[partition] if partition < len(self.indexes) else 0

    def query(self) -> str:
        """The query that resumes from here."""
        if not self.indexes:
            return ""
        if len(self.indexes) == 1 and not self.partitioned:
            return f"&index={self.indexes[0]}"
        return f"&indexes={self}"

    def advance(self, partition: int, index: int, named: bool) -> None:
        """Moves ``partition`` on to ``index`` (never back)."""
        if len(self.indexes) <= partition:
            self.indexes.extend([0] * (partition + 1 - len(self.indexes)))
        self.indexes[partition] = max(self.indexes[partition], index)
        self.partitioned = self.partitioned or named or len(self.indexes) > 1

    def __str__(self) -> str:
        return ",".join(str(index) for index in self.indexes)


class PrefixWatch:
    """An open prefix watch (:meth:`palisade.Client.watch_prefix`). Iterate
    it for events; once it ends (the iteration stops, or raises), open
    another from :attr:`cursor` to resume where it stopped. Use it as a
    context manager, or :meth:`close` it."""

    def __init__(self, response: httpx.Response, cursor: WatchCursor, silent_for: float) -> None:
        self._response = response
        self._chunks: Iterator[bytes] = response.iter_bytes()
        self._buffer = b""
        self._silent_for = silent_for
        #: Where a new watch resumes: the last index read of each partition.
        self.cursor = cursor
        self._ended = False

    def __enter__(self) -> "PrefixWatch":
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def close(self) -> None:
        """Ends the stream (the server sees the connection close)."""
        self._ended = True
        self._response.close()

    def __iter__(self) -> "PrefixWatch":
        return self

    def __next__(self) -> WatchEvent:
        try:
            line = self._line()
            if line is None:
                raise StopIteration
            return self._event(line)
        except PalisadeError:
            self.close()
            raise

    def _line(self) -> Optional[bytes]:
        """The next non-blank line, split on ``\\n`` alone (a lease may hold
        U+2028, which ``str.splitlines`` would split on); ``None`` at the
        end."""
        while not self._ended:
            at = self._buffer.find(b"\n")
            if at >= 0:
                line, self._buffer = self._buffer[:at], self._buffer[at + 1 :]
                if line.strip():
                    return line
                continue
            if len(self._buffer) > MAX_LINE:
                raise ProtocolError(200, "a watch line longer than 1 MiB")
            try:
                self._buffer += next(self._chunks)
            except StopIteration:
                self.close()
            except httpx.ReadTimeout as err:
                last = f"the watch sent nothing, not even a keep-alive, for {self._silent_for}s"
                raise Unavailable(1, self._silent_for, last) from err
            except httpx.HTTPError as err:
                raise Unavailable(1, 0.0, f"the watch was cut: {type(err).__name__}: {err}") from err
        return None

    def _event(self, line: bytes) -> WatchEvent:
        """One line as an event, or the error the stream ends with; the
        cursor moves only past a line understood."""
        try:
            value = json.loads(line.decode("utf-8"))
        except ValueError as err:
            raise ProtocolError(200, f"a watch line that is not JSON: {err}") from err
        if not isinstance(value, dict):
            raise ProtocolError(200, "a watch line that is not an object")
        index = value.get("index")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise ProtocolError(200, "a watch line without an index")
        named = "partition" in value
        partition = value.get("partition", 0)
        if isinstance(partition, bool) or not isinstance(partition, int):
            raise ProtocolError(200, f"a watch line whose partition is {partition!r}")
        if not 0 <= partition < MAX_PARTITIONS:
            raise ProtocolError(200, f"a watch line whose partition is {partition!r}")
        event = self._parse(value, partition, index)
        self.cursor.advance(partition, index, named)
        code = value.get("error")
        if isinstance(code, str):
            if code in ("unauthorized", "forbidden"):
                raise error_for(401 if code == "unauthorized" else 403, value)
            raise Unavailable(1, 0.0, f"{code}: {value.get('message', '')}")
        return event

    @staticmethod
    def _parse(value: Dict[str, Any], partition: int, index: int) -> WatchEvent:
        if value.get("deleted") is True:
            name = value.get("lease_name")
            return WatchEvent("deleted", partition, index, lease_name=name if isinstance(name, str) else "")
        lease = value.get("lease")
        if isinstance(lease, dict):
            try:
                info = LeaseInfo.from_json(lease)
            except (KeyError, TypeError, ValueError) as err:
                raise ProtocolError(200, f"a watch line with a malformed lease: {err}") from err
            return WatchEvent("changed", partition, index, lease=info, lease_name=info.lease)
        return WatchEvent("progress", partition, index)


def silence_bound(keepalive: float) -> float:
    """How long a stream with keep-alives every ``keepalive`` seconds may
    send nothing before it is taken for dead."""
    return max(SILENT_FOR, keepalive + 25.0)


def open_watch(
    http: httpx.Client,
    urls: Sequence[str],
    first: int,
    path: str,
    start: Tuple[WatchCursor, float],
    request_timeout: float,
    passed_over: Callable[[int], None],
) -> PrefixWatch:
    """Opens ``path`` on the first of ``urls`` that answers 200, starting at
    ``first`` and trying each once; a refusal (4xx but 429) is raised at
    once, as its mapped error. The answer's headers must come within
    ``request_timeout``; then lines may be ``silent_for`` apart (``start``
    is the cursor and that bound)."""
    cursor, silent_for = start
    started = time.monotonic()
    last = "no node answered"
    for attempt in range(max(len(urls), 1)):
        at = (first + attempt) % len(urls)
        url = urls[at] + path
        try:
            request = http.build_request("GET", url, timeout=httpx.Timeout(request_timeout))
            response = http.send(request, stream=True)
        except httpx.HTTPError as err:
            last = f"{url}: {type(err).__name__}: {err}"
            passed_over(at)
            continue
        if response.status_code == 200:
            # The body's reads wait up to the silence bound (httpcore reads
            # the request's timeout again when the body starts).
            timeouts = dict(response.request.extensions.get("timeout", {}))
            response.request.extensions["timeout"] = {**timeouts, "read": silent_for}
            return PrefixWatch(response, cursor, silent_for)
        try:
            response.read()
        except httpx.HTTPError as err:
            last = f"{url}: {response.status_code}, then {type(err).__name__}: {err}"
            passed_over(at)
            continue
        finally:
            response.close()
        if response.status_code not in (503, 429):
            raise error_for(response.status_code, json_of(response))
        last = f"{url}: {response.status_code}"
        passed_over(at)
    raise Unavailable(max(len(urls), 1), time.monotonic() - started, last)
