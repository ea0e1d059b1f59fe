"""Vacuums that a PostgreSQL hub's own clients run: :class:`Vacuuming`.

Some of the hub's tables churn: every proxy lease moves its proxy to the end of
``hub_proxies_lru`` and leaves a dead entry at the head, where every pick starts; every
stretch of a host's schedule is a row of ``hub_host_slots`` made and deleted, and an
update of its ``hub_hosts`` row. Autovacuum visits a table once a minute at best, and
a server may have it off; meanwhile every statement wades through the dead entries.
Measured: at 5,000 proxy leases a second the hub slowed by a quarter within 15 s; a
crawl of a million pages over 100,000 hosts with host budgets fell from 34,000 to
24,000 pages a minute in half an hour, with 370,000 dead slot rows, and was back to
34,000 within a minute of one VACUUM (0.2 s). So the stores vacuum their tables
themselves, one process of the cluster at a time, when no vacuum (autovacuum's
included) has visited them lately.
"""

from __future__ import annotations

import logging
from contextlib import suppress

from crawler.hub.db import Hub
from crawler.hub.errors import HubError
from crawler.hub.locks import AdvisoryLock

logger = logging.getLogger(__name__)

# Whether the table is due a vacuum, and if so this session's to do (it then holds the
# lock). NOW() would be rewritten: these are timestamps, not the hub's epoch.
_VACUUM_DUE = """
SELECT CASE WHEN COALESCE(GREATEST(last_vacuum, last_autovacuum), '-infinity')
    < clock_timestamp() - make_interval(secs => ?) THEN pg_try_advisory_lock(?) ELSE FALSE END
FROM pg_stat_user_tables WHERE relid = ?::regclass
"""


class Vacuuming:
    """A store of a PostgreSQL hub whose ``VACUUM_TABLES`` churn: every
    ``VACUUM_CHECK_EVERY`` operations (:meth:`_count_operation`) it vacuums them, unless
    a vacuum visited the first of them in the last ``VACUUM_SECONDS`` or another
    process holds ``VACUUM_LOCK``. Upkeep: a failure is warned of once, and the
    operations go on."""

    VACUUM_TABLES: tuple[str, ...] = ()
    VACUUM_LOCK: AdvisoryLock
    VACUUM_CHECK_EVERY = 500
    VACUUM_SECONDS = 2.0
    # What goes on when a vacuum fails, for its warning.
    VACUUM_GOES_ON = "the crawl"
    hub: Hub
    _operations = 0
    _vacuum_failed = False

    def _count_operation(self) -> None:
        self._operations += 1
        if self._operations % self.VACUUM_CHECK_EVERY:
            return
        try:
            self.vacuum_if_due()
        except Exception as exc:  # the operation before it has succeeded
            if not self._vacuum_failed:
                logger.warning(
                    "Could not vacuum %s of the hub %s (%s); %s goes on, slower as dead "
                    "index entries pile up until autovacuum comes",
                    ", ".join(self.VACUUM_TABLES),
                    self.hub.label,
                    exc,
                    self.VACUUM_GOES_ON,
                )
            self._vacuum_failed = True

    def vacuum_if_due(self) -> bool:
        """Vacuum the tables unless a vacuum visited them in the last
        ``VACUUM_SECONDS`` or another process is at it now; whether this call did."""
        lock = int(self.VACUUM_LOCK)
        due = (self.VACUUM_SECONDS, lock, self.VACUUM_TABLES[0])
        if not self.hub.query(_VACUUM_DUE, due)[0][0]:
            return False
        try:
            # SKIP_LOCKED: a vacuum already running (autovacuum's) is enough.
            self.hub.execute(f"VACUUM (SKIP_LOCKED) {', '.join(self.VACUUM_TABLES)}")
        finally:
            with suppress(HubError):  # a lost session has let go of the lock already
                self.hub.query("SELECT pg_advisory_unlock(?)", (lock,))
        return True
