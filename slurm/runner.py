"""A Slurm task in shard mode: its crawl processes, their signals, shipping.

:class:`TaskRunner` starts ``--procs`` crawls on node-local disk, each on its shard of
the list and skipping what shared storage holds, and ships each one's work
(:class:`slurm.ship.Shipper`) every ``--ship-every`` minutes and at the end.
``slurm/task.py`` is the command line; ``slurm/queue.py`` the queue-mode runner.

The crawls are forked from a fork server that imported Scrapy, Twisted and the
project once (:mod:`slurm.forkserver`), unless ``fork_server`` is off or the server
finds forking unsafe: then each is a plain ``python -m scrapy crawl`` process.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from crawler.storage.datadir import DataDir
from slurm.forkserver import ForkedProcess, ForkServer, ForkServerError
from slurm.ship import Shipper

logger = logging.getLogger(__name__)

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
    partition: str = ""  # shard mode: -a partition= of each crawl ("": CRAWL_PARTITION)
    fork_server: bool = True  # crawls forked from a server that preloaded Scrapy

    def shard(self, k: int) -> str:
        return f"{self.task * self.procs + k}/{self.tasks * self.procs}"

    def command(self, k: int, batch_file: Path | None = None) -> list[str]:
        seen = ",".join(DataDir(self.data).seen_patterns())
        if batch_file is None:
            work = ["-a", f"urls={self.urls}", "-a", f"shard={self.shard(k)}"]
            if self.partition:
                work += ["-a", f"partition={self.partition}"]
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
        self.procs: list[subprocess.Popen | ForkedProcess] = []
        self.forks: ForkServer | None = None  # None: crawls start as plain processes
        self.shippers = [
            Shipper(config.stage / f"p{k}", config.data, f"{config.name}_p{k}")
            for k in range(config.procs)
        ]
        self.settled: set[int] = set()  # crawls that ended and whose work is shipped
        self.stop_signals = 0
        self._forwarded = False
        self.stopping_pids: set[int] = set()  # crawls told to stop already

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

    def open_fork_server(self) -> None:
        if not self.config.fork_server:
            return
        forks = ForkServer()
        try:
            forks.start()
        except ForkServerError as exc:
            logger.warning("No fork server (%s): crawls start as plain processes", exc)
            return
        self.forks = forks

    def close_fork_server(self) -> None:
        if self.forks is not None:
            self.forks.close()
            self.forks = None

    def start_crawl(self, k: int, command: list[str]) -> subprocess.Popen | ForkedProcess:
        self.settled.discard(k)
        logs = self.config.data / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        path = logs / f"{self.config.name}_p{k}.log"
        proc = None
        if self.forks is not None:
            try:
                proc = self.forks.spawn(command, path)
            except ForkServerError as exc:  # its crawls still end (as UNKNOWN if it died)
                logger.error("Fork server failed (%s): crawls start as plain processes", exc)
                self.forks = None
        if proc is None:
            with open(path, "ab") as log:
                proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def pause(self, seconds: float) -> None:
        """Wait ``seconds``, or less when a forked crawl ends (its status arrives)."""
        if self.forks is not None:
            self.forks.read(timeout=seconds)
        else:
            time.sleep(seconds)

    def _forward(self) -> None:
        # Once: a crawl that also got the signal itself (``scancel --full``) would take
        # a second one as an order to stop at once.
        if self.stop_signals and not self._forwarded:
            self._forwarded = True
            for proc in self.procs:
                if proc.poll() is None and proc.pid not in self.stopping_pids:
                    proc.send_signal(signal.SIGTERM)

    def ship(self, only: set[int] | None = None) -> bool:
        """Ship each crawl's work (those in ``only``), but not again that of a crawl
        that ended and was shipped since: each ships once more when it ends, so the
        task's last shipment is only the last crawls'."""
        ok = True
        for k, shipper in enumerate(self.shippers):
            if k in self.settled or (only is not None and k not in only):
                continue
            try:
                done = shipper.ship()
            except Exception as exc:  # shared storage: log, retry next time
                logger.error("Shipping %s failed: %s", shipper.name, exc, exc_info=True)
                ok = False
                continue
            if self.ended(k):
                self.settled.add(k)
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
        self.open_fork_server()
        self.start()
        next_ship = time.monotonic() + self.config.ship_every
        while any(proc.poll() is None for proc in self.procs):
            self._forward()
            self.pause(0.5)
            ended = {k for k in range(len(self.procs)) if self.ended(k)} - self.settled
            if ended:  # shipped now, while the others crawl: not all at the end
                self.ship(ended)
            if time.monotonic() >= next_ship:
                self.ship()
                next_ship = time.monotonic() + self.config.ship_every
        self.close_fork_server()
        shipped = self.ship()
        return self.status(shipped)

    def ended(self, k: int) -> bool:
        """Whether crawl process k has ended (and has no crawl running)."""
        return k < len(self.procs) and self.procs[k].poll() is not None

    def status(self, shipped: bool) -> int:
        codes = [proc.returncode for proc in self.procs]
        logger.info("Crawl exit statuses: %s", codes)
        if not shipped or any(c not in (EXIT_FINISHED, EXIT_INTERRUPTED) and c >= 0 for c in codes):
            return EXIT_FAILED
        if any(c != EXIT_FINISHED for c in codes):
            return EXIT_INTERRUPTED  # stopped, or killed by a signal: resume
        return EXIT_FINISHED
