"""Re-parse throughput and random-access reads over a generated corpus.

    python -m benchmarks.bench_reparse [--pages 5000] [--data bench-data/reparse]

The corpus (``--pages`` product pages of ~50 KB, the ``products`` example spider's
page type with a 20-selector parsel parser) is written once straight through the
storage core and reused while its catalog has that many rows.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path

from warcio.archiveiterator import ArchiveIterator

from crawler.helptext import ToolHelpFormatter
from crawler.reparse.plan import ReparseConfig
from crawler.reparse.runner import Reparse
from crawler.storage.catalog import Catalog
from crawler.storage.datadir import DataDir
from crawler.storage.records import Fetch
from crawler.storage.store import Store, StoreConfig
from demo.site import DemoSite

PAGES = 5000
PAGE_BYTES = 50_000
DATA = Path("bench-data/reparse")


def build_corpus(data_dir: Path, pages: int) -> None:
    datadir = DataDir(data_dir)
    db = datadir.catalog_path
    if db.exists():
        with Catalog(db, readonly=True) as catalog:
            if catalog.count() == pages:
                return
    for path in [db, *db.parent.glob(f"{db.name}-*"), *datadir.archive_dir.glob("*")]:
        path.unlink(missing_ok=True)
    site = DemoSite(pages=pages, page_bytes=PAGE_BYTES)
    store = Store(StoreConfig(data_dir=data_dir, rollover_bytes=64_000_000, batch_size=1000))
    for n in range(pages):
        url = f"http://shop.test/product/{n}.html"
        store.put(
            Fetch(
                key=f"{n:064x}",
                url=url,
                final_url=url,
                method="GET",
                request_headers=[],
                request_body=b"",
                status=200,
                response_headers=[("Content-Type", "text/html; charset=utf-8")],
                body=site.product_html(n),
            )
        )
    store.close()


def reparse_rate(data_dir: Path, workers: int) -> tuple[float, int]:
    config = ReparseConfig(spider="products", data_dir=data_dir, workers=workers)
    summary = Reparse(config).run()
    if summary.exit_code or summary.items != summary.records:
        raise RuntimeError(f"re-parse failed: {summary.lines()}")
    return summary.records / summary.seconds, summary.records


def random_reads(data_dir: Path, samples: int = 2000) -> tuple[float, float]:
    """Single-record reads/s in random order: the project's reader (FastWARC), and
    warcio reading the same records, for comparison."""
    datadir = DataDir(data_dir)
    with Catalog(datadir.catalog_path, readonly=True) as catalog:
        rows = list(catalog.rows())
    rng = random.Random(1)
    picks = [rng.choice(rows) for _ in range(samples)]
    started = time.perf_counter()
    for row in picks:
        datadir.read(row)
    fast = samples / (time.perf_counter() - started)
    started = time.perf_counter()
    for row in picks:
        with open(datadir.resolve(row.archive), "rb") as f:
            f.seek(row.offset)
            record = next(iter(ArchiveIterator(f)))
            record.content_stream().read()
    warcio = samples / (time.perf_counter() - started)
    return fast, warcio


def run(pages: int = PAGES, data_dir: Path = DATA) -> list[str]:
    build_corpus(data_dir, pages)
    cores = os.cpu_count() or 1
    one, n = reparse_rate(data_dir, 1)
    many, _ = reparse_rate(data_dir, cores)
    fast, warcio = random_reads(data_dir)
    return [
        f"reparse products, {n:,} pages of {PAGE_BYTES // 1000} KB, 1 worker: {one:,.0f} pages/s",
        f"reparse products, {cores} workers: {many:,.0f} pages/s ({many / one:.2f}x)",
        f"random-access single-record reads: {fast:,.0f}/s (FastWARC), {warcio:,.0f}/s (warcio)",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        formatter_class=ToolHelpFormatter, description=__doc__.splitlines()[0]
    )
    parser.add_argument("--pages", type=int, default=PAGES)
    parser.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args()
    for line in run(args.pages, args.data):
        print(line)


if __name__ == "__main__":
    main()
