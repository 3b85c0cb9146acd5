"""What the cluster and the gateway answer, as this package hands it out."""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Mapping, Optional, Tuple
from urllib.parse import quote

from ._errors import BadRequest, ProtocolError

_LEASE_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")


def check_lease_name(name: str) -> None:
    """Raises :class:`BadRequest` unless ``name`` is a valid lease name
    (``[A-Za-z0-9._-]{1,128}``, not ``.`` or ``..``)."""
    if not _LEASE_NAME.fullmatch(name) or name in (".", ".."):
        raise BadRequest(f"invalid lease name {name!r}: [A-Za-z0-9._-]{{1,128}}, not . or ..")


def _int(body: Mapping[str, Any], name: str, default: Optional[int] = None) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(200, f"field {name!r} is not an integer: {value!r}")
    return int(value)


def _str(body: Mapping[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str):
        raise ProtocolError(200, f"field {name!r} is not a string: {value!r}")
    return value


def _opt_int(body: Mapping[str, Any], name: str) -> Optional[int]:
    value = body.get(name)
    if value is None:
        return None
    return _int(body, name)


def _opt_str(body: Mapping[str, Any], name: str) -> Optional[str]:
    value = body.get(name)
    if value is None:
        return None
    return _str(body, name)


@dataclass(frozen=True)
class GrantId:
    """Names one grant, with the secret that opens it: what
    :meth:`palisade.Client.renew_grant` and :meth:`palisade.Client.release_grant`
    need. Whoever has it can renew and release the grant; keep it like a
    password (``repr`` does not show the secret)."""

    #: The lease name.
    lease: str
    #: The holder.
    holder: str
    #: The fencing token.
    token: int
    #: Which acquire the handle came from (a release naming an older one
    #: frees nothing); ``None`` from clusters that predate it.
    grant_index: Optional[int] = None
    #: The grant's secret.
    secret: Optional[str] = field(default=None, repr=False)


@dataclass(frozen=True)
class Grant:
    """A grant as the cluster answers an acquire or a renewal."""

    #: The lease name.
    lease: str
    #: The holder.
    holder: str
    #: The fencing token.
    token: int
    #: The granted ttl, in milliseconds (a renewal answers the grant's ttl,
    #: which a repeated acquire may have lengthened).
    ttl_ms: int
    #: The signed lease token for the gateway.
    jwt: str = field(repr=False)
    #: The id of the key that signed ``jwt``.
    kid: Optional[str] = None
    #: Which acquire this grant came from.
    grant_index: Optional[int] = None
    #: The secret: only an acquire answers it.
    secret: Optional[str] = field(default=None, repr=False)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "Grant":
        """Parses a Grant document."""
        return cls(
            lease=_str(body, "lease"),
            holder=_str(body, "holder"),
            token=_int(body, "token"),
            ttl_ms=_int(body, "ttl_ms"),
            jwt=_str(body, "jwt"),
            kid=_opt_str(body, "kid"),
            grant_index=_opt_int(body, "grant_index"),
            secret=_opt_str(body, "secret"),
        )

    def id(self) -> GrantId:
        """What names this grant in renew and release."""
        return GrantId(self.lease, self.holder, self.token, self.grant_index, self.secret)


@dataclass(frozen=True)
class LeaseInfo:
    """A lease as the cluster reports it (``GET /v1/leases/{name}``)."""

    #: The lease name.
    lease: str
    #: The holder, ``None`` when free.
    holder: Optional[str]
    #: The token of the latest grant.
    token: int
    #: The ttl of the latest grant, in milliseconds.
    ttl_ms: int
    #: How many times the holder changed.
    transitions: int
    #: Log index of the last change (for :meth:`palisade.Client.watch`).
    modify_index: int
    #: Time left, in the leader's view (``None`` when not answered).
    expires_in_ms: Optional[int] = None
    #: Whether the grant was revoked.
    revoked: bool = False
    #: When the current holder acquired it (RFC 3339), when the cluster
    #: says (``None`` from clusters that do not send it yet).
    acquire_time: Optional[str] = None
    #: When the current grant was last renewed (RFC 3339), when the cluster
    #: says.
    renew_time: Optional[str] = None
    #: The partition the lease belongs to, on a cluster of several
    #: (``palisade dev --partitions N``); ``None`` with one partition.
    partition: Optional[int] = None

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "LeaseInfo":
        """Parses a Lease document."""
        return cls(
            lease=_str(body, "lease"),
            holder=_opt_str(body, "holder"),
            token=_int(body, "token", 0),
            ttl_ms=_int(body, "ttl_ms", 0),
            transitions=_int(body, "transitions", 0),
            modify_index=_int(body, "modify_index", 0),
            expires_in_ms=_opt_int(body, "expires_in_ms"),
            revoked=bool(body.get("revoked", False)),
            acquire_time=_opt_str(body, "acquire_time"),
            renew_time=_opt_str(body, "renew_time"),
            partition=_opt_int(body, "partition"),
        )


@dataclass(frozen=True)
class Transition:
    """One transition of a lease (:meth:`palisade.Client.history`)."""

    #: The log index of the entry that made it.
    index: int
    #: ``acquire``, ``claim``, ``handover``, ``release``, ``expire``,
    #: ``preempt`` or ``revoke``.
    cause: str
    #: The grant it is about: the new one (acquire, claim, handover) or the
    #: one that ended or was revoked.
    holder: Optional[str]
    #: That grant's token.
    token: int
    #: When it was proposed, on the proposer's clock (ms since the epoch).
    at_ms: Optional[int] = None

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "Transition":
        """Parses one entry of a history document."""
        return cls(
            index=_int(body, "index", 0),
            cause=_str(body, "cause"),
            holder=_opt_str(body, "holder"),
            token=_int(body, "token", 0),
            at_ms=_opt_int(body, "at_ms"),
        )


@dataclass(frozen=True)
class Object:
    """A stored object read through the gateway."""

    #: The bytes.
    value: bytes
    #: The version (the ``ETag``, parsed: what ``if_match`` takes).
    version: int
    #: The token of the write that stored it.
    token: int


class _ReadAsDict:
    """Until the next release, a write's answer may still be read as the
    dict it was (``answer["version"]``, ``answer.get("token")``,
    ``"key" in answer``), with a :class:`DeprecationWarning`: read the
    attribute instead."""

    _FIELDS: ClassVar[Tuple[str, ...]] = ()

    def _legacy(self, name: str) -> None:
        warnings.warn(
            f"{type(self).__name__}[{name!r}] is deprecated: use .{name} "
            "(lease.put/delete answer a dataclass, not a dict)",
            DeprecationWarning,
            stacklevel=3,
        )

    def __getitem__(self, name: str) -> Any:
        self._legacy(name)
        if name not in self._FIELDS:
            raise KeyError(name)
        return getattr(self, name)

    def get(self, name: str, default: Any = None) -> Any:
        """``dict.get``, deprecated: read the attribute."""
        self._legacy(name)
        return getattr(self, name) if name in self._FIELDS else default

    def __contains__(self, name: object) -> bool:
        return name in self._FIELDS


@dataclass(frozen=True)
class Written(_ReadAsDict):
    """What an accepted write (:meth:`palisade.Lease.put`) answers."""

    _FIELDS: ClassVar[Tuple[str, ...]] = ("key", "version", "token")

    #: The key written.
    key: str
    #: The object's new version (its ``ETag``; what ``if_match`` takes).
    version: int
    #: The fencing token the write carried.
    token: int

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "Written":
        """Parses a ``PUT``'s answer."""
        return cls(key=_str(body, "key"), version=_int(body, "version"), token=_int(body, "token"))


@dataclass(frozen=True)
class Deleted(_ReadAsDict):
    """What an accepted delete (:meth:`palisade.Lease.delete`) answers."""

    _FIELDS: ClassVar[Tuple[str, ...]] = ("key", "deleted", "token")

    #: The key deleted.
    key: str
    #: Whether there was an object (the fence is raised either way).
    deleted: bool
    #: The fencing token the delete carried.
    token: int

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "Deleted":
        """Parses a ``DELETE``'s answer."""
        deleted = body.get("deleted")
        if not isinstance(deleted, bool):
            raise ProtocolError(200, f"field 'deleted' is not a boolean: {deleted!r}")
        return cls(key=_str(body, "key"), deleted=deleted, token=_int(body, "token"))


@dataclass(frozen=True)
class ObjectInfo:
    """What the gateway says of a stored object without its bytes: an entry
    of :meth:`palisade.Client.list_objects`, or
    :meth:`palisade.Client.head_object`."""

    #: The object key.
    key: str
    #: Its version (what ``If-Match`` names; the ``ETag``).
    version: int
    #: The fencing token of the write that stored it.
    token: int
    #: Its length in bytes.
    size: int

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "ObjectInfo":
        """Parses one entry of a listing."""
        return cls(
            key=_str(body, "key"),
            version=_int(body, "version"),
            token=_int(body, "token"),
            size=_int(body, "size"),
        )


@dataclass(frozen=True)
class ObjectPage:
    """One page of :meth:`palisade.Client.list_objects`."""

    #: The objects, in byte order of their keys. Under a policy, objects of
    #: leases the caller may not read are left out, so a page may hold fewer
    #: than ``limit`` while :attr:`next` is set.
    objects: List[ObjectInfo]
    #: Pass as ``after`` for the next page; ``None`` when no more keys follow.
    next: Optional[str]

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "ObjectPage":
        """Parses a listing answer."""
        entries = body.get("objects")
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise ProtocolError(200, "a listing without its objects")
        return cls([ObjectInfo.from_json(e) for e in entries], _opt_str(body, "next"))


#: A JSON object as parsed from an answer.
JsonObject = Dict[str, Any]


def encode_key(key: str) -> str:
    """Percent-encodes each segment of an object key, keeping the ``/``
    between them (as the Rust SDK does)."""
    return "/".join(quote(segment, safe="-._~") for segment in key.split("/"))
