"""Proxy leases and the work queue: hub throughput, and crawl speed through the pool vs
direct.

    python -m benchmarks.bench_proxies [--seconds 5] [--pages 800] [--proxies 10000]
        [--queue-urls 200000]

Lease+release operations per second with 1 and 16 client processes on a pool of
``--proxies`` proxies (SQLite and PostgreSQL): one operation is a lease taken and
released; each process rotates (releases its lease and takes the next in one call,
``ProxyPool.rotate``) as a crawl process does when requests wait for a proxy. URLs per
second leased and marked done in batches of 1,000 and 5,000 by 16 processes on
PostgreSQL; a crawl through three tinyproxies against the same crawl direct. Needs
tinyproxy (Debian package) for the crawl part and a PostgreSQL server at PG_TEST_URL
(default postgresql://postgres@127.0.0.1:5432/test) for the PostgreSQL parts; either one
missing is reported as skipped. Takes about two minutes with the defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

from crawler.helptext import ToolHelpFormatter
from crawler.hub import Hub, ProxyPool, WorkQueue

ROOT = Path(__file__).resolve().parent.parent
PG_URL = os.environ.get("PG_TEST_URL", "postgresql://postgres@127.0.0.1:5432/test")
CHURN_SECONDS = 5.0
PROXIES = 10_000
PAGES = 800
QUEUE_URLS = 200_000
PROCESSES = (1, 16)
QUEUE_PROCESSES = 16
STARTUP_SECONDS = 0.5  # per process, on a loaded 2-core machine: when they all churn


SPIDER = """
import json, sys, time
from scrapy import Request, Spider, signals
from scrapy.crawler import CrawlerProcess

class Pages(Spider):
    name = "bench"
    times = []
    def __init__(self, base, pages, **kw):
        super().__init__(**kw)
        self.base, self.pages = base, int(pages)
    async def start(self):
        for n in range(self.pages):
            yield Request(f"{self.base}/page/{n}")
    def parse(self, response):
        self.times.append(time.monotonic())

settings = json.loads(sys.argv[1])
process = CrawlerProcess(settings)
process.crawl(Pages, base=sys.argv[2], pages=sys.argv[3])
process.start()
t = Pages.times
print(json.dumps({"pages": len(t), "seconds": t[-1] - t[0] if len(t) > 1 else 0}))
"""


def _python(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _start_at(processes: int) -> float:
    return time.time() + 2.0 + STARTUP_SECONDS * processes


def lease_rate(url: str, processes: int, proxies: int, seconds: float = CHURN_SECONDS) -> float:
    """Lease+release operations per second over all processes."""
    with Hub.open(url) as hub:
        ProxyPool(hub).add(f"http://10.{n // 62500}.{n // 250 % 250}.{n % 250}:3128"
                           for n in range(proxies))  # fmt: skip
    start = str(_start_at(processes))
    churn = ("-m", "benchmarks.proxy_churn", url, str(seconds), "0", start)
    workers = [_python(*churn) for _ in range(processes)]
    total = 0
    for worker in workers:
        out, err = worker.communicate(timeout=seconds + 120)
        if worker.returncode:
            raise RuntimeError(err[-2000:])
        total += int(out)
    return total / seconds


def queue_rate(url: str, processes: int, urls: int, batch: int) -> float:
    """URLs per second leased and marked done in batches, over all processes."""
    with Hub.open(url) as hub:
        WorkQueue(hub, "bench").load(f"http://127.0.0.1:8000/page/{n}" for n in range(urls))
    churn = ("-m", "benchmarks.queue_churn", url, "bench", str(batch))
    workers = [_python(*churn, str(_start_at(processes))) for _ in range(processes)]
    done, starts, ends = 0, [], []
    for worker in workers:
        out, err = worker.communicate(timeout=600)
        if worker.returncode:
            raise RuntimeError(err[-2000:])
        n, started, ended = out.split()
        done, starts, ends = done + int(n), starts + [float(started)], ends + [float(ended)]
    if done != urls:
        raise RuntimeError(f"the queue handed out {done:,} URLs of {urls:,}")
    return done / (max(ends) - min(starts))


def _pg_schema() -> tuple[str, object] | None:
    try:
        import psycopg

        admin = psycopg.connect(PG_URL, autocommit=True, connect_timeout=5)
    except Exception:
        return None
    schema = f"hubbench_{uuid.uuid4().hex[:8]}"
    admin.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{sep}options=-csearch_path%3D{schema}", (admin, schema)


def _on_postgres(measure) -> float | None:
    """*measure(url)* on a schema of its own, dropped after; None without a server."""
    made = _pg_schema()
    if made is None:
        return None
    url, (admin, schema) = made
    try:
        return measure(url)
    finally:
        admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
        admin.close()


def bench_leases(
    workdir: Path, seconds: float = CHURN_SECONDS, proxies: int = PROXIES
) -> list[str]:
    lines = []
    for processes in PROCESSES:
        url = f"sqlite:///{workdir}/hub-{processes}.db"
        rate = lease_rate(url, processes, proxies, seconds)
        lines.append(
            f"hub sqlite: {processes} process(es), {proxies:,} proxies, "
            f"lease+release {rate:,.0f} ops/s"
        )
    for processes in PROCESSES:
        rate = _on_postgres(lambda url, n=processes: lease_rate(url, n, proxies, seconds))
        if rate is None:
            lines.append(f"hub postgresql: skipped (no server at PG_TEST_URL={PG_URL})")
            break
        lines.append(
            f"hub postgresql: {processes} process(es), {proxies:,} proxies, "
            f"lease+release {rate:,.0f} ops/s"
        )
    return lines


def bench_queue(urls: int = QUEUE_URLS) -> list[str]:
    lines = []
    for batch in (1000, 5000):
        rate = _on_postgres(lambda url, b=batch: queue_rate(url, QUEUE_PROCESSES, urls, b))
        if rate is None:
            return [f"work queue postgresql: skipped (no server at PG_TEST_URL={PG_URL})"]
        lines.append(
            f"work queue postgresql: {QUEUE_PROCESSES} processes, {urls:,} URLs in batches "
            f"of {batch:,}, leased+done {rate:,.0f} URLs/s"
        )
    return lines


def crawl_rate(base: str, settings: dict[str, object], pages: int = PAGES) -> float:
    settings = {
        "LOG_LEVEL": "WARNING",
        "ROBOTSTXT_OBEY": False,
        "CONCURRENT_REQUESTS": 16,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 16,
        "TELNETCONSOLE_ENABLED": False,
        **settings,
    }
    worker = _python("-c", textwrap.dedent(SPIDER), json.dumps(settings), base, str(pages))
    out, err = worker.communicate(timeout=300)
    result = json.loads(out.strip().splitlines()[-1]) if out.strip() else None
    if worker.returncode or not result or result["pages"] != pages:
        raise RuntimeError(f"benchmark crawl failed: {err[-2000:]}")
    return result["pages"] / result["seconds"]


def bench_crawl(workdir: Path, pages: int = PAGES) -> list[str]:
    if shutil.which("tinyproxy") is None:
        return ["crawl through the pool: skipped (tinyproxy is not installed)"]
    from tests.proxy_servers import Origin, TinyProxy

    origin = Origin()
    proxies = [TinyProxy(f"bench-{n}", workdir) for n in range(3)]
    try:
        for proxy in proxies:
            proxy.start()
        hub_url = f"sqlite:///{workdir}/crawl-hub.db"
        with Hub.open(hub_url) as hub:
            ProxyPool(hub).add([p.url for p in proxies])
        direct = crawl_rate(origin.base, {}, pages)
        pooled = crawl_rate(
            origin.base,
            {
                "DOWNLOADER_MIDDLEWARES": {"middlewares.proxy_lease.ProxyLeaseMiddleware": 740},
                "HUB_URL": hub_url,
                "PROXY_LEASES_PER_PROCESS": 3,
                "PROXY_ROTATE_EVERY": 100,
                "PROXY_REST_SECONDS": 0,
            },
            pages,
        )
    finally:
        for proxy in proxies:
            proxy.stop()
        origin.stop()
    return [
        f"crawl direct: {direct:,.0f} pages/s ({pages} pages, 16 concurrent, loopback origin)",
        f"crawl through the pool: {pooled:,.0f} pages/s (3 tinyproxies, 3 leases, "
        f"rotate every 100) = {pooled / direct:.0%} of direct",
    ]


def run(
    seconds: float = CHURN_SECONDS,
    pages: int = PAGES,
    proxies: int = PROXIES,
    queue_urls: int = QUEUE_URLS,
) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="bench-proxies-") as tmp:
        workdir = Path(tmp)
        os.chmod(workdir, 0o755)
        lines = bench_leases(workdir, seconds, proxies) + bench_queue(queue_urls)
        lines += bench_crawl(workdir, pages) if pages else []
    load = ", ".join(f"{n:.2f}" for n in os.getloadavg())
    return lines + [f"load average (1, 5, 15 min) at the end: {load} on {os.cpu_count()} CPUs"]


def main() -> None:
    parser = argparse.ArgumentParser(
        formatter_class=ToolHelpFormatter, prog="python -m benchmarks.bench_proxies"
    )
    parser.add_argument("--seconds", type=float, default=CHURN_SECONDS, help="per lease run")
    parser.add_argument("--pages", type=int, default=PAGES, help="pages per crawl (0: none)")
    parser.add_argument("--proxies", type=int, default=PROXIES, help="proxies in the pool")
    parser.add_argument("--queue-urls", type=int, default=QUEUE_URLS, help="URLs queued")
    args = parser.parse_args()
    print(*run(args.seconds, args.pages, args.proxies, args.queue_urls), sep="\n")


if __name__ == "__main__":
    main()
