"""One process's side of the host budgets: requests wait at their host's gate until a
slot of the hub's (``crawler.hub.hostbudget``) lets them go.

A gate per budget key holds the slots this process took and the requests waiting. A key
with an interval goes through its one *stretch* of send times: a request goes at the
next of them, an interval after the key's last request reached the wire, while fewer
than the key's concurrency are in flight. A key without interval goes through *units*,
one request at a time each, keeping no more of them than its share of the key. No
request goes while the key is backed off (:class:`crawler.politeness.HostBackoffs`).

Asks for slots of many keys go to the hub in one call, with the releases gathered
meanwhile, and renewals in one call too; one call at a time, in the runner's thread, so
that the hub sees them in the order they were made (a back-off is written before the
slot that met it is released). A slot is used only while this process knows it alive:
until its TTL from the last renewal that succeeded, counted from when that renewal was
sent, and a stretch no later than its end. A hub that cannot be reached so lets every
slot run out here before any other process could be given it.

Requests waiting here are *parked*: the downloader (``crawler/downloader.py``) does not
count them against ``CONCURRENT_REQUESTS``, so that other hosts' requests are fetched
while one host's slot is asked for. A parked request goes only while fewer than
``max_in_flight`` (the crawl's ``CONCURRENT_REQUESTS``) that went through the gates are
unfinished.

Waits are told in episodes: one from the moment a key has a request that cannot go at
once until the key has no request waiting, with every reason that held requests back,
when something beyond the process's own pace held it: a back-off, a Crawl-delay, other
processes holding or waiting for the host, or the hub's answer for a second or more.

No Scrapy here: the middleware (``middlewares/host_budget.py``) gives it a clock and a
runner, and tests give it their own.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from crawler.hub.hostbudget import (
    HostAnswer,
    HostAsk,
    HostBudgetStore,
    HostSlot,
    Renewal,
    stretch_length,
)
from crawler.hub.hostcalls import HostCalls
from crawler.hub.leases import Clock, Runner, Timer
from crawler.politeness import HostBackoffs

logger = logging.getLogger(__name__)

# A slot is not used in the last moments it is known to have: a request sent then could
# still be on its way when another process is given the slot.
EXPIRY_MARGIN = 0.1
# A stretch taken at an interval this much longer than its host's now is given back.
SLOWER = 1.25
# Asking again for a slot within this many seconds of an answer that gave none.
MIN_RETRY = 0.05
ASKING = "asking the hub"
# A wait only for the hub's answer is told when it lasts this long: every host's first
# request waits for one, and a line per host would drown the ones that matter.
ASKING_WAIT_TOLD = 1.0


@dataclass
class GateConfig:
    ttl: float = 30.0
    slot_seconds: float = 10.0  # a stretch holds this long of a host's schedule at most
    poll_seconds: float = 1.0  # at most this long between asks while requests wait
    # A slot with no request waiting is kept this long for the next one: a host's
    # requests that come one after another then take one slot, not one each.
    linger_seconds: float = 0.5
    # Asks and releases wait this long for others to go in the same call, unless
    # ``batch_max`` asks wait: fewer calls, each of more hosts.
    batch_seconds: float = 0.1
    batch_max: int = 16

    @property
    def heartbeat(self) -> float:
        return self.ttl / 3


@dataclass
class WaitEpisode:
    """Requests of one key that could not go at once, from the first until none waits."""

    key: str
    url: str
    reason: str
    started: float
    requests: int = 1
    seconds: float = 0.0
    told: bool = False  # something beyond the process's own pace held it

    def saw(self, reason: str, told: bool) -> None:
        """Another reason held requests back in this episode: all are told, in order."""
        self.told = self.told or told
        if reason != ASKING and reason not in self.reason.split("; "):
            self.reason = reason if self.reason == ASKING else f"{self.reason}; {reason}"


class GateEvents:
    """What the gates tell their owner; every method does nothing here."""

    def wait_ended(self, episode: WaitEpisode) -> None:
        """A wait episode is over (or the gates close with it open)."""

    def hub_failed(self, error: Exception, doing: str) -> None:
        """A hub call failed; slots run out here, asks are made again."""

    def slot_lost(self, key: str) -> None:
        """A slot was found run out at renewal (taken over after its TTL)."""


@dataclass(eq=False)
class _Slot:
    slot: HostSlot
    start: float  # local clock of its first send time
    expires: float  # local clock; only ever moved by a renewal that succeeded
    until: float | None  # a stretch: local clock its requests go before, renewed or not
    used: int = 0
    busy: int = 0  # requests in flight through it
    idle_since: float = 0.0
    last_sent: float | None = None  # its last request on the wire, local clock
    retired: bool = False  # given up (a back-off, over its share): goes back once idle

    @property
    def stretch(self) -> bool:
        return self.slot.interval > 0

    def alive_at(self, t: float) -> bool:
        """Whether a request may go through it at *t*: before its expiry (with a margin:
        another process may be given it then) and, a stretch, before its end (which the
        hub counts as its last send time)."""
        return t < self.expires - EXPIRY_MARGIN and (self.until is None or t < self.until)

    def release_item(self, now: float) -> tuple[int, float | None]:
        """What the hub is told when it goes: its id, seconds since its last request."""
        ago = None if self.last_sent is None else max(now - self.last_sent, 0.0)
        return self.slot.slot_id, ago


@dataclass(eq=False)
class _Gate:
    key: str
    interval: float
    concurrency: int
    waiters: deque = field(default_factory=deque)  # (url, go callback)
    slots: list[_Slot] = field(default_factory=list)
    asking: bool = False
    retry_at: float = 0.0
    timer: Timer | None = None
    timer_at: float = 0.0  # when ``timer`` fires, local clock
    episode: WaitEpisode | None = None
    why: str = ""
    share: int = 0  # units this process may keep (0: not told yet)
    queued: bool = False  # other processes are before this one in the key's line
    in_flight: int = 0
    unsent: int = 0  # let through, not yet on the wire
    next_wire: float = 0.0  # the next request goes on the wire no earlier

    def holding_back(self, now: float, backoffs: HostBackoffs) -> tuple[str, bool]:
        """What holds this gate's requests back, and whether it is beyond the process's
        own pace (see the module's docstring)."""
        if backoffs.until(self.key, now) > now:
            return f"back-off ({backoffs.reason(self.key)})", True
        if self.slots:
            if self.interval > 0 and self.in_flight < self.concurrency:
                return self.why, self.why.startswith("Crawl-delay")
            return f"concurrency {self.concurrency}", False
        if self.queued:
            return "other processes' turn at the host", True
        if self.retry_at > now:
            return "concurrency held by other processes", True
        return ASKING, False


class HostGates:
    def __init__(
        self,
        store: HostBudgetStore,
        holder: str,
        config: GateConfig,
        clock: Clock,
        runner: Runner,
        events: GateEvents | None = None,
        backoffs: HostBackoffs | None = None,
        gap: Callable[[float], float] | None = None,
    ) -> None:
        self.store = store
        self.holder = holder
        self.config = config
        self.clock = clock
        self.runner = runner
        self.events = events or GateEvents()
        self.backoffs = backoffs or HostBackoffs()
        # The wait after a request of a key with an interval (jitter lengthens it).
        self.gap = gap or (lambda interval: interval)
        self._gates: dict[str, _Gate] = {}
        self.hub = GateHub(self)
        self.calls = HostCalls(
            store,
            holder,
            config.ttl,
            clock,
            runner,
            self.hub,
            config.batch_seconds,
            config.batch_max,
        )
        self.closed = False
        self.stopping = False  # the crawl is closing: no request waits for a slot
        # Requests waiting at a gate; those let through and not finished, at most
        # max_in_flight (0: no limit); the gates that could let one go but for that.
        self.parked = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self._blocked: dict[str, None] = {}
        # Places among max_in_flight left empty while requests waited here, in
        # place-seconds: what the gates cost the crawl's fetching, beside the CPU.
        self.idle_seconds = 0.0
        self._counted_at: float | None = None

    # --- requests -------------------------------------------------------------------
    def wait(
        self,
        key: str,
        url: str,
        interval: float,
        concurrency: int,
        go: Callable[[_Slot | None], None],
        why: str = "",
    ) -> None:
        """Call *go* with the slot a request of *key* is to go through, once it may (with
        None once the gates stop); *why*: where *interval* comes from, for episodes."""
        if self.stopping:
            go(None)
            return
        gate = self._gates.get(key)
        if gate is None:
            gate = self._gates[key] = _Gate(key, interval, concurrency)
        gate.interval, gate.concurrency = interval, max(concurrency, 1)
        gate.why = why or f"interval {interval:g} s"
        went: list[bool] = []

        def go_once(slot: _Slot | None) -> None:
            went.append(True)
            go(slot)

        self._count_idle()
        gate.waiters.append((url, go_once))
        self.parked += 1
        self._dispatch(gate)
        if went:
            return
        if gate.episode is None:
            reason, told = gate.holding_back(self.clock.now(), self.backoffs)
            gate.episode = WaitEpisode(key, url, reason, self.clock.now(), told=told)
        else:
            gate.episode.requests += 1

    def sent(self, key: str, slot: _Slot) -> None:
        """A request that went through *slot* reached the wire."""
        now = self.clock.now()
        slot.last_sent = now
        gate = self._gates.get(key)
        if gate is not None:
            gate.next_wire = now + self.gap(gate.interval) if gate.interval > 0 else now
            gate.unsent = max(gate.unsent - 1, 0)
            self._dispatch(gate)

    def done(self, key: str, slot: _Slot, sent: bool = True) -> None:
        """The request that went through *slot* has finished (*sent*: it reached the
        wire, and :meth:`sent` was told)."""
        self._count_idle()
        slot.busy -= 1
        slot.idle_since = self.clock.now()
        self.in_flight -= 1
        gate = self._gates.get(key)
        if gate is not None:
            gate.in_flight -= 1
            if not sent:
                gate.unsent = max(gate.unsent - 1, 0)
            self._dispatch(gate)
        self._room_freed()

    def back_off(self, key: str, seconds: float, reason: str) -> None:
        """The host said to wait *seconds*: the hub is told, then this process's slots
        of the key go back (those in flight once their requests end)."""
        self.calls.call(
            lambda: self.store.back_off(key, seconds, reason), lambda _: None, "backing off"
        )
        self.backoffs.set(key, self.clock.now() + seconds, reason, self.clock.now())
        gate = self._gates.get(key)
        if gate is None:
            return
        for slot in gate.slots:
            slot.retired = True
        self._dispatch(gate)

    # --- the schedule ------------------------------------------------------------------
    def _dispatch(self, gate: _Gate) -> None:
        if self.closed:
            return
        self._count_idle()
        now = self.clock.now()
        wake: float | None = None
        backoff = self.backoffs.until(gate.key, now)
        slower = gate.interval * SLOWER + 0.05  # > 0: only stretches are slower
        for slot in gate.slots:
            if slot.slot.interval > slower:
                # Taken at a longer interval than the host's now (AutoThrottle went
                # down): given back once idle, and a stretch at the new pace asked for.
                slot.retired = True
        while gate.waiters:
            slot, at = self._usable(gate, now)
            if slot is None:
                break
            at = max(at, backoff)
            if at > now:
                wake = at
                break
            if not self._room():
                self._blocked[gate.key] = None
                break
            slot.used += 1
            slot.busy += 1
            gate.in_flight += 1
            gate.unsent += 1
            _, go = gate.waiters.popleft()
            self.parked -= 1
            self.in_flight += 1
            go(slot)
        linger = self._drop_spent(gate, now)
        if gate.waiters:
            if gate.episode is not None:
                gate.episode.saw(*gate.holding_back(self.clock.now(), self.backoffs))
            # No slot is asked for while the key is backed off: it stays in the hub,
            # under the back-off, for whoever asks once it ends.
            ask_at = max(gate.retry_at, backoff)
            if wake is None and not gate.asking:
                if now >= ask_at:
                    self.hub.ask(gate)
                else:
                    wake = ask_at
            self._wake_at(gate, wake)
        else:
            self._wake_at(gate, linger)
            self._episode_over(gate, now)

    def _usable(self, gate: _Gate, now: float) -> tuple[_Slot | None, float]:
        """The slot the next request goes through, and when it may go."""
        if gate.interval > 0 and (gate.unsent or gate.in_flight >= gate.concurrency):
            # One at a time to the wire, so that the next keeps an interval from the
            # last one sent; up to the concurrency in flight.
            return None, 0.0
        for slot in gate.slots:
            at = self._next_send(gate, slot, now)
            if at is not None and (slot.stretch or gate.interval <= 0):
                return slot, at
        return None, 0.0

    @staticmethod
    def _next_send(gate: _Gate, slot: _Slot, now: float) -> float | None:
        """When *slot*'s next request may go, or None: it has nothing more to give."""
        if slot.retired:
            return None
        if slot.stretch:
            if slot.used >= slot.slot.count:
                return None
            at = max(slot.start + slot.used * slot.slot.interval, gate.next_wire)
        elif slot.busy:
            return None  # a unit carries one request at a time
        else:
            at = slot.start
        return at if slot.alive_at(max(at, now)) else None

    def _drop_spent(self, gate: _Gate, now: float) -> float | None:
        """Release the slots that have nothing left to give, or were not needed for
        ``linger_seconds``; return when the next idle one is due to go."""
        keep = []
        released: list[tuple[int, float | None]] = []
        due: float | None = None
        for slot in gate.slots:
            if slot.busy:
                keep.append(slot)
                continue
            spent = self._next_send(gate, slot, now) is None or (
                not slot.stretch and gate.interval > 0
            )
            if not spent and not gate.waiters:
                idle_end = slot.idle_since + self.config.linger_seconds
                if idle_end <= now:
                    spent = True
                else:
                    due = idle_end if due is None else min(due, idle_end)
            if spent:
                released.append(slot.release_item(now))
                if not slot.used and gate.waiters:
                    # Given and not usable (its times past before they came): not asked
                    # for again at once, or the hub would be asked in a loop.
                    gate.retry_at = max(gate.retry_at, now + self.config.poll_seconds)
            else:
                keep.append(slot)
        gate.slots = keep
        self.calls.release(released)
        return due

    def _count_idle(self) -> None:
        """Add the idle places since the last change of ``parked`` or ``in_flight``."""
        now = self.clock.now()
        if self._counted_at is not None and self.max_in_flight > 0 and self.parked:
            free = min(self.max_in_flight - self.in_flight, self.parked)
            self.idle_seconds += max(free, 0) * (now - self._counted_at)
        self._counted_at = now

    def _room(self) -> bool:
        return self.max_in_flight <= 0 or self.in_flight < self.max_in_flight

    def _room_freed(self) -> None:
        """A request ended: those that waited only for room go, oldest gate first."""
        while self._blocked and self._room():
            key = next(iter(self._blocked))
            del self._blocked[key]
            gate = self._gates.get(key)
            if gate is not None:
                self._dispatch(gate)

    def _wake_at(self, gate: _Gate, at: float | None) -> None:
        if at is None:
            return
        if gate.timer is not None and gate.timer.active():
            if gate.timer_at <= at:
                # The timer set fires first, and its dispatch sets the next for what is
                # due then: each request that ends pushes an idle slot's end later, and
                # a timer of the reactor per request cost more than the rest of the gate.
                return
            gate.timer.cancel()
        gate.timer_at = at
        gate.timer = self.clock.call_later(max(at - self.clock.now(), 0.0), self._woken(gate))

    def _woken(self, gate: _Gate) -> Callable[[], None]:
        def fire() -> None:
            gate.timer = None
            self._dispatch(gate)

        return fire

    def _episode_over(self, gate: _Gate, now: float) -> None:
        episode, gate.episode = gate.episode, None
        if episode is not None:
            episode.seconds = now - episode.started
            if episode.told or episode.seconds >= ASKING_WAIT_TOLD and episode.reason == ASKING:
                self.events.wait_ended(episode)
        # Forget idle keys, so that memory follows the hosts in flight, not all seen.
        if not gate.slots and not gate.asking and gate.timer is None and not gate.in_flight:
            self._gates.pop(gate.key, None)

    def start(self) -> None:
        """Renew the slots held every third of their TTL."""
        self.hub.start()

    # --- closing ------------------------------------------------------------------------
    def stop_waiting(self) -> None:
        """The crawl is closing: requests waiting for a slot are called with none at once
        (they were never sent: the next run fetches them), and so is any that asks from
        now on; requests in flight keep their slots until they end."""
        self._count_idle()
        self.stopping = True
        for go in self._take_waiters(self.clock.now()):
            go(None)

    def close(self, done: Callable[[], None]) -> None:
        """Give every slot back and leave every key's line; *done* once the hub has
        been told (or failed to be). Requests still waiting are called with no slot."""
        now = self.clock.now()
        waiting = self._take_waiters(now)
        for gate in self._gates.values():
            self.calls.release([s.release_item(now) for s in gate.slots])
            gate.slots = []
        self.hub.stop()
        self.closed = True
        self.calls.close(True, done)
        for go in waiting:
            go(None)

    def _take_waiters(self, now: float) -> list[Callable[[Any], None]]:
        """Every waiting request's callback, taken from its gate (whose timer stops and
        whose wait episode is told); the caller calls them once its state is settled."""
        waiting: list[Callable[[Any], None]] = []
        for gate in list(self._gates.values()):  # a told episode may end its gate
            if gate.timer is not None and gate.timer.active():
                gate.timer.cancel()
            gate.timer = None
            waiting.extend(go for _, go in gate.waiters)
            self.parked -= len(gate.waiters)
            gate.waiters.clear()
            self._episode_over(gate, now)
        self._blocked.clear()
        return waiting

    def snapshot(self) -> list[dict[str, Any]]:
        """Each key's gate now, as plain data for the live views (``extensions/
        heartbeat.py``): slots held, requests in flight through them, requests
        waiting, and what holds those back."""
        return [
            {
                "key": gate.key,
                "slots": len(gate.slots),
                "in_flight": gate.in_flight,
                "waiting": len(gate.waiters),
                "reason": gate.holding_back(self.clock.now(), self.backoffs)[0]
                if gate.waiters
                else "",
            }
            for gate in self._gates.values()
        ]


class GateHub:
    """The gates' dealings with the hub: asks made as their call goes (so that the
    requests that came meanwhile count), answers and renewals turned into slots,
    shares and back-offs. :class:`HostCalls` sends what it asks."""

    def __init__(self, gates: HostGates) -> None:
        self.gates = gates
        self._beat: Timer | None = None

    def stop(self) -> None:
        if self._beat is not None and self._beat.active():
            self._beat.cancel()

    def ask(self, gate: _Gate) -> None:
        if self._wanted(gate) is None:
            return
        gate.asking = True
        self.gates.calls.ask(gate.key)

    def wanted(self, key: str) -> HostAsk | None:
        """What the call going now asks for *key* (``HostCalls`` asks when it sends)."""
        gate = self.gates._gates.get(key)
        ask = self._wanted(gate) if gate is not None else None
        if ask is None and gate is not None:
            gate.asking = False
        return ask

    def failed(self, error: Exception, doing: str) -> None:
        self.gates.events.hub_failed(error, doing)

    def _wanted(self, gate: _Gate) -> HostAsk | None:
        """What to ask the hub for *gate* now (None: nothing): made when the call goes,
        so that the requests that came while the asks gathered are counted."""
        if gate.interval > 0:
            # A stretch held with fewer send times left than requests waiting is
            # extended (the hub says no while another process waits for the host);
            # one that was given up goes back before the next is asked for.
            held = [s for s in gate.slots if s.stretch]
            if any(s.retired for s in held):
                return None
            now = self.gates.clock.now()
            left = sum(
                s.slot.count - s.used
                for s in held
                if self.gates._next_send(gate, s, now) is not None
            )
            if held and left >= len(gate.waiters):
                return None
            count = stretch_length(gate.interval, self.gates.config.slot_seconds, len(gate.waiters))
            return HostAsk(gate.key, gate.interval, gate.concurrency, count=count, slots=1)
        free = sum(1 for s in gate.slots if not s.busy and not s.retired)
        most = min(gate.concurrency, gate.share or gate.concurrency)
        wanted = min(len(gate.waiters) - free, most - len(gate.slots))
        if wanted <= 0:
            return None
        return HostAsk(gate.key, 0.0, gate.concurrency, count=1, slots=wanted)

    def answered(self, answers: list[HostAnswer], sent: float) -> None:
        """The hub's answers to the asks sent at *sent*."""
        now = self.gates.clock.now()
        for answer in answers:
            gate = self.gates._gates.get(answer.key)
            if gate is None or self.gates.closed:
                self.gates.calls.release([(s.slot_id, None) for s in answer.slots])
                continue
            gate.asking, gate.queued = False, answer.queued
            self._fit_share(gate, answer.share)
            held = {s.slot.slot_id: s for s in gate.slots}
            grown = False
            for slot in answer.slots:
                # Local times: its sends no earlier than the hub's (now is later than
                # the hub's answer), its end and expiry no later (sent is earlier).
                until = None if slot.until is None else sent + slot.until
                extended = held.get(slot.slot_id)
                if extended is None:
                    gate.slots.append(_Slot(slot, now + slot.start, sent + slot.ttl, until))
                    grown = True
                    continue
                # More send times on a stretch held.
                grown = grown or slot.count > extended.slot.count
                extended.slot = slot
                extended.until = max(extended.until or 0.0, until or 0.0)
                extended.expires = max(extended.expires, sent + slot.ttl)
            if answer.backoff_in > 0:
                reason = answer.backoff_reason or "told by the hub"
                self.gates.backoffs.set(answer.key, now + answer.backoff_in, reason, now)
            if not grown:
                gate.retry_at = now + min(
                    max(answer.retry_in, MIN_RETRY), self.gates.config.poll_seconds
                )
            self.gates._dispatch(gate)

    def not_answered(self, asks: list[HostAsk]) -> None:
        now = self.gates.clock.now()
        for ask in asks:
            gate = self.gates._gates.get(ask.key)
            if gate is not None:
                gate.asking = False
                gate.retry_at = now + self.gates.config.poll_seconds
                self.gates._dispatch(gate)

    def start(self) -> None:
        self._beat = self.gates.clock.call_later(self.gates.config.heartbeat, self._heartbeat)

    def _heartbeat(self) -> None:
        self._beat = None
        if self.gates.closed:
            return
        held = {s.slot.slot_id: s for g in self.gates._gates.values() for s in g.slots}
        sent = self.gates.clock.now()

        def renewed(alive: dict[int, Renewal]) -> None:
            for slot_id, slot in held.items():
                renewal = alive.get(slot_id)
                if renewal is None:
                    slot.expires = min(slot.expires, sent)
                    self.gates.events.slot_lost(slot.slot.key)
                    continue
                slot.expires = max(slot.expires, sent + slot.slot.ttl)
                gate = self.gates._gates.get(slot.slot.key)
                if gate is not None:
                    self._fit_share(gate, renewal.share)
                if renewal.backoff_in > 0:
                    self.gates.backoffs.set(
                        slot.slot.key, sent + renewal.backoff_in, "told by the hub", sent
                    )
            for gate in list(self.gates._gates.values()):
                self.gates._dispatch(gate)

        if held:
            self.gates.calls.call(
                lambda: self.gates.store.renew(held, self.gates.config.ttl), renewed, "renewing"
            )
        self._beat = self.gates.clock.call_later(self.gates.config.heartbeat, self._heartbeat)

    @staticmethod
    def _fit_share(gate: _Gate, share: int) -> None:
        """Keep no more units of *gate* than its *share* (other processes wait for the
        key): the idle ones go back first, the others once their requests end."""
        gate.share = share
        units = [s for s in gate.slots if not s.stretch and not s.retired]
        for slot in sorted(units, key=lambda s: s.busy)[: max(len(units) - share, 0)]:
            slot.retired = True

    # --- the hub ------------------------------------------------------------------------
