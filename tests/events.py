"""What the tests wait for: rows committed, a line in a log (the waiting itself is
tests/polling.py's)."""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

from tests.polling import BOUND_SECONDS, wait_until

__all__ = ["committed_rows", "log_text", "wait_for_log", "wait_until"]


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
