"""A crawl of a job's work queue that loses a batch's lease (it expired, and another
holder took the batch over) stops fetching that batch's URLs: they are the other
holder's now. With the real hub, on SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import time

import pytest_twisted
from scrapy.utils.defer import deferred_from_coro
from twisted.internet.threads import deferToThread

from crawler.hub import Hub, WorkQueue
from crawler.hub.jobs import JobStore
from crawler.storage.actionlog import read as read_log
from spiders.site import SiteSpider
from tests.conftest import ROOT, kill_group, write_urls
from tests.crawls import crawl
from tests.hostservers import HostServers
from tests.hubs import hub_url  # noqa: F401 - a fixture


def take_over(url: str, server, after: int, queue: str = "j"):
    """Once *server* got *after* requests: the crawl's lease as if it had stalled past
    its TTL, and another holder taking its batch over; that holder's batch."""
    deadline = time.monotonic() + 60
    while server.hits() < after:
        assert time.monotonic() < deadline, "the crawl never started"
        time.sleep(0.02)
    with Hub.open(url) as hub:
        # A renewal of the crawl's that lands between the two calls revives its lease
        # (late, but nobody had taken it): the next try, a second before the next
        # renewal, wins.
        for _ in range(5):
            hub.execute("UPDATE hub_work_leases SET expires = NOW() - 1 WHERE ended IS NULL")
            batch = WorkQueue(hub, queue, create=False).lease("heir", 100, ttl=60)
            if batch is not None:
                return batch
    raise AssertionError("the crawl's lease was renewed every time it was taken over")


@pytest_twisted.ensureDeferred
async def test_a_crawl_that_lost_its_lease_stops_fetching_the_batch(tmp_path, hub_url, monkeypatch):  # noqa: F811
    monkeypatch.setenv("WORK_LEASE_TTL", "3")  # renewed every second
    with HostServers(["slow.test"], latency=0.4) as hosts:
        urls = hosts.urls("slow.test", 16)
        with Hub.open(hub_url) as hub:
            JobStore(hub).create("j", "site", {}, queue="j")
            WorkQueue(hub, "j").load(urls, partition="host")
        settings = {
            **hosts.settings(),
            "HUB_URL": hub_url,
            "JOB": "j",
            "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
            "AUTOTHROTTLE_ENABLED": False,
            "ROBOTSTXT_OBEY": False,
        }
        server = hosts["slow.test"]
        heir = deferToThread(take_over, hub_url, server, 2)
        with hosts.resolving():
            crawler = await deferred_from_coro(crawl(SiteSpider, tmp_path / "data", settings))
        batch = await heir
        fetched = server.hits()
    assert batch.urls == tuple(urls)  # the whole batch, taken over
    # Fetched until the next renewal found the lease lost (a second, 2-3 pages), no more.
    assert 2 <= fetched <= 6, fetched
    stats = crawler.stats
    assert stats.get_value("work/leases_lost") == 1
    assert stats.get_value("work/lost_skipped") == len(urls) - fetched
    # Neither an error nor an outcome for the URLs left: the heir writes theirs.
    lines = read_log(tmp_path / "data" / "fetch_log.jsonl")
    assert {e["outcome"] for e in lines} == {"ok"} and len(lines) == fetched
    with Hub.open(hub_url) as hub:
        leases = WorkQueue(hub, "j", create=False).leases()
    # The crawl's own lease ended taken over; its end did not touch the heir's.
    assert [(lease["holder"] == "heir", lease["end_reason"]) for lease in leases] == [
        (False, "expired"),
        (True, None),
    ]


def hold_the_hub(path: str, server, seconds: float) -> tuple[float, float]:
    """Once *server* got a request: the hub's SQLite file locked for writing by another
    process's transaction for *seconds* (a hub that is slow to answer). When it held
    it, by ``time.monotonic``."""
    deadline = time.monotonic() + 60
    while server.hits() < 1:
        assert time.monotonic() < deadline, "the crawl never started"
        time.sleep(0.02)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("BEGIN IMMEDIATE")
        began = time.monotonic()
        time.sleep(seconds)
        db.execute("ROLLBACK")
        return began, time.monotonic()


@pytest_twisted.ensureDeferred
async def test_a_slow_hub_does_not_hold_up_the_crawl_of_a_job_queue(tmp_path, monkeypatch):
    from twisted.internet import task

    monkeypatch.setenv("WORK_LEASE_TTL", "1.5")  # renewed every half second
    hub = f"sqlite:///{tmp_path}/hub.db"
    with HostServers(["one.test"], latency=0.2) as hosts:
        urls = hosts.urls("one.test", 20)
        with Hub.open(hub) as opened:
            JobStore(opened).create("j", "site", {}, queue="j")
            WorkQueue(opened, "j").load(urls, partition="host")
        settings = {
            **hosts.settings(),
            "HUB_URL": hub,
            "JOB": "j",
            "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
            "AUTOTHROTTLE_ENABLED": False,
            "ROBOTSTXT_OBEY": False,
            "HOST_BUDGET_ENABLED": False,
        }
        ticks: list[float] = []
        ticking = task.LoopingCall(lambda: ticks.append(time.monotonic()))
        ticking.start(0.05)
        held = deferToThread(hold_the_hub, f"{tmp_path}/hub.db", hosts["one.test"], 3.0)
        with hosts.resolving():
            await deferred_from_coro(crawl(SiteSpider, tmp_path / "data", settings))
        began, ended = await held
        ticking.stop()
    # Renewals waited for the hub in their thread: the reactor ran on, ticking and
    # fetching. A renewal on the reactor (one is due every half second) would have
    # stopped it from then until the hub let go: no tick in the hold's last two seconds.
    assert [t for t in ticks if began + 1.0 < t < ended], (began, ended, ticks)


def test_a_queue_task_stops_the_crawl_of_a_batch_taken_over(tmp_path):
    hub = f"sqlite:///{tmp_path}/hub.db"
    with HostServers(["slow.test"], latency=0.2) as hosts:
        urls = hosts.urls("slow.test", 40)
        url_file = write_urls(tmp_path / "urls.txt", urls)
        with Hub.open(hub) as opened:
            WorkQueue(opened, "q").load(urls, partition="host")
        cmd = [sys.executable, "-m", "slurm.task", "--urls", str(url_file), "--data",
               str(tmp_path / "data"), "--stage", str(tmp_path / "stage"), "--task", "0",
               "--tasks", "1", "--name", "t0", "--ship-every", "0.05", "--queue", "q",
               "--batch", "100", "--", "-s", "CONCURRENT_REQUESTS=2",
               "-s", "AUTOTHROTTLE_ENABLED=0", "-s", "ROBOTSTXT_OBEY=0",
               "-s", "HOST_BUDGET_ENABLED=0", *hosts.setting_args()]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HUB_URL": hub, "WORK_LEASE_TTL": "3"}
        with open(tmp_path / "task.log", "w") as log:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip
        try:
            server = hosts["slow.test"]
            heir = take_over(hub, server, 2, "q")
            # The crawl stops at the task's next renewal; the heir then ends its batch.
            deadline = time.monotonic() + 60
            while "stopping crawl p0" not in (tmp_path / "task.log").read_text():
                assert time.monotonic() < deadline, (tmp_path / "task.log").read_text()
                time.sleep(0.1)
            time.sleep(1.5)  # what the crawl had in flight ends
            fetched = server.hits()
            with Hub.open(hub) as opened:
                assert WorkQueue(opened, "q", create=False).done(heir)
            assert proc.wait(timeout=120) == 0, (tmp_path / "task.log").read_text()[-3000:]
        finally:
            kill_group(proc)
        assert server.hits() == fetched
    assert heir.urls == tuple(urls)
    # A stopped crawl takes no request more from its scheduler; the two in its downloader
    # end (a second's fetching at most before the renewal found the lease lost).
    assert 2 <= fetched <= 12, fetched
    assert "Lease of batch 1 was lost" in (tmp_path / "task.log").read_text()
