"""Host budgets: what coordinating hosts through the hub costs a crawl, and what the hub
serves.

    python -m benchmarks.bench_hosts [--hosts 5000] [--procs 8] [--rounds 2]
        [--clients 16] [--seconds 5] [--skip-crawl] [--skip-hub]

Crawl: ``--procs`` ``scrapy crawl site`` processes share a list of ``--hosts`` host
names with one page each, no delay (politeness is not the bottleneck), every name
resolved to one local demo site (tests/loopback_resolver.py). Rounds alternate the host
budget on (``HOST_BUDGET_ENABLED``, a PostgreSQL hub at PG_TEST_URL, else a SQLite one)
and off, in this process tree; pages/s is counted from the first to the last ``ok``
line of all the processes' action logs, and the ratio on/off is printed per round, with
what the budget did (from the crawls' stats): hub calls per page, and how long the
requests that waited at their host's gate (for a slot, then for room among
``CONCURRENT_REQUESTS``) waited on average.

Hub: ``--clients`` processes take and release host slots in a loop for ``--seconds``
on PostgreSQL (a schema of its own), as crawl processes do: one call takes a slot on
each of 20 hosts (a batch, as requests of many hosts wait together), the next releases
them. Printed: calls/s and slot operations/s (a take or a release of one slot).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from crawler.hub import Hub
from crawler.hub.hostbudget import HostAsk, HostBudgetStore

ROOT = Path(__file__).resolve().parent.parent
PG_URL = os.environ.get("PG_TEST_URL", "postgresql://postgres@127.0.0.1:5432/test")
BATCH = 20  # hosts per take, as a crawl process asks for the hosts waiting together


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "HUB_URL"}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _pg_schema() -> tuple[str, object] | None:
    try:
        import psycopg

        admin = psycopg.connect(PG_URL, autocommit=True, connect_timeout=5)
    except Exception:
        return None
    schema = f"hostbench_{uuid.uuid4().hex[:8]}"
    admin.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{sep}options=-csearch_path%3D{schema}", (admin, schema)


def _drop(made: tuple[str, object] | None) -> None:
    if made is not None:
        admin, schema = made[1]
        admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
        admin.close()


# --- crawl -----------------------------------------------------------------------------
def crawl_once(
    workdir: Path, port: int, names: list[str], procs: int, hub: str, on: bool
) -> tuple[float, dict[str, float]]:
    """Pages/s of *procs* crawls over one page of each host name, and the sum of their
    ``host/`` stats."""
    run = workdir / f"run-{time.monotonic_ns()}"
    run.mkdir()
    settings = {
        "HUB_URL": hub,
        "HOST_BUDGET_ENABLED": on,
        "TWISTED_DNS_RESOLVER": "tests.loopback_resolver.LoopbackResolver",
        "LOOPBACK_HOSTS": ",".join(names),
        "ROBOTSTXT_OBEY": False,
        "AUTOTHROTTLE_ENABLED": False,
        "DOWNLOAD_DELAY": 0,
        "CONCURRENT_REQUESTS": 16,
        # INFO and not quiet: the stats are dumped at the end (a few lines per crawl).
        "LOG_LEVEL": "INFO",
        "LOG_QUIET": False,
        "PROGRESS_INTERVAL": 0,
    }
    args = [a for k, v in settings.items() for a in ("-s", f"{k}={v}")]
    crawls = []
    for k in range(procs):
        urls = run / f"urls{k}.txt"
        urls.write_text("".join(f"http://{n}:{port}/page/{i % 3000}.html\n"
                                for i, n in enumerate(names) if i % procs == k))  # fmt: skip
        cmd = [sys.executable, "-m", "scrapy", "crawl", "site", "-a", f"urls={urls}"]
        cmd += ["-s", f"DATA_DIR={run / f'data{k}'}", *args]
        crawls.append(subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE, text=True))  # fmt: skip
    stats: dict[str, float] = {}
    for proc in crawls:
        _, err = proc.communicate(timeout=1800)
        if proc.returncode:
            raise RuntimeError(err[-3000:])
        for name, value in re.findall(r"'(host/[a-z_]+)': ([0-9.]+)", err):
            stats[name] = stats.get(name, 0.0) + float(value)
    stamps = []
    for k in range(procs):
        for line in (run / f"data{k}" / "fetch_log.jsonl").read_text().splitlines():
            entry = json.loads(line)
            if entry["outcome"] == "ok":
                stamps.append(_epoch(entry["ts"]))
    shutil.rmtree(run, ignore_errors=True)
    if len(stamps) != len(names):
        raise RuntimeError(f"{len(stamps)} pages stored of {len(names)}")
    return len(stamps) / (max(stamps) - min(stamps)), stats


def _epoch(ts: str) -> float:
    import calendar

    whole, frac = ts.rstrip("Z").split(".")
    return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + int(frac) / 1000


def bench_crawl(hosts: int, procs: int, rounds: int) -> list[str]:
    names = [f"h{n:05d}.bench.test" for n in range(hosts)]
    port = _free_port()
    site = subprocess.Popen([sys.executable, "-m", "demo.site", "--port", str(port)], cwd=ROOT,
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    made = _pg_schema()
    lines = []
    try:
        time.sleep(1.5)
        with tempfile.TemporaryDirectory(prefix="bench-hosts-") as tmp:
            workdir = Path(tmp)
            hub = made[0] if made else f"sqlite:///{workdir}/hub.db"
            for r in range(rounds):
                off, _ = crawl_once(workdir, port, names, procs, hub, on=False)
                on, stats = crawl_once(workdir, port, names, procs, hub, on=True)
                waits = stats.get("host/gate_waits", 0)
                wait_ms = 1000 * stats.get("host/gate_wait_seconds", 0) / max(waits, 1)
                lines.append(
                    f"round {r + 1}: {procs} processes, {hosts:,} hosts x 1 page, no delay: "
                    f"budget off {off:,.0f} pages/s, on {on:,.0f} pages/s, on/off {on / off:.2f} "
                    f"({'postgresql' if made else 'sqlite'} hub; "
                    f"{stats.get('host/hub_calls', 0) / hosts:.2f} hub calls a page, "
                    f"{waits / hosts:.0%} of requests waited at the gate, {wait_ms:.0f} ms on average)"
                )
    finally:
        site.terminate()
        site.wait(timeout=30)
        _drop(made)
    return lines


# --- hub -------------------------------------------------------------------------------
def churn(url: str, seconds: float, start_at: float, seed: int) -> None:
    """One client: take slots on BATCH random hosts, release them; print calls, slots."""
    rng = random.Random(seed)
    with Hub.open(url) as hub:
        store = HostBudgetStore.open(hub)
        holder = f"bench/{os.getpid()}"
        time.sleep(max(start_at - time.time(), 0))
        calls = slots = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            hosts = {f"h{rng.randrange(100_000)}.test" for _ in range(BATCH)}
            answers = store.take([HostAsk(h, 0.0, 2) for h in hosts], holder, 30.0)
            taken = [(s.slot_id, None) for a in answers for s in a.slots]
            store.release(taken)
            calls += 2
            slots += 2 * len(taken)
    print(calls, slots)


def bench_hub(clients: int, seconds: float) -> list[str]:
    made = _pg_schema()
    if made is None:
        return [f"hub: skipped, no PostgreSQL at PG_TEST_URL ({PG_URL})"]
    url = made[0]
    try:
        with Hub.open(url) as hub:
            HostBudgetStore.open(hub)
        start_at = time.time() + 2.0 + 0.3 * clients
        workers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.bench_hosts",
                    "--churn",
                    url,
                    str(seconds),
                    str(start_at),
                    str(n),
                ],
                cwd=ROOT,
                env=_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for n in range(clients)
        ]
        calls = slots = 0
        for worker in workers:
            out, err = worker.communicate(timeout=seconds + 120)
            if worker.returncode:
                raise RuntimeError(err[-2000:])
            c, s = out.split()
            calls, slots = calls + int(c), slots + int(s)
    finally:
        _drop(made)
    return [
        f"hub (postgresql): {clients} processes, {calls / seconds:,.0f} calls/s, "
        f"{slots / seconds:,.0f} slot operations/s (takes of {BATCH} hosts, then releases)"
    ]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--churn":
        url, seconds, start_at, seed = sys.argv[2:6]
        churn(url, float(seconds), float(start_at), int(seed))
        return
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_hosts")
    parser.add_argument("--hosts", type=int, default=5000)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--skip-crawl", action="store_true")
    parser.add_argument("--skip-hub", action="store_true")
    args = parser.parse_args()
    load = ", ".join(f"{n:.2f}" for n in os.getloadavg())
    print(f"load average (1, 5, 15 min) at the start: {load} on {os.cpu_count()} CPUs")
    lines = [] if args.skip_hub else bench_hub(args.clients, args.seconds)
    lines += [] if args.skip_crawl else bench_crawl(args.hosts, args.procs, args.rounds)
    load = ", ".join(f"{n:.2f}" for n in os.getloadavg())
    print(*lines, f"load average (1, 5, 15 min) at the end: {load}", sep="\n")


if __name__ == "__main__":
    main()
