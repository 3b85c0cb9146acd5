"""The gateway as a store, against a scripted fake gateway: listing pages,
HEAD, conditional writes (412, and 409 whatever the condition), the
conditions refused before sending, and the lease document's newer fields."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import pytest

import palisade
from conftest import FakeServer, Reply, Route

MakeServer = Callable[[Route], FakeServer]


def grant_json(lease: str = "orders", token: int = 7) -> Any:
    return {
        "lease": lease,
        "holder": "A",
        "token": token,
        "ttl_ms": 30000,
        "jwt": "not.a.jwt",
        "kid": "k",
        "grant_index": token,
        "secret": "s" * 64,
    }


def gateway(objects: Callable[[str, str, Any], Reply]) -> Route:
    """Election and gateway in one: grants, fences, and ``objects`` for
    every ``/v1/objects`` call."""

    def route(method: str, path: str, body: Any) -> Reply:
        if path.startswith("/v1/leases/"):
            return 200, grant_json()
        if path.startswith("/v1/fences/"):
            return 200, {"lease": "orders", "fence": 7}
        return objects(method, path, body)

    return route


def client(server: FakeServer) -> palisade.Client:
    return palisade.Client([server.url], server.url, verify_jwt=False, renew_stream=False)


def header(server: FakeServer, i: int, name: str) -> Optional[str]:
    headers: Dict[str, str] = server.requests[i][3]
    found = [v for k, v in headers.items() if k.lower() == name]
    return found[0] if found else None


def object_calls(server: FakeServer) -> List[int]:
    return [i for i, r in enumerate(server.requests) if r[1].startswith("/v1/objects")]


def test_list_objects_sends_the_query_and_types_the_page(fake_server: MakeServer) -> None:
    page = {
        "objects": [
            {"key": "orders/a b", "version": 7, "token": 3, "size": 5},
            {"key": "orders/b", "version": 9, "token": 4, "size": 0},
        ],
        "next": "orders/b",
    }
    server = fake_server(gateway(lambda m, p, b: (200, page)))
    got = client(server).list_objects("orders/a b&c", after="orders/0", limit=2)
    assert got == palisade.ObjectPage(
        [palisade.ObjectInfo("orders/a b", 7, 3, 5), palisade.ObjectInfo("orders/b", 9, 4, 0)],
        "orders/b",
    )
    assert server.paths() == ["/v1/objects?limit=2&prefix=orders%2Fa%20b%26c&after=orders%2F0"]
    assert server.requests[0][0] == "GET"


def test_iter_objects_follows_next_to_the_end(fake_server: MakeServer) -> None:
    def objects(method: str, path: str, body: Any) -> Reply:
        if "after=" not in path:
            return 200, {"objects": [{"key": "k/1", "version": 1, "token": 1, "size": 1}], "next": "k/1"}
        if "after=k%2F1" in path:  # a page shortened by the policy, more to come
            return 200, {"objects": [], "next": "k/5"}
        return 200, {"objects": [{"key": "k/9", "version": 2, "token": 1, "size": 3}], "next": None}

    server = fake_server(gateway(objects))
    keys = [o.key for o in client(server).iter_objects("k/", limit=1)]
    assert keys == ["k/1", "k/9"]
    assert len(server.requests) == 3


def test_iter_objects_refuses_a_next_that_does_not_move(fake_server: MakeServer) -> None:
    server = fake_server(gateway(lambda m, p, b: (200, {"objects": [], "next": "k/1"})))
    with pytest.raises(palisade.ProtocolError):
        list(client(server).iter_objects("k/"))
    assert len(server.requests) == 2


@pytest.mark.parametrize("limit", [0, 1001, -1, True])
def test_a_bad_limit_is_refused_before_sending(fake_server: MakeServer, limit: Any) -> None:
    server = fake_server(gateway(lambda m, p, b: (200, {"objects": [], "next": None})))
    with pytest.raises(palisade.BadRequest):
        client(server).list_objects(limit=limit)
    assert server.requests == []


def test_listing_errors_are_typed(fake_server: MakeServer) -> None:
    replies = iter(
        [
            (400, {"error": "invalid_request", "message": "limit must be 1..=1000"}),
            (403, {"error": "forbidden", "message": "no"}),
            (200, {"objects": "nope", "next": None}),
        ]
    )
    server = fake_server(gateway(lambda m, p, b: next(replies)))
    c = client(server)
    with pytest.raises(palisade.BadRequest):
        c.list_objects()
    with pytest.raises(palisade.Forbidden):
        c.list_objects()
    with pytest.raises(palisade.ProtocolError):
        c.list_objects()


@pytest.mark.parametrize("etag", ['"7"', "7", 'W/"7"'])
def test_head_object(fake_server: MakeServer, etag: str) -> None:
    headers = {"etag": etag, "fencing-token": "3", "content-length": "5"}
    server = fake_server(gateway(lambda m, p, b: (200, ("headers", headers, ("raw", b"")))))
    assert client(server).head_object("orders/a b") == palisade.ObjectInfo("orders/a b", 7, 3, 5)
    assert server.requests[0][:2] == ("HEAD", "/v1/objects/orders/a%20b")


@pytest.mark.parametrize("etag", ['"7"', "7", 'W/"7"'])
def test_get_object_version_is_an_int(fake_server: MakeServer, etag: str) -> None:
    headers = {"etag": etag, "fencing-token": "3"}
    server = fake_server(gateway(lambda m, p, b: (200, ("headers", headers, ("raw", b"v")))))
    assert client(server).get_object("orders/a") == palisade.Object(b"v", 7, 3)


def test_get_object_without_an_etag_is_a_protocol_error(fake_server: MakeServer) -> None:
    headers = {"etag": "abc", "fencing-token": "3"}
    server = fake_server(gateway(lambda m, p, b: (200, ("headers", headers, ("raw", b"v")))))
    with pytest.raises(palisade.ProtocolError):
        client(server).get_object("orders/a")


def test_written_and_deleted_still_read_as_dicts_with_a_warning(fake_server: MakeServer) -> None:
    written = {"key": "orders/a", "version": 8, "token": 7}
    deleted = {"key": "orders/a", "deleted": True, "token": 7}
    server = fake_server(gateway(lambda m, p, b: (200, written if m == "PUT" else deleted)))
    with client(server).acquire("orders", "A", ttl=30.0) as lease:
        put, gone = lease.put("orders/a", b"x"), lease.delete("orders/a")
    with pytest.warns(DeprecationWarning, match=r"Written\['version'\] is deprecated: use \.version"):
        assert put["version"] == 8
    with pytest.warns(DeprecationWarning):
        assert (put["key"], put.get("token"), put.get("size", 0)) == ("orders/a", 7, 0)
    with pytest.warns(DeprecationWarning):
        assert gone["deleted"] is True
    with pytest.warns(DeprecationWarning), pytest.raises(KeyError):
        gone["version"]
    assert "version" in put and "version" not in gone


def test_head_object_404_is_none_and_other_errors_raise(fake_server: MakeServer) -> None:
    replies = iter([(404, ("raw", b"")), (401, ("raw", b"")), (200, ("raw", b""))])
    server = fake_server(gateway(lambda m, p, b: next(replies)))
    c = client(server)
    assert c.head_object("orders/x") is None
    with pytest.raises(palisade.Unauthorized):
        c.head_object("orders/x")
    with pytest.raises(palisade.ProtocolError):  # 200 without ETag or Fencing-Token
        c.head_object("orders/x")


def test_conditional_puts_and_deletes_send_their_headers(fake_server: MakeServer) -> None:
    written = {"key": "orders/a", "version": 8, "token": 7}
    deleted = {"key": "orders/a", "deleted": False, "token": 7}
    server = fake_server(gateway(lambda m, p, b: (200, written if m == "PUT" else deleted)))
    with client(server).acquire("orders", "A", ttl=30.0) as lease:
        assert lease.put("orders/a", b"x", if_match=7) == palisade.Written("orders/a", 8, 7)
        lease.put("orders/a", b"x", if_match="*")
        lease.put("orders/a", b"x", if_none_match=True)
        lease.put("orders/a", b"x")
        lease.delete("orders/a", if_match=8)
        lease.delete("orders/a", if_match="*")
        assert lease.delete("orders/a") == palisade.Deleted("orders/a", False, 7)
    calls = object_calls(server)
    seen = [
        (server.requests[i][0], header(server, i, "if-match"), header(server, i, "if-none-match"))
        for i in calls
    ]
    assert seen == [
        ("PUT", "7", None),
        ("PUT", "*", None),
        ("PUT", None, "*"),
        ("PUT", None, None),
        ("DELETE", "8", None),
        ("DELETE", "*", None),
        ("DELETE", None, None),
    ]
    assert all(header(server, i, "authorization") == "Bearer not.a.jwt" for i in calls)


@pytest.mark.parametrize("current", [7, None])
def test_412_is_precondition_failed_and_the_lease_stays_held(
    fake_server: MakeServer, current: Optional[int]
) -> None:
    refusal = {
        "error": "precondition_failed",
        "message": "version 7, not 6",
        "key": "orders/a",
        "current_version": current,
    }
    headers = {"etag": "7"} if current is not None else {}
    server = fake_server(gateway(lambda m, p, b: (412, ("headers", headers, refusal))))
    with client(server).acquire("orders", "A", ttl=30.0) as lease:
        with pytest.raises(palisade.PreconditionFailed) as err:
            lease.put("orders/a", b"x", if_match=6)
        assert not isinstance(err.value, palisade.LeaseLost)
        assert (err.value.key, err.value.current_version) == ("orders/a", current)
        with pytest.raises(palisade.PreconditionFailed):
            lease.delete("orders/a", if_match="*")
        assert lease.is_held() and not lease.lost.is_set()


def test_a_stale_token_is_fenced_whatever_the_condition(fake_server: MakeServer) -> None:
    stale = {"error": "stale_token", "message": "stale", "token": 7, "fence": 9}
    server = fake_server(gateway(lambda m, p, b: (409, stale)))
    lease = client(server).acquire("orders", "A", ttl=30.0)
    with pytest.raises(palisade.Fenced) as err:
        lease.put("orders/a", b"x", if_none_match=True)
    assert err.value.fence == 9
    assert not lease.is_held() and lease.lost.is_set()


def test_invalid_precondition_is_bad_request(fake_server: MakeServer) -> None:
    invalid = {"error": "invalid_precondition", "message": "If-Match and If-None-Match"}
    server = fake_server(gateway(lambda m, p, b: (400, invalid)))
    with client(server).acquire("orders", "A", ttl=30.0) as lease:
        with pytest.raises(palisade.BadRequest):
            lease.put("orders/a", b"x", if_match=1)
        assert lease.is_held()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"if_match": 7, "if_none_match": True},
        {"if_match": "7"},
        {"if_match": "W/*"},
        {"if_match": -1},
        {"if_match": True},
        {"if_match": 1.0},
    ],
)
def test_bad_conditions_are_refused_before_sending(
    fake_server: MakeServer, kwargs: Dict[str, Any]
) -> None:
    server = fake_server(gateway(lambda m, p, b: (200, {"key": "orders/a", "version": 1, "token": 7})))
    with client(server).acquire("orders", "A", ttl=30.0) as lease:
        with pytest.raises(palisade.BadRequest):
            lease.put("orders/a", b"x", **kwargs)
        if "if_none_match" not in kwargs:
            with pytest.raises(palisade.BadRequest):
                lease.delete("orders/a", **kwargs)
    assert object_calls(server) == []


def test_the_lease_document_with_and_without_the_newer_fields(fake_server: MakeServer) -> None:
    base = {"lease": "orders", "holder": "A", "token": 7, "ttl_ms": 5000,
            "transitions": 1, "modify_index": 12}
    newer = {**base, "expires_in_ms": 4200, "revoked": True,
             "acquire_time": "2026-11-28T01:02:03.456Z", "renew_time": "2026-11-28T01:02:05Z"}
    replies = iter([(200, base), (200, newer)])
    server = fake_server(lambda m, p, b: next(replies))
    c = client(server)
    old = c.get("orders")
    assert (old.expires_in_ms, old.revoked, old.acquire_time, old.renew_time) == (None, False, None, None)
    new = c.get("orders")
    assert (new.expires_in_ms, new.revoked) == (4200, True)
    assert (new.acquire_time, new.renew_time) == ("2026-11-28T01:02:03.456Z", "2026-11-28T01:02:05Z")
