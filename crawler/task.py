"""One Slurm array task: crawl processes on node-local disk, shipped to shared storage.

    python -m crawler.task --urls URLS --data DATA --stage STAGE --task I --tasks N \\
        [--procs P] [--spider site] [--name NAME] [--ship-every MINUTES] [-- scrapy args]

Crawl process k of task I crawls shard ``I*P+k`` of ``N*P`` (``-a shard=``) into
``STAGE/p<k>``, skipping what ``DATA/metadata.db`` and the shipped catalogs
``DATA/catalogs/*.db`` hold (``CATALOG_SEEN``), with archives rolling over every
``--ship-every`` minutes. Every ``--ship-every`` minutes each process's closed
archives, then its catalog and action log, are shipped (:class:`crawler.ship.Shipper`)
as ``DATA/catalogs/NAME_p<k>.db``; its output goes to ``DATA/logs/NAME_p<k>.log``.

SIGUSR1 (the batch script forwards what Slurm sends it before the time limit): each
crawl gets one SIGTERM, its graceful stop. SIGTERM: not forwarded, since Slurm sends
it to every process of the job (``scancel``, time limit) and a crawl takes a second
one as an order to stop at once. Once the crawls have stopped, everything is shipped.

Exit status: 0 every crawl finished its share; 75 one stopped early (run again to
resume); 1 one failed or the last shipment failed.

Queue mode (``--queue NAME``, ``HUB_URL`` set; ``--urls`` is then not read): each crawl
process k loops: lease a batch of ``--batch`` URLs from the hub's work queue NAME
(:mod:`crawler.hub.workqueue`), write it to ``STAGE/p<k>/batch.txt``, crawl it (no shard),
ship, and mark the batch done only once shipped; the lease is renewed while the crawl
runs (``WORK_LEASE_TTL`` seconds, default 300). A process that finds nothing to lease
waits while other holders' leases are live (a dead holder's batch is taken over when
its lease expires) and stops when every item is done. A batch whose crawl stopped
early or failed is given back to the queue. Exit status: 0 the queue is done; 75
stopped by a signal; 1 a crawl, a shipment or the hub failed.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from crawler.hub import Holder, Hub, WorkBatch, WorkQueue
from crawler.seen import SHIPPED_DIR
from crawler.ship import CATALOG_NAME, Shipper

logger = logging.getLogger("crawler.task")

EXIT_FINISHED = 0
EXIT_FAILED = 1
EXIT_INTERRUPTED = 75


@dataclass
class TaskConfig:
    urls: Path
    data: Path
    stage: Path
    task: int
    tasks: int
    procs: int = 1
    spider: str = "site"
    name: str = "task"
    ship_every: float = 600.0  # seconds
    scrapy_args: tuple[str, ...] = ()
    queue: str = ""  # queue mode: the hub's work queue to lease from
    batch: int = 1000  # URLs per lease
    lease_ttl: float = 300.0  # seconds

    def shard(self, k: int) -> str:
        return f"{self.task * self.procs + k}/{self.tasks * self.procs}"

    def command(self, k: int, batch_file: Path | None = None) -> list[str]:
        seen = f"{self.data / CATALOG_NAME},{self.data / SHIPPED_DIR / '*.db'}"
        if batch_file is None:
            work = ["-a", f"urls={self.urls}", "-a", f"shard={self.shard(k)}"]
        else:
            work = ["-a", f"urls={batch_file}"]
        return [
            sys.executable,
            "-m",
            "scrapy",
            "crawl",
            self.spider,
            *work,
            "-s",
            f"DATA_DIR={self.stage / f'p{k}'}",
            "-s",
            f"CATALOG_SEEN={seen}",
            "-s",
            f"ARCHIVE_ROLLOVER_SECONDS={self.ship_every:g}",
            "-s",
            f"ARCHIVE_PREFIX={self.name}_p{k}",
            *self.scrapy_args,
        ]


class TaskRunner:
    def __init__(self, config: TaskConfig):
        self.config = config
        self.procs: list[subprocess.Popen] = []
        self.shippers = [
            Shipper(config.stage / f"p{k}", config.data, f"{config.name}_p{k}")
            for k in range(config.procs)
        ]
        self.stop_signals = 0
        self._forwarded = False

    def _on_signal(self, signum, frame) -> None:
        if signum == signal.SIGUSR1:
            logger.info("Got SIGUSR1: stopping the crawls")
            self.stop_signals += 1
        else:
            name = signal.Signals(signum).name
            logger.info("Got %s (the crawls get it too): waiting for them", name)

    def start(self) -> None:
        for k in range(self.config.procs):
            self.start_crawl(k, self.config.command(k))
            logger.info("Crawl p%d (pid %d): shard %s", k, self.procs[-1].pid, self.config.shard(k))

    def start_crawl(self, k: int, command: list[str]) -> subprocess.Popen:
        logs = self.config.data / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{self.config.name}_p{k}.log", "ab") as log:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def _forward(self) -> None:
        # Once: a crawl that also got the signal itself (``scancel --full``) would take
        # a second one as an order to stop at once.
        if self.stop_signals and not self._forwarded:
            self._forwarded = True
            for proc in self.procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)

    def ship(self) -> bool:
        ok = True
        for shipper in self.shippers:
            try:
                done = shipper.ship()
            except Exception as exc:  # shared storage: log, retry next time
                logger.error("Shipping %s failed: %s", shipper.name, exc, exc_info=True)
                ok = False
                continue
            logger.info(
                "Shipped %s: %d new archives, catalog %d rows (%d held back)",
                shipper.name,
                len(done.archives),
                done.rows,
                done.held_back,
            )
        return ok

    def run(self) -> int:
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        self.start()
        next_ship = time.monotonic() + self.config.ship_every
        while any(proc.poll() is None for proc in self.procs):
            self._forward()
            time.sleep(0.5)
            if time.monotonic() >= next_ship:
                self.ship()
                next_ship = time.monotonic() + self.config.ship_every
        shipped = self.ship()
        return self.status(shipped)

    def status(self, shipped: bool) -> int:
        codes = [proc.returncode for proc in self.procs]
        logger.info("Crawl exit statuses: %s", codes)
        if not shipped or any(c not in (EXIT_FINISHED, EXIT_INTERRUPTED) and c >= 0 for c in codes):
            return EXIT_FAILED
        if any(c != EXIT_FINISHED for c in codes):
            return EXIT_INTERRUPTED  # stopped, or killed by a signal: resume
        return EXIT_FINISHED


# --- queue mode ----------------------------------------------------------------------
@dataclass
class Slot:
    """Crawl process k of a queue-mode task: the batch it crawls, if any."""

    k: int
    proc: subprocess.Popen | None = None
    batch: WorkBatch | None = None
    drained: bool = False  # nothing left to lease: every item is done


class QueueTaskRunner(TaskRunner):
    """A task that takes its URLs from the hub's work queue, batch after batch."""

    def __init__(self, config: TaskConfig, queue: WorkQueue, holder: Holder):
        super().__init__(config)
        self.queue = queue
        self.holder = holder
        self.slots = [Slot(k) for k in range(config.procs)]
        self.stopping = False
        self.failed = False
        self.renew_every = max(min(config.lease_ttl / 3, 60.0), 0.5)
        self.poll_every = max(min(config.lease_ttl / 4, 10.0), 0.5)

    def _on_signal(self, signum, frame) -> None:
        super()._on_signal(signum, frame)
        self.stopping = True  # USR1 or TERM: lease nothing more

    def run(self) -> int:
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
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
            time.sleep(0.2)
        shipped = self.ship()
        if self.failed or not shipped:
            return EXIT_FAILED
        return EXIT_FINISHED if all(s.drained for s in self.slots) else EXIT_INTERRUPTED

    def _lease(self, slot: Slot) -> None:
        try:
            batch = self.queue.lease(f"{self.holder}/p{slot.k}", self.config.batch,
                                     self.config.lease_ttl)  # fmt: skip
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
        try:
            done = self.shippers[slot.k].ship()
        except Exception as exc:
            logger.error("Shipping p%d failed: %s", slot.k, exc, exc_info=True)
            done = None
        complete = code == EXIT_FINISHED and done is not None and done.held_back == 0
        try:
            ok = self.queue.done(batch) if complete else self.queue.release(batch)
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
            if slot.batch is None:
                continue
            try:
                if not self.queue.renew(slot.batch, self.config.lease_ttl):
                    logger.warning("Lease of batch %d was lost (expired and taken over)",
                                   slot.batch.lease_id)  # fmt: skip
            except Exception as exc:
                logger.error("Renewing batch %d failed: %s", slot.batch.lease_id, exc)


def run_queue(config: TaskConfig) -> int:
    hub_url = os.environ.get("HUB_URL", "")
    if not hub_url:
        logger.error("--queue needs HUB_URL (postgresql://...) in the environment")
        return EXIT_FAILED
    with Hub.open(hub_url) as hub:
        queue = WorkQueue(hub, config.queue, create=False)
        logger.info("Queue %s in %s: %s", queue.name, hub.label, queue.progress().line())
        status = QueueTaskRunner(config, queue, Holder.current()).run()
        logger.info("Queue %s: %s", queue.name, queue.progress().line())
    return status


def parse_args(argv: list[str]) -> TaskConfig:
    parser = argparse.ArgumentParser(prog="python -m crawler.task", description=__doc__)
    parser.add_argument("--urls", required=True, type=Path)
    parser.add_argument("--data", required=True, type=Path)
    parser.add_argument("--stage", required=True, type=Path)
    parser.add_argument("--task", required=True, type=int)
    parser.add_argument("--tasks", required=True, type=int)
    parser.add_argument("--procs", type=int, default=1)
    parser.add_argument("--spider", default="site")
    parser.add_argument("--name", default="task")
    parser.add_argument("--ship-every", type=float, default=10.0, help="minutes")
    parser.add_argument("--queue", default="", help="queue mode: the hub's work queue")
    parser.add_argument("--batch", type=int, default=1000, help="queue mode: URLs per lease")
    parser.add_argument("scrapy_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    extra = args.scrapy_args[1:] if args.scrapy_args[:1] == ["--"] else args.scrapy_args
    if not 0 <= args.task < args.tasks or args.procs < 1 or args.batch < 1:
        parser.error("need 0 <= --task < --tasks, --procs >= 1 and --batch >= 1")
    return TaskConfig(
        urls=args.urls.resolve(),
        data=args.data.resolve(),
        stage=args.stage.resolve(),
        task=args.task,
        tasks=args.tasks,
        procs=args.procs,
        spider=args.spider,
        name=args.name,
        ship_every=args.ship_every * 60,
        scrapy_args=tuple(extra),
        queue=args.queue,
        batch=args.batch,
        lease_ttl=float(os.environ.get("WORK_LEASE_TTL") or 300),
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s [task] %(message)s", stream=sys.stdout
    )
    config = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("SQLITE_TMPDIR", str(config.stage))
    if config.queue:
        return run_queue(config)
    return TaskRunner(config).run()


if __name__ == "__main__":
    sys.exit(main())
