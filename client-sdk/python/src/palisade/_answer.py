"""An HTTP answer and the exception each error answer maps to: what the
election calls (``_transport.py``) and the gateway calls (``_gateway.py``)
share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

import httpx

from ._errors import (
    BadRequest,
    Fenced,
    Forbidden,
    Held,
    LeaseLost,
    LockDelay,
    NotFound,
    PalisadeError,
    PreconditionFailed,
    Preempted,
    ProtocolError,
    Unauthorized,
)
from ._model import JsonObject


@dataclass
class Answer:
    """One HTTP answer: its status and JSON body (``None`` when not JSON)."""

    status: int
    body: Any

    def message(self) -> str:
        """The error document's ``message``, or ``""``."""
        if isinstance(self.body, dict):
            message = self.body.get("message")
            if isinstance(message, str):
                return message
        return ""

    def error(self) -> PalisadeError:
        """Maps an error answer to an exception (the Rust SDK's mapping)."""
        return error_for(self.status, self.body)

    def ok_object(self) -> JsonObject:
        """The body if the status is 200 and the body a JSON object; the
        mapped error raised otherwise."""
        if self.status != 200:
            raise self.error()
        if not isinstance(self.body, dict):
            raise ProtocolError(200, "the answer is not a JSON object")
        return self.body


def _field_int(body: Mapping[str, Any], name: str) -> int:
    value = body.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _opt_field_int(body: Mapping[str, Any], name: str) -> Optional[int]:
    value = body.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def error_for(status: int, body: Any) -> PalisadeError:
    """The exception for an error answer ``status`` with JSON ``body``."""
    doc: Mapping[str, Any] = body if isinstance(body, dict) else {}
    code = doc.get("error")
    message = doc.get("message")
    text = message if isinstance(message, str) else ""
    if status == 409 and code == "held":
        holder = doc.get("holder")
        return Held(holder if isinstance(holder, str) else "", _field_int(doc, "token"))
    if status == 409 and code in ("lost", "max_hold"):
        return LeaseLost(text)
    if status == 409 and code == "preempted":
        return Preempted(text)
    if status == 409 and code == "lock_delay":
        return LockDelay(text, _field_int(doc, "retry_after_ms") / 1000.0)
    if status == 409 and code == "stale_token":
        return Fenced(_field_int(doc, "token"), _field_int(doc, "fence"))
    if status == 412:
        key = doc.get("key")
        key = key if isinstance(key, str) else ""
        return PreconditionFailed(key, _opt_field_int(doc, "current_version"), text)
    if status == 404:
        return NotFound(text)
    if status == 401:
        return Unauthorized(text)
    if status == 403:
        return Forbidden(text)
    if status in (400, 413):
        return BadRequest(text)
    return ProtocolError(status, text or (str(code) if code else ""))


def json_of(response: httpx.Response) -> Any:
    """The answer's JSON, ``None`` when it is not JSON."""
    try:
        return response.json()
    except ValueError:
        return None
