"""The catalog: one SQLite row per stored artifact.

The catalog answers "what is in the cache?". Rows are written through
:class:`BatchWriter`, one transaction per batch; a hook runs before each commit so
that the archive can be flushed and fsynced first (a row never points at bytes that
are not on disk).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path

SCHEMA_VERSION = 3
# The oldest schema that has every column of Row: read-only users (tools, other
# tasks' catalogs) read it as it is; only writing migrates.
READABLE_FROM = 2


class CatalogError(Exception):
    """The catalog cannot be used as it is."""


@dataclass
class Row:
    key: str
    url: str
    final_url: str
    status: int
    content_type: str | None
    bytes: int
    etag: str | None
    last_modified: str | None
    fetched_at: str
    archive: str
    offset: int
    length: int
    payload_digest: str | None
    method: str = "GET"
    # 1: the record is the DOM a browser rendered (a WARC conversion record), not the
    # server's response; see middlewares/render.py.
    rendered: int = 0


COLUMNS = [f.name for f in fields(Row)]

# Each entry migrates the schema from version N-1 to N.
MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE artifacts (
        key TEXT PRIMARY KEY,
        url TEXT NOT NULL,
        final_url TEXT NOT NULL,
        status INTEGER NOT NULL,
        content_type TEXT,
        bytes INTEGER NOT NULL,
        etag TEXT,
        last_modified TEXT,
        fetched_at TEXT NOT NULL,
        archive TEXT NOT NULL,
        "offset" INTEGER NOT NULL,
        length INTEGER NOT NULL,
        payload_digest TEXT,
        method TEXT NOT NULL DEFAULT 'GET'
    ) WITHOUT ROWID;
    """,
    2: "ALTER TABLE artifacts ADD COLUMN rendered INTEGER NOT NULL DEFAULT 0",
    # Rows and bytes by status, kept by triggers, so that the summary at the end of
    # every crawl reads a few rows instead of scanning a catalog of millions.
    3: """
    CREATE TABLE totals (
        status INTEGER PRIMARY KEY,
        row_count INTEGER NOT NULL,
        byte_count INTEGER NOT NULL
    );
    INSERT INTO totals SELECT status, count(*), coalesce(sum(bytes), 0)
        FROM artifacts GROUP BY status;
    CREATE TRIGGER totals_insert AFTER INSERT ON artifacts BEGIN
        INSERT INTO totals VALUES (NEW.status, 1, NEW.bytes) ON CONFLICT(status)
            DO UPDATE SET row_count = row_count + 1, byte_count = byte_count + excluded.byte_count;
    END;
    CREATE TRIGGER totals_update AFTER UPDATE OF status, bytes ON artifacts BEGIN
        UPDATE totals SET row_count = row_count - 1, byte_count = byte_count - OLD.bytes
            WHERE status = OLD.status;
        INSERT INTO totals VALUES (NEW.status, 1, NEW.bytes) ON CONFLICT(status)
            DO UPDATE SET row_count = row_count + 1, byte_count = byte_count + excluded.byte_count;
    END;
    CREATE TRIGGER totals_delete AFTER DELETE ON artifacts BEGIN
        UPDATE totals SET row_count = row_count - 1, byte_count = byte_count - OLD.bytes
            WHERE status = OLD.status;
    END;
    """,
}


def statements(script: str) -> Iterator[str]:
    """The SQL statements of ``script``; a trigger's body stays in its statement."""
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            yield pending.strip()
            pending = ""
    if pending.strip():
        yield pending.strip()


def repr_col(column: str) -> str:
    return f'"{column}"'


_SELECT = ", ".join(map(repr_col, COLUMNS))
_UPSERT = (
    f"INSERT INTO artifacts ({_SELECT}) VALUES ({', '.join('?' * len(COLUMNS))}) "
    "ON CONFLICT(key) DO UPDATE SET "
    + ", ".join(f"{repr_col(c)} = excluded.{repr_col(c)}" for c in COLUMNS if c != "key")
)
_SUMMARY = "SELECT status, row_count, byte_count FROM totals WHERE row_count > 0 ORDER BY status"
_SUMMARY_SCAN = (
    "SELECT status, count(*), coalesce(sum(bytes), 0) FROM artifacts "
    "GROUP BY status ORDER BY status"
)
# A 304 refreshes validators and time only; the body stays where it is.
_TOUCH = (
    "UPDATE artifacts SET etag = coalesce(?, etag), "
    "last_modified = coalesce(?, last_modified), fetched_at = ? WHERE key = ?"
)


def connect(path: str | os.PathLike, readonly: bool = False) -> sqlite3.Connection:
    """Open the catalog database with the project's pragmas."""
    path = Path(path)
    if readonly:
        if not path.exists():
            raise CatalogError(f"{path}: no catalog here (run a crawl first)")
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        if not readonly:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=30000")
        conn.execute("PRAGMA temp_store=MEMORY")
        conn.execute("PRAGMA cache_size=-65536")  # 64 MiB
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise CatalogError(f"{path}: not a usable SQLite catalog ({exc})") from exc
    return conn


def _set_tmpdir() -> None:
    # SQLite reads SQLITE_TMPDIR itself; TMPDIR is its fallback, so mirror it for
    # libraries that only look at TMPDIR.
    tmp = os.environ.get("SQLITE_TMPDIR")
    if tmp:
        os.environ.setdefault("TMPDIR", tmp)


class Catalog:
    """The catalog database of one data directory."""

    def __init__(self, path: str | os.PathLike, readonly: bool = False):
        _set_tmpdir()
        self.path = Path(path)
        self.readonly = readonly
        if not readonly and not self.path.exists():
            self._create()
        self.conn = connect(self.path, readonly=readonly)
        if readonly:
            self._check_version()
        else:
            self.migrate()

    def _create(self) -> None:
        # Built beside its final name and linked into place whole, so a reader that
        # opens the catalog while a crawl starts sees no catalog or a complete schema,
        # never an empty file of version 0.
        tmp = self.path.with_name(f"{self.path.name}.new-{os.getpid()}")
        for leftover in (tmp, tmp.with_name(tmp.name + "-wal"), tmp.with_name(tmp.name + "-shm")):
            leftover.unlink(missing_ok=True)
        self.conn = connect(tmp)
        try:
            self.migrate()
        finally:
            self.conn.close()
        try:
            # link, not rename: a catalog another process created meanwhile is kept.
            os.link(tmp, self.path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def version(self) -> int:
        return self.conn.execute("PRAGMA user_version").fetchone()[0]

    def _check_version(self) -> None:
        if self.version > SCHEMA_VERSION:
            raise CatalogError(
                f"{self.path}: schema version {self.version} is newer than this "
                f"code knows ({SCHEMA_VERSION}); update the project"
            )
        if self.version < READABLE_FROM:
            raise CatalogError(
                f"{self.path}: schema version {self.version} is older than "
                f"{SCHEMA_VERSION}; open it once for writing (run a crawl) to migrate"
            )

    def migrate(self) -> None:
        current = self.version
        if current > SCHEMA_VERSION:
            self._check_version()
        for version in range(current + 1, SCHEMA_VERSION + 1):
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                for stmt in statements(MIGRATIONS[version]):
                    self.conn.execute(stmt)
                self.conn.execute(f"PRAGMA user_version = {version}")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            self.conn.execute("COMMIT")

    # -- reading -------------------------------------------------------------------

    def get(self, key: str) -> Row | None:
        cur = self.conn.execute(
            f"SELECT {_SELECT} FROM artifacts WHERE key = ?",
            (key,),
        )
        found = cur.fetchone()
        return Row(*found) if found else None

    def present(self, keys: list[str]) -> set[str]:
        """The subset of ``keys`` that have a row (one query for the whole list)."""
        if not keys:
            return set()
        marks = ",".join("?" * len(keys))
        cur = self.conn.execute(f"SELECT key FROM artifacts WHERE key IN ({marks})", keys)
        return {k for (k,) in cur}

    def rows(self, where: str = "1", params: Iterable = ()) -> Iterator[Row]:
        cur = self.conn.execute(
            f"SELECT {_SELECT} FROM artifacts WHERE {where}",
            tuple(params),
        )
        for found in cur:
            yield Row(*found)

    def count(self) -> int:
        return self.conn.execute("SELECT count(*) FROM artifacts").fetchone()[0]

    def summary(self) -> dict:
        # Read-only on a catalog older than the totals: count them.
        sql = _SUMMARY if self.version >= 3 else _SUMMARY_SCAN
        by_status, rows, total_bytes = {}, 0, 0
        for status, count, size in self.conn.execute(sql):
            by_status[status] = count
            rows += count
            total_bytes += size
        return {"rows": rows, "bytes": total_bytes, "by_status": by_status}

    # -- writing -------------------------------------------------------------------

    def writer(self, **kwargs) -> BatchWriter:
        return BatchWriter(self.conn, **kwargs)


class BatchWriter:
    """Batched UPSERTs: one transaction per ``batch_size`` rows or ``flush_seconds``.

    ``before_commit`` runs before each commit (the archive flushes and fsyncs there).
    Use it as a context manager: leaving the block commits what is pending.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        batch_size: int = 200,
        flush_seconds: float = 5.0,
        before_commit: Callable[[], None] | None = None,
    ):
        self.conn = conn
        self.batch_size = batch_size
        self.flush_seconds = flush_seconds
        self.before_commit = before_commit
        self._upserts: list[tuple] = []
        self._touches: list[tuple] = []
        self._since = time.monotonic()
        self.committed = 0

    def __enter__(self) -> BatchWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.flush()

    @property
    def pending(self) -> int:
        return len(self._upserts) + len(self._touches)

    def upsert(self, row: Row) -> None:
        # Not dataclasses.astuple: it deep-copies every field (60 us a row).
        self._upserts.append(tuple(row.__dict__.values()))
        self._maybe_flush()

    def touch(self, key: str, etag: str | None, last_modified: str | None, fetched_at: str) -> None:
        self._touches.append((etag, last_modified, fetched_at, key))
        self._maybe_flush()

    def due(self) -> bool:
        return self.pending and (
            self.pending >= self.batch_size or time.monotonic() - self._since >= self.flush_seconds
        )

    def _maybe_flush(self) -> None:
        if self.due():
            self.flush()

    def flush(self) -> int:
        """Commit what is pending; returns the number of rows written."""
        if not self.pending:
            self._since = time.monotonic()
            return 0
        if self.before_commit is not None:
            self.before_commit()
        n = self.pending
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            if self._upserts:
                self.conn.executemany(_UPSERT, self._upserts)
            if self._touches:
                self.conn.executemany(_TOUCH, self._touches)
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")
        self._upserts.clear()
        self._touches.clear()
        self._since = time.monotonic()
        self.committed += n
        return n
