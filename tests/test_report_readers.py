"""The crawl report's readers: the action-log aggregation (bounded bins and hosts,
incremental reads) and the hub, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections import Counter

import pytest

from crawler.hub import Holder, Hub, ProxyPool, RestPolicy, UsageCounts, redact_url
from crawler.report import logread
from crawler.report.advice import advice
from crawler.report.logread import MAX_BINS, LogFollower, LogStats, read_action_log
from crawler.report.model import lease_spans
from crawler.report.sources import ReportError, read_hub
from crawler.storage import actionlog
from tests.servers import need


# --- the aggregation -------------------------------------------------------------------------
def test_bins_stay_bounded_and_counts_survive(tmp_path):
    log = tmp_path / "fetch_log.jsonl"
    start = 1_700_000_000
    with log.open("w") as out:
        for i in range(20_000):
            ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(start + i * 37))
            outcome = "error" if i % 10 == 0 else "ok"
            out.write(
                json.dumps(
                    {
                        "ts": f"{ts}.250Z",
                        "url": f"http://h{i % 3}.test/{i}",
                        "outcome": outcome,
                        "status": 500 if outcome == "error" else 200,
                        "error": None,
                        "bytes": 10,
                    }
                )
                + "\n"
            )
        out.write('{"ts": "2026-01-01T00:00:00.000Z", "url": "http://cut')  # killed mid-line
    stats = read_action_log(log)
    assert len(stats.bins) <= MAX_BINS and stats.width > 1
    assert stats.lines == 20_000 and stats.bad_lines == 1
    assert stats.first_problem.startswith(f"{log}:20001: ")
    assert stats.outcomes == Counter(ok=18_000, error=2_000) and stats.ok_bytes == 180_000
    width, bins = stats.series(300)
    assert len(bins) <= 300
    assert sum(slots[0] for _, slots in bins) == 18_000
    assert sum(slots[4] for _, slots in bins) == 2_000
    assert (
        sum(stats.host_errors["h0.test"].values())
        + sum(stats.host_errors["h1.test"].values())
        + sum(stats.host_errors["h2.test"].values())
        == 2_000
    )
    merged = LogStats()
    merged.merge(stats)
    merged.merge(stats)
    assert merged.outcomes["ok"] == 36_000
    assert sum(slots[0] for _, slots in merged.series(300)[1]) == 36_000


def test_hosts_are_bounded_and_the_top_ones_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(logread, "MAX_HOSTS", 10)
    log = tmp_path / "fetch_log.jsonl"
    with log.open("w") as out:
        for i in range(200):
            host = "worst.test" if i % 4 == 0 else f"h{i}.test"
            entry = {"ts": "2026-01-01T00:00:00.000Z", "url": f"http://{host}/", "outcome": "error",
                     "status": None, "error": "TimeoutError: slow"}  # fmt: skip
            out.write(json.dumps(entry) + "\n")
    stats = read_action_log(log)
    assert len(stats.host_errors) <= 10 and stats.hosts_dropped > 0
    assert stats.host_errors["worst.test"] == Counter(TimeoutError=50)


# --- the hub, SQLite and PostgreSQL ----------------------------------------------------------
PG_TEST_URL = os.environ.get("PG_TEST_URL", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture(params=["sqlite", "postgresql"])
def any_hub_url(request, tmp_path):
    """A fresh hub: a SQLite file, or a PostgreSQL schema of its own."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/hub.db"
        return
    import psycopg

    schema = f"reporttest_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        admin = psycopg.connect(PG_TEST_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        need(f"no PostgreSQL at {redact_url(PG_TEST_URL)} (set PG_TEST_URL): {exc}")
    admin.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in PG_TEST_URL else "?"
    try:
        yield f"{PG_TEST_URL}{sep}options=-csearch_path%3D{schema}"
    finally:
        admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        admin.close()


def test_hub_is_read_from_sqlite_and_postgresql(any_hub_url):
    with Hub.open(any_hub_url) as hub:
        pool = ProxyPool(hub)
        pool.add(["http://bob:s3cret-pw@10.0.0.1:3128", "http://10.0.0.2:3128"])
        holder = Holder("node1", 42, "7_3")
        banned = pool.acquire(holder, ttl=60)
        pool.release(banned, "banned", UsageCounts(requests=3, failures=1, bans=1))
        rotated = pool.acquire(holder, ttl=60)
        pool.release(rotated, "rotated", UsageCounts(requests=5), RestPolicy(rest_seconds=0))
        held = pool.acquire(holder, ttl=60)  # still held when the report reads the hub
        proxies, usage, now = pool.proxies(), pool.usage(), hub.now()
    assert held is not None and held.proxy_id == rotated.proxy_id != banned.proxy_id
    read = read_hub(any_hub_url, now)
    assert [p.url for p in read.proxies] == [redact_url(p.url) for p in proxies]
    assert "s3cret-pw" not in repr(read)
    assert [(p.total_uses, p.bans, p.state) for p in read.proxies] == [
        (p.total_uses, p.bans, p.state) for p in proxies
    ]
    assert [(u.proxy_id, u.requests, u.end_reason) for u in read.leases] == [
        (u.proxy_id, u.requests, u.end_reason) for u in sorted(usage, key=lambda u: u.started)
    ]
    spans = dict(lease_spans(read))
    kinds = [kind for rows in spans.values() for _, _, kind in rows]
    assert set(kinds) == {"banned", "held", "rest", "rotated"}


def test_unreadable_hub_is_a_clear_error(tmp_path):
    with pytest.raises(ReportError, match="hub sqlite:///.*cannot read its proxies"):
        read_hub(f"sqlite:///{tmp_path}/absent.db", time.time())
    with pytest.raises(ReportError, match=r"HUB_URL 'mysql://u:\*\*\*@h/x' is not supported"):
        read_hub("mysql://u:pw@h/x", time.time())


def test_follower_reads_only_what_was_appended(tmp_path):
    log = tmp_path / "fetch_log.jsonl"

    def line(i: int, outcome: str = "ok") -> str:
        return json.dumps({"ts": f"2026-01-01T00:00:{i:02d}.000Z", "url": "http://a.test/",
                           "outcome": outcome, "bytes": 100})  # fmt: skip

    log.write_text("".join(line(i) + "\n" for i in range(10)))
    follower = LogFollower(log)
    assert follower.update().lines == 10
    with log.open("a") as out:
        out.write("".join(line(i, "retry") + "\n" for i in range(10, 15)))
        out.write(line(15)[:20])  # being written
    stats = follower.update()
    assert (stats.lines, stats.outcomes["retry"], stats.bad_lines) == (15, 5, 0)
    with log.open("a") as out:
        out.write(line(15)[20:] + "\n")
    assert follower.update().outcomes == Counter(ok=11, retry=5)
    assert follower.stats.ok_bytes == 1100
    log.write_text(line(1) + "\n")  # replaced by a shorter log
    assert follower.update().lines == 1


def _lines(path, seconds, outcome="ok", **fields) -> None:
    with path.open("a") as out:
        for s in seconds:
            ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(1_767_225_600 + s))
            entry = {"ts": f"{ts}.000Z", "url": "http://a.test/", "outcome": outcome}
            out.write(json.dumps({"bytes": 1000, **entry, **fields}) + "\n")


def test_rates_count_active_time_not_stalls_or_time_between_runs(tmp_path):
    log = tmp_path / "fetch_log.jsonl"
    _lines(log, range(10))  # 10 pages in 9 s, ten minutes of nothing, 10 more
    _lines(log, range(609, 619))
    stats = read_action_log(log)
    assert stats.span_seconds == 618
    assert stats.active_seconds == 19  # the 599 s with no line at all left out
    assert stats.pages_per_second == pytest.approx(20 / 19)
    # A pause shorter than IDLE_GAP_SECONDS is part of the crawl's time.
    short = tmp_path / "short.jsonl"
    _lines(short, [0, 1, 2 + logread.IDLE_GAP_SECONDS - 2])
    assert read_action_log(short).active_seconds == logread.IDLE_GAP_SECONDS


def test_each_run_gets_its_own_lines(tmp_path):
    log = tmp_path / "fetch_log.jsonl"
    _lines(log, range(10))
    _lines(log, range(600, 605), "error", error="HTTP 500", status=500)
    follower = LogFollower(log, starts=[1_767_225_600 + 300])
    follower.update()
    before, second = follower.runs
    assert (before.pages, before.outcomes["error"], before.active_seconds) == (10, 0, 9)
    assert (second.pages, second.outcomes["error"], second.active_seconds) == (0, 5, 4)
    # A run recorded later takes the lines from its start on.
    _lines(log, range(900, 903))
    follower.set_starts([1_767_225_600 + 300, 1_767_225_600 + 800])
    follower.update()
    assert [r.lines for r in follower.runs] == [10, 5, 3]


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        ("500 Internal Server Error", 500, "HTTP 500"),  # a retry's reason
        ("HTTP 500", 500, "HTTP 500"),  # the final error's
        (None, 503, "HTTP 503"),
        (
            "twisted.internet.error.TimeoutError: User timeout caused connection failure.",
            None,
            "TimeoutError",
        ),  # fmt: skip
        (
            "TimeoutError: Getting http://a.test/ took longer than 180.0 seconds.",
            None,
            "TimeoutError",
        ),  # fmt: skip
        ("Forbidden by robots.txt", None, actionlog.ROBOTS_KIND),
        ("/data/urls.txt:32: contains white space: 'not a url'", None, actionlog.BAD_LINE_KIND),
        ("/other/list.txt:7: not a URL", None, actionlog.BAD_LINE_KIND),
    ],
)
def test_one_name_per_cause_and_what_to_do(error, status, kind):
    assert actionlog.error_kind(error, status) == kind
    assert advice(kind) != advice("SomethingUnheardOf")
