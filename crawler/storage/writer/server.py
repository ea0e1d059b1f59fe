"""The archive writer process:
``python -m crawler.storage.writer.server DATA_FD REPLY_FD [RING_FD SIZE]``.

Started by :class:`crawler.storage.writer.client.WriterProcess` as a plain interpreter
as soon as the crawl starts up, so that it has loaded its modules by the time the
store opens. It reads messages from ``DATA_FD`` (:mod:`crawler.storage.writer.wire`;
the first one says which store to open), their bodies from the shared ring
``RING_FD`` when one is given, runs them through a
:class:`~crawler.storage.store.Store`, and answers on ``REPLY_FD``: ``ready`` once the
store is open, ``closed`` with a summary at the end, or ``error``. The packages above
this module import nothing, so signals are ignored before anything is loaded.
"""

import signal

# Signals are the crawl's to handle (Ctrl-C reaches the whole process group): ignored
# before anything else is loaded, and this process stops when the crawl closes the
# pipe, after committing.
for _sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
    signal.signal(_sig, signal.SIG_IGN)

import contextlib  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import sqlite3  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

from crawler.storage.holders import catalog_locked_message  # noqa: E402
from crawler.storage.items import PageItems  # noqa: E402
from crawler.storage.store import Store, StoreConfig  # noqa: E402
from crawler.storage.writer.wire import BodyRing, FrameReader, readable, send_frame  # noqa: E402

# Sleep between polls of an empty pipe: doubling from the first to the second figure
# while it stays empty. The pipe and the ring hold much more than the crawl sends in
# the longer one.
IDLE_SLEEP = (0.001, 0.02)
# Bytes asked for by each read of the pipe: a few dozen messages, whose bodies (in the
# ring) take much less than the ring holds.
READ_AHEAD = 8192
# Fetches stored together at most, with ARCHIVE_DEDUP=digest: those already read from
# the pipe are looked up in one query (Store.put_many).
PUT_BATCH = 64
RESUMES = "rows committed so far are intact, the next run repairs the archive and resumes"


def _yield_to_crawl() -> None:
    """Let the crawl have the CPU when both want it.

    The crawl is bound by its one thread; with records waiting, this process would
    otherwise preempt it on its core. As a batch task of lower priority it runs on a
    free core, or in the crawl's pauses, and the ring and the pipe absorb the lag (full,
    they make the crawl wait, which hands this process the CPU).
    """
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    with contextlib.suppress(OSError):
        os.nice(10)


def serve(data_fd: int, reply_fd: int, ring: BodyRing | None = None) -> None:
    """Main loop: open the store the first message names, then store until closed."""
    _yield_to_crawl()

    def answer(*msg) -> None:
        send_frame(reply_fd, msg)

    reader = FrameReader(data_fd, ring, read_ahead=READ_AHEAD)
    try:
        op, config, report_commits = reader.recv()
    except EOFError:
        return  # the crawl ended before its storage opened
    assert op == "open" and isinstance(config, StoreConfig), op
    try:
        # Held until this process exits, after the crawl if it dies first: the next
        # run waits for it (DataDirLock).
        config.datadir.lock().hold_for_writer()
        store = Store(config)
    except Exception as exc:
        answer("error", f"cannot open the store in {config.data_dir}: {exc}")
        return
    answer("ready", None)
    idle = IDLE_SLEEP[0]
    # Rows committed as last reported: the crawl wakes the requests waiting for a row,
    # and counts the fetches found unchanged (Store.progress).
    reported = 0
    try:
        while True:
            if report_commits and store.batch.committed != reported:
                progress = store.progress()
                reported = progress[0]
                answer("committed", progress)
            # Polled, never waited on: a process asleep on the pipe is woken by every
            # write of the crawl, and on a virtual machine that wake-up cost the
            # crawl's thread more than the rest of sending a message
            # (docs/design/crash-guarantee.md).
            if not reader.buffered and not readable(data_fd):
                if ring is not None:
                    ring.publish()  # the poll was a system call
                store.tick()
                time.sleep(idle)
                idle = min(2 * idle, IDLE_SLEEP[1])
                continue
            idle = IDLE_SLEEP[0]
            try:
                msg = reader.recv()
            except EOFError:
                # The crawl died: keep what reached us (a message cut short is dropped).
                store.close(complete=False)
                return
            op = msg[0]
            if op == "put" and store.looks_up_digests:
                puts, msg, ended = _more_puts(reader, [msg[1:]])
                store.put_many(puts)
                if ended:
                    store.close(complete=False)
                    return
                if msg is None:
                    continue
                op = msg[0]
            if op == "put":
                store.put(*msg[1:])
            elif op == "touch":
                store.touch(msg[1], msg[2])
            elif op == "items":
                store.page_items(PageItems.from_wire(msg[1]))
            elif op == "close":
                summary = store.close()
                usage = resource.getrusage(resource.RUSAGE_SELF)
                summary["cpu_seconds"] = usage.ru_utime + usage.ru_stime
                answer("closed", summary)
                return
    except OSError as exc:
        where = exc.filename or (store.archive.path if store.archive.name else config.data_dir)
        answer("error", f"writing {where} failed: {exc.strerror or exc}; {RESUMES}")
    except sqlite3.OperationalError as exc:
        answer("error", catalog_failure(config.datadir.catalog_path, exc))
    except Exception:
        answer("error", "the store failed:\n" + traceback.format_exc())


def _more_puts(reader: FrameReader, puts: list[tuple]) -> tuple[list[tuple], tuple | None, bool]:
    """``puts`` and the puts that follow them already read from the pipe (up to
    PUT_BATCH); the message after them, if read; whether the crawl closed the pipe."""
    while len(puts) < PUT_BATCH and reader.buffered:
        try:
            msg = reader.recv()
        except EOFError:
            return puts, None, True
        if msg[0] != "put":
            return puts, msg, False
        puts.append(msg[1:])
    return puts, None, False


def catalog_failure(path, exc: sqlite3.OperationalError) -> str:
    """One line on why the catalog could not be written, and what to do."""
    if "locked" in str(exc) or "busy" in str(exc):
        return catalog_locked_message(path)
    return f"writing the catalog {path} failed: {exc}; {RESUMES}"


def main(argv: list[str]) -> None:
    data_fd, reply_fd, *ring_args = (int(arg) for arg in argv)
    ring = None
    if ring_args:
        ring_fd, ring_size = ring_args
        ring = BodyRing(ring_size, fd=ring_fd)
    with contextlib.suppress(BrokenPipeError):  # the crawl is gone: nobody to answer
        serve(data_fd, reply_fd, ring)


if __name__ == "__main__":
    main(sys.argv[1:])
