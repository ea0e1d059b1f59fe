"""HostGates, one process's side of the host budgets, driven step by step: a manual
clock, hub calls run inline (or held until the test lets them finish), a real hub on
SQLite and PostgreSQL."""

from __future__ import annotations

import time
from typing import Any

import pytest

from crawler.hub import Hub
from crawler.hub.hostbudget import HostBudgetStore
from crawler.hub.hostgates import GateConfig, HostGates
from tests.hubs import hub_url  # noqa: F401 - the backend-parametrised fixture
from tests.test_lease_pool import InlineRunner, ManualClock


class Calls:
    """The store, every call it is given written down: (name, releases, asks)."""

    def __init__(self, store: HostBudgetStore) -> None:
        self.store = store
        self.made: list[tuple[str, int, int]] = []

    def exchange(self, releases, asks, holder, ttl):
        self.made.append(("exchange", len(releases), len(asks)))
        return self.store.exchange(releases, asks, holder, ttl)

    def release(self, releases):
        self.made.append(("release", len(releases), 0))
        return self.store.release(releases)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


@pytest.fixture
def rig(hub_url, request):  # noqa: F811
    """Gates whose asks go at once, or after ``batch_seconds`` with ``indirect`` params."""
    config = GateConfig(batch_seconds=getattr(request, "param", 0.0), batch_max=3)
    with Hub.open(hub_url) as hub:
        calls = Calls(HostBudgetStore.open(hub))
        clock, runner = ManualClock(), InlineRunner()
        gates = HostGates(calls, "me", config, clock, runner)  # type: ignore[arg-type]
        yield gates, calls, clock, runner


def test_releases_go_in_the_call_that_asks_for_slots(rig):
    """A slot given back while a call is out, and a new host asked for meanwhile, go to
    the hub together once that call is answered: one round trip, not two."""
    gates, calls, clock, runner = rig
    went: dict[str, Any] = {}

    def wait(key: str) -> None:
        gates.wait(key, f"http://{key}/", 0.0, 1, lambda slot: went.setdefault(key, slot))

    wait("b.test")
    gates.done("b.test", went["b.test"])
    runner.hold = True
    wait("a.test")  # its call is out...
    clock.advance(GateConfig().linger_seconds + 0.1)  # ...when b.test's slot goes back
    wait("c.test")
    assert "a.test" not in went and "c.test" not in went
    runner.finish()
    assert sorted(went) == ["a.test", "b.test", "c.test"]
    assert calls.made == [("exchange", 0, 1), ("exchange", 0, 1), ("exchange", 1, 1)]
    # A slot given back with nothing to ask goes alone.
    gates.done("a.test", went["a.test"])
    clock.advance(GateConfig().linger_seconds + 0.1)
    assert calls.made[-1] == ("release", 1, 0)


def test_no_more_requests_go_through_the_gates_than_max_in_flight(rig):
    """Requests waiting at the gates are counted as parked; with ``max_in_flight``
    through and unfinished, one whose slot is ready still waits, and goes, oldest gate
    first, when one of them ends."""
    gates, calls, clock, runner = rig
    gates.max_in_flight = 1
    went: dict[str, Any] = {}
    for key in ("a.test", "b.test", "c.test"):
        gates.wait(key, f"http://{key}/", 0.0, 1, lambda slot, key=key: went.setdefault(key, slot))
    assert (list(went), gates.parked, gates.in_flight) == (["a.test"], 2, 1)
    assert len(calls.made) == 3  # every slot is asked for all the same
    gates.done("a.test", went["a.test"])
    assert (list(went), gates.parked, gates.in_flight) == (["a.test", "b.test"], 1, 1)
    gates.done("b.test", went["b.test"])
    assert (list(went), gates.parked) == (["a.test", "b.test", "c.test"], 0)


@pytest.mark.parametrize("rig", [0.1], indirect=True)
def test_asks_gather_for_a_moment_into_one_call(rig):
    """Asks made within ``batch_seconds`` of the first go in one call, then; as many as
    ``batch_max`` go at once; a slot given back waits for the next call the same way."""
    gates, calls, clock, runner = rig
    went: dict[str, Any] = {}

    def wait(key: str) -> None:
        gates.wait(key, f"http://{key}/", 0.0, 1, lambda slot: went.setdefault(key, slot))

    wait("a.test")
    clock.advance(0.05)
    wait("b.test")
    assert (calls.made, went) == ([], {})
    clock.advance(0.06)
    assert calls.made == [("exchange", 0, 2)] and sorted(went) == ["a.test", "b.test"]
    for key in ("c.test", "d.test", "e.test"):
        wait(key)
    assert calls.made[-1] == ("exchange", 0, 3) and len(went) == 5
    gates.done("a.test", went["a.test"])
    clock.advance(GateConfig().linger_seconds + 0.05)
    assert len(calls.made) == 2
    clock.advance(0.1)
    assert calls.made[-1] == ("release", 1, 0)


def test_places_left_idle_while_requests_wait_for_a_slot_are_counted(rig):
    """While requests wait at the gates for the hub's answer and places among
    ``max_in_flight`` are free, the free places (no more than the requests waiting)
    are counted in place-seconds; once the answer lets them go, nothing more is."""
    gates, calls, clock, runner = rig
    gates.max_in_flight = 3
    went: dict[str, Any] = {}

    def wait(key: str) -> None:
        gates.wait(key, f"http://{key}/", 0.0, 1, lambda slot: went.setdefault(key, slot))

    runner.hold = True
    wait("a.test")  # its call goes out
    clock.advance(1.0)
    wait("b.test")  # its ask waits for that call
    clock.advance(0.5)
    runner.held.pop(0)()  # a.test goes; b.test's call goes out
    assert sorted(went) == ["a.test"]
    clock.advance(0.5)
    runner.finish()
    assert sorted(went) == ["a.test", "b.test"]
    assert gates.idle_seconds == pytest.approx(1 * 1.0 + 2 * 0.5 + 1 * 0.5)
    clock.advance(2.0)
    gates.done("a.test", went["a.test"])
    assert gates.idle_seconds == pytest.approx(2.5)  # nothing waited: nothing idle


def test_a_unit_carries_one_request_at_a_time(rig):
    """No interval, concurrency 1: of three requests one goes, the next when it ends."""
    gates, calls, clock, runner = rig
    went: list[str] = []
    slots: dict[str, Any] = {}
    for n in range(3):
        url = f"http://a.test/{n}"
        gates.wait(
            "a.test",
            url,
            0.0,
            1,
            lambda slot, url=url: (went.append(url), slots.setdefault(url, slot)),
        )
    assert went == ["http://a.test/0"]
    gates.done("a.test", slots["http://a.test/0"])
    assert went == ["http://a.test/0", "http://a.test/1"]


def test_a_stretch_keeps_the_interval_from_the_request_on_the_wire(rig):
    """Interval 1 s, concurrency 4: the first request goes at once; the next not before
    the first reached the wire, and then a whole interval after it."""
    gates, calls, clock, runner = rig
    went: list[Any] = []
    for n in range(3):
        gates.wait("b.test", f"http://b.test/{n}", 1.0, 4, went.append)
    assert len(went) == 1
    clock.advance(2.0)
    assert len(went) == 1  # the first is not on the wire yet
    gates.sent("b.test", went[0])
    clock.advance(0.9)
    assert len(went) == 1
    clock.advance(0.2)
    assert len(went) == 2  # while the first is still in flight: concurrency 4


def test_a_back_off_holds_every_request_of_its_key_until_it_ends(rig):
    """A back-off of 1 s (told the hub, which keeps time for real): the key's next
    request waits for its end, here and in the hub."""
    gates, calls, clock, runner = rig
    went: list[Any] = []
    gates.wait("c.test", "http://c.test/0", 0.0, 2, went.append)
    gates.sent("c.test", went[0])
    gates.back_off("c.test", 1.0, "HTTP 429, Retry-After: 1 s")
    gates.done("c.test", went[0])
    gates.wait("c.test", "http://c.test/1", 0.0, 2, went.append)
    clock.advance(0.8)
    assert len(went) == 1
    time.sleep(1.1)
    clock.advance(1.5)
    assert len(went) == 2


def test_a_holder_of_units_gives_back_its_share_to_a_process_that_waits(hub_url):  # noqa: F811
    """Two processes, one host of concurrency 2 without interval: the first takes both
    units; the second waits in line; at the first's next renewal its share is one, so
    it gives one unit back once its request ends, and the second process gets it."""
    with Hub.open(hub_url) as hub:
        store = HostBudgetStore.open(hub)
        clock, runner = ManualClock(), InlineRunner()
        first = HostGates(store, "first", GateConfig(batch_seconds=0), clock, runner)
        second = HostGates(store, "second", GateConfig(batch_seconds=0), clock, runner)
        ours: list[Any] = []
        theirs: list[Any] = []
        for n in range(4):
            first.wait("d.test", f"http://d.test/{n}", 0.0, 2, ours.append)
        second.wait("d.test", "http://d.test/x", 0.0, 2, theirs.append)
        assert (len(ours), len(theirs)) == (2, 0)
        first.start()
        clock.advance(GateConfig().heartbeat + 0.1)  # renewal: share 1
        first.done("d.test", ours[0])
        first.done("d.test", ours[1])
        clock.advance(GateConfig().poll_seconds + 0.1)
        assert len(theirs) == 1
        assert len(ours) == 3  # one unit kept: the first goes on too


@pytest.mark.parametrize("rig", [0.1], indirect=True)
def test_a_stretch_shorter_than_the_expiry_margin_is_used(rig):
    """Two requests at 0.05 s: a stretch of 0.1 s, all of it usable (a stretch counted
    spent before its first time once left the last requests of a crawl waiting)."""
    gates, calls, clock, runner = rig
    went: list[Any] = []
    for n in range(2):
        gates.wait("e.test", f"http://e.test/{n}", 0.05, 1, went.append)
    clock.advance(0.1)  # the two asks gathered: one stretch of two times
    assert len(went) == 1
    gates.sent("e.test", went[0])
    gates.done("e.test", went[0])
    clock.advance(0.06)
    assert len(went) == 2


def test_a_back_off_holds_the_host_here_and_in_the_hub_until_it_ends(rig):
    """A host that said to wait (a 429's Retry-After): no request of it goes before the
    back-off ends, neither through the slot this process held nor through a new one; the
    hub keeps the back-off for every process; the hub is asked again once it ends."""
    gates, calls, clock, runner = rig
    went: list[Any] = []

    def wait() -> None:
        gates.wait("busy.test", "http://busy.test/", 0.0, 2, went.append)

    wait()
    assert len(went) == 1
    gates.back_off("busy.test", 5.0, "HTTP 429, Retry-After: 5")
    gates.done("busy.test", went[0])
    wait()
    wait()
    asked = len(calls.made)
    for _ in range(49):  # to 4.9 s: nothing goes, nothing is asked for
        clock.advance(0.1)
    assert len(went) == 1 and len(calls.made) == asked, calls.made
    (state,) = [s for s in calls.store.hosts() if s.key == "busy.test"]
    assert state.backoff_reason == "HTTP 429, Retry-After: 5"
    clock.advance(0.2 + GateConfig().linger_seconds)
    assert calls.made[asked:] and calls.made[-1][2] == 1, calls.made  # asked again


def test_requests_one_after_another_share_a_timer(rig):
    """A host's requests ending one after another each push their idle slot's end
    later; the gate keeps the timer it set rather than one per request, and the slot
    still goes back ``linger_seconds`` after the last request ended."""
    gates, calls, clock, runner = rig
    slots: list[Any] = []
    for n in range(50):
        gates.wait("a.test", f"http://a.test/{n}", 0.0, 1, slots.append)
        clock.advance(0.01)
        gates.done("a.test", slots[-1])
    assert len(slots) == 50
    assert len(clock.timers) <= 5
    assert ("release", 1, 0) not in calls.made and calls.made.count(("exchange", 0, 1)) == 1
    clock.advance(gates.config.linger_seconds + 0.01)
    assert gates.snapshot() == []  # given back, the key forgotten
