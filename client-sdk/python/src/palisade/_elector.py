"""The :class:`Elector`: run work only while holding a lease (leader election
for services with replicas, with fencing)."""

from __future__ import annotations

import logging
import threading
from typing import Callable, Optional

from ._client import Client
from ._errors import Held, NotFound, PalisadeError
from ._lease import Lease

log = logging.getLogger("palisade")

#: The work an :class:`Elector` runs while leading: it gets the lease and an
#: event set when it must stop (leadership lost or shutting down).
Task = Callable[[Lease, threading.Event], None]


class Elector:
    """Campaigns for a lease, reports when this process starts and stops
    leading, runs an optional task while leading (told to stop the moment
    leadership is lost), and campaigns again.

    >>> elector = Elector(client, "scheduler", "replica-1", ttl=3.0,
    ...                   on_started=lambda lease: print("leading", lease.token),
    ...                   on_stopped=lambda reason: print("stopped:", reason))  # doctest: +SKIP
    >>> elector.start()  # doctest: +SKIP
    >>> elector.stop()  # doctest: +SKIP
    """

    def __init__(
        self,
        client: Client,
        lease: str,
        holder: str,
        ttl: float = 5.0,
        *,
        on_started: Optional[Callable[[Lease], None]] = None,
        on_stopped: Optional[Callable[[str], None]] = None,
        on_leader_changed: Optional[Callable[[Optional[str]], None]] = None,
        campaign_wait: float = 1.0,
    ) -> None:
        """An elector for ``lease`` as ``holder`` with ``ttl`` seconds.

        ``on_started(lease)`` is called when this process starts leading (the
        fence is raised already), ``on_stopped(reason)`` when it stops
        (``"lease lost"``, ``"shutting down"`` or ``"task finished"``), before
        the lease is released; ``on_leader_changed(holder)`` on every change
        of holder seen through the watch API (``None`` when free). Callbacks
        run on the elector's threads; their exceptions are logged. Each
        acquire waits ``campaign_wait`` seconds, which bounds how long
        :meth:`stop` takes while campaigning."""
        self._client = client
        self._lease = lease
        self._holder = holder
        self._ttl = ttl
        self._on_started = on_started
        self._on_stopped = on_stopped
        self._on_leader_changed = on_leader_changed
        self._campaign_wait = campaign_wait
        self._current: Optional[Lease] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @property
    def lease(self) -> Optional[Lease]:
        """The lease while leading, else ``None``."""
        current = self._current
        return current if current is not None and current.is_held() else None

    def is_leader(self) -> bool:
        """Whether this process leads now (holds the lease)."""
        return self.lease is not None

    def start(self, task: Optional[Task] = None) -> None:
        """Runs :meth:`run` in a daemon thread until :meth:`stop`."""
        if self._thread is not None:
            raise RuntimeError("the elector is already started")
        self._stop.clear()
        self._thread = threading.Thread(
            target=self.run, args=(self._stop, task), name="palisade-elector", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: Optional[float] = None) -> None:
        """Stops the thread :meth:`start` started: stops leading (releasing
        the lease) and campaigning; waits up to ``timeout`` seconds."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _call(self, name: str, callback: Optional[Callable[..., None]], *args: object) -> None:
        if callback is None:
            return
        try:
            callback(*args)
        except Exception:
            log.exception("elector callback %s failed", name)

    def run(self, stop: threading.Event, task: Optional[Task] = None) -> None:
        """Runs until ``stop`` is set: campaign, lead (running ``task`` in
        its own thread with an event set on loss), repeat."""
        watcher: Optional[threading.Thread] = None
        if self._on_leader_changed is not None:
            watcher = threading.Thread(
                target=self._watch, args=(stop,), name="palisade-elector-watch", daemon=True
            )
            watcher.start()
        while not stop.is_set():
            try:
                lease = self._client.acquire(
                    self._lease, self._holder, self._ttl, wait=self._campaign_wait
                )
            except Held:
                continue
            except PalisadeError as err:
                log.debug("campaign for %s failed; retrying: %s", self._lease, err)
                stop.wait(0.2)
                continue
            self._current = lease
            self._call("on_started", self._on_started, lease)
            cancelled = threading.Event()
            done = threading.Event()
            runner: Optional[threading.Thread] = None
            if task is not None:
                job: Task = task

                def run_task(
                    lease: Lease = lease,
                    job: Task = job,
                    cancelled: threading.Event = cancelled,
                    done: threading.Event = done,
                ) -> None:
                    try:
                        job(lease, cancelled)
                    except Exception:
                        log.exception("elector task failed")
                    finally:
                        done.set()

                runner = threading.Thread(target=run_task, name="palisade-elector-task", daemon=True)
                runner.start()
            while True:
                if not lease.is_held():
                    reason = "lease lost"
                    break
                if stop.is_set():
                    reason = "shutting down"
                    break
                if done.is_set():
                    reason = "task finished"
                    break
                lease.lost.wait(0.05)
            cancelled.set()
            if runner is not None:
                runner.join()
            self._call("on_stopped", self._on_stopped, reason)
            self._current = None
            try:
                lease.release()
            except PalisadeError as err:
                log.debug("release of %s failed: %s", self._lease, err)
        if watcher is not None:
            watcher.join(self._client.config.request_timeout + 6.0)

    def _watch(self, stop: threading.Event) -> None:
        """Reports every change of holder, through the watch API."""
        index = 0
        last: Optional[Optional[str]] = None
        seen = False
        while not stop.is_set():
            try:
                info = self._client.watch(self._lease, index, wait=5.0)
            except NotFound:
                if not seen or last is not None:
                    seen, last = True, None
                    self._call("on_leader_changed", self._on_leader_changed, None)
                stop.wait(0.2)
                continue
            except PalisadeError:
                stop.wait(0.2)
                continue
            index = info.modify_index
            if not seen or last != info.holder:
                seen, last = True, info.holder
                self._call("on_leader_changed", self._on_leader_changed, info.holder)
