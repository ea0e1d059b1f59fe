"""The archive writer process: ``python -m crawler.writer DATA_FD REPLY_FD``.

Started by :class:`crawler.store.WriterProcess`. It reads framed messages from
``DATA_FD`` (the first one says which store to open), runs them through a
:class:`~crawler.store.Store`, and answers on ``REPLY_FD``: ``ready`` once the store
is open, ``closed`` with a summary at the end, or ``error``.
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
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

from crawler.store import Store, StoreConfig, _FrameReader, _readable, _send_frame  # noqa: E402


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


def serve(data_fd: int, reply_fd: int) -> None:
    """Main loop: open the store the first message names, then store until closed."""
    _yield_to_crawl()

    def answer(*msg) -> None:
        _send_frame(reply_fd, msg)

    reader = _FrameReader(data_fd)
    try:
        op, config = reader.recv()
    except EOFError:
        return  # the crawl ended before its storage opened
    assert op == "open" and isinstance(config, StoreConfig), op
    try:
        store = Store(config)
    except Exception as exc:
        answer("error", f"cannot open the store in {config.data_dir}: {exc}")
        return
    answer("ready", None)
    try:
        while True:
            wait = max(0.0, config.flush_seconds - (time.monotonic() - store.batch._since))
            if not _readable(data_fd, wait):
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
                answer("closed", summary)
                return
    except OSError as exc:
        where = store.archive.path if store.archive.name else config.data_dir
        answer(
            "error",
            f"writing {where} failed: {exc.strerror or exc}; rows committed so far "
            "are intact, the next run repairs the archive and resumes",
        )
    except Exception:
        answer("error", "the store failed:\n" + traceback.format_exc())


def main(argv: list[str]) -> None:
    data_fd, reply_fd = (int(arg) for arg in argv)
    with contextlib.suppress(BrokenPipeError):  # the crawl is gone: nobody to answer
        serve(data_fd, reply_fd)


if __name__ == "__main__":
    main(sys.argv[1:])
