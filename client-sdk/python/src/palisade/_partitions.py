"""The partition map (issue 46): which partition a lease is in, and which
node leads each partition, as far as the client knows.

A cluster started with ``--partitions N`` runs N Raft groups, each with
its own leader; a lease belongs to partition ``fnv1a64(name) % N``. Any
node serves every call (it forwards to the partition's leader), but a call
sent to the partition's leader takes one hop less, and a partition's
failover then touches only its own leases' calls.

The map is learned from ``GET /v1/cluster`` answers (``partitions``: one
entry per partition, with its ``leader`` and ``term``) and from the
``x-palisade-leader`` header of lease calls. With one partition (or before
anything is learned) it routes nothing: the client behaves as without it.
"""

from __future__ import annotations

import threading
from typing import Any, List, Mapping, Optional
from urllib.parse import parse_qs, urlsplit

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
LEASE_PATH = "/v1/leases/"


def fnv1a64(data: bytes) -> int:
    """64-bit FNV-1a of ``data``."""
    h = FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def partition_of(name: str, count: int) -> int:
    """The partition of lease ``name`` among ``count``."""
    return fnv1a64(name.encode("utf-8")) % max(count, 1)


def lease_in_path(path: str) -> Optional[str]:
    """The lease a call on ``/v1/leases/{name}[/...]`` is about."""
    if not path.startswith(LEASE_PATH):
        return None
    name = urlsplit(path).path[len(LEASE_PATH):].split("/", 1)[0]
    return name or None


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class PartitionMap:
    """The partition count and each partition's leader (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count: Optional[int] = None  # None: not learned yet
        self._leaders: List[Optional[int]] = []
        self._terms: List[int] = []

    @property
    def count(self) -> Optional[int]:
        """The partition count, ``None`` before a ``/v1/cluster`` said."""
        with self._lock:
            return self._count

    def partitioned(self) -> bool:
        """Whether the cluster is known to have more than one partition."""
        with self._lock:
            return self._count is not None and self._count > 1

    def of_path(self, path: str) -> Optional[int]:
        """The partition a call is for: ``?partition=k``, or the lease of a
        ``/v1/leases/{name}`` call; ``None`` with one partition or none
        learned."""
        with self._lock:
            count = self._count
        if count is None or count <= 1:
            return None
        query = parse_qs(urlsplit(path).query).get("partition")
        if query and query[0].isdigit() and int(query[0]) < count:
            return int(query[0])
        name = lease_in_path(path)
        return None if name is None else partition_of(name, count)

    def leader(self, partition: int) -> Optional[int]:
        """The node id leading ``partition``, if known."""
        with self._lock:
            if 0 <= partition < len(self._leaders):
                return self._leaders[partition]
            return None

    def leaders(self) -> List[Optional[int]]:
        """Every partition's leader, as known (for tests and logs)."""
        with self._lock:
            return list(self._leaders)

    def set_leader(self, partition: int, node: Optional[int]) -> None:
        """Node ``node`` leads ``partition`` (an answer said so); ``None``:
        its leader failed, unknown until learned again."""
        with self._lock:
            if 0 <= partition < len(self._leaders):
                self._leaders[partition] = node

    def learn(self, doc: Mapping[str, Any]) -> None:
        """Learns from one node's ``/v1/cluster`` answer: the count (one
        without ``partitions``), and each partition's leader when the node
        names one in a newer term than known (or none is known)."""
        entries = doc.get("partitions")
        if not isinstance(entries, list) or not entries:
            entries = []
            if "node_id" not in doc:
                return
        count = max(len(entries), 1)
        with self._lock:
            if self._count != count:
                self._count = count
                self._leaders = [None] * count
                self._terms = [0] * count
            for entry in entries:
                if not isinstance(entry, dict):
                    continue
                k, leader, term = _int(entry.get("id")), _int(entry.get("leader")), _int(entry.get("term"))
                if k is None or not 0 <= k < count or leader is None or leader <= 0:
                    continue
                term = term or 0
                if self._leaders[k] is None or term > self._terms[k]:
                    self._leaders[k], self._terms[k] = leader, max(term, self._terms[k])
