"""Politeness is the bottleneck: a list of many hosts, each kept to DOWNLOAD_DELAY,
crawled by several processes, against the ideal schedule (the largest host's URLs x
the delay: no schedule that keeps every host to its delay can be shorter).

    python -m benchmarks.bench_politeness [--hosts 40] [--per-host 25] [--delay 1]
        [--procs 8] [--skew 0.6] [--skew-delay 0.25] [--rounds 1] [--only even|skewed|queue|row]
        [--starts fork|plain|both] [--proxies 2] [--proxy-rotate 50]
        [--proxy-rest 60] [--pg URL]

Each host name has its own server on 127.0.0.1 (tests/hostservers.py), logging every
request; ``python -m slurm.task`` runs ``--procs`` crawl processes (one task, as on a
node), no jitter, ``CONCURRENT_REQUESTS_PER_DOMAIN=1``, AutoThrottle off. Printed per
run: wall time from the task's start to its exit, the ideal, their ratio, the most
requests one host got in any 10 s against what its delay allows (10 / delay + 1), and,
from the servers' logs, when the first request came after the task's start (the
crawls' start-up), how long the requests took, and how long after the last answer the
task exited (the crawls' close and the last shipment). ``--starts both`` runs each
``--only even`` case with the crawls forked from the task's fork server and as plain
processes (``--no-fork-server``), alternating.

- even: ``--hosts`` hosts x ``--per-host`` URLs; runs alternate ``CRAWL_PARTITION``
  ``domain`` (one process per site: polite) and ``url`` (every process asks every host:
  faster, and each host gets one share of its limit per process).
- skewed: the same number of URLs, ``--skew`` of them on one host, at ``--skew-delay``
  (shorter, to keep the run short; the ideal scales with it): ``domain`` (the big host
  on one process), ``url`` with the processes sharing each host's budget through a
  SQLite hub (``HOST_BUDGET_ENABLED``, ``HUB_URL``), and ``url`` alone (impolite).

- queue: the skewed list at ``--delay``, loaded into a SQLite hub's work queue with the
  default partition and with ``url``, and crawled by one queue-mode task
  (``slurm.task --queue``) of ``--procs`` processes through ``--proxies`` leased
  proxies (small forwarding proxies of this benchmark: the servers' names resolve to
  127.0.0.1 for the crawls only), host budgets on. Printed besides: how long crawls
  waited for a proxy and for a host, from the action logs' ``host_wait`` and the hub's
  proxy usage. Its ideal is the larger of the schedule above and the least time the
  proxies' rests allow (``--proxy-rotate`` requests per lease, ``--proxy-rest`` seconds
  between two leases of a proxy).
- row: three crawls of 10 URLs of one host one after another (``scrapy crawl site``,
  ``--delay``) without a hub, then on one SQLite hub, then on one PostgreSQL hub
  (``--pg``, a database the benchmark makes a schema in): what a crawl after a crawl costs.

Timings are noisy on a loaded machine: run it with ``uptime`` beside, and compare the
ratios of one invocation (its runs alternate in one process tree).
"""

from __future__ import annotations

import argparse
import http.client
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from crawler.helptext import ToolHelpFormatter
from crawler.hub import Hub, ProxyPool
from tests.hostservers import HostServers

ROOT = Path(__file__).resolve().parent.parent


def host_names(count: int) -> list[str]:
    return [f"www.site{n:03d}.com" for n in range(count)]


def url_list(hosts: HostServers, names: list[str], counts: list[int]) -> list[str]:
    """Interleaved by host, as a list of many sites usually is."""
    per_host = [hosts.urls(name, n) for name, n in zip(names, counts, strict=True)]
    longest = max(counts)
    return [urls[i] for i in range(longest) for urls in per_host if i < len(urls)]


def run_task(workdir: Path, urls: list[str], hosts: HostServers, procs: int, delay: float,
             partition: str, hub: str | None, start: str = "fork") -> tuple[float, float]:  # fmt: skip
    """Run one task of ``procs`` crawl processes over ``urls``; returns when it started
    and ended (``time.monotonic()``, the clock of the servers' logs)."""
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    (workdir / "stage").mkdir()
    url_file = workdir / "urls.txt"
    url_file.write_text("".join(f"{u}\n" for u in urls))
    settings = {
        "DOWNLOAD_DELAY": delay,
        "DOWNLOAD_DELAY_JITTER": 0,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        "AUTOTHROTTLE_ENABLED": 0,
        "HOST_BUDGET_ENABLED": int(bool(hub)),
        "LOG_LEVEL": "WARNING",
        **hosts.settings(),
    }
    args = [a for k, v in settings.items() for a in ("-s", f"{k}={v}")]
    env = {k: v for k, v in os.environ.items() if k != "HUB_URL"}
    env["PYTHONPATH"] = str(ROOT)
    if hub:
        env["HUB_URL"] = hub
    cmd = [sys.executable, "-m", "slurm.task", "--urls", str(url_file), "--data",
           str(workdir / "data"), "--stage", str(workdir / "stage"), "--task", "0",
           "--tasks", "1", "--procs", str(procs), "--partition", partition,
           "--ship-every", "60", f"--{'' if start == 'fork' else 'no-'}fork-server",
           "--", *args]  # fmt: skip
    return timed_task(cmd, env, workdir / "task.log")


def timed_task(cmd: list[str], env: dict[str, str], log_file: Path) -> tuple[float, float]:
    """Run a task's command, its output to *log_file*; when it started and ended."""
    started = time.monotonic()
    with open(log_file, "wb") as log:
        code = subprocess.call(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    ended = time.monotonic()
    if code != 0:
        raise SystemExit(f"the task failed ({code}): see {log_file}")
    return started, ended


@dataclass(frozen=True)
class ProxyPlan:
    """The leased proxies of a queue run: how many, their uses per lease and their rest."""

    count: int
    rotate: int
    rest: float

    def bound(self, requests: int) -> float:
        """The least wall time the proxies' rests alone allow: each lease serves
        ``rotate`` requests, and a proxy rests ``rest`` seconds between two of its leases."""
        per_proxy = math.ceil(math.ceil(requests / self.rotate) / self.count)
        return max(0, per_proxy - 1) * self.rest


class LoopbackProxy:
    """A forwarding HTTP proxy that sends every request to 127.0.0.1 at the URL's port:
    the benchmark's host names exist only for the crawls' resolver."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                target = urlsplit(self.path)
                upstream = http.client.HTTPConnection("127.0.0.1", target.port, timeout=60)
                path = target.path + (f"?{target.query}" if target.query else "")
                headers = {k: v for k, v in self.headers.items() if not k.startswith("Proxy-")}
                upstream.request("GET", path, headers=headers)
                answer = upstream.getresponse()
                body = answer.read()
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                upstream.close()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def run_queue(workdir: Path, urls: list[str], hosts: HostServers, procs: int, delay: float,
              partition: str, proxies: ProxyPlan) -> tuple[float, float]:  # fmt: skip
    """One queue-mode task over ``urls`` loaded into a SQLite hub's work queue with
    ``partition``, through leased proxies; when it started and ended."""
    if workdir.exists():
        shutil.rmtree(workdir)
    (workdir / "stage").mkdir(parents=True)
    hub_url = f"sqlite:///{workdir}/hub.db"
    forwarders = [LoopbackProxy() for _ in range(proxies.count)]
    try:
        with Hub.open(hub_url) as hub:
            ProxyPool(hub).add([f.url for f in forwarders])
        url_file = workdir / "urls.txt"
        url_file.write_text("".join(f"{u}\n" for u in urls))
        env = {k: v for k, v in os.environ.items() if k != "HUB_URL"}
        env.update(PYTHONPATH=str(ROOT), HUB_URL=hub_url)
        load = [sys.executable, "-m", "scrapy", "queue", "load", "q", str(url_file)]
        if partition != "default":
            load += ["--partition", partition]
        subprocess.run(load, cwd=ROOT, env=env, check=True, capture_output=True)
        settings = {
            "DOWNLOAD_DELAY": delay,
            "DOWNLOAD_DELAY_JITTER": 0,
            "AUTOTHROTTLE_ENABLED": 0,
            "HOST_BUDGET_ENABLED": 1,
            "LOG_LEVEL": "WARNING",
            "PROXY_ROTATE_EVERY": proxies.rotate,
            "PROXY_REST_SECONDS": proxies.rest,
            **hosts.settings(),
        }
        args = [a for k, v in settings.items() for a in ("-s", f"{k}={v}")]
        cmd = [sys.executable, "-m", "slurm.task", "--queue", "q", "--urls", str(url_file), "--data",
               str(workdir / "data"), "--stage", str(workdir / "stage"), "--task", "0",
               "--tasks", "1", "--procs", str(procs), "--ship-every", "60", "--", *args]  # fmt: skip
        started, ended = timed_task(cmd, env, workdir / "task.log")
        with Hub.open(hub_url) as hub:
            waited = hub.query("SELECT COALESCE(SUM(waited), 0), COUNT(*) FROM hub_proxy_usage")
        print(f"{'':<34} proxy leases {waited[0][1]}, waited for a proxy "
              f"{waited[0][0]:.1f} s in all", flush=True)  # fmt: skip
        return started, ended
    finally:
        for forwarder in forwarders:
            forwarder.stop()


def measure(label: str, workdir: Path, names: list[str], counts: list[int], procs: int,
            delay: float, partition: str, hub: bool, start: str = "fork",
            proxies: ProxyPlan | None = None) -> float:  # fmt: skip
    with HostServers(names, latency=0.01) as hosts:
        urls = url_list(hosts, names, counts)
        if proxies:
            started, ended = run_queue(workdir, urls, hosts, procs, delay, partition, proxies)
        else:
            hub_url = f"sqlite:///{workdir}-hub.db" if hub else None
            if hub_url:
                Path(f"{workdir}-hub.db").unlink(missing_ok=True)
            started, ended = run_task(workdir, urls, hosts, procs, delay, partition, hub_url, start)
        busiest = max(server.max_in_window(10.0) for server in hosts)
        logs = [server.log() for server in hosts]
    served = sum(len(log) for log in logs)
    first = min(log[0].start for log in logs if log)
    last = max(r.end or r.start for log in logs for r in log)
    wall, ideal = ended - started, max(counts) * delay
    if proxies:
        ideal = max(ideal, proxies.bound(sum(counts)))
    allowed = int(10 / delay) + 1
    print(
        f"{label:<34} wall {wall:7.1f} s  ideal {ideal:6.1f} s  ratio {wall / ideal:5.2f}  "
        f"busiest host {busiest:4d} requests in 10 s (its delay allows {allowed}); "
        f"{served} requests served\n"
        f"{'':<34} first request {first - started:4.1f} s after the start, requests "
        f"{last - first:5.1f} s, exit {ended - last:4.1f} s after the last answer",
        flush=True,
    )
    return wall / ideal


def crawls_in_a_row(workdir: Path, delay: float, pg: str) -> None:
    from tests.hubs import with_search_path

    hubs = [("no hub", ""), ("SQLite hub", f"sqlite:///{workdir}/hub.db")]
    schema = f"bench_row_{os.getpid()}"
    if pg:
        import psycopg

        with psycopg.connect(pg, autocommit=True) as admin:
            admin.execute(f'CREATE SCHEMA "{schema}"')
        hubs.append(("PostgreSQL hub", with_search_path(pg, schema)))
    workdir.mkdir(parents=True)
    try:
        with HostServers(["www.one.com"], latency=0.02) as hosts:
            urls = hosts.urls("www.one.com", 10 * 3 * len(hubs))
            for h, (label, hub) in enumerate(hubs):
                walls = []
                for n in range(3):
                    first = (h * 3 + n) * 10
                    listed = workdir / f"urls{h}{n}.txt"
                    listed.write_text("".join(f"{u}\n" for u in urls[first : first + 10]))
                    settings = {"DOWNLOAD_DELAY": delay, "DOWNLOAD_DELAY_JITTER": 0,
                                "AUTOTHROTTLE_ENABLED": 0, "HOST_BUDGET_ENABLED": 1,
                                "LOG_LEVEL": "WARNING", "DATA_DIR": workdir / f"data{h}{n}",
                                **hosts.settings()}  # fmt: skip
                    cmd = [sys.executable, "-m", "scrapy", "crawl", "site", "-a",
                           f"urls={listed}"]  # fmt: skip
                    cmd += [a for k, v in settings.items() for a in ("-s", f"{k}={v}")]
                    env = {k: v for k, v in os.environ.items() if k != "HUB_URL"}
                    env.update(PYTHONPATH=str(ROOT), **({"HUB_URL": hub} if hub else {}))
                    started = time.monotonic()
                    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True)
                    walls.append(time.monotonic() - started)
                print(f"10 URLs, delay {delay:g} s, {label:<15} crawls in a row: "
                      + ", ".join(f"{w:5.1f} s" for w in walls), flush=True)  # fmt: skip
    finally:
        if pg:
            with psycopg.connect(pg, autocommit=True) as admin:
                admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def skewed_counts(total: int, args: argparse.Namespace) -> list[int]:
    """``--skew`` of the URLs on the first host, the rest spread over the others."""
    big = round(total * args.skew)
    rest = total - big
    return [big] + [
        rest // (args.hosts - 1) + (1 if i < rest % (args.hosts - 1) else 0)
        for i in range(args.hosts - 1)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=ToolHelpFormatter, description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--hosts", type=int, default=40)
    parser.add_argument("--per-host", type=int, default=25)
    parser.add_argument("--delay", type=float, default=1.0)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--skew", type=float, default=0.6)
    parser.add_argument("--skew-delay", type=float, default=0.25)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--only", choices=("even", "skewed", "queue", "row"))
    parser.add_argument("--pg", default=os.environ.get("PG_TEST_URL", ""),
                        help="row: a PostgreSQL database for a hub (default $PG_TEST_URL)")  # fmt: skip
    parser.add_argument("--proxies", type=int, default=2, help="queue: proxies leased")
    parser.add_argument("--proxy-rotate", type=int, default=50,
                        help="queue: PROXY_ROTATE_EVERY (the project's default: 50)")  # fmt: skip
    parser.add_argument("--proxy-rest", type=float, default=60.0,
                        help="queue: PROXY_REST_SECONDS (the project's default: 60)")  # fmt: skip
    parser.add_argument("--starts", choices=("fork", "plain", "both"), default="fork",
                        help="even: crawls forked from the task's fork server, plain "
                        "processes (--no-fork-server), or both, alternating")  # fmt: skip
    args = parser.parse_args(argv)
    print(f"load before: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs", flush=True)
    names = host_names(args.hosts)
    total = args.hosts * args.per_host
    work = Path(tempfile.mkdtemp(prefix="bench_politeness_"))
    try:
        for r in range(args.rounds):
            if args.only == "row":
                crawls_in_a_row(work / "row", args.delay, args.pg)
                continue
            if args.only == "queue":
                plan = ProxyPlan(args.proxies, args.proxy_rotate, args.proxy_rest)
                for mode in ("default", "url"):
                    measure(f"queue, round {r}, {mode} partition", work / f"queue-{mode}",
                            names, skewed_counts(total, args), args.procs, args.delay, mode,
                            True, proxies=plan)  # fmt: skip
                continue
            if args.only != "skewed":
                even = [args.per_host] * args.hosts
                starts = ("fork", "plain") if args.starts == "both" else (args.starts,)
                for start in starts:
                    ratios = [
                        measure(f"even, round {r}, {mode}, {start}", work / f"even-{mode}",
                                names, even, args.procs, args.delay, mode, False, start)
                        for mode in ("domain", "url")
                    ]  # fmt: skip
                    print(f"  domain / url wall time: {ratios[0] / ratios[1]:.2f}", flush=True)
            if args.only != "even":
                skewed = skewed_counts(total, args)
                for mode, hub in (("domain", False), ("url", True), ("url", False)):
                    label = f"skewed, round {r}, {mode}" + (" + hub budget" if hub else "")
                    measure(label, work / f"skew-{mode}-{hub}", names, skewed, args.procs,
                            args.skew_delay, mode, hub)  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"load after: {os.getloadavg()[0]:.2f} (1 min)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
