"""The crawl's answers to the writer process, and stored answers back: :class:`Archiver`.

A part of the storage extension (``extensions/storage/extension.py``), called by the
archive middleware for each final answer (``middlewares/archive.py``) and by the media
pipelines for the records they make. The writer process logs ``ok`` once an answer's
row is committed (or ``unchanged``, when it kept the answer as a revisit of its key's
stored record: the policy says which stored row may be one); an answer that stores
nothing is an ``error`` line, and a later request for its key fetches it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from scrapy import Request
from scrapy.http import Response

from crawler import signals as crawler_signals
from crawler.reparse.responses import build_response
from crawler.storage.actionlog import Outcome
from crawler.storage.errors import StoreError
from crawler.storage.records import Fetch, Row, StoredRecord
from crawler.storage.runcounts import RunCounts
from crawler.storage.session import StorageSession
from extensions.archive_policy import ArchivePolicy
from extensions.storage.actions import ActionRecorder
from extensions.storage.requests import CACHED_FLAG, catalog_key
from extensions.storage.waits import RowWaits


class Archiver:
    """Hands the crawl's answers to the writer process (fetched, refreshed by a 304, or
    made by a pipeline) and answers stored requests from the archive, each with its
    line and counts."""

    def __init__(
        self,
        session: StorageSession,
        policy: ArchivePolicy,
        actions: ActionRecorder,
        waits: RowWaits,
        fail: Callable[[str], None],
    ):
        self.session = session
        self.policy = policy
        self.actions = actions
        self.counts: RunCounts = actions.counts
        self.waits = waits
        self._fail = fail

    def store(self, request: Request, fetch: Fetch, stored: Row | None = None) -> None:
        """Hand an answer to the writer; it logs ``ok`` once the row is committed, or
        ``unchanged`` when the payload is the one of the key's ``stored`` row (kept as
        a revisit of it). This thread hashes no body. The answer is counted ``ok``
        here, and moved to ``unchanged`` when the writer says so
        (:meth:`RunCounts.unchanged`)."""
        size = len(fetch.body)
        action = self.actions.fields(
            request, outcome=Outcome.OK, status=fetch.status, bytes=size, ts=time.time()
        )
        listed = action.pop("listed")
        try:
            self.session.put(fetch, action, self.policy.revisit_of(fetch, stored))
        except StoreError as exc:
            self.failed(request, status=fetch.status, error=f"not stored: {exc}")
            self._fail(str(exc))
            return
        crawler_signals.mark_final(request, Outcome.OK)
        counts = self.counts
        counts.finished(fetch.key)
        self.waits.stored(fetch.key)
        counts.rows_sent += 1
        counts.inc("archive/stored")
        counts.inc("archive/stored_bytes", size)
        counts.outcome(Outcome.OK, listed)

    def refresh(self, request: Request, fetch: Fetch, row: Row | None) -> bool:
        """A 304 to a revalidation: the row's validators and time refreshed."""
        try:
            self.session.touch(fetch, row.fetched_at if row else None)
        except StoreError as exc:
            self._fail(str(exc))
            return False
        self.counts.rows_sent += 1
        self.counts.inc("catalog/not_modified")
        self.actions.record(request, Outcome.NOT_MODIFIED, status=304, bytes=0)
        return True

    def failed(self, request: Request, **fields) -> None:
        """An attempt that stored nothing: an ``error`` line; a later request for its
        key fetches it."""
        self.waits.failed(catalog_key(request))
        self.actions.record(request, Outcome.ERROR, **fields)

    def store_made(self, fetch: Fetch) -> None:
        """Store a record the crawl made rather than fetched (an image's thumbnail,
        ``pipelines/archive_images.py``): archived and cataloged as a fetch is, with no
        action-log line, since nothing was fetched (``archive/made``). Raises
        StoreError when the writer cannot take it (the crawl stops, as for a fetch)."""
        fetch.parsed = False
        try:
            self.session.put(fetch)
        except StoreError as exc:
            self._fail(str(exc))
            raise
        self.counts.rows_sent += 1
        self.counts.inc("archive/made")

    def replay(self, request: Request, row: Row) -> Response | None:
        """The stored answer to ``request``; None when it cannot be read (counted in
        ``archive/read_errors``), which callers treat as not stored."""
        return self.replayed(request, self.session.replay(row))

    def replayed(self, request: Request, stored: StoredRecord | None) -> Response | None:
        """:meth:`replay` of a stored answer read already (None: it could not be)."""
        if stored is None:
            self.counts.inc("archive/read_errors")
            return None
        self.counts.inc("archive/replayed")
        return build_response(stored, request, flags=[CACHED_FLAG])

    def parsing_stored(self) -> None:
        """A stored page replayed for this spider's items."""
        self.counts.inc("items/stored_pages_parsed")
