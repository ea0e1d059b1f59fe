"""Proxy leases on a PostgreSQL hub: each operation one call of a plpgsql function, so
that a hub serves thousands of them per second.

The functions (``hub_take``, ``hub_release``, ``hub_rotate``) are defined here and
nowhere else, and installed when a store opens (:func:`install_functions`): under the
proxy schema's advisory lock, and only when what the database holds differs from what
is written here, so that changing one is one edit, in place at the next start. Each
call is one round trip and one transaction, whose statements each read a fresh snapshot
and run a small cached plan. (One statement of CTEs did the same work; with 16 clients
the server spent a fifth more CPU on each rotation, and a pick that locked a proxy taken
after its snapshot held it to the end, stalling that proxy's next release.)

Durability is chosen per call. Taking and rotating commit synchronously: a lease the
hub forgot in a crash could be given to a second holder while the first still uses it.
Releasing commits without waiting for the WAL flush (synchronous_commit off for that
transaction only): a crash of the server loses at most the releases of its last few
hundred milliseconds, whose proxies then stay leased until their TTL runs out and are
taken over, their usage rows closed at the lease's expiry (a later end than the true
one, so intervals read from the usage table never look shorter than they were). A clean
restart loses nothing.

A rotation releases before it picks: it waits, if it waits, for its own lease's row
only, holding no other proxy, so two rotations never wait for each other in a cycle.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Iterable
from typing import Any

from crawler.hub.db import Hub
from crawler.hub.identity import Holder
from crawler.hub.lease_store import (
    LINE_MINUTE,
    Lease,
    LeaseStore,
    Place,
    RestPolicy,
    UsageCounts,
    line_terms,
)
from crawler.hub.locks import AdvisoryLock
from crawler.hub.upkeep import Vacuuming
from crawler.redact import redact_url

logger = logging.getLogger(__name__)

# p_claim, p_weight, p_line_ttl: lease_store.line_terms(); p_minute: LINE_MINUTE.
_TAKE_HEAD = """(
    p_avoid BIGINT, p_host TEXT, p_pid INTEGER, p_task TEXT, p_waited DOUBLE PRECISION,
    p_holder TEXT, p_ttl DOUBLE PRECISION, p_crawl TEXT, p_claim DOUBLE PRECISION,
    p_weight DOUBLE PRECISION, p_line_ttl DOUBLE PRECISION, p_minute DOUBLE PRECISION,
    OUT new_proxy BIGINT, OUT new_url TEXT, OUT new_lease BIGINT,
    OUT new_started DOUBLE PRECISION
) LANGUAGE plpgsql"""
_TAKE_BODY = """
DECLARE
    t DOUBLE PRECISION := NOW();
    picked RECORD;
    got BOOLEAN := FALSE;
    ahead BIGINT := 0;
    n_free BIGINT := 0;
BEGIN
    IF p_claim IS NOT NULL THEN
        -- The line: a free proxy is taken only when more are free than live waiters
        -- have a stronger claim.
        SELECT COUNT(*) INTO ahead FROM hub_proxy_waiters
        WHERE holder <> p_holder AND expires >= t AND weight + (t - since) / p_minute > p_claim;
        IF ahead > 0 THEN
            SELECT COUNT(*) INTO n_free FROM (SELECT 1 FROM hub_proxies
                WHERE enabled = 1 AND (state <> 'leased' OR lease_expires < t)
                    AND COALESCE(resting_until, 0) <= t AND id <> p_avoid
                LIMIT ahead + 1) f;
        END IF;
    END IF;
    IF ahead = 0 OR n_free > ahead THEN
        -- The least recently used free proxy, from the head of hub_proxies_lru.
        SELECT id, url, state, lease_id, lease_expires INTO picked FROM hub_proxies
        WHERE enabled = 1 AND (state <> 'leased' OR lease_expires < t)
            AND COALESCE(resting_until, 0) <= t AND id <> p_avoid
        ORDER BY COALESCE(last_used, 0), id LIMIT 1 FOR UPDATE SKIP LOCKED;
        got := FOUND;
    END IF;
    IF NOT got AND (ahead = 0 OR n_free > ahead) AND p_crawl <> '' THEN
        -- None free: a rest this crawl's earlier process caused is not waited out by
        -- its rerun, unless a stronger claim waits. A query of its own, so that the
        -- pick above keeps to its index.
        SELECT id, url, state, lease_id, lease_expires INTO picked FROM hub_proxies
        WHERE enabled = 1 AND state = 'resting' AND rest_crawl = p_crawl
            AND rest_pid <> p_pid AND id <> p_avoid
        ORDER BY COALESCE(last_used, 0), id LIMIT 1 FOR UPDATE SKIP LOCKED;
        got := FOUND;
    END IF;
    IF NOT got THEN
        IF p_weight IS NOT NULL THEN
            -- Places lapsed a while ago go; about one row per waiting process stays.
            DELETE FROM hub_proxy_waiters WHERE expires < t - p_line_ttl;
            INSERT INTO hub_proxy_waiters (holder, since, weight, expires)
            VALUES (p_holder, t - GREATEST(p_waited, 0), p_weight, t + p_line_ttl)
            ON CONFLICT (holder) DO UPDATE SET since = EXCLUDED.since,
                weight = EXCLUDED.weight, expires = EXCLUDED.expires;
        END IF;
        RETURN;
    END IF;
    IF p_claim IS NOT NULL THEN
        DELETE FROM hub_proxy_waiters WHERE holder = p_holder;
    END IF;
    IF picked.state = 'leased' THEN
        UPDATE hub_proxy_usage SET ended = picked.lease_expires, end_reason = 'expired'
        WHERE id = picked.lease_id AND ended IS NULL;
    END IF;
    INSERT INTO hub_proxy_usage (proxy_id, host, pid, task, waited, started)
    VALUES (picked.id, p_host, p_pid, p_task, p_waited, t) RETURNING id INTO new_lease;
    UPDATE hub_proxies SET state = 'leased', holder = p_holder, lease_id = new_lease,
        lease_expires = t + p_ttl, stretch_uses = 0, last_used = t, lease_crawl = p_crawl
    WHERE id = picked.id;
    new_proxy := picked.id;
    new_url := picked.url;
    new_started := t;
END
"""

# A lost lease (the proxy taken over after its TTL) keeps its counts; its end is the
# taker's to write. p_rest and p_ban_rests are RestPolicy.rests(): the rest after a used
# lease, and after the 1st, 2nd... ban in a row.
_RELEASE_HEAD = """(
    p_proxy BIGINT, p_lease BIGINT, p_requests BIGINT, p_bytes BIGINT, p_failures BIGINT,
    p_bans BIGINT, p_reason TEXT, p_rest DOUBLE PRECISION, p_ban_rests DOUBLE PRECISION[]
) RETURNS BOOLEAN LANGUAGE plpgsql"""
_RELEASE_BODY = """
DECLARE
    t DOUBLE PRECISION := NOW();
    banned BOOLEAN := p_reason = 'banned';
    streak INTEGER;
    used BIGINT;
    taker INTEGER;
    rest DOUBLE PRECISION := p_rest;
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
    WHERE id = p_lease RETURNING requests, pid INTO used, taker;
    IF banned THEN
        rest := p_ban_rests[LEAST(streak + 1, cardinality(p_ban_rests))];
    ELSIF COALESCE(used, 0) = 0 THEN
        rest := 0.0;
    END IF;
    UPDATE hub_proxies SET
        state = CASE WHEN banned THEN 'banned' WHEN rest > 0 THEN 'resting' ELSE 'free' END,
        holder = NULL, lease_id = NULL, lease_expires = NULL, resting_until = t + rest,
        rest_crawl = CASE WHEN banned THEN NULL ELSE lease_crawl END, rest_pid = taker,
        consecutive_bans = CASE WHEN banned THEN streak + 1 ELSE 0 END,
        total_uses = total_uses + p_requests, failures = failures + p_failures,
        bans = bans + p_bans, stretch_uses = stretch_uses + p_requests, last_used = t
    WHERE id = p_proxy;
    RETURN TRUE;
END
"""

_ROTATE_HEAD = """(
    p_proxy BIGINT, p_lease BIGINT, p_requests BIGINT, p_bytes BIGINT, p_failures BIGINT,
    p_bans BIGINT, p_reason TEXT, p_rest DOUBLE PRECISION, p_ban_rests DOUBLE PRECISION[],
    p_host TEXT, p_pid INTEGER, p_task TEXT, p_waited DOUBLE PRECISION, p_holder TEXT,
    p_ttl DOUBLE PRECISION, p_crawl TEXT, p_claim DOUBLE PRECISION, p_weight DOUBLE PRECISION,
    p_line_ttl DOUBLE PRECISION, p_minute DOUBLE PRECISION, OUT released BOOLEAN,
    OUT new_proxy BIGINT, OUT new_url TEXT, OUT new_lease BIGINT,
    OUT new_started DOUBLE PRECISION
) LANGUAGE plpgsql"""
_ROTATE_BODY = """
BEGIN
    released := hub_release(p_proxy, p_lease, p_requests, p_bytes, p_failures, p_bans,
        p_reason, p_rest, p_ban_rests);
    SELECT * INTO new_proxy, new_url, new_lease, new_started
    FROM hub_take(p_proxy, p_host, p_pid, p_task, p_waited, p_holder, p_ttl, p_crawl,
        p_claim, p_weight, p_line_ttl, p_minute);
END
"""

FUNCTIONS = {
    "hub_take": (_TAKE_HEAD, _TAKE_BODY),
    "hub_release": (_RELEASE_HEAD, _RELEASE_BODY),
    "hub_rotate": (_ROTATE_HEAD, _ROTATE_BODY),
}


def _tag(name: str) -> str:
    """A line in the function's source naming its definition: the database's copy is
    current when it holds this line."""
    head, body = FUNCTIONS[name]
    return "-- definition " + hashlib.sha256(f"{name}{head}{body}".encode()).hexdigest()[:16]


def install_functions(hub: Hub) -> bool:
    """Create the lease functions in the hub's schema, or replace them where they differ
    from their definitions here (other versions of them dropped); whether it did. Safe
    from many processes at once: the proxy schema's lock serialises them."""
    names = list(FUNCTIONS)
    with hub.transaction() as tx:
        tx.lock(AdvisoryLock.PROXY_SCHEMA)
        rows = tx.execute(
            "SELECT p.oid::regprocedure::text, p.proname, p.prosrc FROM pg_proc p "
            "WHERE p.pronamespace = current_schema()::regnamespace AND p.proname = ANY(?)",
            (names,),
        ).fetchall()
        current = {name for _, name, source in rows if _tag(name) in source}
        if len(rows) == len(names) and current == set(names):
            return False
        for signature, _, _ in rows:
            tx.execute(f"DROP FUNCTION {signature}")
        for name, (head, body) in FUNCTIONS.items():
            source = f"\n{_tag(name)}{body}"
            tx.execute(f"CREATE OR REPLACE FUNCTION {name}{head} AS $${source}$$")
    return True


# Parameters: the proxy to pass over (0: none), holder's host, pid and task, seconds
# waited, the holder, the TTL, the holder's crawl, then the line's (_take_params).
_ACQUIRE = "SELECT * FROM hub_take(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
# Parameters: proxy id, lease id, counts (requests, bytes, failures, bans), reason, rest
# seconds, ban rests.
_RELEASE = (
    "SELECT hub_release(?, ?, ?, ?, ?, ?, ?, ?, ?::float8[]), "
    "set_config('synchronous_commit', 'off', true)"
)
# Parameters: those of _RELEASE, then those of _ACQUIRE but the first.
_ROTATE = (
    "SELECT * FROM hub_rotate(?, ?, ?, ?, ?, ?, ?, ?, ?::float8[], ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)

_RENEW = """
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


class PostgresLeaseStore(Vacuuming, LeaseStore):
    # Every lease moves its proxy to the end of hub_proxies_lru and leaves a dead entry
    # at the head, where every pick starts (crawler/hub/upkeep.py): each process, every
    # VACUUM_CHECK_EVERY lease operations, vacuums the table if no one has in the last
    # VACUUM_SECONDS (about 10 ms of server time for 10,000 proxies).
    VACUUM_TABLES = ("hub_proxies",)
    VACUUM_LOCK = AdvisoryLock.PROXY_VACUUM
    VACUUM_CHECK_EVERY = 500
    VACUUM_SECONDS = 2.0
    VACUUM_GOES_ON = "leasing"

    def __init__(self, hub: Hub, rng: random.Random) -> None:
        super().__init__(hub, rng)
        install_functions(hub)

    def acquire(
        self,
        holder: Holder,
        ttl: float,
        waited: float = 0.0,
        avoid: int = 0,
        place: Place | None = None,
    ) -> Lease | None:
        row = self.hub.query(_ACQUIRE, (avoid, *_take_params(holder, ttl, waited, place)))[0]
        self._count_operation()
        return _taken(*row, ttl)

    def renew_many(self, items: Iterable[tuple[Lease, UsageCounts]], ttl: float) -> list[bool]:
        items = list(items)
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
        renewed = {row[0] for row in self.hub.query(_RENEW, (*columns, ttl))}
        return [lease.lease_id in renewed for lease, _ in items]

    def release(self, lease: Lease, reason: str, counts: UsageCounts, policy: RestPolicy) -> bool:
        params = self._release_params(lease, reason, counts, policy)
        released = bool(self.hub.query(_RELEASE, params)[0][0])
        self._count_operation()
        return released

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
        params = self._release_params(lease, reason, counts, policy)
        params += _take_params(holder, ttl, waited, place)
        released, *taken = self.hub.query(_ROTATE, params)[0]
        self._count_operation()
        return bool(released), _taken(*taken, ttl)

    def _release_params(
        self, lease: Lease, reason: str, counts: UsageCounts, policy: RestPolicy
    ) -> tuple[Any, ...]:
        rest, ban_rests = policy.rests(self.rng)
        return (
            (lease.proxy_id, lease.lease_id)
            + (counts.requests, counts.bytes, counts.failures, counts.bans, reason)
            + (rest, ban_rests)
        )


def _take_params(holder: Holder, ttl: float, waited: float, place: Place | None) -> tuple[Any, ...]:
    line = (*line_terms(place, waited), LINE_MINUTE)
    return (holder.host, holder.pid, holder.task, waited, str(holder), ttl, holder.crawl, *line)


def _taken(
    proxy_id: int | None, url: str | None, lease_id: int, started: float, ttl: float
) -> Lease | None:
    """The lease hub_take returned (its fields NULL when no proxy was free)."""
    if proxy_id is None or url is None:
        return None
    return Lease(lease_id, proxy_id, url, redact_url(url), started, started + ttl)
