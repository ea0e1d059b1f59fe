"""Helpers of the fault tests: the processes of a crawl, and waiting for committed rows
(the waiting itself is tests/polling.py's)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.events import committed_rows
from tests.polling import wait_until

WRITER_MODULE = "crawler.storage.writer.server"


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
