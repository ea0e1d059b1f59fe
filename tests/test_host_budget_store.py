"""One host-budget scenario against both hub backends (SQLite, PostgreSQL): stretches,
give-back, the line of waiters, units and shares, back-off, expiry, renewal, leaving,
shared robots.txt; and the schedule's bound under many takers. Both backends must
answer alike (``crawler/hub/hostbudget.py``)."""

from __future__ import annotations

import threading
import time

import pytest

from crawler.hub import Hub
from crawler.hub.hostbudget import HostAsk, HostBudgetStore
from crawler.hub.locks import AdvisoryLock
from tests.hubs import (
    hub_url,  # noqa: F401 - a fixture
    pg_schema_url,
)

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
    # A stretch of three send times, a second apart; nobody else gets the host meanwhile,
    # and is told to ask again when its times are over.
    (a,) = store.take([HostAsk("a.test", 1.0, 1, count=3)], A, ttl=30)
    (slot,) = a.slots
    seen.append(("slot", _r(slot.start), slot.interval, slot.count))
    (b,) = store.take([HostAsk("a.test", 1.0, 1)], B, ttl=30)
    seen.append(("busy", b.slots, _r(b.retry_in), b.queued))
    # One request went (just now): the two unused times go back, and the next stretch
    # starts one interval after the request that went.
    seen.append(("released", store.release([(slot.slot_id, 0.0)])))
    (b,) = store.take([HostAsk("a.test", 1.0, 1, count=1)], B, ttl=30)
    seen.append(("given back", _r(b.slots[0].start)))
    # A back-off holds the key: nothing is given until it ends.
    store.back_off("a.test", 5.0, "HTTP 429, Retry-After: 5")
    store.release([(b.slots[0].slot_id, None)])
    (a,) = store.take([HostAsk("a.test", 1.0, 1)], A, ttl=30)
    seen.append(("backoff", a.slots, _r(a.retry_in), _r(a.backoff_in), a.backoff_reason))
    # A shorter back-off does not shorten a longer one.
    seen.append(("kept", _r(store.back_off("a.test", 1.0, "HTTP 503"))))
    # The interval is the asker's: the store applies it.
    (c,) = store.take([HostAsk("b.test", 2.0, 1, count=2)], A, ttl=30)
    seen.append(("interval", c.interval, [_r(t) for t in c.slots[0].times()]))
    # Without interval: units, at most two at once, whoever asks; one send time each.
    d1, e = store.take([HostAsk("d.test", 0, 2, slots=3), HostAsk("e.test", 0, 4, count=9)], A, 30)
    (d2,) = store.take([HostAsk("d.test", 0, 2)], B, ttl=30)
    seen.append(("concurrency", len(d1.slots), len(d2.slots), e.slots[0].count, d2.queued))
    # A slot not renewed runs out at its TTL and the host is taken over.
    (f,) = store.take([HostAsk("f.test", 0, 1)], A, ttl=0.3)
    (held,) = store.take([HostAsk("f.test", 0, 1)], B, ttl=30)
    time.sleep(0.5)
    (g,) = store.take([HostAsk("f.test", 0, 1)], B, ttl=30)
    seen.append(("expiry", held.slots, len(g.slots)))
    # Renewals: B waits for d.test, so A's share of its two units is one.
    renewed = store.renew([d1.slots[0].slot_id, f.slots[0].slot_id], 30)
    seen.append(("renewed", d1.slots[0].slot_id in renewed, f.slots[0].slot_id in renewed))
    seen.append(("share", renewed[d1.slots[0].slot_id].share))
    (h,) = store.take([HostAsk("h.test", 0, 1)], A, ttl=30)
    store.back_off("h.test", 4.0, "HTTP 503, Retry-After: 4")
    left = store.renew([h.slots[0].slot_id], 30)[h.slots[0].slot_id].backoff_in
    seen.append(("renew says back-off", 3 < left <= 4))
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
            states["a.test"].backoff_reason,
            states["d.test"].live_slots,
            states["d.test"].waiting,
        )
    )
    # A holder that ends leaves every line, gives its slots back and its claims pass on.
    store.claim_robots("c.test", A, 30, 3600)
    store.leave(A)
    (d3,) = store.take([HostAsk("d.test", 0, 2, slots=2)], B, ttl=30)
    seen.append(("left", len(d3.slots), store.claim_robots("c.test", B, 30, 3600)))
    return seen


def test_both_backends_answer_alike(store):
    assert scenario(store) == [
        ("slot", 0.0, 1.0, 3),
        ("busy", (), 3.0, False),
        ("released", 1),
        ("given back", 1.0),
        ("backoff", (), 5.0, 5.0, "HTTP 429, Retry-After: 5"),
        ("kept", 5.0),
        ("interval", 2.0, [0.0, 2.0]),
        ("concurrency", 2, 0, 1, False),
        ("expiry", (), 1),
        ("renewed", True, False),
        ("share", 1),
        ("renew says back-off", True),
        ("claims", True, False),
        ("robots", 200, b"User-agent: *\nCrawl-delay: 2\n", False),
        ("stale", None),
        (
            "hosts",
            ["a.test", "b.test", "d.test", "e.test", "f.test", "h.test"],
            "HTTP 429, Retry-After: 5",
            2,
            1,
        ),
        ("left", 2, True),
    ]


def test_the_line_gives_the_next_stretch_to_who_waited_longest(store):
    """A holder giving its stretch back and asking again in one call does not keep the
    host from a process that waits: the waiter gets the next stretch, then the first."""
    (a,) = store.take([HostAsk("x.test", 0.5, 1, count=2)], A, ttl=30)
    (waits,) = store.take([HostAsk("x.test", 0.5, 1, count=2)], B, ttl=30)
    (again,) = store.exchange([(a.slots[0].slot_id, 0.0)], [HostAsk("x.test", 0.5, 1)], A, 30)
    (turn,) = store.take([HostAsk("x.test", 0.5, 1, count=2)], B, ttl=30)
    (after,) = store.exchange([(turn.slots[0].slot_id, 0.0)], [HostAsk("x.test", 0.5, 1)], A, 30)
    assert (waits.slots, again.slots, again.queued) == ((), (), True)
    assert len(turn.slots) == 1 and _r(turn.slots[0].start) == 0.5
    assert len(after.slots) == 1


@pytest.mark.parametrize("interval", [0.5, 1.0])
def test_the_schedule_never_runs_ahead_whatever_takers_do(store, hub_url, interval):  # noqa: F811
    """Six takers of one host, each asking for long stretches and using some of the
    times, none or all, giving them back, or dying with them (a short TTL): the
    host's next time in the hub is never more than one interval, plus the longest
    stretch, ahead of now, and every taker gets turns."""
    import random

    rng = random.Random(7)
    count, bound = 20, interval + 20 * interval + 1.0
    stop = time.monotonic() + 6.0
    worst: list[float] = []
    turns: dict[int, int] = {}
    errors: list[Exception] = []

    def taker(n: int) -> None:
        with Hub.open(hub_url) as hub:
            mine = HostBudgetStore.open(hub)
            try:
                while time.monotonic() < stop:
                    ttl = 0.4 if rng.random() < 0.2 else 30  # some die with their stretch
                    (got,) = mine.take(
                        [HostAsk("run.test", interval, 1, count=count)], f"t/{n}", ttl
                    )
                    ahead = [h.next_at - h_now for h, h_now in _states(mine, hub, "run.test")]
                    worst.extend(ahead)
                    if not got.slots:
                        time.sleep(min(got.retry_in, 0.05))
                        continue
                    turns[n] = turns.get(n, 0) + 1
                    if ttl < 1:
                        continue  # dies: its stretch runs out
                    used = rng.choice([0, 1, 3])
                    ago = None if not used else max(hub.now() - got.hub_now - got.slots[0].start, 0)
                    mine.release([(got.slots[0].slot_id, ago)])
            except Exception as exc:  # noqa: BLE001 - the failure is what is checked
                errors.append(exc)

    threads = [threading.Thread(target=taker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert max(worst) <= bound, max(worst)
    assert len(turns) == 6, turns


def _states(store: HostBudgetStore, hub: Hub, key: str) -> list[tuple]:
    now = hub.now()
    return [(h, now) for h in store.hosts([key])]


def test_concurrent_takers_never_share_a_schedule(store, hub_url):  # noqa: F811
    """Eight threads, each with a connection of its own, take stretches of one host at
    once and give each back having sent its first request: every request sent is at
    least the interval from every other."""
    sent: list[float] = []
    lock = threading.Lock()

    def taker(n: int) -> None:
        with Hub.open(hub_url) as hub:
            mine = HostBudgetStore.open(hub)
            got = 0
            while got < 5:
                (answer,) = mine.take([HostAsk("z.test", 0.25, 64, count=3)], f"t/{n}", 30)
                if not answer.slots:
                    time.sleep(0.01)
                    continue
                got += 1
                (slot,) = answer.slots
                # Sent at its first time (waited for, if ahead): the next stretch goes an
                # interval after it.
                at = answer.hub_now + slot.start
                time.sleep(max(at - hub.now(), 0))
                with lock:
                    sent.append(at)
                mine.release([(slot.slot_id, hub.now() - at)])

    threads = [threading.Thread(target=taker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sent.sort()
    assert len(sent) == 8 * 5
    gaps = [b - a for a, b in zip(sent, sent[1:], strict=False)]
    assert min(gaps) >= 0.25 - 1e-6


def test_an_exchange_answers_as_a_release_then_a_take(store):
    """One call that gives slots back and asks for more: the stretch given back is free
    for the ask in the same call (its host's schedule resumes an interval after the
    request that went), a new host is made."""
    (a,) = store.take([HostAsk("x.test", 1.0, 1, count=3)], A, ttl=30)
    x, y = store.exchange(
        [(a.slots[0].slot_id, 0.0)], [HostAsk("x.test", 1.0, 1), HostAsk("y.test", 0, 2)], B, 30
    )
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


def test_a_stretch_grows_for_its_holder_while_nobody_waits(store):
    """A holder asking again for a host whose stretch it holds gets more send times on
    that stretch (reaching no further than its requests from now), until another
    process waits for the host: then the holder finishes and the other goes next."""
    (a,) = store.take([HostAsk("g.test", 1.0, 1, count=1)], A, ttl=30)
    (more,) = store.take([HostAsk("g.test", 1.0, 1, count=3)], A, ttl=30)
    assert more.slots[0].slot_id == a.slots[0].slot_id
    assert _r(more.slots[0].start + more.slots[0].count) == 3.0
    (b,) = store.take([HostAsk("g.test", 1.0, 1)], B, ttl=30)
    (refused,) = store.take([HostAsk("g.test", 1.0, 1, count=3)], A, ttl=30)
    assert (b.slots, refused.slots, refused.queued) == ((), (), True)


def test_slot_churn_on_postgresql_is_vacuumed_by_the_takers_one_at_a_time():
    """Every stretch is a slot row made and deleted: with autovacuum late or off (as on
    this project's test server) the dead rows pile up under every take, so the takers
    vacuum the host tables themselves, one process at a time."""
    url, drop = pg_schema_url()
    stats = (
        "SELECT vacuum_count + autovacuum_count, n_dead_tup FROM pg_stat_user_tables "
        "WHERE relid = 'hub_host_slots'::regclass"
    )

    def churn(store: HostBudgetStore, rounds: int) -> None:
        for _ in range(rounds):
            answers = store.take([HostAsk(f"h{n}.test", 1.0, 1) for n in range(20)], A, 30)
            store.release([(slot.slot_id, 0.0) for a in answers for slot in a.slots])

    try:
        with Hub.open(url) as hub, Hub.open(url) as other:
            store = HostBudgetStore.open(hub)
            store.VACUUM_SECONDS = 0.0
            store.VACUUM_CHECK_EVERY = 10**9  # first without
            churn(store, 50)
            hub.query("SELECT pg_stat_force_next_flush()")
            vacuums, dead = hub.query(stats)[0]
            assert dead >= 500, dead  # what takes wade through unvacuumed
            store.VACUUM_CHECK_EVERY = 20
            churn(store, 50)
            hub.query("SELECT pg_stat_force_next_flush()")
            assert hub.query(stats)[0][0] - vacuums >= 4, "a vacuum every 20 calls"
            # Never two at once, never more often than VACUUM_SECONDS.
            lock = int(AdvisoryLock.HOST_VACUUM)
            assert other.query("SELECT pg_try_advisory_lock(?)", (lock,))[0][0]
            assert not store.vacuum_if_due(), "another process is vacuuming"
            other.query("SELECT pg_advisory_unlock(?)", (lock,))
            assert store.vacuum_if_due()
            store.VACUUM_SECONDS = 3600.0
            assert not store.vacuum_if_due(), "vacuumed a moment ago"
    finally:
        drop()
