"""The URLs of a hub job's work queue, for a crawl of the job without a URL list.

``scrapy crawl site -s JOB=NAME`` without ``-a urls`` leases the queue's pending URLs
in batches (as Slurm tasks in queue mode do, ``crawler/hub/workqueue.py``), renews
its leases while it runs, and at its end marks its batches done when it finished, or
gives them back when it stopped early, so that the next crawl of the job takes them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from scrapy.exceptions import UsageError

from crawler.hub import Holder, Hub, WorkBatch, WorkQueue, WorkQueueError
from crawler.hub.jobs import JobStore


class JobQueueUrls:
    """A URL list read from a job's work queue: ``name`` and ``batches`` as
    :class:`~crawler.spiderkit.urls.UrlList` has them."""

    def __init__(self, hub_url: str, job: str):
        # The lease time Slurm tasks in queue mode use; renewed every third of it.
        self.ttl = float(os.environ.get("WORK_LEASE_TTL") or 300)
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

    def batches(self, size: int) -> Iterator[list[tuple[int, str, str | None]]]:
        """Leased batches, as ``(number, url, None)``: the crawl checks each URL."""
        number = 0
        while (batch := self.queue.lease(self.holder, size, self.ttl)) is not None:
            self.held.append(batch)
            yield [(number := number + 1, url, None) for url in batch.urls]

    def pending(self) -> int:
        """The queue's URLs not done yet, for the progress line."""
        progress = self.queue.progress()
        return progress.total - progress.done

    def renew(self) -> None:
        for batch in self.held:
            self.queue.renew(batch, self.ttl)

    def finish(self, finished: bool) -> None:
        """Mark the batches done (the crawl finished its list) or give them back."""
        try:
            for batch in self.held:
                self.queue.done(batch) if finished else self.queue.release(batch)
        finally:
            self.held = []
            self.hub.close()
