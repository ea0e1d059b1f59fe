"""The run log: ``DATA_DIR/runs.jsonl``, one JSON line per crawl that stored here, with
what it ran with (started, pid, host, spider, its arguments and crawl settings, already
redacted), and, once it ended, when and its peak memory (``ended``, ``peak_rss_mib``,
``children_peak_rss_mib``: what a Slurm ``--mem`` must cover).

Each line is written whole by one ``write`` on a file opened with ``O_APPEND``, as the
action log is, so a killed crawl leaves at most its own line incomplete. Its end is
added to its line by writing the file anew beside it and renaming it over it (the run
holds the data directory's lock, so no other run writes meanwhile): a reader sees the
line before or after, one line per run either way; a killed run's line has no end.
"""

from __future__ import annotations

import json
import logging
import os
import resource
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
    entry = {
        # To the millisecond, as the action log's lines: a run started within the
        # second the last one ended still tells its lines from the last one's.
        "started": _now(),
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


def _now() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"


def peak_rss() -> dict[str, float]:
    """The peak resident memory, in MiB, of this process (``peak_rss_mib``) and of the
    largest of its child processes that ended (``children_peak_rss_mib``: the archive
    writer's, once it exited)."""
    # ru_maxrss is in KiB on Linux.
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {
        "peak_rss_mib": round(own / 1024, 1),
        "children_peak_rss_mib": round(children / 1024, 1),
    }


def end_run(path: str | os.PathLike, entry: dict, fields: dict) -> bool:
    """Add ``ended`` and ``fields`` to the line of the run ``entry`` (as
    :func:`append_run` returned it) in *path*; False, with a warning, when its line is
    not there any more."""
    path = Path(path)
    lines = path.read_bytes().split(b"\n")
    for number in range(len(lines) - 1, -1, -1):
        try:
            found = json.loads(lines[number])
        except ValueError:
            continue
        if isinstance(found, dict) and (found.get("started"), found.get("pid")) == (
            entry["started"],
            entry["pid"],
        ):
            found.update(ended=_now(), **fields)
            lines[number] = json.dumps(found, ensure_ascii=False).encode("utf-8")
            break
    else:
        logger.warning(
            "%s has no line of the run started %s: its end is not recorded", path, entry["started"]
        )
        return False
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(b"\n".join(lines))
    os.replace(tmp, path)
    return True


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
