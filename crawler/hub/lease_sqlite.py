"""Proxy leases on a SQLite hub: each operation a few statements in one ``BEGIN
IMMEDIATE`` transaction, which holds the whole database, so no row locks are needed.

The same steps as ``lease_postgres``'s functions, in the same order; the scenario of
``tests/test_lease_store.py`` holds them to the same results.
"""

from __future__ import annotations

from collections.abc import Iterable

from crawler.hub.db import Transaction
from crawler.hub.identity import Holder
from crawler.hub.lease_store import (
    LINE_MINUTE,
    Lease,
    LeaseStore,
    Place,
    RestPolicy,
    UsageCounts,
    ban_rest,
    line_terms,
)
from crawler.redact import redact_url

_FREE = (
    "enabled = 1 AND (state <> 'leased' OR lease_expires < NOW()) "
    "AND COALESCE(resting_until, 0) <= NOW() AND id <> ?"
)
# Live waiters other than the taker whose claim beats its own. Parameters: the taker,
# LINE_MINUTE, the taker's claim.
_AHEAD = (
    "SELECT COUNT(*) FROM hub_proxy_waiters WHERE holder <> ? AND expires >= NOW() "
    "AND weight + (NOW() - since) / ? > ?"
)
# With none free, a rest the taker's own crawl caused (a proxy it released, not banned)
# is not waited out by another process of it: a rerun. Parameters: the taker's crawl and
# pid, the proxy to pass over.
_OWN_REST = (
    "SELECT id, url, state, lease_id, lease_expires FROM hub_proxies "
    "WHERE enabled = 1 AND state = 'resting' AND rest_crawl = ? AND rest_pid <> ? AND id <> ? "
    "ORDER BY COALESCE(last_used, 0), id LIMIT 1"
)


class SQLiteLeaseStore(LeaseStore):
    def acquire(
        self,
        holder: Holder,
        ttl: float,
        waited: float = 0.0,
        avoid: int = 0,
        place: Place | None = None,
    ) -> Lease | None:
        claim, weight, line_ttl = line_terms(place, waited)
        with self.hub.transaction() as tx:
            row = None
            # A stronger claim in the line goes first, for a rest of its own crawl too.
            served = claim is None or _line_lets(tx, str(holder), avoid, claim)
            if served:
                row = tx.execute(
                    f"SELECT id, url, state, lease_id, lease_expires FROM hub_proxies "
                    f"WHERE {_FREE} ORDER BY COALESCE(last_used, 0), id LIMIT 1",
                    (avoid,),
                ).fetchone()
            if row is None and served and holder.crawl:
                row = tx.execute(_OWN_REST, (holder.crawl, holder.pid, avoid)).fetchone()
            if row is None:
                if weight is not None:
                    _keep_place(tx, str(holder), waited, weight, line_ttl)
                return None
            if claim is not None:
                tx.execute("DELETE FROM hub_proxy_waiters WHERE holder = ?", (str(holder),))
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
                "lease_expires = ?, stretch_uses = 0, last_used = ?, lease_crawl = ? "
                "WHERE id = ?",
                (str(holder), lease_id, expires, started, holder.crawl, proxy_id),
            )
        return Lease(lease_id, proxy_id, url, redact_url(url), started, expires)

    def renew_many(self, items: Iterable[tuple[Lease, UsageCounts]], ttl: float) -> list[bool]:
        return [self._renew(lease, ttl, counts) for lease, counts in items]

    def _renew(self, lease: Lease, ttl: float, counts: UsageCounts) -> bool:
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

    def release(self, lease: Lease, reason: str, counts: UsageCounts, policy: RestPolicy) -> bool:
        # A lost lease (the proxy taken over after its TTL) keeps its counts; its end is
        # the taker's to write.
        rest, ban_rests = policy.rests(self.rng)
        banned = reason == "banned"
        with self.hub.transaction() as tx:
            _add_usage(tx, lease, counts)
            row = tx.execute(
                "SELECT consecutive_bans FROM hub_proxies WHERE id = ? AND lease_id = ?",
                (lease.proxy_id, lease.lease_id),
            ).fetchone()
            if row is None:
                return False
            streak = row[0]
            used = tx.execute(
                "UPDATE hub_proxy_usage SET ended = COALESCE(ended, NOW()), "
                "end_reason = CASE WHEN ended IS NULL THEN ? ELSE end_reason END "
                "WHERE id = ? RETURNING requests",
                (reason, lease.lease_id),
            ).fetchone()
            if banned:
                rest = ban_rest(ban_rests, streak)
            elif not (used and used[0]):
                rest = 0.0
            state = "banned" if banned else ("resting" if rest > 0 else "free")
            tx.execute(
                "UPDATE hub_proxies SET state = ?, holder = NULL, lease_id = NULL, "
                "rest_crawl = CASE WHEN ? THEN NULL ELSE lease_crawl END, rest_pid = "
                "(SELECT pid FROM hub_proxy_usage WHERE id = ?), "
                "lease_expires = NULL, resting_until = NOW() + ?, consecutive_bans = ?, "
                "total_uses = total_uses + ?, failures = failures + ?, bans = bans + ?, "
                "stretch_uses = stretch_uses + ?, last_used = NOW() WHERE id = ?",
                (state, banned, lease.lease_id, rest, streak + 1 if banned else 0)
                + (counts.requests, counts.failures)
                + (counts.bans, counts.requests, lease.proxy_id),
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
        place: Place | None = None,
    ) -> tuple[bool, Lease | None]:
        released = self.release(lease, reason, counts, policy)
        return released, self.acquire(holder, ttl, waited, avoid=lease.proxy_id, place=place)


def _line_lets(tx: Transaction, holder: str, avoid: int, claim: float) -> bool:
    """Whether a taker with *claim* may have a free proxy: more are free than live
    waiters have a stronger claim."""
    ahead = tx.execute(_AHEAD, (holder, LINE_MINUTE, claim)).fetchone()[0]
    if not ahead:
        return True
    free = tx.execute(
        f"SELECT COUNT(*) FROM (SELECT 1 FROM hub_proxies WHERE {_FREE} LIMIT ?)",
        (avoid, ahead + 1),
    ).fetchone()[0]
    return free > ahead


def _keep_place(tx: Transaction, holder: str, waited: float, weight: float, ttl: float) -> None:
    # Places lapsed a while ago go; the table holds about one row per waiting process.
    tx.execute("DELETE FROM hub_proxy_waiters WHERE expires < NOW() - ?", (ttl,))
    tx.execute(
        "INSERT INTO hub_proxy_waiters (holder, since, weight, expires) "
        "VALUES (?, NOW() - ?, ?, NOW() + ?) ON CONFLICT (holder) DO UPDATE SET "
        "since = excluded.since, weight = excluded.weight, expires = excluded.expires",
        (holder, max(waited, 0.0), weight, ttl),
    )


def _add_usage(tx: Transaction, lease: Lease, counts: UsageCounts) -> None:
    if not (counts.requests or counts.bytes or counts.failures or counts.bans):
        return
    tx.execute(
        "UPDATE hub_proxy_usage SET requests = requests + ?, bytes = bytes + ?, "
        "failures = failures + ?, bans = bans + ? WHERE id = ?",
        (counts.requests, counts.bytes, counts.failures, counts.bans, lease.lease_id),
    )
