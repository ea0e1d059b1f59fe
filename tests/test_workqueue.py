"""The hub's work queue (crawler/workqueue.py), on SQLite and on PostgreSQL."""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from crawler.hub import Hub
from crawler.workqueue import WorkQueue, WorkQueueError, ensure_work_schema, list_lines
from tests.test_hub import pg_schema_url

URLS = [f"http://example.org/{n}" for n in range(25)]


@pytest.fixture(params=["sqlite", "postgresql"])
def hub_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/hub.db"
        return
    url, drop = pg_schema_url("worktest")
    yield url
    drop()


@pytest.fixture
def queue(hub_url):
    with Hub.open(hub_url) as hub:
        queue = WorkQueue(hub, "q1")
        queue.load(URLS)
        yield queue


def test_schema_is_idempotent_and_versioned(hub_url):
    for _ in range(2):
        with Hub.open(hub_url) as hub:
            assert ensure_work_schema(hub) == 1
            WorkQueue(hub, "q")
            assert hub._query("SELECT COUNT(*) FROM hub_work_schema")[0][0] == 1


def test_load_streams_dedupes_and_keeps_queues_apart(hub_url):
    with Hub.open(hub_url) as hub:
        lines = ["# list", "", " http://example.org/a ", "http://example.org/b",
                 "http://EXAMPLE.org/a"]  # fmt: skip
        q = WorkQueue(hub, "one")
        assert q.load(list_lines(lines), chunk=1) == (2, 1)
        assert q.load(list_lines(lines)) == (0, 3)  # loading again adds nothing
        other = WorkQueue(hub, "two")
        assert other.load(["http://example.org/a"]) == (1, 0)
        assert q.progress().pending == 2 and other.progress().pending == 1
        with pytest.raises(WorkQueueError, match="load it first"):
            WorkQueue(hub, "missing", create=False)


def test_leases_are_exclusive_and_done_is_final(queue):
    a = queue.lease("a", 10, ttl=60)
    b = queue.lease("b", 10, ttl=60)
    c = queue.lease("c", 10, ttl=60)
    assert (len(a.urls), len(b.urls), len(c.urls)) == (10, 10, 5)
    assert not set(a.urls) & set(b.urls) and not set(b.urls) & set(c.urls)
    assert queue.lease("d", 10, ttl=60) is None
    assert queue.progress().leased == 25 and queue.progress().holders == 3
    assert queue.done(a)
    assert not queue.done(a) and not queue.release(a) and not queue.renew(a, 60)
    assert queue.release(b)  # back to pending, leased again
    again = queue.lease("e", 10, ttl=60)
    assert sorted(again.urls) == sorted(b.urls)
    assert queue.done(again) and queue.done(c)
    progress = queue.progress()
    assert progress.finished and progress.done == 25
    assert queue.lease("f", 10, ttl=60) is None


def test_expired_batch_is_taken_over_whole(queue):
    dead = queue.lease("dead", 10, ttl=0.2)
    live = queue.lease("live", 10, ttl=60)
    assert queue.renew(live, 60)
    time.sleep(0.4)
    assert queue.progress().expired == 10
    taken = queue.lease("heir", 3, ttl=60)  # the expired batch first, whole
    assert taken.urls == dead.urls and taken.taken_over == dead.lease_id
    # The dead holder has lost it: no renewal, no done, no release.
    assert not queue.renew(dead, 60) and not queue.done(dead) and not queue.release(dead)
    assert queue.done(taken)
    assert queue.progress().done == 10
    reasons = {lease["holder"]: lease["end_reason"] for lease in queue.leases()}
    assert reasons["dead"] == "expired" and reasons["heir"] == "done"


def test_renewed_lease_does_not_expire(queue):
    batch = queue.lease("a", 5, ttl=0.5)
    for _ in range(4):
        time.sleep(0.2)
        assert queue.renew(batch, 0.5)
    assert queue.lease("b", 100, ttl=60).urls == tuple(URLS[5:])


def test_no_url_leased_twice_under_contention(hub_url):
    with Hub.open(hub_url) as hub:
        WorkQueue(hub, "busy").load(f"http://example.org/{n}" for n in range(400))

    def worker(name: str) -> list[str]:
        got = []
        with Hub.open(hub_url) as hub:
            queue = WorkQueue(hub, "busy")
            while batch := queue.lease(name, 7, ttl=60):
                got.extend(batch.urls)
                assert queue.done(batch)
        return got

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(worker, ["w1", "w2", "w3", "w4"]))
    counts = Counter(url for got in results for url in got)
    assert len(counts) == 400 and set(counts.values()) == {1}
    with Hub.open(hub_url) as hub:
        assert WorkQueue(hub, "busy").progress().finished
