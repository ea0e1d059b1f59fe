"""Host budgets held by real crawl processes: two Slurm tasks of four processes each
(``python -m slurm.task``, as ``slurm/crawl.sbatch`` runs them) share one hub; a
Retry-After stops all of them, a Crawl-delay paces all of them, robots.txt is fetched
once; a process killed -9 while it holds a host leaves it to the others at its TTL."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crawler.hub import Hub
from crawler.hub.hostbudget import HostBudgetStore
from tests.conftest import ROOT, crawl_env, kill_group, start_crawl, write_urls
from tests.hostservers import HostServers, Reply
from tests.hubs import pg_schema_url
from tests.polling import wait_until

TASKS, PROCS = 2, 4
# The servers log when a request arrives, not when its process let it go: connection
# set-up and a loaded machine move each arrival by up to tenths of a second.
SLACK = 0.3
COMMON = [
    "AUTOTHROTTLE_ENABLED=0",
    "DOWNLOAD_DELAY_JITTER=0",
    "CONCURRENT_REQUESTS_PER_DOMAIN=1",
    "LOG_LEVEL=INFO",
]


@pytest.fixture(params=["sqlite", "postgresql"])
def any_hub(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/hub.db"
        return
    url, drop = pg_schema_url()
    yield url
    drop()


def run_tasks(urls: list[str], tmp_path: Path, hub: str, *settings: str) -> Path:
    """Two tasks of four crawl processes over *urls*, sharing *hub*; their DATA dir."""
    url_file = write_urls(tmp_path / "urls.txt", urls)
    data = tmp_path / "DATA"
    args = [a for s in [*COMMON, f"HUB_URL={hub}", *settings] for a in ("-s", s)]
    tasks = []
    for task in range(TASKS):
        log = open(tmp_path / f"task{task}.log", "w")  # noqa: SIM115 - closed below
        tasks.append((log, subprocess.Popen(
            [sys.executable, "-m", "slurm.task", "--urls", str(url_file), "--data", str(data)]
            + ["--stage", str(tmp_path / f"stage{task}"), "--task", str(task)]
            + ["--tasks", str(TASKS), "--procs", str(PROCS), "--name", f"job_{task}_r0"]
            # Every process gets URLs of every host: the host's budget is all that
            # keeps them to one process's limits.
            + ["--ship-every", "0.05", "--partition", "url", "--", *args],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=crawl_env(),
            start_new_session=True,
        )))  # fmt: skip
    try:
        for task, (_, proc) in enumerate(tasks):
            code = proc.wait(timeout=300)
            assert code == 0, (tmp_path / f"task{task}.log").read_text()[-4000:] + logs(data)
    finally:
        for log, proc in tasks:
            if proc.poll() is None:
                kill_group(proc)
            log.close()
    return data


def settings_of(hosts: HostServers) -> list[str]:
    return [f"{key}={value}" for key, value in hosts.settings().items()]


def logs(data: Path) -> str:
    return "".join(p.read_text()[-2000:] for p in sorted((data / "logs").glob("*.log")))


def stored(data: Path) -> set[str]:
    urls: set[str] = set()
    for db in (data / "catalogs").glob("*.db"):
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            urls |= {u for (u,) in conn.execute("SELECT url FROM artifacts WHERE status = 200")}
    return urls


def test_retry_after_stops_every_process_then_all_is_stored(tmp_path, any_hub):
    def first_is_429(server, path, n):
        if (
            path != "/robots.txt"
            and sum(server.counts.values()) - server.counts["/robots.txt"] == 1
        ):
            return Reply(429, {"Retry-After": "5"})
        return None

    with HostServers(["busy.test"], latency=0.02, answer=first_is_429) as hosts:
        urls = hosts.urls("busy.test", 24)
        data = run_tasks(urls, tmp_path, any_hub, *settings_of(hosts))
        log = hosts["busy.test"].log()
    answered = [r for r in log if r.status == 429]
    assert len(answered) == 1, log
    later = [r.start - answered[0].end for r in log if r.start > answered[0].start]
    assert later and min(later) >= 5.0 - SLACK, sorted(later)[:5]
    assert stored(data) == set(urls)


def test_crawl_delay_paces_every_process_and_robots_is_fetched_once(tmp_path, any_hub):
    robots = "User-agent: *\nCrawl-delay: 2\n"
    with HostServers(["slow.test", "quick.test"], latency=0.02, robots=robots) as hosts:
        hosts["quick.test"].robots = None
        urls = hosts.urls("slow.test", 6) + hosts.urls("quick.test", 16)
        data = run_tasks(urls, tmp_path, any_hub, *settings_of(hosts))
        slow, quick = hosts["slow.test"], hosts["quick.test"]
        pages = [r.start for r in slow.log() if r.path != "/robots.txt"]
        gaps = [b - a for a, b in zip(pages, pages[1:], strict=False)]
        assert slow.hits("/robots.txt") == 1 and quick.hits("/robots.txt") == 1
        assert len(pages) == 6 and min(gaps) >= 2.0 - SLACK, gaps
        assert slow.max_concurrency() == 1 and quick.max_concurrency() == 1
    assert stored(data) == set(urls)


def test_a_process_killed_holding_a_host_leaves_it_to_the_others_at_its_ttl(tmp_path):
    """Process A holds the only slot of a slow host when it is killed -9; process B,
    waiting for that host, takes it over once the slot's TTL has run out (never
    before) and fetches all of its share."""
    hub = f"sqlite:///{tmp_path}/hub.db"
    ttl = 3.0
    with HostServers(["held.test"], latency=0.3) as hosts:
        urls = hosts.urls("held.test", 40)
        settings = [*COMMON, f"HUB_URL={hub}", f"HOST_SLOT_TTL={ttl}", "ROBOTSTXT_OBEY=0"]
        args = [a for s in settings + settings_of(hosts) for a in ("-s", s)]
        a = start_crawl(write_urls(tmp_path / "a.txt", urls[0::2]), tmp_path / "a", *args,
                        log_path=tmp_path / "a.log")  # fmt: skip
        b = None
        try:
            with Hub.open(hub) as opened:
                HostBudgetStore.open(opened)  # the tables, before A makes them
                wait_until(lambda: held_by(opened, a.pid), "A to hold the host", proc=a)
                b = start_crawl(write_urls(tmp_path / "b.txt", urls[1::2]), tmp_path / "b",
                                *args, log_path=tmp_path / "b.log")  # fmt: skip
                wait_until(lambda: hosts["held.test"].hits() >= 4 and held_by(opened, a.pid),
                           "A to be fetching", proc=a)  # fmt: skip
                kill_group(a)
                killed = time.monotonic()
            assert b.wait(timeout=180) == 0, (tmp_path / "b.log").read_text()[-4000:]
        finally:
            for proc in (a, b):
                if proc is not None and proc.poll() is None:
                    kill_group(proc)
        log = hosts["held.test"].log()
    b_paths = {u.split(":", 2)[2].split("/", 1)[1] for u in urls[1::2]}
    b_starts = [r.start for r in log if r.path.lstrip("/") in b_paths]
    a_ends = [r.end or killed for r in log if r.path.lstrip("/") not in b_paths]
    # B went only once A's slot had run out: after A's last request, and the TTL. A
    # renewed its slot every third of the TTL, the last time at most that long before
    # the kill: the slot lived on at least two thirds of the TTL after it.
    assert min(b_starts) > max(a_ends)
    assert min(b_starts) >= killed + ttl * 2 / 3 - SLACK, (min(b_starts) - killed, ttl)
    with sqlite3.connect(tmp_path / "b" / "metadata.db") as conn:
        got = {u for (u,) in conn.execute("SELECT url FROM artifacts WHERE status = 200")}
    assert got == set(urls[1::2])


def held_by(hub: Hub, pid: int) -> bool:
    rows = hub.query(
        "SELECT holder FROM hub_host_slots WHERE key = 'held.test' AND expires >= NOW()"
    )
    return any(f"/{pid}#" in holder for (holder,) in rows)


def test_a_restarted_hub_keeps_the_budget_and_no_slot_outlives_it(tmp_path):
    """Two crawls share one host through a PostgreSQL hub that is stopped for longer than
    a slot lives, then started again: the host is never asked faster than its budget,
    nothing goes to it once the slots held at the stop have run out and until the hub
    is back, each crawl says once that it lost the hub and once that it is back, and
    every URL is stored."""
    from tests.pg_cluster import PgCluster

    cluster = PgCluster()
    ttl, delay = 2.0, 0.5
    try:
        cluster.start()
        with HostServers(["steady.test"], latency=0.02) as hosts:
            urls = hosts.urls("steady.test", 40)
            # A slot holds send times for longer than the outage: only its TTL, which
            # no renewal extends while the hub is away, stops its holder.
            settings = [*COMMON, f"HUB_URL={cluster.url}", f"HOST_SLOT_TTL={ttl}",
                        f"DOWNLOAD_DELAY={delay}", "ROBOTSTXT_OBEY=0", "HOST_POLL_SECONDS=0.3",
                        "HOST_SLOT_SECONDS=60", "CONCURRENT_REQUESTS=32"]  # fmt: skip
            args = [a for s in settings + settings_of(hosts) for a in ("-s", s)]
            crawls = [
                start_crawl(
                    write_urls(tmp_path / f"{n}.txt", urls[n::2]),
                    tmp_path / f"d{n}",
                    *args,
                    log_path=tmp_path / f"{n}.log",
                )  # fmt: skip
                for n in range(2)
            ]
            server = hosts["steady.test"]
            try:
                wait_until(lambda: server.hits() >= 8, "the crawls to be under way")
                cluster.stop()
                stopped = time.monotonic()
                for n, crawl in enumerate(crawls):
                    wait_until(lambda n=n: "Lost the hub" in (tmp_path / f"{n}.log").read_text(),
                               "the crawls to notice", proc=crawl)  # fmt: skip
                time.sleep(max(stopped + ttl + 2 - time.monotonic(), 0))  # shapes the outage
                restarted = time.monotonic()
                cluster.start()
                for n, crawl in enumerate(crawls):
                    code = crawl.wait(timeout=300)
                    assert code == 0, (tmp_path / f"{n}.log").read_text()[-4000:]
            finally:
                for crawl in crawls:
                    if crawl.poll() is None:
                        kill_group(crawl)
            starts = [r.start for r in server.log()]
    finally:
        cluster.destroy()
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert min(gaps) >= delay - SLACK, gaps
    assert not [t for t in starts if stopped + ttl < t < restarted], (stopped, restarted, starts)
    for n in range(2):
        log = (tmp_path / f"{n}.log").read_text()
        assert log.count("Lost the hub") == 1 and log.count("is back after") == 1, log[-3000:]
        with sqlite3.connect(tmp_path / f"d{n}" / "metadata.db") as conn:
            got = {u for (u,) in conn.execute("SELECT url FROM artifacts WHERE status = 200")}
        assert got == set(urls[n::2])
