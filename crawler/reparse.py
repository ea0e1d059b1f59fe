"""Re-parse: run a spider's callback over stored responses, on every core.

The catalog selects the rows (``--where``, ``--limit``, ``--archive``); rows are
grouped by archive file and cut into byte ranges (:func:`plan`); a pool of worker
processes reads each range with one read, rebuilds each response and runs the
callback; the parent writes all items through one :class:`~crawler.feeds.ItemFileWriter`.
Nothing is fetched: requests the callback yields are counted and dropped.
"""

from __future__ import annotations

import glob
import inspect
import io
import logging
import multiprocessing
import os
import sqlite3
import sys
import time
import zlib
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from itemadapter import is_item
from scrapy import Request

from crawler.archive import (
    KEY_HEADER,
    ArchiveError,
    StoredRecord,
    TruncatedRecordError,
    conversion_record,
    is_zip,
    parse_record,
    stored_record,
)
from crawler.catalog import Catalog, Row
from crawler.feeds import ItemFileWriter
from crawler.responses import build_response

logger = logging.getLogger(__name__)

CHUNK_ROWS = 200
CHUNK_BYTES = 16 << 20


class ReparseError(Exception):
    """The re-parse cannot start (bad spider, callback, selection or output)."""


@dataclass
class ReparseConfig:
    spider: str
    data_dir: Path
    archive_glob: str | None = None
    callback: str = "parse"
    output: Path | None = None
    workers: int = 0  # 0: every core
    where: str | None = None
    limit: int | None = None
    spider_args: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    chunk_rows: int = CHUNK_ROWS  # records per task (a byte range of one file)

    @property
    def worker_count(self) -> int:
        if self.workers > 0:
            return self.workers
        # The cores this process may run on (a batch scheduler's share), not the machine's.
        affinity = getattr(os, "sched_getaffinity", None)
        return len(affinity(0)) if affinity else (os.cpu_count() or 1)


@dataclass
class Task:
    """A byte range of one archive file and the catalog rows inside it."""

    path: str
    rows: list[tuple]  # (key, url, final_url, method, fetched_at, offset, length)

    @property
    def start(self) -> int:
        return self.rows[0][5]

    @property
    def end(self) -> int:
        return self.rows[-1][5] + self.rows[-1][6]


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
    def exit_code(self) -> int:
        return 1 if self.skipped or self.callback_errors else 0

    def lines(self) -> list[str]:
        rate = self.records / self.seconds if self.seconds else 0.0
        out = [
            f"Re-parsed {self.records:,} records into {self.items:,} items "
            f"in {self.seconds:.1f} s ({rate:,.0f} pages/s)",
            f"requests ignored: {self.stats['reparse/requests_ignored']:,}; "
            f"responses not passed to the callback for their status (as in a crawl): "
            f"{self.stats['reparse/filtered_status']:,}",
            f"errors: {self.skipped:,} corrupt or truncated records skipped, "
            f"{self.callback_errors:,} callback exceptions",
        ]
        if self.output is not None:
            out.append(f"output: {self.output}")
        return out


# -- planning ---------------------------------------------------------------------------


def archive_files(data_dir: Path, pattern: str | None) -> set[str]:
    """Relative paths (to ``data_dir``) of the closed archives that ``pattern`` names."""
    if pattern is None:
        found = [*data_dir.glob("archive/*.warc.gz"), *data_dir.glob("archive/*.zip")]
    else:
        base = pattern if os.path.isabs(pattern) else None
        found = [Path(p) for p in glob.glob(base or str(data_dir / pattern))]
        if not found and base is None:
            found = [Path(p) for p in glob.glob(pattern)]
    return {os.path.relpath(p.resolve(), data_dir.resolve()) for p in found if p.is_file()}


class Selection:
    """The catalog rows a re-parse reads, streamed in archive and offset order."""

    # SQLite binds at most 32,766 parameters; past that the archive filter runs here
    # (and --limit and the progress total then count rows of every archive).
    MAX_BOUND_FILES = 30_000

    def __init__(self, config: ReparseConfig):
        self.catalog_path = config.data_dir / "metadata.db"
        self.files = sorted(archive_files(config.data_dir, config.archive_glob))
        self.user_where = config.where
        self.limit = config.limit
        where = f"({config.where})" if config.where else "1"
        self.params: list[str] = []
        if len(self.files) <= self.MAX_BOUND_FILES:
            where += f" AND archive IN ({','.join('?' * len(self.files))})"
            self.params = list(self.files)
        self.where = where

    def _query(self, catalog: Catalog, sql: str, params=()):
        try:
            return catalog.conn.execute(sql, params)
        except sqlite3.Error as exc:
            raise ReparseError(f"--where {self.user_where!r}: {exc}") from exc

    def count(self) -> int:
        if not self.files:
            return 0
        limit = f" LIMIT {int(self.limit)}" if self.limit is not None else ""
        sql = f"SELECT count(*) FROM (SELECT 1 FROM artifacts WHERE {self.where}{limit})"
        with Catalog(self.catalog_path, readonly=True) as catalog:
            return self._query(catalog, sql, self.params).fetchone()[0]

    def __iter__(self) -> Iterator[Row]:
        if not self.files:
            return
        files = set(self.files)
        sql = f'{self.where} ORDER BY archive, "offset"'
        if self.limit is not None:
            sql += f" LIMIT {int(self.limit)}"
        with Catalog(self.catalog_path, readonly=True) as catalog:
            for row in catalog.rows(sql, self.params):
                if row.archive in files:
                    yield row


def select_rows(config: ReparseConfig) -> Selection:
    return Selection(config)


def plan(rows: Iterable[Row], data_dir: Path, chunk_rows: int = CHUNK_ROWS) -> Iterator[Task]:
    """Cut rows (sorted by archive and offset) into byte ranges of one file each."""
    current: Task | None = None
    for row in rows:
        path = str(data_dir / row.archive)
        entry = (
            row.key,
            row.url,
            row.final_url,
            row.method,
            row.fetched_at,
            row.offset,
            row.length,
        )
        if current is not None and (
            current.path != path
            or len(current.rows) >= chunk_rows
            or row.offset + row.length - current.start > CHUNK_BYTES
        ):
            yield current
            current = None
        if current is None:
            current = Task(path, [])
        current.rows.append(entry)
    if current is not None:
        yield current


# -- reading records ----------------------------------------------------------------------


def decode_warc_member(data: bytes, path: str, offset: int) -> StoredRecord:
    """A stored response from one gzip member of a WARC (FastWARC parses it)."""
    where = f"{path}: offset {offset}"
    try:
        raw = zlib.decompress(data, 31)
    except zlib.error as exc:
        kind = TruncatedRecordError if "incomplete" in str(exc) else ArchiveError
        raise kind(f"{where}: corrupt or truncated gzip member ({exc})") from exc
    return _parse_warc(raw, where)


def _parse_warc(raw: bytes, where: str) -> StoredRecord:
    try:
        from fastwarc.warc import ArchiveIterator
    except ImportError:  # pragma: no cover - fastwarc is in requirements.txt
        record, body = parse_record(raw)
        return stored_record(record, body)
    for record in ArchiveIterator(
        io.BytesIO(raw), parse_http=True, stream_detect=False, fsspec_args=False
    ):
        http = record.http_headers
        if http is None and record.headers.get("WARC-Type") == "conversion":
            return conversion_record(list(record.headers.astuples()), record.reader.read())
        if http is None:
            raise ArchiveError(f"{where}: record has no HTTP headers")
        return StoredRecord(
            url=record.headers.get("WARC-Target-URI"),
            status=http.status_code,
            headers=list(http.astuples()),
            body=record.reader.read(),
            warc_headers=list(record.headers.astuples()),
        )
    raise ArchiveError(f"{where}: not a WARC record")


def decode(data: bytes, path: str, offset: int) -> StoredRecord:
    if is_zip(path):
        from crawler.ziparchive import decode_entry

        return decode_entry(data, path, offset)
    return decode_warc_member(data, path, offset)


# -- the worker ---------------------------------------------------------------------------


class Reparser:
    """One process's spider and callback; :meth:`run_task` parses one byte range."""

    def __init__(self, spider_name: str, callback: str, spider_args: dict, settings: dict):
        self.spider = make_spider(spider_name, spider_args, settings)
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
        try:
            with open(task.path, "rb") as f:
                f.seek(task.start)
                data = f.read(task.end - task.start)
        except OSError as exc:
            for row in task.rows:
                problems.append(Problem("corrupt", f"{task.path}: offset {row[5]}: {exc}"))
            stats["reparse/errors/corrupt"] += len(task.rows)
            return TaskResult(items, stats, problems, len(task.rows))
        for key, url, _final_url, method, fetched_at, offset, length in task.rows:
            start = offset - task.start
            chunk = data[start : start + length]
            try:
                if len(chunk) < length:
                    raise TruncatedRecordError(
                        f"{task.path}: offset {offset}: file ends inside the record"
                    )
                stored = decode(chunk, task.path, offset)
                found = dict(stored.warc_headers).get(KEY_HEADER)
                if found != key:
                    raise ArchiveError(
                        f"{task.path}: offset {offset}: record of key {found}, not {key}"
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
            self._run_callback(response, key, url, items, stats, problems)
        return TaskResult(items, stats, problems, len(task.rows))

    def _run_callback(self, response, key, url, items, stats, problems) -> None:
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


def _init_worker(spider_name, callback, spider_args, settings) -> None:
    global _worker
    logging.getLogger("scrapy").setLevel(logging.WARNING)
    _worker = Reparser(spider_name, callback, spider_args, settings)


def _run_in_worker(task: Task) -> TaskResult:
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
        selection = select_rows(config)
        total = selection.count()
        tasks = plan(selection, config.data_dir, config.chunk_rows)
        summary = Summary()
        writer = ItemFileWriter(config.output) if config.output else None
        progress = Progress(total, self.progress_stream)
        done = 0
        try:
            for result in self._results(tasks, total):
                done += result.records
                summary.stats.update(result.stats)
                for problem in result.problems:
                    summary.problems.append(problem)
                    logger.error("%s", problem.message)
                if writer is not None:
                    for item in result.items:
                        writer.write(item)
                summary.items += len(result.items)
                errors = summary.skipped + summary.callback_errors
                progress.update(done, errors)
            progress.update(done, summary.skipped + summary.callback_errors, final=True)
        except BaseException:
            if writer is not None:
                writer.abort()
            raise
        if writer is not None:
            summary.output = writer.close()
        summary.records = summary.stats["reparse/records"]
        summary.seconds = time.monotonic() - started
        summary.stats["reparse/seconds"] = round(summary.seconds, 3)
        return summary

    def _results(self, tasks: Iterator[Task], total: int) -> Iterator[TaskResult]:
        config = self.config
        init = (config.spider, config.callback, config.spider_args, config.settings)
        workers = max(1, min(config.worker_count, -(-total // config.chunk_rows)))
        if workers == 1:
            reparser = Reparser(*init)
            for task in tasks:
                yield reparser.run_task(task)
            return
        Reparser(*init)  # fail fast on a bad spider or callback, before any process starts
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(workers, initializer=_init_worker, initargs=init) as pool:
            # A few tasks in flight per worker: memory stays bounded, results in order.
            pending: deque = deque()
            for task in tasks:
                pending.append(pool.apply_async(_run_in_worker, (task,)))
                if len(pending) >= workers * 4:
                    yield pending.popleft().get()
            while pending:
                yield pending.popleft().get()
