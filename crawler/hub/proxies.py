"""The hub's proxy pool: its tables, managing them, and the lease store of the backend.

``hub_proxies`` has one row per proxy: its URL, whether it is enabled, and its lease
state (``free``, ``leased`` by one holder until ``lease_expires``, ``resting`` or
``banned`` until ``resting_until``). ``hub_proxy_usage`` has one row per lease: who
held it, what went through it, and how it ended (``END_REASONS``).

Taking, renewing, releasing and rotating leases are a :class:`LeaseStore`'s, one per
backend (``lease_sqlite``, ``lease_postgres``), picked here by the hub's backend;
:class:`ProxyPool` checks their arguments and hands them over. No proxy ever has two
live holders; a lease whose holder stopped renewing it expires and is taken over;
releasing it lets the proxy rest (:class:`RestPolicy`) before anyone may lease it again.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from crawler.hub.db import Hub, Migration
from crawler.hub.errors import HubError, InvalidProxyURLError
from crawler.hub.identity import Holder
from crawler.hub.lease_postgres import PostgresLeaseStore
from crawler.hub.lease_sqlite import SQLiteLeaseStore
from crawler.hub.lease_store import (
    END_REASONS,
    Lease,
    LeaseStore,
    Place,
    RestPolicy,
    UsageCounts,
)
from crawler.hub.locks import AdvisoryLock
from crawler.hub.redact import normalize_proxy_url
from crawler.redact import redact_url

SCHEMA_VERSION = 6
_STORES: dict[str, type[LeaseStore]] = {
    "sqlite": SQLiteLeaseStore,
    "postgresql": PostgresLeaseStore,
}

_PROXY_COLUMNS = (
    "id, url, enabled, state, holder, lease_id, lease_expires, stretch_uses, total_uses, "
    "failures, bans, consecutive_bans, resting_until, last_used"
)
_USAGE_COLUMNS = (
    "id, proxy_id, host, pid, task, started, ended, requests, bytes, failures, bans, "
    "end_reason, waited"
)

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
    # Version 4 created PostgreSQL's lease functions; lease_postgres installs them at
    # start since, so that changing one is one edit. The number stays taken.
    4: [],
    # Which crawl held a proxy, and which crawl and process made it rest: a rerun of
    # the same crawl (another process) does not wait for a rest that was its own.
    5: [
        "ALTER TABLE hub_proxies ADD COLUMN lease_crawl TEXT",
        "ALTER TABLE hub_proxies ADD COLUMN rest_crawl TEXT",
        "ALTER TABLE hub_proxies ADD COLUMN rest_pid INTEGER",
    ],
    # The line of processes waiting for a proxy (lease_store.Place): since when each
    # waits, the weight of its work left, and when its place lapses unless asked again.
    6: [
        """CREATE TABLE IF NOT EXISTS hub_proxy_waiters (
            holder TEXT PRIMARY KEY,
            since {real} NOT NULL,
            weight {real} NOT NULL,
            expires {real} NOT NULL
        )""",
    ],
}


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
class PoolOutlook:
    """What :meth:`ProxyPool.outlook` found: at the hub's time *now*, the enabled
    proxies, those leased, and the proxy whose rest or ban ends first (None: none rests)."""

    now: float
    enabled: int
    leased: int
    next_id: int | None
    next_state: str | None
    next_free_at: float | None

    @property
    def next_free_in(self) -> float | None:
        return None if self.next_free_at is None else max(self.next_free_at - self.now, 0.0)


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

    def __init__(self, hub: Hub, rng: random.Random | None = None) -> None:
        self.hub = hub
        hub.migrate("hub_schema", _MIGRATIONS, AdvisoryLock.PROXY_SCHEMA)
        self.store: LeaseStore = _STORES[hub.backend](hub, rng or random.Random())

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

    def unban(self, proxy_id: int | None = None) -> list[int]:
        """Lift the bans of banned proxies (all, or one): they may be leased at once, and
        a later ban rests the first ban's rest again. Returns the ids whose ban was on."""
        where, params = ("WHERE state = 'banned'", ())
        if proxy_id is not None:
            where, params = where + " AND id = ?", (proxy_id,)
        with self.hub.transaction() as tx:
            live = tx.execute(
                f"SELECT id FROM hub_proxies {where} AND resting_until > NOW() ORDER BY id",
                params,
            ).fetchall()
            tx.execute(
                "UPDATE hub_proxies SET state = 'free', resting_until = NULL, "
                f"consecutive_bans = 0 {where}",
                params,
            )
        return [row[0] for row in live]

    def outlook(self) -> PoolOutlook:
        """The enabled proxies now: how many are leased, and whose rest or ban ends next."""
        with self.hub.transaction() as tx:
            now, enabled, leased = tx.execute(
                "SELECT NOW(), COUNT(*), COALESCE(SUM(CASE WHEN state = 'leased' "
                "AND lease_expires >= NOW() THEN 1 ELSE 0 END), 0) "
                "FROM hub_proxies WHERE enabled = 1"
            ).fetchone()
            rest = tx.execute(
                "SELECT id, state, resting_until FROM hub_proxies WHERE enabled = 1 "
                "AND state <> 'leased' AND resting_until > NOW() "
                "ORDER BY resting_until, id LIMIT 1"
            ).fetchone()
        return PoolOutlook(float(now), int(enabled), int(leased), *(rest or (None, None, None)))

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

    # --- leases (the store of the hub's backend) --------------------------------------
    def acquire(
        self, holder: Holder, ttl: float, waited: float = 0.0, place: Place | None = None
    ) -> Lease | None:
        """Lease the least recently used free proxy for *ttl* seconds, or return None.

        *waited*: how long the holder has had requests waiting for a proxy (kept with the
        lease, and its claim in the line); *place*: the holder's place in the line of
        waiters (None: take any free proxy)."""
        return self.store.acquire(holder, ttl, waited, place=place)

    def renew(self, lease: Lease, ttl: float, counts: UsageCounts | None = None) -> bool:
        """Extend a lease by *ttl* from now and record usage; False if the lease was lost."""
        return self.store.renew_many([(lease, counts or UsageCounts())], ttl)[0]

    def renew_many(self, items: Iterable[tuple[Lease, UsageCounts]], ttl: float) -> list[bool]:
        """:meth:`renew` each lease with its counts (a heartbeat); one result per lease."""
        return self.store.renew_many(items, ttl)

    def release(
        self,
        lease: Lease,
        reason: str,
        counts: UsageCounts | None = None,
        policy: RestPolicy | None = None,
    ) -> bool:
        """End a lease: close its usage row and let the proxy rest; False if it was lost."""
        _check_reason(reason)
        return self.store.release(lease, reason, counts or UsageCounts(), policy or RestPolicy())

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
        """:meth:`release` *lease*, then :meth:`acquire` the next (never the same proxy):
        (whether the release found the lease, the new lease or None). One call of
        ``hub_rotate`` on PostgreSQL."""
        _check_reason(reason)
        return self.store.rotate(lease, reason, counts, policy, holder, ttl, waited, place)

    def leave_line(self, holder: Holder) -> None:
        """Give up *holder*'s place in the line of waiters (it stopped waiting)."""
        self.hub.execute("DELETE FROM hub_proxy_waiters WHERE holder = ?", (str(holder),))

    def release_many(
        self, ends: Iterable[tuple[Lease, str, UsageCounts, RestPolicy]]
    ) -> list[bool]:
        """:meth:`release` each (lease, reason, counts, policy); one result per lease."""
        ends = list(ends)
        for _, reason, _, _ in ends:
            _check_reason(reason)
        return self.store.release_many(ends)


def recent_bans(hub: Hub, since: float) -> list[dict[str, Any]]:
    """Bans and requests per proxy and lease holder (host, pid) over the leases live
    or ended since the hub time *since*, with each proxy's state now: what the live
    views list as the proxies most banned. Reads the tables as they are, creating and
    upgrading nothing (call it when the hub has ``hub_proxies``)."""
    rows = hub.query(
        "SELECT p.id, p.url, CASE WHEN p.enabled = 0 THEN 'disabled' "
        "WHEN p.state = 'leased' AND p.lease_expires >= NOW() THEN 'leased' "
        "WHEN p.state <> 'leased' AND p.resting_until > NOW() THEN p.state "
        "ELSE 'free' END, u.host, u.pid, SUM(u.bans), SUM(u.requests) "
        "FROM hub_proxy_usage u JOIN hub_proxies p ON p.id = u.proxy_id "
        "WHERE u.ended IS NULL OR u.ended >= ? "
        "GROUP BY p.id, p.url, p.enabled, p.state, p.lease_expires, p.resting_until, "
        "u.host, u.pid",
        (since,),
    )
    keys = ("id", "label", "state", "host", "pid", "bans", "requests")
    return [
        dict(zip(keys, (id_, redact_url(url), state, host, int(pid), int(b), int(r)), strict=True))
        for id_, url, state, host, pid, b, r in rows
    ]


def _check_reason(reason: str) -> None:
    if reason not in END_REASONS:
        raise ValueError(f"release reason {reason!r} is not one of {END_REASONS}")


def _proxy_row(row: tuple[Any, ...]) -> ProxyRow:
    values = list(row)
    values[2] = bool(values[2])
    return ProxyRow(*values)
