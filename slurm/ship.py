"""Shipping a task's work from node-local disk to shared storage, and merging it.

A Slurm task crawls into a data directory on node-local disk (``$LOCAL/...``) and ships
to the shared data directory ``DATA``:

- closed archive files, of every format, to ``DATA/archive/`` (copied under a
  temporary name, fsynced, renamed, the directory fsynced; hard-linked instead where
  the stage and ``DATA`` share a file system), and then
- its catalog to ``DATA/catalogs/<name>.db``, taken with SQLite's online backup API
  while the crawl writes, with the rows whose archive is not shipped yet removed, and
  its action log beside it (``<name>.fetch_log.jsonl``).

So at every instant every row of a shipped catalog points at a complete record of a
shipped file. ``merge_shipped`` folds the shipped catalogs into ``DATA/metadata.db``.

    python -m slurm.ship ship LOCAL_DATA_DIR DATA --name NAME  # one shipment
    python -m slurm.ship merge DATA                            # after the array
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

from crawler.helptext import ToolHelpFormatter
from crawler.storage.catalog import keep_archives
from crawler.storage.datadir import DataDir
from crawler.storage.formats.base import fsync_dir
from crawler.storage.itemmerge import prune_items
from crawler.tools.rebuild import merge_catalogs
from crawler.tools.stats import catalog_stats

logger = logging.getLogger(__name__)


class ShipError(Exception):
    """Shipping to shared storage failed."""


def copy_atomic(src: Path, dest: Path, link: bool = False) -> None:
    """Put ``src``'s bytes at ``dest`` so that ``dest`` is never seen partly written.

    ``link``: a file nobody writes any more (a closed archive, a catalog snapshot) is
    hard-linked where ``src`` and ``dest`` share a file system (a stage on the shared
    storage itself, one machine): no byte is read or written again, where a copy cost
    the task as much CPU as its writer's compression. Elsewhere (node-local disk to
    shared storage, the usual case) it is one streaming copy. A file still being
    appended to (the action log) is copied: a link would show the shipped one growing.
    """
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    try:
        if not (link and _link(src, tmp)):
            with open(src, "rb") as fin, open(tmp, "wb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
                fout.flush()
                os.fsync(fout.fileno())
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(dest.parent)


def _link(src: Path, tmp: Path) -> bool:
    """Hard-link ``src`` as ``tmp`` after making its bytes durable; False where the
    file system cannot (another device, no hard links): then it is copied."""
    fd = os.open(src, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        return False
    return True


@dataclass
class Shipment:
    archives: list[str] = field(default_factory=list)  # files shipped this time
    rows: int = 0  # rows of the shipped catalog
    held_back: int = 0  # rows left out: their archive is not shipped yet


class Shipper:
    """Ships one local data directory to the shared data directory under ``name``."""

    def __init__(self, local: Path, shared: Path, name: str):
        self.local = DataDir(local)
        self.shared = DataDir(shared)
        self.name = name
        self.shipped: set[str] = set()  # "archive/<file>" as catalog rows name them

    @property
    def catalog_path(self) -> Path:
        return self.shared.shipped_catalog(self.name)

    def ship(self) -> Shipment:
        """Ship the closed archives, then the catalog rows that point into shipped ones."""
        self.shared.archive_dir.mkdir(parents=True, exist_ok=True)
        self.shared.shipped_dir.mkdir(parents=True, exist_ok=True)
        out = Shipment()
        for path in self.local.archives():
            rel = self.local.relpath(path)
            if rel in self.shipped:
                continue
            dest = self.shared.root / rel
            if dest.exists():
                # Names carry ARCHIVE_PREFIX, time and pid: a clash means two crawls
                # share a prefix (slurm/runner.py gives each its own).
                raise ShipError(f"{dest} exists already: give each crawl its own ARCHIVE_PREFIX")
            copy_atomic(path, dest, link=True)
            self.shipped.add(rel)
            out.archives.append(path.name)
        if self.local.catalog_path.exists():
            out.rows, out.held_back = self._ship_catalog()
        log = self.local.action_log_path
        if log.exists():
            copy_atomic(log, self.shared.shipped_action_log(self.name))
        return out

    def _ship_catalog(self) -> tuple[int, int]:
        # A snapshot on local disk first (the crawl goes on writing), trimmed to the
        # shipped archives, folded into one file, then copied over in one rename.
        snapshot = self.local.root / f".ship-{self.name}.db"
        snapshot.unlink(missing_ok=True)
        src = sqlite3.connect(self.local.catalog_path, timeout=30)
        dest = sqlite3.connect(snapshot, isolation_level=None)
        try:
            src.backup(dest)
            # A plain connection, not a Catalog: that one would put the copy in WAL
            # mode, and a shipped catalog is one self-contained file.
            dest.execute("PRAGMA journal_mode=DELETE")
            held_back = keep_archives(dest, self.shipped)
            prune_items(dest)
            rows = dest.execute("SELECT count(*) FROM artifacts").fetchone()[0]
        finally:
            src.close()
            dest.close()
        try:
            copy_atomic(snapshot, self.catalog_path, link=True)
        finally:
            snapshot.unlink(missing_ok=True)
        return rows, held_back


def merge_shipped(data: Path) -> int:
    """Fold every shipped catalog into ``DATA/metadata.db`` (newest fetch wins)."""
    datadir = DataDir(data)
    target = datadir.catalog_path
    inputs = datadir.shipped_catalogs()
    if target.exists():
        inputs.insert(0, target)
    if not inputs:
        raise ShipError(f"nothing to merge: no catalogs in {datadir.shipped_dir}")
    merged = target.with_name(f".{target.name}.merging")
    n = merge_catalogs(inputs, merged)
    os.replace(merged, target)
    fsync_dir(datadir.root)
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=ToolHelpFormatter, prog="python -m slurm.ship", description=__doc__
    )
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
    print(f"merged {len(DataDir(args.data).shipped_catalogs())} shipped catalogs: {n:,} rows")
    for line in catalog_stats(Path(args.data)).lines():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
