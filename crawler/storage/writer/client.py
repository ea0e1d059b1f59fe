"""The crawl's side of the archive writer process.

:class:`WriterProcess` starts ``python -m crawler.storage.writer.server`` and sends it
fetches through a pipe and a ring of shared memory (:mod:`~crawler.storage.writer.wire`),
so that compression, fsync and SQLite commits never run on the crawl's thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from crawler.storage.errors import StoreError
from crawler.storage.items import PageItems
from crawler.storage.records import Fetch, Row
from crawler.storage.store import StoreConfig
from crawler.storage.writer.wire import BodyRing, FrameReader, readable, send_frame

CHECK_EVERY = 64
# The folder holding the ``crawler`` package, for the writer process's import path.
_PROJECT_ROOT = str(Path(__file__).resolve().parents[3])
F_SETPIPE_SZ = 1031  # Linux; not exported by the fcntl module before Python 3.10 on all builds
SERVER = "crawler.storage.writer.server"


class WriterProcess:
    """A :class:`Store` in a child process, fed through a bounded pipe.

    The process starts at construction and loads its modules while the crawl starts
    up; :meth:`open` (or a ``config`` given here) makes it open the store, once the
    data directory is recovered. Bodies cross in a shared ring of ``queue_bytes``
    and, when it is full, in the pipe (as large): ``put`` blocks when both are full.
    That is the backpressure that keeps memory bounded when the disk is slower than
    the network.
    """

    def __init__(
        self,
        config: StoreConfig | None = None,
        queue_bytes: int = 1 << 20,
        on_commit: Callable[[], None] | None = None,
    ):
        data_read, self._fd = os.pipe()
        reply_read, reply_write = os.pipe()
        # Past the system's limit the default pipe size still works.
        with contextlib.suppress(OSError):
            fcntl.fcntl(self._fd, F_SETPIPE_SZ, queue_bytes)
        self._ring = BodyRing.create(queue_bytes)
        self._ring_sent = 0
        ring_args = [str(self._ring.fd), str(self._ring.size)] if self._ring else []
        # A plain interpreter, not multiprocessing's spawn: that one re-imports the
        # crawl's main script (Scrapy and Twisted) in the child, which would then be
        # ready long after the crawl is.
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PROJECT_ROOT, env.get("PYTHONPATH")]))
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", SERVER, str(data_read), str(reply_write)] + ring_args,
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
        # Called for each commit the writer reports (it reports them only then).
        self.on_commit = on_commit
        # Rows committed, as the writer last reported (with on_commit only): what a
        # run stored when the writer failed before its summary.
        self.rows_committed = 0
        # Fetches put with their key's stored row that the writer found unchanged (kept
        # as revisits of it), and their bytes, as last reported (or summed up).
        self.unchanged = (0, 0)
        self.error: str | None = None
        self.summary: dict | None = None
        self.opened = False
        self._sent = 0
        if config is not None:
            self.open(config)

    def open(self, config: StoreConfig, timeout: float = 120) -> None:
        """Have the process open the store; raises :class:`StoreError` if it cannot."""
        try:
            send_frame(self._fd, ("open", config, self.on_commit is not None))
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

    @property
    def reply_fd(self) -> int | None:
        """The pipe the process answers on (readable: call :meth:`check`)."""
        return self._replies.fd

    def _check(self) -> None:
        while self.error is None and self._replies.fd is not None and readable(self._replies.fd):
            try:
                kind, payload = self._replies.recv()
            except EOFError:
                kind, payload = "error", "the archive writer process exited unexpectedly"
            if kind == "error":
                self.error = payload
            elif kind == "committed" and self.on_commit is not None:
                self.rows_committed, *unchanged = payload
                self.unchanged = tuple(unchanged)
                self.on_commit()
        if self.error is not None:
            raise StoreError(self.error)

    def check(self) -> None:
        """Raise :class:`StoreError` if the process failed or is gone (a poll, cheap
        enough for a timer of the crawl's)."""
        if self._fd is None or self.summary is not None:
            return
        self._check()
        if not self.alive:
            self.error = f"the archive writer process exited unexpectedly ({self._proc.returncode})"
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

    def put(self, fetch: Fetch, action: dict | None = None, stored: Row | None = None) -> None:
        self._send_msg(("put", fetch, action, stored))

    def touch(self, fetch: Fetch, refers_to_date: str | None = None) -> None:
        self._send_msg(("touch", fetch, refers_to_date))

    def page_items(self, page: PageItems) -> None:
        """A page's items, committed with its row (StoreConfig.items)."""
        self._send_msg(("items", page.to_wire()))

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    @property
    def ring_bytes(self) -> int:
        """Bytes of bodies sent through the shared ring so far (0 without a ring)."""
        return self._ring.head if self._ring is not None else self._ring_sent

    def abandon(self) -> None:
        """What the writer sees when the crawl is killed, for crash tests: its pipes
        close unannounced, and it commits what reached it and exits (waited for here)."""
        if self._fd is None:
            return
        self.summary = {}
        self._end()

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
                    self.unchanged = (payload["unchanged"], payload["unchanged_bytes"])
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
            self._ring_sent = self._ring.head
            self._ring.close()
            self._ring = None
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


class ReplyWatcher:
    """A writer's reply pipe for an event loop (Twisted's ``IReadDescriptor``:
    ``reactor.addReader``), which calls ``on_readable`` when the writer has answered."""

    def __init__(self, fd: int, on_readable: Callable[[], None]):
        self.fd = fd
        self.on_readable = on_readable

    def fileno(self) -> int:
        return self.fd

    def doRead(self) -> None:  # noqa: N802 - Twisted's name
        self.on_readable()

    def connectionLost(self, reason) -> None:  # noqa: N802 - Twisted's name
        pass

    def logPrefix(self) -> str:  # noqa: N802 - Twisted's name
        return "archive-writer"

    def __eq__(self, other) -> bool:
        return isinstance(other, ReplyWatcher) and other.fd == self.fd

    def __hash__(self) -> int:
        return hash(self.fd)
