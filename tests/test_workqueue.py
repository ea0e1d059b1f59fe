"""The hub's work queue (crawler/hub/workqueue.py), on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from crawler.admin import QueueAdmin
from crawler.hub import Hub
from crawler.hub.workqueue import (
    WORK_SCHEMA_VERSION,
    WorkQueue,
    WorkQueueError,
    ensure_work_schema,
    list_lines,
)
from tests.hubs import hub_url, scrapy_with_hub  # noqa: F401 - hub_url: a fixture
from tests.polling import wait_until

URLS = [f"http://example.org/{n}" for n in range(25)]


@pytest.fixture
def queue(hub_url):  # noqa: F811
    with Hub.open(hub_url) as hub:
        queue = WorkQueue(hub, "q1")
        queue.load(URLS)
        yield queue


def test_schema_is_idempotent_and_versioned(hub_url):  # noqa: F811
    for _ in range(2):
        with Hub.open(hub_url) as hub:
            assert ensure_work_schema(hub) == WORK_SCHEMA_VERSION
            WorkQueue(hub, "q")
            count = hub.query("SELECT COUNT(*) FROM hub_work_schema")[0][0]
            assert count == WORK_SCHEMA_VERSION


def test_items_done_under_version_1_count_as_done_after_the_upgrade(hub_url):  # noqa: F811
    with Hub.open(hub_url) as hub:
        queue = WorkQueue(hub, "old")
        queue.load(URLS[:3])
        batch = queue.lease("a", 2, ttl=60)
        assert queue.done(batch)
        # Version 1 marked each item of a finished batch; version 2 marks only its lease.
        hub.execute(
            "UPDATE hub_work_items SET state = 'done', lease_id = NULL WHERE lease_id = ?",
            (batch.lease_id,),
        )
        progress = queue.progress()
        assert (progress.done, progress.pending, progress.finished) == (2, 1, False)


def test_load_streams_dedupes_and_keeps_queues_apart(hub_url):  # noqa: F811
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


def test_given_back_items_behind_newer_leases_are_leased_again(queue):
    a, b = queue.lease("a", 5, ttl=60), queue.lease("b", 5, ttl=60)
    assert queue.release(a)  # its items lie before b's and before where leases now look
    other = WorkQueue(queue.hub, "q1", create=False)  # another process, its own start
    taken = []
    while (batch := (other if len(taken) % 2 else queue).lease("c", 4, ttl=60)) is not None:
        taken += batch.urls
        assert queue.done(batch)
    assert sorted(taken) == sorted(set(URLS) - set(b.urls)), "each leased once, none lost"
    assert queue.done(b) and queue.progress().finished


def test_expired_batch_is_taken_over_whole(queue):
    dead = queue.lease("dead", 10, ttl=0.2)
    live = queue.lease("live", 10, ttl=60)
    assert queue.renew(live, 60)
    wait_until(lambda: queue.progress().expired == 10, "the dead holder's lease to expire")
    taken = queue.lease("heir", 3, ttl=60)  # the expired batch first, whole
    assert taken.urls == dead.urls and taken.taken_over == dead.lease_id
    # The dead holder has lost it: no renewal, no done, no release.
    assert not queue.renew(dead, 60) and not queue.done(dead) and not queue.release(dead)
    assert queue.done(taken)
    assert queue.progress().done == 10
    reasons = {lease["holder"]: lease["end_reason"] for lease in queue.leases()}
    assert reasons["dead"] == "expired" and reasons["heir"] == "done"


def test_renewal_keeps_a_batch_from_being_taken_over(queue):
    batch = queue.lease("a", 5, ttl=0.05)
    wait_until(lambda: queue.progress().expired == 5, "the lease to run out")
    # Run out but not taken over yet: a renewal makes it live again, from now.
    assert queue.renew(batch, 60)
    progress = queue.progress()
    assert (progress.expired, progress.leased, progress.holders) == (0, 5, 1)
    assert queue.lease("b", 100, ttl=60).urls == tuple(URLS[5:])
    assert queue.renew(batch, 60) and queue.done(batch)


def test_no_url_leased_twice_under_contention(hub_url):  # noqa: F811
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


# --- scrapy queue ------------------------------------------------------------------------
def scrapy_queue(*args: str, hub: str | None = None, stdin: str | None = None):
    return scrapy_with_hub("queue", *args, hub=hub, stdin=stdin)


def test_queue_admin_loads_and_reports(hub_url, tmp_path):  # noqa: F811
    urls = tmp_path / "urls.txt"
    urls.write_text("# list\nhttp://example.org/a\n\nhttp://example.org/b\nhttp://EXAMPLE.org/a\n")
    with Hub.open(hub_url) as hub:
        admin = QueueAdmin(hub)
        loaded = admin.load("q", str(urls)).splitlines()
        assert loaded[0].endswith("2 URLs added, 1 already there")
        assert (
            loaded[1] == "queue 'q': done 0/2 (0.0%), leased 0 by 0 holders, expired 0, pending 2"
        )
        queue = WorkQueue(hub, "q", create=False)
        assert queue.done(queue.lease("a", 1, ttl=60))
        queue.lease("b", 1, ttl=60)
        assert admin.status("q") == (
            "queue 'q': done 1/2 (50.0%), leased 1 by 1 holders, expired 0, pending 0"
        )
        with pytest.raises(WorkQueueError, match="no queue 'other'.*load it first"):
            admin.status("other")
        with pytest.raises(WorkQueueError, match="cannot read the URL list"):
            admin.load("q", str(tmp_path / "missing.txt"))


def test_queue_command_end_to_end(tmp_path):
    hub = f"sqlite:///{tmp_path}/hub.db"
    urls = tmp_path / "urls.txt"
    urls.write_text("http://example.org/a\nhttp://example.org/b\n")
    done = scrapy_queue("load", "q", str(urls), hub=hub)
    assert done.returncode == 0, done.stderr
    assert "2 URLs added, 0 already there" in done.stdout
    piped = scrapy_queue("load", "q", "-", hub=hub, stdin="http://example.org/c\n")
    assert piped.returncode == 0 and "1 URLs added" in piped.stdout, piped.stderr
    # -s HUB_URL works as well as the environment variable.
    status = scrapy_queue("-s", f"HUB_URL={hub}", "status", "q")
    assert status.returncode == 0, status.stderr
    assert status.stdout.strip() == (
        "queue 'q': done 0/3 (0.0%), leased 0 by 0 holders, expired 0, pending 3"
    )


def test_queue_load_names_the_file_and_line_of_each_bad_line_and_loads_the_rest(tmp_path):
    hub = f"sqlite:///{tmp_path}/hub.db"
    urls = tmp_path / "urls.txt"
    urls.write_text(
        "# a list\nhttp://example.org/a\nexample.org/no-scheme\n\n"
        "http://example.org:99999/bad-port\nhttp://example.org/b\nftp://example.org/c\n"
    )
    done = scrapy_queue("load", "q", str(urls), hub=hub)
    assert done.returncode == 0, done.stderr
    # As a crawl of the list says them: file:line, why, the line.
    assert done.stderr.splitlines() == [
        f"Skipped line {urls}:3: not an absolute http(s) URL: 'example.org/no-scheme'",
        f"Skipped line {urls}:5: not a URL (Port out of range 0-65535): "
        "'http://example.org:99999/bad-port'",
        f"Skipped line {urls}:7: not an absolute http(s) URL: 'ftp://example.org/c'",
    ]
    assert "2 URLs added, 0 already there" in done.stdout
    assert f"queue 'q': 3 lines of {urls} left out: not URLs to fetch" in done.stdout
    with Hub.open(hub) as opened:
        batch = WorkQueue(opened, "q", create=False).lease("a", 10, ttl=60)
        assert batch.urls == ("http://example.org/a", "http://example.org/b")
    piped = scrapy_queue("load", "q", "-", hub=hub, stdin="http://example.org/c\nnot a url\n")
    assert piped.stderr.strip() == "Skipped line <stdin>:2: contains white space: 'not a url'"
    assert "1 URLs added" in piped.stdout


def test_queue_command_errors_are_clear(tmp_path):
    hub = f"sqlite:///{tmp_path}/hub.db"
    missing = scrapy_queue("status", "nope", hub=hub)
    assert missing.returncode == 1 and "load it first" in missing.stderr
    nohub = scrapy_queue("status", "q")
    assert nohub.returncode == 2 and "set HUB_URL" in nohub.stderr
    nolist = scrapy_queue("load", "q", str(tmp_path / "missing.txt"), hub=hub)
    assert nolist.returncode == 1 and "cannot read the URL list" in nolist.stderr
    usage = scrapy_queue("frobnicate", hub=hub)
    assert usage.returncode == 2 and "give one of" in usage.stderr
    down = scrapy_queue("status", "q", hub="postgresql://u:hunter2@127.0.0.1:1/x")
    assert down.returncode == 1 and "cannot reach the hub" in down.stderr
    assert "hunter2" not in down.stdout + down.stderr


def test_stats_say_speed_eta_failures_and_who_holds_what(queue):
    a = queue.lease("node1/11", 10, ttl=60)
    queue.lease("node1/12", 5, ttl=60)
    queue.lease("node2/13", 5, ttl=60)
    # Worked for 100 s: the rate is over those, not over the 10 min window.
    queue.hub.execute("UPDATE hub_work_leases SET started = started - 100")
    assert queue.done(a, failed=list(a.urls[:3]))
    stats = queue.stats(window=600)
    p = stats.progress
    assert (p.done, p.leased, p.pending, stats.failed) == (7, 10, 8, 3)
    assert stats.held_by_host == {"node1": (1, 5), "node2": (1, 5)}
    assert stats.done_recently == 7 and 100 <= stats.window < 110
    assert stats.eta == pytest.approx(18 / (7 / stats.window))
    text = QueueAdmin(queue.hub).stats("q1")
    assert "25 total, 8 pending, 10 leased" in text and "7 done, 0 failed for good" in text
    assert "ETA 4 min" in text and "node2" in text


def test_a_failed_url_goes_back_until_it_failed_too_often_then_waits_for_a_requeue(hub_url):  # noqa: F811
    """A batch done with one URL failed: that URL is pending again (counted), leased by
    the next batch; failed a third time (WORK_MAX_ATTEMPTS) it is kept as failed, the
    queue finished, until ``requeue`` puts it back."""
    with Hub.open(hub_url) as hub:
        queue = WorkQueue(hub, "flaky")
        queue.load(URLS[:3])
        bad = URLS[1]
        batch = queue.lease("a", 10, ttl=60)
        assert queue.done(batch, [bad], max_attempts=3)
        assert (queue.progress().done, queue.progress().pending) == (2, 1)
        for attempt in (2, 3):
            again = queue.lease("b", 10, ttl=60)
            assert again.urls == (bad,), attempt
            assert queue.done(again, [bad], max_attempts=3)
        progress = queue.progress()
        assert (progress.failed, progress.pending, progress.finished) == (1, 0, True)
        assert queue.lease("c", 10, ttl=60) is None
        assert "failed 1" in QueueAdmin(hub).status("flaky")
        assert "1 failed URL(s) pending again" in QueueAdmin(hub).requeue("flaky")
        assert queue.lease("c", 10, ttl=60).urls == (bad,)


def test_the_eta_comes_from_the_queue_s_own_rate(hub_url):  # noqa: F811
    """A queue worked for a few seconds: its rate is over those seconds, not over the
    whole window (10 URLs done in ~2 s is ~5 URLs/s, not 10 in 10 minutes)."""
    with Hub.open(hub_url) as hub:
        queue = WorkQueue(hub, "quick")
        queue.load(URLS[:20])
        batch = queue.lease("a", 10, ttl=60)
        hub.execute(
            "UPDATE hub_work_leases SET started = started - 2 WHERE id = ?", (batch.lease_id,)
        )
        assert queue.done(batch)
        stats = queue.stats(window=600)
        assert 2.0 <= stats.window <= 10.0 and stats.rate >= 1.0
        assert stats.eta is not None and stats.eta < 20
