"""Crawl throughput of the storage stack against a bare crawl, on pages served by nginx.

    python -m benchmarks.bench_crawl [--pages 5000] [--big 50000] [--rounds 5]

Runs, in one go, over the same pages: (a) a bare spider storing nothing with the
project's settings, (a') the same spider with Scrapy's defaults, (b) the bare spider
with the project's storage stack, (c) the bare spider with Scrapy's HTTP cache
(FilesystemCacheStorage), (d) a warm re-run of (b) where everything is stored; then
(a), (b) and (d) again over a list ten times longer, for peak memory and skip speed.

(a) and (b) alternate for ``--rounds`` rounds and their medians are reported, with
the ratio of each round: on a shared 2-core machine the speed of one run varies by
10-20% from one minute to the next, more than the difference being measured. The
column "crawl process" is the CPU time of the crawl's own process while its spider
is open (not the writer's, not start-up): the crawl is bound by that one thread, so
(b)'s excess over (a) there is what storage costs the crawl, and it is less noisy
than pages/s.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import random
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import psutil

from crawler.helptext import ToolHelpFormatter
from crawler.storage.datadir import DataDir

ROOT = Path(__file__).resolve().parent.parent
WORDS = [
    "data",
    "crawl",
    "archive",
    "index",
    "record",
    "page",
    "link",
    "server",
    "parse",
    "query",
    "batch",
    "resume",
]
# The same for every run, so that the ratios measure what differs.
COMMON = [
    "-s", "AUTOTHROTTLE_ENABLED=0",
    "-s", "ROBOTSTXT_OBEY=0",
    "-s", "LOG_LEVEL=INFO", "-s", "LOG_QUIET=0",  # the stats dump is read
    "-s", "LOGSTATS_INTERVAL=0",
    "-s", "PROGRESS_INTERVAL=0",
    "-s", "CONCURRENT_REQUESTS=16",
    "-s", "CONCURRENT_REQUESTS_PER_DOMAIN=16",
    "-s", "CLOSESPIDER_ERRORCOUNT=0",
]  # fmt: skip


class NginxUnavailableError(Exception):
    """nginx is not installed (apt-get install nginx-light)."""


@dataclass
class Result:
    name: str
    pages: int
    seconds: float
    cpu_seconds: float
    peak_rss: int
    skip_rate: float | None = None  # cache hits/s, first hit to last (start-up excluded)
    writer_cpu_seconds: float = 0.0  # part of cpu_seconds spent in the writer process
    # CPU of the crawl's own process while the spider was open (start-up excluded):
    # the crawl is bound by its one thread, so this is what storage must not add to.
    crawl_cpu_seconds: float = 0.0
    ratios: list[float] = field(default_factory=list)  # (b)/(a) of each round
    cpu_ratios: list[float] = field(default_factory=list)  # crawl CPU, (b)/(a) per round

    @property
    def rate(self) -> float:
        return self.pages / self.seconds if self.seconds else 0.0


def make_site(root: Path, pages: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for n in range(pages):
        target = rng.randint(40_000, 60_000)
        parts = [f"<!DOCTYPE html><html><head><title>Page {n}</title></head><body>"]
        size = len(parts[0])
        while size < target:
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 20)))
            href = rng.randrange(pages)
            piece = (
                f"<p class='c{rng.randrange(9)}'>{words} <a href='/p{href}.html'>{href}</a></p>\n"
            )
            parts.append(piece)
            size += len(piece)
        parts.append("</body></html>\n")
        (root / f"p{n}.html").write_text("".join(parts))


class Nginx:
    def __init__(self, docroot: Path, workdir: Path):
        self.docroot = docroot
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self) -> str:
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        if not os.path.exists(binary):
            raise NginxUnavailableError("nginx not found: apt-get install nginx-light")
        for _ in range(5):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]
            conf = self.workdir / "nginx.conf"
            conf.write_text(
                f"worker_processes 1; daemon off; pid {self.workdir}/nginx.pid;\n"
                f"error_log {self.workdir}/error.log;\n"
                "events { worker_connections 1024; }\n"
                "http { access_log off; keepalive_requests 100000;\n"
                f"  client_body_temp_path {self.workdir}; proxy_temp_path {self.workdir};\n"
                f"  server {{ listen 127.0.0.1:{self.port}; root {self.docroot};\n"
                "    types { text/html html; } } }\n"
            )
            self.proc = subprocess.Popen([binary, "-c", str(conf), "-p", str(self.workdir)])
            time.sleep(0.5)
            if self.proc.poll() is None:
                return f"http://127.0.0.1:{self.port}"
        raise NginxUnavailableError(f"nginx did not start: see {self.workdir}/error.log")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def _tree_rss(proc: psutil.Process) -> int:
    """RSS of a process and its children (processes may end while we look)."""
    total = 0
    with contextlib.suppress(psutil.Error):
        for p in [proc, *proc.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
    return total


def skip_rate(action_log: Path, hits: int) -> float:
    """Cache hits per second between the first and the last of the last ``hits`` lines."""
    with open(action_log) as f:
        lines = f.readlines()[-hits:]
    first, last = (json.loads(line)["ts"] for line in (lines[0], lines[-1]))
    parse = lambda ts: datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()  # noqa: E731
    return hits / max(parse(last) - parse(first), 1e-3)


def run_crawl(name: str, args: list[str], cwd: Path, pages: int) -> Result:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if cwd != ROOT:
        env.pop("PYTHONPATH")
    log = cwd / f"bench-{name.split()[0]}.log" if cwd != ROOT else ROOT / "bench-data" / "last.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "scrapy", *args, *COMMON],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        watched = psutil.Process(proc.pid)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _tree_rss(watched))
            time.sleep(0.05)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    text = log.read_text()
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: crawl failed (exit {proc.returncode}), see {log}")
    stats = _stats(text)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    done = stats.get("response_received_count", 0) + stats.get("catalog/cache_hits", 0)
    if done != pages:
        raise RuntimeError(f"{name}: {done} pages handled, {pages} expected; see {log}")
    result = Result(name, pages, stats["elapsed_time_seconds"], cpu, peak)
    result.writer_cpu_seconds = stats.get("archive/writer_cpu_seconds", 0.0)
    result.crawl_cpu_seconds = stats.get("bench/crawl_cpu_seconds", 0.0)
    hits = stats.get("catalog/cache_hits", 0)
    if hits == pages:
        data_dir = Path(next(a.split("=", 1)[1] for a in args if a.startswith("DATA_DIR=")))
        result.skip_rate = skip_rate(DataDir(data_dir).action_log_path, hits)
    return result


def _stats(log: str) -> dict:
    start = log.rindex("Dumping Scrapy stats:\n") + len("Dumping Scrapy stats:\n")
    end = log.index("}\n", start) + 1
    text = log[start:end]
    text = text.replace("datetime.datetime(", "(").replace("tzinfo=datetime.timezone.utc", "0")
    return {k: v for k, v in ast.literal_eval(text).items() if not isinstance(v, tuple)}


def median_of(runs: list[Result]) -> Result:
    """The run of median speed, with the highest peak RSS of all."""
    runs = sorted(runs, key=lambda r: r.rate)
    mid = runs[len(runs) // 2]
    return Result(
        mid.name + (f", median of {len(runs)}" if len(runs) > 1 else ""),
        mid.pages,
        mid.seconds,
        mid.cpu_seconds,
        max(r.peak_rss for r in runs),
        writer_cpu_seconds=mid.writer_cpu_seconds,
        crawl_cpu_seconds=mid.crawl_cpu_seconds,
    )


def run(
    pages: int = 5000, big: int = 50000, rounds: int = 5, workdir: Path | None = None
) -> list[str]:
    workdir = Path(workdir or tempfile.mkdtemp(prefix="bench-crawl-"))
    (ROOT / "bench-data").mkdir(exist_ok=True)
    docroot = workdir / "site"
    make_site(docroot, pages)
    nginx = Nginx(docroot, workdir)
    base = nginx.start()
    try:
        urls = workdir / "urls.txt"
        urls.write_text("".join(f"{base}/p{n}.html\n" for n in range(pages)))
        many = workdir / "many.txt"
        many.write_text("".join(f"{base}/p{n % pages}.html?v={n}\n" for n in range(big)))
        bare = ["runspider", str(ROOT / "benchmarks" / "bare.py")]
        outside = workdir / "outside"
        outside.mkdir()
        no_store = ["-s", "ARCHIVE_ENABLED=0"]

        def crawl(name, url_list, extra, n, cwd=ROOT):
            return run_crawl(name, [*bare, "-a", f"urls={url_list}", *extra], cwd, n)

        bare_runs, stored_runs = [], []
        for i in range(rounds):
            bare_runs.append(crawl("(a) bare, project settings", urls, no_store, pages))
            data = workdir / f"data-{i}"
            stored_runs.append(crawl("(b) storage stack", urls, ["-s", f"DATA_DIR={data}"], pages))
        a, b = median_of(bare_runs), median_of(stored_runs)
        pairs = list(zip(bare_runs, stored_runs, strict=True))
        b.ratios = [sb.rate / sa.rate for sa, sb in pairs]
        b.cpu_ratios = [sb.crawl_cpu_seconds / sa.crawl_cpu_seconds for sa, sb in pairs]
        httpcache = ["-s", "HTTPCACHE_ENABLED=1", "-s", f"HTTPCACHE_DIR={workdir / 'httpcache'}"]
        big_data = ["-s", f"DATA_DIR={workdir / 'data-big'}"]
        results = [
            a,
            crawl("(a') bare, Scrapy defaults", urls, [], pages, cwd=outside),
            b,
            crawl("(c) Scrapy HTTP cache", urls, [*no_store, *httpcache], pages),
            crawl("(d) warm re-run of (b)", urls, ["-s", f"DATA_DIR={data}"], pages),
            crawl(f"(a) bare, project settings, {big:,} URLs", many, no_store, big),
            crawl(f"(b) storage stack, {big:,} URLs", many, big_data, big),
            crawl(f"(d) warm re-run, {big:,} URLs", many, big_data, big),
        ]
    finally:
        nginx.stop()
    return report(results, pages)


def report(results: list[Result], pages: int) -> list[str]:
    # Each run is compared with the bare run (a) over the same number of URLs.
    bare = {r.pages: r.rate for r in results if r.name.startswith("(a)")}
    lines = [
        f"{'run':44} {'pages/s':>9} {'CPU ms/page':>12} {'of it writer':>13} "
        f"{'crawl process':>14} {'peak RSS MB':>12} {'ratio to (a)':>13}",
    ]
    for r in results:
        writer = f"{1000 * r.writer_cpu_seconds / r.pages:.2f}" if r.writer_cpu_seconds else "-"
        lines.append(
            f"{r.name:44} {r.rate:9.0f} {1000 * r.cpu_seconds / r.pages:12.2f} {writer:>13} "
            f"{1000 * r.crawl_cpu_seconds / r.pages:14.2f} "
            f"{r.peak_rss / 1e6:12.0f} {r.rate / bare[r.pages]:13.2f}"
        )
    for r in results:
        if r.ratios:
            lines.append(f"{r.name}: (b)/(a) in each round {_each(r.ratios)}")
            lines.append(
                f"{r.name}: CPU of the crawl process, (b)/(a) in each round {_each(r.cpu_ratios)}"
            )
    for r in results:
        if r.skip_rate:
            lines.append(f"{r.name}: skips {r.skip_rate:,.0f} stored URLs/s (start-up excluded)")
    return lines


def _each(ratios: list[float]) -> str:
    median = sorted(ratios)[len(ratios) // 2]
    return ", ".join(f"{x:.2f}" for x in ratios) + f"; median {median:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        formatter_class=ToolHelpFormatter, description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--pages", type=int, default=5000)
    parser.add_argument("--big", type=int, default=50000)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of (a) then (b)")
    args = parser.parse_args()
    for line in run(args.pages, args.big, args.rounds):
        print(line, flush=True)


if __name__ == "__main__":
    main()
