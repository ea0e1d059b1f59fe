"""How a work queue's batches are leased (:class:`crawler.hub.workqueue.WorkQueue`'s
``lease`` and ``lease_many``): which items a new lease takes, in one transaction or one
statement, on either backend.

- A queue split by ``url``: an expired lease's batch whole, else the first pending items
  (on PostgreSQL from a stretch of item ids the lease claimed first, see ``_PG_CLAIM``).
- A queue split by units (``domain``, ``host``): the same, but a batch holds one unit's
  items and a unit held by as many live leases as it allows is passed over; these leases
  are serialised by an advisory lock, since "is the unit free" and "take it" must be one
  step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from crawler.hub.db import Hub, Transaction
from crawler.hub.locks import AdvisoryLock


@dataclass(frozen=True)
class WorkBatch:
    """A leased batch of URLs, held until done, released or expired."""

    lease_id: int
    queue: str
    urls: tuple[str, ...]
    expires: float
    taken_over: int | None = None  # the expired lease this batch was taken from
    unit: str | None = None  # the partition unit of its URLs (None: any URLs)


# The units of a queue that have as many live leases as they allow, or as the asker
# allows (the lesser): none of their batches is leased now.
_HELD_UNITS = """
SELECT l.unit FROM hub_work_leases l
LEFT JOIN hub_work_units u ON u.queue_id = l.queue_id AND u.unit = l.unit
WHERE l.queue_id = ? AND l.ended IS NULL AND l.expires >= NOW() AND l.unit IS NOT NULL
GROUP BY l.unit, u.max_holders
HAVING COUNT(*) >= CASE WHEN COALESCE(u.max_holders, 1) < ? THEN COALESCE(u.max_holders, 1)
    ELSE ? END
"""
# No cap of the asker's on a unit's holders: the unit's own max_holders holds.
_ANY_HOLDERS = 2**31 - 1


# PostgreSQL: many processes asking for pending items at once would all start at the
# first one and step over every row the others have locked (FOR UPDATE SKIP LOCKED), a
# cost that grows with the processes. So each lease first claims its own stretch of item
# ids, the queue's next_item moved on by the batch size (a transaction of a few
# microseconds, committed without waiting for the WAL flush: a claim lost in a crash
# only makes two leases look in the same place), and looks for pending items from there;
# finding none, it looks from the start, where given-back items are.
_PG_CLAIM = """
WITH s AS (SELECT set_config('synchronous_commit', 'off', true))
UPDATE hub_work_queues SET next_item = GREATEST(next_item, ?) + ? FROM s WHERE id = ?
RETURNING next_item - ?
"""

# A batch is then leased in one statement, a transaction of its own: one round trip and
# one commit per batch instead of six. The lease's id is drawn first, so that the items
# and the lease row, which counts them, are written by the same statement; a lease that
# found nothing is never written. An expired lease's batch is taken over whole.
_PG_LEASE = """
WITH lid AS (SELECT nextval(pg_get_serial_sequence('hub_work_leases', 'id')) AS id),
old AS (
    SELECT id FROM hub_work_leases WHERE queue_id = ? AND ended IS NULL
    AND expires < NOW() ORDER BY expires LIMIT 1 FOR UPDATE SKIP LOCKED
),
ended AS (
    UPDATE hub_work_leases l SET ended = NOW(), end_reason = 'expired' FROM old
    WHERE l.id = old.id
),
moved AS (
    UPDATE hub_work_items i SET lease_id = lid.id FROM lid, old
    WHERE i.lease_id = old.id AND i.state = 'leased' RETURNING i.id, i.url
),
fresh AS (
    UPDATE hub_work_items i SET state = 'leased', lease_id = lid.id FROM lid
    WHERE NOT EXISTS (SELECT 1 FROM old) AND i.id IN (
        SELECT id FROM hub_work_items WHERE queue_id = ? AND state = 'pending' AND id >= ?
        ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED)
    RETURNING i.id, i.url
),
taken AS (SELECT * FROM moved UNION ALL SELECT * FROM fresh),
made AS (
    INSERT INTO hub_work_leases (id, queue_id, holder, started, expires, items)
    SELECT lid.id, ?, ?, NOW(), NOW() + ?, (SELECT COUNT(*) FROM taken) FROM lid
    WHERE EXISTS (SELECT 1 FROM taken) RETURNING id, expires
)
SELECT made.id, made.expires, (SELECT id FROM old),
    (SELECT array_agg(url ORDER BY id) FROM taken), (SELECT MAX(id) FROM taken)
FROM made
"""


def _take(tx: Transaction, lease_id: int, old: int | None, pending: str, params: tuple) -> list:
    """Fill the new lease *lease_id* (SQLite, and split queues on PostgreSQL): with the
    batch of the expired lease *old*, which ends, else with the pending items that
    ``SELECT id FROM hub_work_items WHERE`` *pending* (bound to *params*) finds. The URLs
    taken, in item order; none taken, the lease row is deleted."""
    if old is not None:
        tx.execute(
            "UPDATE hub_work_leases SET ended = NOW(), end_reason = 'expired' WHERE id = ?",
            (old,),
        )
        taken = tx.execute(
            "UPDATE hub_work_items SET lease_id = ? WHERE lease_id = ? AND state = 'leased'",
            (lease_id, old),
        ).rowcount
    else:
        taken = tx.execute(
            "UPDATE hub_work_items SET state = 'leased', lease_id = ? WHERE id IN "
            "(SELECT id FROM hub_work_items WHERE " + pending + ")",
            (lease_id, *params),
        ).rowcount
    if not taken:
        tx.execute("DELETE FROM hub_work_leases WHERE id = ?", (lease_id,))
        return []
    tx.execute("UPDATE hub_work_leases SET items = ? WHERE id = ?", (taken, lease_id))
    return _urls(tx, lease_id)


def _urls(tx: Transaction, lease_id: int) -> list[str]:
    """The URLs of the lease *lease_id*, in item order, as one row: each row SQLite
    returns is a step of its own, the GIL let go and taken back while the crawl's other
    threads want it (a domain-split resume skipped 10-20% faster so)."""
    if tx.dialect.name == "postgresql":
        sql = "SELECT array_agg(url ORDER BY id) FROM hub_work_items WHERE lease_id = ?"
        return list(tx.execute(sql, (lease_id,)).fetchone()[0] or ())
    sql = (
        "SELECT json_group_array(url) FROM "
        "(SELECT url FROM hub_work_items WHERE lease_id = ? ORDER BY id)"
    )
    return json.loads(tx.execute(sql, (lease_id,)).fetchone()[0])


def _pending_units(tx: Transaction, queue_id: int, after: int) -> list:
    """``(id, unit)`` of the next 500 pending items past *after*, in item order (as one
    row on SQLite, see :func:`_urls`)."""
    sql = (
        "SELECT id, unit FROM hub_work_items WHERE queue_id = ? "
        "AND state = 'pending' AND id > ? ORDER BY id LIMIT 500"
    )
    if tx.dialect.name == "postgresql":
        return tx.execute(sql, (queue_id, after)).fetchall()
    found = tx.execute(
        f"SELECT json_group_array(json_array(id, unit)) FROM ({sql})", (queue_id, after)
    )
    return json.loads(found.fetchone()[0])


def _cap(holders: int | None) -> int:
    """The asker's cap on a unit's holders (None: the unit's own max_holders holds)."""
    return _ANY_HOLDERS if holders is None else max(holders, 1)


class BatchLeaser:
    """Takes new leases of one queue's items; the queue ends, renews and counts them."""

    def __init__(self, hub: Hub, queue_id: int, name: str) -> None:
        self.hub = hub
        self.queue_id = queue_id
        self.name = name
        # PostgreSQL: past the last batch this process leased, where its next claim
        # starts at the earliest (see _lease_pg_from).
        self._next_item = 0

    def lease(
        self, partition: str, holder: str, size: int, ttl: float, holders: int | None
    ) -> WorkBatch | None:
        """:meth:`WorkQueue.lease` of a queue split by *partition*."""
        if size < 1 or ttl <= 0:
            raise ValueError("a lease needs size >= 1 and ttl > 0")
        if partition != "url":
            return self._lease_unit(holder, size, ttl, _cap(holders))
        if self.hub.dialect.name == "postgresql":
            return self._lease_pg(holder, size, ttl)
        with self.hub.transaction() as tx:
            lock = tx.dialect.skip_locked
            old = tx.execute(
                "SELECT id FROM hub_work_leases WHERE queue_id = ? AND ended IS NULL "
                "AND expires < NOW() ORDER BY expires LIMIT 1" + lock,
                (self.queue_id,),
            ).fetchone()
            lease_id, expires = tx.execute(
                "INSERT INTO hub_work_leases (queue_id, holder, started, expires) "
                "VALUES (?, ?, NOW(), NOW() + ?) RETURNING id, expires",
                (self.queue_id, holder, ttl),
            ).fetchone()
            taken = _take(
                tx,
                lease_id,
                old[0] if old else None,
                "queue_id = ? AND state = 'pending' ORDER BY id LIMIT ?" + lock,
                (self.queue_id, size),
            )
            if not taken:
                return None
        return WorkBatch(lease_id, self.name, tuple(taken), float(expires), old[0] if old else None)

    def lease_many(
        self, partition: str, holder: str, size: int, ttl: float, holders: int | None
    ) -> list[WorkBatch]:
        """:meth:`WorkQueue.lease_many` of a queue split by *partition*."""
        if partition == "url":
            batch = self.lease(partition, holder, size, ttl, holders)
            return [] if batch is None else [batch]
        if size < 1 or ttl <= 0:
            raise ValueError("a lease needs size >= 1 and ttl > 0")
        cap = _cap(holders)
        with self.hub.transaction() as tx:
            tx.lock(AdvisoryLock.WORK_UNIT_LEASE)
            first = self._lease_unit_in(tx, holder, size, ttl, cap)
            if first is None:
                return []
            batches = [first]
            size -= len(first.urls)
            if size <= 0 or first.taken_over is not None:
                return batches
            # The units of the next pending items, in item order, but for those held
            # as often as they allow (found once: this transaction holds the lock).
            q = self.queue_id
            held = {unit for (unit,) in tx.execute(_HELD_UNITS, (q, cap, cap)).fetchall()}
            held.add(first.unit)
            after = -1
            while size > 0:
                rows = _pending_units(tx, q, after)
                if not rows:
                    break
                after = rows[-1][0]
                for _, unit in rows:
                    if unit in held:
                        continue
                    held.add(unit)
                    batch = self._lease_unit_items(tx, holder, size, ttl, unit, None)
                    if batch is not None:
                        batches.append(batch)
                        size -= len(batch.urls)
                        if size <= 0:
                            break
        return batches

    def _lease_unit(self, holder: str, size: int, ttl: float, cap: int) -> WorkBatch | None:
        """A lease of a queue split by units: an expired lease's batch whose unit is not
        held as often as it allows, else up to *size* pending items of the first unit
        (by item order) that is not."""
        with self.hub.transaction() as tx:
            tx.lock(AdvisoryLock.WORK_UNIT_LEASE)
            return self._lease_unit_in(tx, holder, size, ttl, cap)

    def _lease_unit_in(
        self, tx: Transaction, holder: str, size: int, ttl: float, cap: int
    ) -> WorkBatch | None:
        q = self.queue_id
        old = tx.execute(
            "SELECT id, unit FROM hub_work_leases WHERE queue_id = ? AND ended IS NULL "
            "AND expires < NOW() AND (unit IS NULL OR unit NOT IN (" + _HELD_UNITS + ")) "
            "ORDER BY expires LIMIT 1",
            (q, q, cap, cap),
        ).fetchone()
        if old is not None:
            unit = old[1]
        else:
            row = tx.execute(
                "SELECT unit FROM hub_work_items WHERE queue_id = ? AND state = 'pending' "
                "AND unit NOT IN (" + _HELD_UNITS + ") ORDER BY id LIMIT 1",
                (q, q, cap, cap),
            ).fetchone()
            if row is None:
                return None
            unit = row[0]
        return self._lease_unit_items(tx, holder, size, ttl, unit, old[0] if old else None)

    def _lease_unit_items(
        self, tx: Transaction, holder: str, size: int, ttl: float, unit: str, old: int | None
    ) -> WorkBatch | None:
        """A lease of up to *size* pending items of *unit*, or of the expired lease
        *old*'s batch; None when it found none."""
        q = self.queue_id
        lease_id, expires = tx.execute(
            "INSERT INTO hub_work_leases (queue_id, holder, started, expires, unit) "
            "VALUES (?, ?, NOW(), NOW() + ?, ?) RETURNING id, expires",
            (q, holder, ttl, unit),
        ).fetchone()
        taken = _take(
            tx,
            lease_id,
            old,
            "queue_id = ? AND unit = ? AND state = 'pending' ORDER BY id LIMIT ?",
            (q, unit, size),
        )
        if not taken:
            return None
        return WorkBatch(lease_id, self.name, tuple(taken), float(expires), old, unit)

    def _lease_pg(self, holder: str, size: int, ttl: float) -> WorkBatch | None:
        claim = (self._next_item, size, self.queue_id, size)
        start = int(self.hub.query(_PG_CLAIM, claim)[0][0])
        batch = self._lease_pg_from(start, holder, size, ttl)
        if batch is None and start > 0:
            batch = self._lease_pg_from(0, holder, size, ttl)
        return batch

    def _lease_pg_from(self, start: int, holder: str, size: int, ttl: float) -> WorkBatch | None:
        params = (self.queue_id, self.queue_id, start, size, self.queue_id, holder, ttl)
        rows = self.hub.query(_PG_LEASE, params)
        if not rows:
            return None
        lease_id, expires, old, urls, last = rows[0]
        # Past this batch: where this process's next claim starts at the earliest, so that
        # a queue whose items are numbered far from 0 is reached at once.
        self._next_item = max(self._next_item, int(last) + 1)
        return WorkBatch(lease_id, self.name, tuple(urls), float(expires), old)
