"""Shipping a task's work from node-local disk to shared storage, and merging it.

A Slurm task crawls into a data directory on node-local disk (``$LOCAL/...``) and ships
to the shared data directory ``DATA``:

- closed archive files to ``DATA/archive/`` (copied under a temporary name, fsynced,
  renamed, the directory fsynced), and then
- its catalog to ``DATA/catalogs/<name>.db``, taken with SQLite's online backup API
  while the crawl writes, with the rows whose archive is not shipped yet removed, and
  its action log beside it (``<name>.fetch_log.jsonl``).

So at every instant every row of a shipped catalog points at a complete record of a
shipped file. ``merge_shipped`` folds the shipped catalogs into ``DATA/metadata.db``.

    python -m crawler.ship ship LOCAL_DATA_DIR DATA --name NAME   # one shipment
    python -m crawler.ship merge DATA                             # after the array
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sqlite3
import sys
from dataclasses import dataclass, field
from pathlib import Path

from crawler.archive import ARCHIVE_GLOB, fsync_dir
from crawler.catalog_tools import catalog_stats, merge_catalogs
from crawler.seen import SHIPPED_DIR

logger = logging.getLogger(__name__)

CATALOG_NAME = "metadata.db"
ACTION_LOG_NAME = "fetch_log.jsonl"


class ShipError(Exception):
    """Shipping to shared storage failed."""


def copy_atomic(src: Path, dest: Path) -> None:
    """Copy ``src`` to ``dest`` so that ``dest`` is never seen partly written."""
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    try:
        with open(src, "rb") as fin, open(tmp, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
            fout.flush()
            os.fsync(fout.fileno())
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(dest.parent)


@dataclass
class Shipment:
    archives: list[str] = field(default_factory=list)  # files shipped this time
    rows: int = 0  # rows of the shipped catalog
    held_back: int = 0  # rows left out: their archive is not shipped yet


class Shipper:
    """Ships one local data directory to the shared data directory under ``name``."""

    def __init__(self, local: Path, shared: Path, name: str):
        self.local = Path(local)
        self.shared = Path(shared)
        self.name = name
        self.archive_dir = self.shared / "archive"
        self.catalog_dir = self.shared / SHIPPED_DIR
        self.shipped: set[str] = set()  # "archive/<file>" as catalog rows name them

    @property
    def catalog_path(self) -> Path:
        return self.catalog_dir / f"{self.name}.db"

    def ship(self) -> Shipment:
        """Ship the closed archives, then the catalog rows that point into shipped ones."""
        self.archive_dir.mkdir(parents=True, exist_ok=True)
        self.catalog_dir.mkdir(parents=True, exist_ok=True)
        out = Shipment()
        for path in sorted((self.local / "archive").glob(ARCHIVE_GLOB)):
            rel = f"archive/{path.name}"
            if rel in self.shipped:
                continue
            dest = self.archive_dir / path.name
            if dest.exists():
                # Names carry ARCHIVE_PREFIX, time and pid: a clash means two crawls
                # share a prefix (crawler/task.py gives each its own).
                raise ShipError(f"{dest} exists already: give each crawl its own ARCHIVE_PREFIX")
            copy_atomic(path, dest)
            self.shipped.add(rel)
            out.archives.append(path.name)
        if (self.local / CATALOG_NAME).exists():
            out.rows, out.held_back = self._ship_catalog()
        log = self.local / ACTION_LOG_NAME
        if log.exists():
            copy_atomic(log, self.catalog_dir / f"{self.name}.{ACTION_LOG_NAME}")
        return out

    def _ship_catalog(self) -> tuple[int, int]:
        # A snapshot on local disk first (the crawl goes on writing), trimmed to the
        # shipped archives, folded into one file, then copied over in one rename.
        snapshot = self.local / f".ship-{self.name}.db"
        snapshot.unlink(missing_ok=True)
        src = sqlite3.connect(self.local / CATALOG_NAME, timeout=30)
        dest = sqlite3.connect(snapshot, isolation_level=None)
        try:
            src.backup(dest)
            dest.execute("PRAGMA journal_mode=DELETE")
            dest.execute("BEGIN")
            dest.execute("CREATE TEMP TABLE shipped (archive TEXT PRIMARY KEY)")
            dest.executemany("INSERT INTO temp.shipped VALUES (?)", [(a,) for a in self.shipped])
            held_back = dest.execute(
                "DELETE FROM artifacts WHERE archive NOT IN (SELECT archive FROM temp.shipped)"
            ).rowcount
            dest.execute("COMMIT")
            rows = dest.execute("SELECT count(*) FROM artifacts").fetchone()[0]
        finally:
            src.close()
            dest.close()
        try:
            copy_atomic(snapshot, self.catalog_path)
        finally:
            snapshot.unlink(missing_ok=True)
        return rows, held_back


def shipped_catalogs(data: Path) -> list[Path]:
    return sorted((Path(data) / SHIPPED_DIR).glob("*.db"))


def merge_shipped(data: Path) -> int:
    """Fold every shipped catalog into ``DATA/metadata.db`` (newest fetch wins)."""
    data = Path(data)
    target = data / CATALOG_NAME
    inputs = shipped_catalogs(data)
    if target.exists():
        inputs.insert(0, target)
    if not inputs:
        raise ShipError(f"nothing to merge: no catalogs in {data / SHIPPED_DIR}")
    merged = data / f".{CATALOG_NAME}.merging"
    n = merge_catalogs(inputs, merged)
    os.replace(merged, target)
    fsync_dir(data)
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m crawler.ship", description=__doc__)
    sub = parser.add_subparsers(dest="action", required=True)
    ship = sub.add_parser("ship", help="ship a local data directory once")
    ship.add_argument("local")
    ship.add_argument("data")
    ship.add_argument("--name", required=True)
    merge = sub.add_parser("merge", help="merge the shipped catalogs into DATA/metadata.db")
    merge.add_argument("data")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.action == "ship":
        done = Shipper(Path(args.local), Path(args.data), args.name).ship()
        print(f"shipped {len(done.archives)} archives, a catalog of {done.rows} rows")
        return 0
    n = merge_shipped(Path(args.data))
    print(f"merged {len(shipped_catalogs(Path(args.data)))} shipped catalogs: {n:,} rows")
    for line in catalog_stats(Path(args.data)).lines():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
