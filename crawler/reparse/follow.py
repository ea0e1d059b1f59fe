"""``scrapy reparse SPIDER --follow``: parse each page a running crawl commits.

A crawl appends every page whose row it commits to the page log (``_page_log``, in
the row's own transaction). The follower reads the log after its saved position,
parses those pages on every core, and writes their items together with its new
position (``_follow_progress``) in one transaction: stopped, restarted or killed, it
neither misses nor repeats a page. It stops on SIGINT/SIGTERM after the batch in
hand, or, with ``until_idle``, once the data directory is not locked by a crawl and
nothing new was logged for that many seconds.

Over a Slurm run's ``DATA/`` (it has ``catalogs/``, where tasks ship their catalogs:
slurm/ship.py), the follower reads the page log of every shipped catalog instead, as
each shipment replaces it, and writes the items and its position in each catalog
(``_follow_shipped``) into a database of its own (``items_db``): the merge job
rewrites ``DATA/metadata.db`` when the run ends. A shipment holds back the pages whose
archive file is not shipped yet and a later one brings them with their original log
numbers, so the position in a catalog is the highest number parsed and the numbers
below it not seen yet. ``until_idle`` then counts from the last new page shipped
(no lock tells that a Slurm run is over).
"""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from crawler.reparse.plan import ReparseConfig, Task, plan
from crawler.reparse.runner import (
    TABLES,
    Problem,
    Reparser,
    TaskResult,
    end_pool,
    run_in_worker,
    worker_pool,
)
from crawler.storage.bookmarks import FollowBookmarks
from crawler.storage.catalog import Catalog
from crawler.storage.datadir import DataDir
from crawler.storage.items import PAGE_LOG, ItemTableWriter

logger = logging.getLogger(__name__)

BATCH_PAGES = 1000
# Parses tasks, in a pool of workers or in this process: their results, in order.
Parse = Callable[[list[Task]], Iterator[TaskResult]]


@dataclass
class FollowSummary:
    pages: int = 0
    items: int = 0
    batches: int = 0
    stats: Counter = field(default_factory=Counter)
    problems: list[Problem] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [
            f"Followed the crawl: {self.pages:,} pages parsed into {self.items:,} items "
            f"in {self.batches:,} batches",
            f"errors: {self.stats['reparse/errors/corrupt']:,} corrupt records, "
            f"{self.stats['reparse/errors/callback']:,} callback exceptions, "
            f"{self.stats['reparse/errors/item']:,} items not stored",
        ]


def shipped_mode(datadir: DataDir) -> bool:
    """Whether ``datadir`` is a Slurm run's DATA/ (tasks ship catalogs into it)."""
    return datadir.shipped_dir.is_dir()


def default_items_db(datadir: DataDir) -> Path:
    """Where a follower of a Slurm DATA/ writes items unless told (``--items-db``)."""
    return datadir.derived_dir / "items.db"


def unseen(log: list[tuple[int, str]], seq: int, gaps: set[int], limit: int):
    """The entries of a page log (in order) not parsed yet, at most ``limit``, and the
    position and gaps once they are: numbers below the new position absent from this
    log may come with a later shipment."""
    todo = [entry for entry in log if entry[0] > seq or entry[0] in gaps][:limit]
    if not todo:
        return todo, seq, gaps
    top = max(seq, todo[-1][0])
    present = {n for n, _ in log if n <= top}
    taken = {n for n, _ in todo}
    new_gaps = (gaps - taken) | {n for n in range(seq + 1, top + 1) if n not in present}
    return todo, top, new_gaps


class Follow:
    def __init__(
        self,
        config: ReparseConfig,
        until_idle: float | None = None,
        poll: float = 0.5,
        items_db: Path | None = None,
    ):
        self.config = config
        self.until_idle = until_idle
        self.poll = poll
        self.datadir = DataDir(config.data_dir)
        self.items_db = items_db
        self.stopping = False

    def stop(self, *_args) -> None:
        self.stopping = True

    def run(self) -> FollowSummary:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self.stop)
        config = self.config
        init = (config.spider, config.callback, config.spider_args, config.settings, TABLES)
        reparser = Reparser(*init)  # fails fast on a bad spider or callback
        self.workers = workers = config.worker_count
        summary = FollowSummary()
        shipped = self._wait_for_data()
        if shipped is None:
            return summary
        if shipped:
            self.items_db = Path(self.items_db or default_items_db(self.datadir))
            self.items_db.parent.mkdir(parents=True, exist_ok=True)
            logger.info("Following the catalogs shipped to %s", self.datadir.shipped_dir)
        writer = ItemTableWriter(self.items_db if shipped else self.datadir.catalog_path)
        # One worker parses in this process: no pool to start, nothing pickled.
        pool = None if workers == 1 else worker_pool(workers, reparser, init)
        parse = (
            partial(map, reparser.run_task) if pool is None else partial(pool.imap, run_in_worker)
        )
        finished = False
        try:
            if shipped:
                self._loop_shipped(writer, parse, summary)
            else:
                self._loop(writer, parse, summary)
            finished = not self.stopping
        finally:
            if pool is not None:
                end_pool(pool, finished)
            writer.close()
        return summary

    def _wait_for_data(self) -> bool | None:
        """Whether the data directory is a Slurm DATA/ (True) or a crawl's (False), once
        it shows which: a crawl creates its catalog as it starts, a Slurm task creates
        ``catalogs/`` at its first shipment. None: stopped, or idle, before that."""
        waiting_since = time.monotonic()
        while not self.stopping:
            if self.items_db is not None or shipped_mode(self.datadir):
                return True
            if self.datadir.catalog_path.exists():
                return False
            if self.until_idle is not None and time.monotonic() - waiting_since >= self.until_idle:
                return None
            time.sleep(self.poll)
        return None

    def _loop(self, writer: ItemTableWriter, parse: Parse, summary: FollowSummary) -> None:
        spider = self.config.spider
        marks = FollowBookmarks(writer.catalog.conn)
        position = marks.position(spider)
        logger.info("Following %s from page log position %d", self.datadir.root, position)
        idle_since = time.monotonic()
        ahead = None  # the next batch, (logged pages, results), handed to the workers
        while not self.stopping:
            if ahead is None:
                logged = writer.logged_rows(position, BATCH_PAGES)
                if not logged:
                    if self._idle_done(idle_since):
                        return
                    time.sleep(self.poll)
                    continue
                ahead = (logged, self._start(parse, logged))
            logged, results = ahead
            # The batch after this one goes to the workers before this one's items are
            # collected and written: they parse while the parent writes. It is written
            # only after this one, with its own position, or dropped if the loop ends.
            following = writer.logged_rows(logged[-1][0], BATCH_PAGES)
            ahead = (following, self._start(parse, following)) if following else None
            pages = self._collect(results, summary)
            position = logged[-1][0]
            mark = partial(marks.save, spider, position, len(logged))
            summary.items += writer.write(pages, then=mark)
            summary.pages += len(logged)
            summary.batches += 1
            idle_since = time.monotonic()

    def _idle_done(self, idle_since: float) -> bool:
        if self.until_idle is None:
            return False
        if not self.datadir.is_free():  # a crawl holds the data directory
            return False
        return time.monotonic() - idle_since >= self.until_idle

    def _start(self, parse: Parse, logged: list[tuple[int, str]]) -> Iterator[TaskResult]:
        """Hand one batch of logged pages to ``parse``; its results come in order."""
        with Catalog(self.datadir.catalog_path, readonly=True) as catalog:
            rows = rows_of(catalog, [key for _, key in logged])
        return parse(self._tasks(rows))

    def _tasks(self, rows: list) -> list[Task]:
        rows.sort(key=lambda row: (row.archive, row.offset))
        tasks = list(plan(rows, self.datadir.root, self.config.chunk_rows, self.workers, len(rows)))
        for task in tasks:
            # A file still written to has its .open name.
            task.path = str(self.datadir.resolve(os.path.relpath(task.path, self.datadir.root)))
        return tasks

    def _collect(self, results: Iterator[TaskResult], summary: FollowSummary) -> list:
        pages = []
        for result in results:
            summary.stats.update(result.stats)
            for problem in result.problems:
                summary.problems.append(problem)
                logger.error("%s", problem.message)
            pages += result.pages
        return pages

    # -- a Slurm DATA/ -------------------------------------------------------------------

    def _loop_shipped(self, writer: ItemTableWriter, parse: Parse, summary: FollowSummary) -> None:
        spider = self.config.spider
        marks = FollowBookmarks(writer.catalog.conn)
        positions = marks.shipped_positions(spider)
        # A catalog's file as last read with nothing new in it: not read again until a
        # shipment replaces it.
        done: dict[str, tuple] = {}
        idle_since = time.monotonic()
        while not self.stopping:
            found = False
            for path in self.datadir.shipped_catalogs():
                if self.stopping:
                    return
                name = path.stem
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue
                version = (st.st_ino, st.st_mtime_ns, st.st_size)
                if done.get(name) == version:
                    continue
                seq, gaps = positions.get(name, (0, set()))
                got = self._read_shipped(path, seq, gaps)
                if got is None:
                    done[name] = version
                    continue
                rows, read, seq, gaps = got
                pages = self._collect(parse(self._tasks(rows)), summary)
                mark = partial(marks.save_shipped, spider, name, seq, gaps, read)
                summary.items += writer.write(pages, then=mark)
                positions[name] = (seq, gaps)
                summary.pages += read
                summary.batches += 1
                found = True
            if found:
                idle_since = time.monotonic()
                continue
            if self.until_idle is not None and time.monotonic() - idle_since >= self.until_idle:
                return
            time.sleep(self.poll)

    def _read_shipped(self, path: Path, seq: int, gaps: set[int]):
        """(rows, pages, position, gaps) of the next batch of a shipped catalog, or None.

        The log and the rows are read from one open file: a shipment replaces the
        catalog by a rename, and this connection keeps the version it opened.
        """
        try:
            catalog = Catalog(path, readonly=True)
        except (sqlite3.Error, OSError) as exc:
            logger.warning("Shipped catalog %s not readable yet: %s", path, exc)
            return None
        with catalog:
            try:
                low = min(gaps) - 1 if gaps else seq
                log = catalog.conn.execute(
                    f"SELECT seq, _key FROM {PAGE_LOG} WHERE seq > ? ORDER BY seq", (low,)
                ).fetchall()
            except sqlite3.OperationalError:
                return None  # no page log: nothing committed with items yet
            todo, seq, gaps = unseen(log, seq, gaps, BATCH_PAGES)
            if not todo:
                return None
            rows = rows_of(catalog, [key for _, key in todo])
        return rows, len(todo), seq, gaps


def rows_of(catalog: Catalog, keys: list[str]) -> list:
    rows = []
    for i in range(0, len(keys), 500):
        chunk = keys[i : i + 500]
        rows += catalog.rows(f"key IN ({', '.join('?' * len(chunk))})", chunk)
    return rows
