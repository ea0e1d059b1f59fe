"""The URLs of a hub job's work queue, for a crawl of the job without a URL list.

``scrapy crawl site -s JOB=NAME`` without ``-a urls`` leases the queue's pending URLs
in batches (as Slurm tasks in queue mode do, ``crawler/hub/workqueue.py``), renews
its leases while it runs, and at its end marks its batches done when it finished (the
URLs that failed after every retry go back to the queue, up to ``WORK_MAX_ATTEMPTS``
times), or gives them back when it stopped early, so that the next crawl of the job
takes them.

Every call here asks the hub and blocks: the crawl makes them in threads, never on the
reactor (``blocking``; the hub's connection is thread-safe).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import deque
from collections.abc import Iterator
from pathlib import Path

from scrapy.exceptions import UsageError

from crawler.hub import Holder, Hub, HubUnavailableError, WorkBatch, WorkQueue, WorkQueueError
from crawler.hub.jobs import JobStore
from crawler.hub.workqueue import MAX_ATTEMPTS
from crawler.storage.actionlog import failed_keys

logger = logging.getLogger(__name__)


class JobQueueUrls:
    """A URL list read from a job's work queue: ``name`` and ``batches`` as
    :class:`~crawler.spiderkit.urls.UrlList` has them."""

    # Its batches are leased from the hub: read in a thread (crawler/spiderkit/start.py).
    blocking = True

    def __init__(
        self,
        hub_url: str,
        job: str,
        holders: int | None = None,
        max_attempts: int = MAX_ATTEMPTS,
    ):
        # The lease time Slurm tasks in queue mode use; renewed every third of it.
        self.ttl = float(os.environ.get("WORK_LEASE_TTL") or 300)
        self.max_attempts = max_attempts
        self.hub = Hub.open(hub_url)
        try:
            queue = JobStore(self.hub).get(job).queue
            if not queue:
                raise UsageError(
                    f"job {job!r} has no work queue: give -a urls=FILE, or create the job "
                    "with --urls FILE"
                )
            self.queue = WorkQueue(self.hub, queue, create=False)
        except (UsageError, WorkQueueError):
            self.hub.close()
            raise
        self.path = self.name = f"job {job}, queue {queue}"
        self.holder = str(Holder.current())
        self.held: list[WorkBatch] = []
        # Leased and not yet gone through by the crawl's start, in lease order; and
        # the batches it found stored whole, to be marked done at once (settle).
        self._leased: deque[list[WorkBatch]] = deque()
        self._stored: deque[WorkBatch] = deque()
        self._settling = threading.Lock()
        self.holders = holders  # the most holders of a unit this crawl's settings allow
        # Request keys of the batches whose lease was lost: not to be fetched here
        # (crawler/downloader.py); changed on the reactor thread only.
        self.lost_keys: set[str] = set()

    def batches(self, size: int) -> Iterator[list[tuple[int, str, str | None]]]:
        """Leased batches, as ``(number, url, None)``: the crawl checks each URL."""
        number = 0
        while True:
            self.settle()  # in the thread that leases, before the next lease
            leased = self.queue.lease_many(self.holder, size, self.ttl, self.holders)
            if not leased:
                return
            self.held.extend(leased)
            self._leased.append(leased)
            yield [(number := number + 1, url, None) for batch in leased for url in batch.urls]

    def gone_through(self, stored: bool) -> bool:
        """The crawl's start has gone through the next list of batches (in lease order,
        a list each lease call); with ``stored`` every URL of them was stored and has its
        cache-hit line: they are held no more, and :meth:`settle` marks them done before
        the next lease. Otherwise they stay held to the crawl's end. So a resumed job
        holds only the batches it fetches: its memory does not grow with the queue, nor
        do its lease calls (each looks at every live lease of the queue). Called on the
        reactor thread; returns ``stored``."""
        leased = self._leased.popleft()
        if stored:
            for batch in leased:
                # A batch whose lease was lost meanwhile (renew) is held no more already.
                with contextlib.suppress(ValueError):
                    self.held.remove(batch)
            self._stored.extend(leased)
        return stored

    def settle(self) -> None:
        """Mark done the batches found stored whole (blocks: call it in a thread); one
        the hub could not mark is held again, for :meth:`finish`."""
        with self._settling:
            stored = []
            while self._stored:  # deque operations are atomic: gone_through adds meanwhile
                stored.append(self._stored.popleft())
            try:
                self.queue.done_many(stored)
            except Exception as exc:  # the hub logs once that it is away
                logger.debug("Marking %d stored batches done failed: %s", len(stored), exc)
                self.held.extend(stored)

    def pending(self) -> int:
        """The queue's URLs not done yet, for the progress line."""
        progress = self.queue.progress()
        return progress.total - progress.done

    def renew(self) -> list[tuple[WorkBatch, set[str]]]:
        """Renew every batch held. The batches whose lease was lost (it expired, say
        while the crawl stalled, and another holder took the batch over) are no longer
        held: returned, each with the request keys of its URLs. A hub that fails is
        told, and asked again next time."""
        lost = []
        for batch in list(self.held):
            try:
                renewed = self.queue.renew(batch, self.ttl)
            except HubUnavailableError:  # the hub logs once that it is away
                break
            except Exception as exc:
                logger.warning("Renewing batch %d failed: %s", batch.lease_id, exc)
                break
            if not renewed:
                self.held.remove(batch)
                keys = {key for key in map(_key, batch.urls) if key is not None}
                lost.append((batch, keys))
        return lost

    def finish(self, finished: bool, log: Path | None = None, since: int = 0) -> None:
        """Mark the batches done (the crawl finished its list), the URLs this run's
        action log (*log*, from byte *since*) says failed put back for another crawl;
        or give the batches back (it stopped early). The ones found stored whole are
        done either way."""
        try:
            self.settle()
            if not finished:
                for batch in self.held:
                    self.queue.release(batch)
                return
            keyed = [{_key(url): url for url in batch.urls} for batch in self.held]
            # One reading of the log for every batch: a job's run may hold thousands.
            failed = failed_keys(log, since, set().union(*keyed)) if log is not None else set()
            for batch, keys in zip(self.held, keyed, strict=True):
                failed_urls = [url for key, url in keys.items() if key in failed]
                self.queue.done(batch, failed_urls, self.max_attempts)
        finally:
            self.held = []
            self.hub.close()


def _key(text: str) -> str | None:
    """The request key a crawl gives the listed line *text* (None: not a URL)."""
    from crawler.spiderkit.start import listed_key

    return listed_key(text)[1]
