"""The storage core: archive + catalog written in the order that makes them crash-safe.

:class:`Store` does the work in-process (no Scrapy needed). :class:`WriterProcess`
runs a Store in a child process fed through a pipe, so that gzip, fsync and SQLite
commits never run on the crawl's reactor thread and use another core.

The ordering: a catalog row is committed only after the record it points at is
flushed and fsynced (the batch writer's ``before_commit`` hook), and an archive file
is renamed to its closed name only after the rows pointing into it are committed.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import fcntl
import io
import logging
import multiprocessing
import operator
import os
import pickle
import resource
import signal
import struct
import time
import traceback
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
from crawler.ziparchive import ZipArchiveWriter, repair_open_zip

logger = logging.getLogger(__name__)

CHECK_EVERY = 64
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
        (call it when idle)."""
        if self.batch.due() or not self.batch.pending:
            # With nothing pending this only restarts the clock, so that an idle writer
            # sleeps a full CATALOG_FLUSH_SECONDS between ticks instead of spinning.
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

# A message on the pipe: a header (length of the pickled message, length of the body),
# the message pickled with the fetch's body left out, then the body itself. Written with
# one writev, so the crawl never copies a body to send it; read into one buffer.
_FRAME = struct.Struct("!IQ")


# A fetch crosses as the tuple of its fields but the body: pickling a dataclass costs
# twice as much, and a copy of it without the body as much again.
_FETCH_FIELDS = tuple(f.name for f in dataclasses.fields(Fetch) if f.name != "body")
_fetch_values = operator.attrgetter(*_FETCH_FIELDS)


def _send_frame(fd: int, msg: tuple) -> None:
    body = b""
    if msg[0] in ("put", "touch"):
        body = msg[1].body
        msg = (msg[0], _fetch_values(msg[1]), *msg[2:])
    meta = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    parts = [_FRAME.pack(len(meta), len(body)), meta, body]
    total = _FRAME.size + len(meta) + len(body)
    sent = os.writev(fd, parts)
    if sent < total:
        # A signal cut a large write short: send the rest.
        rest = memoryview(b"".join(parts))[sent:]
        while rest:
            rest = rest[os.write(fd, rest) :]


class _FrameReader:
    def __init__(self, fd: int):
        self._file = io.FileIO(fd, "rb", closefd=False)

    def _read_into(self, view: memoryview) -> None:
        while view:
            n = self._file.readinto(view)
            if not n:
                raise EOFError
            view = view[n:]

    def recv(self) -> tuple:
        head = bytearray(_FRAME.size)
        self._read_into(memoryview(head))
        meta_len, body_len = _FRAME.unpack(head)
        meta = bytearray(meta_len)
        self._read_into(memoryview(meta))
        msg = pickle.loads(meta)
        body = b""
        if body_len:
            body = bytearray(body_len)
            self._read_into(memoryview(body))
        if msg[0] in ("put", "touch"):
            fetch = Fetch(**dict(zip(_FETCH_FIELDS, msg[1], strict=True)), body=body)
            msg = (msg[0], fetch, *msg[2:])
        return msg


def _yield_to_crawl() -> None:
    """Let the crawl have the CPU when both want it.

    The crawl is bound by its one thread; woken by every record, this process would
    otherwise preempt it on its core. As a batch task of lower priority it runs on a
    free core, or in the crawl's pauses, and the pipe absorbs the lag (a full pipe
    makes the crawl wait, which hands this process the CPU).
    """
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    with contextlib.suppress(OSError):
        os.nice(10)


def _serve(inbox, outbox, config: StoreConfig) -> None:
    """Main loop of the writer process."""
    # Signals are the crawl's to handle (Ctrl-C reaches the whole process group);
    # this process stops when the crawl closes the pipe, after committing.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    _yield_to_crawl()
    try:
        store = Store(config)
    except Exception as exc:
        outbox.send(("error", f"cannot open the store in {config.data_dir}: {exc}"))
        return
    outbox.send(("ready", None))
    reader = _FrameReader(inbox.fileno())
    try:
        while True:
            wait = max(0.0, config.flush_seconds - (time.monotonic() - store.batch._since))
            if not inbox.poll(wait):
                store.tick()
                continue
            try:
                msg = reader.recv()
            except EOFError:
                # The crawl died: keep what reached us (a message cut short is dropped).
                store.close()
                return
            op = msg[0]
            if op == "put":
                store.put(msg[1], msg[2])
            elif op == "touch":
                store.touch(msg[1], msg[2])
            elif op == "close":
                summary = store.close()
                usage = resource.getrusage(resource.RUSAGE_SELF)
                summary["cpu_seconds"] = usage.ru_utime + usage.ru_stime
                outbox.send(("closed", summary))
                return
    except OSError as exc:
        where = store.archive.path if store.archive.name else config.data_dir
        outbox.send(
            (
                "error",
                f"writing {where} failed: {exc.strerror or exc}; rows committed so far "
                "are intact, the next run repairs the archive and resumes",
            )
        )
    except Exception:
        outbox.send(("error", "the store failed:\n" + traceback.format_exc()))


class WriterProcess:
    """A :class:`Store` in a child process, fed through a bounded pipe.

    ``put`` blocks when the pipe is full (``queue_bytes``): that is the backpressure
    that keeps memory bounded when the disk is slower than the network.
    """

    def __init__(self, config: StoreConfig, queue_bytes: int = 1 << 20):
        self.config = config
        ctx = multiprocessing.get_context("spawn")
        recv_in, self._send = ctx.Pipe(duplex=False)
        self._recv, send_out = ctx.Pipe(duplex=False)
        for conn in (self._send, recv_in):
            # Past the system's limit the default pipe size still works.
            with contextlib.suppress(OSError):
                fcntl.fcntl(conn.fileno(), F_SETPIPE_SZ, queue_bytes)
        self._proc = ctx.Process(
            target=_serve, args=(recv_in, send_out, config), name="archive-writer"
        )
        self._proc.start()
        recv_in.close()
        send_out.close()
        self._fd = self._send.fileno()
        # On a forced exit, multiprocessing joins the writer at exit: close the pipe
        # first so that it commits what it holds and ends.
        atexit.register(self._send.close)
        self.error: str | None = None
        self.summary: dict | None = None
        self._sent = 0
        self._wait_ready()

    def _wait_ready(self) -> None:
        if not self._recv.poll(120):
            self._proc.kill()
            raise StoreError("the archive writer process did not start within 120 s")
        kind, payload = self._recv.recv()
        if kind == "error":
            self._proc.join()
            raise StoreError(payload)

    def _check(self) -> None:
        if self.error is None and self._recv.poll():
            try:
                kind, payload = self._recv.recv()
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
            _send_frame(self._fd, msg)
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
        return self._proc.is_alive()

    def close(self, timeout: float = 600) -> dict:
        """Drain the queue, commit, close the archive; returns the writer's summary."""
        if self.summary is not None:
            return self.summary
        try:
            if self.error is None:
                _send_frame(self._fd, ("close",))
            while self._recv.poll(timeout):
                kind, payload = self._recv.recv()
                if kind == "closed":
                    self.summary = payload
                    break
                if kind == "error":
                    self.error = payload
                    break
        except (EOFError, BrokenPipeError, OSError):
            pass
        finally:
            self._send.close()
            atexit.unregister(self._send.close)
            self._proc.join(timeout=30)
            if self._proc.is_alive():
                self._proc.kill()
        if self.summary is None:
            raise StoreError(self.error or "the archive writer process did not finish")
        return self.summary
