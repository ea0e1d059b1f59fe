"""``scrapy catalog stats``: rows by status, content type and host; bytes; compression."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from crawler.storage.datadir import DataDir
from crawler.tools.scan import open_catalog


@dataclass
class CatalogStats:
    rows: int
    by_status: list[tuple[int, int]]
    by_content_type: list[tuple[str, int]]
    by_host: list[tuple[str, int]]
    body_bytes: int
    archive_bytes: int
    archive_files: int
    oldest: str | None
    newest: str | None

    @property
    def ratio(self) -> float:
        return self.body_bytes / self.archive_bytes if self.archive_bytes else 0.0

    def lines(self) -> list[str]:
        out = [
            f"rows            {self.rows:>14,}",
            f"bytes stored    {self.body_bytes:>14,}",
            f"archive bytes   {self.archive_bytes:>14,}  in {self.archive_files} files",
            f"compression     {self.ratio:>14.2f}x",
            f"oldest fetch    {self.oldest or '-':>27}",
            f"newest fetch    {self.newest or '-':>27}",
        ]
        for title, pairs in (
            ("status", self.by_status),
            ("content type", self.by_content_type),
            ("host (top 20)", self.by_host),
        ):
            out.append("")
            out.append(f"{title:<40} {'rows':>12}")
            out.extend(f"{str(name):<40} {count:>12,}" for name, count in pairs)
        return out


def catalog_stats(data_dir: Path, top: int = 20) -> CatalogStats:
    datadir = DataDir(data_dir)
    with open_catalog(data_dir) as catalog:
        rows, body_bytes, oldest, newest = catalog.overview()
        by_status = catalog.count_by("status")
        types: Counter = Counter()
        for content_type, n in catalog.count_by("content_type"):
            types[(content_type or "(none)").split(";")[0].strip().lower()] += n
        hosts: Counter = Counter()
        for url in catalog.column("url"):
            hosts[urlsplit(url).hostname or "(none)"] += 1
        archives = catalog.archives()
    files = {datadir.resolve(a) for a in archives} | set(datadir.archives())
    sizes = [p.stat().st_size for p in files if p.exists()]
    return CatalogStats(
        rows=rows,
        by_status=by_status,
        by_content_type=types.most_common(),
        by_host=hosts.most_common(top),
        body_bytes=body_bytes,
        archive_bytes=sum(sizes),
        archive_files=len(sizes),
        oldest=oldest,
        newest=newest,
    )
