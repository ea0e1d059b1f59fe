"""LeasePool, the lease state machine, driven step by step: a manual clock, hub calls run
inline (or held until the test lets them finish), a real hub on SQLite and PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from crawler.hub import Holder, Hub, ProxyPool, RestPolicy
from crawler.hub.leases import (
    Attempt,
    LeaseConfig,
    LeaseEvents,
    LeasePool,
    LeaseView,
    PoolClosedError,
)
from tests.hubs import hub_url  # noqa: F401 - the backend-parametrised fixture

HOLDER = Holder("testhost", 1, "job_1")
NO_REST = RestPolicy(rest_seconds=0, ban_rest_seconds=0, jitter=0)


# --- the pool's surroundings, made by hand ------------------------------------------------
class ManualTimer:
    def __init__(self, when: float, seq: int, fn: Callable[[], Any]) -> None:
        self.when, self.seq, self.fn = when, seq, fn
        self.cancelled = self.called = False

    def active(self) -> bool:
        return not (self.cancelled or self.called)

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """Time moves only when the test says so; timers fire in order as it passes them."""

    def __init__(self, start: float = 1000.0) -> None:
        self.time = start
        self.timers: list[ManualTimer] = []

    def now(self) -> float:
        return self.time

    def call_later(self, delay: float, fn: Callable[[], Any]) -> ManualTimer:
        timer = ManualTimer(self.time + delay, len(self.timers), fn)
        self.timers.append(timer)
        return timer

    def advance(self, seconds: float) -> None:
        end = self.time + seconds
        while due := [t for t in self.timers if t.active() and t.when <= end]:
            timer = min(due, key=lambda t: (t.when, t.seq))
            self.time = max(self.time, timer.when)
            timer.called = True
            timer.fn()
        self.time = end


class InlineRunner:
    """Runs hub calls at once, or, while ``hold`` is set, when the test calls ``finish``."""

    def __init__(self) -> None:
        self.hold = False
        self.held: list[Callable[[], None]] = []

    def run(self, fn, done, failed) -> None:
        def call() -> None:
            try:
                result = fn()
            except Exception as error:
                failed(error)
            else:
                done(result)

        if self.hold:
            self.held.append(call)
        else:
            call()

    def finish(self) -> None:
        self.hold = False
        calls, self.held = self.held, []
        for call in calls:
            call()


class Recorder(LeaseEvents):
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def named(self, name: str) -> list[tuple[Any, ...]]:
        return [e[1:] for e in self.events if e[0] == name]

    def acquired(self, lease: LeaseView, held: int) -> None:
        self.events.append(("acquired", lease.proxy_id, held))

    def none_free(self) -> None:
        self.events.append(("none_free",))

    def acquire_failed(self, error: Exception) -> None:
        self.events.append(("acquire_failed", type(error).__name__))

    def released(self, lease: LeaseView, reason: str, ok: bool) -> None:
        self.events.append(("released", lease.proxy_id, reason, ok))

    def lost(self, lease: LeaseView) -> None:
        self.events.append(("lost", lease.proxy_id))

    def hub_failed(self, error: Exception, doing: str) -> None:
        self.events.append(("hub_failed", doing))

    def wait_started(self, waiting: int, shortage: bool) -> None:
        self.events.append(("wait_started", waiting, shortage))

    def wait_ended(self, seconds: float) -> None:
        self.events.append(("wait_ended", seconds))

    def heartbeat(self) -> None:
        self.events.append(("heartbeat",))


@dataclass
class Taken:
    """What one request got from ``take``: an attempt, an error, or (so far) nothing."""

    attempt: Attempt | None = None
    error: Exception | None = None
    waiting: Any = None

    @property
    def token(self) -> int:
        assert self.attempt is not None, "still waiting"
        return self.attempt.token

    @property
    def proxy_id(self) -> int | None:
        return self.attempt.lease.proxy_id if self.attempt else None


@dataclass
class Rig:
    pool: LeasePool
    proxies: ProxyPool
    clock: ManualClock = field(default_factory=ManualClock)
    runner: InlineRunner = field(default_factory=InlineRunner)
    events: Recorder = field(default_factory=Recorder)

    def take(self, avoid: tuple[int, ...] = ()) -> Taken:
        taken = Taken()
        taken.waiting = self.pool.take(
            set(avoid), self._setter(taken, "attempt"), self._setter(taken, "error")
        )
        return taken

    @staticmethod
    def _setter(taken: Taken, name: str) -> Callable[[Any], None]:
        return lambda value: setattr(taken, name, value)


def rig(
    hub: Hub, holder: Holder = HOLDER, backlog: Callable[[], int] = lambda: 0, **config: Any
) -> Rig:
    proxies = ProxyPool(hub)
    clock, runner, events = ManualClock(), InlineRunner(), Recorder()
    settings = {"lease_ttl": 60.0, "heartbeat": 20.0, "poll_seconds": 2.0, "rest": NO_REST}
    config = LeaseConfig(**{**settings, **config})
    pool = LeasePool(proxies, holder, config, clock, runner, events, backlog)
    pool.start()
    return Rig(pool, proxies, clock, runner, events)


@pytest.fixture
def hub(hub_url):  # noqa: F811
    with Hub.open(hub_url) as opened:
        yield opened


def add_proxies(hub: Hub, count: int) -> None:
    ProxyPool(hub).add([f"http://127.0.0.1:{port}" for port in range(1, count + 1)])


def rest_of(proxies: ProxyPool, proxy_id: int) -> float:
    row = next(p for p in proxies.proxies() if p.id == proxy_id)
    return row.resting_until - row.last_used


# --- rotation and rest -----------------------------------------------------------------------
def test_rotation_waits_for_inflight_then_takes_the_next_proxy(hub):
    add_proxies(hub, 2)
    r = rig(hub, rotate_every=3, leases_per_process=1)
    a, b, c = r.take(), r.take(), r.take()
    assert a.proxy_id == b.proxy_id == c.proxy_id == 1
    assert len({a.token, b.token, c.token}) == 3
    assert not c.attempt.lease.alive, "its third use rotates the lease"
    d = r.take()
    assert d.attempt is None and r.pool.waiting == 1
    assert r.events.named("wait_started") == [(1, False)], "waiting for a rotation, no shortage"
    r.pool.finish(a.token)
    r.pool.finish(b.token)
    assert d.attempt is None and r.events.named("released") == [], "c is still in flight"
    r.pool.finish(c.token, nbytes=10)
    assert r.events.named("released") == [(1, "rotated", True)]
    assert d.proxy_id == 2, "woken by the release, with no time passing"
    assert r.events.named("wait_ended") == [(0.0,)]
    first = r.proxies.usage()[0]
    assert (first.requests, first.bytes, first.end_reason) == (3, 10, "rotated")


def test_rest_between_stretches_is_jittered_within_bounds(hub):
    add_proxies(hub, 4)
    rest = RestPolicy(rest_seconds=100, jitter=0.25)
    r = rig(hub, rotate_every=1, leases_per_process=1, rest=rest)
    for proxy_id in (1, 2, 3, 4):
        taken = r.take()
        assert taken.proxy_id == proxy_id, "a rested proxy is not leased again"
        r.pool.finish(taken.token)
    rests = [rest_of(r.proxies, proxy_id) for proxy_id in (1, 2, 3, 4)]
    assert all(75 <= rest <= 125 for rest in rests), rests
    assert len({round(rest, 6) for rest in rests}) > 1, "jittered, not all equal"
    assert {p.state for p in r.proxies.proxies()} == {"resting"}
    waiting = r.take()
    assert waiting.attempt is None and r.events.named("wait_started") == [(1, True)]


def test_a_lease_that_ends_early_rests_its_proxy_for_the_share_it_used(hub):
    """A crawl (a queue batch) that ends after 3 of its lease's 10 requests rests the
    proxy 3/10 of the rest, at close as at a release: a full rest per short batch made
    a queue of small batches wait on its proxies most of the time."""
    add_proxies(hub, 2)
    rest = RestPolicy(rest_seconds=100, jitter=0)
    r = rig(hub, rotate_every=10, leases_per_process=1, rest=rest)
    for _ in range(10):
        r.pool.finish(r.take().token)
    assert round(rest_of(r.proxies, 1)) == 100, "a whole stretch rests the whole rest"
    for _ in range(3):
        taken = r.take()
        assert taken.proxy_id == 2
        r.pool.finish(taken.token)
    closed = []
    r.pool.close(lambda: closed.append(True))
    assert closed
    assert round(rest_of(r.proxies, 2)) == 30
    assert [row.requests for row in r.proxies.usage()] == [10, 3]


# --- bans --------------------------------------------------------------------------------------
def test_ban_rest_doubles_and_is_capped(hub):
    add_proxies(hub, 1)
    rest = RestPolicy(rest_seconds=0, ban_rest_seconds=10, ban_rest_max_seconds=35, jitter=0)
    r = rig(hub, rotate_every=100, leases_per_process=1, rest=rest)
    rests = []
    for _ in range(4):
        taken = r.take()
        finished = r.pool.finish(taken.token, banned=True)
        assert finished.newly_banned and not finished.lease.alive
        rests.append(round(rest_of(r.proxies, 1)))
        assert r.proxies.proxies()[0].state == "banned"
        r.proxies.end_rest()
    assert rests == [10, 20, 35, 35]
    assert r.proxies.proxies()[0].consecutive_bans == 4
    r.pool.finish(r.take().token)
    closed = []
    r.pool.close(lambda: closed.append(True))
    assert closed and r.proxies.proxies()[0].consecutive_bans == 0, "a clean stretch resets it"


def test_ban_ends_the_lease_and_the_retry_goes_elsewhere(hub):
    add_proxies(hub, 3)
    rest = RestPolicy(rest_seconds=0, ban_rest_seconds=600, jitter=0)
    r = rig(hub, rotate_every=100, leases_per_process=2, rest=rest)
    a = r.take()
    b = r.take()  # a's lease is busy: a second one is leased
    assert (a.proxy_id, b.proxy_id) == (1, 2)
    again = r.take()
    assert again.proxy_id == 1, "the least busy lease, the older of two as busy"
    first = r.pool.finish(a.token, failed=True, banned=True)
    second = r.pool.finish(again.token, banned=True)
    assert first.newly_banned and not second.newly_banned, "one lease, ended once"
    assert r.events.named("released") == [(1, "banned", True)]
    usage = r.proxies.usage()[0]
    assert (usage.requests, usage.failures, usage.bans) == (2, 1, 2)
    retry = r.take(avoid=(2,))
    assert retry.proxy_id == 3, "proxy 2 banned this request: another one is leased for it"
    r.pool.finish(b.token)
    again = r.take(avoid=(2,))
    assert again.proxy_id == 3, "avoided, though proxy 2 is now the least busy"
    fallback = r.take(avoid=(2, 3))
    assert fallback.proxy_id == 2, "with nothing else usable, avoiding is a preference"


# --- leases that run out --------------------------------------------------------------------
def test_dead_holders_lease_expires_and_is_taken_over(hub):
    add_proxies(hub, 1)
    stalled = rig(hub, Holder("node1", 11, "stalled"), lease_ttl=0.5, heartbeat=0.1)
    heir = rig(hub, Holder("node2", 22, "heir"), lease_ttl=60.0)
    held = stalled.take()
    assert held.proxy_id == 1
    waiting = heir.take()
    for _ in range(1200):  # until the hub's clock passes the stalled lease's TTL
        heir.clock.advance(2.0)
        if waiting.attempt is not None:
            break
        time.sleep(0.05)
    assert waiting.proxy_id == 1
    by_task = {row.task: row for row in heir.proxies.usage()}
    assert by_task["stalled"].end_reason == "expired"
    assert by_task["heir"].ended is None and by_task["heir"].started >= by_task["stalled"].ended

    stalled.clock.advance(0.1)  # its heartbeat: the renewal fails
    assert stalled.events.named("lost") == [(1,)]
    assert not held.attempt.lease.alive
    stalled.pool.finish(held.token)  # its last request ends: the lease is gone
    assert stalled.pool.leases == []
    assert heir.proxies.proxies()[0].holder.endswith("/heir"), "the heir keeps it"


def test_heartbeat_renews_leases_and_reports_usage(hub):
    add_proxies(hub, 1)
    r = rig(hub, lease_ttl=30.0, heartbeat=10.0, rotate_every=100, leases_per_process=1)
    first = r.take()
    r.pool.finish(first.token, nbytes=100)
    r.clock.advance(10.0)
    usage = r.proxies.usage()[0]
    assert (usage.requests, usage.bytes, usage.ended) == (1, 100, None), "reported, still held"
    assert r.events.named("heartbeat") == [()]
    r.clock.advance(90.0)  # three TTLs: renewed all along
    later = r.take()
    assert later.attempt.lease.lease_id == first.attempt.lease.lease_id
    assert len(r.events.named("acquired")) == 1
    r.pool.finish(later.token)

    # A renewal that does not come back in time: no request goes through the lease
    # until it does.
    r.runner.hold = True
    r.clock.advance(25.0)
    blocked = r.take()
    assert blocked.attempt is None
    r.runner.finish()
    r.clock.advance(2.0)  # the next poll
    assert blocked.attempt.lease.lease_id == first.attempt.lease.lease_id


def test_an_attempt_that_waited_past_its_leases_renewals_may_not_be_sent(hub):
    """An attempt kept elsewhere after take (at its host's gate) while renewals fail
    must not go out once its lease may have run out: sendable says so; a new take waits
    for a renewal that comes back. Nor once its lease is banned."""
    add_proxies(hub, 1)
    r = rig(hub, lease_ttl=8.0, heartbeat=2.0, rotate_every=100, leases_per_process=1)
    parked = r.take()
    assert r.pool.sendable(parked.token)
    r.runner.hold = True  # the hub stops answering: the next renewal hangs
    r.clock.advance(5.9)
    assert r.pool.sendable(parked.token), "still a quarter of its TTL ahead"
    r.clock.advance(0.2)
    assert not r.pool.sendable(parked.token)
    assert r.take().attempt is None, "and no other request is given it"
    r.runner.finish()
    r.clock.advance(2.0)
    assert r.pool.sendable(parked.token), "renewed"
    r.pool.finish(parked.token)
    assert not r.pool.sendable(parked.token), "a finished attempt is not sent"

    # Nor one whose lease another attempt found banned while it waited.
    waiting, banning = r.take(), r.take()
    r.pool.finish(banning.token, banned=True)
    assert not r.pool.sendable(waiting.token)


# --- waiting ---------------------------------------------------------------------------------
def test_waits_for_a_proxy_another_holder_releases(hub):
    add_proxies(hub, 1)
    other = ProxyPool(hub).acquire(Holder("elsewhere", 9), 60)
    r = rig(hub, poll_seconds=2.0)
    waiting = r.take()
    assert waiting.attempt is None
    assert r.events.named("none_free") == [()]
    assert r.events.named("wait_started") == [(1, True)]
    r.clock.advance(1.0)
    assert len(r.events.named("none_free")) == 1, "the hub is asked every poll_seconds"
    ProxyPool(hub).release(other, "released", policy=NO_REST)
    assert waiting.attempt is None, "nothing tells it: it learns at its next poll"
    r.clock.advance(1.0)
    assert waiting.proxy_id == 1
    assert r.events.named("wait_ended") == [(2.0,)] and r.pool.waiting == 0
    assert ProxyPool(hub).usage()[-1].waited == 2.0, "the hub learns how long it waited"


def test_a_wait_given_up_takes_nothing(hub):
    add_proxies(hub, 1)
    other = ProxyPool(hub).acquire(Holder("elsewhere", 9), 60)
    r = rig(hub)
    waiting = r.take()
    waiting.waiting.cancel()
    assert r.pool.waiting == 0 and len(r.events.named("wait_ended")) == 1
    ProxyPool(hub).release(other, "released", policy=NO_REST)
    r.clock.advance(10.0)
    assert waiting.attempt is None and r.pool.leases == []


def test_hub_failure_while_leasing_is_reported_and_retried(hub_url):  # noqa: F811
    hub = Hub.open(hub_url)
    add_proxies(hub, 1)
    r = rig(hub)
    hub.close()  # every call on it fails from now on
    waiting = r.take()
    assert waiting.attempt is None and waiting.error is None
    assert r.events.named("acquire_failed") and r.events.named("none_free") == [()]
    r.clock.advance(2.0)
    assert len(r.events.named("acquire_failed")) == 2, "asked again at the next poll"


# --- closing ---------------------------------------------------------------------------------
def test_close_fails_waiters_and_releases_after_calls_in_flight(hub):
    add_proxies(hub, 2)
    r = rig(hub, rotate_every=2, leases_per_process=1)
    a, b = r.take(), r.take()
    waiting = r.take()
    r.runner.hold = True
    r.pool.finish(a.token)
    r.pool.finish(b.token)  # the rotation (release and next lease) is now in flight
    closed = []
    r.pool.close(lambda: closed.append(True))
    assert isinstance(waiting.error, PoolClosedError) and r.pool.waiting == 0
    assert not closed, "the rotation in flight comes first"
    r.runner.finish()
    assert closed and r.pool.leases == []
    # The lease the rotation took for the request that was waiting is released at close.
    usage = r.proxies.usage()
    assert [row.end_reason for row in usage] == ["rotated", "released"]
    assert all(row.ended is not None for row in usage)
    late = r.take()
    assert isinstance(late.error, PoolClosedError)


def test_close_releases_what_is_held(hub):
    add_proxies(hub, 2)
    r = rig(hub, rotate_every=100, leases_per_process=2)
    a = r.take()
    b = r.take()
    r.pool.finish(a.token, nbytes=5)
    r.pool.finish(b.token, nbytes=7)
    closed = []
    r.pool.close(lambda: closed.append(True))
    assert closed
    assert sorted(r.events.named("released")) == [(1, "released", True), (2, "released", True)]
    rows = r.proxies.usage()
    assert [(row.requests, row.bytes, row.end_reason) for row in rows] == [
        (1, 5, "released"),
        (1, 7, "released"),
    ]
    assert {p.state for p in r.proxies.proxies()} == {"free"}, "no rest asked for"


def test_a_dropped_attempt_is_not_counted(hub):
    add_proxies(hub, 1)
    r = rig(hub, rotate_every=1, leases_per_process=1)
    taken = r.take()
    assert r.pool.lease_of(taken.token) is not None
    assert r.pool.drop(taken.token) and not r.pool.drop(taken.token)
    assert r.pool.lease_of(taken.token) is None
    assert r.events.named("released") == [(1, "rotated", True)], "its lease still rotates"
    assert r.proxies.usage()[0].requests == 0


# --- the line of waiters ---------------------------------------------------------------------
def test_a_freed_proxy_goes_to_the_waiting_crawl_with_the_most_work_left(hub):
    """Two processes wait for the only proxy: when it comes free, the one whose crawl has
    more left takes it, even when the other asks first (queue mode: the batch of the
    busiest host must not lose its proxy to every small batch that starts)."""
    add_proxies(hub, 1)
    other = ProxyPool(hub).acquire(Holder("elsewhere", 9, ""), 60)
    big = rig(hub, Holder("node", 1, ""), backlog=lambda: 300)
    small = rig(hub, Holder("node", 2, ""), backlog=lambda: 12)
    waiting_big, waiting_small = big.take(), small.take()
    assert waiting_big.attempt is None and waiting_small.attempt is None
    assert ProxyPool(hub).release(other, "released")
    small.clock.advance(2)
    assert waiting_small.attempt is None, "the bigger crawl waits for it"
    big.clock.advance(2)
    assert waiting_big.proxy_id == 1
    assert hub.query("SELECT holder FROM hub_proxy_waiters WHERE expires >= NOW()") == [
        (str(Holder("node", 2, "")),)
    ], "the taker left the line; the other keeps its place"


def test_a_pool_that_closes_while_it_waits_leaves_the_line(hub):
    """Ctrl-C while waiting for a proxy: the place goes with the crawl, so that it holds
    back no one (its rerun first) until it lapses."""
    add_proxies(hub, 1)
    other = ProxyPool(hub).acquire(Holder("elsewhere", 9, ""), 60)
    stopped = rig(hub, Holder("node", 1, ""), backlog=lambda: 300)
    assert stopped.take().attempt is None
    assert hub.query("SELECT COUNT(*) FROM hub_proxy_waiters")[0][0] == 1
    closed: list[bool] = []
    stopped.pool.close(lambda: closed.append(True))
    assert closed == [True]
    assert hub.query("SELECT COUNT(*) FROM hub_proxy_waiters")[0][0] == 0
    assert ProxyPool(hub).release(other, "released")
    rerun = rig(hub, Holder("node", 2, ""), backlog=lambda: 10)
    assert rerun.take().proxy_id == 1
