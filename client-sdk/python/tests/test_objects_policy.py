"""Listing under a policy, against a real ``palisade dev`` whose policy has a
second principal, ``reader``, that may read only the leases ``plist-a``
and ``plist-c``: listing a prefix that spans ``plist-b`` too shows only its
own objects, pages may be short (or empty) while ``next`` is set, and
``next`` still walks the whole prefix."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

import palisade
from conftest import BIN, DevCluster

KEYS = ["plist-a/1", "plist-a/2", "plist-b/1", "plist-b/2", "plist-b/3", "plist-c/1"]
MINE = ["plist-a/1", "plist-a/2", "plist-c/1"]


def policy_with_a_reader(data: Path) -> None:
    for args in (
        ["policy", "init", "--dir", str(data)],
        ["policy", "add", "--dir", str(data), "reader", "--read", "plist-a,plist-c"],
    ):
        subprocess.run([BIN, *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def policy_cluster() -> Iterator[DevCluster]:
    dev = DevCluster(prepare=policy_with_a_reader)
    try:
        admin = dev.client()
        for lease_name in ("plist-a", "plist-b", "plist-c"):
            with admin.lease(lease_name, "writer", ttl=10.0, wait=10.0) as lease:
                for key in KEYS:
                    if key.startswith(lease_name + "/"):
                        lease.put(key, key.encode())
        admin.close()
        yield dev
    finally:
        dev.remove()


def reader(dev: DevCluster) -> palisade.Client:
    return palisade.Client(dev.election, dev.gateway, api_key_file=str(dev.data / "reader.key"))


def pages(client: palisade.Client, prefix: str, limit: int) -> List[palisade.ObjectPage]:
    found: List[palisade.ObjectPage] = []
    after: Optional[str] = None
    while True:
        page = client.list_objects(prefix, after=after, limit=limit)
        found.append(page)
        assert len(found) <= len(KEYS) + 1, "next does not end"
        if page.next is None:
            return found
        after = page.next


def test_a_reader_lists_only_its_leases_and_next_walks_the_whole_prefix(
    policy_cluster: DevCluster,
) -> None:
    with reader(policy_cluster) as client:
        walked = pages(client, "plist-", limit=2)
        assert [o.key for p in walked for o in p.objects] == MINE
        # The scan is confined to what the reader may read: no page's
        # next names a key of plist-b, the lease it may not read.
        assert all(p.next is None or not p.next.startswith("plist-b/") for p in walked)
        assert [o.key for o in client.iter_objects("plist-", limit=2)] == MINE
        assert all(o.version > 0 and o.size == len(o.key) for o in client.iter_objects("plist-"))
        # A prefix inside a lease it may not read: nothing, not an error.
        assert [o.key for o in client.iter_objects("plist-b/")] == []
        with pytest.raises(palisade.Forbidden):
            client.head_object("plist-b/1")
        info = client.head_object("plist-a/1")
        assert info is not None and info.key == "plist-a/1"

    admin = policy_cluster.client()
    try:
        every = pages(admin, "plist-", limit=2)
        assert [o.key for p in every for o in p.objects] == KEYS
        # The reader's walk scans only its own keys: fewer pages.
        assert len(walked) < len(every)
    finally:
        admin.close()
