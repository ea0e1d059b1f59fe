"""The storage core: archive + catalog written in the order that makes them crash-safe.

:class:`Store` does the work in-process (no Scrapy needed). :class:`WriterProcess`
runs a Store in a child process fed through a pipe and a ring of shared memory
(crawler/wire.py, crawler/writer.py), so that gzip, fsync and SQLite
commits never run on the crawl's reactor thread and use another core.

The ordering: a catalog row is committed only after the record it points at is
flushed and fsynced (the batch writer's ``before_commit`` hook), and an archive file
is renamed to its closed name only after the rows pointing into it are committed.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from crawler.actionlog import ActionLog
from crawler.archive import (
    OPEN_SUFFIX,
    ArchiveWriter,
    Fetch,
    Repair,
    header,
    repair_open_file,
    warc_date,
)
from crawler.catalog import BatchWriter, Catalog, Row
from crawler.wire import BodyRing, FrameReader, readable, send_frame
from crawler.ziparchive import ZipArchiveWriter, repair_open_zip

logger = logging.getLogger(__name__)

CHECK_EVERY = 64
# The folder holding the ``crawler`` package, for the writer process's import path.
_PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)
F_SETPIPE_SZ = 1031  # Linux; not exported by the fcntl module before Python 3.10 on all builds


class StoreError(Exception):
    """The store cannot go on (disk full, permissions, another writer...)."""


@dataclass
class StoreConfig:
    data_dir: Path
    prefix: str = "crawl"
    rollover_bytes: int = 1_000_000_000
    gzip_level: int = 1
    compressor: str = "isal"
    batch_size: int = 200
    flush_seconds: float = 5.0
    rollover_seconds: float = 0.0
    format: str = "warc"  # or "zip" (crawler/ziparchive.py)

    @property
    def catalog_path(self) -> Path:
        return self.data_dir / "metadata.db"

    @property
    def archive_dir(self) -> Path:
        return self.data_dir / "archive"

    @property
    def action_log_path(self) -> Path:
        return self.data_dir / "fetch_log.jsonl"

    @property
    def lock_path(self) -> Path:
        return self.data_dir / ".lock"


@dataclass
class Recovery:
    repairs: list[Repair] = field(default_factory=list)
    indexed_rows: int = 0


class DataDirLock:
    """An exclusive lock on a data directory: one crawl writes it at a time."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
            os.close(fd)
            raise StoreError(
                f"{self.path.parent} is in use by another crawl (pid {holder or '?'}); "
                "wait for it or use another DATA_DIR"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def recover(config: StoreConfig) -> Recovery:
    """Repair archives left open by a killed run and index what the catalog lacks.

    Call it with the data directory locked and no writer running.
    """
    result = Recovery()
    if not config.archive_dir.is_dir():
        return result
    open_files = sorted(
        [
            *config.archive_dir.glob("*.warc.gz" + OPEN_SUFFIX),
            *config.archive_dir.glob("*.zip" + OPEN_SUFFIX),
        ]
    )
    if not open_files:
        return result
    with Catalog(config.catalog_path) as catalog:
        for path in open_files:
            repair_fn = (
                repair_open_zip if path.name.endswith(".zip" + OPEN_SUFFIX) else repair_open_file
            )
            repair = repair_fn(path, config.data_dir)
            result.repairs.append(repair)
            result.indexed_rows += index_missing(
                catalog, repair.indexed.rows, repair.indexed.touches
            )
    return result


def index_missing(catalog: Catalog, rows: list[Row], touches: list) -> int:
    """UPSERT rows the catalog lacks or holds an older fetch of; apply newer 304s."""
    added = 0
    with catalog.writer(batch_size=1000) as batch:
        for row in rows:
            have = catalog.get(row.key)
            if have is None or have.fetched_at < row.fetched_at:
                batch.upsert(row)
                added += 1
        for key, etag, last_modified, fetched_at in touches:
            have = catalog.get(key)
            if have is not None and have.fetched_at < fetched_at:
                batch.touch(key, etag, last_modified, fetched_at)
    return added


class Store:
    """Writes fetches to the archive and their rows to the catalog, in that order."""

    def __init__(self, config: StoreConfig):
        self.config = config
        self.catalog = Catalog(config.catalog_path)
        common = dict(
            prefix=config.prefix,
            rollover_bytes=config.rollover_bytes,
            rollover_seconds=config.rollover_seconds,
        )
        if config.format == "zip":
            self.archive = ZipArchiveWriter(config.archive_dir, config.data_dir, **common)
        else:
            self.archive = ArchiveWriter(
                config.archive_dir,
                config.data_dir,
                gzip_level=config.gzip_level,
                compressor=config.compressor,
                **common,
            )
        self.batch = BatchWriter(
            self.catalog.conn,
            batch_size=config.batch_size,
            flush_seconds=config.flush_seconds,
            before_commit=self.archive.flush,
        )
        self.stored = 0
        self.refreshed = 0
        self.bytes = 0
        self._log: ActionLog | None = None

    def put(self, fetch: Fetch, action: dict | None = None) -> Row:
        """Store a fetch; ``action``: its action-log line (ActionLog.write's arguments),
        written here once the records are, to spare the crawl's thread the work."""
        row = self.archive.write_fetch(fetch)
        if action is not None:
            if self._log is None:
                self._log = ActionLog(self.config.action_log_path)
            self._log.write(**action)
        self.batch.upsert(row)
        self.stored += 1
        self.bytes += row.bytes
        self._maybe_roll()
        return row

    def touch(self, fetch: Fetch, refers_to_date: str | None = None) -> None:
        """A 304: refresh validators and time; no new body."""
        self.archive.write_revisit(fetch, refers_to_date)
        self.batch.touch(
            fetch.key,
            header(fetch.response_headers, "ETag"),
            header(fetch.response_headers, "Last-Modified"),
            warc_date(fetch.fetched_at),
        )
        self.refreshed += 1
        self._maybe_roll()

    def _maybe_roll(self) -> None:
        if self.archive.needs_rollover():
            self.batch.flush()
            self.archive.close()

    def tick(self) -> None:
        """Commit a batch whose time is up, and roll over a file whose time is up
        (call it whenever idle: it costs nothing when there is nothing to do)."""
        if self.batch.due() or not self.batch.pending:
            # With nothing pending this only restarts the clock: the first row after
            # a pause waits at most CATALOG_FLUSH_SECONDS for its commit.
            self.batch.flush()
        self._maybe_roll()

    def close(self) -> dict:
        self.batch.flush()
        self.archive.close()
        self.catalog.close()
        if self._log is not None:
            self._log.close()
        return {
            "stored": self.stored,
            "refreshed": self.refreshed,
            "bytes": self.bytes,
            "rows_committed": self.batch.committed,
            "archives": [str(p) for p in self.archive.closed_files],
        }


# -- the writer process -----------------------------------------------------------------


class WriterProcess:
    """A :class:`Store` in a child process, fed through a bounded pipe.

    The process starts at construction and loads its modules while the crawl starts
    up; :meth:`open` (or a ``config`` given here) makes it open the store, once the
    data directory is recovered. Bodies cross in a shared ring of ``queue_bytes``
    and, when it is full, in the pipe (as large): ``put`` blocks when both are full.
    That is the backpressure that keeps memory bounded when the disk is slower than
    the network.
    """

    def __init__(self, config: StoreConfig | None = None, queue_bytes: int = 1 << 20):
        data_read, self._fd = os.pipe()
        reply_read, reply_write = os.pipe()
        # Past the system's limit the default pipe size still works.
        with contextlib.suppress(OSError):
            fcntl.fcntl(self._fd, F_SETPIPE_SZ, queue_bytes)
        self._ring = BodyRing.create(queue_bytes)
        ring_args = [str(self._ring.fd), str(self._ring.size)] if self._ring else []
        # A plain interpreter, not multiprocessing's spawn: that one re-imports the
        # crawl's main script (Scrapy and Twisted, ~0.4 s) in the child.
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PROJECT_ROOT, env.get("PYTHONPATH")]))
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "crawler.writer", str(data_read), str(reply_write)]
                + ring_args,
                pass_fds=(data_read, reply_write, *([self._ring.fd] if self._ring else [])),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        except BaseException:
            os.close(self._fd)
            os.close(reply_read)
            if self._ring is not None:
                self._ring.close()
            raise
        finally:
            os.close(data_read)
            os.close(reply_write)
        self._replies = FrameReader(reply_read)
        self.error: str | None = None
        self.summary: dict | None = None
        self.opened = False
        self._sent = 0
        if config is not None:
            self.open(config)

    def open(self, config: StoreConfig, timeout: float = 120) -> None:
        """Have the process open the store; raises :class:`StoreError` if it cannot."""
        try:
            send_frame(self._fd, ("open", config))
        except OSError:
            self._check()
            raise StoreError("the archive writer process exited before it started") from None
        if not readable(self._replies.fd, timeout):
            self._proc.kill()
            raise StoreError(f"the archive writer process did not start within {timeout:.0f} s")
        try:
            kind, payload = self._replies.recv()
        except EOFError:
            kind, payload = "error", "the archive writer process exited before it started"
        if kind == "error":
            self.error = payload
            self._end()
            raise StoreError(payload)
        self.opened = True

    def _check(self) -> None:
        if self.error is None and readable(self._replies.fd):
            try:
                kind, payload = self._replies.recv()
            except EOFError:
                kind, payload = "error", "the archive writer process exited unexpectedly"
            if kind == "error":
                self.error = payload
        if self.error is not None:
            raise StoreError(self.error)

    def _send_msg(self, msg) -> None:
        # An error is looked for every CHECK_EVERY messages (a poll is a system call);
        # a writer that died meanwhile makes the send itself fail.
        self._sent += 1
        if self._sent % CHECK_EVERY == 0 or self.error is not None:
            self._check()
        try:
            send_frame(self._fd, msg, self._ring)
        except (BrokenPipeError, OSError):
            self._check()
            raise StoreError(
                self.error or "the archive writer process exited unexpectedly"
            ) from None

    def put(self, fetch: Fetch, action: dict | None = None) -> None:
        self._send_msg(("put", fetch, action))

    def touch(self, fetch: Fetch, refers_to_date: str | None = None) -> None:
        self._send_msg(("touch", fetch, refers_to_date))

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def close(self, timeout: float = 600) -> dict | None:
        """Drain the queue, commit, close the archive; returns the writer's summary.

        A process that never opened the store is just ended (None).
        """
        if self.summary is not None or self._fd is None:
            return self.summary
        if not self.opened:
            self._end()
            return None
        try:
            if self.error is None:
                send_frame(self._fd, ("close",))
            while readable(self._replies.fd, timeout):
                kind, payload = self._replies.recv()
                if kind == "closed":
                    self.summary = payload
                    break
                if kind == "error":
                    self.error = payload
                    break
        except (EOFError, BrokenPipeError, OSError):
            pass
        finally:
            self._end()
        if self.summary is None:
            raise StoreError(self.error or "the archive writer process did not finish")
        return self.summary

    def _end(self) -> None:
        """Close the pipes; the process, seeing the end of its input, exits."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._replies.fd is not None:
            os.close(self._replies.fd)
            self._replies.fd = None
        if self._ring is not None:
            self._ring.close()
            self._ring = None
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
