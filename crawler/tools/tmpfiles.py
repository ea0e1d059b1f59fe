"""The temporary file a tool writes its output to, beside it, before renaming it.

A tool writes ``OUT`` as ``.OUT.tmp-PID`` (plus SQLite's ``-wal``, ``-shm`` and
``-journal`` for a catalog) and renames it at the end, so that ``OUT`` is whole or
absent. A killed run leaves its temporary files behind (a merge of large catalogs:
gigabytes); the next run of a tool writing ``OUT`` removes those of processes that are
gone, and leaves a running one's alone.
"""

from __future__ import annotations

import errno
import logging
import os
import re
from pathlib import Path

logger = logging.getLogger(__name__)

SQLITE_SUFFIXES = ("", "-wal", "-shm", "-journal")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM  # someone else's process
    return True


def temp_path(output: Path) -> Path:
    """``output``'s temporary file for this process, after removing those a killed
    run of any tool writing ``output`` left behind."""
    output = Path(output)
    prefix = f".{output.name}.tmp-"
    mine = re.compile(re.escape(prefix) + r"(\d+)(-wal|-shm|-journal)?")
    try:
        names = os.listdir(output.parent)
    except FileNotFoundError:
        names = []
    for name in names:
        found = mine.fullmatch(name)
        if found is None or _alive(int(found[1])) and int(found[1]) != os.getpid():
            continue
        path = output.parent / name
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        logger.info("Removed %s, left by a run that did not finish", path)
    return output.with_name(f"{prefix}{os.getpid()}")
