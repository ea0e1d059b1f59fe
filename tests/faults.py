"""Helpers of the fault tests: the processes of a crawl, and waiting for events."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from crawler.storage.errors import CatalogError
from tests.checks import catalog_rows

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
    pid = wait_for(
        lambda: next((p for p in children(crawl_pid) if WRITER_MODULE in cmdline(p)), None),
        f"the writer process of crawl {crawl_pid}",
    )
    return pid


def wait_for(condition: Callable, what: str, timeout: float = 120, proc=None):
    """Poll ``condition`` until it returns something true; fail after ``timeout`` (a
    safety net, not a timing: the test waits for an event), or if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the process exited ({proc.returncode}) before {what}")
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def committed_rows(data_dir: Path) -> int:
    try:
        return len(catalog_rows(data_dir))
    except (CatalogError, sqlite3.Error):  # being created right now: not there yet
        return 0


def wait_for_rows(data_dir: Path, target: int, proc) -> None:
    """Wait until ``target`` rows are committed, or ``proc`` has exited."""
    wait_for(
        lambda: committed_rows(data_dir) >= target or proc.poll() is not None,
        f"{target} rows committed",
    )
