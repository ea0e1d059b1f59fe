"""One host-budget scenario against both hub backends (SQLite, PostgreSQL): slots, send
times, give-back, concurrency, back-off, Crawl-delay, expiry, renewal, shared robots.txt.
Both run the same SQL (``crawler/hub/hostbudget.py``); what they answer must not differ."""

from __future__ import annotations

import threading
import time

import pytest

from crawler.hub import Hub
from crawler.hub.hostbudget import HostAsk, HostBudgetStore
from tests.hubs import hub_url  # noqa: F401 - a fixture

A, B = "host-a/1", "host-b/2"


@pytest.fixture
def store(hub_url):  # noqa: F811
    with Hub.open(hub_url) as hub:
        yield HostBudgetStore.open(hub)


def _r(x: float) -> float:
    """*x* to the half second: the scenario's own steps take a little time, more on a
    loaded machine, and every figure it checks is a whole second or half of one."""
    return round(x * 2) / 2


def scenario(store: HostBudgetStore) -> list[tuple]:
    seen: list[tuple] = []
    # One slot of three send times, a second apart; nobody else gets the host meanwhile.
    (a,) = store.take([HostAsk("a.test", 1.0, 1, count=3)], A, ttl=30)
    (slot,) = a.slots
    seen.append(("slot", _r(slot.start), slot.interval, slot.count))
    (b,) = store.take([HostAsk("a.test", 1.0, 1)], B, ttl=30)
    seen.append(("busy", b.slots, _r(b.retry_in)))
    # One request went (just now): the two unused times go back, and the next slot
    # starts one interval after the request that went.
    seen.append(("released", store.release([(slot.slot_id, 0.0)])))
    (b,) = store.take([HostAsk("a.test", 1.0, 1, count=1)], B, ttl=30)
    seen.append(("given back", _r(b.slots[0].start)))
    # A back-off holds every later slot until it ends.
    store.back_off("a.test", 5.0, "HTTP 429, Retry-After: 5")
    store.release([(b.slots[0].slot_id, None)])
    (a,) = store.take([HostAsk("a.test", 1.0, 1)], A, ttl=30)
    seen.append(("backoff", _r(a.slots[0].start), _r(a.backoff_in), a.backoff_reason))
    # A shorter back-off does not shorten a longer one.
    seen.append(("kept", _r(store.back_off("a.test", 1.0, "HTTP 503"))))
    # Crawl-delay raises the interval over the asker's own.
    store.set_crawl_delay("b.test", 2.0)
    (c,) = store.take([HostAsk("b.test", 0.5, 1, count=2)], A, ttl=30)
    seen.append(("crawl-delay", c.interval, [_r(t) for t in c.slots[0].times()]))
    # Concurrency: at most two slots at once, whoever asks; no interval: one open slot.
    d1, e = store.take([HostAsk("d.test", 0, 2, slots=3), HostAsk("e.test", 0, 4, count=9)], A, 30)
    (d2,) = store.take([HostAsk("d.test", 0, 2)], B, ttl=30)
    seen.append(("concurrency", len(d1.slots), len(d2.slots), e.slots[0].count))
    # A slot not renewed runs out at its TTL and the host is taken over.
    (f,) = store.take([HostAsk("f.test", 0, 1)], A, ttl=0.3)
    (held,) = store.take([HostAsk("f.test", 0, 1)], B, ttl=30)
    time.sleep(0.5)
    (g,) = store.take([HostAsk("f.test", 0, 1)], B, ttl=30)
    seen.append(("expiry", held.slots, len(g.slots)))
    renewed = store.renew([d1.slots[0].slot_id, f.slots[0].slot_id, a.slots[0].slot_id], 30)
    seen.append(("renewed", d1.slots[0].slot_id in renewed, f.slots[0].slot_id in renewed))
    seen.append(("renew says back-off", 3 < renewed[a.slots[0].slot_id] < 5))
    # robots.txt: one claim at a time, then everyone reads the stored body.
    seen.append(
        (
            "claims",
            store.claim_robots("a.test", A, 30, 3600),
            store.claim_robots("a.test", B, 30, 3600),
        )
    )
    store.put_robots("a.test", 200, b"User-agent: *\nCrawl-delay: 2\n")
    entry = store.robots("a.test", 3600)
    seen.append(("robots", entry.status, entry.body, store.claim_robots("a.test", B, 30, 3600)))
    seen.append(("stale", store.robots("a.test", -1)))
    states = {s.key: s for s in store.hosts()}
    seen.append(
        (
            "hosts",
            sorted(states),
            states["b.test"].crawl_delay,
            states["a.test"].backoff_reason,
            states["d.test"].live_slots,
        )
    )
    return seen


def test_both_backends_answer_alike(store):
    assert scenario(store) == [
        ("slot", 0.0, 1.0, 3),
        ("busy", (), 30.0),
        ("released", 1),
        ("given back", 1.0),
        ("backoff", 5.0, 5.0, "HTTP 429, Retry-After: 5"),
        ("kept", 5.0),
        ("crawl-delay", 2.0, [2.0, 4.0]),
        ("concurrency", 2, 0, 1),
        ("expiry", (), 1),
        ("renewed", True, False),
        ("renew says back-off", True),
        ("claims", True, False),
        ("robots", 200, b"User-agent: *\nCrawl-delay: 2\n", False),
        ("stale", None),
        (
            "hosts",
            ["a.test", "b.test", "d.test", "e.test", "f.test"],
            2.0,
            "HTTP 429, Retry-After: 5",
            2,
        ),
    ]


def test_concurrent_takers_never_share_a_schedule(store, hub_url):  # noqa: F811
    """Eight threads, each with a connection of its own, take send times of one host at
    once, and release each slot having sent its first request: every time handed out
    to a live slot is at least the interval from every other."""
    times: list[float] = []
    lock = threading.Lock()

    def taker(n: int) -> None:
        with Hub.open(hub_url) as hub:
            mine = HostBudgetStore.open(hub)
            for _ in range(5):
                (answer,) = mine.take([HostAsk("z.test", 0.25, 64, count=3)], f"t/{n}", 30)
                with lock:
                    for s in answer.slots:
                        times.append(answer.hub_now + s.start)
                # Sent at its first time: the next slot goes an interval after it.
                sent = [(s.slot_id, hub.now() - answer.hub_now - s.start) for s in answer.slots]
                mine.release(sent)

    threads = [threading.Thread(target=taker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    times.sort()
    assert len(times) == 8 * 5
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert min(gaps) >= 0.25 - 1e-6


def test_an_exchange_answers_as_a_release_then_a_take(store):
    """One call that gives slots back and asks for more: the slot given back is free for
    the ask in the same call (its host's schedule resumes an interval after the request
    that went), a busy host says when to ask again, a new host is made."""
    (a,) = store.take([HostAsk("x.test", 1.0, 1, count=3)], A, ttl=30)
    (busy,) = store.exchange([], [HostAsk("x.test", 1.0, 1)], B, 30)
    x, y = store.exchange(
        [(a.slots[0].slot_id, 0.0)], [HostAsk("x.test", 1.0, 1), HostAsk("y.test", 0, 2)], B, 30
    )
    assert (busy.slots, _r(busy.retry_in)) == ((), 30.0)
    assert [_r(s.start) for s in x.slots] == [1.0]
    assert (len(y.slots), y.slots[0].count) == (1, 1)
    # Releases alone still go; what was released is free to the next taker.
    assert store.exchange([(x.slots[0].slot_id, None), (y.slots[0].slot_id, None)], [], B, 30) == []
    (again,) = store.take([HostAsk("x.test", 1.0, 1)], A, ttl=30)
    assert len(again.slots) == 1
    assert {s.key: s.live_slots for s in store.hosts()} == {"x.test": 1, "y.test": 0}


def test_crossing_exchanges_never_deadlock(store, hub_url):  # noqa: F811
    """Two holders, each giving back a slot of the host the other asks for, over and over:
    every host row an exchange touches is locked in one order, so neither waits for the
    other in a cycle (PostgreSQL would end one with a deadlock error)."""
    errors: list[Exception] = []
    keys = [f"k{n}.test" for n in range(2)]
    start = threading.Barrier(2)

    def holder(n: int) -> None:
        with Hub.open(hub_url) as hub:
            mine = HostBudgetStore.open(hub)
            mine_key, theirs = keys[n], keys[1 - n]
            (held,) = mine.take([HostAsk(mine_key, 0, 64)], f"x/{n}", 30)
            slots = list(held.slots)
            start.wait()
            try:
                for _ in range(150):
                    # Give back this side's slots and ask for one of the other side's
                    # host, then the reverse: the two locks are wanted in both orders.
                    (got,) = mine.exchange(
                        [(s.slot_id, None) for s in slots], [HostAsk(theirs, 0, 64)], f"x/{n}", 30
                    )
                    (back,) = mine.exchange(
                        [(s.slot_id, None) for s in got.slots],
                        [HostAsk(mine_key, 0, 64)],
                        f"x/{n}",
                        30,
                    )
                    slots = list(back.slots)
            except Exception as exc:  # noqa: BLE001 - the failure is what is checked
                errors.append(exc)

    threads = [threading.Thread(target=holder, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
