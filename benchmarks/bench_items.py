"""Item tables: items/s through the writer process, the products crawl with and
without the item pipeline, and how far ``reparse --follow`` lags behind a crawl.

``python -m benchmarks.bench_items [--items N] [--pages N] [--runs N]``; figures go in
docs/benchmarks.md with the command that measured them.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from crawler.helptext import ToolHelpFormatter
from crawler.storage.items import ItemRow, PageItems
from crawler.storage.records import Fetch
from crawler.storage.store import StoreConfig
from crawler.storage.writer.client import WriterProcess
from demo.site import DemoSite

ROOT = Path(__file__).resolve().parent.parent
ITEMS_PER_PAGE = 10


def writer_items_per_second(items: int, workdir: Path) -> tuple[float, int, float]:
    """Small items (4 fields), 10 per page, each page with its row, through the writer:
    items/s, items stored, and the writer process's CPU per page in microseconds (the
    steadier figure on a shared machine)."""
    pages = items // ITEMS_PER_PAGE
    writer = WriterProcess(StoreConfig(workdir / "data", items=True))
    started = time.perf_counter()
    for n in range(pages):
        key = f"{n:064x}"
        url = f"http://example.org/{n}"
        fetch = Fetch(
            key=key,
            url=url,
            final_url=url,
            method="GET",
            request_headers=[],
            request_body=b"",
            status=200,
            response_headers=[("Content-Type", "text/html")],
            body=b"<html>x</html>",
        )
        writer.put(fetch)
        rows = [
            ItemRow("bench_item", {"url": url, "position": i, "price": i * 1.5, "tag": "t"})
            for i in range(ITEMS_PER_PAGE)
        ]
        writer.page_items(PageItems(key, "bench", rows, "2026-01-01T00:00:00Z"))
    summary = writer.close()
    seconds = time.perf_counter() - started
    cpu_per_page = summary["cpu_seconds"] / pages * 1e6
    return summary["items"] / seconds, summary["items"], cpu_per_page


def crawl_seconds(url_file: Path, data_dir: Path, *settings: str) -> tuple[float, float]:
    cmd = [sys.executable, "-m", "scrapy", "crawl", "products", "-a", f"urls={url_file}"]
    cmd += ["-s", f"DATA_DIR={data_dir}", "-s", "AUTOTHROTTLE_ENABLED=0", "-s", "LOG_LEVEL=WARNING"]
    cmd += ["-s", "ROBOTSTXT_OBEY=0", "-s", "CONCURRENT_REQUESTS_PER_DOMAIN=32", *settings]
    started = time.perf_counter()
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU of the crawl and its writer process (waited for by the crawl): less
    # sensitive than the wall time to what else the machine runs.
    used = after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime
    return time.perf_counter() - started, used


def pipeline_ratio(
    site: DemoSite, pages: int, runs: int, workdir: Path
) -> tuple[list[float], list[float]]:
    """Per round, pages/s with the pipeline over pages/s without it, by wall time and
    by CPU time: whole crawl processes, in alternating order (ABBA...), so that a drift
    of the machine's load weighs on both sides alike."""
    urls = workdir / "products.txt"
    urls.write_text("".join(f"{site.base_url}/product/{n}.html\n" for n in range(pages)))
    without_items = ("-s", "ITEM_PIPELINES={}", "-s", "CATALOG_ITEMS_ENABLED=0")
    wall, cpu = [], []
    for run in range(runs):
        order = (True, False) if run % 2 == 0 else (False, True)
        seconds = {}
        for items in order:
            name = f"{'with' if items else 'without'}{run}"
            args = () if items else without_items
            seconds[items] = crawl_seconds(urls, workdir / name, *args)
        wall.append(seconds[False][0] / seconds[True][0])
        cpu.append(seconds[False][1] / seconds[True][1])
    return wall, cpu


def follow_progress(db: Path) -> tuple[int, int] | None:
    """(pages the crawl logged, pages the follower read), None before both exist."""
    with contextlib.suppress(sqlite3.OperationalError):
        connect = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        with contextlib.closing(connect) as conn:
            (logged,) = conn.execute("SELECT count(*) FROM _page_log").fetchone()
            got = conn.execute("SELECT pages FROM _follow_progress").fetchone()
            return logged, got[0] if got else 0
    return None


def follow_lag(site: DemoSite, pages: int, workdir: Path) -> tuple[float, float, int]:
    """A ``site`` crawl at full speed (no throttle, 32 requests per domain) with
    ``reparse products --follow`` beside it: the crawl's pages/s, the most pages the
    follower was behind while the crawl ran, and the seconds from the crawl's end
    until the follower had read every page."""
    urls = workdir / "follow.txt"
    urls.write_text("".join(f"{site.base_url}/product/{n}.html\n" for n in range(pages)))
    data = workdir / "follow-data"
    common = ["-s", f"DATA_DIR={data}", "-s", "LOG_LEVEL=WARNING"]
    started = time.perf_counter()
    crawl = subprocess.Popen(
        [sys.executable, "-m", "scrapy", "crawl", "site", "-a", f"urls={urls}", *common]
        + ["-s", "AUTOTHROTTLE_ENABLED=0", "-s", "ROBOTSTXT_OBEY=0"]
        + ["-s", "CONCURRENT_REQUESTS_PER_DOMAIN=32"],
        cwd=ROOT,
    )
    time.sleep(0.5)  # the follower waits for the catalog the crawl creates
    follower = subprocess.Popen(
        [sys.executable, "-m", "scrapy", "reparse", "products", "--follow", *common], cwd=ROOT
    )
    db = data / "metadata.db"
    behind = 0
    try:
        while crawl.poll() is None:
            got = follow_progress(db)
            if got is not None and got[1]:  # once the follower has started reading
                behind = max(behind, got[0] - got[1])
            time.sleep(0.1)
        ended = time.perf_counter()
        rate = pages / (ended - started)
        while True:
            got = follow_progress(db)
            if got is not None and got[1] >= got[0]:
                return rate, behind, time.perf_counter() - ended
            time.sleep(0.05)
    finally:
        follower.send_signal(signal.SIGTERM)
        follower.wait()


def run(items: int = 200_000, pages: int = 2000, runs: int = 6) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="bench-items-") as tmp:
        workdir = Path(tmp)
        rate, stored, cpu = writer_items_per_second(items, workdir)
        lines = [
            f"writer process: {rate:,.0f} items/s ({stored:,} items, 10 per page; "
            f"writer CPU {cpu:.0f} us per page)"
        ]
        site = DemoSite(pages=pages)
        site.start()
        try:
            wall, cpu = pipeline_ratio(site, pages, runs, workdir)
            for what, ratios in (("pages/s", wall), ("pages per CPU second", cpu)):
                lines.append(
                    f"products crawl, {pages:,} pages, {runs} alternating rounds: {what} "
                    f"with the item pipeline / without, median {statistics.median(ratios):.2f} "
                    f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)})"
                )
            rate, behind, lag = follow_lag(site, pages, workdir)
            lines.append(
                f"reparse products --follow beside a site crawl of {pages:,} pages at full "
                f"speed ({rate:,.0f} pages/s): at most {behind:,} pages behind "
                f"({behind / rate:.1f} s of crawl), caught up {lag:.2f} s after the crawl ended"
            )
        finally:
            site.stop()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        formatter_class=ToolHelpFormatter, description=__doc__.splitlines()[0]
    )
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--pages", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=6, help="rounds of the products crawl")
    args = parser.parse_args()
    for line in run(args.items, args.pages, args.runs):
        print(line)


if __name__ == "__main__":
    main()
