"""The order the crash guarantee rests on, checked at the instant of each catalog commit:
every row the commit makes visible points at bytes that are in their file and fsynced,
in a file whose "being written" marker is fsynced into its directory.

Deterministic: the check runs inside the store's own COMMIT (SQLite's trace callback
sees the statement before it runs, and the transaction's rows are still readable on its
connection), and fsync is watched where it is called. A kill test can only hope to land
between a commit and the buffer's next write; this one looks at every commit.

The sqlite format's bodies are rows of a database of their own: a row is on disk when
another connection reads its body (committed), and durable when that database commits
with ``synchronous=FULL`` in WAL mode (SQLite fsyncs the WAL at each commit, from C,
where no Python spy sees it): its connection is watched where it is made.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from crawler.storage.formats.base import WRITING_SUFFIX
from crawler.storage.store import Store, StoreConfig
from tests.factories import page_fetch
from tests.thirdparty import warc_body, zip_body

PAGES = 60


@dataclass
class Fsyncs:
    """How far each file was fsynced (its size when ``os.fsync`` returned), and the
    names each directory held when it was fsynced."""

    sizes: dict[str, int] = field(default_factory=dict)
    entries: dict[str, set[str]] = field(default_factory=dict)

    def spy(self, real):
        def fsync(fd: int) -> None:
            real(fd)
            path = os.readlink(f"/proc/self/fd/{fd}")
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                self.entries.setdefault(path, set()).update(os.listdir(path))
            else:
                self.sizes[path] = max(self.sizes.get(path, 0), os.fstat(fd).st_size)

        return fsync


def sqlite_row(path: Path, row_id: int, connect=sqlite3.connect) -> bytes:
    """A body as any reader of the ``bodies`` table reads it: committed, or nothing."""
    conn = connect(f"file:{path}?mode=ro", uri=True)
    try:
        found = conn.execute("SELECT body FROM bodies WHERE id = ?", (row_id,)).fetchone()
    finally:
        conn.close()
    if found is None:
        raise LookupError(f"no committed body of id {row_id}")
    body = found[0]
    return body.encode() if isinstance(body, str) else body


READERS = {"warc": warc_body, "zip": zip_body, "sqlite": sqlite_row}


@dataclass
class BodiesConnections:
    """The connections made to the sqlite format's bodies databases."""

    made: list[sqlite3.Connection] = field(default_factory=list)
    real = staticmethod(sqlite3.connect)

    def spy(self, *args, **kwargs) -> sqlite3.Connection:
        conn = self.real(*args, **kwargs)
        if str(args[0] if args else kwargs.get("database")).endswith(".sqlite"):
            self.made.append(conn)
        return conn

    def durability(self) -> list[tuple[str, int]]:
        """(journal_mode, synchronous) of each bodies database still open for writing."""
        found = []
        for conn in self.made:
            try:
                mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
                level = conn.execute("PRAGMA synchronous").fetchone()[0]
            except sqlite3.ProgrammingError:  # closed: its file is finished
                continue
            found.append((mode, level))
        return found


class CommitWatch:
    """At each COMMIT of the store's catalog, read every row of the transaction back
    from its file as a third party would, and check its bytes were fsynced."""

    def __init__(
        self,
        store: Store,
        data_dir: Path,
        fsyncs: Fsyncs,
        bodies: dict[str, bytes],
        connections: BodiesConnections,
    ):
        self.conn = store.catalog.conn
        self.data_dir = data_dir
        self.fsyncs = fsyncs
        self.bodies = bodies
        self.connections = connections
        self.format = store.config.format
        self.read = READERS[self.format]
        self.commits = 0
        self.rows_checked = 0
        self.failures: list[str] = []
        self.conn.set_trace_callback(self.statement)

    def statement(self, sql: str) -> None:
        if sql.strip().upper() != "COMMIT":
            return
        self.commits += 1
        rows = self.conn.execute('SELECT key, archive, "offset", length FROM artifacts')
        for key, archive, offset, length in rows.fetchall():
            problem = self.check(key, archive, offset, length)
            if problem:
                self.failures.append(f"commit {self.commits}: {key[-6:]}: {problem}")
            self.rows_checked += 1

    def check(self, key: str, archive: str, offset: int, length: int) -> str:
        if self.format == "sqlite":
            return self.check_sqlite(key, archive, offset)
        path = self.data_dir / archive
        end = offset + length
        with open(path, "rb") as f:  # the name the row gives, nothing else
            size = os.fstat(f.fileno()).st_size
            if end > size:
                return f"{archive}[{offset}:{end}] beyond the {size} bytes in the file"
            f.seek(offset)
            raw = f.read(length)
        try:
            body = self.read(raw)
        except Exception as exc:  # any way the bytes fail to read is the finding
            return f"{archive}[{offset}:{end}] does not read back: {exc!r}"
        if body != self.bodies[key]:
            return f"{archive}[{offset}:{end}] holds another body"
        synced = self.fsyncs.sizes.get(os.path.realpath(path), 0)
        if end > synced:
            return f"{archive}[{offset}:{end}] not fsynced (fsynced up to {synced})"
        # The file's "being written" marker is what makes the next run repair and index
        # it after a kill: it must have been durable in its directory before any row.
        marker = path.name + WRITING_SUFFIX
        if marker not in self.fsyncs.entries.get(os.path.realpath(path.parent), set()):
            return f"{archive}: its marker {marker} was never fsynced into its directory"
        return ""

    def check_sqlite(self, key: str, archive: str, row_id: int) -> str:
        try:
            body = sqlite_row(self.data_dir / archive, row_id, self.connections.real)
        except (LookupError, sqlite3.Error) as exc:
            return f"{archive} id {row_id} does not read back: {exc!r}"
        if body != self.bodies[key]:
            return f"{archive} id {row_id} holds another body"
        # Committed is not durable: only FULL fsyncs the WAL at each commit.
        durability = self.connections.durability()
        if not durability or any(d != ("wal", 2) for d in durability):
            return (
                f"bodies written with (journal_mode, synchronous) = {durability}, not (wal, FULL)"
            )
        return ""


@pytest.fixture
def fsyncs(monkeypatch) -> Fsyncs:
    spy = Fsyncs()
    monkeypatch.setattr(os, "fsync", spy.spy(os.fsync))
    return spy


@pytest.mark.parametrize("fmt", sorted(READERS))
@pytest.mark.parametrize("batch_size", [1, 7])
def test_every_row_is_on_disk_and_fsynced_when_its_commit_runs(
    data_dir, fsyncs, monkeypatch, fmt, batch_size
):
    connections = BodiesConnections()
    monkeypatch.setattr(sqlite3, "connect", connections.spy)
    # Records far smaller than a file buffer: unflushed, they would sit in the process.
    store = Store(StoreConfig(data_dir, format=fmt, batch_size=batch_size, rollover_bytes=20_000))
    bodies: dict[str, bytes] = {}
    watch = CommitWatch(store, data_dir, fsyncs, bodies, connections)
    for n in range(PAGES):
        fetch = page_fetch(n)
        bodies[fetch.key] = fetch.body
        store.put(fetch)
        if n % 5 == 4:
            store.touch(page_fetch(n - 2))  # a revisit between responses
    store.close()
    assert watch.failures == [], watch.failures[:5]
    assert watch.commits >= PAGES // batch_size // 2
    assert watch.rows_checked >= PAGES
    assert len(list((data_dir / "archive").iterdir())) > 1, "no rollover happened"
