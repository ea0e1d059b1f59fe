"""What every core of a node pays: CPU per page of whole process trees, and two crawls
on two cores, against bare Scrapy spiders over the same pages.

    python -m benchmarks.bench_cores [--pages 20000] [--rounds 3] [--hub] [--quick]

Pages of 40-60 KB come from nginx on 127.0.0.1 (``bench_crawl.make_site``); every run
is a whole process tree started and waited for here, so its CPU is the
``getrusage(RUSAGE_CHILDREN)`` delta: every process it started (writer, fork server,
crawls, shipping) counted, start-up included. In alternating rounds:

- (a) one process over the ``--pages`` URLs: (1) ``benchmarks/bare.py``, a spider whose
  callback does nothing, run from outside the project (Scrapy's defaults plus
  ``bench_speed.SETTINGS``); (2) ``scrapy crawl site``; (3) ``python -m slurm.task
  --tasks 1 --procs 1`` (stage and data directory on the same file system). CPU ms
  per page and its ratio to (1); targets (3)/(1) <= 1.2, (3)/(2) <= 1.15.
- (b) two processes on two cores: ``slurm.task --tasks 1 --procs 2 --partition url``
  against two bare spiders started together over the two halves of the list (the same
  split, ``crawler.partition.shard_of``), wall seconds start to exit; pages/s of
  the task over the bare pair's, target >= 0.9. With ``--hub`` the task runs a third
  time with host budgets through a SQLite hub (``HUB_URL=sqlite:///...``).

Medians over the rounds are printed, with each round's ratio. ``--quick``: 2,000 pages,
one round, to see that it works.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.bench_crawl import Nginx, make_site
from benchmarks.bench_speed import SETTINGS, crawl, median
from crawler.helptext import ToolHelpFormatter
from crawler.partition import shard_of
from crawler.storage.keys import request_key

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Tree:
    """One run of a process tree: pages, wall seconds start to exit, CPU of the tree."""

    pages: int
    seconds: float
    cpu: float

    @property
    def rate(self) -> float:
        return self.pages / self.seconds

    @property
    def ms(self) -> float:
        return 1000 * self.cpu / self.pages


def _env(inside: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    env.pop("PYTHONPATH", None)
    if inside:
        env["PYTHONPATH"] = str(ROOT)
    return env


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def together(commands: list[tuple[list[str], Path, Path, bool]]) -> tuple[float, float]:
    """Runs the commands (argv, cwd, log, inside the project) at once: wall seconds from
    the first start to the last exit, CPU seconds of every process tree."""
    before = _children_cpu()
    started = time.perf_counter()
    procs = []
    for argv, cwd, log, inside in commands:
        out = open(log, "w")  # noqa: SIM115 - closed below, after the process exits
        procs.append((subprocess.Popen(argv, cwd=cwd, env=_env(inside), stdout=out,
                                       stderr=subprocess.STDOUT), out, log))  # fmt: skip
    for proc, out, log in procs:
        code = proc.wait()
        out.close()
        if code != 0:
            raise RuntimeError(f"{' '.join(proc.args[:4])} failed (exit {code}): see {log}")
    return time.perf_counter() - started, _children_cpu() - before


def stored(data: Path) -> int:
    """Rows of the catalogs a task shipped to ``data``."""
    total = 0
    for db in sorted((data / "catalogs").glob("*.db")):
        with sqlite3.connect(db) as con:
            total += con.execute("SELECT count(*) FROM artifacts").fetchone()[0]
        con.close()
    return total


def task(urls: Path, work: Path, tag: str, procs: int, extra: list[str], pages: int) -> Tree:
    data, stage = work / f"data-{tag}", work / f"stage-{tag}"
    argv = [sys.executable, "-m", "slurm.task", "--urls", str(urls), "--data", str(data),
            "--stage", str(stage), "--task", "0", "--tasks", "1", "--procs", str(procs),
            "--partition", "url", "--", *SETTINGS, *extra]  # fmt: skip
    seconds, cpu = together([(argv, ROOT, work / "logs" / f"{tag}.log", True)])
    got = stored(data)
    shutil.rmtree(data)
    shutil.rmtree(stage)
    if got != pages:
        raise RuntimeError(f"slurm.task {tag}: {got} pages stored, {pages} expected")
    return Tree(got, seconds, cpu)


def bare_pair(halves: list[Path], work: Path, tag: str, pages: int) -> Tree:
    bare = str(ROOT / "benchmarks" / "bare.py")
    commands = [
        ([sys.executable, "-m", "scrapy", "runspider", bare, "-a", f"urls={half}", *SETTINGS],
         work / "outside", work / "logs" / f"{tag}-{k}.log", False)
        for k, half in enumerate(halves)
    ]  # fmt: skip
    seconds, cpu = together(commands)
    return Tree(pages, seconds, cpu)


def one_process(base_urls: Path, work: Path, i: int, pages: int) -> dict[str, Tree]:
    logs = work / "logs"
    bare = ["runspider", str(ROOT / "benchmarks" / "bare.py"), "-a", f"urls={base_urls}"]
    out: dict[str, Tree] = {}
    r = crawl("bare", bare, work / "outside", logs / f"a{i}-bare.log", pages)
    out["bare"] = Tree(r.pages, r.seconds, r.cpu_seconds)
    data = work / f"data-site-{i}"
    site = ["crawl", "site", "-a", f"urls={base_urls}", "-s", f"DATA_DIR={data}"]
    r = crawl("site", site, ROOT, logs / f"a{i}-site.log", pages)
    shutil.rmtree(data)
    out["site"] = Tree(r.pages, r.seconds, r.cpu_seconds)
    out["task"] = task(base_urls, work, f"a{i}-task", 1, [], pages)
    return out


def run(pages: int = 20000, rounds: int = 3, hub: bool = False, workdir: Path | None = None):
    work = Path(workdir or tempfile.mkdtemp(prefix="bench-cores-"))
    for sub in ("outside", "logs"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    docs = work / "site"
    site_pages = min(pages, 5000)
    make_site(docs, site_pages)
    nginx = Nginx(docs, work)
    base = nginx.start()
    urls = work / "urls.txt"
    lines = [f"{base}/p{n % site_pages}.html?v={n}\n" for n in range(pages)]
    urls.write_text("".join(lines))
    halves = [work / "half-0.txt", work / "half-1.txt"]
    split: list[list[str]] = [[], []]
    for line in lines:
        url = line.strip()
        split[shard_of(url, request_key(url), "url", 2)].append(line)
    for path, part in zip(halves, split, strict=True):
        path.write_text("".join(part))
    load = os.getloadavg()
    report = [f"load average at start: {load[0]:.2f}; {os.cpu_count()} cores; logs in {work}"]
    one: dict[str, list[Tree]] = {"bare": [], "site": [], "task": []}
    two: dict[str, list[Tree]] = {"bare x2": [], "task --procs 2": []}
    if hub:
        two["task --procs 2, hub"] = []
    try:
        for i in range(rounds):
            for name, tree in one_process(urls, work, i, pages).items():
                one[name].append(tree)
            two["bare x2"].append(bare_pair(halves, work, f"b{i}-bare", pages))
            two["task --procs 2"].append(task(urls, work, f"b{i}-task", 2, [], pages))
            if hub:
                hub_url = f"sqlite:///{work}/hub-{i}.db"
                extra = ["-s", f"HUB_URL={hub_url}", "-s", "HOST_BUDGET_ENABLED=1"]
                two["task --procs 2, hub"].append(task(urls, work, f"b{i}-hub", 2, extra, pages))
    finally:
        nginx.stop()
    names = {"bare": "(1) bare spider", "site": "(2) scrapy crawl site",
             "task": "(3) python -m slurm.task --procs 1"}  # fmt: skip
    report.append(f"(a) one process, {pages:,} URLs, {rounds} rounds (medians)")
    report.append(f"  {'run':36} {'pages/s':>8} {'CPU ms/page':>12} {'/(1)':>6}")
    ref = median([t.ms for t in one["bare"]])
    for key, trees in one.items():
        ms = median([t.ms for t in trees])
        rate = median([t.rate for t in trees])
        report.append(f"  {names[key]:36} {rate:8.0f} {ms:12.2f} {ms / ref:6.2f}")
    for a, b in (("task", "bare"), ("task", "site"), ("site", "bare")):
        each = [x.ms / y.ms for x, y in zip(one[a], one[b], strict=True)]
        report.append(f"  CPU/page {names[a][:3]}/{names[b][:3]} in each round: "
                      f"{', '.join(f'{x:.2f}' for x in each)}; median {median(each):.2f}")  # fmt: skip
    report.append(f"(b) two processes, the list split by URL, {rounds} rounds (medians)")
    report.append(f"  {'run':36} {'pages/s':>8} {'CPU ms/page':>12} {'of bare':>8}")
    ref_rate = median([t.rate for t in two["bare x2"]])
    for key, trees in two.items():
        rate = median([t.rate for t in trees])
        report.append(f"  {key:36} {rate:8.0f} {median([t.ms for t in trees]):12.2f} "
                      f"{rate / ref_rate:8.2f}")  # fmt: skip
    for key, trees in two.items():
        if key != "bare x2":
            each = [t.rate / b.rate for t, b in zip(trees, two["bare x2"], strict=True)]
            report.append(f"  {key} / bare x2 in each round: "
                          f"{', '.join(f'{x:.2f}' for x in each)}; median {median(each):.2f}")  # fmt: skip
    load = os.getloadavg()
    report.append(f"load average at end: {load[0]:.2f}")
    if workdir is None:
        shutil.rmtree(work)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(
        formatter_class=ToolHelpFormatter, description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--pages", type=int, help="URLs per run (20000; --quick 2000)")
    parser.add_argument("--rounds", type=int, help="(3; --quick 1)")
    parser.add_argument("--hub", action="store_true", help="(b) also with a SQLite hub")
    parser.add_argument("--quick", action="store_true", help="small, one round")
    parser.add_argument("--workdir", type=Path, help="keep the corpus and logs here")
    args = parser.parse_args()
    pages = args.pages or (2000 if args.quick else 20000)
    rounds = args.rounds or (1 if args.quick else 3)
    for line in run(pages, rounds, args.hub, args.workdir):
        print(line, flush=True)


if __name__ == "__main__":
    main()
