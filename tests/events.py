"""Waiting for events instead of the clock.

A test that must act "while the crawl runs" or "once rows are committed" waits for that
event here. Each wait has a generous bound that only decides when the test gives up
(and fails, saying what it waited for); it never decides a pass.
"""

from __future__ import annotations

import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

BOUND_SECONDS = 120.0


def wait_until(
    check: Callable[[], T],
    what: str,
    timeout: float = BOUND_SECONDS,
    proc: subprocess.Popen | None = None,
    step: float = 0.05,
) -> T:
    """Poll ``check`` until it returns something true, and return that.

    With ``proc``, fail at once if that process exits first (the event will not come).
    """
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"waiting for {what}: the process exited ({proc.returncode})")
        if time.monotonic() > deadline:
            raise AssertionError(f"waiting for {what}: not within {timeout:.0f} s")
        time.sleep(step)


def committed_rows(data_dir: Path) -> int:
    """Rows the catalog holds right now, read as any reader would (0 before it exists)."""
    db = data_dir / "metadata.db"
    if not db.exists():
        return 0
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
        try:
            return conn.execute("SELECT count(*) FROM artifacts").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.OperationalError:  # created, its schema not yet committed
        return 0


def log_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def wait_for_log(path: Path, text: str, proc: subprocess.Popen | None = None,
                 timeout: float = BOUND_SECONDS) -> str:  # fmt: skip
    """Wait until the log file at ``path`` holds ``text``; returns the log."""

    def found() -> str:
        log = log_text(path)
        return log if text in log else ""

    return wait_until(found, f"{text!r} in {path}", timeout, proc)
