"""What other catalogs hold: the read-only catalogs that ``CATALOG_SEEN`` names.

A Slurm task writes its own catalog on node-local disk, yet must not fetch what the
shared catalog, or any task's shipped catalog, already holds. :class:`SeenCatalogs`
indexes the keys of those catalogs once, at start, in a temporary SQLite file (under
``SQLITE_TMPDIR``/``TMPDIR``: node-local under Slurm), so a lookup costs one local query
whatever the number of catalogs. :class:`CatalogWithSeen` puts it behind the crawl's own
catalog: ``present`` and ``get`` answer from either.

A row counts only when its archive file exists: archive paths are relative to the
catalog's data directory, which is the folder holding the catalog, or its parent for a
catalog shipped under ``catalogs/`` (``DATA/catalogs/*.db`` name ``DATA/archive/...``).
A row whose archive is missing is absent, and its URL is fetched again.
"""

from __future__ import annotations

import glob
import logging
import os
import sqlite3
import tempfile
from pathlib import Path

from crawler.storage.catalog import (
    SCHEMA_VERSION,
    SEEN_ABSENT_IN_SRC,
    SEEN_KEYS_FROM_SRC,
    SRC_ARCHIVES,
    Catalog,
    attached,
    transaction,
)
from crawler.storage.datadir import DataDir
from crawler.storage.errors import CatalogError
from crawler.storage.records import Row

logger = logging.getLogger(__name__)


def expand(patterns: list[str]) -> list[Path]:
    """The catalog files the glob patterns match, each once, in a stable order."""
    found: dict[Path, None] = {}
    for pattern in patterns:
        for name in sorted(glob.glob(os.path.expanduser(pattern))):
            found.setdefault(Path(name).resolve(), None)
    return list(found)


class SeenCatalogs:
    """The keys of other catalogs whose records exist, indexed for lookups."""

    def __init__(self, patterns: list[str], tmp_dir: str | None = None):
        self.sources = expand(patterns)
        fd, path = tempfile.mkstemp(prefix="seen-", suffix=".db", dir=tmp_dir)
        os.close(fd)
        self._path = Path(path)
        self.conn = sqlite3.connect(path, isolation_level=None, uri=True)
        self.conn.execute("PRAGMA journal_mode=OFF")
        self.conn.execute("PRAGMA synchronous=OFF")
        self.conn.execute(
            "CREATE TABLE seen (key TEXT PRIMARY KEY, source INTEGER NOT NULL) WITHOUT ROWID"
        )
        self.absent_rows = 0
        for index, path in enumerate(self.sources):
            try:
                self._load(index, path)
            except (sqlite3.Error, CatalogError) as exc:
                logger.warning("Ignoring catalog %s (CATALOG_SEEN): %s", path, exc)
        self.rows = self.conn.execute("SELECT count(*) FROM seen").fetchone()[0]
        self._catalogs: dict[int, Catalog] = {}

    @property
    def path(self) -> Path:
        """The temporary index (deleted by :meth:`close`)."""
        return self._path

    def _load(self, index: int, path: Path) -> None:
        conn = self.conn
        with attached(conn, path):
            version = conn.execute("PRAGMA src.user_version").fetchone()[0]
            if not 1 <= version <= SCHEMA_VERSION:  # key and archive: in every version
                raise CatalogError(f"schema version {version}, not 1 to {SCHEMA_VERSION}")
            data_dir = DataDir.of_catalog(path).root
            archives = [a for (a,) in conn.execute(SRC_ARCHIVES)]
            existing = [(a,) for a in archives if (data_dir / a).is_file()]
            with transaction(conn):
                conn.execute("CREATE TEMP TABLE archives (archive TEXT PRIMARY KEY)")
                conn.executemany("INSERT INTO temp.archives VALUES (?)", existing)
                conn.execute(SEEN_KEYS_FROM_SRC, (index,))
                if len(existing) < len(archives):
                    self.absent_rows += conn.execute(SEEN_ABSENT_IN_SRC).fetchone()[0]
                conn.execute("DROP TABLE temp.archives")

    def present(self, keys: list[str]) -> set[str]:
        if not keys or not self.rows:
            return set()
        marks = ",".join("?" * len(keys))
        cur = self.conn.execute(f"SELECT key FROM seen WHERE key IN ({marks})", keys)
        return {k for (k,) in cur}

    def get(self, key: str) -> Row | None:
        """The row, its ``archive`` made absolute (it lives in another data directory)."""
        found = self.conn.execute("SELECT source FROM seen WHERE key = ?", (key,)).fetchone()
        if found is None:
            return None
        source = found[0]
        catalog = self._catalogs.get(source)
        if catalog is None:
            catalog = self._catalogs[source] = Catalog(self.sources[source], readonly=True)
        row = catalog.get(key)
        if row is not None:
            row.archive = str(DataDir.of_catalog(self.sources[source]).root / row.archive)
        return row

    def close(self) -> None:
        for catalog in self._catalogs.values():
            catalog.close()
        self._catalogs.clear()
        self.conn.close()
        self._path.unlink(missing_ok=True)


class CatalogWithSeen:
    """The crawl's own catalog, backed by :class:`SeenCatalogs` for lookups."""

    def __init__(self, catalog: Catalog, seen: SeenCatalogs):
        self.catalog = catalog
        self.seen = seen

    def present(self, keys: list[str]) -> set[str]:
        own = self.catalog.present(keys)
        return own | self.seen.present([k for k in keys if k not in own])

    def get(self, key: str) -> Row | None:
        return self.catalog.get(key) or self.seen.get(key)

    def close(self) -> None:
        self.catalog.close()
        self.seen.close()

    def __getattr__(self, name: str):
        return getattr(self.catalog, name)


def with_seen(catalog: Catalog, patterns: list[str]) -> Catalog | CatalogWithSeen:
    """``catalog`` alone when no pattern is given, else backed by the seen catalogs."""
    if not patterns:
        return catalog
    seen = SeenCatalogs(patterns)
    logger.info(
        "CATALOG_SEEN: %d catalogs, %d stored keys skipped%s",
        len(seen.sources),
        seen.rows,
        f", {seen.absent_rows} rows ignored (archive missing)" if seen.absent_rows else "",
    )
    return CatalogWithSeen(catalog, seen)
