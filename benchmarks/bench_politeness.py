"""Politeness is the bottleneck: a list of many hosts, each kept to DOWNLOAD_DELAY,
crawled by several processes, against the ideal schedule (the largest host's URLs x
the delay: no schedule that keeps every host to its delay can be shorter).

    python -m benchmarks.bench_politeness [--hosts 40] [--per-host 25] [--delay 1]
        [--procs 8] [--skew 0.6] [--skew-delay 0.25] [--rounds 1] [--only even|skewed]
        [--starts fork|plain|both]

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

Timings are noisy on a loaded machine: run it with ``uptime`` beside, and compare the
ratios of one invocation (its runs alternate in one process tree).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from crawler.helptext import ToolHelpFormatter
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
    started = time.monotonic()
    with open(workdir / "task.log", "wb") as log:
        code = subprocess.call(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    ended = time.monotonic()
    if code != 0:
        raise SystemExit(f"the task failed ({code}): see {workdir / 'task.log'}")
    return started, ended


def measure(label: str, workdir: Path, names: list[str], counts: list[int], procs: int,
            delay: float, partition: str, hub: bool, start: str = "fork") -> float:  # fmt: skip
    with HostServers(names, latency=0.01) as hosts:
        urls = url_list(hosts, names, counts)
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
    parser.add_argument("--only", choices=("even", "skewed"))
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
                big = round(total * args.skew)
                rest = total - big
                skewed = [big] + [
                    rest // (args.hosts - 1) + (1 if i < rest % (args.hosts - 1) else 0)
                    for i in range(args.hosts - 1)
                ]
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
