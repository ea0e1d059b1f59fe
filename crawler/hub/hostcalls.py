"""One process's calls to the hub's host budgets, made as few and in the order they
were meant: :class:`HostCalls`.

Asks for slots of many keys and the releases gathered meanwhile go in one call (one
round trip where a release and a take took two) once they have gathered for
``batch_seconds`` (or ``batch_max`` keys ask); other calls (a back-off, renewals,
leaving) go in order with them, so that the hub sees a back-off before the release of
the slot that met it. One call at a time, in the runner's thread; answers come back on
the caller's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from crawler.hub.hostbudget import HostAnswer, HostAsk, HostBudgetStore
from crawler.hub.leases import Clock, Runner, Timer


class Asker(Protocol):
    """What the calls ask of the gates: an ask made when the call goes (so that the
    requests that came meanwhile count), and what to do with the answers."""

    def wanted(self, key: str) -> HostAsk | None: ...

    def answered(self, answers: list[HostAnswer], sent: float) -> None: ...

    def not_answered(self, asks: list[HostAsk]) -> None: ...

    def failed(self, error: Exception, doing: str) -> None: ...


class HostCalls:
    def __init__(
        self,
        store: HostBudgetStore,
        holder: str,
        ttl: float,
        clock: Clock,
        runner: Runner,
        asker: Asker,
        batch_seconds: float = 0.1,
        batch_max: int = 16,
    ) -> None:
        self.store = store
        self.holder = holder
        self.ttl = ttl
        self.clock = clock
        self.runner = runner
        self.asker = asker
        self.batch_seconds = batch_seconds
        self.batch_max = batch_max
        self.made = 0  # calls made, for the stats
        self.closed = False
        self._asks: dict[str, None] = {}  # the keys whose asks gather
        self._releases: list[tuple[int, float | None]] = []
        self._busy = False  # a call is out
        self._gathering: float | None = None  # since when asks or releases wait
        self._timer: Timer | None = None
        self._queue: deque[Callable[[], None]] = deque()

    def ask(self, key: str) -> None:
        """*key* wants slots: asked in the next exchange."""
        self._asks[key] = None
        self.flush()

    def release(self, items: list[tuple[int, float | None]]) -> None:
        """Slots given back ``(id, seconds since its last request)``, in the next call."""
        if items:
            self._releases.extend(items)
            self.flush()

    def call(self, fn: Callable[[], Any], done: Callable[[Any], None], doing: str) -> None:
        """A call that goes in order with the asks and releases."""
        self._queue.append(lambda: self._send(fn, done, doing))
        self.flush()

    def close(self, leave: bool, done: Callable[[], None]) -> None:
        """No more asks; what was given back goes, then (*leave*) this holder leaves
        every key's line; *done* once the hub was told (or failed to be)."""
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self.closed = True
        self._asks.clear()
        releases, self._releases = self._releases, []
        if releases:
            self.call(lambda: self.store.release(releases), lambda _: None, "releasing slots")
        if leave:
            self.call(lambda: self.store.leave(self.holder), lambda _: None, "leaving")
        self._queue.append(done)
        self.flush()

    def flush(self) -> None:
        """Send what has gathered, one call at a time: calls made in order at once,
        asks and releases once they gathered for ``batch_seconds`` (or ``batch_max``
        asks wait)."""
        while not self._busy and (self._queue or self._due()):
            self._flush_one()
        if self._busy or not (self._releases or self._asks) or self._gathering is None:
            return
        if self._timer is None or not self._timer.active():
            wait = self._gathering + self.batch_seconds - self.clock.now()
            self._timer = self.clock.call_later(max(wait, 0.0), self.flush)

    def _due(self) -> bool:
        if not (self._releases or self._asks):
            return False
        now = self.clock.now()
        if self._gathering is None:
            self._gathering = now
        return (
            self.closed
            or len(self._asks) >= self.batch_max
            or now >= self._gathering + self.batch_seconds
        )

    def _flush_one(self) -> None:
        # Calls made in order first, then releases and asks in one call, the releases
        # first (a slot given back before this process asks again).
        if self._queue:
            self._queue.popleft()()
            return
        releases, self._releases = self._releases, []
        keys, self._asks = list(self._asks), {}
        asks = [] if self.closed else [a for k in keys if (a := self.asker.wanted(k))]
        self._gathering = None
        if not asks:
            if releases:
                self._send(lambda: self.store.release(releases), lambda _: None, "releasing slots")
            return
        sent = self.clock.now()
        self._send(
            lambda: self.store.exchange(releases, asks, self.holder, self.ttl),
            lambda answers: self.asker.answered(answers, sent),
            "taking host slots",
            lambda: self.asker.not_answered(asks),
        )

    def _send(
        self,
        fn: Callable[[], Any],
        done: Callable[[Any], None],
        doing: str,
        failed: Callable[[], None] | None = None,
    ) -> None:
        self._busy = True
        self.made += 1

        def ok(result: Any) -> None:
            self._busy = False
            done(result)
            self.flush()

        def bad(error: Exception) -> None:
            self._busy = False
            self.asker.failed(error, doing)
            if failed is not None:
                failed()
            self.flush()

        self.runner.run(fn, ok, bad)
