"""``scrapy catalog rebuild`` (a catalog from the archives alone) and ``merge``
(one catalog from several, the newest fetch winning)."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from crawler.storage.catalog import Catalog
from crawler.storage.datadir import DataDir
from crawler.storage.itemmerge import merge_items_from
from crawler.storage.records import Row
from crawler.tools.scan import ToolError, newest_rows, scan_archives
from crawler.tools.tmpfiles import temp_path


@dataclass
class RebuildResult:
    path: Path
    rows: int
    records: int
    problems: list[str]


def write_catalog(rows: Iterable[Row], out: Path) -> int:
    """A new catalog at ``out`` (written beside it, then renamed) holding ``rows``."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(out)
    n = 0
    with Catalog(tmp) as catalog, catalog.writer(batch_size=5000) as batch:
        for row in rows:
            batch.upsert(row)
            n += 1
    finish_db(tmp, out)
    return n


def finish_db(tmp: Path, out: Path) -> None:
    """Give a catalog written at ``tmp`` its name ``out``, as one self-contained file."""
    conn = sqlite3.connect(tmp)
    conn.execute("PRAGMA journal_mode=DELETE")  # fold the WAL in: one self-contained file
    conn.close()
    os.replace(tmp, out)


class Rebuild:
    """A catalog from the archives alone (the archive is the source of truth)."""

    def __init__(self, data_dir: Path, output: Path | None = None):
        self.data_dir = Path(data_dir)
        self.datadir = DataDir(data_dir)
        self.output = Path(output) if output else self.data_dir / "metadata.rebuilt.db"

    def run(self) -> RebuildResult:
        if self.output.resolve() == self.datadir.catalog_path.resolve():
            raise ToolError(
                f"{self.output} is the live catalog; write elsewhere (-o) and move it in place "
                "with no crawl running"
            )
        archives = self.datadir.archives()
        if not archives:
            raise ToolError(
                f"no closed archive files under {self.datadir.archive_dir}: nothing to rebuild "
                "the catalog from (check DATA_DIR)"
            )
        scan = scan_archives(archives, self.data_dir)
        rows = newest_rows(scan.indexed)
        n = write_catalog(sorted(rows.values(), key=lambda r: r.key), self.output)
        # A revisit whose original is lost is a page the rebuilt catalog lacks.
        return RebuildResult(self.output, n, scan.records, scan.problems + scan.unresolved)


# -- merge -----------------------------------------------------------------------------


def merge_catalogs(inputs: list[Path], output: Path) -> int:
    """One catalog from several; on a key in several, the newest ``fetched_at`` wins.

    Rows keep their ``archive`` paths (relative to a data directory): gather the
    archives of every input under one ``DATA_DIR/archive`` (their names carry time and
    process id, so they do not clash) and put the merged catalog beside them.
    """
    output = Path(output)
    for path in inputs:
        if Path(path).resolve() == output.resolve():
            raise ToolError(f"{output} is also an input; write the merge to a new file")
        Catalog(path, readonly=True).close()  # exists and has the right schema
    tmp = temp_path(output)
    with Catalog(tmp) as catalog:
        for path in inputs:
            catalog.merge_from(path)
            merge_items_from(catalog.conn, path)
        n = catalog.count()
    finish_db(tmp, output)
    return n
