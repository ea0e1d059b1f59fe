"""Keys this run is fetching or has handed to the writer, not yet in the catalog.

A request for such a key would miss the catalog and be fetched a second time: a
depth crawl meets a page again higher up while its first fetch is in flight, or
queued for the writer's next commit. The crawl waits for the row instead
(``extensions/storage/waits.py``). Bounded: the oldest stored keys are forgotten first, long
after the writer committed them (it commits at least every ``CATALOG_FLUSH_SECONDS``, 5 s:
20,000 keys are 20 s of a crawl storing 1,000 pages a second). A key forgotten too soon
costs one more fetch of its URL, never a lost row; every key held costs about 160 bytes
(100,000 of them were 15 MB of a cold crawl's memory).
"""

from __future__ import annotations

FETCHING = "fetching"
STORED = "stored"


class UnsettledKeys:
    def __init__(self, limit: int = 20_000):
        self.limit = limit
        self._state: dict[str, str] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._state

    def fetching(self, key: str) -> None:
        self._state[key] = FETCHING
        self._trim()

    def stored(self, key: str) -> None:
        self._state.pop(key, None)  # to the end: forgotten last
        self._state[key] = STORED
        self._trim()

    def failed(self, key: str) -> None:
        """The fetch stored nothing: a later request must fetch it."""
        if self._state.get(key) == FETCHING:
            del self._state[key]

    def _trim(self) -> None:
        while len(self._state) > self.limit:
            del self._state[next(iter(self._state))]
