"""Taking, renewing, releasing and rotating proxy leases: the interface each backend
implements, and what both share (the lease, its counts, the rest formula).

:class:`LeaseStore` is written once per backend, side by side: ``lease_sqlite`` runs
each operation as a few statements in one ``BEGIN IMMEDIATE`` transaction, and
``lease_postgres`` as one call of a plpgsql function, installed when the store opens.
``tests/test_lease_store.py`` runs one scenario against both.

The rest a released proxy takes is computed here, in Python, for both: the store passes
the database the rests already worked out (:meth:`RestPolicy.rests`), and the database
only picks the one its row calls for (used or not, banned how many times in a row).
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from crawler.hub.db import Hub
from crawler.hub.identity import Holder

END_REASONS = ("rotated", "banned", "released", "expired")
# Rests after bans in a row double until the cap; past this many the cap is reached
# whatever the settings (2 ** 64 times any positive rest).
_MAX_BAN_STEPS = 64


@dataclass(frozen=True)
class Lease:
    """A proxy held by this process until renewed or released."""

    lease_id: int
    proxy_id: int
    url: str = field(repr=False)
    label: str
    started: float
    expires: float


@dataclass
class UsageCounts:
    """What a holder did through a proxy since it last reported."""

    requests: int = 0
    bytes: int = 0
    failures: int = 0
    bans: int = 0

    def add(self, other: UsageCounts) -> None:
        self.requests += other.requests
        self.bytes += other.bytes
        self.failures += other.failures
        self.bans += other.bans

    def take(self) -> UsageCounts:
        """Return the counts and reset them to zero."""
        taken = UsageCounts(self.requests, self.bytes, self.failures, self.bans)
        self.requests = self.bytes = self.failures = self.bans = 0
        return taken


# A minute of waiting weighs as much in the proxies' line as twice the work left.
LINE_MINUTE = 60.0


@dataclass(frozen=True)
class Place:
    """A process's place in the hub's line for proxies (``hub_proxy_waiters``), given
    with each take: when proxies are scarce the free ones go to the waiters with the
    strongest claim, not to whoever asks first. Its claim is ``log2(1 + work)`` (the
    requests its crawl has left) plus one per ``LINE_MINUTE`` it has waited: the crawl
    with an order of magnitude more to do goes first, as the longest job does in a
    schedule that ends soonest, yet no crawl waits long behind a bigger one. A process
    asking for a *further* lease (it holds one) yields to every waiter and takes no
    place. A place not asked for again within *ttl* seconds lapses (its process has
    stopped waiting or died)."""

    work: int = 0
    further: bool = False
    ttl: float = 15.0

    @property
    def weight(self) -> float:
        return math.log2(1 + max(self.work, 0))


def line_terms(place: Place | None, waited: float) -> tuple[float | None, float | None, float]:
    """What a take passes its store's SQL about the line: (the claim to beat, None for
    no line; the weight to keep a place with, None for none; the place's TTL). A further
    lease's claim (-1) is beaten by every waiter's."""
    if place is None:
        return None, None, 0.0
    if place.further:
        return -1.0, None, place.ttl
    return place.weight + max(waited, 0.0) / LINE_MINUTE, place.weight, place.ttl


@dataclass(frozen=True)
class RestPolicy:
    """How long a released proxy rests before anyone may lease it again: after a used
    lease ``rest_seconds``; after a ban ``ban_rest_seconds``, doubled at each ban in a
    row up to ``ban_rest_max_seconds``; each +/- ``jitter`` of itself."""

    rest_seconds: float = 60.0
    ban_rest_seconds: float = 600.0
    ban_rest_max_seconds: float = 6 * 3600.0
    jitter: float = 0.25

    def rests(self, rng: random.Random) -> tuple[float, list[float]]:
        """(the rest after a used lease, the rests after the 1st, 2nd... ban in a row,
        the last one standing for every later ban), one jitter factor for all."""
        factor = 1 + rng.uniform(-self.jitter, self.jitter)
        bans = []
        for step in range(_MAX_BAN_STEPS):
            rest = min(self.ban_rest_seconds * 2**step, self.ban_rest_max_seconds)
            bans.append(max(rest, 0.0) * factor)
            if rest >= self.ban_rest_max_seconds or self.ban_rest_seconds <= 0:
                break
        return max(self.rest_seconds, 0.0) * factor, bans

    def for_share(self, uses: int, stretch: int) -> RestPolicy:
        """The policy for a lease that ended after *uses* requests of the *stretch* a
        whole lease serves: its rest after use is that share of the full one. A proxy so
        rests as long per request sent through it however its leases end: a crawl, or a
        queue batch, that ends after a few requests does not cost the proxy a full rest."""
        if stretch <= 0 or uses >= stretch:
            return self
        return replace(self, rest_seconds=self.rest_seconds * max(uses, 0) / stretch)

    def rest_for(self, reason: str, consecutive_bans: int, rng: random.Random) -> float:
        """The rest after a lease that ended *reason*, the proxy's *consecutive_bans*
        counting this one."""
        rest, bans = self.rests(rng)
        if reason != "banned":
            return rest
        return ban_rest(bans, consecutive_bans - 1)


def ban_rest(bans: list[float], streak: int) -> float:
    """The rest of a ban that follows *streak* bans in a row (see :meth:`RestPolicy.rests`)."""
    return bans[min(max(streak, 0), len(bans) - 1)]


class LeaseStore(ABC):
    """The lease operations on one hub's proxy table (``crawler.hub.proxies`` makes the
    tables and picks the store of the hub's backend). Each operation is atomic: no proxy
    ever has two live holders, and a lease ends once."""

    def __init__(self, hub: Hub, rng: random.Random) -> None:
        self.hub = hub
        self.rng = rng

    @abstractmethod
    def acquire(
        self,
        holder: Holder,
        ttl: float,
        waited: float = 0.0,
        avoid: int = 0,
        place: Place | None = None,
    ) -> Lease | None:
        """Lease the least recently used free proxy but *avoid* for *ttl* seconds (an
        expired lease on it is closed ``expired``), or return None. With a *place*, a
        free proxy is taken only when more are free than live waiters have a stronger
        claim; otherwise the holder keeps (or takes) its place in the line."""

    @abstractmethod
    def renew_many(self, items: Iterable[tuple[Lease, UsageCounts]], ttl: float) -> list[bool]:
        """Extend each lease by *ttl* from now and add its counts; False where it was lost."""

    @abstractmethod
    def release(self, lease: Lease, reason: str, counts: UsageCounts, policy: RestPolicy) -> bool:
        """End a lease and let its proxy rest; False if it had been taken over."""

    @abstractmethod
    def rotate(
        self,
        lease: Lease,
        reason: str,
        counts: UsageCounts,
        policy: RestPolicy,
        holder: Holder,
        ttl: float,
        waited: float = 0.0,
        place: Place | None = None,
    ) -> tuple[bool, Lease | None]:
        """:meth:`release` *lease*, then :meth:`acquire` another proxy."""

    def release_many(
        self, ends: Iterable[tuple[Lease, str, UsageCounts, RestPolicy]]
    ) -> list[bool]:
        return [self.release(*end) for end in ends]
