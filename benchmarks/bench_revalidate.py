"""Revalidation of stored pages against a bare spider over the same URLs, whole processes.

    python -m benchmarks.bench_revalidate [--pages 500] [--rounds 2]

Stores ``--pages`` pages of the demo site (ETag and Last-Modified on each; a 304 when
they match), then times from start to exit, in alternating rounds: (1)
``scrapy crawl site -a urls=LIST -a revalidate=1`` over the stored data directory,
every answer a 304; (2) ``benchmarks/bare.py`` over the same list with
``-s ARCHIVE_ENABLED=0``, every answer a 200. Both run with the project's settings,
AutoThrottle included (start delay 1 s), which is what made a revalidation crawl slow:
the stock AutoThrottle lowers its delay on 200s only. Target: (1)/(2) <= 2.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from crawler.helptext import ToolHelpFormatter

ROOT = Path(__file__).resolve().parent.parent
COMMON = ["-s", "LOG_LEVEL=WARNING", "-s", "PROGRESS_INTERVAL=0", "-s", "LOGSTATS_INTERVAL=0"]


def scrapy(args: list[str], log: Path) -> float:
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


def run(pages: int = 500, rounds: int = 2) -> list[str]:
    from demo.site import DemoSite

    site = DemoSite(pages=pages, page_bytes=3000)
    site.start()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-revalidate-") as tmp:
            work = Path(tmp)
            urls = work / "urls.txt"
            urls.write_text("".join(f"{site.base_url}/page/{n}.html\n" for n in range(pages)))
            data = work / "data"
            listed = ["-a", f"urls={urls}", "-s", f"DATA_DIR={data}"]
            scrapy(["crawl", "site", *listed, "-s", "AUTOTHROTTLE_ENABLED=0"], work / "store.log")
            lines = [f"{pages} stored pages, demo site on 127.0.0.1, load {os.getloadavg()[0]:.2f}"]
            for r in range(rounds):
                load = os.getloadavg()[0]
                revalidate = scrapy(
                    ["crawl", "site", *listed, "-a", "revalidate=1"], work / "revalidate.log"
                )
                bare = scrapy(
                    ["runspider", "benchmarks/bare.py", "-a", f"urls={urls}"]
                    + ["-s", "ARCHIVE_ENABLED=0", "-s", "ROBOTSTXT_OBEY=1"],
                    work / "bare.log",
                )
                lines.append(
                    f"round {r + 1}: revalidate {revalidate:.1f} s ({pages / revalidate:.0f}"
                    f" pages/s), bare {bare:.1f} s ({pages / bare:.0f} pages/s), ratio"
                    f" {revalidate / bare:.2f} (target <= 2; load at start {load:.2f})"
                )
            return lines
    finally:
        site.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        formatter_class=ToolHelpFormatter, description=__doc__.splitlines()[0]
    )
    parser.add_argument("--pages", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    for line in run(args.pages, args.rounds):
        print(line, flush=True)


if __name__ == "__main__":
    main()
