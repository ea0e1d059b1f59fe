"""The hub's heartbeat table (crawler/hub/heartbeats.py): one row per crawl process,
updated in place; read as empty from a hub older than it; written from a thread that
never queues beats up. On SQLite and on PostgreSQL."""

from __future__ import annotations

import threading
import time

import pytest

from crawler.hub import Hub, ProxyPool
from crawler.hub.heartbeats import (
    FETCHING,
    IDLE,
    TABLE,
    WAITING_HOST,
    WAITING_PROXY,
    Beat,
    HeartbeatStore,
    HeartbeatWriter,
    Series,
    activity,
    series_points,
)
from crawler.hub.jobs import JobStore
from crawler.hub.workqueue import WorkQueue
from crawler.watch.source import JobSource, UnknownJobError
from tests.hubs import hub_url  # noqa: F401 - the backend-parametrised fixture


@pytest.fixture
def hub(hub_url):  # noqa: F811
    with Hub.open(hub_url) as opened:
        yield opened


def beat(pid: int, job: str = "j", **values) -> Beat:
    values = {"state": FETCHING, "period": 5.0, **values}
    return Beat(id=f"node-a/{pid}/t", node="node-a", pid=pid, job=job, **values)


def test_a_process_has_one_row_updated_in_place(hub):
    store = HeartbeatStore(hub)
    store.write(beat(1, pages=10, detail={"hosts": [{"key": "a.example", "waiting": 2}]}))
    first = store.read("j")
    assert len(first) == 1 and first[0].pages == 10
    time.sleep(0.05)
    store.write(beat(1, pages=25, errors=3, state=WAITING_HOST, last_error="HTTP 500: http://x/"))
    store.write(beat(2, pages=1))
    store.write(beat(3, job="other"))
    rows = {row.pid: row for row in store.read("j")}
    assert set(rows) == {1, 2}, "one row per process, and only the job's"
    again = rows[1]
    assert (again.pages, again.errors, again.state) == (25, 3, WAITING_HOST)
    assert again.last_error == "HTTP 500: http://x/"
    assert again.detail == {}, "the detail is the last beat's, whole"
    assert again.started == first[0].started, "started is the first beat's"
    assert again.updated > first[0].updated
    assert abs(again.updated - hub.now()) < 5, "the hub's clock"
    count = hub.query(f"SELECT COUNT(*) FROM {TABLE}")[0][0]
    assert count == 3
    assert [b.job for b in store.read(None)] and store.jobs() == ["j", "other"]


def test_a_window_keeps_the_last_runs_of_a_job(hub):
    store = HeartbeatStore(hub)
    store.write(beat(1))
    # An old run's row, as a process that died long ago left it.
    hub.execute(f"UPDATE {TABLE} SET updated = updated - 7200 WHERE pid = 1")
    store.write(beat(2))
    assert [b.pid for b in store.read("j", window=3600)] == [2]
    assert sorted(b.pid for b in store.read("j")) == [1, 2], "stale rows are kept, not deleted"


def test_an_older_hub_reads_as_empty_and_a_crawl_creates_the_table(hub):
    # A hub of an earlier version: proxies, a job and its queue, no heartbeat table.
    ProxyPool(hub)
    JobStore(hub).create("old", "site", {}, queue="old")
    WorkQueue(hub, "old").load(["http://example.org/1"])
    assert not hub.has_table(TABLE)
    source = JobSource(hub, "old")
    snapshot = source.snapshot()
    assert snapshot.beats == [] and snapshot.queue.progress.total == 1
    assert not hub.has_table(TABLE), "a view creates nothing"
    with pytest.raises(UnknownJobError, match="no job 'missing'"):
        JobSource(hub, "missing")
    HeartbeatStore(hub).write(beat(7, job="old"))  # what a crawl does at its first beat
    assert hub.version("hub_heartbeat_schema") == 1
    assert [b.pid for b in source.snapshot().beats] == [7], "found once a crawl made it"


def test_a_job_known_only_from_heartbeats_is_not_unknown(hub):
    HeartbeatStore(hub).write(beat(4, job="adhoc"))
    assert [b.pid for b in JobSource(hub, "adhoc").snapshot().beats] == [4]


def test_the_writer_writes_the_newest_beat_and_goes_on_after_a_failure(hub):
    calls = []
    entered, release = threading.Event(), threading.Event()

    class SlowStore(HeartbeatStore):
        def write(self, b: Beat) -> None:
            calls.append(b.pages)
            if len(calls) == 1:
                raise ConnectionError("the hub went away")
            if len(calls) == 2:
                entered.set()
                release.wait(10)
            super().write(b)

    writer = HeartbeatWriter(lambda: SlowStore(hub), hub.label)
    writer.start()
    writer.offer(beat(1, pages=1))  # fails: counted, the next one is tried
    deadline = time.monotonic() + 10
    while writer.failed == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    writer.offer(beat(1, pages=2))
    assert entered.wait(10)
    for pages in (3, 4, 5):  # offered while the hub is slow: only the newest is written
        writer.offer(beat(1, pages=pages))
    release.set()
    while len(calls) < 3 and time.monotonic() < deadline + 10:
        time.sleep(0.01)
    assert writer.close(beat(1, pages=6, state=IDLE), timeout=10)
    assert calls == [1, 2, 5, 6]
    assert (writer.failed, writer.written) == (1, 3)
    with Hub.open(hub.url) as other:
        (row,) = HeartbeatStore(other).read("j")
    assert (row.pages, row.state) == (6, IDLE), "the last beat given at close is written"


def test_series_buckets_follow_the_wall_clock_over_the_last_hour():
    series = Series(step=30, span=120)
    series.add(1000.0, {"pages": 5, "errors": 1})  # bucket 990
    series.add(1010.0, {"pages": 2})
    series.add(1085.0, {"pages": 7, "retries": 2})  # bucket 1080; 1020, 1050 empty
    data = series.to_json()
    assert data == {
        "step": 30,
        "t0": 990,
        "pages": [7, 0, 0, 7],
        "errors": [1, 0, 0, 0],
        "retries": [0, 0, 0, 2],
    }
    series.add(1111.0, {"pages": 1})  # bucket 1110: 990 is more than 120 s old
    assert series_points(series.to_json(), "pages") == [
        (1080.0, 7),
        (1110.0, 1),
    ]
    assert series_points({"step": "x"}, "pages") == []


@pytest.mark.parametrize(
    ("on_wire", "proxy", "host", "pending", "expected"),
    [
        (1, 5, 5, 11, FETCHING),
        (0, 2, 5, 7, WAITING_PROXY),
        (0, 0, 3, 3, WAITING_HOST),
        (0, 0, 0, 4, FETCHING),
        (0, 0, 0, 0, IDLE),
    ],
)
def test_activity_names_what_the_waiting_requests_wait_for(on_wire, proxy, host, pending, expected):
    assert activity(on_wire, proxy, host, pending) == expected
