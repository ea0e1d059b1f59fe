"""The live views' model (crawler/watch/model.py) and its two drawings, plain text and
HTML, from heartbeat rows made by hand: which process is dead, stalled or waiting,
the totals and ETA, the hosts and proxies lists, sorting and filtering."""

from __future__ import annotations

import re

import pytest

from crawler.hub import heartbeats as hb
from crawler.hub.heartbeats import Beat
from crawler.hub.workqueue import QueueProgress, QueueStats
from crawler.watch.model import (
    DEAD,
    FETCHING,
    FINISHED,
    IDLE,
    STALLED,
    WAITING_HOST,
    WAITING_PROXY,
    Snapshot,
    ViewError,
    ViewOptions,
    build,
    node_rates,
    process_state,
)
from crawler.watch.page import render_page
from crawler.watch.terminal import plain

NOW = 1_800_000_000.0
SECRET = "s3cret-pw"


def beat(pid: int, node: str = "n1", **values) -> Beat:
    defaults = {
        "id": f"{node}/{pid}/x",
        "node": node,
        "pid": pid,
        "period": 5.0,
        "state": hb.FETCHING,
        "job": "j",
        "started": NOW - 600,
        "updated": NOW - 1,
        "pages_per_s": 2.0,
        "pending": 8,
    }
    return Beat(**{**defaults, **values})


def test_a_process_is_dead_after_three_periods_without_a_heartbeat():
    assert process_state(beat(1, updated=NOW - 15), NOW) == FETCHING
    assert process_state(beat(1, updated=NOW - 15.1), NOW) == DEAD
    assert process_state(beat(1, updated=NOW - 3.1, period=1.0), NOW) == DEAD
    # A process that said it finished is finished, however long ago.
    assert process_state(beat(1, updated=NOW - 9999, state=hb.FINISHED), NOW) == FINISHED


def test_stalled_is_no_page_over_the_rate_window_with_work_pending():
    assert process_state(beat(1, pages_per_s=0.0), NOW) == STALLED
    # Skipping stored URLs of its list: moving on, though it fetches nothing.
    assert process_state(beat(1, pages_per_s=0.0, detail={"list_per_s": 900.0}), NOW) == FETCHING
    assert process_state(beat(1, pages_per_s=0.0, pending=0, state=hb.IDLE), NOW) == IDLE
    # Too young to tell: its rate window is not full yet.
    assert process_state(beat(1, pages_per_s=0.0, started=NOW - 10), NOW) == FETCHING
    # What it waits for explains it: not stalled.
    assert process_state(beat(1, pages_per_s=0.0, state=hb.WAITING_PROXY), NOW) == WAITING_PROXY
    assert process_state(beat(1, pages_per_s=0.0, state=hb.WAITING_HOST), NOW) == WAITING_HOST


def snapshot(*beats: Beat, **values) -> Snapshot:
    return Snapshot(
        job="j", hub="postgresql://crawler:***@db:5432/hub", now=NOW, beats=list(beats), **values
    )


def test_totals_count_live_rates_and_every_process_s_pages():
    view = build(
        snapshot(
            beat(1, pages=100, errors=2, bans=1, lag=5),
            beat(2, pages=50, errors=1, updated=NOW - 60, lag=7),  # dead: its rate and lag are gone
            beat(3, pages=10, state=hb.FINISHED, pages_per_s=4.0),
        )
    )
    t = view.totals
    assert (t.processes, t.pages, t.errors, t.bans, t.lag) == (3, 160, 3, 1, 5)
    assert t.pages_per_s == 2.0
    assert view.counts == {FETCHING: 1, DEAD: 1, FINISHED: 1}
    assert view.state_line() == "3 processes: 1 dead, 1 fetching, 1 finished"
    assert [p.beat.pid for p in view.problems] == [2]


def test_eta_is_the_last_list_to_finish_or_the_queue_left():
    def listing(pid, done, total, rate):
        return beat(pid, detail={"list_done": done, "list_total": total, "list_per_s": rate})

    view = build(snapshot(listing(1, 50, 100, 5.0), listing(2, 10, 100, 1.0)))
    assert view.eta == 90.0  # the second: 90 URLs at 1/s
    assert build(snapshot(listing(1, 50, 100, 0.0))).eta is None  # nothing moves
    assert build(snapshot(beat(1))).eta is None  # a list of unknown length
    finished = beat(1, state=hb.FINISHED, detail={"list_done": 5, "list_total": 5})
    assert build(snapshot(finished)).eta == 0.0
    queue = QueueStats(
        QueueProgress(pending=300, leased=100, expired=0, done=600, holders=2), 0, 60, 600.0, {}
    )
    view = build(snapshot(listing(1, 0, 50, 2.0), listing(2, 0, 50, 2.0), queue=queue))
    assert view.eta == 100.0  # 400 URLs left at 4/s


def test_hosts_most_waited_on_add_up_every_process():
    gate = {
        "key": "slow.example",
        "slots": 1,
        "in_flight": 1,
        "waiting": 4,
        "reason": "Crawl-delay 5 s",
    }
    other = {"key": "fast.example", "slots": 1, "in_flight": 1, "waiting": 0, "reason": ""}
    view = build(
        snapshot(
            beat(
                1,
                detail={
                    "hosts": [gate, other],
                    "waited": [{"host": "slow.example", "episodes": 3, "seconds": 12.5}],
                },
            ),
            beat(
                2,
                detail={
                    "hosts": [gate],
                    "waited": [{"host": "old.example", "episodes": 1, "seconds": 99.0}],
                },
            ),
        )
    )
    slow, old = view.hosts
    assert (slow.host, slow.waiting, slow.holders, slow.seconds, slow.reason) == (
        "slow.example", 8, 2, 12.5, "Crawl-delay 5 s",
    )  # fmt: skip
    assert (old.host, old.waiting, old.seconds) == ("old.example", 0, 99.0)


def test_proxies_most_banned_are_the_job_s_own():
    bans = [
        {
            "label": "http://u:***@p1:3128",
            "state": "banned",
            "host": "n1",
            "pid": 1,
            "bans": 3,
            "requests": 40,
        },
        {
            "label": "http://u:***@p1:3128",
            "state": "banned",
            "host": "n1",
            "pid": 2,
            "bans": 1,
            "requests": 10,
        },
        {
            "label": "http://p2:3128",
            "state": "banned",
            "host": "elsewhere",
            "pid": 1,
            "bans": 9,
            "requests": 9,
        },
    ]
    holding = {"proxies": [{"id": 3, "label": "http://p3:3128", "uses": 4, "alive": True}]}
    view = build(snapshot(beat(1, detail=holding), beat(2), proxy_bans=bans))
    assert [(p.label, p.bans, p.requests) for p in view.proxies] == [
        ("http://u:***@p1:3128", 4, 50),
        ("http://p3:3128", 0, 0),
    ]
    assert view.proxies[1].holders == ("n1/1",)


def test_sort_and_filter():
    beats = [
        beat(1, node="b", pages_per_s=9.0),
        beat(2, node="a", updated=NOW - 100),
        beat(3, node="c", state=hb.WAITING_PROXY, errors=7),
        beat(4, node="a2", pages_per_s=5.0),
    ]
    pids = lambda view: [p.beat.pid for p in view.shown]  # noqa: E731
    assert pids(build(snapshot(*beats))) == [2, 3, 4, 1]  # dead, waiting, then by node
    assert pids(build(snapshot(*beats), ViewOptions.parse("rate"))) == [1, 4, 3, 2]
    assert pids(build(snapshot(*beats), ViewOptions.parse("errors"))) == [3, 2, 4, 1]
    assert pids(build(snapshot(*beats), ViewOptions.parse(states="problems"))) == [2]
    assert pids(build(snapshot(*beats), ViewOptions.parse(states="waiting,fetching"))) == [3, 4, 1]
    assert pids(build(snapshot(*beats), ViewOptions.parse(nodes=["a*"]))) == [2, 4]
    assert len(build(snapshot(*beats), ViewOptions.parse(states="dead")).every) == 4
    with pytest.raises(ViewError, match="--sort 'speed'"):
        ViewOptions.parse("speed")
    with pytest.raises(ViewError, match="--state 'broken'"):
        ViewOptions.parse(states="dead,broken")
    options = ViewOptions()
    assert (
        options.next_sort().sort == "node"
        and options.toggle_problems().toggle_problems() == options
    )


def test_plain_lines_name_each_process_and_the_log_of_a_dead_one():
    view = build(
        snapshot(
            beat(11, pages=120, pages_per_s=3.5, task="77_0"),
            beat(12, updated=NOW - 30, log="/scratch/logs/job_p1.log"),
            beat(13, state=hb.WAITING_PROXY, detail={"proxy_waiting": 16, "proxy_wait_s": 42.0}),
            # No log file (its stderr a pipe): the action log is the place to look.
            beat(14, node="n2", updated=NOW - 99, detail={"action_log": "/d/fetch_log.jsonl"}),
        )
    )
    text = plain(view)
    assert "\x1b" not in text, "no escape codes"
    lines = text.splitlines()
    assert lines[0] == "job 'j' in postgresql://crawler:***@db:5432/hub, 2027-01-15 08:00:00 UTC"
    assert any(
        line.startswith("DEAD: n1/12")
        and "no heartbeat for 30 s" in line
        and "read n1:/scratch/logs/job_p1.log" in line
        for line in lines
    ), text
    assert (
        "DEAD: n2/14 (task -): no heartbeat for 99 s (every 5 s); read n2:/d/fetch_log.jsonl"
        in text
    )
    rows = {int(line.split()[1]): line.split() for line in lines if re.match(r"n1\s+\d+\s", line)}
    assert set(rows) == {11, 12, 13}
    assert rows[11][2:5] == ["77_0", "fetching", "3.5"]
    assert " ".join(rows[13][3:7]) == "waiting for a proxy"
    assert "16 requests wait for a proxy lease (42 s)" in text


def test_the_page_names_no_credential_and_carries_its_numbers():
    proxies = {
        "proxies": [{"id": 1, "label": "http://alice:***@10.0.0.1:3128", "uses": 3, "alive": True}]
    }
    series = {
        "step": 30,
        "t0": NOW - 90,
        "pages": [30, 60, 45],
        "errors": [0, 2, 1],
        "retries": [1, 0, 0],
    }
    view = build(
        snapshot(
            beat(
                1,
                pages=135,
                detail={**proxies, "series": series},
                last_error=f"10:00:00 UTC HTTP 502: http://bob:{SECRET}@example.org/page",
            ),
            beat(2, node="n2", updated=NOW - 60, detail={"series": series}),
        )
    )
    html = render_page(view, 5)
    assert SECRET not in html and "alice:***@10.0.0.1" in html and "bob:***@example.org" in html
    assert SECRET not in plain(view)
    assert 'data-stat="job:pages" data-value="135"' in html
    assert 'data-stat="state:dead" data-value="1"' in html
    assert (
        'data-state="dead"' in html
        and 'id="plot-node-rates"' in html
        and 'id="plot-failures"' in html
    )
    assert node_rates(view.every, NOW)["n1"] == [(NOW - 90, 1.0), (NOW - 60, 2.0), (NOW - 30, 1.5)]


def test_pages_per_second_per_node_count_the_time_each_process_ran():
    series = {"step": 30, "t0": NOW - 60, "pages": [60, 30], "errors": [0, 0], "retries": [0, 0]}
    young = {"step": 30, "t0": NOW - 30, "pages": [30], "errors": [0], "retries": [0]}
    view = build(
        snapshot(
            beat(1, detail={"series": series}),
            # Started 10 s ago, mid-bucket: its 30 pages came in 10 s, not 30.
            beat(2, started=NOW - 10, detail={"series": young}),
            # Dead 40 s ago: its last bucket ran 20 s.
            beat(3, node="n2", updated=NOW - 40, detail={"series": {**series, "t0": NOW - 90}}),
        )
    )
    assert node_rates(view.every, NOW) == {
        "n1": [(NOW - 60, 2.0), (NOW - 30, 1.0 + 3.0)],
        "n2": [(NOW - 90, 2.0), (NOW - 60, 1.5)],
    }
