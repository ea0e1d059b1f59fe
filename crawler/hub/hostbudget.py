"""Host budgets in the hub: how often, and how many at once, all crawl processes together
may ask one host (or one host through one proxy).

Per budget key (a host name, or ``host via proxy``) the hub holds the request interval
(the askers' ``DOWNLOAD_DELAY``, raised to the host's robots.txt ``Crawl-delay``), the
concurrency, the earliest time the next request may go (``next_at``) and a back-off
(``backoff_until``, from a ``Retry-After``). A process takes a *slot*: one unit of the
host's concurrency, held for ``ttl`` seconds unless renewed, with ``count`` send times
spaced by the interval, so that the hub is asked once per slot, not once per request. A
slot of a host without interval is not counted in times: it may send one request after
another while it lives. A process killed while it holds a slot frees it at its TTL.

Every time crosses the wire as seconds from the hub's now, never as a clock reading: a
process adds them to its own clock when the answer arrives (later than the hub's now,
so never early), and processes on nodes with skewed clocks still keep to one schedule.

One store for both backends: each operation is one transaction in the SQL they share
(``crawler.hub.db``), the host rows locked (``FOR UPDATE`` on PostgreSQL, the whole
database on SQLite) in the order of their keys, so two batches never wait for each
other in a cycle. Takes commit synchronously: a restarted hub never forgets a slot it
gave, so it never gives it twice. Releases may be lost in a crash: their slots then run
out at their TTL and their unused send times stay unused (slower, never faster).

robots.txt bodies are kept here too, per host with the time they were fetched, so that
one process of a cluster fetches a host's robots.txt and the others read it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from crawler.hub.db import Hub, Transaction
from crawler.hub.locks import AdvisoryLock

HOST_SCHEMA_VERSION = 1

_HOST_MIGRATIONS: dict[int, list] = {
    1: [
        """CREATE TABLE IF NOT EXISTS hub_hosts (
            key TEXT PRIMARY KEY,
            interval_s {real} NOT NULL DEFAULT 0,
            concurrency INTEGER NOT NULL DEFAULT 1,
            crawl_delay {real},
            next_at {real} NOT NULL DEFAULT 0,
            backoff_until {real} NOT NULL DEFAULT 0,
            backoff_reason TEXT,
            taken BIGINT NOT NULL DEFAULT 0,
            updated {real} NOT NULL DEFAULT 0
        )""",
        # Slot ids are never used twice (AUTOINCREMENT on SQLite, which otherwise gives
        # the id of a deleted last row again): a holder renewing a slot that ran out
        # must not renew another process's.
        (
            "sqlite",
            """CREATE TABLE IF NOT EXISTS hub_host_slots (
            id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, holder TEXT NOT NULL,
            expires {real} NOT NULL, until_at {real} NOT NULL)""",
        ),
        (
            "postgresql",
            """CREATE TABLE IF NOT EXISTS hub_host_slots (
            id {id}, key TEXT NOT NULL, holder TEXT NOT NULL,
            expires {real} NOT NULL, until_at {real} NOT NULL)""",
        ),
        "CREATE INDEX IF NOT EXISTS hub_host_slots_key ON hub_host_slots (key, expires)",
        (
            "sqlite",
            """CREATE TABLE IF NOT EXISTS hub_robots (
                host TEXT PRIMARY KEY, status INTEGER, body BLOB, fetched {real},
                claim_holder TEXT, claim_expires {real} NOT NULL DEFAULT 0)""",
        ),
        (
            "postgresql",
            """CREATE TABLE IF NOT EXISTS hub_robots (
                host TEXT PRIMARY KEY, status INTEGER, body BYTEA, fetched {real},
                claim_holder TEXT, claim_expires {real} NOT NULL DEFAULT 0)""",
        ),
    ],
}


@dataclass(frozen=True)
class HostAsk:
    """What a process wants of one budget key: ``slots`` slots, each with ``count`` send
    times, under its own settings (``interval`` seconds between requests, ``concurrency``
    requests at once, cluster-wide)."""

    key: str
    interval: float
    concurrency: int
    count: int = 1
    slots: int = 1


@dataclass(frozen=True)
class HostSlot:
    """One slot given: send times ``start + i * interval`` for ``i < count`` (seconds from
    the hub's now when it answered); no interval: any number of sends until it expires."""

    slot_id: int
    key: str
    start: float
    interval: float
    count: int
    ttl: float

    def times(self) -> list[float]:
        return [self.start + i * self.interval for i in range(self.count)]


@dataclass(frozen=True)
class HostAnswer:
    """The hub's answer to one :class:`HostAsk`: the slots it gave (maybe none), and when
    asking again may give one (seconds from now), the back-off left and its reason."""

    key: str
    slots: tuple[HostSlot, ...]
    retry_in: float
    backoff_in: float
    backoff_reason: str | None
    interval: float
    hub_now: float  # the hub's clock when it answered: for tools and tests, not schedules


@dataclass(frozen=True)
class HostState:
    """One budget key as the hub holds it (for tools, the report and tests)."""

    key: str
    interval: float
    concurrency: int
    crawl_delay: float | None
    next_at: float
    backoff_until: float
    backoff_reason: str | None
    taken: int
    live_slots: int


@dataclass(frozen=True)
class RobotsEntry:
    """A host's robots.txt as one process fetched it: ``status`` None when the fetch
    failed (no robots.txt: everything allowed, as Scrapy treats it)."""

    host: str
    status: int | None
    body: bytes
    age: float


class HostBudgetStore:
    """The host-budget operations on one hub (see the module's docstring)."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        hub.migrate("hub_hosts_version", _HOST_MIGRATIONS, AdvisoryLock.HOST_SCHEMA)

    # --- slots --------------------------------------------------------------------
    def take(self, asks: Sequence[HostAsk], holder: str, ttl: float) -> list[HostAnswer]:
        """Give each ask the slots its host's budget has free, in one transaction."""
        if not asks:
            return []
        answers: dict[str, HostAnswer] = {}
        with self.hub.transaction() as tx:
            now = _now(tx)
            for ask in sorted(asks, key=lambda a: a.key):
                answers[ask.key] = self._take_one(tx, ask, holder, ttl, now)
        return [answers[ask.key] for ask in asks]

    def _take_one(
        self, tx: Transaction, ask: HostAsk, holder: str, ttl: float, now: float
    ) -> HostAnswer:
        row = _locked_row(tx, ask.key, now)
        crawl_delay, next_at, backoff_until, reason = row
        interval = max(ask.interval, crawl_delay or 0.0, 0.0)
        concurrency = max(ask.concurrency, 1)
        tx.execute("DELETE FROM hub_host_slots WHERE key = ? AND expires < ?", (ask.key, now))
        live = [
            e
            for (e,) in tx.execute(
                "SELECT expires FROM hub_host_slots WHERE key = ?", (ask.key,)
            ).fetchall()
        ]
        free = min(max(ask.slots, 0), concurrency - len(live))
        start = max(now, next_at, backoff_until)
        count = max(ask.count, 1) if interval > 0 else 1
        slots = []
        for _ in range(max(free, 0)):
            until = start + count * interval
            slot_id = tx.execute(
                "INSERT INTO hub_host_slots (key, holder, expires, until_at) "
                "VALUES (?, ?, ?, ?) RETURNING id",
                (ask.key, holder, now + ttl, until),
            ).fetchone()[0]
            slots.append(HostSlot(slot_id, ask.key, start - now, interval, count, ttl))
            live.append(now + ttl)
            start = until
        tx.execute(
            "UPDATE hub_hosts SET interval_s = ?, concurrency = ?, next_at = ?, "
            "taken = taken + ?, updated = ? WHERE key = ?",
            (ask.interval, concurrency, start, len(slots), now, ask.key),
        )
        # Asking again helps when a slot frees (all taken) or the schedule reaches now.
        retry_in = max((min(live) if len(live) >= concurrency else start) - now, 0.0)
        return HostAnswer(
            ask.key,
            tuple(slots),
            retry_in,
            max(backoff_until - now, 0.0),
            reason if backoff_until > now else None,
            interval,
            now,
        )

    def renew(self, slot_ids: Iterable[int], ttl: float) -> dict[int, float]:
        """Extend the live slots among *slot_ids* by *ttl* from now; returns, per slot
        still held, the back-off left on its key (0: none). A slot missing has run out."""
        ids = sorted(set(slot_ids))
        if not ids:
            return {}
        held: dict[int, float] = {}
        with self.hub.transaction() as tx:
            now = _now(tx)
            for slot_id in ids:
                row = tx.execute(
                    "UPDATE hub_host_slots SET expires = ? WHERE id = ? AND expires >= ? "
                    "RETURNING key",
                    (now + ttl, slot_id, now),
                ).fetchone()
                if row is None:
                    continue
                (until,) = tx.execute(
                    "SELECT backoff_until FROM hub_hosts WHERE key = ?", (row[0],)
                ).fetchone()
                held[slot_id] = max(until - now, 0.0)
        return held

    def release(self, slots: Iterable[tuple[int, float | None]]) -> int:
        """End slots: ``(slot id, seconds from now of its first unused send time, or
        None)``. Unused times at the end of a key's schedule go back to it; returns how
        many slots were still held."""
        items = sorted(slots)
        if not items:
            return 0
        released = 0
        with self.hub.transaction() as tx:
            now = _now(tx)
            for slot_id, unused_in in items:
                row = tx.execute(
                    "DELETE FROM hub_host_slots WHERE id = ? RETURNING key, until_at, expires",
                    (slot_id,),
                ).fetchone()
                if row is None:
                    continue
                key, until, expires = row
                released += expires >= now
                if unused_in is None:
                    continue
                # Only the schedule's tail comes back: a later slot's times stay where
                # they are, and these become a gap (slower, never faster).
                tx.execute(
                    "UPDATE hub_hosts SET next_at = ? WHERE key = ? AND next_at = ?",
                    (now + max(unused_in, 0.0), key, until),
                )
        return released

    # --- the host's own signals ----------------------------------------------------------
    def back_off(self, key: str, seconds: float, reason: str) -> float:
        """No slot of *key* sends before *seconds* from now (a later back-off stands);
        returns the back-off left."""
        with self.hub.transaction() as tx:
            now = _now(tx)
            _, _, until, _ = _locked_row(tx, key, now)
            if now + seconds > until:
                until = now + seconds
                tx.execute(
                    "UPDATE hub_hosts SET backoff_until = ?, backoff_reason = ?, updated = ? "
                    "WHERE key = ?",
                    (until, reason, now, key),
                )
        return max(until - now, 0.0)

    def set_crawl_delay(self, key: str, delay: float | None) -> None:
        """The host's robots.txt asks for *delay* seconds between requests (None: no
        Crawl-delay); its next request waits for it from now."""
        with self.hub.transaction() as tx:
            now = _now(tx)
            _, next_at, _, _ = _locked_row(tx, key, now)
            later = max(next_at, now + (delay or 0.0))
            tx.execute(
                "UPDATE hub_hosts SET crawl_delay = ?, next_at = ?, updated = ? WHERE key = ?",
                (delay, later, now, key),
            )

    def hosts(self, keys: Iterable[str] | None = None) -> list[HostState]:
        """The budget keys the hub holds (those of *keys* only, when given)."""
        rows = self.hub.query(
            "SELECT h.key, h.interval_s, h.concurrency, h.crawl_delay, h.next_at, "
            "h.backoff_until, h.backoff_reason, h.taken, "
            "(SELECT COUNT(*) FROM hub_host_slots s WHERE s.key = h.key AND s.expires >= NOW()) "
            "FROM hub_hosts h ORDER BY h.key"
        )
        wanted = None if keys is None else set(keys)
        return [
            HostState(k, i, c, d, n, b, r, int(t), int(live))
            for k, i, c, d, n, b, r, t, live in rows
            if wanted is None or k in wanted
        ]

    # --- robots.txt, fetched once per cluster -----------------------------------------------
    def robots(self, host: str, max_age: float) -> RobotsEntry | None:
        """The robots.txt of *host* fetched less than *max_age* seconds ago, or None."""
        rows = self.hub.query(
            "SELECT status, body, NOW() - fetched FROM hub_robots "
            "WHERE host = ? AND fetched IS NOT NULL",
            (host,),
        )
        if not rows or rows[0][2] > max_age:
            return None
        status, body, age = rows[0]
        return RobotsEntry(host, status, bytes(body or b""), float(age))

    def claim_robots(self, host: str, holder: str, ttl: float, max_age: float) -> bool:
        """Whether *holder* is to fetch *host*'s robots.txt: none fresh is stored and
        nobody else claimed it less than *ttl* seconds ago."""
        with self.hub.transaction() as tx:
            now = _now(tx)
            tx.execute(
                "INSERT INTO hub_robots (host) VALUES (?) ON CONFLICT (host) DO NOTHING", (host,)
            )
            fetched, claim_holder, claim_expires = tx.execute(
                "SELECT fetched, claim_holder, claim_expires FROM hub_robots WHERE host = ?"
                + tx.dialect.for_update,
                (host,),
            ).fetchone()
            if fetched is not None and now - fetched <= max_age:
                return False
            if claim_holder not in (None, holder) and claim_expires >= now:
                return False
            tx.execute(
                "UPDATE hub_robots SET claim_holder = ?, claim_expires = ? WHERE host = ?",
                (holder, now + ttl, host),
            )
        return True

    def put_robots(self, host: str, status: int | None, body: bytes) -> None:
        """Store the robots.txt one process fetched for every other to read."""
        self.hub.execute(
            "INSERT INTO hub_robots (host, status, body, fetched, claim_expires) "
            "VALUES (?, ?, ?, NOW(), 0) ON CONFLICT (host) DO UPDATE SET status = ?, "
            "body = ?, fetched = NOW(), claim_holder = NULL, claim_expires = 0",
            (host, status, body, status, body),
        )


def _now(tx: Transaction) -> float:
    return float(tx.execute("SELECT NOW()").fetchone()[0])


def _locked_row(
    tx: Transaction, key: str, now: float
) -> tuple[float | None, float, float, str | None]:
    """(crawl delay, next_at, backoff_until, back-off reason) of *key*, its row made if
    missing and locked until the transaction ends."""
    tx.execute(
        "INSERT INTO hub_hosts (key, updated) VALUES (?, ?) ON CONFLICT (key) DO NOTHING",
        (key, now),
    )
    crawl_delay, next_at, backoff_until, reason = tx.execute(
        "SELECT crawl_delay, next_at, backoff_until, backoff_reason FROM hub_hosts "
        "WHERE key = ?" + tx.dialect.for_update,
        (key,),
    ).fetchone()
    return crawl_delay, float(next_at), float(backoff_until), reason


def slots_for(interval: float, seconds: float, waiting: int) -> int:
    """Send times to ask for at once: those of about *seconds* of the host's schedule,
    no more than the requests *waiting* for them, at least one."""
    if interval <= 0:
        return 1
    return max(1, min(waiting, math.ceil(seconds / interval)))
