"""How a crawl process's hub clients (the lease pool, the host gates) run their calls:
blocking hub calls in a thread of their own, answers and timers on the caller's thread.

The caller hands in the two things of its event loop these need: ``deliver(fn)``, which
calls ``fn`` on the loop's thread (``reactor.callFromThread``), and ``call_later(delay,
fn)`` (``reactor.callLater``). No Twisted here, so that tools and tests drive the same
clients with their own loop.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from time import monotonic
from typing import Any, TypeVar

from crawler.hub.leases import Timer

logger = logging.getLogger(__name__)
T = TypeVar("T")

_STOP = object()


class HubThread:
    """Runs hub calls one at a time, in order, in one thread; each result (or error)
    comes back through ``deliver``. A daemon thread: a forced stop never waits for a
    hub that does not answer."""

    def __init__(self, deliver: Callable[[Callable[[], None]], None], name: str = "hub") -> None:
        self.deliver = deliver
        self.name = name
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def run(
        self, fn: Callable[[], T], done: Callable[[T], None], failed: Callable[[Exception], None]
    ) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name=self.name, daemon=True)
            self._thread.start()
        self._calls.put((fn, done, failed))

    def stop(self) -> None:
        """No more calls: the thread ends once those queued have run."""
        if self._thread is not None:
            self._calls.put(_STOP)

    def _work(self) -> None:
        while (call := self._calls.get()) is not _STOP:
            fn, done, failed = call
            try:
                result = fn()
            except Exception as exc:  # noqa: BLE001 - handed to the caller's failed()
                self.deliver(_guarded(failed, exc))
            else:
                self.deliver(_guarded(done, result))


def _guarded(fn: Callable[[Any], None], value: Any) -> Callable[[], None]:
    def call() -> None:
        try:
            fn(value)
        except Exception:
            logger.exception("Hub bookkeeping failed")

    return call


class LoopClock:
    """Monotonic time, and the caller's loop's timers."""

    def __init__(self, call_later: Callable[[float, Callable[[], Any]], Timer]) -> None:
        self.call_later = call_later

    @staticmethod
    def now() -> float:
        return monotonic()
