"""``scrapy catalog verify``: every row's record readable and matching its digest,
and nothing stored missing from the catalog; ``--fix`` repairs what it finds."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from crawler.storage import formats
from crawler.storage.catalog import Catalog
from crawler.storage.datadir import DataDir
from crawler.storage.errors import ArchiveError
from crawler.storage.records import Indexed, Row, payload_digest
from crawler.storage.store import index_missing
from crawler.tools.scan import newest_rows, open_catalog, scan_archives


@dataclass
class VerifyReport:
    rows_checked: int = 0
    bad_rows: list[tuple[Row, str]] = field(default_factory=list)
    orphans: list[Row] = field(default_factory=list)
    orphan_touches: list[tuple] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    archive: Indexed = field(default_factory=Indexed)
    cut: list[Path] = field(default_factory=list)  # files that end inside a record
    dropped: int = 0
    reindexed: int = 0
    repaired: list[Path] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.bad_rows or self.orphans or self.orphan_touches or self.problems)

    def lines(self) -> list[str]:
        out = [
            f"{row.archive}: offset {row.offset}: {row.url}: {why}" for row, why in self.bad_rows
        ]
        out += [
            f"{row.archive}: offset {row.offset}: {row.url}: in the archive, not in the catalog"
            for row in self.orphans
        ]
        out += self.problems
        out.append(
            f"checked {self.rows_checked:,} rows: {len(self.bad_rows):,} unreadable or wrong, "
            f"{len(self.orphans):,} stored records missing from the catalog, "
            f"{len(self.orphan_touches):,} 304 refreshes not applied, "
            f"{len(self.problems):,} unreadable places in the archives"
        )
        if self.dropped or self.reindexed or self.repaired:
            out.append(f"fixed: dropped {self.dropped:,} rows, indexed {self.reindexed:,} records")
            out += [
                f"fixed: cut the partial last record off {p} (kept beside it)"
                for p in self.repaired
            ]
        elif not self.ok:
            out.append(
                "run `scrapy catalog verify --fix` to drop the bad rows (their URLs are "
                "fetched again), index the missing records and cut a partial last "
                "record off a file"
            )
        return out


class Verify:
    """Every row's record is readable and its digest matches; nothing stored is
    missing from the catalog."""

    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)
        self.datadir = DataDir(data_dir)

    def check_row(self, row: Row) -> str | None:
        """Why the row's record is not what the row says, or None."""
        try:
            stored = self.datadir.read(row)
        except (ArchiveError, OSError, ValueError) as exc:
            return f"unreadable ({exc})"
        if stored.key not in (None, row.key):
            return "the record at this offset belongs to another key"
        if row.payload_digest and payload_digest(stored.body) != row.payload_digest:
            return (
                f"digest mismatch (stored {payload_digest(stored.body)}, row {row.payload_digest})"
            )
        if len(stored.body) != row.bytes:
            return f"size mismatch (stored {len(stored.body)}, row {row.bytes})"
        return None

    def run(self) -> VerifyReport:
        report = VerifyReport()
        with open_catalog(self.data_dir) as catalog:
            have: dict[str, str] = {}
            for row in catalog.rows():
                report.rows_checked += 1
                have[row.key] = row.fetched_at
                why = self.check_row(row)
                if why:
                    report.bad_rows.append((row, why))
        scan = scan_archives(self.datadir.archives(), self.data_dir)
        report.problems = scan.problems
        report.archive = scan.indexed
        report.cut = scan.cut
        implied = newest_rows(Indexed(rows=scan.indexed.rows))
        for key, row in implied.items():
            if key not in have or have[key] < row.fetched_at:
                report.orphans.append(row)
        orphan_keys = {r.key for r in report.orphans}
        for touch in scan.indexed.touches:
            key, fetched_at = touch[0], touch[3]
            if key in have and have[key] < fetched_at and key not in orphan_keys:
                report.orphan_touches.append(touch)
        return report

    def fix(self, report: VerifyReport) -> VerifyReport:
        """Drop the bad rows, then index what the archive holds and the catalog lacks,
        and cut a partial last record off a file that ends inside one, keeping it
        beside the file as the recovery of a killed crawl does (hold the data
        directory's lock).

        A dropped row whose key has an older readable record falls back to it, as
        ``rebuild`` would; a key with none is fetched again by the next crawl. A
        revisit whose original record is lost is not indexed: its page is fetched
        again too.
        """
        bad = {(row.archive, row.offset) for row, _ in report.bad_rows}
        readable = [r for r in report.archive.rows if (r.archive, r.offset) not in bad]
        with Catalog(self.datadir.catalog_path) as catalog:
            catalog.delete(row.key for row, _ in report.bad_rows)
            report.dropped = len(report.bad_rows)
            report.reindexed = index_missing(catalog, readable, report.archive.touches)
        for path in report.cut:
            formats.for_path(path).repair(path, self.data_dir)
            report.repaired.append(path)
        return report


def confirm_prompt(question: str, stream_in=None, stream_out=None) -> bool:
    """Ask a yes/no question on the terminal (no terminal: no)."""
    stream_in = stream_in or sys.stdin
    stream_out = stream_out or sys.stderr
    if not stream_in.isatty():
        return False
    stream_out.write(f"{question} [y/N] ")
    stream_out.flush()
    return stream_in.readline().strip().lower() in ("y", "yes")


Confirm = Callable[[str], bool]
