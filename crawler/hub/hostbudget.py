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

HOST_SCHEMA_VERSION = 2

# On PostgreSQL a take and a release are one call of these functions each: one round
# trip, where the same steps as statements took five per host (a take of 20 hosts from
# 16 processes ran 13 calls/s on a loaded 2-core machine). They do what
# HostBudgetStore.take and .release do, step for step; tests/test_host_budget_store.py
# holds both backends to the same answers. Keys come sorted: host rows are locked in
# one order by every caller.
_PG_TAKE = """(
    p_keys TEXT[], p_intervals DOUBLE PRECISION[], p_concurrency INTEGER[],
    p_counts INTEGER[], p_slots INTEGER[], p_holder TEXT, p_ttl DOUBLE PRECISION
) RETURNS TABLE (o_key TEXT, o_slot BIGINT, o_start DOUBLE PRECISION,
    o_interval DOUBLE PRECISION, o_count INTEGER, o_retry DOUBLE PRECISION,
    o_backoff DOUBLE PRECISION, o_reason TEXT, o_now DOUBLE PRECISION)
LANGUAGE plpgsql AS $$
DECLARE
    t DOUBLE PRECISION := EXTRACT(EPOCH FROM clock_timestamp())::float8;
    h RECORD;
    gone RECORD;
    i INTEGER;
    k TEXT;
    conc INTEGER;
    live INTEGER;
    earliest DOUBLE PRECISION;
    free INTEGER;
    st DOUBLE PRECISION;
    nxt DOUBLE PRECISION;
    upto DOUBLE PRECISION;
    given INTEGER;
BEGIN
    FOR i IN 1 .. COALESCE(cardinality(p_keys), 0) LOOP
        k := p_keys[i];
        INSERT INTO hub_hosts (key, updated) VALUES (k, t) ON CONFLICT (key) DO NOTHING;
        SELECT crawl_delay, next_at, backoff_until, backoff_reason INTO h
        FROM hub_hosts WHERE key = k FOR UPDATE;
        nxt := h.next_at;
        FOR gone IN DELETE FROM hub_host_slots WHERE key = k AND expires < t
            RETURNING expires, interval_s LOOP
            IF gone.interval_s > 0 THEN
                nxt := GREATEST(nxt, gone.expires + gone.interval_s);
            END IF;
        END LOOP;
        o_key := k;
        o_interval := GREATEST(p_intervals[i], COALESCE(h.crawl_delay, 0), 0);
        conc := GREATEST(p_concurrency[i], 1);
        o_count := CASE WHEN o_interval > 0 THEN GREATEST(p_counts[i], 1) ELSE 1 END;
        o_backoff := GREATEST(h.backoff_until - t, 0);
        o_reason := CASE WHEN h.backoff_until > t THEN h.backoff_reason END;
        o_now := t;
        SELECT COUNT(*), MIN(expires) INTO live, earliest FROM hub_host_slots WHERE key = k;
        free := LEAST(GREATEST(p_slots[i], 0), conc - live);
        st := GREATEST(t, nxt, h.backoff_until);
        given := 0;
        WHILE given < free LOOP
            upto := st + o_count * o_interval;
            INSERT INTO hub_host_slots (key, holder, expires, start_at, until_at, interval_s)
            VALUES (k, p_holder, t + p_ttl, st, upto, o_interval) RETURNING id INTO o_slot;
            o_start := st - t;
            o_retry := 0;
            RETURN NEXT;
            given := given + 1;
            st := upto;
        END LOOP;
        UPDATE hub_hosts SET interval_s = p_intervals[i], concurrency = conc, next_at = st,
            taken = taken + given, updated = t WHERE key = k;
        IF given = 0 THEN
            o_slot := NULL;
            o_start := NULL;
            o_retry := GREATEST(CASE WHEN live >= conc THEN earliest ELSE st END - t, 0);
            RETURN NEXT;
        END IF;
    END LOOP;
END
$$"""

_PG_RELEASE = """(p_ids BIGINT[], p_sent_ago DOUBLE PRECISION[])
RETURNS INTEGER LANGUAGE plpgsql AS $$
DECLARE
    t DOUBLE PRECISION := EXTRACT(EPOCH FROM clock_timestamp())::float8;
    r RECORD;
    nxt DOUBLE PRECISION;
    after DOUBLE PRECISION;
    wanted DOUBLE PRECISION;
    released INTEGER := 0;
BEGIN
    -- Host rows first, in key order, as a take locks them: no cycle with a take.
    PERFORM 1 FROM hub_hosts WHERE key IN (
        SELECT key FROM hub_host_slots WHERE id = ANY(p_ids)) ORDER BY key FOR UPDATE;
    FOR r IN SELECT s.id, s.key, s.start_at, s.until_at, s.interval_s, s.expires, u.ago
        FROM hub_host_slots s JOIN unnest(p_ids, p_sent_ago) AS u(id, ago) ON u.id = s.id
        ORDER BY s.id LOOP
        DELETE FROM hub_host_slots WHERE id = r.id;
        IF r.expires >= t THEN
            released := released + 1;
        END IF;
        CONTINUE WHEN r.interval_s <= 0;
        SELECT next_at INTO nxt FROM hub_hosts WHERE key = r.key;
        after := t - r.ago + r.interval_s;
        IF nxt = r.until_at THEN
            wanted := COALESCE(after, r.start_at);
        ELSE
            wanted := GREATEST(nxt, COALESCE(after, nxt));
        END IF;
        IF wanted <> nxt THEN
            UPDATE hub_hosts SET next_at = wanted WHERE key = r.key;
        END IF;
    END LOOP;
    RETURN released;
END
$$"""

# A release and a take in one call, the release first (a slot given back before its
# holder asks again): one round trip where a holder had two, its asks no longer waiting
# behind its releases. Every host row either touches is locked first, in key order,
# as a take and a release each lock theirs: two exchanges never wait in a cycle.
_PG_EXCHANGE = """(
    p_ids BIGINT[], p_sent_ago DOUBLE PRECISION[], p_keys TEXT[],
    p_intervals DOUBLE PRECISION[], p_concurrency INTEGER[], p_counts INTEGER[],
    p_slots INTEGER[], p_holder TEXT, p_ttl DOUBLE PRECISION
) RETURNS TABLE (o_key TEXT, o_slot BIGINT, o_start DOUBLE PRECISION,
    o_interval DOUBLE PRECISION, o_count INTEGER, o_retry DOUBLE PRECISION,
    o_backoff DOUBLE PRECISION, o_reason TEXT, o_now DOUBLE PRECISION)
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
        ("postgresql", "CREATE OR REPLACE FUNCTION hub_host_take" + _PG_TAKE),
        ("postgresql", "CREATE OR REPLACE FUNCTION hub_host_release" + _PG_RELEASE),
    ],
    2: [("postgresql", "CREATE OR REPLACE FUNCTION hub_host_exchange" + _PG_EXCHANGE)],
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
        """Give each ask the slots its host's budget has free, in one transaction."""
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
        row = _locked_row(tx, ask.key, now)
        crawl_delay, next_at, backoff_until, reason = row
        interval = max(ask.interval, crawl_delay or 0.0, 0.0)
        concurrency = max(ask.concurrency, 1)
        # A holder that ran out may have sent until its slot's end: the host's next
        # request waits an interval after that.
        ran_out = tx.execute(
            "DELETE FROM hub_host_slots WHERE key = ? AND expires < ? RETURNING expires, "
            "interval_s",
            (ask.key, now),
        ).fetchall()
        for expires, slot_interval in ran_out:
            if slot_interval > 0:
                next_at = max(next_at, expires + slot_interval)
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
                "INSERT INTO hub_host_slots (key, holder, expires, start_at, until_at, "
                "interval_s) VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
                (ask.key, holder, now + ttl, start, until, interval),
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
        """End slots: ``(slot id, seconds since its last request went, or None if none
        did)``; returns how many were still held. The key's next request waits an
        interval after the last one sent (a holder's clock runs behind the hub's
        schedule by the time its answer took to arrive: this is what the schedule
        learns of it); the unused times at the end of a key's schedule go back to it,
        those before a later slot's stay a gap (slower, never faster)."""
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
                "RETURNING key, start_at, until_at, interval_s, expires",
                (slot_id,),
            ).fetchone()
            if row is None:
                continue
            key, start, until, interval, expires = row
            released += expires >= now
            if interval <= 0:
                continue
            _, next_at, _, _ = _locked_row(tx, key, now)
            after = None if sent_ago is None else now - sent_ago + interval
            if next_at == until:
                wanted = start if after is None else after
            else:
                wanted = next_at if after is None else max(next_at, after)
            if wanted != next_at:
                tx.execute("UPDATE hub_hosts SET next_at = ? WHERE key = ?", (wanted, key))
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


class PostgresHostBudgetStore(HostBudgetStore):
    """Takes, exchanges, renewals and releases in one round trip each (see ``_PG_TAKE``)."""

    def take(self, asks: Sequence[HostAsk], holder: str, ttl: float) -> list[HostAnswer]:
        if not asks:
            return []
        ordered = sorted(asks, key=lambda a: a.key)
        rows = self.hub.query(
            "SELECT * FROM hub_host_take(?::text[], ?::float8[], ?::int[], ?::int[], "
            "?::int[], ?, ?)",
            (*_ask_arrays(ordered), holder, ttl),
        )
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
        return _answers(asks, rows, ttl)

    def renew(self, slot_ids: Iterable[int], ttl: float) -> dict[int, float]:
        ids = sorted(set(slot_ids))
        if not ids:
            return {}
        rows = self.hub.query(
            "WITH t AS (SELECT NOW() AS now), u AS (UPDATE hub_host_slots s "
            "SET expires = t.now + ? FROM t WHERE s.id = ANY(?::bigint[]) "
            "AND s.expires >= t.now RETURNING s.id, s.key) "
            "SELECT u.id, GREATEST(h.backoff_until - t.now, 0) FROM u "
            "JOIN hub_hosts h ON h.key = u.key CROSS JOIN t",
            (ttl, ids),
        )
        return {int(slot_id): float(left) for slot_id, left in rows}

    def release(self, slots: Iterable[tuple[int, float | None]]) -> int:
        items = sorted(slots)
        if not items:
            return 0
        rows = self.hub.query(
            "SELECT hub_host_release(?::bigint[], ?::float8[])",
            ([i for i, _ in items], [ago for _, ago in items]),
        )
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
    for key, slot_id, start, interval, count, retry, backoff, reason, now in rows:
        heads.setdefault(key, (retry, backoff, reason, interval, now))
        if slot_id is not None:
            slots.setdefault(key, []).append(HostSlot(slot_id, key, start, interval, count, ttl))
    answers = []
    for ask in asks:
        retry, backoff, reason, interval, now = heads[ask.key]
        given = tuple(slots.get(ask.key, ()))
        answers.append(HostAnswer(ask.key, given, retry, backoff, reason, interval, now))
    return answers


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
