"""The gateway as a store against a real ``palisade dev``: conditional
writes (412 changing nothing, the lease still held; a stale token 409
whatever the condition), HEAD, listing pages, the lease's newer fields."""

from __future__ import annotations

from typing import Any, Dict, List

import httpx
import pytest

import palisade
from conftest import DevCluster


def test_conditional_writes_head_and_listing(cluster: DevCluster, name: str) -> None:
    client = cluster.client()
    key = f"{name}/a"
    with client.lease(name, "A", ttl=10.0, wait=10.0) as lease:
        first = lease.put(key, b"one", if_none_match=True)
        with pytest.raises(palisade.PreconditionFailed) as err:
            lease.put(key, b"two", if_none_match=True)
        assert (err.value.key, err.value.current_version) == (key, first.version)
        second = lease.put(key, b"three", if_match=first.version)
        assert second.version > first.version
        with pytest.raises(palisade.PreconditionFailed):
            lease.put(key, b"four", if_match=first.version)
        with pytest.raises(palisade.PreconditionFailed) as err:
            lease.put(f"{name}/none", b"x", if_match="*")
        assert err.value.current_version is None
        assert lease.is_held()

        head = client.head_object(key)
        assert head == palisade.ObjectInfo(key, second.version, lease.token, 5)
        got = client.get_object(key)
        assert got == palisade.Object(b"three", second.version, lease.token)
        assert client.head_object(f"{name}/none") is None

        for k in ("c", "b", "d"):
            lease.put(f"{name}/{k}", k.encode())
        pages: List[palisade.ObjectPage] = []
        after = None
        while True:
            page = client.list_objects(f"{name}/", after=after, limit=2)
            pages.append(page)
            assert len(page.objects) <= 2 and len(pages) <= 4
            if page.next is None:
                break
            after = page.next
        keys = [o.key for p in pages for o in p.objects]
        assert keys == [f"{name}/{k}" for k in "abcd"]
        assert [o.key for o in client.iter_objects(f"{name}/", limit=3)] == keys
        with pytest.raises(palisade.BadRequest):
            client.list_objects(limit=1001)

        with pytest.raises(palisade.PreconditionFailed):
            lease.delete(key, if_match=first.version)
        assert lease.delete(key, if_match=second.version) == palisade.Deleted(key, True, lease.token)
        with pytest.raises(palisade.PreconditionFailed) as err:
            lease.delete(key, if_match="*")
        assert err.value.current_version is None

        info = client.get(name)
        assert info.expires_in_ms is not None and not info.revoked


@pytest.mark.parametrize(
    "condition", [{"if-match": "*"}, {"if-none-match": "*"}, {"if-match": '"1"'}]
)
def test_a_stale_token_is_refused_whatever_the_condition(
    cluster: DevCluster, name: str, condition: Dict[str, str]
) -> None:
    client = cluster.client()
    key = f"{name}/state"
    a = client.acquire(name, "A", ttl=10.0, wait=10.0)
    a.put(key, b"from A")
    old_jwt = a.jwt
    assert old_jwt is not None
    a.handover_to("B")
    with client.lease(name, "B", ttl=10.0, wait=10.0):
        headers: Dict[str, Any] = {
            "authorization": f"Bearer {old_jwt}",
            "x-palisade-key": cluster.api_key,
            **condition,
        }
        late = httpx.put(f"{cluster.gateway}/v1/objects/{key}", content=b"late", headers=headers)
        assert late.status_code == 409 and late.json()["error"] == "stale_token", late.text
        got = client.get_object(key)
        assert got is not None and got.value == b"from A"
