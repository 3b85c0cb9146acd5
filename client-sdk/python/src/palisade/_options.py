"""What an acquire may ask for beyond holder and ttl, and the grant secret
it carries."""

from __future__ import annotations

import dataclasses
import secrets
from typing import Any, Dict, Optional

from ._errors import BadRequest


@dataclasses.dataclass(frozen=True)
class AcquireOptions:
    """What an acquire may ask for beyond holder and ttl (README:
    leadership semantics)."""

    #: 0..=1000. A waiting acquire of a higher priority than a preemptible
    #: holder's preempts it (the holder's next renewal is refused with
    #: :class:`Preempted`); waiters queue by priority. Equal priority never
    #: preempts.
    priority: int = 0
    #: A waiting acquire of a higher priority may preempt this grant.
    preemptible: bool = False
    #: Seconds the lease stays unavailable after this grant *expires* (not
    #: after a release), so a crashed holder's writes in flight drain first.
    lock_delay: float = 0.0
    #: Renew this grant for at most this many seconds (``None``: no cap).
    max_hold: Optional[float] = None

    def body(self) -> Dict[str, Any]:
        """The acquire body's fields for these options (none for defaults).
        Raises :class:`BadRequest` for a value out of range."""
        if (
            not isinstance(self.priority, int)
            or isinstance(self.priority, bool)
            or not 0 <= self.priority <= 1000
        ):
            raise BadRequest(f"the priority must be an integer in 0..=1000, not {self.priority!r}")
        if not 0 <= self.lock_delay <= 60.0:
            raise BadRequest(f"lock_delay must be 0..=60 seconds, not {self.lock_delay!r}")
        if self.max_hold is not None and not 0.001 <= self.max_hold <= 86_400.0:
            raise BadRequest(f"max_hold must be None or 0.001..=86400 seconds, not {self.max_hold!r}")
        fields: Dict[str, Any] = {}
        if self.priority:
            fields["priority"] = self.priority
        if self.preemptible:
            fields["preemptible"] = True
        if self.lock_delay:
            fields["lock_delay_ms"] = int(round(self.lock_delay * 1000))
        if self.max_hold is not None:
            fields["max_hold_ms"] = int(round(self.max_hold * 1000))
        return fields


def new_secret() -> str:
    """A fresh grant secret: 256 bits from the OS RNG, as 64 hex digits."""
    return secrets.token_hex(32)
