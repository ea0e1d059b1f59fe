"""Catalog lookups with a large catalog: what a resumed crawl pays per listed URL.

    python -m benchmarks.bench_lookup [--rows 10000000]

Builds a catalog of ``--rows`` synthetic rows, then times the two lookups the crawl
makes: ``present()`` over batches of 256 keys (the start-request fast path; half of
them stored) and ``get()`` of one key (followed links); then what the writer process
pays to commit new rows into it, in transactions of ``CATALOG_BATCH_SIZE`` (200).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import tempfile
import time
from pathlib import Path

from crawler.helptext import ToolHelpFormatter
from crawler.storage.catalog import Catalog

BATCH = 256


COMMIT_BATCH = 200


def _values(n: int) -> tuple:
    # In the order of crawler.storage.catalog.COLUMNS.
    return (_key(n), f"http://example.org/{n}", f"http://example.org/{n}", 200,
            "text/html", 50000, None, None, "2026-01-01T00:00:00.000000Z",
            "archive/a.warc.gz", n, 20000, None, "GET", 0)  # fmt: skip


def _key(n: int) -> str:
    return hashlib.sha256(b"http://example.org/%d" % n).hexdigest()


def build(path: Path, rows: int) -> float:
    started = time.perf_counter()
    with Catalog(path) as catalog:
        chunk = 200_000
        for first in range(0, rows, chunk):
            with catalog.transaction():
                catalog.upsert_values([_values(n) for n in range(first, min(first + chunk, rows))])
    return time.perf_counter() - started


def measure(path: Path, rows: int, seconds: float = 5.0) -> tuple[float, float]:
    rng = random.Random(7)
    with Catalog(path, readonly=True) as catalog:
        looked = 0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            # half stored keys, half keys never stored
            keys = [_key(n) for n in rng.sample(range(rows), BATCH // 2)]
            keys += [_key(rows + rng.randrange(rows)) for _ in range(BATCH // 2)]
            found = catalog.present(keys)
            assert len(found) == BATCH // 2
            looked += BATCH
        batched = looked / (time.perf_counter() - started)
        got = 0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            catalog.get(_key(rng.randrange(rows)))
            got += 1
        single = got / (time.perf_counter() - started)
    return batched, single


def commits(path: Path, rows: int, batches: int = 200) -> float:
    """Microseconds per row to commit ``batches`` transactions of new rows."""
    values = [_values(rows * 2 + n) for n in range(batches * COMMIT_BATCH)]
    with Catalog(path) as catalog:
        started = time.perf_counter()
        for first in range(0, len(values), COMMIT_BATCH):
            with catalog.transaction():
                catalog.upsert_values(values[first : first + COMMIT_BATCH])
        return (time.perf_counter() - started) / len(values) * 1e6


def run(rows: int = 10_000_000, workdir: Path | None = None) -> list[str]:
    workdir = Path(workdir or tempfile.mkdtemp(prefix="bench-lookup-"))
    path = workdir / "metadata.db"
    build_seconds = build(path, rows)
    size = os.path.getsize(path) + sum(
        os.path.getsize(p) for p in workdir.glob("metadata.db-*") if p.exists()
    )
    batched, single = measure(path, rows)
    per_row = commits(path, rows)
    for p in workdir.glob("metadata.db*"):
        p.unlink()
    return [
        f"catalog of {rows:,} rows: built in {build_seconds:.0f} s, {size / 1e9:.2f} GB",
        f"present() in batches of {BATCH} (half stored): {batched:,.0f} keys/s",
        f"get() of one key: {single:,.0f} lookups/s",
        f"commit of new rows, {COMMIT_BATCH} a transaction: {per_row:.1f} us/row",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        formatter_class=ToolHelpFormatter, description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--rows", type=int, default=10_000_000)
    args = parser.parse_args()
    for line in run(args.rows):
        print(line, flush=True)


if __name__ == "__main__":
    main()
