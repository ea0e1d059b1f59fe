"""Host budgets in the hub: how often, and how many at once, all crawl processes together
may ask one host (or one host through one proxy).

Per budget key (a host name, or ``host via proxy``) the hub holds when the last request
known to have gone was sent (``last_sent``), a back-off (``backoff_until``, from a
``Retry-After``), and the *slots* processes hold. A slot of a key with an interval is a
*stretch*: ``count`` send times spaced by the interval, the first an interval after the
last request sent; a key has one stretch at a time, so the host's schedule is one line
however many processes share it, and it never runs ahead of now by more than one
interval (or a back-off) plus the send times of the stretch being used, which are for
requests waiting in its holder. A key without interval has *units*: up to its
concurrency of them at once, each good for one request at a time until it runs out.
Every number comes from the asker (``crawler/politeness.py`` works them out); the store
applies them and never works one out itself.

Processes that asked and got nothing wait in line (``hub_host_waiters``): the key's next
slot goes to the one that waited longest, so that a process giving back a stretch and
asking again in the same call does not keep the host from the others. A holder of units
learns its *share* (the key's concurrency over the processes that hold or want it) and
gives back what it holds beyond it.

A slot runs out ``ttl`` seconds after its last renewal, and a stretch also a grace after
its end (its requests go before it, some later than their times when the holder's
jitter lengthens gaps): a process killed while it holds a key leaves it to the others
then, and the next stretch starts an interval after that end.
A released stretch tells when its last request went (``sent_ago``): the next stretch
starts an interval after it, and its unused times go back. A holder that ends leaves
the line and gives back its robots.txt claims (:meth:`HostBudgetStore.leave`).

Every time crosses the wire as seconds from the hub's now, never as a clock reading: a
process adds them to its own clock when the answer arrives (later than the hub's now,
so never early), and processes on nodes with skewed clocks still keep to one schedule.

One store for both backends: each operation is one transaction, the host rows locked
(``FOR UPDATE`` on PostgreSQL, the whole database on SQLite) in the order of their keys,
so two batches never wait for each other in a cycle. On PostgreSQL a take, a release and
an exchange are one call of a function each (one round trip; ``_PG_TAKE``), doing what
the Python of :class:`HostBudgetStore` does, step for step; tests hold both backends to
the same answers. Takes commit synchronously: a restarted hub never forgets a slot it
gave, so it never gives it twice. Releases may be lost in a crash: their slots then run
out and their unused send times stay unused (slower, never faster).

robots.txt bodies are kept here too, per host with the time they were fetched, so that
one process of a cluster fetches a host's robots.txt and the others read it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from crawler.hub.db import Hub, Transaction
from crawler.hub.locks import AdvisoryLock
from crawler.hub.upkeep import Vacuuming

HOST_SCHEMA_VERSION = 3

# A stretch its holder did not give back ends this long (or an interval, if longer) after
# its last send time's interval: its holder has died, or is too late to use it.
STRETCH_GRACE = 1.0

_PG_TAKE = """(
    p_keys TEXT[], p_intervals DOUBLE PRECISION[], p_concurrency INTEGER[],
    p_counts INTEGER[], p_slots INTEGER[], p_holder TEXT, p_ttl DOUBLE PRECISION
) RETURNS TABLE (o_key TEXT, o_slot BIGINT, o_start DOUBLE PRECISION,
    o_interval DOUBLE PRECISION, o_count INTEGER, o_retry DOUBLE PRECISION,
    o_backoff DOUBLE PRECISION, o_reason TEXT, o_now DOUBLE PRECISION,
    o_share INTEGER, o_queued BOOLEAN)
LANGUAGE plpgsql AS $$
DECLARE
    t DOUBLE PRECISION := EXTRACT(EPOCH FROM clock_timestamp())::float8;
    h RECORD;
    gone RECORD;
    own_id BIGINT;
    own_iv DOUBLE PRECISION;
    own_start DOUBLE PRECISION;
    own_until DOUBLE PRECISION;
    i INTEGER;
    k TEXT;
    iv DOUBLE PRECISION;
    conc INTEGER;
    last DOUBLE PRECISION;
    n_live INTEGER;
    n_stretch INTEGER;
    stretch_end DOUBLE PRECISION;
    first_holder TEXT;
    holders INTEGER;
    turn BOOLEAN;
    room INTEGER;
    given INTEGER;
    give INTEGER;
    st DOUBLE PRECISION;
    upto DOUBLE PRECISION;
BEGIN
    FOR i IN 1 .. COALESCE(cardinality(p_keys), 0) LOOP
        k := p_keys[i];
        INSERT INTO hub_hosts (key, updated) VALUES (k, t) ON CONFLICT (key) DO NOTHING;
        SELECT last_sent, backoff_until, backoff_reason INTO h
        FROM hub_hosts WHERE key = k FOR UPDATE;
        last := h.last_sent;
        FOR gone IN DELETE FROM hub_host_slots WHERE key = k AND (expires < t OR ends_at < t)
            RETURNING expires, until_at, interval_s LOOP
            IF gone.interval_s > 0 THEN
                last := GREATEST(last, LEAST(gone.expires, gone.until_at));
            END IF;
        END LOOP;
        DELETE FROM hub_host_waiters WHERE key = k AND expires < t;
        SELECT COUNT(*), COUNT(*) FILTER (WHERE interval_s > 0)
        INTO n_live, n_stretch FROM hub_host_slots WHERE key = k;
        SELECT holder INTO first_holder FROM hub_host_waiters WHERE key = k
            ORDER BY since, holder LIMIT 1;
        SELECT COUNT(*) INTO holders FROM (
            SELECT holder FROM hub_host_slots WHERE key = k
            UNION SELECT holder FROM hub_host_waiters WHERE key = k
            UNION SELECT p_holder) AS x;
        iv := GREATEST(p_intervals[i], 0);
        conc := GREATEST(p_concurrency[i], 1);
        turn := (first_holder IS NULL OR first_holder = p_holder) AND h.backoff_until <= t;
        o_key := k;
        o_interval := iv;
        o_count := CASE WHEN iv > 0 THEN GREATEST(p_counts[i], 1) ELSE 1 END;
        o_backoff := GREATEST(h.backoff_until - t, 0);
        o_reason := CASE WHEN h.backoff_until > t THEN h.backoff_reason END;
        o_now := t;
        o_share := GREATEST(conc / holders, 1);
        given := 0;
        own_id := NULL;
        IF iv > 0 THEN
            SELECT id, interval_s, start_at, until_at
            INTO own_id, own_iv, own_start, own_until FROM hub_host_slots
            WHERE key = k AND holder = p_holder AND interval_s > 0 LIMIT 1;
        END IF;
        IF own_id IS NOT NULL THEN
            -- More send times on the stretch this holder has, while nobody waits.
            IF turn THEN
                upto := GREATEST(own_until, t + o_count * own_iv);
                UPDATE hub_host_slots SET until_at = upto,
                    ends_at = upto + GREATEST(own_iv, %(grace)s), expires = t + p_ttl
                WHERE id = own_id;
                o_slot := own_id;
                o_start := own_start - t;
                o_interval := own_iv;
                o_count := round((upto - own_start) / own_iv)::int;
                o_retry := 0;
                o_queued := FALSE;
                RETURN NEXT;
                given := 1;
            END IF;
        ELSE
            IF iv > 0 THEN
                room := CASE WHEN n_live > 0 THEN 0 ELSE 1 END;
            ELSE
                room := CASE WHEN n_stretch > 0 THEN 0 ELSE conc - n_live END;
            END IF;
            give := 0;
            IF turn THEN
                give := LEAST(GREATEST(p_slots[i], 0), GREATEST(room, 0));
            END IF;
            st := GREATEST(t, last + iv);
            WHILE given < give LOOP
                upto := st + o_count * iv;
                INSERT INTO hub_host_slots
                    (key, holder, expires, start_at, until_at, interval_s, ends_at)
                VALUES (k, p_holder, t + p_ttl, st, upto, iv,
                    CASE WHEN iv > 0 THEN upto + GREATEST(iv, %(grace)s) END)
                RETURNING id INTO o_slot;
                o_start := st - t;
                o_retry := 0;
                o_queued := FALSE;
                RETURN NEXT;
                given := given + 1;
            END LOOP;
        END IF;
        IF given > 0 THEN
            DELETE FROM hub_host_waiters WHERE key = k AND holder = p_holder;
        ELSIF p_slots[i] > 0 THEN
            INSERT INTO hub_host_waiters (key, holder, since, expires)
            VALUES (k, p_holder, t, t + p_ttl / 3)
            ON CONFLICT (key, holder) DO UPDATE SET expires = EXCLUDED.expires;
        END IF;
        SELECT MAX(until_at) INTO stretch_end FROM hub_host_slots
        WHERE key = k AND interval_s > 0;
        UPDATE hub_hosts SET interval_s = iv, concurrency = conc, last_sent = last,
            next_at = GREATEST(last + iv, COALESCE(stretch_end, 0)),
            taken = taken + given, updated = t WHERE key = k;
        IF given = 0 THEN
            o_slot := NULL;
            o_start := NULL;
            o_interval := iv;
            o_queued := first_holder IS NOT NULL AND first_holder <> p_holder;
            o_retry := CASE
                WHEN h.backoff_until > t THEN h.backoff_until - t
                WHEN stretch_end > t THEN stretch_end - t
                ELSE p_ttl END;
            RETURN NEXT;
        END IF;
    END LOOP;
END
$$""".replace("%(grace)s", repr(STRETCH_GRACE))

_PG_RELEASE = """(p_ids BIGINT[], p_sent_ago DOUBLE PRECISION[])
RETURNS INTEGER LANGUAGE plpgsql AS $$
DECLARE
    t DOUBLE PRECISION := EXTRACT(EPOCH FROM clock_timestamp())::float8;
    r RECORD;
    released INTEGER := 0;
BEGIN
    -- Host rows first, in key order, as a take locks them: no cycle with a take.
    PERFORM 1 FROM hub_hosts WHERE key IN (
        SELECT key FROM hub_host_slots WHERE id = ANY(p_ids)) ORDER BY key FOR UPDATE;
    FOR r IN SELECT s.id, s.key, s.interval_s, s.expires, s.ends_at, u.ago
        FROM hub_host_slots s JOIN unnest(p_ids, p_sent_ago) AS u(id, ago) ON u.id = s.id
        ORDER BY s.id LOOP
        DELETE FROM hub_host_slots WHERE id = r.id;
        IF r.expires >= t AND (r.ends_at IS NULL OR r.ends_at >= t) THEN
            released := released + 1;
        END IF;
        CONTINUE WHEN r.interval_s <= 0 OR r.ago IS NULL;
        UPDATE hub_hosts SET last_sent = t - r.ago, next_at = t - r.ago + r.interval_s
        WHERE key = r.key AND last_sent < t - r.ago;
    END LOOP;
    RETURN released;
END
$$"""

# A release and a take in one call, the release first (a slot given back before its
# holder asks again): one round trip where a holder had two. Every host row either
# touches is locked first, in key order, as a take and a release each lock theirs: two
# exchanges never wait in a cycle.
_PG_EXCHANGE = """(
    p_ids BIGINT[], p_sent_ago DOUBLE PRECISION[], p_keys TEXT[],
    p_intervals DOUBLE PRECISION[], p_concurrency INTEGER[], p_counts INTEGER[],
    p_slots INTEGER[], p_holder TEXT, p_ttl DOUBLE PRECISION
) RETURNS TABLE (o_key TEXT, o_slot BIGINT, o_start DOUBLE PRECISION,
    o_interval DOUBLE PRECISION, o_count INTEGER, o_retry DOUBLE PRECISION,
    o_backoff DOUBLE PRECISION, o_reason TEXT, o_now DOUBLE PRECISION,
    o_share INTEGER, o_queued BOOLEAN)
LANGUAGE plpgsql AS $$
DECLARE
    t DOUBLE PRECISION := EXTRACT(EPOCH FROM clock_timestamp())::float8;
    k TEXT;
BEGIN
    FOR k IN SELECT DISTINCT x FROM unnest(COALESCE(p_keys, ARRAY[]::text[]) || ARRAY(
        SELECT key FROM hub_host_slots WHERE id = ANY(p_ids))) AS x ORDER BY x LOOP
        INSERT INTO hub_hosts (key, updated) VALUES (k, t) ON CONFLICT (key) DO NOTHING;
        PERFORM 1 FROM hub_hosts WHERE key = k FOR UPDATE;
    END LOOP;
    IF COALESCE(cardinality(p_ids), 0) > 0 THEN
        PERFORM hub_host_release(p_ids, p_sent_ago);
    END IF;
    RETURN QUERY SELECT * FROM hub_host_take(p_keys, p_intervals, p_concurrency, p_counts,
        p_slots, p_holder, p_ttl);
END
$$"""

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
            expires {real} NOT NULL, start_at {real} NOT NULL, until_at {real} NOT NULL,
            interval_s {real} NOT NULL)""",
        ),
        (
            "postgresql",
            """CREATE TABLE IF NOT EXISTS hub_host_slots (
            id {id}, key TEXT NOT NULL, holder TEXT NOT NULL,
            expires {real} NOT NULL, start_at {real} NOT NULL, until_at {real} NOT NULL,
            interval_s {real} NOT NULL)""",
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
    2: [],
    # One stretch per key, the line of waiting processes, the schedule kept as the last
    # request sent (a schedule kept as its next free time ran away: it was moved on for
    # send times that were never used).
    3: [
        "ALTER TABLE hub_hosts ADD COLUMN last_sent {real} NOT NULL DEFAULT 0",
        "ALTER TABLE hub_host_slots ADD COLUMN ends_at {real}",
        "UPDATE hub_hosts SET next_at = 0",
        """CREATE TABLE IF NOT EXISTS hub_host_waiters (
            key TEXT NOT NULL, holder TEXT NOT NULL, since {real} NOT NULL,
            expires {real} NOT NULL, PRIMARY KEY (key, holder))""",
        "CREATE INDEX IF NOT EXISTS hub_host_waiters_holder ON hub_host_waiters (holder)",
        "CREATE INDEX IF NOT EXISTS hub_host_slots_holder ON hub_host_slots (holder)",
        ("postgresql", "DROP FUNCTION IF EXISTS hub_host_exchange"),
        ("postgresql", "DROP FUNCTION IF EXISTS hub_host_take"),
        ("postgresql", "DROP FUNCTION IF EXISTS hub_host_release"),
        ("postgresql", "CREATE FUNCTION hub_host_take" + _PG_TAKE),
        ("postgresql", "CREATE FUNCTION hub_host_release" + _PG_RELEASE),
        ("postgresql", "CREATE FUNCTION hub_host_exchange" + _PG_EXCHANGE),
    ],
}


@dataclass(frozen=True)
class HostAsk:
    """What a process wants of one budget key: with an ``interval``, a stretch of
    ``count`` send times; without, ``slots`` units; ``concurrency`` requests at once,
    cluster-wide."""

    key: str
    interval: float
    concurrency: int
    count: int = 1
    slots: int = 1


@dataclass(frozen=True)
class HostSlot:
    """One slot given: send times ``start + i * interval`` for ``i < count`` (seconds from
    the hub's now when it answered); no interval: any number of sends, one at a time,
    until it runs out."""

    slot_id: int
    key: str
    start: float
    interval: float
    count: int
    ttl: float

    def times(self) -> list[float]:
        return [self.start + i * self.interval for i in range(self.count)]

    @property
    def until(self) -> float | None:
        """A stretch's requests go before this (seconds from the hub's now); None: a unit."""
        if self.interval <= 0:
            return None
        return self.start + self.count * self.interval


@dataclass(frozen=True)
class HostAnswer:
    """The hub's answer to one :class:`HostAsk`: the slots it gave (maybe none), when
    asking again may give one (seconds from now), the back-off left and its reason, the
    units this holder may keep (``share``), and whether other processes are before it
    in the key's line (``queued``)."""

    key: str
    slots: tuple[HostSlot, ...]
    retry_in: float
    backoff_in: float
    backoff_reason: str | None
    interval: float
    hub_now: float  # the hub's clock when it answered: for tools and tests, not schedules
    share: int = 1
    queued: bool = False


@dataclass(frozen=True)
class Renewal:
    """A slot renewed: the back-off left on its key, and the units its holder may keep."""

    backoff_in: float
    share: int


@dataclass(frozen=True)
class HostState:
    """One budget key as the hub holds it (for tools, the report and tests)."""

    key: str
    interval: float
    concurrency: int
    next_at: float
    last_sent: float
    backoff_until: float
    backoff_reason: str | None
    taken: int
    live_slots: int
    waiting: int


@dataclass(frozen=True)
class RobotsEntry:
    """A host's robots.txt as one process fetched it: ``status`` None when the fetch
    failed (no robots.txt: everything allowed, as Scrapy treats it)."""

    host: str
    status: int | None
    body: bytes
    age: float


def stretch_grace(interval: float) -> float:
    return max(interval, STRETCH_GRACE)


class HostBudgetStore:
    """The host-budget operations on one hub (see the module's docstring); opened with
    :meth:`open`, which picks the backend's."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        hub.migrate("hub_hosts_version", _HOST_MIGRATIONS, AdvisoryLock.HOST_SCHEMA)

    @staticmethod
    def open(hub: Hub) -> HostBudgetStore:
        """The store of *hub*'s backend, its tables made if missing."""
        if hub.backend == "postgresql":
            return PostgresHostBudgetStore(hub)
        return HostBudgetStore(hub)

    # --- slots --------------------------------------------------------------------
    def take(self, asks: Sequence[HostAsk], holder: str, ttl: float) -> list[HostAnswer]:
        """Give each ask what its key has free, in one transaction."""
        if not asks:
            return []
        with self.hub.transaction() as tx:
            return self._take_all(tx, asks, holder, ttl, _now(tx))

    def exchange(
        self,
        releases: Iterable[tuple[int, float | None]],
        asks: Sequence[HostAsk],
        holder: str,
        ttl: float,
    ) -> list[HostAnswer]:
        """:meth:`release` then :meth:`take`, in one transaction (one round trip): what
        the two calls one after the other would answer."""
        items = sorted(releases)
        if not asks:
            self.release(items)
            return []
        with self.hub.transaction() as tx:
            now = _now(tx)
            self._release_all(tx, items, now)
            return self._take_all(tx, asks, holder, ttl, now)

    def _take_all(
        self, tx: Transaction, asks: Sequence[HostAsk], holder: str, ttl: float, now: float
    ) -> list[HostAnswer]:
        answers: dict[str, HostAnswer] = {}
        for ask in sorted(asks, key=lambda a: a.key):
            answers[ask.key] = self._take_one(tx, ask, holder, ttl, now)
        return [answers[ask.key] for ask in asks]

    def _take_one(
        self, tx: Transaction, ask: HostAsk, holder: str, ttl: float, now: float
    ) -> HostAnswer:
        key = ask.key
        last, backoff_until, reason = _locked_row(tx, key, now)
        last = _end_ran_out(tx, key, now, last)
        tx.execute("DELETE FROM hub_host_waiters WHERE key = ? AND expires < ?", (key, now))
        live = tx.execute(
            "SELECT id, holder, interval_s, start_at, until_at FROM hub_host_slots WHERE key = ?",
            (key,),
        ).fetchall()
        line = [h for (h,) in tx.execute(
            "SELECT holder FROM hub_host_waiters WHERE key = ? ORDER BY since, holder", (key,)
        ).fetchall()]  # fmt: skip
        holders = len({row[1] for row in live} | set(line) | {holder})
        interval, concurrency = max(ask.interval, 0.0), max(ask.concurrency, 1)
        turn = (not line or line[0] == holder) and backoff_until <= now
        own = [row for row in live if row[1] == holder and row[2] > 0]
        if own and interval > 0:
            # More send times on the stretch this holder has, while nobody waits.
            slots = [_extend(tx, key, own[0], max(ask.count, 1), now, ttl)] if turn else []
        else:
            stretches = sum(1 for row in live if row[2] > 0)
            room = _room(interval, len(live), stretches, concurrency)
            give = min(max(ask.slots, 0), max(room, 0)) if turn else 0
            count = max(ask.count, 1) if interval > 0 else 1
            start = max(now, last + interval)
            slots = [
                _insert(tx, key, holder, start, interval, count, now, ttl) for _ in range(give)
            ]
        if slots:
            tx.execute("DELETE FROM hub_host_waiters WHERE key = ? AND holder = ?", (key, holder))
        elif ask.slots > 0:
            tx.execute(
                "INSERT INTO hub_host_waiters (key, holder, since, expires) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (key, holder) DO UPDATE SET expires = excluded.expires",
                (key, holder, now, now + ttl / 3),
            )
        (stretch_end,) = tx.execute(
            "SELECT MAX(until_at) FROM hub_host_slots WHERE key = ? AND interval_s > 0", (key,)
        ).fetchone()
        tx.execute(
            "UPDATE hub_hosts SET interval_s = ?, concurrency = ?, last_sent = ?, "
            "next_at = ?, taken = taken + ?, updated = ? WHERE key = ?",
            (interval, concurrency, last, max(last + interval, stretch_end or 0.0),
             len(slots), now, key),
        )  # fmt: skip
        if backoff_until > now:
            retry_in = backoff_until - now
        elif slots:
            retry_in = 0.0
        elif stretch_end is not None and stretch_end > now:
            retry_in = stretch_end - now
        else:
            retry_in = ttl  # a unit frees or the line moves: ask again at the poll
        return HostAnswer(
            key,
            tuple(slots),
            retry_in,
            max(backoff_until - now, 0.0),
            reason if backoff_until > now else None,
            interval,
            now,
            max(concurrency // holders, 1),
            not slots and bool(line) and line[0] != holder,
        )

    def renew(self, slot_ids: Iterable[int], ttl: float) -> dict[int, Renewal]:
        """Extend the live slots among *slot_ids* by *ttl* from now; per slot still held,
        the back-off left on its key and the units its holder may keep. A slot missing
        has run out."""
        ids = sorted(set(slot_ids))
        if not ids:
            return {}
        held: dict[int, Renewal] = {}
        with self.hub.transaction() as tx:
            now = _now(tx)
            for slot_id in ids:
                row = tx.execute(
                    "UPDATE hub_host_slots SET expires = ? WHERE id = ? AND expires >= ? "
                    "AND (ends_at IS NULL OR ends_at >= ?) RETURNING key",
                    (now + ttl, slot_id, now, now),
                ).fetchone()
                if row is None:
                    continue
                until, concurrency, holders = tx.execute(_KEY_STATE, (now, row[0])).fetchone()
                held[slot_id] = Renewal(
                    max(until - now, 0.0), max(concurrency // max(holders, 1), 1)
                )
        return held

    def release(self, slots: Iterable[tuple[int, float | None]]) -> int:
        """End slots: ``(slot id, seconds since its last request went, or None if none
        did)``; returns how many were still held. The key's next stretch starts an
        interval after the last request sent."""
        items = sorted(slots)
        if not items:
            return 0
        with self.hub.transaction() as tx:
            return self._release_all(tx, items, _now(tx))

    def _release_all(
        self, tx: Transaction, items: Sequence[tuple[int, float | None]], now: float
    ) -> int:
        released = 0
        for slot_id, sent_ago in items:
            row = tx.execute(
                "DELETE FROM hub_host_slots WHERE id = ? "
                "RETURNING key, interval_s, expires, ends_at",
                (slot_id,),
            ).fetchone()
            if row is None:
                continue
            key, interval, expires, ends = row
            released += expires >= now and (ends is None or ends >= now)
            if interval <= 0 or sent_ago is None:
                continue
            sent = now - sent_ago
            tx.execute(
                "UPDATE hub_hosts SET last_sent = ?, next_at = ? WHERE key = ? AND last_sent < ?",
                (sent, sent + interval, key, sent),
            )
        return released

    def leave(self, holder: str) -> None:
        """*holder* ends: its slots go back unused, it leaves every key's line, and its
        unfulfilled robots.txt claims pass to the next asker at once."""
        with self.hub.transaction() as tx:
            tx.execute("DELETE FROM hub_host_slots WHERE holder = ?", (holder,))
            tx.execute("DELETE FROM hub_host_waiters WHERE holder = ?", (holder,))
            tx.execute(
                "UPDATE hub_robots SET claim_holder = NULL, claim_expires = 0 "
                "WHERE claim_holder = ?",
                (holder,),
            )

    # --- the host's own signals ----------------------------------------------------------
    def back_off(self, key: str, seconds: float, reason: str) -> float:
        """No slot of *key* sends before *seconds* from now (a later back-off stands);
        returns the back-off left."""
        with self.hub.transaction() as tx:
            now = _now(tx)
            _, until, _ = _locked_row(tx, key, now)
            if now + seconds > until:
                until = now + seconds
                tx.execute(
                    "UPDATE hub_hosts SET backoff_until = ?, backoff_reason = ?, updated = ? "
                    "WHERE key = ?",
                    (until, reason, now, key),
                )
        return max(until - now, 0.0)

    def hosts(self, keys: Iterable[str] | None = None) -> list[HostState]:
        """The budget keys the hub holds (those of *keys* only, when given)."""
        rows = self.hub.query(
            "SELECT h.key, h.interval_s, h.concurrency, h.next_at, h.last_sent, "
            "h.backoff_until, h.backoff_reason, h.taken, "
            "(SELECT COUNT(*) FROM hub_host_slots s WHERE s.key = h.key AND s.expires >= NOW() "
            "AND (s.ends_at IS NULL OR s.ends_at >= NOW())), "
            "(SELECT COUNT(*) FROM hub_host_waiters w WHERE w.key = h.key "
            "AND w.expires >= NOW()) FROM hub_hosts h ORDER BY h.key"
        )
        wanted = None if keys is None else set(keys)
        return [
            HostState(k, i, c, n, s, b, r, int(t), int(live), int(w))
            for k, i, c, n, s, b, r, t, live, w in rows
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


# A key's back-off end, concurrency, and the processes holding or waiting for it.
_KEY_STATE = (
    "SELECT h.backoff_until, h.concurrency, (SELECT COUNT(*) FROM ("
    "SELECT holder FROM hub_host_slots WHERE key = h.key UNION "
    "SELECT holder FROM hub_host_waiters WHERE key = h.key AND expires >= ?) AS x) "
    "FROM hub_hosts h WHERE h.key = ?"
)


class PostgresHostBudgetStore(Vacuuming, HostBudgetStore):
    """Takes, exchanges, renewals and releases in one round trip each (see ``_PG_TAKE``);
    every stretch is a slot row made and deleted, and its host's row updated: the
    tables are vacuumed by their users (``crawler/hub/upkeep.py``)."""

    VACUUM_TABLES = ("hub_host_slots", "hub_hosts", "hub_host_waiters")
    VACUUM_LOCK = AdvisoryLock.HOST_VACUUM
    VACUUM_CHECK_EVERY = 100
    VACUUM_SECONDS = 5.0
    VACUUM_GOES_ON = "host budgeting"

    def take(self, asks: Sequence[HostAsk], holder: str, ttl: float) -> list[HostAnswer]:
        if not asks:
            return []
        ordered = sorted(asks, key=lambda a: a.key)
        rows = self.hub.query(
            "SELECT * FROM hub_host_take(?::text[], ?::float8[], ?::int[], ?::int[], "
            "?::int[], ?, ?)",
            (*_ask_arrays(ordered), holder, ttl),
        )
        self._count_operation()
        return _answers(asks, rows, ttl)

    def exchange(
        self,
        releases: Iterable[tuple[int, float | None]],
        asks: Sequence[HostAsk],
        holder: str,
        ttl: float,
    ) -> list[HostAnswer]:
        items = sorted(releases)
        if not asks:
            self.release(items)
            return []
        ordered = sorted(asks, key=lambda a: a.key)
        rows = self.hub.query(
            "SELECT * FROM hub_host_exchange(?::bigint[], ?::float8[], ?::text[], "
            "?::float8[], ?::int[], ?::int[], ?::int[], ?, ?)",
            (
                [i for i, _ in items],
                [ago for _, ago in items],
                *_ask_arrays(ordered),
                holder,
                ttl,
            ),
        )
        self._count_operation()
        return _answers(asks, rows, ttl)

    def renew(self, slot_ids: Iterable[int], ttl: float) -> dict[int, Renewal]:
        ids = sorted(set(slot_ids))
        if not ids:
            return {}
        rows = self.hub.query(
            "WITH t AS (SELECT NOW() AS now), u AS (UPDATE hub_host_slots s "
            "SET expires = t.now + ? FROM t WHERE s.id = ANY(?::bigint[]) "
            "AND s.expires >= t.now AND (s.ends_at IS NULL OR s.ends_at >= t.now) "
            "RETURNING s.id, s.key) "
            "SELECT u.id, GREATEST(h.backoff_until - t.now, 0), h.concurrency, "
            "(SELECT COUNT(*) FROM (SELECT holder FROM hub_host_slots WHERE key = u.key "
            "UNION SELECT holder FROM hub_host_waiters w WHERE w.key = u.key "
            "AND w.expires >= t.now) AS x) "
            "FROM u JOIN hub_hosts h ON h.key = u.key CROSS JOIN t",
            (ttl, ids),
        )
        return {
            int(slot_id): Renewal(float(left), max(int(conc) // max(int(holders), 1), 1))
            for slot_id, left, conc, holders in rows
        }

    def release(self, slots: Iterable[tuple[int, float | None]]) -> int:
        items = sorted(slots)
        if not items:
            return 0
        rows = self.hub.query(
            "SELECT hub_host_release(?::bigint[], ?::float8[])",
            ([i for i, _ in items], [ago for _, ago in items]),
        )
        self._count_operation()
        return int(rows[0][0])


def _ask_arrays(ordered: Sequence[HostAsk]) -> tuple[list, ...]:
    """The asks as the PostgreSQL functions' arrays, in the key order given."""
    return (
        [a.key for a in ordered],
        [float(a.interval) for a in ordered],
        [int(a.concurrency) for a in ordered],
        [int(a.count) for a in ordered],
        [int(a.slots) for a in ordered],
    )


def _answers(asks: Sequence[HostAsk], rows: list[tuple], ttl: float) -> list[HostAnswer]:
    """The rows of ``hub_host_take`` as one answer per ask, in the asks' order."""
    slots: dict[str, list[HostSlot]] = {}
    heads: dict[str, tuple] = {}
    for key, slot_id, start, interval, count, retry, backoff, reason, now, share, queued in rows:
        heads.setdefault(key, (retry, backoff, reason, interval, now, share, queued))
        if slot_id is not None:
            slots.setdefault(key, []).append(HostSlot(slot_id, key, start, interval, count, ttl))
    answers = []
    for ask in asks:
        retry, backoff, reason, interval, now, share, queued = heads[ask.key]
        given = tuple(slots.get(ask.key, ()))
        answers.append(
            HostAnswer(ask.key, given, retry, backoff, reason, interval, now, share, queued)
        )
    return answers


def _end_ran_out(tx: Transaction, key: str, now: float, last: float) -> float:
    """Drop *key*'s slots that ran out; the last request sent, as far as the hub knows:
    a holder that ran out may have sent until its stretch's end (or its expiry)."""
    for expires, until, interval in tx.execute(
        "DELETE FROM hub_host_slots WHERE key = ? AND (expires < ? OR ends_at < ?) "
        "RETURNING expires, until_at, interval_s",
        (key, now, now),
    ).fetchall():
        if interval > 0:
            last = max(last, min(expires, until))
    return last


def _insert(
    tx: Transaction,
    key: str,
    holder: str,
    start: float,
    interval: float,
    count: int,
    now: float,
    ttl: float,
) -> HostSlot:
    until = start + count * interval
    ends = until + stretch_grace(interval) if interval > 0 else None
    slot_id = tx.execute(
        "INSERT INTO hub_host_slots (key, holder, expires, start_at, until_at, interval_s, "
        "ends_at) VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
        (key, holder, now + ttl, start, until, interval, ends),
    ).fetchone()[0]
    return HostSlot(slot_id, key, start - now, interval, count, ttl)


def _extend(tx: Transaction, key: str, own: tuple, more: int, now: float, ttl: float) -> HostSlot:
    """*own* stretch (its row), its send times now reaching *more* intervals past now:
    times for the requests waiting, never more (the schedule stays near now)."""
    slot_id, _, interval, start, until = own
    until = max(until, now + more * interval)
    tx.execute(
        "UPDATE hub_host_slots SET until_at = ?, ends_at = ?, expires = ? WHERE id = ?",
        (until, until + stretch_grace(interval), now + ttl, slot_id),
    )
    count = round((until - start) / interval)
    return HostSlot(slot_id, key, start - now, interval, count, ttl)


def _room(interval: float, live: int, stretches: int, concurrency: int) -> int:
    """Slots a key has free: with an interval, one stretch at a time, alone; without, up
    to its concurrency of units."""
    if interval > 0:
        return 0 if live else 1
    return 0 if stretches else concurrency - live


def _now(tx: Transaction) -> float:
    return float(tx.execute("SELECT NOW()").fetchone()[0])


def _locked_row(tx: Transaction, key: str, now: float) -> tuple[float, float, str | None]:
    """(last_sent, backoff_until, back-off reason) of *key*, its row made if missing and
    locked until the transaction ends."""
    tx.execute(
        "INSERT INTO hub_hosts (key, updated) VALUES (?, ?) ON CONFLICT (key) DO NOTHING",
        (key, now),
    )
    last, backoff_until, reason = tx.execute(
        "SELECT last_sent, backoff_until, backoff_reason FROM hub_hosts "
        "WHERE key = ?" + tx.dialect.for_update,
        (key,),
    ).fetchone()
    return float(last), float(backoff_until), reason


def stretch_length(interval: float, seconds: float, waiting: int) -> int:
    """Send times to ask for at once: those of about *seconds* of the host's schedule,
    no more than the requests *waiting* for them, at least one."""
    if interval <= 0:
        return 1
    return max(1, min(waiting, math.ceil(seconds / interval)))
