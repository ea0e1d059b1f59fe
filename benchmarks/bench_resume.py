"""A warm re-run of a long list, all stored: how fast a resumed crawl skips.

    python -m benchmarks.bench_resume [--urls 1000000] [--rounds 3] [--workdir DIR]
        [--variants after,thread,before,products,queue] [--queue-partition domain]

Builds, once (cached in ``--workdir``), a data directory holding ``--urls`` stored
URLs, written through the project's store (``crawler.storage.store.Store``: real
WARC records with tiny bodies, real catalog rows; ``scrapy catalog verify`` passes
on it), and the list of those URLs: mostly plain URLs, 1% with an uppercase host,
1% with a non-ASCII path, 1% with an IDN host, each keyed as the ``Request`` Scrapy
builds from the line would be. Then times whole processes,
``scrapy crawl site -a urls=LIST -s DATA_DIR=...`` from start to exit, over the
first tenth of the list and over all of it, and reports URLs/s (start-up included),
the skip rate between the first and the last cache hit (start-up excluded), and the
peak RSS of the crawl's own process (flat memory: about the same at both sizes).

"before" is the way the ``site`` spider started before stored URLs were skipped
ahead of Scrapy: a ``Request`` built per line, dropped in batches of 256 by
``middlewares/resume.py`` (a subclass of the spider run with ``scrapy runspider``).
"thread" keys the next batch in a thread while this one is looked up
(``start_thread = True``) instead of keying every batch on the reactor's thread.
The three alternate for ``--rounds`` rounds; the ratio of each round is printed.

"products" is the same crawl with the ``products`` spider (items): every stored page is
marked parsed for it once (a row of ``_item_pages`` each, as a crawl that parsed it
would leave), so that its stored pages are skipped, not replayed. "queue" crawls a hub
job's work queue instead of the list (``scrapy job create`` in a SQLite hub in
``--workdir``, then ``scrapy crawl site -s JOB=...``; the job is made again, untimed,
before each crawl), its queue split by domain (``CRAWL_PARTITION``, the default) or
with ``--queue-partition url`` by URL.

"plain" is the least a resume must do, in a plain Python process with no Scrapy: read
the list, sha256 each line (the key of a plain URL), look the keys up in the catalog
2,000 at a time, write one JSON line each; its rate is compared with the crawl's skip
rate (both without start-up), and the crawl's peak RSS with that of a crawl of a
1-URL list (what the list adds). ``--variants after`` runs the crawl alone.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import psutil

from crawler.helptext import ToolHelpFormatter

ROOT = Path(__file__).resolve().parent.parent
COMMON = [
    "-s", "LOG_LEVEL=INFO", "-s", "LOG_QUIET=0",  # the stats dump is read
    "-s", "LOGSTATS_INTERVAL=0",
    "-s", "PROGRESS_INTERVAL=0",
    "-s", "ROBOTSTXT_OBEY=0",
    "-s", "AUTOTHROTTLE_ENABLED=0",
]  # fmt: skip

THREAD_SPIDER = """
from spiders.site import SiteSpider


class SiteThread(SiteSpider):
    start_thread = True  # the next batch keyed in a thread while this one is looked up
"""

BEFORE_SPIDER = '''
import scrapy

from spiders.site import SiteSpider


class SiteBefore(SiteSpider):
    """The site spider's start before stored URLs were skipped ahead of Scrapy."""

    async def start(self):
        for number, url, problem in self.url_list:
            if problem:
                continue
            yield scrapy.Request(url, callback=self.parse, meta={"catalog_replay": False})
'''


PLAIN_LOOP = """
import hashlib, json, sqlite3, sys, time
urls, catalog, out = sys.argv[1:4]
conn = sqlite3.connect(f"file:{catalog}?mode=ro", uri=True)
started = time.perf_counter()
with open(urls, encoding="utf-8") as f, open(out, "w", encoding="utf-8") as log:
    while batch := [line.rstrip("\\n") for _, line in zip(range(2000), f)]:
        keys = [hashlib.sha256(url.encode()).hexdigest() for url in batch]
        marks = ",".join("?" * len(keys))
        found = {k for (k,) in conn.execute(f"SELECT key FROM artifacts WHERE key IN ({marks})", keys)}
        for url, key in zip(batch, keys):
            log.write(json.dumps({"url": url, "key": key, "stored": key in found}) + "\\n")
print(time.perf_counter() - started)
"""


def plain(url_file: Path, data_dir: Path, urls: int, workdir: Path) -> float:
    """The plain loop over ``url_file``: URLs per second, start-up excluded."""
    from crawler.storage.datadir import DataDir

    catalog = DataDir(data_dir).catalog_path
    out = workdir / "plain-loop.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", PLAIN_LOOP, str(url_file), str(catalog), str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    return urls / float(done.stdout)


def listed_line(n: int) -> str:
    host = n % 5000
    kind = n % 100
    if kind == 1:
        return f"https://WWW.Site{host}.example/articles/{n}.html"
    if kind == 2:
        return f"https://www.site{host}.example/caf\u00e9/{n}.html?q=\u00fc"
    if kind == 3:
        return f"https://b\u00fccher{host}.example/{n}"
    return f"https://www.site{host}.example/articles/{n}/page.html?id={n}&ref=list"


def build(workdir: Path, urls: int) -> tuple[Path, Path]:
    """The data directory and the list (built once, then reused)."""
    from scrapy import Request

    from crawler.storage.records import Fetch
    from crawler.storage.store import Store, StoreConfig

    data_dir = workdir / f"data-{urls}"
    url_file = workdir / f"urls-{urls}.txt"
    done = workdir / f"built-{urls}"
    if done.exists():
        return data_dir, url_file
    from crawler.storage.keys import request_key

    started = time.perf_counter()
    store = Store(StoreConfig(data_dir, batch_size=5000, flush_seconds=3600))
    with open(url_file, "w", encoding="utf-8") as out:
        for n in range(urls):
            line = listed_line(n)
            out.write(line + "\n")
            url = Request(line).url
            body = b"<html><body>page %d</body></html>" % n
            store.put(
                Fetch(
                    key=request_key(url),
                    url=url,
                    final_url=url,
                    method="GET",
                    request_headers=[("Accept", "*/*")],
                    request_body=b"",
                    status=200,
                    response_headers=[("Content-Type", "text/html; charset=utf-8")],
                    body=body,
                    fetched_at=1_700_000_000.0 + n / 1000,
                )
            )
    store.close()
    done.write_text(f"{urls} URLs built in {time.perf_counter() - started:.0f} s\n")
    return data_dir, url_file


def mark_parsed(data_dir: Path, spider: str) -> None:
    """Every stored page parsed for ``spider`` (once per data directory)."""
    import sqlite3

    from crawler.storage.datadir import DataDir
    from crawler.storage.items import PAGES_SQL, PAGES_TABLE

    done = data_dir / f".bench-parsed-{spider}"
    if done.exists():
        return
    conn = sqlite3.connect(DataDir(data_dir).catalog_path)
    with conn:
        conn.execute(PAGES_SQL)
        conn.execute(
            f"INSERT OR IGNORE INTO {PAGES_TABLE} (_key, _spider, tables, items, parsed_at) "
            "SELECT key, ?, '[]', 0, '2026-01-01T00:00:00.000000Z' FROM artifacts",
            (spider,),
        )
    conn.close()
    done.touch()


def queue_job(workdir: Path, listed: Path, name: str, partition: str) -> dict[str, str]:
    """A job of ``listed`` made (again) in the workdir's hub: the crawl's environment."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), HUB_URL=f"sqlite:///{workdir / 'hub.db'}")
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    args = ["job", "create", name, "--spider", "site", "--urls", str(listed)]
    args += ["-s", f"CRAWL_PARTITION={partition}"]
    subprocess.run(
        [sys.executable, "-m", "scrapy", *args], cwd=ROOT, env=env, check=True, capture_output=True
    )
    return env


def head(url_file: Path, n: int) -> Path:
    part = url_file.with_name(f"{url_file.stem}-first-{n}.txt")
    if not part.exists():
        with open(url_file, "rb") as f, open(part, "wb") as out:
            for _, line in zip(range(n), f, strict=False):
                out.write(line)
    return part


def crawl(
    name: str,
    args: list[str],
    data_dir: Path,
    urls: int,
    workdir: Path,
    env: dict[str, str] | None = None,
) -> dict:
    """One whole crawl process: seconds, peak RSS of its own process, skip rate."""
    from crawler.storage.datadir import DataDir

    log_path = DataDir(data_dir).action_log_path
    log_size = log_path.stat().st_size if log_path.exists() else 0
    load = os.getloadavg()[0]
    if env is None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        env.pop("SCRAPY_SETTINGS_MODULE", None)
    out_path = workdir / f"last-{name}.log"
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with open(out_path, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "scrapy", *args, "-s", f"DATA_DIR={data_dir}", *COMMON],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        watched = psutil.Process(proc.pid)
        peak = 0
        while proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                peak = max(peak, watched.memory_info().rss)
            time.sleep(0.02)
    seconds = time.perf_counter() - started
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = sum(getattr(cpu_after, f) - getattr(cpu_before, f) for f in ("ru_utime", "ru_stime"))
    text = out_path.read_text()
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: crawl failed (exit {proc.returncode}), see {out_path}")
    hits = _stat(text, "catalog/cache_hits")
    if hits != urls or "'downloader/request_count'" in text:
        raise RuntimeError(f"{name}: {hits} cache hits of {urls} (or requests sent); {out_path}")
    rate = _skip_rate(log_path, log_size)
    # The data directory stays as built: this run's cache-hit lines are cut off again.
    with open(log_path, "r+b") as f:
        f.truncate(log_size)
    return {"seconds": seconds, "cpu": cpu, "peak": peak, "skip_rate": rate, "load": load}


def _stat(text: str, name: str) -> int:
    at = text.rfind(f"'{name}': ")
    if at < 0:
        return 0
    start = at + len(name) + 4
    return int(text[start : text.index(",", start)].strip().rstrip("}"))


def _skip_rate(log_path: Path, offset: int) -> float:
    """Cache hits per second between the run's first and last (start-up excluded)."""
    import json
    from datetime import datetime

    with open(log_path, "rb") as f:
        f.seek(offset)
        first = f.readline()
        lines = 1
        last = first
        for last in f:  # noqa: B007 - the last line is wanted
            lines += 1
    parse = lambda line: datetime.strptime(  # noqa: E731
        json.loads(line)["ts"], "%Y-%m-%dT%H:%M:%S.%fZ"
    ).timestamp()
    elapsed = parse(last) - parse(first)
    return lines / elapsed if elapsed >= 0.05 else float("nan")  # too short to tell


def run(
    urls: int = 1_000_000,
    rounds: int = 3,
    workdir: Path | None = None,
    variants: tuple[str, ...] = ("after", "thread", "before"),
    queue_partition: str = "domain",
) -> list[str]:
    workdir = workdir or ROOT / "bench-data" / "resume"
    workdir.mkdir(parents=True, exist_ok=True)
    data_dir, url_file = build(workdir, urls)
    if "products" in variants:
        mark_parsed(data_dir, "products")
    for stale in workdir.glob("hub.db*"):
        stale.unlink()
    lines = [f"data directory: {data_dir} ({(workdir / f'built-{urls}').read_text().strip()})"]
    if not rounds:
        return lines
    before_spider = workdir / "site_before.py"
    before_spider.write_text(BEFORE_SPIDER)
    thread_spider = workdir / "site_thread.py"
    thread_spider.write_text(THREAD_SPIDER)
    results: dict[tuple[str, int], list[dict]] = {}
    plain_rates: dict[int, list[float]] = {}
    sizes = [max(urls // 10, 1), urls]
    for round_ in range(rounds):
        one = head(url_file, 1)
        results.setdefault(("after", 1), []).append(
            crawl("after", ["crawl", "site", "-a", f"urls={one}"], data_dir, 1, workdir)
        )
        for n in sizes:
            listed = head(url_file, n) if n < urls else url_file
            for name, args in (
                ("after", ["crawl", "site", "-a", f"urls={listed}"]),
                ("thread", ["runspider", str(thread_spider), "-a", f"urls={listed}"]),
                ("before", ["runspider", str(before_spider), "-a", f"urls={listed}"]),
                ("products", ["crawl", "products", "-a", f"urls={listed}"]),
                ("queue", ["crawl", "site", "-s", f"JOB=resume-{round_}-{n}"]),
            ):
                if name not in variants:
                    continue
                env = None
                if name == "queue":
                    env = queue_job(workdir, listed, f"resume-{round_}-{n}", queue_partition)
                results.setdefault((name, n), []).append(
                    crawl(name, args, data_dir, n, workdir, env)
                )
            plain_rates.setdefault(n, []).append(plain(listed, data_dir, n, workdir))
    lines.append(
        f"{'run':<8} {'URLs':>10} {'URLs/s whole':>13} {'skip URLs/s':>12} "
        f"{'seconds':>8} {'CPU s':>6} {'peak RSS MB':>12} {'load':>5}"
    )
    for (name, n), runs in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        for r in runs:
            lines.append(
                f"{name:<8} {n:>10,} {n / r['seconds']:>13,.0f} {r['skip_rate']:>12,.0f} "
                f"{r['seconds']:>8.1f} {r['cpu']:>6.1f} {r['peak'] / 1e6:>12.0f} {r['load']:>5.2f}"
            )
    for n in sizes:
        for name in ("after", "products", "queue"):
            if (name, n) not in results:
                continue
            pairs = zip(results[(name, n)], plain_rates[n], strict=True)
            each = ", ".join(
                f"{r['skip_rate']:,.0f}/{p:,.0f} = {r['skip_rate'] / p:.2f}" for r, p in pairs
            )
            lines.append(f"{n:,} URLs, {name}: skip rate / plain loop rate, each round: {each}")
            peaks = zip(results[(name, n)], results[("after", 1)], strict=True)
            each = ", ".join(f"{(r['peak'] - o['peak']) / 1e6:+.1f}" for r, o in peaks)
            lines.append(
                f"{n:,} URLs, {name}: peak RSS minus a 1-URL crawl's, MB, each round: {each}"
            )
        for other in ("before", "thread"):
            if other not in variants:
                continue
            ratios = [
                b["seconds"] / a["seconds"]
                for a, b in zip(results[("after", n)], results[(other, n)], strict=True)
            ]
            each = ", ".join(f"{x:.2f}" for x in ratios)
            lines.append(f"{n:,} URLs: after/{other} speed, whole processes, each round: {each}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        formatter_class=ToolHelpFormatter, description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--urls", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--variants",
        default="after,thread,before",
        help="the crawls to time, of after,thread,before,products,queue",
    )
    parser.add_argument(
        "--queue-partition",
        default="domain",
        help="how the queue variant's job splits its queue: domain (default), host or url",
    )
    args = parser.parse_args()
    variants = tuple(args.variants.split(","))
    for line in run(args.urls, args.rounds, args.workdir, variants, args.queue_partition):
        print(line, flush=True)


if __name__ == "__main__":
    main()
