"""Who holds a file of the data directory, for messages that say what to do."""

from __future__ import annotations

import os

from crawler.storage.catalog import BUSY_TIMEOUT_ENV, busy_timeout


def holders(path: str | os.PathLike) -> list[str]:
    """The other processes that have ``path`` open, as ``pid N (command line)``."""
    target = os.path.realpath(path)
    mine = {os.getpid(), os.getppid()}
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            fds = os.listdir(f"/proc/{entry.name}/fd")
            if any(os.readlink(f"/proc/{entry.name}/fd/{fd}") == target for fd in fds):
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                found.append(f"pid {entry.name} ({command[:200]})")
        except OSError:  # gone meanwhile, or not ours to look at
            continue
    return found


def catalog_locked_message(path: str | os.PathLike) -> str:
    """What to tell a user when another program holds the catalog's write lock."""
    held_by = ", ".join(holders(path)) or "a process this user cannot see"
    return (
        f"the catalog {path} stayed locked for {busy_timeout():g} s ({BUSY_TIMEOUT_ENV}) "
        f"by another program's write transaction "
        f"(open by: {held_by}); end that transaction (COMMIT or ROLLBACK, or quit that "
        "sqlite3 session) and run the crawl again: nothing stored is lost, the next run "
        "indexes what was not committed"
    )
