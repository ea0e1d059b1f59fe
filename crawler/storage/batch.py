"""Batched catalog writes: one transaction per batch of rows.

A hook runs before each commit so that the archive can be flushed and fsynced first:
a row never points at bytes that are not on disk; another runs after it, so that what
says a row is stored (the action log's ``ok``) never precedes the row.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from crawler.storage.catalog import Catalog
    from crawler.storage.records import Row


class BatchWriter:
    """Batched UPSERTs: one transaction per ``batch_size`` rows or ``flush_seconds``.

    ``before_commit`` runs before each commit (the archive flushes and fsyncs there),
    ``after_commit`` after it. Use it as a context manager: leaving the block commits
    what is pending.
    """

    def __init__(
        self,
        catalog: Catalog,
        batch_size: int = 200,
        flush_seconds: float = 5.0,
        before_commit: Callable[[], None] | None = None,
        after_commit: Callable[[], None] | None = None,
    ):
        self.catalog = catalog
        self.batch_size = batch_size
        self.flush_seconds = flush_seconds
        self.before_commit = before_commit
        self.after_commit = after_commit
        self._upserts: list[tuple] = []
        self._touches: list[tuple] = []
        self._since = time.monotonic()
        self.committed = 0
        # Writes committed in each batch's transaction (item tables: crawler/storage/items.py).
        self._extra: list = []

    def add_writes(self, source) -> None:
        """Commit ``source.write()`` in every batch; ``source.pending`` counts toward it."""
        self._extra.append(source)

    def __enter__(self) -> BatchWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.flush()

    @property
    def pending(self) -> int:
        n = len(self._upserts) + len(self._touches)
        for source in self._extra:
            n += source.pending
        return n

    def upsert(self, row: Row) -> None:
        # Not dataclasses.astuple: it deep-copies every field (the history of docs/benchmarks.md).
        self._upserts.append(tuple(row.__dict__.values()))
        self._maybe_flush()

    def touch(self, key: str, etag: str | None, last_modified: str | None, fetched_at: str) -> None:
        self._touches.append((etag, last_modified, fetched_at, key))
        self._maybe_flush()

    def due(self) -> bool:
        pending = self.pending  # asked after every row: once
        return bool(pending) and (
            pending >= self.batch_size or time.monotonic() - self._since >= self.flush_seconds
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
        n = len(self._upserts) + len(self._touches)
        with self.catalog.transaction():
            if self._upserts:
                self.catalog.upsert_values(self._upserts)
            if self._touches:
                self.catalog.touch_values(self._touches)
            for source in self._extra:
                source.write()
        self._upserts.clear()
        self._touches.clear()
        self._since = time.monotonic()
        self.committed += n
        if self.after_commit is not None:
            self.after_commit()
        return n
