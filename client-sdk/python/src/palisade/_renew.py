"""A lease's renew thread: renewals every ``ttl * renew_ratio``, and what
happens when one is refused or the safe deadline passes."""

from __future__ import annotations

import logging
import time

from ._errors import LeaseLost, PalisadeError, Preempted, Unavailable
from ._shared import _DEADLINE_PASSED, _Shared, margin_for

log = logging.getLogger("palisade")


def _lapse(shared: _Shared) -> None:
    """The safe deadline passed unrenewed: lost here, and the grant given back
    (not with a lock-delay), retried while unavailable for 3 ttls (5..60 s).
    Every new leader re-arms a live grant at takeover, so while leadership
    moves faster than the ttl an abandoned grant never expires. The release
    names token, secret and grant index: it frees nothing else."""
    shared.mark_lost(_DEADLINE_PASSED)
    until = time.monotonic() + min(max(shared.ttl * 3, 5.0), 60.0)
    pause = 0.1
    while not shared.lock_delayed:
        try:
            shared.transport.release_grant(shared.id)
            return
        except Unavailable:
            if time.monotonic() + pause > until:
                return
        except PalisadeError:
            return
        time.sleep(pause)
        pause = min(pause * 2, 1.0)


def _lapse_if_deadline(shared: _Shared) -> None:
    """Stopped because the holder saw the deadline pass first (``held_jwt``
    marked it): give the grant back all the same."""
    with shared.lock:
        lapsed = shared.lost_reason == _DEADLINE_PASSED
    if lapsed:
        _lapse(shared)


def _renew_loop(shared: _Shared) -> None:
    """Renews every ``ttl * renew_ratio`` (the ttl the leader answered);
    retries failures every 50 ms until the deadline; marks the lease lost on
    refusal or when the deadline passes."""
    config = shared.transport.config
    ratio = min(max(config.renew_ratio, 0.05), 0.9)
    every = shared.ttl * ratio
    next_at = time.monotonic() + every
    while True:
        with shared.lock:
            deadline = shared.deadline
        now = time.monotonic()
        if shared.stop.wait(max(0.0, min(next_at, deadline) - now)):
            _lapse_if_deadline(shared)
            return
        now = time.monotonic()
        if now >= deadline:
            _lapse(shared)
            return
        if now < next_at:
            continue
        sent = time.monotonic()
        try:
            # Retries end at the deadline, and each attempt's timeout is cut
            # to it: a renewal stuck on a frozen node cannot hide the loss.
            grant = shared.transport.renew_grant(shared.id, until=deadline)
        except Preempted as err:
            # Let go at once: the preemptor waits for this release, not for
            # the grant's deadline (and the cluster keeps the lease for the
            # preemptor, so a new acquire by this holder waits behind it).
            # Marked lost (no more writes) before the release, and on_lost
            # called after it, so a slow callback does not hold the
            # preemptor up.
            with shared.lock:
                shared.preempted = True
            reason = f"preempted: {err.reason}"
            first = shared.mark_lost(reason, quiet=True)
            try:
                shared.transport.release_grant(shared.id)
            except PalisadeError as release_err:
                log.debug("release of preempted %s failed: %s", shared.id.lease, release_err)
            if first:
                shared.notify_lost(reason)
            return
        except LeaseLost as err:
            shared.mark_lost(f"renewal refused: {err.reason}")
            return
        except PalisadeError as err:
            if time.monotonic() >= deadline:
                _lapse(shared)
                return
            log.debug("renewal of %s failed; retrying: %s", shared.id.lease, err)
            next_at = time.monotonic() + 0.05
            continue
        except Exception:  # never die silently while the lease looks held
            log.exception("renew thread of lease %s failed", shared.id.lease)
            shared.mark_lost("the renew thread failed")
            return
        ttl = grant.ttl_ms / 1000.0
        margin = margin_for(config.drift_margin_ratio, ttl)
        with shared.lock:
            stopped = shared.lost_reason is not None
            passed = not stopped and time.monotonic() >= shared.deadline
            if not stopped and not passed:
                # The leader extended the grant by the ttl it answered: that,
                # from the send time, bounds the deadline; never move it back.
                shared.deadline = max(shared.deadline, sent + ttl - margin)
                shared.jwt = grant.jwt
        if stopped:
            _lapse_if_deadline(shared)
            return
        if passed:
            # Once the deadline has passed the lease stays lost, even if the
            # renewal made it in time at the leader.
            _lapse(shared)
            return
        every = ttl * ratio
        next_at = sent + every
