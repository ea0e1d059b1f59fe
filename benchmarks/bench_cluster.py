"""A cluster-sized rehearsal on one machine: many crawl processes, one PostgreSQL hub.

    python -m benchmarks.bench_cluster [--tasks 10] [--procs 4] [--proxies 10]
        [--urls 100000] [--batch 500]

``--tasks`` queue-mode tasks (``python -m slurm.task --queue``) of ``--procs`` crawl
processes each share one hub: a PostgreSQL cluster of their own (tests/pg_cluster.py,
so that its CPU can be measured), holding a work queue of ``--urls`` URLs served by
nginx and a pool of ``--proxies`` real tinyproxies every request goes through. Then it
checks what a real run must hold: every URL stored exactly once across all processes'
catalogs and fetched once, no proxy ever held by two processes at once (from the hub's
usage table), every proxy used, every task finished, the merged catalog passing
``scrapy catalog verify``; and reports pages/s, hub operations/s (committed
transactions) and the hub's CPU. ``tests/test_cluster.py`` runs a small one.

Needs nginx and tinyproxy (``apt-get install nginx-light tinyproxy``), PostgreSQL 15's
``initdb``/``pg_ctl`` and root (to run them as ``postgres``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from crawler.helptext import ToolHelpFormatter
from crawler.hub import Hub, ProxyPool, WorkQueue

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "rehearsal"


@dataclass(frozen=True)
class RehearsalConfig:
    tasks: int = 10
    procs: int = 4  # crawl processes per task
    proxies: int = 10
    urls: int = 100_000
    batch: int = 500
    rotate_every: int = 10
    timeout: float = 3600.0

    def crawl_settings(self) -> dict[str, object]:
        return {
            "PROXY_LEASES_PER_PROCESS": 1,
            "PROXY_ROTATE_EVERY": self.rotate_every,
            "PROXY_REST_SECONDS": 0,
            "PROXY_POLL_SECONDS": 0.2,
            "PROXY_LEASE_TTL": 30,
            "CONCURRENT_REQUESTS": 8,
            "ROBOTSTXT_OBEY": False,
            "AUTOTHROTTLE_ENABLED": False,
            "LOG_LEVEL": "INFO",
            "TELNETCONSOLE_ENABLED": False,
        }


@dataclass
class RehearsalResult:
    seconds: float = 0.0
    pages: int = 0
    hub_transactions: int = 0
    hub_cpu_seconds: float = 0.0
    leases: int = 0
    problems: list[str] = field(default_factory=list)

    def lines(self, config: RehearsalConfig) -> list[str]:
        procs = config.tasks * config.procs
        return [
            f"{procs} crawl processes ({config.tasks} tasks x {config.procs}), "
            f"{config.proxies} tinyproxies, {config.urls:,} URLs from nginx, "
            f"batches of {config.batch}",
            f"pages/s: {self.pages / self.seconds:,.0f} ({self.pages:,} in {self.seconds:.0f} s)",
            f"hub: {self.hub_transactions / self.seconds:,.0f} transactions/s, "
            f"{self.leases:,} proxy leases, CPU {self.hub_cpu_seconds:.2f} s "
            f"({100 * self.hub_cpu_seconds / self.seconds:.0f}% of one core)",
            "checks: " + ("all hold" if not self.problems else "; ".join(self.problems)),
        ]


class Nginx:
    """nginx answering every path with a small page that names it."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.base = ""

    def start(self) -> None:
        from tests.servers import free_port

        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        port = free_port()
        conf = self.workdir / "nginx.conf"
        conf.write_text(
            f"worker_processes 1; daemon off; pid {self.workdir}/nginx.pid;\n"
            f"error_log {self.workdir}/error.log;\n"
            "events { worker_connections 4096; }\n"
            "http { access_log off; keepalive_requests 100000;\n"
            f"  client_body_temp_path {self.workdir}; proxy_temp_path {self.workdir};\n"
            f"  server {{ listen 127.0.0.1:{port};\n"
            "    location / { default_type text/html;\n"
            '      return 200 "<html><body><h1>$uri</h1></body></html>"; } } }\n'
        )
        self.proc = subprocess.Popen([binary, "-c", str(conf), "-p", str(self.workdir)])
        _wait_port(port, self.proc)
        self.base = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server on port {port} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port} after {timeout:g} s")


class CpuMeter:
    """CPU seconds of a process tree, including children that exit before the end."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> None:
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return
        for proc in procs:
            try:
                times = proc.cpu_times()
                self.seen[proc.pid] = times.user + times.system
            except psutil.Error:
                continue

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            self._sample()

    def start(self) -> None:
        self._sample()
        self.base = sum(self.seen.values())
        self._thread.start()

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        self._sample()
        return sum(self.seen.values()) - self.base


class Rehearsal:
    """One rehearsal in *workdir*; :meth:`run` returns what it measured and found."""

    def __init__(self, workdir: Path, config: RehearsalConfig) -> None:
        self.workdir = workdir
        self.config = config
        self.data = workdir / "data"
        self.urls = [f"/p/{n}.html" for n in range(config.urls)]

    def run(self) -> RehearsalResult:
        from tests.pg_cluster import PgCluster
        from tests.proxy_servers import TinyProxy

        (self.workdir / "proxies").mkdir()
        (self.workdir / "nginx").mkdir()
        nginx = Nginx(self.workdir / "nginx")
        proxies = [
            TinyProxy(f"px{n}", self.workdir / "proxies") for n in range(self.config.proxies)
        ]
        cluster = PgCluster()
        try:
            cluster.start()
            nginx.start()
            for proxy in proxies:
                proxy.start()
            urls = [nginx.base + path for path in self.urls]
            self._prepare(cluster.url, urls, [p.url for p in proxies])
            return self._measure(cluster, urls, proxies)
        finally:
            for proxy in proxies:
                proxy.stop()
            nginx.stop()
            cluster.destroy()

    def _prepare(self, hub_url: str, urls: list[str], proxy_urls: list[str]) -> None:
        with Hub.open(hub_url) as hub:
            ProxyPool(hub).add(proxy_urls)
            WorkQueue(hub, QUEUE).load(urls)
        (self.workdir / "urls.txt").write_text("".join(u + "\n" for u in urls))

    def _task(self, i: int, hub_url: str) -> subprocess.Popen[bytes]:
        c = self.config
        settings = [arg for k, v in c.crawl_settings().items() for arg in ("-s", f"{k}={v}")]
        command = [
            sys.executable, "-m", "slurm.task", "--urls", str(self.workdir / "urls.txt"),
            "--data", str(self.data), "--stage", str(self.workdir / "stage" / f"t{i}"),
            "--task", str(i), "--tasks", str(c.tasks), "--procs", str(c.procs),
            "--queue", QUEUE, "--batch", str(c.batch), "--name", f"t{i}", "--ship-every", "60",
            "--", *settings,
        ]  # fmt: skip
        env = {**os.environ, "HUB_URL": hub_url, "WORK_LEASE_TTL": "120"}
        env["PYTHONPATH"] = str(ROOT)
        with open(self.workdir / f"task{i}.log", "wb") as log:
            return subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )

    def _measure(self, cluster, urls: list[str], proxies: list) -> RehearsalResult:
        result = RehearsalResult()
        with Hub.open(cluster.url) as hub:
            before = _transactions(hub)
        meter = CpuMeter(cluster.postmaster_pid())
        meter.start()
        started = time.monotonic()
        tasks = [self._task(i, cluster.url) for i in range(self.config.tasks)]
        deadline = started + self.config.timeout
        codes = []
        for task in tasks:
            try:
                codes.append(task.wait(timeout=max(deadline - time.monotonic(), 1)))
            except subprocess.TimeoutExpired:
                task.kill()
                codes.append(task.wait())
        result.seconds = time.monotonic() - started
        result.hub_cpu_seconds = meter.stop()
        with Hub.open(cluster.url) as hub:
            result.hub_transactions = _transactions(hub) - before
            self._check_hub(hub, result, len(proxies))
        failed = [i for i, code in enumerate(codes) if code != 0]
        if failed:
            result.problems.append(f"tasks {failed} did not finish (see task<i>.log)")
        self._check_stored(urls, result)
        self._check_fetched(urls, proxies, result)
        return result

    def _check_hub(self, hub: Hub, result: RehearsalResult, proxies: int) -> None:
        pool = ProxyPool(hub)
        usage = pool.usage()
        result.leases = len(usage)
        by_proxy: dict[int, list[tuple[float, float]]] = defaultdict(list)
        for row in usage:
            if row.ended is None:
                result.problems.append(f"lease {row.id} never ended")
            by_proxy[row.proxy_id].append((row.started, row.ended or float("inf")))
        for proxy_id, spans in by_proxy.items():
            spans.sort()
            overlaps = sum(1 for a, b in zip(spans, spans[1:], strict=False) if b[0] < a[1])
            if overlaps:
                result.problems.append(f"proxy {proxy_id}: {overlaps} overlapping leases")
        if len(by_proxy) != proxies:
            result.problems.append(f"{proxies - len(by_proxy)} proxies never used")
        progress = WorkQueue(hub, QUEUE, create=False).progress()
        if not progress.finished:
            result.problems.append(f"queue not finished: {progress.line()}")

    def _check_stored(self, urls: list[str], result: RehearsalResult) -> None:
        stored: Counter[str] = Counter()
        for catalog in sorted((self.data / "catalogs").glob("*.db")):
            with sqlite3.connect(f"file:{catalog}?mode=ro", uri=True) as db:
                stored.update(url for (url,) in db.execute("SELECT url FROM artifacts"))
        result.pages = sum(stored.values())
        twice = sum(1 for n in stored.values() if n > 1)
        missing = len(set(urls) - set(stored))
        if twice or missing:
            result.problems.append(f"{twice} URLs stored more than once, {missing} not stored")
        merged = subprocess.run(
            [sys.executable, "-m", "slurm.ship", "merge", str(self.data)],
            cwd=ROOT, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        verified = subprocess.run(
            [sys.executable, "-m", "scrapy", "catalog", "verify", "-s", f"DATA_DIR={self.data}"],
            cwd=ROOT, capture_output=True, text=True, timeout=1200,
        )  # fmt: skip
        if merged.returncode or verified.returncode:
            result.problems.append(
                f"merge exit {merged.returncode}, verify exit {verified.returncode}: "
                + (merged.stderr + verified.stdout + verified.stderr)[-500:]
            )

    def _check_fetched(self, urls: list[str], proxies: list, result: RehearsalResult) -> None:
        sent: Counter[str] = Counter()
        for proxy in proxies:
            for line in proxy.requests_logged():
                sent[line.split(": GET ", 1)[-1].split(" ", 1)[0]] += 1
        again = sum(1 for n in sent.values() if n > 1)
        if again or set(sent) != set(urls):
            result.problems.append(
                f"{again} URLs sent through the proxies more than once, "
                f"{len(set(urls) - set(sent))} never"
            )


def _transactions(hub: Hub) -> int:
    rows = hub.query(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
    )
    return int(rows[0][0])


def main() -> None:
    parser = argparse.ArgumentParser(
        formatter_class=ToolHelpFormatter, prog="python -m benchmarks.bench_cluster"
    )
    defaults = RehearsalConfig()
    for name in ("tasks", "procs", "proxies", "urls", "batch"):
        parser.add_argument(f"--{name}", type=int, default=getattr(defaults, name))
    args = parser.parse_args()
    config = RehearsalConfig(args.tasks, args.procs, args.proxies, args.urls, args.batch)
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        workdir = Path(tmp)
        os.chmod(workdir, 0o755)
        result = Rehearsal(workdir, config).run()
    load = ", ".join(f"{n:.2f}" for n in os.getloadavg())
    print(*result.lines(config), f"load average (1, 5, 15 min) at the end: {load}", sep="\n")


if __name__ == "__main__":
    main()
