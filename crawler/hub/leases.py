"""The proxy leases of one crawl process: which proxies it holds and which request goes
through which; rotation, bans, heartbeats, and waiting for a free proxy.

A :class:`LeasePool` holds up to ``leases_per_process`` leases from the hub's
:class:`~crawler.hub.proxies.ProxyPool` and hands requests an :class:`Attempt` on one
of them (:meth:`LeasePool.take`), the least busy, avoiding proxies that banned the
request. A lease stops taking requests after ``rotate_every`` of them, or at once when
one of them finds the proxy banned, and is released (the proxy then rests in the hub:
a lease released before its ``rotate_every`` requests, as its crawl ends, for their
share of the rest) once every request it took has finished (:meth:`LeasePool.finish`); when requests are
waiting then, the release and the next lease are one hub call (a rotation). A heartbeat
renews held leases and reports their usage; a lease the hub gave to someone else meanwhile
(it expired) is lost and used no more. With no lease usable and none to be had, a
request waits, and the hub is asked again every ``poll_seconds``, keeping the process's
place in the hub's line of waiters (:class:`~crawler.hub.lease_store.Place`: the crawl
with the most work left first, by its *backlog*, and no one waiting long).

No Scrapy and no event loop in here, so that the state machine can be driven step by
step: time and timers come from an injected :class:`Clock`, and every blocking hub call
goes through an injected :class:`Runner`, which runs it off the caller's thread and
calls back on it (``middlewares/proxy_lease.py`` passes the reactor and a thread; tests
a manual clock and inline calls). The pool reports what happens to :class:`LeaseEvents`
(stats, logs) and calls back ``ready`` / ``failed``, never blocking.

Longer than most modules here: the state machine is one piece, read as one, and a third
of it is the interfaces it is driven through (clock, runner, events, views).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from crawler.hub.identity import Holder
from crawler.hub.lease_store import Lease, Place, RestPolicy, UsageCounts
from crawler.hub.proxies import ProxyPool
from crawler.redact import url_credentials

T = TypeVar("T")


class Timer(Protocol):
    def cancel(self) -> None: ...

    def active(self) -> bool: ...


class Clock(Protocol):
    """Monotonic time in seconds, and timers on the caller's thread."""

    def now(self) -> float: ...

    def call_later(self, delay: float, fn: Callable[[], Any]) -> Timer: ...


class Runner(Protocol):
    """Runs a blocking call away from the caller's thread, then calls *done* with its
    result or *failed* with its exception, back on the caller's thread."""

    def run(
        self, fn: Callable[[], T], done: Callable[[T], None], failed: Callable[[Exception], None]
    ) -> None: ...


class PoolClosedError(Exception):
    """The lease pool is closed: no more leases."""


class LeaseEvents:
    """What a lease pool tells its owner; every method does nothing here."""

    def acquired(self, lease: LeaseView, held: int) -> None:
        """A lease was taken; *held*: how many this process holds now."""

    def none_free(self) -> None:
        """The hub had no proxy to lease (or failed): asked again in poll_seconds."""

    def acquire_failed(self, error: Exception) -> None:
        """Asking the hub for a lease failed."""

    def released(self, lease: LeaseView, reason: str, ok: bool) -> None:
        """A lease was released (*ok*: False when it had expired and been taken over)."""

    def lost(self, lease: LeaseView) -> None:
        """A heartbeat found the lease taken over: no request goes through it any more."""

    def hub_failed(self, error: Exception, doing: str) -> None:
        """A hub call other than leasing failed while *doing* something."""

    def wait_started(self, waiting: int, shortage: bool) -> None:
        """A request waits (*shortage*: the hub has no proxy free, rather than a lease of
        this process finishing its requests before it rotates)."""

    def wait_ended(self, seconds: float) -> None:
        """A request stopped waiting after *seconds*."""

    def heartbeat(self) -> None:
        """A heartbeat renewed the leases held."""

    def heartbeat_stopped(self, error: Exception) -> None:
        """The heartbeat failed in a way it cannot go on from."""


@dataclass(frozen=True)
class LeaseConfig:
    """How a process leases: the PROXY_* settings the state machine needs."""

    lease_ttl: float = 60.0
    heartbeat: float = 20.0
    rotate_every: int = 50
    leases_per_process: int = 2
    poll_seconds: float = 2.0
    rest: RestPolicy = field(default_factory=RestPolicy)

    def place(self, work: int, holding: int) -> Place:
        """A process's place in the hub's line, with *work* left and *holding* leases
        kept: a further lease yields to every process waiting for its first. The place
        outlasts a few polls."""
        return Place(work, further=holding > 0, ttl=3 * self.poll_seconds + 5)


@dataclass(eq=False)
class _Held:
    """A lease this process holds, with what it sent through it."""

    lease: Lease
    deadline: float  # the clock's time the lease runs out unless renewed
    assigned: int = 0
    inflight: int = 0
    draining: str | None = None  # end reason, once no new request may use it
    lost: bool = False
    releasing: bool = False
    counts: UsageCounts = field(default_factory=UsageCounts)

    @property
    def alive(self) -> bool:
        return not (self.draining or self.lost or self.releasing)


class LeaseView:
    """A lease this process holds, read-only: what requests and browsers need of it."""

    __slots__ = ("_held",)

    def __init__(self, held: _Held) -> None:
        self._held = held

    @property
    def lease_id(self) -> int:
        return self._held.lease.lease_id

    @property
    def proxy_id(self) -> int:
        return self._held.lease.proxy_id

    @property
    def proxy_url(self) -> str:
        """The proxy's URL with its credentials: for the downloader only, never logs."""
        return self._held.lease.url

    @property
    def label(self) -> str:
        """The proxy's URL as logs and the action log show it (password as ``***``)."""
        return self._held.lease.label

    @property
    def credentials(self) -> tuple[str, str] | None:
        """(user, password) for the proxy, or None."""
        return url_credentials(self._held.lease.url)

    @property
    def slot(self) -> str:
        """The download slot of requests through this proxy: one per proxy."""
        return f"proxy-{self._held.lease.proxy_id}"

    @property
    def uses(self) -> int:
        """Requests sent through the lease so far."""
        return self._held.assigned

    @property
    def alive(self) -> bool:
        """Still taking requests: not rotated, banned, lost or released."""
        return self._held.alive

    def __repr__(self) -> str:
        return f"<LeaseView {self.lease_id} proxy #{self.proxy_id} {self.label}>"


@dataclass(frozen=True)
class Attempt:
    """One request's use of a lease, until :meth:`LeasePool.finish`."""

    token: int
    lease: LeaseView


@dataclass(frozen=True)
class Finished:
    """What :meth:`LeasePool.finish` did: the lease, and whether this ban ended it."""

    lease: LeaseView
    newly_banned: bool


@dataclass(eq=False)
class _Waiter:
    avoid: Collection[int]
    ready: Callable[[Attempt], None]
    failed: Callable[[Exception], None]
    since: float | None = None
    timer: Timer | None = None
    settled: bool = False


class Waiting:
    """A request's place in :meth:`LeasePool.take`; cancel it to give it up."""

    def __init__(self, cancel: Callable[[], None]) -> None:
        self._cancel = cancel

    def cancel(self) -> None:
        self._cancel()


class LeasePool:
    """The proxy leases of one process (see the module's docstring)."""

    def __init__(
        self,
        proxies: ProxyPool,
        holder: Holder,
        config: LeaseConfig,
        clock: Clock,
        runner: Runner,
        events: LeaseEvents | None = None,
        backlog: Callable[[], int] = lambda: 0,
    ) -> None:
        """*backlog*: the requests the crawl has left, its claim in the hub's line of
        processes waiting for a proxy (by default none: a process's claim is its wait)."""
        self.proxies = proxies
        self.holder = holder
        self.config = config
        self.clock = clock
        self.runner = runner
        self.events = events or LeaseEvents()
        self.backlog = backlog
        self._in_line = False  # whether this process may hold a place in the hub's line
        self._leases: dict[int, _Held] = {}
        self._attempts: dict[int, _Held] = {}
        self._tokens = itertools.count(1)
        self._waiters: list[_Waiter] = []
        self._acquiring = False
        self._next_acquire = 0.0
        self._waiting = 0
        self._calls = 0  # hub calls in flight
        self.upkeep = LeaseUpkeep(self)
        self._closed = False
        self._stopping = False
        self._on_closed: Callable[[], None] | None = None

    # --- what the owner reads ---------------------------------------------------------
    @property
    def leases(self) -> list[LeaseView]:
        """The leases held now, oldest first."""
        return [LeaseView(held) for held in self._leases.values()]

    @property
    def waiting(self) -> int:
        """Requests waiting for a lease."""
        return self._waiting

    @property
    def longest_wait(self) -> float:
        """Seconds the request waiting longest has waited (0: none waits)."""
        since = [w.since for w in self._waiters if w.since is not None]
        return self.clock.now() - min(since) if since else 0.0

    def lease_of(self, token: int) -> LeaseView | None:
        """The lease of an attempt not yet finished, or None."""
        held = self._attempts.get(token)
        return LeaseView(held) if held is not None else None

    # --- requests -------------------------------------------------------------------------
    def start(self) -> None:
        """Start the heartbeat."""
        if not self._closed:
            self.upkeep.start()

    def take(
        self,
        avoid: Collection[int],
        ready: Callable[[Attempt], None],
        failed: Callable[[Exception], None],
    ) -> Waiting:
        """Give a request an attempt on a lease, avoiding the proxy ids in *avoid* when
        another is usable: *ready* is called with it, at once or once one is free;
        *failed* with :class:`PoolClosedError` when the pool closes first."""
        waiter = _Waiter(avoid, ready, failed)
        self._serve(waiter)
        return Waiting(lambda: self._give_up(waiter))

    def finish(
        self, token: int, *, nbytes: int = 0, failed: bool = False, banned: bool = False
    ) -> Finished | None:
        """End an attempt (once) and count it: *nbytes* received, or *failed*; *banned*
        ends the lease (the proxy then rests longer). None if the token is not live."""
        held = self._attempts.pop(token, None)
        if held is None:
            return None
        held.inflight -= 1
        held.counts.requests += 1
        held.counts.bytes += nbytes
        held.counts.failures += int(failed)
        newly_banned = False
        if banned:
            held.counts.bans += 1
            newly_banned = held.draining != "banned"
            held.draining = "banned"
        self._maybe_release(held)
        return Finished(LeaseView(held), newly_banned)

    def sendable(self, token: int) -> bool:
        """Whether an attempt may still be sent on its lease: it is neither lost, banned
        nor being released, and lasts as :meth:`take` promised. A request that waited
        after it was given its lease (for its host's slot) can outlive that promise
        while the hub is away and renewals fail."""
        held = self._attempts.get(token)
        if held is None or held.lost or held.releasing or held.draining == "banned":
            return False
        return self._lasts(held, self.clock.now())

    def drop(self, token: int) -> bool:
        """End an attempt (once) without counting it: its outcome never came back (a
        retried copy of its request arrived first)."""
        held = self._attempts.pop(token, None)
        if held is None:
            return False
        held.inflight -= 1
        self._maybe_release(held)
        return True

    def stop_waiting(self) -> None:
        """The crawl is closing: requests waiting for a lease fail at once with
        :class:`PoolClosedError` (they were never sent), and so does any that asks from
        now on; the leases held stay until :meth:`close`."""
        self._stopping = True
        self._wake()

    def close(self, done: Callable[[], None]) -> None:
        """Stop the heartbeat, fail the waiting requests, and once the hub calls in flight
        are over, release every lease held; then call *done* (once: a second close does
        nothing)."""
        if self._closed:
            return
        self._closed = True
        self._on_closed = done
        self.upkeep.stop()
        self._wake()
        self.upkeep.close_when_idle()

    # --- choosing and waiting ----------------------------------------------------------------
    def _serve(self, w: _Waiter, acquire: bool = True) -> None:
        if w.settled:
            return
        if self._closed or self._stopping:
            self._settle(w)
            w.failed(PoolClosedError("the lease pool is closed"))
            return
        held = self._choose(w.avoid)
        wants_more = held is None or held.inflight > 0
        if acquire and wants_more and self._may_acquire():
            self._acquire(lambda got: self._serve(w, acquire=got), w.since)
            return
        if held is not None:
            self._assign(w, held)
            return
        self._wait(w)

    def _lasts(self, held: _Held, now: float) -> bool:
        """Whether *held* is known to live long enough for a request given it now to be
        sent and answered: a quarter of the TTL before its deadline."""
        return now < held.deadline - self.config.lease_ttl / 4

    def _choose(self, avoid: Collection[int]) -> _Held | None:
        now = self.clock.now()
        usable = [h for h in self._leases.values() if h.alive and self._lasts(h, now)]
        preferred = [h for h in usable if h.lease.proxy_id not in avoid] or usable
        if not preferred:
            return None
        return min(preferred, key=lambda h: (h.inflight, h.lease.lease_id))

    def _may_acquire(self) -> bool:
        return (
            not self._acquiring
            and len(self._leases) < self.config.leases_per_process
            and self.clock.now() >= self._next_acquire
        )

    def _assign(self, w: _Waiter, held: _Held) -> None:
        self._settle(w)
        token = next(self._tokens)
        self._attempts[token] = held
        held.assigned += 1
        held.inflight += 1
        if held.assigned >= self.config.rotate_every and held.draining is None:
            held.draining = "rotated"
        w.ready(Attempt(token, LeaseView(held)))

    def _wait(self, w: _Waiter) -> None:
        if w.since is None:
            w.since = self.clock.now()
            self._waiting += 1
            self.events.wait_started(self._waiting, shortage=w.since < self._next_acquire)
        self._waiters.append(w)
        w.timer = self.clock.call_later(self.config.poll_seconds, lambda: self._poll(w))

    def _poll(self, w: _Waiter) -> None:
        if w in self._waiters:
            self._waiters.remove(w)
        self._serve(w)

    def _wake(self) -> None:
        """Let every waiting request look again (a lease came, went, or the pool closed)."""
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if w.timer is not None and w.timer.active():
                w.timer.cancel()
            self._serve(w)

    def _settle(self, w: _Waiter) -> None:
        w.settled = True
        if w.timer is not None and w.timer.active():
            w.timer.cancel()
        if w.since is not None:
            self._waiting -= 1
            self.events.wait_ended(self.clock.now() - w.since)

    def _give_up(self, w: _Waiter) -> None:
        if w.settled:
            return
        if w in self._waiters:
            self._waiters.remove(w)
        self._settle(w)

    # --- hub calls ---------------------------------------------------------------------------
    def _call(
        self, fn: Callable[[], T], done: Callable[[T], None], failed: Callable[[Exception], None]
    ) -> None:
        self._calls += 1

        def _done(result: T) -> None:
            self._calls -= 1
            done(result)
            self.upkeep.close_when_idle()

        def _failed(error: Exception) -> None:
            self._calls -= 1
            failed(error)
            self.upkeep.close_when_idle()

        self.runner.run(fn, _done, _failed)

    def _acquire(self, then: Callable[[bool], None], since: float | None = None) -> None:
        """Lease one more proxy; *then* learns whether one came (no: poll later).
        *since*: when the request asking for it started waiting, if it waits."""
        self._acquiring = True
        started = self.clock.now()
        place = self.config.place(self.backlog(), holding=len(self._leases))

        def done(lease: Lease | None) -> None:
            self._acquiring = False
            self._in_line = lease is None and not place.further
            if lease is None:
                self._next_acquire = self.clock.now() + self.config.poll_seconds
                self.events.none_free()
                self._wake()
                then(False)
                return
            held = _Held(lease, deadline=started + self.config.lease_ttl)
            self._leases[lease.lease_id] = held
            self.events.acquired(LeaseView(held), len(self._leases))
            then(True)  # the request that asked for it first, then the others
            self._wake()

        def failed(error: Exception) -> None:
            self.events.acquire_failed(error)
            done(None)

        holder, ttl = self.holder, self.config.lease_ttl
        waits = [w.since for w in self._waiters if w.since is not None]
        waits += [since] if since is not None else []
        waited = started - min(waits) if waits else 0.0
        self._call(lambda: self.proxies.acquire(holder, ttl, waited, place), done, failed)

    def _maybe_release(self, held: _Held) -> None:
        if held.inflight > 0 or held.releasing:
            return
        if held.lost:
            self._leases.pop(held.lease.lease_id, None)
            self._wake()
            return
        if not held.draining or self._closed:
            return
        held.releasing = True
        reason, counts, policy = held.draining, held.counts.take(), self._rest(held)
        # The lease released frees its place for the next one.
        if self._waiters and not self._acquiring and self.clock.now() >= self._next_acquire:
            self._rotate(held, reason, counts)
            return

        def done(ok: bool) -> None:
            self.events.released(LeaseView(held), reason, ok)
            self._forget(held)

        def failed(error: Exception) -> None:
            self.events.hub_failed(error, f"releasing proxy #{held.lease.proxy_id}")
            self._forget(held)

        self._call(lambda: self.proxies.release(held.lease, reason, counts, policy), done, failed)

    def _rotate(self, held: _Held, reason: str, counts: UsageCounts) -> None:
        """Release *held* and lease the next proxy in one hub call: requests are waiting,
        and one round trip instead of two is what lets a hub serve many processes."""
        self._acquiring = True
        started = self.clock.now()
        waits = [w.since for w in self._waiters if w.since is not None]
        waited = started - min(waits) if waits else 0.0
        holder, config, policy = self.holder, self.config, self._rest(held)
        place = self.config.place(self.backlog(), holding=len(self._leases) - 1)

        def done(result: tuple[bool, Lease | None]) -> None:
            released, lease = result
            self._acquiring = False
            self._in_line = lease is None and not place.further
            self.events.released(LeaseView(held), reason, released)
            self._leases.pop(held.lease.lease_id, None)
            if lease is None:
                self._next_acquire = self.clock.now() + config.poll_seconds
                self.events.none_free()
            else:
                new = _Held(lease, deadline=started + config.lease_ttl)
                self._leases[lease.lease_id] = new
                self.events.acquired(LeaseView(new), len(self._leases))
            self._wake()

        def failed(error: Exception) -> None:
            # Whatever the hub did of it, the old lease is used no more and a new one, if
            # taken, is never used: both expire in the hub.
            self._acquiring = False
            self._next_acquire = self.clock.now() + config.poll_seconds
            self.events.hub_failed(error, f"rotating proxy #{held.lease.proxy_id}")
            self._forget(held)

        def rotate() -> tuple[bool, Lease | None]:
            return self.proxies.rotate(
                held.lease, reason, counts, policy, holder, config.lease_ttl, waited, place
            )

        self._call(rotate, done, failed)

    def _rest(self, held: _Held) -> RestPolicy:
        """The rest policy of *held*'s release: a lease that ends before its
        ``rotate_every`` requests rests its proxy for their share of the rest."""
        return self.config.rest.for_share(held.assigned, self.config.rotate_every)

    def _forget(self, held: _Held) -> None:
        self._leases.pop(held.lease.lease_id, None)
        self._wake()


class LeaseUpkeep:
    """What keeps a pool's leases in the hub: the heartbeat that renews them and reports
    their usage, and the release of all of them once the pool closes."""

    def __init__(self, pool: LeasePool) -> None:
        self.pool = pool
        self._beat_timer: Timer | None = None
        self._beating = False

    def start(self) -> None:
        if self._beat_timer is None:
            self._beat_timer = self.pool.clock.call_later(self.pool.config.heartbeat, self._beat)

    def stop(self) -> None:
        if self._beat_timer is not None and self._beat_timer.active():
            self._beat_timer.cancel()

    def _beat(self) -> None:
        self._beat_timer = None
        if self.pool._closed:
            return
        try:
            self._renew_leases()
        except Exception as error:
            self.pool.events.heartbeat_stopped(error)
            return
        self._beat_timer = self.pool.clock.call_later(self.pool.config.heartbeat, self._beat)

    def _renew_leases(self) -> None:
        if self._beating:
            return
        batch = [
            (h, h.counts.take()) for h in self.pool._leases.values() if not (h.releasing or h.lost)
        ]
        if not batch:
            return
        self._beating = True
        started, ttl = self.pool.clock.now(), self.pool.config.lease_ttl
        items = [(h.lease, counts) for h, counts in batch]

        def done(results: list[bool]) -> None:
            self._beating = False
            self.pool.events.heartbeat()
            for (held, _), ok in zip(batch, results, strict=True):
                if ok:
                    held.deadline = started + ttl
                    continue
                held.lost = True
                self.pool.events.lost(LeaseView(held))
                self.pool._maybe_release(held)

        def failed(error: Exception) -> None:
            self._beating = False
            for held, counts in batch:
                held.counts.add(counts)
            self.pool.events.hub_failed(error, "renewing proxy leases")

        self.pool._call(lambda: self.pool.proxies.renew_many(items, ttl), done, failed)

    def close_when_idle(self) -> None:
        """Once the pool is closed and no hub call is out, release every lease held."""
        if not self.pool._closed or self.pool._calls or self.pool._on_closed is None:
            return
        done, self.pool._on_closed = self.pool._on_closed, None
        ends = [
            (held, held.draining or "released", held.counts.take())
            for held in self.pool._leases.values()
            if not (held.releasing or held.lost)
        ]
        # A process that stops while it waits leaves the line at once: its place would
        # hold back others, its own rerun included, until it lapsed.
        leaving = self.pool.holder if self.pool._in_line else None
        if not ends and leaving is None:
            done()
            return
        for held, _, _ in ends:
            held.releasing = True
        batch = [
            (held.lease, reason, counts, self.pool._rest(held)) for held, reason, counts in ends
        ]

        def end_all() -> list[bool]:
            if leaving is not None:
                self.pool.proxies.leave_line(leaving)
            return self.pool.proxies.release_many(batch)

        def released(results: list[bool]) -> None:
            for (held, reason, _), ok in zip(ends, results, strict=True):
                self.pool._leases.pop(held.lease.lease_id, None)
                self.pool.events.released(LeaseView(held), reason, ok)
            done()

        def failed(error: Exception) -> None:
            self.pool.events.hub_failed(error, "releasing proxy leases at close")
            done()

        self.pool.runner.run(end_all, released, failed)
