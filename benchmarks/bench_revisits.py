"""Revisits: how much a second crawl of a site without validators adds to the archive,
and what comparing digests costs the crawl, whole processes.

    python -m benchmarks.bench_revisits [--pages 1000] [--rounds 3] [--index-rows 200000]
                                        [--parts abc]

The demo site's product pages send no ETag or Last-Modified, as most dynamic sites:
``-a revalidate=1`` fetches each again in full. The site serves ``--pages`` of them on
127.0.0.1; a first crawl stores them, then 10% change.

- (a) Growth of the archive by the second crawl, for each format and ``ARCHIVE_DEDUP``:
  against the budget "compressed bytes of the changed pages (their new rows' records)
  + 1.5 KB per unchanged page", and against the first crawl's archive.
- (b) Speed of the second crawl, in alternating rounds, each run a whole process on
  a fresh copy of the first crawl's data directory: (1) ``benchmarks/bare.py`` over
  the same list with ``-s ARCHIVE_ENABLED=0``; (2) ``scrapy crawl site -a
  revalidate=1`` (``ARCHIVE_DEDUP=url``, the default); (3) the same with
  ``ARCHIVE_DEDUP=off``; (4) with ``ARCHIVE_DEDUP=digest``. Ratios of each round.
- (c) What the index of digests (``ARCHIVE_DEDUP=digest``) costs per row: UPSERTs of
  ``--index-rows`` rows in batches of 200 into a catalog without and with it,
  alternating, and a lookup by digest; CPU time of lookups alone and in batches of
  16 and 64 (``Catalog.by_digests``), and of the writer's ``Store`` per new page, put
  one by one and in batches of 64 (``Store.put_many``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from crawler.helptext import ToolHelpFormatter
from crawler.storage.catalog import Catalog
from crawler.storage.records import Row, payload_digest

ROOT = Path(__file__).resolve().parent.parent
COMMON = [
    "-s", "LOG_LEVEL=WARNING", "-s", "PROGRESS_INTERVAL=0", "-s", "LOGSTATS_INTERVAL=0",
    "-s", "AUTOTHROTTLE_ENABLED=0", "-s", "CONCURRENT_REQUESTS=32",
    "-s", "CONCURRENT_REQUESTS_PER_DOMAIN=32", "-s", "DOWNLOAD_DELAY=0",
]  # fmt: skip
BUDGET_PER_UNCHANGED = 1500


def scrapy(args: list[str], log: Path) -> float:
    """Run ``scrapy ARGS`` from the project root; wall seconds from start to exit."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    started = time.perf_counter()
    with open(log, "w") as out:
        code = subprocess.call(
            [sys.executable, "-m", "scrapy", *args, *COMMON],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    if code != 0:
        raise RuntimeError(f"scrapy {' '.join(args)} exited {code}; see {log}")
    return time.perf_counter() - started


def archive_bytes(data: Path) -> int:
    return sum(p.stat().st_size for p in (data / "archive").iterdir() if p.is_file())


def rows(data: Path) -> dict[str, tuple]:
    with sqlite3.connect(data / "metadata.db") as db:
        found = db.execute('SELECT url, archive, "offset", length FROM artifacts')
        return {url: rest for url, *rest in found}


def answered(data: Path) -> list[str]:
    """The outcomes of the action log's lines so far."""
    path = data / "fetch_log.jsonl"
    if not path.exists():
        return []
    with open(path) as f:
        return [json.loads(line)["outcome"] for line in f]


def check_answered(data: Path, before: int, pages: int) -> None:
    """A run must have stored every page (``ok`` or ``unchanged``), or its figures are
    of another crawl (a loaded machine can make a local server time out)."""
    stored = sum(o in ("ok", "unchanged") for o in answered(data)[before:])
    if stored != pages:
        raise RuntimeError(f"{data}: {stored} of {pages} pages stored; see the logs")


def growth(site, work: Path, urls: Path, fmt: str, dedup: str, changed: set[str]) -> str:
    """One format and mode: crawl, change 10%, crawl again; the second crawl's growth."""
    data = work / f"growth-{fmt}-{dedup}"
    listed = ["-a", f"urls={urls}", "-s", f"DATA_DIR={data}", "-s", f"ARCHIVE_FORMAT={fmt}"]
    listed += ["-s", f"ARCHIVE_DEDUP={dedup}"]
    site.versions.clear()
    scrapy(["crawl", "site", *listed], work / "first.log")
    first = archive_bytes(data)
    before = rows(data)
    for path in changed:
        site.bump(path)
    logged = len(answered(data))
    scrapy(["crawl", "site", *listed, "-a", "revalidate=1"], work / "second.log")
    check_answered(data, logged, len(before))
    grown = archive_bytes(data) - first
    after = rows(data)
    changed_urls = [u for u in after if u.split("/", 3)[3] in {p[1:] for p in changed}]
    changed_bytes = sum(after[u][2] for u in changed_urls)
    unchanged = len(after) - len(changed_urls)
    budget = changed_bytes + BUDGET_PER_UNCHANGED * unchanged
    moved = sum(1 for u in after if after[u] != before[u])
    shutil.rmtree(data)
    return (
        f"  {fmt:6} {dedup:6} {grown / 1e3:9.0f} {budget / 1e3:9.0f} {grown / budget:7.2f}"
        f" {grown / first:8.2f} {(grown - changed_bytes) / max(unchanged, 1):10.0f}"
        f" {moved:6}"
    )


def speed(site, work: Path, urls: Path, pages: int, rounds: int, changed: set[str]) -> list[str]:
    stored = work / "stored"
    site.versions.clear()
    scrapy(["crawl", "site", "-a", f"urls={urls}", "-s", f"DATA_DIR={stored}"], work / "s.log")
    for path in changed:
        site.bump(path)
    names = ["(1) bare.py, ARCHIVE_ENABLED=0", "(2) revalidate, dedup url", "(3) dedup off"]
    names.append("(4) dedup digest")
    runs: dict[str, list[float]] = {name: [] for name in names}
    lines = []
    for r in range(rounds):
        load = os.getloadavg()[0]
        runs[names[0]].append(
            scrapy(
                ["runspider", "benchmarks/bare.py", "-a", f"urls={urls}"]
                + ["-s", "ARCHIVE_ENABLED=0", "-s", "ROBOTSTXT_OBEY=1"],
                work / "bare.log",
            )
        )
        for name, dedup in zip(names[1:], ("url", "off", "digest"), strict=True):
            data = work / "second"
            shutil.rmtree(data, ignore_errors=True)
            shutil.copytree(stored, data)
            args = ["crawl", "site", "-a", f"urls={urls}", "-a", "revalidate=1"]
            args += ["-s", f"DATA_DIR={data}", "-s", f"ARCHIVE_DEDUP={dedup}"]
            logged = len(answered(data))
            runs[name].append(scrapy(args, work / f"{dedup}.log"))
            check_answered(data, logged, pages)
        bare = runs[names[0]][-1]
        ratios = ", ".join(f"{n.split()[0]}/(1) {bare / runs[n][-1]:.2f}" for n in names[1:])
        off = runs[names[2]][-1]
        lines.append(
            f"  round {r + 1} (load {load:.2f}): pages/s as a share of bare: {ratios}; "
            f"(2)/(3) {off / runs[names[1]][-1]:.2f}"
        )
    for name in names:
        best = sorted(runs[name])[len(runs[name]) // 2]
        lines.append(f"  {name:32} median {best:6.1f} s, {pages / best:6.0f} pages/s")
    return lines


def index_cost(n: int, work: Path) -> list[str]:
    """Seconds per row of batched UPSERTs into a catalog without and with the index of
    digests, alternating; and of a lookup by digest."""

    def fill(indexed: bool) -> float:
        path = work / f"index-{indexed}.db"
        for leftover in work.glob(f"index-{indexed}.db*"):
            leftover.unlink()
        with Catalog(path) as catalog:
            if indexed:
                catalog.index_digests()
            started = time.perf_counter()
            with catalog.writer(batch_size=200) as batch:
                for i in range(n):
                    batch.upsert(_row(i))
            return (time.perf_counter() - started) / n

    without, with_index = [], []
    for _ in range(2):
        without.append(fill(False))
        with_index.append(fill(True))
    with Catalog(work / "index-True.db") as catalog:
        started = time.perf_counter()
        for i in range(0, n, max(n // 10_000, 1)):
            assert catalog.by_digest(_row(i).payload_digest) is not None
        lookups = len(range(0, n, max(n // 10_000, 1)))
        lookup = (time.perf_counter() - started) / lookups
        batched = lookup_cpu(catalog, n)
    size = (work / "index-True.db").stat().st_size - (work / "index-False.db").stat().st_size
    a, b = min(without), min(with_index)
    return [
        f"  {n:,} rows in batches of 200: {a * 1e6:.1f} us/row without the index, "
        f"{b * 1e6:.1f} us/row with it (+{(b - a) * 1e6:.1f} us, {b / a:.2f}x); "
        f"the index adds {size / n:.0f} bytes/row to the catalog",
        f"  a lookup by digest: {lookup * 1e6:.1f} us",
        *batched,
        *store_cpu(work / "index-True.db", work),
    ]


def lookup_cpu(catalog: Catalog, n: int) -> list[str]:
    """CPU seconds per digest looked up alone (by_digest) and in batches (by_digests),
    found and not found, best of 3: CPU time, since the machine is shared."""
    found = [_row(i).payload_digest for i in range(0, n, max(n // 5_000, 1))]
    missing = [payload_digest(b"missing %d" % i) for i in range(len(found))]
    lines = []
    for name, digests in (("found", found), ("not found", missing)):
        costs = {}
        for size in (1, 16, 64):
            runs = []
            for _ in range(3):
                started = time.process_time()
                for k in range(0, len(digests), size):
                    if size == 1:
                        catalog.by_digest(digests[k])
                    else:
                        catalog.by_digests(digests[k : k + size])
                runs.append((time.process_time() - started) / len(digests))
            costs[size] = min(runs)
        lines.append(
            f"  CPU per digest {name}: {costs[1] * 1e6:.1f} us alone, "
            f"{costs[16] * 1e6:.1f} us in batches of 16, {costs[64] * 1e6:.1f} us of 64"
        )
    return lines


def store_cpu(catalog: Path, work: Path, pages: int = 3000) -> list[str]:
    """CPU per page the writer's Store spends with ARCHIVE_DEDUP=digest (3 KB pages,
    none stored before, over ``catalog``), put one by one and in batches of 64."""
    from crawler.storage.records import Fetch
    from crawler.storage.store import Store, StoreConfig

    def fetches(run: int) -> list[Fetch]:
        return [
            Fetch(
                key=f"{run}-{i}",
                url=f"http://example.com/{i}",
                final_url=f"http://example.com/{i}",
                method="GET",
                request_headers=[("Accept", "*/*")],
                request_body=b"",
                status=200,
                response_headers=[("Content-Type", "text/html")],
                body=(f"<p>page {run}-{i}</p>" + "x" * 3000).encode(),
            )
            for i in range(pages)
        ]

    costs: dict[int, list[float]] = {1: [], 64: []}
    for run in range(4):
        size = 1 if run % 2 == 0 else 64
        data = work / f"store-{run}"
        (data / "archive").mkdir(parents=True)
        shutil.copy(catalog, data / "metadata.db")
        store = Store(StoreConfig(data_dir=data, dedup="digest"))
        batch = fetches(run)
        started = time.process_time()
        for k in range(0, pages, size):
            store.put_many([(f, None, None) for f in batch[k : k + size]])
        store.close()
        costs[size].append((time.process_time() - started) / pages)
        shutil.rmtree(data)
    one, many = min(costs[1]), min(costs[64])
    return [
        f"  the writer's CPU per 3 KB page with ARCHIVE_DEDUP=digest: {one * 1e6:.0f} us "
        f"put one by one, {many * 1e6:.0f} us in batches of 64 ({many / one:.2f}x)"
    ]


def _row(i: int) -> Row:
    # Keys are hashes, as request keys are: both indexes take rows in random order.
    return Row(
        key=hashlib.sha256(str(i).encode()).hexdigest(),
        url=f"http://example.com/{i}",
        final_url=f"http://example.com/{i}",
        status=200,
        content_type="text/html",
        bytes=3000,
        etag=None,
        last_modified=None,
        fetched_at="2026-01-01T00:00:00.000000Z",
        archive="archive/crawl-1.warc.gz",
        offset=i * 1000,
        length=1000,
        payload_digest=payload_digest(str(i).encode()),
    )


def run(
    pages: int = 1000, rounds: int = 3, index_rows: int = 200_000, parts: str = "abc"
) -> list[str]:
    from demo.site import DemoSite

    site = DemoSite(pages=pages, page_bytes=3000)
    site.start()
    lines = [f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"]
    try:
        with tempfile.TemporaryDirectory(prefix="bench-revisits-") as tmp:
            work = Path(tmp)
            urls = work / "urls.txt"
            urls.write_text("".join(f"{site.base_url}/product/{n}.html\n" for n in range(pages)))
            changed = {f"/product/{n}.html" for n in range(0, pages, 10)}
            if "a" in parts:
                lines.append(
                    f"(a) archive growth of a second crawl of {pages} pages, 10% changed "
                    f"(budget: changed pages' records + {BUDGET_PER_UNCHANGED} B per unchanged)"
                )
                lines.append(
                    f"  {'format':6} {'dedup':6} {'grown KB':>9} {'budget KB':>9} {'/budget':>7}"
                    f" {'/first':>8} {'B/unchngd':>10} {'moved':>6}"
                )
                for fmt in ("warc", "zip", "sqlite"):
                    for dedup in ("url", "off"):
                        lines.append(growth(site, work, urls, fmt, dedup, changed))
            if "b" in parts:
                lines.append(
                    f"(b) the second crawl, {pages} pages, whole processes, {rounds} rounds"
                )
                lines += speed(site, work, urls, pages, rounds, changed)
            if "c" in parts:
                lines.append("(c) the index of payload digests (ARCHIVE_DEDUP=digest)")
                lines += index_cost(index_rows, work)
    finally:
        site.stop()
    lines.append(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        formatter_class=ToolHelpFormatter, description=__doc__.splitlines()[0]
    )
    parser.add_argument("--pages", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--index-rows", type=int, default=200_000)
    parser.add_argument("--parts", default="abc", help="which of (a), (b), (c) to run")
    args = parser.parse_args()
    for line in run(args.pages, args.rounds, args.index_rows, args.parts):
        print(line, flush=True)


if __name__ == "__main__":
    main()
