"""Sets and maps whose memory stops growing: keys in a Python set or dict up to a
bound, the rest in a private temporary SQLite database.

A Python set costs about 100 bytes a key: a gigabyte for ten million. Past the bound,
the keys move to SQLite's private temporary database (a file under ``SQLITE_TMPDIR``,
else ``TMPDIR``: node-local disk on a cluster, that only this connection sees and that
goes when it closes), of which at most ``cache_mib`` stays in memory. Answers stay
exact. The duplicate filter (``extensions/dupefilter.py``) keeps its fingerprints so,
and a depth crawl the registered domains of its list and the depth each URL was met at
(``spiders/site.py``).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Hashable, Iterable

# What a file that cannot be used raises: (what was tried, SQLite's error) -> exception.
ErrorFactory = Callable[[str, sqlite3.Error], Exception]


def temp_dir() -> str:
    """Where SQLite puts its temporary files, for messages."""
    return os.environ.get("SQLITE_TMPDIR") or os.environ.get("TMPDIR") or "/var/tmp"


class SpillFile:
    """The keys (and their values, for a map) moved out of memory, in a private
    temporary SQLite database."""

    def __init__(self, cache_mib: int, error: ErrorFactory) -> None:
        self.error = error
        try:
            db = sqlite3.connect("", isolation_level=None)  # "": private and temporary
            db.execute("PRAGMA journal_mode=OFF")
            db.execute("PRAGMA synchronous=OFF")
            db.execute(f"PRAGMA cache_size=-{cache_mib * 1024}")
            db.execute("CREATE TABLE seen (key PRIMARY KEY, value) WITHOUT ROWID")
            # Never committed: nothing needs to outlive the process, and one open
            # transaction spares a commit per insert.
            db.execute("BEGIN")
        except sqlite3.Error as exc:
            raise error("write", exc) from exc
        self._db = db
        self._lookup = db.cursor()

    def has(self, key: Hashable) -> bool:
        try:
            return self._lookup.execute(_SELECT, (key,)).fetchone() is not None
        except sqlite3.Error as exc:
            raise self.error("read", exc) from exc

    def get(self, key: Hashable) -> object | None:
        try:
            row = self._lookup.execute(_SELECT_VALUE, (key,)).fetchone()
        except sqlite3.Error as exc:
            raise self.error("read", exc) from exc
        return None if row is None else row[0]

    def put_all(self, items: Iterable[tuple[Hashable, object]]) -> None:
        """Set the values of *items* (key, value), best sorted by key (see add_all)."""
        try:
            self._db.executemany(_REPLACE, items)
        except sqlite3.Error as exc:
            raise self.error("write", exc) from exc

    def add_all(self, keys: Iterable[Hashable]) -> None:
        """Add *keys*, best in sorted order: the B-tree is then walked once (a spill
        takes half the time, and stays flat as the table grows)."""
        try:
            self._db.executemany(_INSERT, ((key,) for key in keys))
        except sqlite3.Error as exc:
            raise self.error("write", exc) from exc

    def close(self) -> None:
        self._db.close()


class SpillingMap:
    """A map of keys (all ``str`` or all ``bytes``) to values SQLite can store (never
    None), held in memory up to *memory_keys*, then moved to a :class:`SpillFile`; a
    key found there is remembered among the last *recent* found, as a crawl asks for
    the same few keys again and again. A value set again is kept in memory until the
    next move, which replaces the file's."""

    def __init__(
        self, memory_keys: int, cache_mib: int, error: ErrorFactory, recent: int = 4096
    ) -> None:
        self.memory_keys = max(memory_keys, 1)
        self.cache_mib = cache_mib
        self.error = error
        self.recent = recent
        self._items: dict[Hashable, object] = {}
        self._found: dict[Hashable, object] = {}
        self._file: SpillFile | None = None

    def get(self, key: Hashable, default: object = None) -> object:
        value = self._items.get(key)
        if value is None:
            value = self._found.get(key)
        if value is None and self._file is not None:
            value = self._file.get(key)
            if value is not None:
                if len(self._found) >= self.recent:
                    self._found.clear()
                self._found[key] = value
        return default if value is None else value

    def __setitem__(self, key: Hashable, value: object) -> None:
        self._found.pop(key, None)
        self._items[key] = value
        if len(self._items) >= self.memory_keys:
            if self._file is None:
                self._file = SpillFile(self.cache_mib, self.error)
            self._file.put_all(sorted(self._items.items()))
            # clear() hands the dict's table back; the new dict starts small.
            self._items.clear()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._items.clear()
        self._found.clear()


class SpillingSet(SpillingMap):
    """A set of keys on a :class:`SpillingMap`."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def __contains__(self, key: Hashable) -> bool:
        return self.get(key) is not None

    def add(self, key: Hashable) -> None:
        if key not in self:
            self.count += 1
            self[key] = 1

    def close(self) -> None:
        super().close()
        self.count = 0


_SELECT = "SELECT 1 FROM seen WHERE key = ?"
_SELECT_VALUE = "SELECT value FROM seen WHERE key = ?"
_INSERT = "INSERT OR IGNORE INTO seen (key) VALUES (?)"
_REPLACE = "INSERT OR REPLACE INTO seen VALUES (?, ?)"
