"""Heartbeats (issue 47): what they cost the hub, and what they cost a crawl.

    python -m benchmarks.bench_heartbeats [--quick] [--processes 40] [--period 5]
        [--seconds 60] [--pages 20000] [--rounds 3] [--hub sqlite|postgresql]
        [--crawl-period 5] [--skip-hub] [--skip-crawl]

(a) The hub's side: ``--processes`` client processes each write a crawl's heartbeat
every ``--period`` seconds for ``--seconds``, as ``extensions/heartbeat.py`` does (one
upsert of a full row: hosts, proxies, the last hour's counts), on a SQLite hub and on
PostgreSQL (``PG_TEST_URL``; a schema of its own). Printed: statements per second the
hub took, the upserts' latency (median, 99th percentile), the CPU the PostgreSQL
backends serving them spent (their processes' CPU time, read with psutil on this
machine), and the CPU each client spent per beat (encoding and sending it).

(b) The crawl's side: ``scrapy crawl site`` over ``--pages`` URLs of 40-60 KB pages
from nginx, with a hub (``--hub``), heartbeats on (every ``--crawl-period`` s) and off
(``HEARTBEAT_ENABLED=0``), against ``benchmarks/bare.py`` (a bare spider with
Scrapy's defaults), whole processes, alternating in each of ``--rounds`` rounds.
Target: on/off >= 0.98. ``--quick`` runs small sizes in about two minutes, to check
that it works; figures come from full runs, with the machine's load printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PG_URL = os.environ.get("PG_TEST_URL", "postgresql://postgres@127.0.0.1:5432/test")


# --- (a) the hub's side ------------------------------------------------------------------
def sample_beat(n: int, period: float):
    """A heartbeat as a busy crawl writes it: ten hosts, two proxies, a full hour."""
    from crawler.hub.heartbeats import Beat

    hosts = [
        {
            "key": f"host{k}.example.org",
            "slots": 2,
            "in_flight": 1,
            "waiting": k,
            "reason": "Crawl-delay 2 s",
        }
        for k in range(10)
    ]
    proxies = [
        {"id": k, "label": f"http://user:***@10.0.0.{k}:3128", "uses": 40, "alive": True}
        for k in range(2)
    ]
    series = {"step": 30, "t0": int(time.time()) // 30 * 30 - 3570}
    series.update({name: [37] * 120 for name in ("pages", "errors", "retries")})
    return Beat(
        id=f"node{n}/{os.getpid()}/bench", node=f"node{n}", pid=os.getpid(), period=period,
        state="fetching", job="bench", spider="site", task=f"1234_{n}", pages=123_456,
        bytes=6_000_000_000, pages_per_s=21.4, bytes_per_s=1.1e6, ok=120_000, errors=300,
        retries=900, bans=4, host_waits=77, pending=48, lag=120, rss=400_000_000,
        last_error="10:00:00 UTC HTTP 500: http://host1.example.org/page/1",
        log=f"/gpfs/me/DATA/logs/bench_p{n}.log",
        detail={"hosts": hosts, "proxies": proxies, "series": series, "list_done": 100_000,
                "list_total": 400_000, "list_per_s": 20.0, "rate_seconds": 30.0},
    )  # fmt: skip


def client(url: str, n: int, period: float, seconds: float, start_at: float) -> None:
    """One process: a beat every *period* from *start_at*, for *seconds*; prints JSON."""
    from crawler.hub import Hub
    from crawler.hub.heartbeats import HeartbeatStore

    with Hub.open(url) as hub:
        store = HeartbeatStore(hub)
        beat = sample_beat(n, period)
        # The PostgreSQL backend serving this connection, on this machine.
        backend = (
            [hub.query("SELECT pg_backend_pid()")[0][0]] if hub.backend == "postgresql" else []
        )
        # Spread over the period, as processes started at different times are.
        first = start_at + period * (n % 97) / 97
        while time.time() < first:
            time.sleep(0.01)
        cpu0, backend0 = time.process_time(), _backend_cpu(backend)
        latencies = []
        end = start_at + seconds
        beat_at = first
        while beat_at < end:
            beat.pages += 100
            began = time.perf_counter()
            store.write(beat)
            latencies.append(time.perf_counter() - began)
            beat_at += period
            time.sleep(max(beat_at - time.time(), 0))
        cpu, backend_cpu = time.process_time() - cpu0, _backend_cpu(backend) - backend0
    said = {
        "writes": len(latencies),
        "cpu": cpu,
        "backend_cpu": backend_cpu,
        "latencies": latencies,
    }
    print(json.dumps(said), flush=True)


def _pg_schema() -> tuple[str, str] | None:
    try:
        import psycopg

        admin = psycopg.connect(PG_URL, autocommit=True, connect_timeout=5)
    except Exception as exc:  # no server, no driver
        print(f"  PostgreSQL at {PG_URL} unavailable ({exc}): skipped", flush=True)
        return None
    schema = f"bench_hb_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin.execute(f'CREATE SCHEMA "{schema}"')
    admin.close()
    sep = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{sep}options=-csearch_path%3D{schema}", schema


def _drop(schema: str) -> None:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _backend_cpu(pids: list[int]) -> float:
    """CPU seconds of the processes, from /proc/PID/schedstat (nanoseconds: a backend
    serving a beat every few seconds spends less than psutil's 10 ms clock tick)."""
    total = 0.0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            continue
    return total


def hub_cost(backend: str, processes: int, period: float, seconds: float, work: Path) -> list[str]:
    schema = None
    if backend == "postgresql":
        made = _pg_schema()
        if made is None:
            return [f"  {backend}: skipped"]
        url, schema = made
    else:
        url = f"sqlite:///{work}/hub-bench.db"
    from crawler.hub import Hub
    from crawler.hub.heartbeats import HeartbeatStore

    with Hub.open(url) as hub:
        HeartbeatStore(hub)  # the table, before the clients race for it
    start_at = time.time() + 3 + processes * 0.15  # every client connected by then
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    clients = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.bench_heartbeats",
                "--client",
                url,
                str(n),
                str(period),
                str(seconds),
                str(start_at),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for n in range(processes)
    ]
    try:
        while time.time() < start_at:
            time.sleep(0.1)
        load0 = os.getloadavg()[0]
        results = [json.loads(c.communicate(timeout=seconds + 300)[0]) for c in clients]
        backend_cpu = sum(r["backend_cpu"] for r in results)
    finally:
        for c in clients:
            if c.poll() is None:
                c.kill()
        if schema:
            _drop(schema)
    writes = sum(r["writes"] for r in results)
    latencies = sorted(x for r in results for x in r["latencies"])
    p50 = statistics.median(latencies) * 1000
    p99 = latencies[int(0.99 * (len(latencies) - 1))] * 1000
    client_ms = 1000 * sum(r["cpu"] for r in results) / writes
    lines = [
        f"  {backend}: {processes} processes, a beat every {period:g} s, {seconds:g} s "
        f"(load {load0:.2f}): {writes:,} upserts, {writes / seconds:.1f} statements/s "
        f"(expected {processes / period:.1f}); latency median {p50:.2f} ms, p99 {p99:.2f} ms; "
        f"client CPU {client_ms:.2f} ms per beat"
    ]
    if schema:
        lines.append(
            f"  {backend}: the backends serving them spent {backend_cpu:.2f} s of CPU, "
            f"{100 * backend_cpu / seconds:.2f}% of one core "
            f"({1000 * backend_cpu / max(writes, 1):.2f} ms per upsert)"
        )
    return lines


# --- (b) the crawl's side --------------------------------------------------------------------
def crawl_cost(pages: int, rounds: int, hub: str, period: float, work: Path) -> list[str]:
    from benchmarks.bench_crawl import Nginx, _stats, make_site
    from benchmarks.bench_speed import crawl, median

    docs = work / "site"
    site_pages = min(pages, 5000)
    make_site(docs, site_pages)
    nginx = Nginx(docs, work)
    base = nginx.start()
    urls = work / "urls.txt"
    urls.write_text("".join(f"{base}/p{n % site_pages}.html?v={n}\n" for n in range(pages)))
    (work / "outside").mkdir(exist_ok=True)
    (work / "logs").mkdir(exist_ok=True)
    runs: dict[str, list] = {"bare": [], "on": [], "off": []}
    beats: list[tuple[int, float, float]] = []  # (rows written, reactor CPU, thread CPU)
    schema = None
    load0 = os.getloadavg()
    try:
        for i in range(rounds):
            if hub == "postgresql":
                made = _pg_schema()
                if made is None:
                    return ["  (b) skipped: no PostgreSQL"]
                hub_url, schema = made
            else:
                hub_url = f"sqlite:///{work}/hub-{i}.db"
            bare = ["runspider", str(ROOT / "benchmarks" / "bare.py"), "-a", f"urls={urls}"]
            runs["bare"].append(
                crawl("bare", bare, work / "outside", work / "logs" / f"{i}-bare.log", pages)
            )
            for name, enabled in (("on", 1), ("off", 0)):
                data = work / f"data-{name}"
                args = ["crawl", "site", "-a", f"urls={urls}", "-s", f"DATA_DIR={data}",
                        "-s", f"HUB_URL={hub_url}", "-s", f"HEARTBEAT_ENABLED={enabled}",
                        "-s", f"HEARTBEAT_SECONDS={period}"]  # fmt: skip
                log = work / "logs" / f"{i}-{name}.log"
                runs[name].append(crawl(name, args, ROOT, log, pages))
                shutil.rmtree(data, ignore_errors=True)
                if enabled:
                    stats = _stats(log.read_text())
                    beats.append(
                        (
                            stats.get("heartbeat/rows_written", 0),
                            stats.get("heartbeat/reactor_cpu_seconds", 0.0),
                            stats.get("heartbeat/thread_cpu_seconds", 0.0),
                        )
                    )
            if schema:
                _drop(schema)
                schema = None
    finally:
        nginx.stop()
        if schema:
            _drop(schema)
    load1 = os.getloadavg()
    rate = {name: median([r.rate for r in rs]) for name, rs in runs.items()}
    each = [on.rate / off.rate for on, off in zip(runs["on"], runs["off"], strict=True)]
    return [
        f"  (b) {pages:,} URLs, {rounds} rounds, hub {hub}, a beat every {period:g} s "
        f"(load {load0[0]:.2f} at the start, {load1[0]:.2f} at the end)",
        f"  bare spider {rate['bare']:.0f} pages/s; heartbeats on {rate['on']:.0f} "
        f"({rate['on'] / rate['bare']:.2f} of bare), off {rate['off']:.0f} "
        f"({rate['off'] / rate['bare']:.2f} of bare)",
        f"  on/off in each round: {', '.join(f'{x:.3f}' for x in each)}; median "
        f"{median(each):.3f} (target >= 0.98); crawl CPU ms/page on "
        f"{median([r.crawl_ms for r in runs['on']]):.3f}, off "
        f"{median([r.crawl_ms for r in runs['off']]):.3f}",
        "  CPU per beat, measured in the crawl (heartbeat/*_cpu_seconds): reactor "
        + ", ".join(f"{1000 * r / max(n, 1):.2f}" for n, r, _ in beats)
        + " ms, writer thread "
        + ", ".join(f"{1000 * t / max(n, 1):.2f}" for n, _, t in beats)
        + f" ms ({', '.join(str(n) for n, _, _ in beats)} beats)",
    ]


def run(
    processes: int = 40,
    period: float = 5.0,
    seconds: float = 60.0,
    pages: int = 20000,
    rounds: int = 3,
    hub: str = "sqlite",
    crawl_period: float = 5.0,
    skip_hub: bool = False,
    skip_crawl: bool = False,
) -> list[str]:
    work = Path(tempfile.mkdtemp(prefix="bench-heartbeats-"))
    lines = [f"{os.cpu_count()} cores; load at start {os.getloadavg()[0]:.2f}"]
    try:
        if not skip_hub:
            lines.append("(a) the hub's cost of heartbeats")
            for backend in ("sqlite", "postgresql"):
                lines += hub_cost(backend, processes, period, seconds, work)
        if not skip_crawl:
            lines.append("(b) a crawl with heartbeats on and off, against a bare spider")
            lines += crawl_cost(pages, rounds, hub, crawl_period, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return lines


def main() -> None:
    if sys.argv[1:2] == ["--client"]:
        url, n, period, seconds, start_at = sys.argv[2:7]
        client(url, int(n), float(period), float(seconds), float(start_at))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: checks that it works")
    parser.add_argument("--processes", type=int, default=40)
    parser.add_argument("--period", type=float, default=5.0, help="(a): seconds between beats")
    parser.add_argument("--seconds", type=float, help="(a): how long (60)")
    parser.add_argument("--pages", type=int, help="(b): URLs per crawl (20000)")
    parser.add_argument("--rounds", type=int, help="(b): (3)")
    parser.add_argument("--hub", choices=("sqlite", "postgresql"), default="sqlite", help="(b)")
    parser.add_argument("--crawl-period", type=float, default=5.0, help="(b): HEARTBEAT_SECONDS")
    parser.add_argument("--skip-hub", action="store_true")
    parser.add_argument("--skip-crawl", action="store_true")
    args = parser.parse_args()
    seconds = args.seconds or (15.0 if args.quick else 60.0)
    pages = args.pages or (3000 if args.quick else 20000)
    rounds = args.rounds or (1 if args.quick else 3)
    for line in run(
        args.processes, args.period, seconds, pages, rounds, args.hub, args.crawl_period,
        args.skip_hub, args.skip_crawl,
    ):  # fmt: skip
        print(line, flush=True)


if __name__ == "__main__":
    main()
