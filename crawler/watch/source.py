"""What the live views read from the hub: a job's heartbeat rows, its work queue's
progress and the bans of the proxies its processes leased. Reads only: a hub without
the heartbeat table (older than it) reads as no processes, and nothing is created in
it, apart from what ``scrapy job`` itself creates when it opens a job.
"""

from __future__ import annotations

from crawler.hub.db import Hub
from crawler.hub.errors import HubError
from crawler.hub.heartbeats import HeartbeatStore
from crawler.hub.jobs import JobError, JobStore
from crawler.hub.proxies import recent_bans
from crawler.hub.workqueue import WorkQueue, WorkQueueError
from crawler.watch.model import Snapshot

# The window of the queue's speed, and of the proxies' bans.
QUEUE_WINDOW = 600.0
BANS_WINDOW = 3600.0


class UnknownJobError(HubError):
    """The hub has no such job and no process ever reported one."""


class JobSource:
    """The hub's rows of one job (every job's: ``job`` None), read again at every
    :meth:`snapshot`; processes heard from within ``window`` seconds of the job's
    newest heartbeat (its last runs, not last month's)."""

    def __init__(self, hub: Hub, job: str | None = None, window: float = 3600.0) -> None:
        self.hub = hub
        self.job = job
        self.window = window
        self.beats = HeartbeatStore(hub, create=False)
        self.queue: WorkQueue | None = None
        self.queue_name = ""
        self._proxy_tables = False  # asked until found: a crawl may make them later
        if job is not None:
            self._find(job)

    def _find(self, name: str) -> None:
        """The job and its queue; UnknownJobError when neither the jobs nor the
        heartbeats know it."""
        if self.hub.has_table("hub_jobs"):
            try:
                job = JobStore(self.hub).get(name)
            except JobError:
                job = None
            if job is not None:
                self.queue_name = job.queue
                self._open_queue(job.queue)
                return
        if name not in self.beats.jobs():
            raise UnknownJobError(
                f"no job {name!r} in the hub {self.hub.label}: `scrapy job list` shows "
                "the jobs (without a NAME, `scrapy job top` shows every process)"
            )

    def _open_queue(self, name: str) -> None:
        if not name or not self.hub.has_table("hub_work_queues"):
            return
        try:
            self.queue = WorkQueue(self.hub, name, create=False)
        except WorkQueueError:  # created with the job, loaded later (or never)
            self.queue = None

    def snapshot(self) -> Snapshot:
        now = self.hub.now()
        beats = self.beats.read(self.job, self.window)
        bans = []
        if beats and not self._proxy_tables:
            self._proxy_tables = self.hub.has_table("hub_proxy_usage")
        if beats and self._proxy_tables:
            bans = recent_bans(self.hub, now - BANS_WINDOW)
        return Snapshot(
            job=self.job,
            hub=self.hub.label,
            now=now,
            beats=beats,
            queue_name=self.queue_name,
            queue=self.queue.stats(QUEUE_WINDOW) if self.queue is not None else None,
            proxy_bans=bans,
        )
