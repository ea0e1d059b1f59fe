"""A Slurm task in queue mode: its crawl processes take batches from the hub's work
queue, one after another, until every URL of the queue is done.

Each crawl process k loops: lease a batch of ``--batch`` URLs from the hub's work
queue (:mod:`crawler.hub.workqueue`), write it to ``STAGE/p<k>/batch.txt``, crawl it (no
shard), ship, and mark the batch done only once shipped; the lease is renewed while
the crawl runs (``WORK_LEASE_TTL``). A process that finds nothing to lease waits while
other holders' leases are live (a dead holder's batch is taken over when its lease
expires) and stops when every item is done. A batch whose crawl stopped early or
failed is given back to the queue. A batch whose lease was lost (it expired and another
holder took it over) has its crawl stopped: the new holder fetches its URLs.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from crawler.hub import Holder, Hub, WorkBatch, WorkQueue
from crawler.hub.db import hub_url
from crawler.hub.workqueue import MAX_ATTEMPTS, item_key, unit_holders
from crawler.storage.actionlog import failed_keys
from crawler.storage.datadir import DataDir
from slurm.forkserver import ForkedProcess
from slurm.runner import EXIT_FAILED, EXIT_FINISHED, EXIT_INTERRUPTED, TaskConfig, TaskRunner

logger = logging.getLogger(__name__)


@dataclass
class Slot:
    """Crawl process k of a queue-mode task: the batch it crawls, if any."""

    k: int
    proc: subprocess.Popen | ForkedProcess | None = None
    batch: WorkBatch | None = None
    log_offset: int = 0  # the size of its action log when the batch's crawl started
    drained: bool = False  # nothing left to lease: every item is done
    lost: bool = False  # its batch's lease was lost: the crawl was told to stop


def failed_urls(log: Path, offset: int, urls: Iterable[str]) -> list[str]:
    """The *urls* that ended ``error`` in the action log lines past *offset* (the crawl
    of one batch): each listed URL ends with one final line."""
    by_key = {item_key(url): url for url in urls}
    return sorted(by_key[key] for key in failed_keys(log, offset, by_key))


def crawl_settings(args: Sequence[str]):
    """The crawls' settings: the project's, with the ``-s KEY=VALUE`` of the crawls'
    arguments over them."""
    from scrapy.utils.project import get_project_settings

    settings = get_project_settings()
    for flag, value in zip(args, args[1:], strict=False):
        if flag == "-s" and "=" in value:
            key, _, setting = value.partition("=")
            settings.set(key, setting, priority="cmdline")
    return settings


class QueueTaskRunner(TaskRunner):
    """A task that takes its URLs from the hub's work queue, batch after batch."""

    def __init__(self, config: TaskConfig, queue: WorkQueue, holder: Holder):
        super().__init__(config)
        self.queue = queue
        self.holder = holder
        self.slots = [Slot(k) for k in range(config.procs)]
        self.stopping = False
        self.failed = False
        settings = crawl_settings(config.scrapy_args)
        self.holders = unit_holders(settings)
        self.max_attempts = settings.getint("WORK_MAX_ATTEMPTS", MAX_ATTEMPTS)
        self.renew_every = max(min(config.lease_ttl / 3, 60.0), 0.5)
        self.poll_every = max(min(config.lease_ttl / 4, 10.0), 0.5)

    def _on_signal(self, signum, frame) -> None:
        super()._on_signal(signum, frame)
        self.stopping = True  # USR1 or TERM: lease nothing more

    def run(self) -> int:
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        self.open_fork_server()
        now = time.monotonic()
        next_ship, next_renew, next_poll = now + self.config.ship_every, now, now
        while True:
            self._forward()
            for slot in self.slots:
                if slot.proc is not None and slot.proc.poll() is not None:
                    self._finish(slot)
                    next_poll = 0.0  # take the next batch at once
            ending = self.stopping or self.failed
            if not any(s.proc for s in self.slots) and (
                ending or all(s.drained for s in self.slots)
            ):
                break
            idle = [s for s in self.slots if s.proc is None and not s.drained]
            if idle and not ending and time.monotonic() >= next_poll:
                for slot in idle:
                    self._lease(slot)
                next_poll = time.monotonic() + self.poll_every
            if time.monotonic() >= next_renew:
                self._renew()
                next_renew = time.monotonic() + self.renew_every
            if time.monotonic() >= next_ship:
                self.ship()
                next_ship = time.monotonic() + self.config.ship_every
            self.pause(0.2)
        self.close_fork_server()
        shipped = self.ship()
        if self.failed or not shipped:
            return EXIT_FAILED
        return EXIT_FINISHED if all(s.drained for s in self.slots) else EXIT_INTERRUPTED

    def ended(self, k: int) -> bool:
        return self.slots[k].proc is None

    def _lease(self, slot: Slot) -> None:
        try:
            batch = self.queue.lease(f"{self.holder}/p{slot.k}", self.config.batch,
                                     self.config.lease_ttl, self.holders)  # fmt: skip
            if batch is None:
                progress = self.queue.progress()
                slot.drained = progress.pending == 0 and progress.leased + progress.expired == 0
                if not slot.drained:
                    logger.debug("Queue %s: %s; waiting", self.queue.name, progress.line())
                return
        except Exception as exc:  # the hub: log, try again at the next poll
            logger.error("Leasing from queue %s failed: %s", self.queue.name, exc, exc_info=True)
            return
        local = self.config.stage / f"p{slot.k}"
        local.mkdir(parents=True, exist_ok=True)
        batch_file = local / "batch.txt"
        batch_file.write_text("".join(f"{url}\n" for url in batch.urls), encoding="utf-8")
        log = DataDir(local).action_log_path
        slot.log_offset = log.stat().st_size if log.exists() else 0
        slot.batch = batch
        slot.proc = self.start_crawl(slot.k, self.config.command(slot.k, batch_file))
        logger.info(
            "Crawl p%d (pid %d): batch %d of queue %s, %d URLs%s",
            slot.k, slot.proc.pid, batch.lease_id, batch.queue, len(batch.urls),
            f" (taken over from expired lease {batch.taken_over})" if batch.taken_over else "",
        )  # fmt: skip

    def _finish(self, slot: Slot) -> None:
        code, batch = slot.proc.returncode, slot.batch
        slot.proc = slot.batch = None
        slot.lost = False
        try:
            done = self.shippers[slot.k].ship()
        except Exception as exc:
            logger.error("Shipping p%d failed: %s", slot.k, exc, exc_info=True)
            done = None
        else:
            self.settled.add(slot.k)
        complete = code == EXIT_FINISHED and done is not None and done.held_back == 0
        try:
            if complete:
                log = DataDir(self.config.stage / f"p{slot.k}").action_log_path
                failed = failed_urls(log, slot.log_offset, batch.urls)
                ok = self.queue.done(batch, failed, self.max_attempts)
            else:
                ok = self.queue.release(batch)
        except Exception as exc:  # its lease expires and another task takes it over
            logger.error("Ending batch %d failed: %s", batch.lease_id, exc, exc_info=True)
            ok = False
        logger.info(
            "Crawl p%d exit status %s: batch %d %s%s", slot.k, code, batch.lease_id,
            "done" if complete else "given back", "" if ok else " (lease lost before)",
        )  # fmt: skip
        if code not in (EXIT_FINISHED, EXIT_INTERRUPTED) and code >= 0 or done is None:
            self.failed = True

    def _renew(self) -> None:
        for slot in self.slots:
            if slot.batch is None or slot.lost:
                continue
            try:
                renewed = self.queue.renew(slot.batch, self.config.lease_ttl)
            except Exception as exc:
                logger.error("Renewing batch %d failed: %s", slot.batch.lease_id, exc)
                continue
            if not renewed:
                self._lost(slot)

    def _lost(self, slot: Slot) -> None:
        """The slot's batch was taken over (its lease expired, say while the task
        stalled): its URLs are the new holder's. The crawl stops as at a stop signal
        (once: a second signal stops a crawl at once), and ships what it stored."""
        slot.lost = True
        logger.warning(
            "Lease of batch %d was lost (expired and taken over by another holder): "
            "stopping crawl p%d, whose URLs left the new holder fetches",
            slot.batch.lease_id, slot.k,
        )  # fmt: skip
        if slot.proc is not None and slot.proc.poll() is None and not self._forwarded:
            self.stopping_pids.add(slot.proc.pid)
            slot.proc.send_signal(signal.SIGTERM)


def run_queue(config: TaskConfig) -> int:
    url = hub_url({})  # a task has no Scrapy settings: the environment's
    if not url:
        logger.error("--queue needs HUB_URL (postgresql://...) in the environment")
        return EXIT_FAILED
    with Hub.open(url) as hub:
        queue = WorkQueue(hub, config.queue, create=False)
        logger.info("Queue %s in %s: %s", queue.name, hub.label, queue.progress().line())
        status = QueueTaskRunner(config, queue, Holder.current()).run()
        logger.info("Queue %s: %s", queue.name, queue.progress().line())
    return status
