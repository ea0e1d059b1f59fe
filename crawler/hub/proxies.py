"""The hub's proxy pool: its tables and every statement on them.

``hub_proxies`` has one row per proxy: its URL, whether it is enabled, and its lease
state (``free``, ``leased`` by one holder until ``lease_expires``, ``resting`` or
``banned`` until ``resting_until``). ``hub_proxy_usage`` has one row per lease: who
held it, what went through it, and how it ended (``END_REASONS``).

A lease is taken in one transaction that picks the least recently used proxy that is
enabled, not resting and not under a live lease (PostgreSQL: ``FOR UPDATE SKIP
LOCKED``; SQLite: the whole database under ``BEGIN IMMEDIATE``), so no proxy ever has
two live holders. A lease whose holder stopped renewing it expires and is taken over.
Releasing it lets the proxy rest (:class:`RestPolicy`) before anyone may lease it again.

On PostgreSQL, taking, renewing (a whole heartbeat's leases at once) and releasing a
lease are one call each (a statement, or a plpgsql function the schema creates), and so
is a rotation (releasing one lease and taking the next, :meth:`ProxyPool.rotate`), so
that a hub serves thousands of them per second; the durability chosen for each is
stated beside their SQL. SQLite runs the same steps as a few statements in one ``BEGIN
IMMEDIATE`` transaction.

Longer than most modules here: every statement on the proxy tables lives in it, in both
backends' forms.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from crawler.hub.db import Hub, Migration, Transaction
from crawler.hub.errors import HubError, InvalidProxyURLError
from crawler.hub.identity import Holder
from crawler.hub.redact import normalize_proxy_url, redact_url

SCHEMA_VERSION = 4
END_REASONS = ("rotated", "banned", "released", "expired")
logger = logging.getLogger(__name__)

_SCHEMA_LOCK = 7302519001  # serialises concurrent creators of these tables
_VACUUM_LOCK = 7302519002  # one process at a time vacuums hub_proxies

_PROXY_COLUMNS = (
    "id, url, enabled, state, holder, lease_id, lease_expires, stretch_uses, total_uses, "
    "failures, bans, consecutive_bans, resting_until, last_used"
)
_USAGE_COLUMNS = (
    "id, proxy_id, host, pid, task, started, ended, requests, bytes, failures, bans, "
    "end_reason, waited"
)

# PostgreSQL takes, releases and rotates leases through the functions of migration 4,
# one call each: one round trip and one transaction, whose statements each read a fresh
# snapshot and run a small cached plan. (One statement of CTEs did the same work; with 16
# clients the server spent a fifth more CPU on each rotation, and a pick that locked a
# proxy taken after its snapshot held it to the end, stalling that proxy's next release.)
#
# Durability is chosen per call. Taking and rotating commit synchronously: a lease the
# hub forgot in a crash could be given to a second holder while the first still uses
# it. Releasing commits without waiting for the WAL flush (synchronous_commit off for
# that transaction only): a crash of the server loses at most the releases of its last
# few hundred milliseconds, whose proxies then stay leased until their TTL runs out and
# are taken over, their usage rows closed at the lease's expiry (a later end than the
# true one, so intervals read from the usage table never look shorter than they were).
# A clean restart loses nothing.
#
# A rotation releases before it picks: it waits, if it waits, for its own lease's row
# only, holding no other proxy, so two rotations never wait for each other in a cycle.
_PG_TAKE = """CREATE OR REPLACE FUNCTION hub_take(
    p_avoid BIGINT, p_host TEXT, p_pid INTEGER, p_task TEXT, p_waited DOUBLE PRECISION,
    p_holder TEXT, p_ttl DOUBLE PRECISION, OUT new_proxy BIGINT, OUT new_url TEXT,
    OUT new_lease BIGINT, OUT new_started DOUBLE PRECISION
) LANGUAGE plpgsql AS $$
DECLARE
    t DOUBLE PRECISION := NOW();
    picked RECORD;
BEGIN
    -- The least recently used free proxy, from the head of hub_proxies_lru.
    SELECT id, url, state, lease_id, lease_expires INTO picked FROM hub_proxies
    WHERE enabled = 1 AND (state <> 'leased' OR lease_expires < t)
        AND COALESCE(resting_until, 0) <= t AND id <> p_avoid
    ORDER BY COALESCE(last_used, 0), id LIMIT 1 FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF picked.state = 'leased' THEN
        UPDATE hub_proxy_usage SET ended = picked.lease_expires, end_reason = 'expired'
        WHERE id = picked.lease_id AND ended IS NULL;
    END IF;
    INSERT INTO hub_proxy_usage (proxy_id, host, pid, task, waited, started)
    VALUES (picked.id, p_host, p_pid, p_task, p_waited, t) RETURNING id INTO new_lease;
    UPDATE hub_proxies SET state = 'leased', holder = p_holder, lease_id = new_lease,
        lease_expires = t + p_ttl, stretch_uses = 0, last_used = t
    WHERE id = picked.id;
    new_proxy := picked.id;
    new_url := picked.url;
    new_started := t;
END
$$"""

# A lost lease (the proxy taken over after its TTL) keeps its counts; its end is the
# taker's to write. The rest doubles with each ban in a row, up to its cap.
_PG_RELEASE_FUNCTION = """CREATE OR REPLACE FUNCTION hub_release(
    p_proxy BIGINT, p_lease BIGINT, p_requests BIGINT, p_bytes BIGINT, p_failures BIGINT,
    p_bans BIGINT, p_reason TEXT, p_rest DOUBLE PRECISION, p_ban_rest DOUBLE PRECISION,
    p_ban_rest_max DOUBLE PRECISION, p_jitter DOUBLE PRECISION
) RETURNS BOOLEAN LANGUAGE plpgsql AS $$
DECLARE
    t DOUBLE PRECISION := NOW();
    banned BOOLEAN := p_reason = 'banned';
    streak INTEGER;
    used BIGINT;
    rest DOUBLE PRECISION := 0.0;
BEGIN
    SELECT consecutive_bans INTO streak FROM hub_proxies
    WHERE id = p_proxy AND lease_id = p_lease FOR UPDATE;
    IF NOT FOUND THEN
        UPDATE hub_proxy_usage SET requests = requests + p_requests,
            bytes = bytes + p_bytes, failures = failures + p_failures, bans = bans + p_bans
        WHERE id = p_lease;
        RETURN FALSE;
    END IF;
    UPDATE hub_proxy_usage SET requests = requests + p_requests, bytes = bytes + p_bytes,
        failures = failures + p_failures, bans = bans + p_bans, ended = COALESCE(ended, t),
        end_reason = CASE WHEN ended IS NULL THEN p_reason ELSE end_reason END
    WHERE id = p_lease RETURNING requests INTO used;
    IF banned THEN
        rest := LEAST(p_ban_rest * power(2, streak), p_ban_rest_max) * p_jitter;
    ELSIF COALESCE(used, 0) > 0 THEN
        rest := p_rest * p_jitter;
    END IF;
    UPDATE hub_proxies SET
        state = CASE WHEN banned THEN 'banned' WHEN rest > 0 THEN 'resting' ELSE 'free' END,
        holder = NULL, lease_id = NULL, lease_expires = NULL, resting_until = t + rest,
        consecutive_bans = CASE WHEN banned THEN streak + 1 ELSE 0 END,
        total_uses = total_uses + p_requests, failures = failures + p_failures,
        bans = bans + p_bans, stretch_uses = stretch_uses + p_requests, last_used = t
    WHERE id = p_proxy;
    RETURN TRUE;
END
$$"""

_PG_ROTATE_FUNCTION = """CREATE OR REPLACE FUNCTION hub_rotate(
    p_proxy BIGINT, p_lease BIGINT, p_requests BIGINT, p_bytes BIGINT, p_failures BIGINT,
    p_bans BIGINT, p_reason TEXT, p_rest DOUBLE PRECISION, p_ban_rest DOUBLE PRECISION,
    p_ban_rest_max DOUBLE PRECISION, p_jitter DOUBLE PRECISION, p_host TEXT,
    p_pid INTEGER, p_task TEXT, p_waited DOUBLE PRECISION, p_holder TEXT,
    p_ttl DOUBLE PRECISION, OUT released BOOLEAN, OUT new_proxy BIGINT, OUT new_url TEXT,
    OUT new_lease BIGINT, OUT new_started DOUBLE PRECISION
) LANGUAGE plpgsql AS $$
BEGIN
    released := hub_release(p_proxy, p_lease, p_requests, p_bytes, p_failures, p_bans,
        p_reason, p_rest, p_ban_rest, p_ban_rest_max, p_jitter);
    SELECT * INTO new_proxy, new_url, new_lease, new_started
    FROM hub_take(p_proxy, p_host, p_pid, p_task, p_waited, p_holder, p_ttl);
END
$$"""

# Numbered migrations; {id} and {real} differ between the dialects.
_MIGRATIONS: dict[int, list[Migration]] = {
    1: [
        """CREATE TABLE IF NOT EXISTS hub_proxies (
            id {id},
            url TEXT NOT NULL UNIQUE,
            enabled INTEGER NOT NULL DEFAULT 1,
            state TEXT NOT NULL DEFAULT 'free',
            holder TEXT,
            lease_id BIGINT,
            lease_expires {real},
            stretch_uses INTEGER NOT NULL DEFAULT 0,
            total_uses BIGINT NOT NULL DEFAULT 0,
            failures BIGINT NOT NULL DEFAULT 0,
            bans BIGINT NOT NULL DEFAULT 0,
            consecutive_bans INTEGER NOT NULL DEFAULT 0,
            resting_until {real},
            last_used {real},
            added {real}
        )""",
        """CREATE TABLE IF NOT EXISTS hub_proxy_usage (
            id {id},
            proxy_id BIGINT NOT NULL REFERENCES hub_proxies(id),
            host TEXT NOT NULL,
            pid INTEGER NOT NULL,
            task TEXT NOT NULL DEFAULT '',
            started {real} NOT NULL,
            ended {real},
            requests BIGINT NOT NULL DEFAULT 0,
            bytes BIGINT NOT NULL DEFAULT 0,
            failures BIGINT NOT NULL DEFAULT 0,
            bans BIGINT NOT NULL DEFAULT 0,
            end_reason TEXT
        )""",
        "CREATE INDEX IF NOT EXISTS hub_proxy_usage_proxy ON hub_proxy_usage (proxy_id, started)",
    ],
    # The least recently used enabled proxy, found at the head of an index rather than by
    # sorting the pool: leased and resting proxies were used last, so the first rows of
    # this order are nearly always free.
    2: [
        "CREATE INDEX IF NOT EXISTS hub_proxies_lru ON hub_proxies "
        "((COALESCE(last_used, 0)), id) WHERE enabled = 1",
    ],
    # How long the holder had requests waiting for a proxy when it got this lease.
    3: [
        "ALTER TABLE hub_proxy_usage ADD COLUMN waited {real} NOT NULL DEFAULT 0",
        "CREATE INDEX IF NOT EXISTS hub_proxy_usage_started ON hub_proxy_usage (started)",
    ],
    # PostgreSQL's lease functions (above); SQLite runs the same steps from Python.
    4: [
        ("postgresql", _PG_TAKE),
        ("postgresql", _PG_RELEASE_FUNCTION),
        ("postgresql", _PG_ROTATE_FUNCTION),
    ],
}

# Whether hub_proxies is due a vacuum, and if so this session's to do (it then holds
# _VACUUM_LOCK). NOW() would be rewritten: these are timestamps, not the hub's epoch.
_PG_VACUUM_DUE = """
SELECT CASE WHEN COALESCE(GREATEST(last_vacuum, last_autovacuum), '-infinity')
    < clock_timestamp() - make_interval(secs => ?) THEN pg_try_advisory_lock(?) ELSE FALSE END
FROM pg_stat_user_tables WHERE relid = 'hub_proxies'::regclass
"""

# Parameters: the proxy to pass over (0: none), holder's host, pid and task, seconds
# waited, the holder, the TTL.
_PG_ACQUIRE = "SELECT * FROM hub_take(?, ?, ?, ?, ?, ?, ?)"
# Parameters: proxy id, lease id, counts (requests, bytes, failures, bans), reason, rest
# seconds, ban rest seconds, ban rest cap, jitter factor.
_PG_RELEASE = (
    "SELECT hub_release(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?), "
    "set_config('synchronous_commit', 'off', true)"
)
# Parameters: those of _PG_RELEASE, then those of _PG_ACQUIRE but the first.
_PG_ROTATE = "SELECT * FROM hub_rotate(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"

_PG_RENEW = """
WITH t AS (SELECT NOW() AS now),
b AS (
    SELECT * FROM unnest(?::bigint[], ?::bigint[], ?::bigint[], ?::bigint[], ?::bigint[],
        ?::bigint[]) AS b(lease_id, proxy_id, requests, bytes, failures, bans)
),
counted AS (
    UPDATE hub_proxy_usage u SET requests = u.requests + b.requests,
        bytes = u.bytes + b.bytes, failures = u.failures + b.failures, bans = u.bans + b.bans
    FROM b WHERE u.id = b.lease_id AND b.requests + b.bytes + b.failures + b.bans > 0
)
UPDATE hub_proxies p SET lease_expires = t.now + ?,
    stretch_uses = p.stretch_uses + b.requests, total_uses = p.total_uses + b.requests,
    failures = p.failures + b.failures, bans = p.bans + b.bans
FROM b, t WHERE p.id = b.proxy_id AND p.lease_id = b.lease_id AND p.state = 'leased'
RETURNING p.lease_id
"""


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


@dataclass(frozen=True)
class RestPolicy:
    """How long a released proxy rests before anyone may lease it again."""

    rest_seconds: float = 60.0
    ban_rest_seconds: float = 600.0
    ban_rest_max_seconds: float = 6 * 3600.0
    jitter: float = 0.25

    def rest_for(self, reason: str, consecutive_bans: int, rng: random.Random) -> float:
        if reason == "banned":
            base = self.ban_rest_seconds * 2 ** max(consecutive_bans - 1, 0)
            base = min(base, self.ban_rest_max_seconds)
        else:
            base = self.rest_seconds
        if base <= 0:
            return 0.0
        return base * (1 + rng.uniform(-self.jitter, self.jitter))


@dataclass(frozen=True)
class ProxyRow:
    id: int
    url: str = field(repr=False)
    enabled: bool
    state: str
    holder: str | None
    lease_id: int | None
    lease_expires: float | None
    stretch_uses: int
    total_uses: int
    failures: int
    bans: int
    consecutive_bans: int
    resting_until: float | None
    last_used: float | None

    @property
    def label(self) -> str:
        return redact_url(self.url)

    def effective_state(self, now: float) -> str:
        """The state as a person means it: an expired lease or a rest that ended is free."""
        if not self.enabled:
            return "disabled"
        if self.state == "leased":
            return "expired" if (self.lease_expires or 0) < now else "leased"
        if self.resting_until and self.resting_until > now:
            return self.state
        return "free"


@dataclass(frozen=True)
class UsageRow:
    id: int
    proxy_id: int
    host: str
    pid: int
    task: str
    started: float
    ended: float | None
    requests: int
    bytes: int
    failures: int
    bans: int
    end_reason: str | None
    waited: float = 0.0


class ProxyPool:
    """The proxy tables of one hub: managing the pool, leasing, usage."""

    # Every lease moves its proxy to the end of hub_proxies_lru and leaves a dead entry
    # at the head, where every pick starts. Autovacuum visits a table once a minute at
    # best: at 5,000 leases a second, picks came to wade through hundreds of index pages
    # of dead entries and the hub slowed by a quarter within 15 s. So each process, every
    # VACUUM_CHECK_EVERY lease operations, vacuums the table if no one has in the last
    # VACUUM_SECONDS (about 10 ms of server time for 10,000 proxies).
    VACUUM_CHECK_EVERY = 500
    VACUUM_SECONDS = 2.0

    def __init__(self, hub: Hub, rng: random.Random | None = None) -> None:
        self.hub = hub
        self._rng = rng or random.Random()
        self._operations = 0
        self._vacuum_failed = False
        hub.migrate("hub_schema", _MIGRATIONS, _SCHEMA_LOCK)

    def schema_version(self) -> int:
        return self.hub.version("hub_schema")

    # --- managing the pool --------------------------------------------------------
    def add(self, urls: Iterable[str]) -> tuple[int, int]:
        """Add proxies (validated first, all or none); return (added, already there)."""
        normalized = [normalize_proxy_url(url) for url in urls]
        added = 0
        with self.hub.transaction() as tx:
            for url in dict.fromkeys(normalized):
                if tx.execute("SELECT id FROM hub_proxies WHERE url = ?", (url,)).fetchone():
                    continue
                tx.execute("INSERT INTO hub_proxies (url, added) VALUES (?, NOW())", (url,))
                added += 1
        return added, len(normalized) - added

    def find(self, ref: str) -> ProxyRow:
        """A proxy by id, by URL, or by the redacted URL that ``list`` shows."""
        rows = self.proxies()
        ref = ref.strip()
        if ref.isdigit():
            matches = [row for row in rows if row.id == int(ref)]
        else:
            try:
                url = normalize_proxy_url(ref)
            except InvalidProxyURLError:
                url = ref
            matches = [row for row in rows if url in (row.url, row.label)]
        if len(matches) != 1:
            what = "no proxy" if not matches else f"{len(matches)} proxies"
            raise HubError(
                f"{what} in the hub match {redact_url(ref)!r}: give an id or a URL "
                "as `scrapy proxies list` shows it"
            )
        return matches[0]

    def set_enabled(self, proxy_id: int, enabled: bool) -> None:
        self.hub.execute(
            "UPDATE hub_proxies SET enabled = ? WHERE id = ?", (int(enabled), proxy_id)
        )

    def end_rest(self, proxy_id: int | None = None) -> None:
        """Let resting or banned proxies (all, or one) be leased again at once."""
        sql = "UPDATE hub_proxies SET resting_until = NULL"
        if proxy_id is None:
            self.hub.execute(sql)
        else:
            self.hub.execute(sql + " WHERE id = ?", (proxy_id,))

    def proxies(self) -> list[ProxyRow]:
        rows = self.hub.query(f"SELECT {_PROXY_COLUMNS} FROM hub_proxies ORDER BY id")
        return [_proxy_row(row) for row in rows]

    def enabled_count(self) -> int:
        return int(self.hub.query("SELECT COUNT(*) FROM hub_proxies WHERE enabled = 1")[0][0])

    def usage(self, proxy_id: int | None = None) -> list[UsageRow]:
        sql = f"SELECT {_USAGE_COLUMNS} FROM hub_proxy_usage"
        params: tuple[Any, ...] = ()
        if proxy_id is not None:
            sql, params = sql + " WHERE proxy_id = ?", (proxy_id,)
        rows = self.hub.query(sql + " ORDER BY id", params)
        return [UsageRow(*row) for row in rows]

    def usage_stats(self) -> list[dict[str, Any]]:
        """Per proxy, over its usage rows: leases, requests, bytes, failures, bans."""
        rows = self.hub.query(
            "SELECT p.id, p.url, p.enabled, COUNT(u.id), COALESCE(SUM(u.requests), 0), "
            "COALESCE(SUM(u.bytes), 0), COALESCE(SUM(u.failures), 0), "
            "COALESCE(SUM(u.bans), 0) "
            "FROM hub_proxies p LEFT JOIN hub_proxy_usage u ON u.proxy_id = p.id "
            "GROUP BY p.id, p.url, p.enabled ORDER BY p.id"
        )
        keys = ("id", "url", "enabled", "leases", "requests", "bytes", "failures", "bans")
        stats = []
        for row in rows:
            values = (v if k == "url" else int(v) for k, v in zip(keys, row, strict=True))
            item = dict(zip(keys, values, strict=True))
            item["enabled"] = bool(item["enabled"])
            item["label"] = redact_url(item.pop("url"))
            item["ban_rate"] = item["bans"] / item["requests"] if item["requests"] else 0.0
            stats.append(item)
        return stats

    def host_stats(self, since: float) -> list[dict[str, Any]]:
        """Per host: leases held now; leases taken, requests sent and the wait for a
        proxy (mean, max) since the hub time *since*."""
        rows = self.hub.query(
            "SELECT u.host, SUM(CASE WHEN u.ended IS NULL AND p.lease_id = u.id "
            "AND p.lease_expires >= NOW() THEN 1 ELSE 0 END), "
            "SUM(CASE WHEN u.started >= ? THEN 1 ELSE 0 END), "
            "SUM(CASE WHEN u.started >= ? THEN u.requests ELSE 0 END), "
            "AVG(CASE WHEN u.started >= ? THEN u.waited END), "
            "MAX(CASE WHEN u.started >= ? THEN u.waited END) "
            "FROM hub_proxy_usage u LEFT JOIN hub_proxies p ON p.id = u.proxy_id "
            "WHERE u.ended IS NULL OR u.started >= ? GROUP BY u.host ORDER BY u.host",
            (since,) * 5,
        )
        keys = ("host", "held", "leases", "requests", "wait_mean", "wait_max")
        return [dict(zip(keys, row, strict=True)) for row in rows]

    # --- leases -------------------------------------------------------------------
    def acquire(self, holder: Holder, ttl: float, waited: float = 0.0) -> Lease | None:
        """Lease the least recently used free proxy for *ttl* seconds, or return None.

        *waited*: how long the holder has had requests waiting for a proxy (for stats)."""
        if self.hub.dialect.name == "postgresql":
            row = self.hub.query(_PG_ACQUIRE, (0, *_take_params(holder, ttl, waited)))[0]
            self._count_operation()
            return _taken(*row, ttl)
        return self._acquire_sqlite(holder, ttl, waited)

    def _acquire_sqlite(
        self, holder: Holder, ttl: float, waited: float, avoid: int = 0
    ) -> Lease | None:
        with self.hub.transaction() as tx:
            row = tx.execute(
                "SELECT id, url, state, lease_id, lease_expires FROM hub_proxies "
                "WHERE enabled = 1 AND (state <> 'leased' OR lease_expires < NOW()) "
                "AND COALESCE(resting_until, 0) <= NOW() AND id <> ? "
                "ORDER BY COALESCE(last_used, 0), id LIMIT 1",
                (avoid,),
            ).fetchone()
            if row is None:
                return None
            proxy_id, url, state, old_lease, old_expires = row
            if state == "leased" and old_lease is not None:
                tx.execute(
                    "UPDATE hub_proxy_usage SET ended = ?, end_reason = 'expired' "
                    "WHERE id = ? AND ended IS NULL",
                    (old_expires, old_lease),
                )
            lease_id, started = tx.execute(
                "INSERT INTO hub_proxy_usage (proxy_id, host, pid, task, waited, started) "
                "VALUES (?, ?, ?, ?, ?, NOW()) RETURNING id, started",
                (proxy_id, holder.host, holder.pid, holder.task, waited),
            ).fetchone()
            expires = started + ttl
            tx.execute(
                "UPDATE hub_proxies SET state = 'leased', holder = ?, lease_id = ?, "
                "lease_expires = ?, stretch_uses = 0, last_used = ? WHERE id = ?",
                (str(holder), lease_id, expires, started, proxy_id),
            )
        return Lease(lease_id, proxy_id, url, redact_url(url), started, expires)

    def renew(self, lease: Lease, ttl: float, counts: UsageCounts | None = None) -> bool:
        """Extend a lease by *ttl* from now and record usage; False if the lease was lost."""
        counts = counts or UsageCounts()
        if self.hub.dialect.name == "postgresql":
            return self.renew_many([(lease, counts)], ttl)[0]
        with self.hub.transaction() as tx:
            _add_usage(tx, lease, counts)
            cur = tx.execute(
                "UPDATE hub_proxies SET lease_expires = NOW() + ?, "
                "stretch_uses = stretch_uses + ?, total_uses = total_uses + ?, "
                "failures = failures + ?, bans = bans + ? "
                "WHERE id = ? AND lease_id = ? AND state = 'leased'",
                (ttl, counts.requests, counts.requests, counts.failures, counts.bans)
                + (lease.proxy_id, lease.lease_id),
            )
            return cur.rowcount == 1

    def renew_many(self, items: Iterable[tuple[Lease, UsageCounts]], ttl: float) -> list[bool]:
        """:meth:`renew` each lease with its counts (a heartbeat); one result per lease.

        One statement for them all on PostgreSQL."""
        items = list(items)
        if self.hub.dialect.name != "postgresql":
            return [self.renew(lease, ttl, counts) for lease, counts in items]
        if not items:
            return []
        columns = [
            [lease.lease_id for lease, _ in items],
            [lease.proxy_id for lease, _ in items],
            [counts.requests for _, counts in items],
            [counts.bytes for _, counts in items],
            [counts.failures for _, counts in items],
            [counts.bans for _, counts in items],
        ]
        renewed = {row[0] for row in self.hub.query(_PG_RENEW, (*columns, ttl))}
        return [lease.lease_id in renewed for lease, _ in items]

    def release(
        self,
        lease: Lease,
        reason: str,
        counts: UsageCounts | None = None,
        policy: RestPolicy | None = None,
    ) -> bool:
        """End a lease: close its usage row and let the proxy rest; False if it was lost."""
        if reason not in END_REASONS:
            raise ValueError(f"release reason {reason!r} is not one of {END_REASONS}")
        counts, policy = counts or UsageCounts(), policy or RestPolicy()
        if self.hub.dialect.name == "postgresql":
            return self._release_pg(lease, reason, counts, policy)
        with self.hub.transaction() as tx:
            _add_usage(tx, lease, counts)
            row = tx.execute(
                "SELECT consecutive_bans FROM hub_proxies WHERE id = ? AND lease_id = ?"
                + tx.dialect.for_update,
                (lease.proxy_id, lease.lease_id),
            ).fetchone()
            if row is None:
                return False
            streak = row[0] + 1 if reason == "banned" else 0
            rested = counts.requests > 0 or reason == "banned" or _used(tx, lease)
            rest = policy.rest_for(reason, streak, self._rng) if rested else 0.0
            tx.execute(
                "UPDATE hub_proxy_usage SET ended = NOW(), end_reason = ? "
                "WHERE id = ? AND ended IS NULL",
                (reason, lease.lease_id),
            )
            state = "banned" if reason == "banned" else ("resting" if rest > 0 else "free")
            tx.execute(
                "UPDATE hub_proxies SET state = ?, holder = NULL, lease_id = NULL, "
                "lease_expires = NULL, resting_until = NOW() + ?, consecutive_bans = ?, "
                "total_uses = total_uses + ?, failures = failures + ?, bans = bans + ?, "
                "stretch_uses = stretch_uses + ?, last_used = NOW() WHERE id = ?",
                (state, rest, streak, counts.requests, counts.failures, counts.bans)
                + (counts.requests, lease.proxy_id),
            )
        return True

    def rotate(
        self,
        lease: Lease,
        reason: str,
        counts: UsageCounts,
        policy: RestPolicy,
        holder: Holder,
        ttl: float,
        waited: float = 0.0,
    ) -> tuple[bool, Lease | None]:
        """:meth:`release` *lease*, then :meth:`acquire` the next (never the same proxy):
        (whether the release found the lease, the new lease or None). One call of
        ``hub_rotate`` on PostgreSQL."""
        if reason not in END_REASONS:
            raise ValueError(f"release reason {reason!r} is not one of {END_REASONS}")
        if self.hub.dialect.name != "postgresql":
            released = self.release(lease, reason, counts, policy)
            return released, self._acquire_sqlite(holder, ttl, waited, lease.proxy_id)
        params = self._release_params(lease, reason, counts, policy)
        params += _take_params(holder, ttl, waited)
        released, *taken = self.hub.query(_PG_ROTATE, params)[0]
        self._count_operation()
        return bool(released), _taken(*taken, ttl)

    def _release_pg(
        self, lease: Lease, reason: str, counts: UsageCounts, policy: RestPolicy
    ) -> bool:
        params = self._release_params(lease, reason, counts, policy)
        released = bool(self.hub.query(_PG_RELEASE, params)[0][0])
        self._count_operation()
        return released

    def _count_operation(self) -> None:
        self._operations += 1
        if self._operations % self.VACUUM_CHECK_EVERY:
            return
        try:
            self.vacuum_if_due()
        except Exception as exc:  # upkeep: the lease operation before it has succeeded
            if not self._vacuum_failed:
                logger.warning(
                    "Could not vacuum the proxy table of the hub %s (%s); leasing goes on, "
                    "slower as dead index entries pile up until autovacuum comes",
                    self.hub.label,
                    exc,
                )
            self._vacuum_failed = True

    def vacuum_if_due(self) -> bool:
        """Vacuum the proxy table unless another process did in the last
        ``VACUUM_SECONDS`` or is at it now (PostgreSQL); whether this call did."""
        if self.hub.dialect.name != "postgresql":
            return False
        if not self.hub.query(_PG_VACUUM_DUE, (self.VACUUM_SECONDS, _VACUUM_LOCK))[0][0]:
            return False
        try:
            # SKIP_LOCKED: a vacuum already running (autovacuum's) is enough.
            self.hub.execute("VACUUM (SKIP_LOCKED) hub_proxies")
        finally:
            with suppress(HubError):  # a lost session has let go of the lock already
                self.hub.query("SELECT pg_advisory_unlock(?)", (_VACUUM_LOCK,))
        return True

    def _release_params(
        self, lease: Lease, reason: str, counts: UsageCounts, policy: RestPolicy
    ) -> tuple[Any, ...]:
        factor = 1 + self._rng.uniform(-policy.jitter, policy.jitter)
        return (
            (lease.proxy_id, lease.lease_id)
            + (counts.requests, counts.bytes, counts.failures, counts.bans, reason)
            + (max(policy.rest_seconds, 0.0), policy.ban_rest_seconds)
            + (policy.ban_rest_max_seconds, factor)
        )

    def release_many(
        self, ends: Iterable[tuple[Lease, str, UsageCounts]], policy: RestPolicy | None = None
    ) -> list[bool]:
        """:meth:`release` each (lease, reason, counts); one result per lease."""
        return [self.release(lease, reason, counts, policy) for lease, reason, counts in ends]


def _take_params(holder: Holder, ttl: float, waited: float) -> tuple[Any, ...]:
    return (holder.host, holder.pid, holder.task, waited, str(holder), ttl)


def _taken(
    proxy_id: int | None, url: str | None, lease_id: int, started: float, ttl: float
) -> Lease | None:
    """The lease hub_take returned (its fields NULL when no proxy was free)."""
    if proxy_id is None or url is None:
        return None
    return Lease(lease_id, proxy_id, url, redact_url(url), started, started + ttl)


def _used(tx: Transaction, lease: Lease) -> bool:
    row = tx.execute(
        "SELECT requests FROM hub_proxy_usage WHERE id = ?", (lease.lease_id,)
    ).fetchone()
    return bool(row and row[0])


def _add_usage(tx: Transaction, lease: Lease, counts: UsageCounts) -> None:
    if not (counts.requests or counts.bytes or counts.failures or counts.bans):
        return
    tx.execute(
        "UPDATE hub_proxy_usage SET requests = requests + ?, bytes = bytes + ?, "
        "failures = failures + ?, bans = bans + ? WHERE id = ?",
        (counts.requests, counts.bytes, counts.failures, counts.bans, lease.lease_id),
    )


def _proxy_row(row: tuple[Any, ...]) -> ProxyRow:
    values = list(row)
    values[2] = bool(values[2])
    return ProxyRow(*values)
