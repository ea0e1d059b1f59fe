"""What a user sees: ``scrapy crawl site`` against a bare Scrapy spider, whole processes.

    python -m benchmarks.bench_speed [--quick] [--pages 5000] [--big 50000] [--rounds 3]
        [--seeds 20] [--budget-off]

Every crawl is a whole process timed from its start to its exit, with the same explicit
settings (``SETTINGS``); pages of 40-60 KB come from nginx on 127.0.0.1. Runs, in
alternating rounds with the ratio of each round:

- (a) a list of ``--pages`` URLs, then of ``--big``: (1) ``benchmarks/bare.py``, a
  spider whose callback does nothing, run with ``scrapy runspider`` from outside the
  project (Scrapy's defaults plus those settings: the reference a user would pick);
  (2) ``scrapy crawl site -a urls=...`` with the storage stack; (3) the same with
  ``-s ARCHIVE_ENABLED=0``; with ``--budget-off``, (4) the storage stack with
  ``-s HOST_BUDGET_ENABLED=0`` (what host budgets cost one process). Target:
  (2)/(1) >= 0.90 at both sizes.
- (b) a linked corpus (same host, every page linking to pages of the next layer)
  crawled with ``-a depth=2``, against ``benchmarks/bare_follow.py`` following the same
  links with ``response.css`` and ``response.follow``; both must reach the same pages.
  Target >= 0.90.
- (d) ``scrapy reparse site`` into the ``page_summary`` table over the stored crawl
  of (a)'s corpus, with ``--workers 1`` and ``2``. Target >= 300 pages/s per core and
  >= 1.8x on two cores.

CPU per page: "crawl" is the crawl's own process, start-up included (the process
tree's CPU less the writer's), "writer" the writer process's. ``--quick`` runs small
sizes, one round, in about a minute, to check that it works; figures come from the
full run on an idle machine.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.bench_crawl import WORDS, Nginx, _stats, make_site
from crawler.helptext import ToolHelpFormatter

ROOT = Path(__file__).resolve().parent.parent
# The same for every run (issue 13), so that the ratios measure what differs.
SETTINGS = [
    "-s", "CONCURRENT_REQUESTS=32",
    "-s", "CONCURRENT_REQUESTS_PER_DOMAIN=32",
    "-s", "DOWNLOAD_DELAY=0",
    "-s", "AUTOTHROTTLE_ENABLED=0",
    "-s", "ROBOTSTXT_OBEY=0",
    "-s", "CONCURRENT_ITEMS=1",  # the project's
    "-s", "LOG_LEVEL=INFO", "-s", "LOG_QUIET=0",  # the stats dump: pages counted, writer CPU
]  # fmt: skip


@dataclass
class Run:
    name: str
    pages: int
    seconds: float  # start to exit
    cpu_seconds: float  # the process tree's
    writer_cpu_seconds: float = 0.0

    @property
    def rate(self) -> float:
        return self.pages / self.seconds

    @property
    def crawl_ms(self) -> float:
        return 1000 * (self.cpu_seconds - self.writer_cpu_seconds) / self.pages

    @property
    def writer_ms(self) -> float:
        return 1000 * self.writer_cpu_seconds / self.pages


def scrapy(args: list[str], cwd: Path, log: Path) -> tuple[float, float, str]:
    """Runs ``scrapy ARGS`` in ``cwd``: wall seconds, CPU seconds of its tree, its log.

    Outside the project (``cwd`` not ROOT) nothing of the project is importable, as
    for a user's own spider."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    if cwd == ROOT:
        env["PYTHONPATH"] = str(ROOT)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with open(log, "w") as out:
        code = subprocess.call(
            [sys.executable, "-m", "scrapy", *args], cwd=cwd, env=env, stdout=out, stderr=out
        )
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    text = log.read_text()
    if code != 0:
        raise RuntimeError(f"scrapy {args[0]} failed (exit {code}): see {log}")
    return seconds, cpu, text


def crawl(name: str, args: list[str], cwd: Path, log: Path, pages: int | None) -> Run:
    seconds, cpu, text = scrapy([*args, *SETTINGS], cwd, log)
    stats = _stats(text)
    done = stats.get("response_received_count", 0)
    if pages is not None and done != pages:
        raise RuntimeError(f"{name}: {done} pages fetched, {pages} expected; see {log}")
    return Run(name, done, seconds, cpu, stats.get("archive/writer_cpu_seconds", 0.0))


# -- the linked corpus -------------------------------------------------------------------


def make_linked_site(root: Path, seeds: int, fanout: int, seed: int = 2) -> int:
    """Layers of pages: ``seeds`` start pages, each linking to ``fanout`` pages of the
    next layer, and so on to depth 2; every page is 40-60 KB with one link per
    paragraph (its ``fanout`` targets over and over, as menus and related links
    repeat). A page is in one layer only, so a depth-2 crawl reaches every page,
    whatever the order of the downloads. Returns the number of pages."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    layers = [seeds, seeds * fanout, seeds * fanout * fanout]
    first = [0, layers[0], layers[0] + layers[1]]
    total = sum(layers)
    for depth, count in enumerate(layers):
        for i in range(count):
            n = first[depth] + i
            if depth < 2:
                targets = [first[depth + 1] + i * fanout + j for j in range(fanout)]
            else:  # the last layer links within itself: those links are not followed
                targets = [first[2] + rng.randrange(layers[2]) for _ in range(fanout)]
            target = rng.randint(40_000, 60_000)
            parts = [f"<!DOCTYPE html><html><head><title>Page {n}</title></head><body>"]
            size = len(parts[0])
            k = 0
            while size < target:
                words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 20)))
                href = targets[k % len(targets)]
                k += 1
                piece = f"<p class='c{k % 9}'>{words} <a href='/l{href}.html'>{href}</a></p>\n"
                parts.append(piece)
                size += len(piece)
            parts.append("</body></html>\n")
            (root / f"l{n}.html").write_text("".join(parts))
    return total


# -- the report --------------------------------------------------------------------------


def median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2]


def table(title: str, runs: dict[str, list[Run]], reference: str) -> list[str]:
    ref = median([r.rate for r in runs[reference]])
    lines = [
        title,
        f"  {'run':48} {'pages/s':>8} {'of (1)':>7} {'crawl ms/page':>14} {'writer ms/page':>15}",
    ]
    for name, rs in runs.items():
        rate = median([r.rate for r in rs])
        crawl_ms = median([r.crawl_ms for r in rs])
        writer = median([r.writer_ms for r in rs])
        lines.append(
            f"  {name:48} {rate:8.0f} {rate / ref:7.2f} {crawl_ms:14.2f} "
            f"{(f'{writer:.2f}' if writer else '-'):>15}"
        )
    ref_runs = runs[reference]
    for name, rs in runs.items():
        if name == reference:
            continue
        ratios = [r.rate / b.rate for r, b in zip(rs, ref_runs, strict=True)]
        lines.append(
            f"  {name.split()[0]}/(1) in each round: {', '.join(f'{x:.2f}' for x in ratios)}; "
            f"median {median(ratios):.2f}"
        )
    lines.append(f"  (bare crawl: {ref:.0f} pages/s on this machine; median of {len(ref_runs)})")
    return lines


# -- the runs ----------------------------------------------------------------------------


def list_crawls(
    base: str, work: Path, docs: Path, pages: int, rounds: int, tag: str, budget_off: bool = False
):
    urls = work / f"urls-{pages}.txt"
    site_pages = len(list(docs.glob("p*.html")))
    # Past the corpus, the same pages again under other query strings.
    urls.write_text(
        "".join(
            f"{base}/p{n % site_pages}.html" + (f"?v={n}" if n >= site_pages else "") + "\n"
            for n in range(pages)
        )
    )
    outside = work / "outside"
    bare = ["runspider", str(ROOT / "benchmarks" / "bare.py"), "-a", f"urls={urls}"]
    site = ["crawl", "site", "-a", f"urls={urls}"]
    runs: dict[str, list[Run]] = {
        "(1) bare spider, runspider, Scrapy defaults": [],
        "(2) scrapy crawl site, storage stack": [],
        "(3) scrapy crawl site, ARCHIVE_ENABLED=0": [],
    }
    four = "(4) scrapy crawl site, HOST_BUDGET_ENABLED=0"
    if budget_off:
        runs[four] = []
    (one, two, three, *_) = runs
    kept = None
    for i in range(rounds):
        log = work / "logs"
        data = work / f"data-{tag}-{i}"
        runs[one].append(crawl(one, bare, outside, log / f"{tag}-{i}-1.log", pages))
        runs[two].append(
            crawl(two, [*site, "-s", f"DATA_DIR={data}"], ROOT, log / f"{tag}-{i}-2.log", pages)
        )
        off = [*site, "-s", "ARCHIVE_ENABLED=0", "-s", f"DATA_DIR={work / 'data-off'}"]
        runs[three].append(crawl(three, off, ROOT, log / f"{tag}-{i}-3.log", pages))
        shutil.rmtree(work / "data-off", ignore_errors=True)
        if budget_off:
            free = [*site, "-s", "HOST_BUDGET_ENABLED=0", "-s", f"DATA_DIR={work / 'data-free'}"]
            runs[four].append(crawl(four, free, ROOT, log / f"{tag}-{i}-4.log", pages))
            shutil.rmtree(work / "data-free", ignore_errors=True)
        if kept is not None:
            shutil.rmtree(kept)
        kept = data
    return runs, kept


def depth_crawls(base: str, work: Path, seeds: int, expected: int, rounds: int):
    urls = work / "seeds.txt"
    urls.write_text("".join(f"{base}/l{n}.html\n" for n in range(seeds)))
    bare = ["runspider", str(ROOT / "benchmarks" / "bare_follow.py"), "-a", f"urls={urls}"]
    site = ["crawl", "site", "-a", f"urls={urls}", "-a", "depth=2"]
    one = "(1) bare spider, response.follow, depth 2"
    two = "(2) scrapy crawl site -a depth=2, storage"
    runs: dict[str, list[Run]] = {one: [], two: []}
    for i in range(rounds):
        log = work / "logs"
        runs[one].append(crawl(one, bare, work / "outside", log / f"depth-{i}-1.log", expected))
        data = work / f"data-depth-{i}"
        args = [*site, "-s", f"DATA_DIR={data}"]
        runs[two].append(crawl(two, args, ROOT, log / f"depth-{i}-2.log", expected))
        shutil.rmtree(data)
    return runs


REPARSED = re.compile(r"Re-parsed ([\d,]+) records into ([\d,]+) items in ([\d.]+) s")


def reparse(data: Path, work: Path, workers: int, pages: int) -> tuple[float, float, float]:
    """``scrapy reparse site`` into page_summary: (pages/s of its own count, pages/s
    start to exit, CPU ms per page of the process tree)."""
    args = ["reparse", "site", "--workers", str(workers), "-s", f"DATA_DIR={data}"]
    seconds, cpu, text = scrapy(args, ROOT, work / "logs" / f"reparse-{workers}.log")
    found = REPARSED.search(text)
    if not found or int(found[1].replace(",", "")) != pages:
        raise RuntimeError(f"reparse: {pages} records expected: {text[-2000:]}")
    if int(found[2].replace(",", "")) != pages:
        raise RuntimeError(f"reparse: one summary per page expected: {found[0]}")
    return pages / float(found[3]), pages / seconds, 1000 * cpu / pages


def run(
    pages: int = 5000,
    big: int = 50000,
    rounds: int = 3,
    seeds: int = 20,
    fanout: int = 15,
    workdir: Path | None = None,
    budget_off: bool = False,
) -> list[str]:
    work = Path(workdir or tempfile.mkdtemp(prefix="bench-speed-"))
    (work / "outside").mkdir(parents=True, exist_ok=True)
    (work / "logs").mkdir(exist_ok=True)
    docs = work / "site"
    make_site(docs, pages)
    linked = make_linked_site(docs, seeds, fanout) if seeds else 0
    nginx = Nginx(docs, work)
    base = nginx.start()
    load = os.getloadavg()
    lines = [
        f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
        f"{os.cpu_count()} cores; logs in {work / 'logs'}"
    ]
    try:
        runs, data = list_crawls(base, work, docs, pages, rounds, "small", budget_off)
        lines += table(f"(a) list crawl, {pages:,} URLs, {rounds} rounds", runs, next(iter(runs)))
        bare_rate = median([r.rate for r in next(iter(runs.values()))])
        if big:
            big_runs, big_data = list_crawls(base, work, docs, big, rounds, "big", budget_off)
            shutil.rmtree(big_data)
            lines += table(
                f"(a) list crawl, {big:,} URLs, {rounds} rounds", big_runs, next(iter(big_runs))
            )
        if seeds:
            depth = depth_crawls(base, work, seeds, linked, rounds)
            lines += table(
                f"(b) depth 2 over a linked corpus: {seeds} seeds, {linked:,} pages reached by both",
                depth,
                next(iter(depth)),
            )
    finally:
        nginx.stop()
    one = reparse(data, work, 1, pages)
    two = reparse(data, work, 2, pages)
    lines += [
        f"(d) scrapy reparse site into page_summary, {pages:,} stored pages "
        f"(bare crawl: {bare_rate:.0f} pages/s on this machine)",
        f"  {'workers':8} {'pages/s':>8} {'start to exit':>14} {'CPU ms/page':>12}",
        f"  {1:<8} {one[0]:8.0f} {one[1]:14.0f} {one[2]:12.2f}",
        f"  {2:<8} {two[0]:8.0f} {two[1]:14.0f} {two[2]:12.2f}",
        f"  2 workers / 1: {two[0] / one[0]:.2f}x ({two[1] / one[1]:.2f}x start to exit)",
    ]
    load = os.getloadavg()
    lines.append(f"load average at end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if workdir is None:
        shutil.rmtree(work)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        formatter_class=ToolHelpFormatter, description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, one round")
    parser.add_argument("--pages", type=int, help="list crawl: URLs (5000)")
    parser.add_argument("--big", type=int, help="the big list crawl: URLs, 0: none (50000)")
    parser.add_argument("--rounds", type=int, help="(3)")
    parser.add_argument("--seeds", type=int, help="linked corpus: start pages, 0: none (20)")
    parser.add_argument("--fanout", type=int, help="linked corpus: links per page (15)")
    parser.add_argument("--budget-off", action="store_true", help="add HOST_BUDGET_ENABLED=0")
    parser.add_argument("--workdir", type=Path, help="keep the corpus, data and logs here")
    args = parser.parse_args()
    # --quick changes the sizes not given on the command line.
    sizes = (1000, 3000, 1, 5, 10) if args.quick else (5000, 50000, 3, 20, 15)
    for name, default in zip(("pages", "big", "rounds", "seeds", "fanout"), sizes, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, default)
    lines = run(
        args.pages, args.big, args.rounds, args.seeds, args.fanout, args.workdir, args.budget_off
    )
    for line in lines:
        print(line, flush=True)


if __name__ == "__main__":
    main()
