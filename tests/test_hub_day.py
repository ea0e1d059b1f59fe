"""A day with a hub, as users live it, with real ``scrapy crawl`` processes: several
processes on one host share its schedule and each stores its share, the schedule in the
hub never runs away, a crawl after them (or after another) starts at once, and nothing
goes to a host inside its back-off, with host budgets on or off."""

from __future__ import annotations

import email.utils
import json
import sqlite3
import subprocess
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from crawler.hub import Hub
from crawler.hub.hostbudget import HostBudgetStore
from tests.conftest import kill_group, run_crawl, start_crawl, write_urls
from tests.hostservers import HostServers, Reply
from tests.hubs import pg_schema_url, scrapy_with_hub

# The servers log when a request arrives, not when its process let it go: connection
# set-up and a loaded machine move each arrival by up to tenths of a second.
SLACK = 0.3
SLOT_SECONDS = 10.0  # HOST_SLOT_SECONDS: the longest stretch of a host's schedule


@pytest.fixture(params=["sqlite", "postgresql"])
def any_hub(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/hub.db"
        return
    url, drop = pg_schema_url()
    yield url
    drop()


def args_of(hosts: HostServers, *settings: str) -> list[str]:
    return [a for s in settings for a in ("-s", s)] + hosts.setting_args()


def stored(data: Path) -> set[str]:
    with sqlite3.connect(f"file:{data / 'metadata.db'}?mode=ro", uri=True) as db:
        return {url for (url,) in db.execute("SELECT url FROM artifacts WHERE status = 200")}


def actions(data: Path, outcome: str) -> list[dict]:
    lines = (data / "fetch_log.jsonl").read_text().splitlines()
    return [entry for entry in map(json.loads, lines) if entry.get("outcome") == outcome]


class ScheduleWatch:
    """Reads the hub's host rows every half second while crawls run: how far ahead of
    now each key's next time ever stood."""

    def __init__(self, hub_url: str) -> None:
        self.hub_url = hub_url
        self.ahead: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> ScheduleWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _watch(self) -> None:
        with Hub.open(self.hub_url) as hub:
            while not self._stop.wait(0.5):
                try:
                    store = HostBudgetStore.open(hub)
                    now = hub.now()
                    self.ahead += [h.next_at - now for h in store.hosts() if h.next_at]
                except Exception:  # noqa: BLE001, S112 - the tables are made by the crawls
                    continue


@pytest.mark.parametrize(
    ("procs", "delay", "backend"),
    [(2, 1.0, "sqlite"), (4, 0.5, "sqlite"), (2, 0.5, "postgresql"), (4, 1.0, "postgresql")],
)
def test_processes_on_one_host_each_store_their_share(tmp_path, procs, delay, backend):
    """Every process with URLs of the host gets turns and stores all of them; two
    requests to the host never start closer than the delay; the host's next time in the
    hub is never further than a stretch and an interval ahead; the hub is left with no
    slot and no waiter, and a crawl after them waits for nobody."""
    if backend == "sqlite":
        hub_url, drop = f"sqlite:///{tmp_path}/hub.db", lambda: None
    else:
        hub_url, drop = pg_schema_url()
    each = max(int(8 / delay / procs), 4)
    settings = [f"HUB_URL={hub_url}", f"DOWNLOAD_DELAY={delay}", "AUTOTHROTTLE_ENABLED=0"]
    try:
        with HostServers(["one.test"], latency=0.02) as hosts:
            urls = hosts.urls("one.test", procs * each + 3)
            crawls = []
            with ScheduleWatch(hub_url) as watch:
                for n in range(procs):
                    mine = write_urls(tmp_path / f"urls{n}.txt", urls[n : procs * each : procs])
                    crawls.append(
                        start_crawl(
                            mine,
                            tmp_path / f"data{n}",
                            *args_of(hosts, *settings),
                            log_path=tmp_path / f"crawl{n}.log",
                        )
                    )
                for n, proc in enumerate(crawls):
                    try:
                        assert proc.wait(timeout=300) == 0, (
                            tmp_path / f"crawl{n}.log"
                        ).read_text()[-3000:]
                    finally:
                        if proc.poll() is None:
                            kill_group(proc)
            for n in range(procs):
                assert stored(tmp_path / f"data{n}") == set(urls[n : procs * each : procs])
            starts = sorted(r.start for r in hosts["one.test"].log() if r.path != "/robots.txt")
            assert min(b - a for a, b in zip(starts, starts[1:], strict=False)) >= delay - SLACK
            assert max(watch.ahead) <= delay + SLOT_SECONDS + 1.0, max(watch.ahead)
            with Hub.open(hub_url) as hub:
                (state,) = HostBudgetStore.open(hub).hosts()
                assert (state.live_slots, state.waiting) == (0, 0)
            after = write_urls(tmp_path / "after.txt", urls[procs * each :])
            done = run_crawl(after, tmp_path / "after", *args_of(hosts, *settings))
            assert done.returncode == 0, done.stderr[-3000:]
            assert stored(tmp_path / "after") == set(urls[procs * each :])
            assert actions(tmp_path / "after", "host_wait") == []
    finally:
        drop()


def test_crawls_in_a_row_on_one_hub_leave_it_nothing_to_wait_out(tmp_path, any_hub):
    """Three crawls one after another on one hub: each ends leaving the host no slot,
    no one waiting and its schedule within an interval of now, so the next one has
    nothing of it to wait out (a crawl that did took 15-20 s more:
    ``benchmarks.bench_politeness --only row`` times them)."""
    delay = 0.2
    with HostServers(["one.test"], latency=0.02) as hosts:
        urls = hosts.urls("one.test", 30)
        plain = ["AUTOTHROTTLE_ENABLED=0", f"DOWNLOAD_DELAY={delay}", "DOWNLOAD_DELAY_JITTER=0"]
        for n in range(3):
            listed = write_urls(tmp_path / f"urls{n}.txt", urls[n * 10 : (n + 1) * 10])
            settings = [*plain, f"HUB_URL={any_hub}"]
            done = run_crawl(listed, tmp_path / f"data{n}", *args_of(hosts, *settings))
            assert done.returncode == 0, done.stderr[-3000:]
            assert stored(tmp_path / f"data{n}") == set(urls[n * 10 : (n + 1) * 10])
            assert actions(tmp_path / f"data{n}", "host_wait") == []
            with Hub.open(any_hub) as hub:
                (state,) = HostBudgetStore.open(hub).hosts()
                ahead = state.next_at - hub.now()
            assert (state.live_slots, state.waiting) == (0, 0), state
            assert ahead <= delay + 0.05, state


def first_is_429(retry_after):
    """The first page answers 429 with *retry_after* (or what it returns, when called
    as the answer is made: a date some seconds ahead)."""

    def answer(server, path, n):
        pages = sum(server.counts.values()) - server.counts["/robots.txt"]
        if path != "/robots.txt" and pages == 1:
            value = retry_after() if callable(retry_after) else retry_after
            return Reply(429, {"Retry-After": value})
        return None

    return answer


@pytest.mark.parametrize("form", ["seconds", "date"])
@pytest.mark.parametrize("budgets", [True, False])
def test_nothing_goes_to_a_host_inside_its_back_off(tmp_path, form, budgets):
    """The first page answers 429 with ``Retry-After: 8`` (or the date 8 s ahead): no
    request reaches the host until then, whatever Scrapy had queued, and every URL is
    stored after it."""
    seconds = 8
    if form == "seconds":
        retry_after = str(seconds)
    else:  # whole seconds: one more, so that it is at least *seconds* ahead

        def retry_after():
            return email.utils.formatdate(time.time() + seconds + 1, usegmt=True)

    with HostServers(["busy.test"], latency=0.02, answer=first_is_429(retry_after)) as hosts:
        urls = hosts.urls("busy.test", 12)
        # One at a time, 0.2 s apart: left alone, the other pages would all go within
        # the back-off.
        settings = [
            "AUTOTHROTTLE_ENABLED=0",
            "CONCURRENT_REQUESTS_PER_DOMAIN=1",
            "DOWNLOAD_DELAY=0.2",
            f"HOST_BUDGET_ENABLED={int(budgets)}",
        ]
        listed = write_urls(tmp_path / "urls.txt", urls)
        done = run_crawl(listed, tmp_path / "data", *args_of(hosts, *settings))
        assert done.returncode == 0, done.stderr[-3000:]
        log = hosts["busy.test"].log()
    (refused,) = [r for r in log if r.status == 429]
    inside = [r for r in log if refused.end < r.start < refused.end + seconds - SLACK]
    assert inside == [], [(r.path, round(r.start - refused.end, 2)) for r in inside]
    assert max(r.start for r in log) > refused.end + seconds - SLACK  # the rest went after
    assert stored(tmp_path / "data") == set(urls)


def test_a_crawl_killed_while_it_holds_the_host_leaves_it_at_its_stretch_end(tmp_path, any_hub):
    """A crawl killed -9 while it holds the host's stretch: the next crawl's first page
    goes once that stretch would have ended, not a slot TTL later."""
    settings = [f"HUB_URL={any_hub}", "DOWNLOAD_DELAY=0.5", "AUTOTHROTTLE_ENABLED=0"]
    settings += ["HOST_SLOT_TTL=120"]
    with HostServers(["one.test"], latency=0.02) as hosts:
        urls = hosts.urls("one.test", 60)
        first = write_urls(tmp_path / "first.txt", urls[:50])
        proc = start_crawl(
            first, tmp_path / "a", *args_of(hosts, *settings), log_path=tmp_path / "a.log"
        )
        try:
            deadline = time.monotonic() + 120
            while len(hosts["one.test"].log()) < 4 and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            kill_group(proc)
        killed = time.monotonic()
        second = write_urls(tmp_path / "second.txt", urls[50:])
        done = run_crawl(second, tmp_path / "b", *args_of(hosts, *settings))
        assert done.returncode == 0, done.stderr[-3000:]
        later = [
            r.start for r in hosts["one.test"].log() if r.start > killed and r.path != "/robots.txt"
        ]
    assert stored(tmp_path / "b") == set(urls[50:])
    # A stretch is at most HOST_SLOT_SECONDS long, plus its grace: far below the TTL
    # (the second crawl's own start-up included).
    assert min(later) - killed < 60, min(later) - killed


def test_a_job_url_that_failed_is_fetched_by_the_job_s_next_crawl(tmp_path, any_hub):
    """A job's URL answers 500 (after every retry) in its first crawl: the queue keeps
    it, counted, and the job's next crawl, once the server is well, stores it."""
    broken = {"on": True}

    def answer(server, path, n):
        return Reply(500) if broken["on"] and path == "/page/1.html" else None

    with HostServers(["flaky.test"], latency=0.01, answer=answer) as hosts:
        urls = hosts.urls("flaky.test", 4)
        listed = write_urls(tmp_path / "list.txt", urls)
        created = scrapy_with_hub(
            "job", "create", "flow", "--spider", "site", "--urls", str(listed), hub=any_hub
        )
        assert created.returncode == 0, created.stderr
        job = ["AUTOTHROTTLE_ENABLED=0", "RETRY_TIMES=1", f"DATA_DIR={tmp_path / 'data'}"]
        job += ["JOB=flow", "LOG_LEVEL=INFO"]
        first = scrapy_with_hub("crawl", "site", *args_of(hosts, *job), hub=any_hub)
        assert first.returncode == 0, first.stderr[-3000:]
        assert stored(tmp_path / "data") == set(urls) - {urls[1]}
        shown = scrapy_with_hub("queue", "status", "flow", hub=any_hub)
        assert "pending 1" in shown.stdout, shown.stdout
        broken["on"] = False
        second = scrapy_with_hub("crawl", "site", *args_of(hosts, *job), hub=any_hub)
        assert second.returncode == 0, second.stderr[-3000:]
    assert stored(tmp_path / "data") == set(urls)
    assert "done 4/4" in scrapy_with_hub("queue", "status", "flow", hub=any_hub).stdout


# --- stopping, whatever waits -------------------------------------------------------
STOP_WITHIN = 15.0  # seconds from SIGINT to the process's exit (the bound)


def interrupt(proc, started_waiting, log: Path) -> float:
    """SIGINT *proc* once *started_waiting()* says it waits; seconds it took to exit 75."""
    import signal

    deadline = time.monotonic() + 120
    while not started_waiting():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)
    time.sleep(1.0)  # well into the wait
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            kill_group(proc)
    took = time.monotonic() - sent
    assert code == 75, log.read_text()[-3000:]
    return took


@pytest.mark.parametrize("budgets", [True, False])
def test_sigint_during_a_back_off_stops_in_seconds_and_the_rerun_stores_the_rest(tmp_path, budgets):
    with HostServers(["busy.test"], latency=0.01, answer=first_is_429("300")) as hosts:
        urls = hosts.urls("busy.test", 8)
        listed = write_urls(tmp_path / "urls.txt", urls)
        settings = [f"HOST_BUDGET_ENABLED={int(budgets)}", "RETRY_BACKOFF_TIMES=10"]
        log = tmp_path / "crawl.log"
        proc = start_crawl(listed, tmp_path / "data", *args_of(hosts, *settings), log_path=log)
        took = interrupt(proc, lambda: any(r.status == 429 for r in hosts["busy.test"].log()), log)
        assert took < STOP_WITHIN, took
        rerun = run_crawl(listed, tmp_path / "data", *args_of(hosts, *settings))
        assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert stored(tmp_path / "data") == set(urls)


def test_sigint_while_robots_txt_hangs_stops_in_seconds(tmp_path):
    hang = {"on": True}

    def answer(server, path, n):
        if path == "/robots.txt" and hang["on"]:
            time.sleep(60)
        return None

    with HostServers(["slow.test"], latency=0.01, answer=answer) as hosts:
        urls = hosts.urls("slow.test", 5)
        listed = write_urls(tmp_path / "urls.txt", urls)
        log = tmp_path / "crawl.log"
        proc = start_crawl(
            listed, tmp_path / "data", *args_of(hosts, "ROBOTSTXT_OBEY=1"), log_path=log
        )
        took = interrupt(proc, lambda: hosts["slow.test"].hits("/robots.txt") > 0, log)
        assert took < STOP_WITHIN, took
        hang["on"] = False
        rerun = run_crawl(listed, tmp_path / "data", *args_of(hosts, "ROBOTSTXT_OBEY=1"))
        assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert stored(tmp_path / "data") == set(urls)


def test_sigint_while_the_hub_is_stopped_stops_in_seconds(tmp_path):
    """The crawl's PostgreSQL hub goes away mid-crawl: requests wait for it; a SIGINT
    then still ends the crawl in seconds, and the rerun, the hub back, stores the rest."""
    from tests.pg_cluster import PgCluster

    cluster = PgCluster()
    try:
        cluster.start()
        settings = [f"HUB_URL={cluster.url}", "DOWNLOAD_DELAY=0.5", "AUTOTHROTTLE_ENABLED=0"]
        with HostServers(["one.test"], latency=0.01) as hosts:
            urls = hosts.urls("one.test", 60)
            listed = write_urls(tmp_path / "urls.txt", urls)
            log = tmp_path / "crawl.log"
            proc = start_crawl(listed, tmp_path / "data", *args_of(hosts, *settings), log_path=log)

            stopped: list[bool] = []

            def hub_gone() -> bool:
                if hosts["one.test"].hits() < 3:
                    return False
                if not stopped:
                    cluster.stop()
                    stopped.append(True)
                return True

            took = interrupt(proc, hub_gone, log)
            assert took < STOP_WITHIN, took
            cluster.start()
            rerun = run_crawl(listed, tmp_path / "data", *args_of(hosts, *settings))
            assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert stored(tmp_path / "data") == set(urls)
    finally:
        cluster.destroy()


def test_a_queue_task_s_next_batch_starts_at_once(tmp_path, any_hub):
    """Queue mode, one process, three batches of one host on a hub: each batch's crawl
    waits for nothing the one before held (no ``host_wait`` line), and its first request
    goes as soon as its process has started (2 s on a quiet machine, as the politeness
    benchmark measures; the bound here leaves room for a loaded one, far below the slot
    TTL that a batch waited out before)."""
    import sys

    from tests.conftest import ROOT, crawl_env

    with HostServers(["one.test"], latency=0.01) as hosts:
        urls = hosts.urls("one.test", 15)
        listed = write_urls(tmp_path / "urls.txt", urls)
        env = {**crawl_env(), "HUB_URL": any_hub}
        loaded = scrapy_with_hub("queue", "load", "batches", str(listed), hub=any_hub)
        assert loaded.returncode == 0, loaded.stderr
        stage = tmp_path / "stage"
        stage.mkdir()
        settings = ["AUTOTHROTTLE_ENABLED=0", "DOWNLOAD_DELAY=0.3", "DOWNLOAD_DELAY_JITTER=0"]
        cmd = [sys.executable, "-m", "slurm.task", "--queue", "batches", "--batch", "5",
               "--urls", str(listed),
               "--data", str(tmp_path / "data"), "--stage", str(stage), "--task", "0",
               "--tasks", "1", "--procs", "1", "--ship-every", "0.05",
               "--", *args_of(hosts, *settings)]  # fmt: skip
        with open(tmp_path / "task.log", "w") as log:
            done = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=300)  # fmt: skip
        assert done.returncode == 0, (tmp_path / "task.log").read_text()[-3000:]
        pages = sorted(
            (r for r in hosts["one.test"].log() if r.path != "/robots.txt"), key=lambda r: r.start
        )
    assert len(pages) == 15
    batch_of = {urlsplit(url).path: n // 5 for n, url in enumerate(urls)}
    firsts: dict[int, float] = {}
    lasts: dict[int, float] = {}
    for r in pages:
        firsts.setdefault(batch_of[r.path], r.start)
        lasts[batch_of[r.path]] = r.end
    gaps = [firsts[n + 1] - lasts[n] for n in (0, 1)]
    assert max(gaps) <= 10.0, gaps
    assert actions(tmp_path / "stage" / "p0", "host_wait") == []
