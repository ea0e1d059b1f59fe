"""A request for a key this run is still fetching or storing waits for its row:
:class:`RowWaits`.

A part of the storage extension (``extensions/storage/extension.py``). Such a request
would miss the catalog and fetch the URL a second time: a depth crawl meets a page
again higher up while its first fetch is in flight, or queued for the writer's next
commit. The archive writer reports each commit, and the waiters look again then;
a fetch that stores nothing wakes its waiters at once, to fetch it themselves.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet import defer

from crawler.storage.records import Row
from crawler.storage.runcounts import RunCounts
from crawler.storage.session import StorageSession
from crawler.storage.unsettled import UnsettledKeys

# A key's (row, parsed) from the catalog, asked off the reactor thread.
Lookup = Callable[[str], Awaitable[tuple[Row | None, bool]]]


class RowWaits:
    """Requests for a key this run is fetching or storing wait here for its row, woken
    when the writer commits (or the fetch fails)."""

    def __init__(self, session: StorageSession, counts: RunCounts, settle_seconds: float):
        self.session = session
        self.counts = counts
        # A commit comes at least every CATALOG_FLUSH_SECONDS: past this, give up.
        self.settle_seconds = settle_seconds
        self._unsettled = UnsettledKeys()
        self._waiting: dict[str, list[defer.Deferred]] = {}
        self._wake_call = None

    def fetching(self, key: str) -> None:
        """``key`` is being fetched: a request for it waits for its row."""
        self._unsettled.fetching(key)

    def stored(self, key: str) -> None:
        """``key``'s answer went to the writer: its row comes with a commit."""
        self._unsettled.stored(key)

    def failed(self, key: str) -> None:
        """``key``'s fetch stored nothing: its waiters fetch it themselves."""
        self._unsettled.failed(key)
        self.wake(key)

    def in_flight(self, key: str) -> bool:
        return key in self._unsettled

    async def wait_for_row(self, key: str, lookup: Lookup) -> tuple[Row | None, bool | None]:
        """What ``lookup`` finds of a key this run is fetching or storing (its row, and
        whether its page is parsed), asked again after each commit until the row is
        there; no row when its fetch stored nothing, or after a while."""
        from twisted.internet import reactor

        self.counts.inc("catalog/waits_for_writer")
        deadline = time.monotonic() + self.settle_seconds
        found: tuple[Row | None, bool | None] = (None, None)
        session = self.session
        while found[0] is None and key in self._unsettled and session.catalog is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            woken = defer.Deferred()
            self._waiting.setdefault(key, []).append(woken)
            woken.addTimeout(left, reactor)
            try:
                await maybe_deferred_to_future(woken)
            except defer.TimeoutError:
                break
            if session.catalog is not None:
                found = await lookup(key)
        return found

    def committed(self) -> None:
        """The writer committed a batch. Called while its replies are read, maybe in
        the middle of a send: the waiters run on their own turn of the reactor."""
        if self._waiting and self._wake_call is None:
            from twisted.internet import reactor

            self._wake_call = reactor.callLater(0, self.wake)

    def wake(self, key: str | None = None) -> None:
        """Wake the requests waiting for ``key`` (for every key: after a commit, and
        when the session closes: they find no catalog and are fetched)."""
        if key is None:
            self._wake_call = None
            waiting, self._waiting = self._waiting, {}
            woken = [d for ds in waiting.values() for d in ds]
        else:
            woken = self._waiting.pop(key, [])
        for d in woken:
            if not d.called:
                d.callback(None)
