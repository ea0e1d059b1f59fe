"""The run log: ``DATA_DIR/runs.jsonl``, one JSON line per crawl that stored here, with
what it ran with (started, pid, host, spider, its arguments and crawl settings, already
redacted).

Each line is written whole by one ``write`` on a file opened with ``O_APPEND``, as the
action log is, so a killed crawl leaves at most its own line incomplete.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path

from crawler.redact import redact_url

logger = logging.getLogger(__name__)


def append_run(
    path: str | os.PathLike,
    spider: str,
    settings: dict[str, str],
    arguments: dict[str, str] | None = None,
) -> dict:
    """Append this process's run to *path* and return the entry written; *arguments*
    are the spider's (``-a``: its URL list, depth...)."""
    now = time.time()
    entry = {
        # To the millisecond, as the action log's lines: a run started within the
        # second the last one ended still tells its lines from the last one's.
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now))
        + f".{int(now % 1 * 1000):03d}Z",
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "spider": spider,
        "arguments": {str(k): redact_url(str(v)) for k, v in (arguments or {}).items()},
        "settings": dict(settings),
    }
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(entry, ensure_ascii=False) + "\n").encode("utf-8"))
    finally:
        os.close(fd)
    return entry


def read_runs(path: str | os.PathLike) -> list[dict]:
    """Every complete run in *path*, oldest first (none when the file is absent). A torn
    or malformed line (a killed run's) is skipped with a warning naming it."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return []
    runs = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            entry = None
        if isinstance(entry, dict) and isinstance(entry.get("settings"), dict):
            runs.append(entry)
        else:
            logger.warning("%s line %d is not a run record: skipped", path, number)
    return runs


def last_run(path: str | os.PathLike) -> dict | None:
    """The latest complete run in *path*; None when the file is absent or holds none.
    A torn or malformed line (a killed run's) is skipped with a warning naming it."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return None
    for number in range(len(lines), 0, -1):
        line = lines[number - 1].strip()
        if not line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            entry = None
        if isinstance(entry, dict) and isinstance(entry.get("settings"), dict):
            return entry
        logger.warning("%s line %d is not a run record: skipped", path, number)
    return None
