"""Host budgets: what coordinating hosts through the hub costs a crawl, and what the hub
serves.

    python -m benchmarks.bench_hosts [--hosts 5000] [--pages N] [--procs 8] [--rounds 2]
        [--baseline N] [--clients 16] [--seconds 5] [--skip-crawl] [--skip-hub]
        [--keep DIR] [--py-spy PATH]

Crawl: ``--procs`` ``scrapy crawl site`` processes share a list of ``--pages`` URLs
(default one a host) over ``--hosts`` host names, no delay (politeness is not the
bottleneck), every name resolved to one local nginx (tests/loopback_resolver.py). ``--rounds`` pairs of
rounds, the host budget on (``HOST_BUDGET_ENABLED``, a PostgreSQL hub at PG_TEST_URL,
else a SQLite one) and off, off first in odd pairs and on first in even ones. Per pair:
the ratio on/off of pages/s, counted from the first to the last ``ok`` line of all the
processes' action logs, and of "steady" pages/s, counted while every process was
fetching (from the last process's first page to the first process's last: start-up
and stragglers left out), and the ratio of CPU a page while every process was fetching
(crawl processes, their archive writers and, on, the PostgreSQL backends serving them,
sampled from /proc), and the peak RSS of a crawl process (its archive writer apart).
``--baseline N``: then one more crawl, budget on, of the list's first N URLs, whose
peak RSS the others' are compared with (memory must not grow with the list). Per round: the budget's stats summed over the crawls (hub calls a
page, how long requests waited at their host's gate, the share of fetch places left
idle meanwhile), the load average, the slowest fetch and the listen overflows of the
machine (a connection dropped and tried again a second or more later). At the end, the
medians over the pairs.

Every round's logs are kept in ``--keep`` (default ``bench-data/hosts/<time>/``):
each crawl's log with its stats, its action log, and ``round.json`` with the figures
and the pages stored in each second. ``--py-spy PATH`` records every crawl with that
py-spy (raw stacks of every thread, idle ones too, in ``py-spy<N>.txt``).

Hub: ``--clients`` processes take and release host slots in a loop for ``--seconds``
on PostgreSQL (a schema of its own), as crawl processes do: one call takes a slot on
each of 20 hosts (a batch, as requests of many hosts wait together), the next releases
them. Printed: calls/s and slot operations/s (a take or a release of one slot).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from crawler.helptext import ToolHelpFormatter
from crawler.hub import Hub
from crawler.hub.hostbudget import HostAsk, HostBudgetStore

ROOT = Path(__file__).resolve().parent.parent
PG_URL = os.environ.get("PG_TEST_URL", "postgresql://postgres@127.0.0.1:5432/test")
CONCURRENCY = 16  # CONCURRENT_REQUESTS of each crawl
BATCH = 20  # hosts per take, as a crawl process asks for the hosts waiting together


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
@dataclass
class Round:
    """One crawl of the list by every process, budget on or off."""

    on: bool
    load: float  # 1-minute load average at its end
    pages: int
    span: tuple[float, float]  # first and last ``ok`` of all the processes
    spans: list[tuple[float, float, int]]  # per process: first ``ok``, last, pages
    cpu: float  # CPU seconds of the crawl processes and their writers
    hub_cpu: float  # of the PostgreSQL backends serving them
    stats: dict[str, float]
    per_second: list[int]  # pages stored in each second from the first ``ok``
    peak_rss: int = 0  # bytes, the largest crawl process (without its writer)

    @property
    def rate(self) -> float:
        return self.pages / max(self.span[1] - self.span[0], 1e-3)

    @property
    def steady(self) -> float:
        """Pages/s while every process was fetching (from the last process's first
        ``ok`` to the first one's last): start-up and the end's stragglers left out."""
        start = max(s[0] for s in self.spans)
        end = min(s[1] for s in self.spans)
        if end - start < 1.0:
            return float("nan")
        return self.steady_pages / (end - start)

    steady_pages: int = 0
    steady_cpu: tuple[float, float] = (0.0, 0.0)  # crawls', hub's, while all fetched
    # Connections the machine's listening sockets dropped (a SYN sent again a second
    # or more later: a few such pages stretch a round), and the longest fetch.
    listen_overflows: int = 0
    slowest: float = 0.0

    @property
    def steady_ms(self) -> float:
        """CPU ms a page (crawls and hub) while every process was fetching."""
        return 1000 * sum(self.steady_cpu) / max(self.steady_pages, 1)

    def summary(self) -> dict:
        return {**asdict(self), "rate": self.rate, "steady": self.steady}


class CPUSampler:
    """CPU seconds of the crawl processes (with their children: the archive writers) and
    of the PostgreSQL backends whose ``application_name`` is *app*, sampled from /proc
    every 0.2 s while they live (the server runs on this machine): CPU over a stretch of
    the crawl, start-up left out."""

    def __init__(self, app: str | None) -> None:
        self.app = app
        self.crawls: list[int] = []
        self.seen: dict[tuple[str, int], float] = {}
        self.series: list[tuple[float, float, float]] = []  # (time, crawls', hub's)
        self.peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._db = None

    def __enter__(self) -> CPUSampler:
        if self.app is not None:
            import psycopg

            self._db = psycopg.connect(PG_URL, autocommit=True, connect_timeout=5)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.sample()

    def sample(self) -> None:
        backends = []
        if self._db is not None:
            backends = [pid for (pid,) in self._db.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (self.app,)
            ).fetchall()]  # fmt: skip
        for pid in list(self.crawls):
            self._read("crawl", pid)
            with contextlib.suppress(OSError, ValueError, IndexError):
                pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
                self.peak_rss = max(self.peak_rss, pages * os.sysconf("SC_PAGE_SIZE"))
            for child in _children(pid):
                self._read("crawl", child)
        for pid in backends:
            self._read("hub", pid)
        crawl = sum(v for (kind, _), v in self.seen.items() if kind == "crawl")
        self.series.append((time.time(), crawl, self.seconds("hub")))

    def _read(self, kind: str, pid: int) -> None:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return
        self.seen[kind, pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def seconds(self, kind: str) -> float:
        return sum(v for (k, _), v in self.seen.items() if k == kind)

    def between(self, start: float, end: float) -> tuple[float, float]:
        """CPU seconds of the crawls and of the hub from *start* to *end*."""

        def at(t: float) -> tuple[float, float]:
            before = [s for s in self.series if s[0] <= t]
            return before[-1][1:] if before else (0.0, 0.0)

        (c0, h0), (c1, h1) = at(start), at(end)
        return c1 - c0, h1 - h0

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        if self._db is not None:
            self._db.close()


def _children(pid: int) -> list[int]:
    found = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(c) for c in (task / "children").read_text().split()]
    except OSError:
        pass
    return found


def crawl_once(
    workdir: Path,
    keep: Path,
    port: int,
    names: list[str],
    procs: int,
    hub: str,
    on: bool,
    spy: str | None,
    pages: int | None = None,
) -> Round:
    """*procs* crawls over *pages* URLs spread over the host names (default one each);
    what they did is kept in *keep*."""
    pages = len(names) if pages is None else pages
    run = workdir / f"run-{time.monotonic_ns()}"
    run.mkdir()
    keep.mkdir(parents=True)
    app = f"bench_hosts_{uuid.uuid4().hex[:8]}"
    if hub.startswith("postgresql"):
        hub += f"&application_name={app}"
    settings = {
        "HUB_URL": hub,
        "HOST_BUDGET_ENABLED": on,
        "TWISTED_DNS_RESOLVER": "tests.loopback_resolver.LoopbackResolver",
        "LOOPBACK_HOSTS": ".bench.test",  # every name below it
        "ROBOTSTXT_OBEY": False,
        "AUTOTHROTTLE_ENABLED": False,
        "DOWNLOAD_DELAY": 0,
        "CONCURRENT_REQUESTS": CONCURRENCY,
        # INFO and not quiet: the stats are dumped at the end (a few lines per crawl).
        "LOG_LEVEL": "INFO",
        "LOG_QUIET": False,
        "PROGRESS_INTERVAL": 0,
    }
    args = [a for k, v in settings.items() for a in ("-s", f"{k}={v}")]
    crawls = []
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    overflows = _listen_overflows()
    with contextlib.ExitStack() as stack:
        cpu = stack.enter_context(CPUSampler(app if "postgresql" in hub else None))
        for k in range(procs):
            urls = run / f"urls{k}.txt"
            with urls.open("w") as out:
                for i in range(k, pages, procs):  # host i mod hosts, a path of its own
                    host = names[i % len(names)]
                    out.write(f"http://{host}:{port}/page/{(i // len(names) + i) % 3000}.html\n")
            cmd = [sys.executable, "-m", "scrapy", "crawl", "site", "-a", f"urls={urls}"]
            cmd += ["-s", f"DATA_DIR={run / f'data{k}'}", *args]
            if spy:
                # Every thread's stacks, idle ones too, so that waits show.
                out = keep / f"py-spy{k}.txt"
                cmd = [spy, "record", "--format", "raw", "--idle", "--threads", "--nonblocking",
                       "--rate", "50", "-o", str(out), "--", *cmd]  # fmt: skip
            err = (keep / f"crawl{k}.log").open("w")
            stack.callback(err.close)
            crawls.append(subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                                           stderr=err))  # fmt: skip
            cpu.crawls.append(crawls[-1].pid)
        for proc in crawls:
            # A million pages take over half an hour at a few hundred pages a second.
            proc.wait(timeout=max(1800, pages / 50))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    overflows = _listen_overflows() - overflows
    stats: dict[str, float] = {}
    stamps: list[float] = []
    spans = []
    for k, proc in enumerate(crawls):
        err = (keep / f"crawl{k}.log").read_text()
        if proc.returncode:
            raise RuntimeError(f"crawl {k} exited {proc.returncode}: {err[-3000:]}")
        for name, value in re.findall(r"'(host/[a-z_]+)': ([0-9.]+)", err):
            stats[name] = stats.get(name, 0.0) + float(value)
        log = run / f"data{k}" / "fetch_log.jsonl"
        shutil.copy(log, keep / f"fetch_log{k}.jsonl")
        mine = [_epoch(json.loads(line)["ts"]) for line in log.read_text().splitlines()
                if '"outcome": "ok"' in line]  # fmt: skip
        spans.append((min(mine), max(mine), len(mine)))
        stamps += mine
    shutil.rmtree(run, ignore_errors=True)
    if len(stamps) != pages:
        raise RuntimeError(f"{len(stamps)} pages stored of {pages}")
    first = min(stamps)
    per_second = [0] * (int(max(stamps) - first) + 1)
    for t in stamps:
        per_second[int(t - first)] += 1
    start, end = max(s[0] for s in spans), min(s[1] for s in spans)
    steady_cpu = cpu.between(start, end) if end - start >= 1.0 else (float("nan"),) * 2
    result = Round(
        on=on,
        load=os.getloadavg()[0],
        pages=len(stamps),
        span=(first, max(stamps)),
        spans=spans,
        cpu=(after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        hub_cpu=cpu.seconds("hub"),
        steady_cpu=steady_cpu,
        stats=stats,
        per_second=per_second,
        steady_pages=sum(1 for t in stamps if start <= t <= end),
        listen_overflows=overflows,
        slowest=max(_slowest(keep / f"fetch_log{k}.jsonl") for k in range(procs)),
        peak_rss=cpu.peak_rss,
    )
    (keep / "round.json").write_text(json.dumps(result.summary(), indent=1))
    return result


def _listen_overflows() -> int:
    """TcpExtListenOverflows of the machine (every listening socket, others' too)."""
    try:
        head, values = [line.split() for line in Path("/proc/net/netstat").read_text()
                        .splitlines() if line.startswith("TcpExt:")][:2]  # fmt: skip
    except (OSError, ValueError):
        return 0
    return int(dict(zip(head, values, strict=False)).get("ListenOverflows", 0))


def _slowest(log: Path) -> float:
    """Seconds of the slowest ``ok`` fetch in an action log."""
    return max(
        (json.loads(line).get("elapsed_ms") or 0) / 1000
        for line in log.read_text().splitlines()
        if '"outcome": "ok"' in line
    )


def _epoch(ts: str) -> float:
    import calendar

    whole, frac = ts.rstrip("Z").split(".")
    return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + int(frac) / 1000


def describe(r: Round) -> str:
    """What one round did, for the pair's lines."""
    text = (
        f"{'on ' if r.on else 'off'} {r.rate:5.0f} pages/s, steady {r.steady:5.0f}; "
        f"CPU a page {1000 * (r.cpu + r.hub_cpu) / r.pages:.1f} ms, "
        f"{r.steady_ms:.2f} ms while all fetched"
    )
    if r.on:
        waits = r.stats.get("host/gate_waits", 0)
        wait_ms = 1000 * r.stats.get("host/gate_wait_seconds", 0) / max(waits, 1)
        idle = r.stats.get("host/idle_fetch_seconds", 0)
        places = CONCURRENCY * sum(max(last - first, 1e-3) for first, last, _ in r.spans)
        text += (
            f" (hub {1000 * r.steady_cpu[1] / max(r.steady_pages, 1):.2f} ms); "
            f"{r.stats.get('host/hub_calls', 0) / r.pages:.2f} hub calls a page, "
            f"{waits / r.pages:.0%} waited at the gate, {wait_ms:.0f} ms on average, "
            f"{idle / places:.0%} of fetch places idle meanwhile"
        )
    starts = [s[0] - r.span[0] for s in r.spans]
    ends = [r.span[1] - s[1] for s in r.spans]
    return (
        f"{text}; peak RSS {r.peak_rss / 1e6:.0f} MB; load {r.load:.1f}; slowest fetch {r.slowest:.1f} s, "
        f"{r.listen_overflows} listen overflows; processes' first page {min(starts):.1f}-{max(starts):.1f} s "
        f"after the first, last page {min(ends):.1f}-{max(ends):.1f} s before the end"
    )


def bench_crawl(
    hosts: int,
    procs: int,
    rounds: int,
    keep: Path,
    spy: str | None = None,
    pages: int | None = None,
    baseline: int = 0,
) -> list[str]:
    from benchmarks.bench_cluster import Nginx

    names = [f"h{n:06d}.bench.test" for n in range(hosts)]
    pages = hosts if pages is None else pages
    peaks: list[float] = []
    made = _pg_schema()
    ratios: list[float] = []
    steady: list[float] = []
    cpus: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-hosts-") as tmp:
        workdir = Path(tmp)
        # nginx, as for the crawl benchmarks: a Python site sharing the 2 cores with 8
        # crawls stalled now and then for seconds, and a round's last pages set its rate.
        (workdir / "nginx").mkdir()
        site = Nginx(workdir / "nginx")
        site.start()
        port = int(site.base.rsplit(":", 1)[1])
        try:
            hub = made[0] if made else f"sqlite:///{workdir}/hub.db"
            for r in range(rounds):
                # Off first in odd pairs, on first in even ones: a load that rises or
                # falls through a pair favours neither.
                order = (False, True) if r % 2 == 0 else (True, False)
                done = {}
                for on in order:
                    where = keep / f"pair{r + 1:02d}-{'on' if on else 'off'}"
                    done[on] = crawl_once(workdir, where, port, names, procs, hub, on, spy, pages)
                    peaks.append(done[on].peak_rss)
                off, on_ = done[False], done[True]
                ratios.append(on_.rate / off.rate)
                steady.append(on_.steady / off.steady)
                cpus.append(on_.steady_ms / off.steady_ms)
                line = (
                    f"pair {r + 1} ({'off, on' if r % 2 == 0 else 'on, off'}): "
                    f"on/off {ratios[-1]:.2f}, steady {steady[-1]:.2f}, "
                    f"CPU a page {cpus[-1]:.2f}\n"
                    f"    {describe(off)}\n    {describe(on_)}"
                )
                print(line, flush=True)
            if baseline:
                small = crawl_once(
                    workdir, keep / "baseline", port, names, procs, hub, True, spy, baseline
                )
                print(f"baseline, {baseline:,} URLs:\n    {describe(small)}", flush=True)
        finally:
            site.stop()
            _drop(made)
    lines = [
        f"{procs} processes, {pages:,} pages over {hosts:,} hosts, no delay, "
        f"{'postgresql' if made else 'sqlite'} hub: median on/off over {rounds} pairs "
        f"{statistics.median(ratios):.2f} (each {', '.join(f'{x:.2f}' for x in ratios)}); "
        f"steady {statistics.median(steady):.2f}; CPU a page on/off "
        f"{statistics.median(cpus):.2f}; every round's logs and stats in {keep}"
    ]
    if baseline:
        each = ", ".join(f"{(peak - small.peak_rss) / 1e6:+.0f}" for peak in peaks)
        lines.append(f"peak RSS of a crawl process minus the baseline's, MB, each crawl: {each}")
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
    parser = argparse.ArgumentParser(
        formatter_class=ToolHelpFormatter, prog="python -m benchmarks.bench_hosts"
    )
    parser.add_argument("--hosts", type=int, default=5000)
    parser.add_argument("--pages", type=int, help="URLs in all (default: one a host)")
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--baseline", type=int, default=0, metavar="N")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--skip-crawl", action="store_true")
    parser.add_argument("--skip-hub", action="store_true")
    parser.add_argument("--keep", type=Path, help="where every round's logs go")
    parser.add_argument("--py-spy", metavar="PATH", help="record every crawl with py-spy")
    args = parser.parse_args()
    keep = args.keep or ROOT / "bench-data" / "hosts" / time.strftime("%Y%m%d-%H%M%S")
    load = ", ".join(f"{n:.2f}" for n in os.getloadavg())
    print(f"load average (1, 5, 15 min) at the start: {load} on {os.cpu_count()} CPUs")
    if not args.skip_hub:
        print(*bench_hub(args.clients, args.seconds), sep="\n", flush=True)
    if not args.skip_crawl:
        print(
            *bench_crawl(
                args.hosts, args.procs, args.rounds, keep, args.py_spy, args.pages, args.baseline
            ),
            sep="\n",
        )
    load = ", ".join(f"{n:.2f}" for n in os.getloadavg())
    print(f"load average (1, 5, 15 min) at the end: {load}")


if __name__ == "__main__":
    main()
