"""The hub's work queue: URL lists that tasks lease in batches, for the queue mode.

A queue is a named list of work items (URLs) in the hub (``HUB_URL``: PostgreSQL for
many nodes, SQLite for one machine). Tasks lease batches of items, crawl them, ship
the catalog holding their rows, and only then mark the batch done; faster tasks so
take more batches. A lease expires ``WORK_LEASE_TTL`` seconds after it was taken or
last renewed: its batch is then taken over, whole, by the next task that asks.

- An item is ``pending``, ``leased`` (under one lease) or done; done is final. A batch
  done ends its lease ``done`` and leaves its items as they are: an item is done when its
  lease ended done (or, from a version 1 hub, when its state says ``done``). One row
  written per batch instead of one per URL is what lets many tasks share a queue.
- A lease ends ``done``, ``released`` (its items pending again), or ``expired`` (taken
  over: its items moved to the new lease). Renewing or finishing a lease that ended
  fails, so no batch is ever held by two live leases.
- PostgreSQL: leases are taken with ``FOR UPDATE SKIP LOCKED``; SQLite: in one
  ``BEGIN IMMEDIATE`` transaction.
- Politeness: a queue loaded with partition ``domain`` or ``host``
  (``crawler/partition.py``) stores each item's unit, a batch holds one unit's
  items, and a unit's batches are leased to at most ``max_holders`` live leases at a
  time (``hub_work_units``, set at load from the host budget, :func:`unit_holders`): a
  batch of a unit held that often is not leased, and neither is an expired lease taken
  over. So no more crawl processes at a time fetch a site than its budget allows. How a
  lease picks its items, on either backend, is ``crawler/hub/batchlease.py``. A queue
  loaded with ``url`` leases any items, as before.

``scrapy queue load NAME URLS|-`` and ``scrapy queue status NAME`` (``commands/queue.py``
over :class:`crawler.admin.QueueAdmin`) load a list and show a queue's progress.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

from crawler.hub.batchlease import BatchLeaser, WorkBatch
from crawler.hub.db import Hub
from crawler.hub.errors import HubError
from crawler.hub.identity import Holder
from crawler.hub.locks import AdvisoryLock
from crawler.partition import PartitionError, check_mode, queue_unit
from crawler.storage.keys import request_key

WORK_SCHEMA_VERSION = 6
# A URL whose crawl failed is put back this many times at most, then kept as failed
# until `scrapy queue requeue` (WORK_MAX_ATTEMPTS).
MAX_ATTEMPTS = 3
LOAD_CHUNK = 5000

# Numbered migrations of the work tables, kept apart from the proxy tables' own.
_WORK_MIGRATIONS: dict[int, list[str]] = {
    1: [
        """CREATE TABLE IF NOT EXISTS hub_work_queues (
            id {id},
            name TEXT NOT NULL UNIQUE,
            created {real} NOT NULL
        )""",
        """CREATE TABLE IF NOT EXISTS hub_work_leases (
            id {id},
            queue_id BIGINT NOT NULL REFERENCES hub_work_queues(id),
            holder TEXT NOT NULL,
            started {real} NOT NULL,
            expires {real} NOT NULL,
            ended {real},
            end_reason TEXT,
            items INTEGER NOT NULL DEFAULT 0
        )""",
        """CREATE TABLE IF NOT EXISTS hub_work_items (
            id {id},
            queue_id BIGINT NOT NULL REFERENCES hub_work_queues(id),
            ukey TEXT NOT NULL,
            url TEXT NOT NULL,
            state TEXT NOT NULL DEFAULT 'pending',
            lease_id BIGINT,
            done_at {real},
            UNIQUE (queue_id, ukey)
        )""",
        "CREATE INDEX IF NOT EXISTS hub_work_items_state ON hub_work_items (queue_id, state, id)",
        "CREATE INDEX IF NOT EXISTS hub_work_items_lease ON hub_work_items (lease_id)",
        "CREATE INDEX IF NOT EXISTS hub_work_leases_open ON hub_work_leases (queue_id, ended, expires)",
    ],
    # Only pending items are looked up by state: a smaller index that leasing leaves sooner.
    2: [
        "CREATE INDEX IF NOT EXISTS hub_work_items_pending ON hub_work_items (queue_id, id) "
        "WHERE state = 'pending'",
        "DROP INDEX IF EXISTS hub_work_items_state",
    ],
    # URLs of a finished batch that failed (5xx after retries, timeouts), as its task says.
    3: ["ALTER TABLE hub_work_leases ADD COLUMN failed INTEGER NOT NULL DEFAULT 0"],
    # Where the next lease starts looking for pending items (PostgreSQL; see _PG_CLAIM).
    4: ["ALTER TABLE hub_work_queues ADD COLUMN next_item BIGINT NOT NULL DEFAULT 0"],
    # Partition units: what a batch holds whole, and how many may hold a unit at once.
    5: [
        "ALTER TABLE hub_work_queues ADD COLUMN partition TEXT NOT NULL DEFAULT 'url'",
        "ALTER TABLE hub_work_items ADD COLUMN unit TEXT",
        "ALTER TABLE hub_work_leases ADD COLUMN unit TEXT",
        "CREATE INDEX IF NOT EXISTS hub_work_items_unit_pending ON hub_work_items "
        "(queue_id, unit, id) WHERE state = 'pending'",
        "CREATE INDEX IF NOT EXISTS hub_work_leases_unit ON hub_work_leases "
        "(queue_id, unit) WHERE ended IS NULL",
        """CREATE TABLE IF NOT EXISTS hub_work_units (
            queue_id BIGINT NOT NULL REFERENCES hub_work_queues(id),
            unit TEXT NOT NULL,
            max_holders INTEGER NOT NULL DEFAULT 1,
            PRIMARY KEY (queue_id, unit)
        )""",
    ],
    # A URL whose crawl failed goes back to pending, counted, up to a limit; then it
    # stays 'failed' until requeued by hand.
    6: ["ALTER TABLE hub_work_items ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0"],
}

# Ending a lease is one statement too; a batch done writes its lease row only.
_PG_DONE = """
UPDATE hub_work_leases SET ended = NOW(), end_reason = ?, failed = ?
WHERE id = ? AND ended IS NULL RETURNING id
"""

_PG_RELEASE = """
WITH ended AS (
    UPDATE hub_work_leases SET ended = NOW(), end_reason = ?, failed = ?
    WHERE id = ? AND ended IS NULL RETURNING id
),
back AS (
    UPDATE hub_work_items i SET state = 'pending', lease_id = NULL FROM ended
    WHERE i.lease_id = ended.id AND i.state = 'leased'
)
SELECT id FROM ended
"""


class WorkQueueError(HubError):
    """A work queue operation failed."""


@dataclass(frozen=True)
class QueueProgress:
    pending: int
    leased: int  # under a live lease
    expired: int  # under a lease that expired and was not taken over yet
    done: int
    holders: int  # live leases
    failed: int = 0  # failed as often as allowed: kept until requeued

    @property
    def total(self) -> int:
        return self.pending + self.leased + self.expired + self.done + self.failed

    @property
    def finished(self) -> bool:
        return self.total > 0 and self.done + self.failed == self.total

    def line(self) -> str:
        pct = 100.0 * self.done / self.total if self.total else 0.0
        failed = f", failed {self.failed:,} (`scrapy queue requeue`)" if self.failed else ""
        return (
            f"done {self.done:,}/{self.total:,} ({pct:.1f}%), leased {self.leased:,} "
            f"by {self.holders} holders, expired {self.expired:,}, pending "
            f"{self.pending:,}{failed}"
        )


@dataclass(frozen=True)
class QueueStats:
    """What an operator of a many-node run watches: progress, speed, who holds what."""

    progress: QueueProgress
    failed: int  # URLs of finished batches that failed, as their tasks reported
    done_recently: int  # URLs done in the last `window` seconds
    window: float  # seconds: the window, or how long the queue has been worked, if less
    held_by_host: dict[str, tuple[int, int]]  # host -> (live leases, URLs under them)

    @property
    def rate(self) -> float:
        """URLs done per second over the window."""
        return self.done_recently / self.window if self.window > 0 else 0.0

    @property
    def eta(self) -> float | None:
        """Seconds until every URL is done at the current rate; None when nothing moves."""
        left = self.progress.total - self.progress.done - self.progress.failed
        if left == 0:
            return 0.0
        return left / self.rate if self.rate > 0 else None


def item_key(url: str) -> str:
    """The request key of a listed URL (duplicates by key are queued once)."""
    try:
        return request_key(url)
    except Exception:  # not a URL the crawl can take: it reports the line itself
        return hashlib.sha256(url.encode("utf-8", "replace")).hexdigest()


def _unit(url: str, mode: str) -> str | None:
    """The partition unit stored with an item (None for ``url``); a line that is not a
    URL stands for itself: the crawl reports it."""
    try:
        return queue_unit(url, mode)
    except ValueError:
        return url


def unit_holders(settings: Any) -> int:
    """How many leases may hold one unit's batches at once under these crawl settings.

    With host budgets on (``HOST_BUDGET_ENABLED``), the hub keeps each host to
    ``CONCURRENT_REQUESTS_PER_DOMAIN`` requests at once and one per ``DOWNLOAD_DELAY``
    whichever processes ask: that many holders stay within the budget, each with a
    request in flight. Off, each process keeps its own limits: one holder at a time."""
    if not settings.getbool("HOST_BUDGET_ENABLED", True):
        return 1
    return max(settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN", 1), 1)


def list_lines(stream: Iterable[str]) -> Iterator[str]:
    """The entries of a URL list: stripped lines, no blanks, no ``#`` comments."""
    for raw in stream:
        line = raw.strip()
        if line and not line.startswith("#"):
            yield line


class WorkQueue:
    """One named queue in a hub; the hub's connection and dialects do the SQL."""

    def __init__(self, hub: Hub, name: str, create: bool = True) -> None:
        if not name or len(name) > 200:
            raise WorkQueueError(f"queue name {name!r}: give 1 to 200 characters")
        self.hub = hub
        self.name = name
        ensure_work_schema(hub)
        self.queue_id = self._queue_id(create)
        self._leaser = BatchLeaser(hub, self.queue_id, name)
        # What a batch takes whole: domain, host or url (any URLs), as the queue was
        # first loaded (loaded before it is leased from: read once).
        self.partition = str(
            self.hub.query("SELECT partition FROM hub_work_queues WHERE id = ?",
                           (self.queue_id,))[0][0]
        )  # fmt: skip

    def _queue_id(self, create: bool) -> int:
        with self.hub.transaction() as tx:
            if create:
                tx.execute(
                    "INSERT INTO hub_work_queues (name, created) VALUES (?, NOW()) "
                    "ON CONFLICT (name) DO NOTHING",
                    (self.name,),
                )
            row = tx.execute(
                "SELECT id FROM hub_work_queues WHERE name = ?", (self.name,)
            ).fetchone()
        if row is None:
            raise WorkQueueError(
                f"no queue {self.name!r} in the hub {self.hub.label}: load it first "
                "(scrapy queue load NAME URLS)"
            )
        return int(row[0])

    # --- loading ----------------------------------------------------------------
    def load(
        self,
        urls: Iterable[str],
        chunk: int = LOAD_CHUNK,
        partition: str = "url",
        holders: int = 1,
    ) -> tuple[int, int]:
        """Add URLs (streamed, one transaction per chunk); return (added, already there).

        Loading the same list again adds nothing: items done stay done, so a queue is
        resumed by loading it again under the same name. ``partition``: what a batch
        takes whole (``domain``, ``host``; ``url``: any URLs); a queue keeps the mode
        it was first loaded with, and loading it with another is refused. ``holders``:
        how many leases may hold each loaded unit's batches at once (its
        ``max_holders``, set again for units loaded before; see :func:`unit_holders`).
        """
        if holders < 1:
            raise ValueError("a unit needs max_holders >= 1")
        mode = self._set_partition(partition)
        before = self._count()
        seen = 0
        lines = iter(urls)
        while rows := [
            (self.queue_id, item_key(url), url, _unit(url, mode)) for url in islice(lines, chunk)
        ]:
            seen += len(rows)
            with self.hub.transaction() as tx:
                tx.executemany(
                    "INSERT INTO hub_work_items (queue_id, ukey, url, unit) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (queue_id, ukey) DO NOTHING",
                    rows,
                )
                if mode != "url":
                    tx.executemany(
                        "INSERT INTO hub_work_units (queue_id, unit, max_holders) "
                        "VALUES (?, ?, ?) ON CONFLICT (queue_id, unit) "
                        "DO UPDATE SET max_holders = excluded.max_holders",
                        sorted({(self.queue_id, row[3], holders) for row in rows}),
                    )
        if self.hub.dialect.name == "postgresql":
            # Leases claim stretches of item ids from here (_PG_CLAIM), not from 0.
            self.hub.execute(
                "UPDATE hub_work_queues SET next_item = GREATEST(next_item, COALESCE((SELECT "
                "MIN(id) FROM hub_work_items WHERE queue_id = ? AND state = 'pending'), 0)) "
                "WHERE id = ?",
                (self.queue_id, self.queue_id),
            )
        added = self._count() - before
        return added, seen - added

    def _set_partition(self, partition: str) -> str:
        try:
            mode = check_mode(partition, "partition")
        except PartitionError as exc:
            raise WorkQueueError(str(exc)) from None
        with self.hub.transaction() as tx:
            if mode != "url":  # a new queue (no items yet) takes the mode it is given
                tx.execute(
                    "UPDATE hub_work_queues SET partition = ? WHERE id = ? AND NOT EXISTS "
                    "(SELECT 1 FROM hub_work_items WHERE queue_id = ?)",
                    (mode, self.queue_id, self.queue_id),
                )
            current = tx.execute(
                "SELECT partition FROM hub_work_queues WHERE id = ?", (self.queue_id,)
            ).fetchone()[0]
        self.partition = str(current)
        if current != mode:
            raise WorkQueueError(
                f"queue {self.name!r} in {self.hub.label} is split by {current}, not {mode}: "
                f"load it with --partition {current}, or under a new name"
            )
        return mode

    def set_max_holders(self, unit: str, holders: int) -> None:
        """Let ``holders`` leases hold batches of ``unit`` at once (1 by default): for a
        host whose budget, shared through the hub, allows several processes."""
        if holders < 1:
            raise ValueError("a unit needs max_holders >= 1")
        self.hub.execute(
            "INSERT INTO hub_work_units (queue_id, unit, max_holders) VALUES (?, ?, ?) "
            "ON CONFLICT (queue_id, unit) DO UPDATE SET max_holders = excluded.max_holders",
            (self.queue_id, unit, holders),
        )

    def _count(self) -> int:
        rows = self.hub.query(
            "SELECT COUNT(*) FROM hub_work_items WHERE queue_id = ?", (self.queue_id,)
        )
        return int(rows[0][0])

    # --- leases -----------------------------------------------------------------
    def lease(
        self, holder: Holder | str, size: int, ttl: float, holders: int | None = None
    ) -> WorkBatch | None:
        """Lease a batch: an expired lease's batch, whole, else up to *size* pending
        items; None when neither is there (see :meth:`progress` for why). *holders*:
        the most holders the asker's crawl settings allow a unit (:func:`unit_holders`),
        below its ``max_holders`` when fewer: a crawl without host budgets shares no
        unit, whatever the queue was loaded with."""
        return self._leaser.lease(self.partition, str(holder), size, ttl, holders)

    def lease_many(
        self, holder: Holder | str, size: int, ttl: float, holders: int | None = None
    ) -> list[WorkBatch]:
        """Batches of up to *size* items together, leased in one transaction: a queue
        split by units of a few URLs each (a domain's pages) would otherwise cost a
        transaction, and a search for the next unit not held, for every few URLs. Each
        batch is a lease of its own (:meth:`lease`, which takes an expired lease's batch
        first); none when there is nothing to lease."""
        return self._leaser.lease_many(self.partition, str(holder), size, ttl, holders)

    def renew(self, batch: WorkBatch, ttl: float) -> bool:
        """Extend the lease by *ttl* from now; False if it ended (taken over)."""
        changed = self.hub.execute(
            "UPDATE hub_work_leases SET expires = NOW() + ? WHERE id = ? AND ended IS NULL",
            (ttl, batch.lease_id),
        )
        return changed == 1

    def done(
        self, batch: WorkBatch, failed: Collection[str] = (), max_attempts: int = MAX_ATTEMPTS
    ) -> bool:
        """Mark the batch's items done, but for the *failed* URLs (an error after every
        retry: a 5xx, a timeout): each goes back to pending for another crawl, or once
        it failed *max_attempts* times stays failed until :meth:`requeue`. False if the
        lease ended before."""
        if not self._end(batch, "done", len(failed)):
            return False
        if failed:
            with self.hub.transaction() as tx:
                tx.executemany(
                    "UPDATE hub_work_items SET attempts = attempts + 1, "
                    "state = CASE WHEN attempts + 1 >= ? THEN 'failed' ELSE 'pending' END, "
                    "lease_id = CASE WHEN attempts + 1 >= ? THEN lease_id END "
                    "WHERE queue_id = ? AND ukey = ? AND lease_id = ?",
                    [
                        (max_attempts, max_attempts, self.queue_id, item_key(url), batch.lease_id)
                        for url in sorted(set(failed))
                    ],
                )
        return True

    def done_many(self, batches: Collection[WorkBatch]) -> int:
        """:meth:`done` of batches none of whose URLs failed, in one statement; how many
        were still leased (the others ended before)."""
        if not batches:
            return 0
        marks = ",".join("?" * len(batches))
        return self.hub.execute(
            "UPDATE hub_work_leases SET ended = NOW(), end_reason = 'done', failed = 0 "
            f"WHERE id IN ({marks}) AND ended IS NULL",
            tuple(batch.lease_id for batch in batches),
        )

    def requeue(self) -> int:
        """Put every failed URL back to pending, its count of failures reset; how many."""
        return self.hub.execute(
            "UPDATE hub_work_items SET state = 'pending', lease_id = NULL, attempts = 0 "
            "WHERE queue_id = ? AND state = 'failed'",
            (self.queue_id,),
        )

    def release(self, batch: WorkBatch) -> bool:
        """Give the batch back: its items are pending again; False if the lease ended."""
        return self._end(batch, "released")

    def _end(self, batch: WorkBatch, reason: str, failed: int = 0) -> bool:
        if self.hub.dialect.name == "postgresql":
            sql = _PG_DONE if reason == "done" else _PG_RELEASE
            return bool(self.hub.query(sql, (reason, failed, batch.lease_id)))
        with self.hub.transaction() as tx:
            ended = tx.execute(
                "UPDATE hub_work_leases SET ended = NOW(), end_reason = ?, failed = ? "
                "WHERE id = ? AND ended IS NULL",
                (reason, failed, batch.lease_id),
            )
            if ended.rowcount != 1:
                return False
            if reason != "done":
                tx.execute(
                    "UPDATE hub_work_items SET state = 'pending', lease_id = NULL "
                    "WHERE lease_id = ? AND state = 'leased'",
                    (batch.lease_id,),
                )
        return True

    # --- reporting --------------------------------------------------------------
    def progress(self) -> QueueProgress:
        rows = self.hub.query(
            "SELECT i.state, l.end_reason, COALESCE(l.expires < NOW(), FALSE), COUNT(*) "
            "FROM hub_work_items i LEFT JOIN hub_work_leases l ON l.id = i.lease_id "
            "WHERE i.queue_id = ? GROUP BY 1, 2, 3",
            (self.queue_id,),
        )
        counts = {"pending": 0, "leased": 0, "expired": 0, "done": 0, "failed": 0}
        for state, end_reason, expired, n in rows:
            if state == "leased" and end_reason == "done":
                state = "done"
            elif state == "leased" and expired:
                state = "expired"
            counts[state] += int(n)
        holders = self.hub.query(
            "SELECT COUNT(*) FROM hub_work_leases WHERE queue_id = ? AND ended IS NULL "
            "AND expires >= NOW()",
            (self.queue_id,),
        )[0][0]
        return QueueProgress(holders=int(holders), **counts)

    def stats(self, window: float = 600.0) -> QueueStats:
        """Progress, failures, the rate over the last *window* seconds (or since the
        queue's first lease, if later), leases per host."""
        failed, recent, worked = self.hub.query(
            "SELECT COALESCE(SUM(failed), 0), COALESCE(SUM(CASE WHEN ended >= NOW() - ? "
            "THEN items - failed ELSE 0 END), 0), NOW() - MIN(started) FROM hub_work_leases "
            "WHERE queue_id = ? AND end_reason = 'done'",
            (window, self.queue_id),
        )[0]
        if worked is not None:
            window = min(window, max(float(worked), 1.0))
        held: dict[str, tuple[int, int]] = {}
        for holder, items in self.hub.query(
            "SELECT holder, items FROM hub_work_leases WHERE queue_id = ? AND ended IS NULL "
            "AND expires >= NOW()",
            (self.queue_id,),
        ):
            host = str(holder).split("/", 1)[0]
            leases, urls = held.get(host, (0, 0))
            held[host] = (leases + 1, urls + int(items))
        return QueueStats(self.progress(), int(failed), int(recent), window, held)

    def leases(self) -> list[dict[str, Any]]:
        """Every lease of this queue, oldest first (for tests and status)."""
        rows = self.hub.query(
            "SELECT id, holder, started, expires, ended, end_reason, items "
            "FROM hub_work_leases WHERE queue_id = ? ORDER BY id",
            (self.queue_id,),
        )
        keys = ("id", "holder", "started", "expires", "ended", "end_reason", "items")
        return [dict(zip(keys, row, strict=True)) for row in rows]


def ensure_work_schema(hub: Hub) -> int:
    """Create or upgrade the work tables; safe to call from many processes at once."""
    return hub.migrate("hub_work_schema", _WORK_MIGRATIONS, AdvisoryLock.WORK_SCHEMA)
