"""Crawl speed and archive size of each archive format, against the bare spider.

    python -m benchmarks.bench_format_speed [--pages 5000] [--rounds 3] [--quick]

Whole processes, as ``bench_speed.py`` runs them (same settings, same nginx corpus of
40-60 KB pages on 127.0.0.1): in each round, in an order that alternates, (1)
``benchmarks/bare.py`` with ``scrapy runspider``, (2) ``scrapy crawl site`` with
``ARCHIVE_FORMAT=warc``, (3) with ``ARCHIVE_FORMAT=sqlite`` (bodies uncompressed, the
default), (4) with ``ARCHIVE_FORMAT=sqlite -s ARCHIVE_SQLITE_GZIP_LEVEL=6``. Printed:
pages/s and each run's ratio to the bare spider of its round, the sqlite runs' ratio
to WARC's of their round (target: >= 0.95 of the WARC figure), their CPU per page
(crawl process and writer) against WARC's, and the archive files' bytes of each format
against WARC.gz. ``--quick`` runs 1,000 pages, one round.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from benchmarks.bench_crawl import Nginx, make_site
from benchmarks.bench_speed import ROOT, Run, crawl, median, table
from crawler.helptext import ToolHelpFormatter

FORMATS = {
    "(2) crawl site, ARCHIVE_FORMAT=warc": ["-s", "ARCHIVE_FORMAT=warc"],
    "(3) crawl site, ARCHIVE_FORMAT=sqlite": ["-s", "ARCHIVE_FORMAT=sqlite"],
    "(4) crawl site, sqlite, gzip level 6": [
        "-s", "ARCHIVE_FORMAT=sqlite", "-s", "ARCHIVE_SQLITE_GZIP_LEVEL=6",
    ],
}  # fmt: skip
BARE = "(1) bare spider, runspider, Scrapy defaults"
WARC = next(iter(FORMATS))


def archive_bytes(data: Path) -> int:
    return sum(p.stat().st_size for p in (data / "archive").iterdir() if p.is_file())


def run(pages: int = 5000, rounds: int = 3, workdir: Path | None = None) -> list[str]:
    work = Path(workdir or tempfile.mkdtemp(prefix="bench-format-speed-"))
    (work / "outside").mkdir(parents=True, exist_ok=True)
    (work / "logs").mkdir(exist_ok=True)
    docs = work / "site"
    make_site(docs, pages)
    nginx = Nginx(docs, work)
    base = nginx.start()
    urls = work / "urls.txt"
    urls.write_text("".join(f"{base}/p{n}.html\n" for n in range(pages)))
    load = os.getloadavg()
    lines = [f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"]
    runs: dict[str, list[Run]] = {BARE: [], **{name: [] for name in FORMATS}}
    sizes: dict[str, list[int]] = {name: [] for name in FORMATS}
    bare = ["runspider", str(ROOT / "benchmarks" / "bare.py"), "-a", f"urls={urls}"]
    try:
        for rnd in range(rounds):
            order = [BARE, *FORMATS]
            if rnd % 2:
                order.reverse()
            for name in order:
                log = work / "logs" / f"{rnd}-{name[1]}.log"
                if name == BARE:
                    runs[name].append(crawl(name, bare, work / "outside", log, pages))
                    continue
                data = work / f"data-{name[1]}"
                args = ["crawl", "site", "-a", f"urls={urls}", "-s", f"DATA_DIR={data}"]
                runs[name].append(crawl(name, [*args, *FORMATS[name]], ROOT, log, pages))
                sizes[name].append(archive_bytes(data))
                shutil.rmtree(data)
    finally:
        nginx.stop()
    lines += table(f"list crawl, {pages:,} URLs, {rounds} rounds", runs, BARE)
    for name in list(FORMATS)[1:]:
        ratios = [r.rate / w.rate for r, w in zip(runs[name], runs[WARC], strict=True)]
        lines.append(
            f"  {name.split()[0]}/(2) in each round: {', '.join(f'{x:.2f}' for x in ratios)}; "
            f"median {median(ratios):.2f} (target >= 0.95)"
        )
    # CPU per page (the crawl's process and the writer's) suffers less from a busy
    # machine than pages/s does.
    for name in list(FORMATS)[1:]:
        ratios = [
            (r.crawl_ms + r.writer_ms) / (w.crawl_ms + w.writer_ms)
            for r, w in zip(runs[name], runs[WARC], strict=True)
        ]
        lines.append(
            f"  {name.split()[0]}/(2) CPU per page, crawl + writer, in each round: "
            f"{', '.join(f'{x:.2f}' for x in ratios)}; median {median(ratios):.2f}"
        )
    warc_size = median(sizes[WARC])
    lines.append(f"archive files after one crawl of {pages:,} pages:")
    for name in FORMATS:
        size = median(sizes[name])
        lines.append(f"  {name:48} {size / 1e6:8.1f} MB {size / warc_size:6.2f}x WARC.gz")
    load = os.getloadavg()
    lines.append(f"load average at end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if workdir is None:
        shutil.rmtree(work)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        formatter_class=ToolHelpFormatter, description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="1,000 pages, one round")
    parser.add_argument("--pages", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", type=Path, help="keep the corpus and logs here")
    args = parser.parse_args()
    if args.quick:
        args.pages, args.rounds = 1000, 1
    for line in run(args.pages, args.rounds, args.workdir):
        print(line, flush=True)


if __name__ == "__main__":
    main()
