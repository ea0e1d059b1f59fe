"""Re-parse: run a spider's callback over stored responses, on every core.

A pool of worker processes reads each byte range of :func:`crawler.reparse.plan.plan`
with one read, rebuilds each response and runs the callback; the parent writes all
items through one :class:`~crawler.reparse.feeds.ItemFileWriter`. Nothing is fetched:
requests the callback yields are counted and dropped.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import multiprocessing
import signal
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from itemadapter import ItemAdapter, is_item
from scrapy import Request

from crawler.itemrows import ItemFieldError, dataclass_fields, item_row, item_values
from crawler.reparse.feeds import ItemFileWriter, takes_dicts
from crawler.reparse.plan import (
    ReparseConfig,
    ReparseError,
    Selection,
    Task,
    plan,
    select_rows,
)
from crawler.reparse.responses import build_response, release
from crawler.storage import formats
from crawler.storage.datadir import DataDir
from crawler.storage.errors import ArchiveError
from crawler.storage.items import ItemTableWriter, PageItems, parsed_at_now
from crawler.storage.records import as_answer

logger = logging.getLogger(__name__)


@dataclass
class Problem:
    kind: str  # "corrupt" or "callback"
    message: str


@dataclass
class TaskResult:
    items: list
    stats: Counter
    problems: list[Problem]
    records: int
    pages: list[PageItems] = field(default_factory=list)  # into the item tables


@dataclass
class Summary:
    records: int = 0
    items: int = 0
    seconds: float = 0.0
    stats: Counter = field(default_factory=Counter)
    problems: list[Problem] = field(default_factory=list)
    output: Path | None = None

    @property
    def skipped(self) -> int:
        return self.stats["reparse/errors/corrupt"]

    @property
    def callback_errors(self) -> int:
        return self.stats["reparse/errors/callback"]

    @property
    def item_errors(self) -> int:
        return self.stats["reparse/errors/item"]

    @property
    def missing_files(self) -> int:
        return self.stats["reparse/errors/missing_files"]

    @property
    def exit_code(self) -> int:
        failed = self.skipped or self.callback_errors or self.item_errors or self.missing_files
        return 1 if failed else 0

    def lines(self) -> list[str]:
        rate = self.records / self.seconds if self.seconds else 0.0
        out = [
            f"Re-parsed {self.records:,} records into {self.items:,} items "
            f"in {self.seconds:.1f} s ({rate:,.0f} pages/s)",
            f"requests ignored: {self.stats['reparse/requests_ignored']:,}; "
            f"responses not passed to the callback for their status (as in a crawl): "
            f"{self.stats['reparse/filtered_status']:,}",
            f"errors: {self.skipped:,} corrupt or truncated records skipped, "
            f"{self.callback_errors:,} callback exceptions, "
            f"{self.item_errors:,} items that could not be stored",
        ]
        if self.missing_files:
            out.append(f"archive files missing (their pages not parsed): {self.missing_files:,}")
        if self.output is not None:
            out.append(f"output: {self.output}")
        return out


# -- the worker ---------------------------------------------------------------------------

# What a worker hands the parent: the items as the callback yielded them (for Scrapy's
# exporters, which read field metadata), plain dicts (for parquet), or each page's rows
# for the item tables.
ITEMS, DICTS, TABLES = "items", "dicts", "tables"
_SCALARS = frozenset({str, int, float, bool, bytes, type(None)})


def plain(value):
    """``value`` with every item in it turned into a dict, as ``ItemAdapter.asdict()``
    does; scalars are returned as they are without asking every adapter about them."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    # Scalars in lists and dicts are taken without a call each: most values are.
    if kind is list:
        return [v if type(v) in _SCALARS else plain(v) for v in value]
    if kind is dict:
        return {k: v if type(v) in _SCALARS else plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return value.__class__(plain(v) for v in value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if dataclass_fields(kind) is not None:  # the project's items: no adapter per item
        return {k: plain(v) for k, v in item_values(value)}
    if isinstance(value, ItemAdapter):
        value = value.item
    if is_item(value):
        return {k: plain(v) for k, v in ItemAdapter(value).items()}
    return value


class Reparser:
    """One process's spider and callback; :meth:`run_task` parses one byte range."""

    def __init__(
        self,
        spider_name: str,
        callback: str,
        spider_args: dict,
        settings: dict,
        mode: str = ITEMS,
    ):
        self.spider = make_spider(spider_name, spider_args, settings)
        # Items become rows or dicts here, on the workers' cores; the parent only
        # writes them.
        self.tables = mode == TABLES
        self.dicts = mode == DICTS
        self._set_allowed_statuses()
        self.callback_name = callback
        self.callback = getattr(self.spider, callback, None)
        if not callable(self.callback):
            raise ReparseError(f"spider {spider_name!r} has no callback {callback!r}")

    def _set_allowed_statuses(self) -> None:
        # As HttpErrorMiddleware decides during a crawl: what it filters never reached
        # the callback then, so it does not now.
        settings = self.spider.crawler.settings
        self.allow_all = bool(
            getattr(self.spider, "handle_httpstatus_all", False)
            or settings.getbool("HTTPERROR_ALLOW_ALL")
        )
        self.allowed = set(
            getattr(self.spider, "handle_httpstatus_list", None)
            or settings.getlist("HTTPERROR_ALLOWED_CODES")
        )

    def reaches_callback(self, status: int) -> bool:
        return 200 <= status < 300 or self.allow_all or status in self.allowed

    def run_task(self, task: Task) -> TaskResult:
        stats: Counter = Counter()
        problems: list[Problem] = []
        items: list = []
        result = TaskResult(items, stats, problems, len(task.rows))
        fmt = formats.for_path(task.path)
        try:
            records = fmt.iter_span(task.path, [(row[5], row[6]) for row in task.rows])
        except OSError as exc:
            for row in task.rows:
                problems.append(Problem("corrupt", f"{task.path}: offset {row[5]}: {exc}"))
            stats["reparse/errors/corrupt"] += len(task.rows)
            return result
        for row, stored in zip(task.rows, records, strict=True):
            key, url, final_url, method, fetched_at, offset, _length, status, digest = row
            try:
                if isinstance(stored, ArchiveError):
                    raise stored
                # A row deduplicated against another URL's record: its own URL, status.
                stored = as_answer(stored, key, url, final_url, method, status, digest)
                if stored.key != key:
                    raise ArchiveError(
                        f"{task.path}: offset {offset}: record of key {stored.key}, not {key}"
                    )
            except ArchiveError as exc:
                stats["reparse/errors/corrupt"] += 1
                problems.append(Problem("corrupt", f"{exc} (url {url}); skipped"))
                continue
            stats["reparse/records"] += 1
            if not self.reaches_callback(stored.status):
                stats["reparse/filtered_status"] += 1
                continue
            meta = {
                "catalog_key": key,
                "catalog_url": url,
                "fetched_at": fetched_at,
                "reparse": True,
            }
            request = Request(url, method=method, meta=meta, dont_filter=True)
            response = build_response(stored, request, flags=["cached"])
            if not self.tables:
                if not self.dicts:
                    self._run_callback(response, key, url, items, stats, problems)
                    continue
                page_items = []
                self._run_callback(response, key, url, page_items, stats, problems)
                items += map(plain, page_items)
                continue
            page_items: list = []
            if self._run_callback(response, key, url, page_items, stats, problems):
                result.pages.append(self._page(key, url, page_items, stats, problems))
        return result

    def _page(self, key, url, items, stats, problems) -> PageItems:
        rows = []
        for item in items:
            try:
                rows.append(item_row(item, self.spider.name))
            except ItemFieldError as exc:
                stats["reparse/errors/item"] += 1
                problems.append(Problem("item", exc.describe(self.spider.name, item, url)))
        parsed_at = parsed_at_now()
        return PageItems(key, self.spider.name, rows, parsed_at, replace=True)

    def _run_callback(self, response, key, url, items, stats, problems) -> bool:
        """Run the callback; False when it raised (its page's stored items are kept)."""
        try:
            for out in iterate(self.callback(response)):
                if isinstance(out, Request):
                    stats["reparse/requests_ignored"] += 1
                elif is_item(out):
                    items.append(out)  # pickled as it is; exporters read any item type
                    stats["reparse/items"] += 1
        except Exception as exc:
            stats["reparse/errors/callback"] += 1
            problems.append(
                Problem(
                    "callback",
                    f"{self.callback_name}() failed on {url} (key {key}): "
                    f"{type(exc).__name__}: {exc}",
                )
            )
            return False
        finally:
            release(response)
        return True


def iterate(result):
    if result is None:
        return ()
    if inspect.isgenerator(result) or isinstance(result, list | tuple):
        return result
    return (result,)


def make_spider(name: str, spider_args: dict, overrides: dict):
    """The project's spider ``name``, built as for a crawl but never started."""
    from scrapy.crawler import Crawler
    from scrapy.spiderloader import get_spider_loader
    from scrapy.statscollectors import MemoryStatsCollector
    from scrapy.utils.project import get_project_settings

    settings = get_project_settings()
    settings.setdict(overrides, priority="cmdline")
    # Tells a spider it is re-parsing stored pages: it may parse there what it
    # leaves out while crawling (the site spider's page summaries).
    settings.set("REPARSING", True, priority="cmdline")
    try:
        spidercls = get_spider_loader(settings).load(name)
    except KeyError:
        raise ReparseError(f"no spider named {name!r} in this project (scrapy list)") from None
    args = dict(spider_args)
    params = inspect.signature(spidercls.__init__).parameters
    if "urls" in params and "urls" not in args:
        args["urls"] = "-"  # the project's list spiders: nothing is read from it here
    crawler = Crawler(spidercls, settings)
    crawler.stats = MemoryStatsCollector(crawler)
    return spidercls.from_crawler(crawler, **args)


_worker: Reparser | None = None


def quiet_worker() -> None:
    # A forked worker inherits the parent's handlers (Scrapy's, the reactor's), which
    # only log a SIGTERM: Pool.terminate() then waited forever on a worker blocked on
    # the task queue. Interrupts are the parent's to handle; it terminates the pool.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.getLogger("scrapy").setLevel(logging.WARNING)


def init_worker(spider_name, callback, spider_args, settings, mode) -> None:
    global _worker
    quiet_worker()
    _worker = Reparser(spider_name, callback, spider_args, settings, mode)


def run_in_worker(task: Task) -> TaskResult:
    return _worker.run_task(task)


# -- the run ------------------------------------------------------------------------------


class Progress:
    """A one-line progress bar on a terminal (records done/total, pages/s, ETA)."""

    def __init__(self, total: int, stream=None, interval: float = 0.2):
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.interval = interval
        self.started = time.monotonic()
        self._last = 0.0

    def line(self, done: int, errors: int) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = done / elapsed
        share = done / self.total if self.total else 1.0
        bar = "#" * int(share * 30)
        eta = str(timedelta(seconds=int((self.total - done) / rate))) if rate > 0 else "?"
        return (
            f"[{bar:<30}] {done:,}/{self.total:,} ({share:.0%}) {rate:,.0f} pages/s "
            f"{errors:,} errors ETA {eta}"
        )

    def update(self, done: int, errors: int, final: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if final or now - self._last >= self.interval:
            self._last = now
            self.stream.write("\r" + self.line(done, errors) + ("\n" if final else ""))
            self.stream.flush()


class Reparse:
    """Runs a re-parse from a :class:`ReparseConfig`; :meth:`run` returns a Summary."""

    def __init__(self, config: ReparseConfig, progress_stream=None):
        self.config = config
        self.progress_stream = progress_stream

    def run(self) -> Summary:
        config = self.config
        started = time.monotonic()
        output = config.output
        mode = TABLES if output is None else DICTS if takes_dicts(output) else ITEMS
        # Built before the catalog is read, as a follower builds it: a bad spider or
        # callback fails before any query (and a one-worker run went no slower for
        # it, the history of docs/benchmarks.md).
        init = (config.spider, config.callback, config.spider_args, config.settings, mode)
        reparser = Reparser(*init)
        selection = select_rows(config)
        total = selection.count()
        summary = Summary()
        missing = selection.missing_files()
        if missing:
            summary.stats["reparse/errors/missing_files"] = len(missing)
            shown = ", ".join(missing[:5]) + (
                f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            )
            problem = Problem(
                "missing",
                f"{len(missing)} archive files named by the catalog of {config.data_dir} are "
                f"missing: {shown}; their pages are not parsed (restore the files, or drop "
                "their rows with `scrapy catalog verify --fix`)",
            )
            summary.problems.append(problem)
            logger.error("%s", problem.message)
        writer = ItemFileWriter(output) if output else None
        tables = ItemTableWriter(DataDir(config.data_dir).catalog_path) if writer is None else None
        progress = Progress(total, self.progress_stream)
        done = 0
        try:
            for result in self._results(reparser, init, selection, total):
                done += result.records
                summary.stats.update(result.stats)
                for problem in result.problems:
                    summary.problems.append(problem)
                    logger.error("%s", problem.message)
                if writer is not None:
                    write = writer.write_dict if mode == DICTS else writer.write
                    for item in result.items:
                        write(item)
                    summary.items += len(result.items)
                else:
                    summary.items += tables.write(result.pages)
                errors = summary.skipped + summary.callback_errors
                progress.update(done, errors)
            progress.update(done, summary.skipped + summary.callback_errors, final=True)
        except BaseException:
            if writer is not None:
                writer.abort()
            raise
        finally:
            if tables is not None:
                tables.close()
        if writer is not None:
            summary.output = writer.close()
        summary.records = summary.stats["reparse/records"]
        summary.seconds = time.monotonic() - started
        summary.stats["reparse/seconds"] = round(summary.seconds, 3)
        return summary

    def _results(
        self, reparser: Reparser, init: tuple, selection: Selection, total: int
    ) -> Iterator[TaskResult]:
        config = self.config
        workers = max(1, min(config.worker_count, -(-total // config.chunk_rows)))
        tasks = plan(selection, config.data_dir, config.chunk_rows, workers, total)
        if workers == 1:
            for task in tasks:
                yield reparser.run_task(task)
            return
        pool = worker_pool(workers, reparser, init)
        finished = False
        try:
            # A few tasks in flight per worker: memory stays bounded, results in order.
            pending: deque = deque()
            for task in tasks:
                pending.append(pool.apply_async(run_in_worker, (task,)))
                if len(pending) >= workers * 4:
                    yield pending.popleft().get()
            while pending:
                yield pending.popleft().get()
            finished = True
        finally:
            end_pool(pool, finished)


# A terminated worker that has not ended after this long is killed.
TERMINATE_WAIT = 5.0


def end_pool(pool, finished: bool) -> None:
    """Let a pool's workers end: those of a finished run exit on their own once told
    there is no more work (``close``); ``terminate`` only for a run cut short (an
    error, an interrupt). Terminating idle workers raced with them on the task queue's
    lock, and once in a few thousand pools the parent waited forever. A worker that
    outlives ``terminate`` (its SIGTERM came before it could act on one) is killed
    after ``TERMINATE_WAIT`` seconds rather than waited for. A worker ended while it
    handed over a result leaves the result queue's lock taken for good, and the pool's
    own threads wait for it forever: the parent waits for them no longer than
    ``TERMINATE_WAIT`` more, and leaves them (daemon threads) to its exit."""
    if finished:
        pool.close()
        pool.join()
        return
    workers = list(getattr(pool, "_pool", ()))
    stragglers = threading.Timer(TERMINATE_WAIT, _kill, (workers,))
    stragglers.daemon = True
    stragglers.start()
    ending = threading.Thread(target=_terminate, args=(pool,), daemon=True)
    try:
        ending.start()
        ending.join(2 * TERMINATE_WAIT)
    finally:
        stragglers.cancel()
    if ending.is_alive():
        logger.warning("Re-parse pool's threads did not end (a worker ended holding a lock)")


def _terminate(pool) -> None:
    pool.terminate()
    pool.join()


def _kill(workers) -> None:
    for worker in workers:
        if worker.exitcode is None:
            logger.warning("Re-parse worker %s did not end when told: killing it", worker.pid)
            with contextlib.suppress(OSError):
                worker.kill()


def worker_pool(workers: int, reparser: Reparser, init: tuple):
    """A pool of ``workers`` processes running ``reparser`` (built from ``init``)."""
    if "fork" in multiprocessing.get_all_start_methods():
        # Forked workers start with this spider built and Scrapy imported: spawned
        # ones spent ~1 s of CPU each on that, which kept two workers near the
        # speed of one on a few thousand pages. Nothing the parent holds open
        # (catalog connections) is used in a worker.
        global _worker
        _worker = reparser
        # The workers are forked with SIGTERM's default action: until their initializer
        # runs they would otherwise have the parent's handler, which only logs it, and a
        # pool terminated that early waited for them.
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, signal.SIG_DFL) if main else None
        try:
            return multiprocessing.get_context("fork").Pool(workers, initializer=quiet_worker)
        finally:
            if main:
                signal.signal(signal.SIGTERM, previous)
    # Spawned workers start with SIGINT ignored: the parent handles it and ends the pool.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return multiprocessing.get_context("spawn").Pool(
            workers, initializer=init_worker, initargs=init
        )
    finally:
        signal.signal(signal.SIGINT, previous)
