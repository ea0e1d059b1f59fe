"""Helpers of the fault tests: the processes of a crawl, and waiting for committed rows
(the waiting itself is tests/polling.py's)."""

from __future__ import annotations

import os
import random
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.events import committed_rows
from tests.polling import wait_until

WRITER_MODULE = "crawler.storage.writer.server"
SEED_VARIABLE = "CRASH_SEED"


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return []
    return [int(p) for p in text.split()]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def writer_pid(crawl_pid: int) -> int:
    """The archive writer process the crawl ``crawl_pid`` started."""
    pid = wait_until(
        lambda: next((p for p in children(crawl_pid) if WRITER_MODULE in cmdline(p)), None),
        f"the writer process of crawl {crawl_pid}",
    )
    return pid


def wait_for_rows(data_dir: Path, target: int, proc: subprocess.Popen) -> int:
    """Wait until ``target`` rows are committed; fail if ``proc`` exits first."""
    return wait_until(
        lambda: (n := committed_rows(data_dir)) >= target and n,
        f"{target} rows committed in {data_dir}",
        proc=proc,
    )


@contextmanager
def kill_moments() -> Iterator[random.Random]:
    """The generator a crash test draws its kill moments from. Its seed is printed and
    named in any failure; ``CRASH_SEED=<seed>`` replays the same moments."""
    seed = int(os.environ.get(SEED_VARIABLE) or random.SystemRandom().randrange(2**32))
    print(f"kill moments: {SEED_VARIABLE}={seed}")
    try:
        yield random.Random(seed)
    except BaseException as exc:
        exc.add_note(f"kill moments drawn with {SEED_VARIABLE}={seed}: set it to replay them")
        raise
