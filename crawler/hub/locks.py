"""Every PostgreSQL advisory lock key the hub takes, in one registry.

Advisory locks are server-wide numbers: two uses of one key serialise work that has
nothing in common (the work-queue schema lock once shared its key with the proxy
vacuum, so a vacuum held up every crawl process starting in queue mode). ``@unique``
makes a second use of a value an import error rather than a silent alias.
"""

from __future__ import annotations

from enum import IntEnum, unique


@unique
class AdvisoryLock(IntEnum):
    """Keys of ``pg_advisory_xact_lock`` / ``pg_try_advisory_lock``."""

    # Creating or upgrading the proxy tables, and installing the lease functions.
    PROXY_SCHEMA = 7302519001
    # One process at a time vacuums hub_proxies.
    PROXY_VACUUM = 7302519002
    # Creating or upgrading the job table.
    JOB_SCHEMA = 7302519003
    # Creating or upgrading the work-queue tables.
    WORK_SCHEMA = 7302519004
    # Creating or upgrading the host-budget tables.
    HOST_SCHEMA = 7302519005
    # Leasing a batch of a work queue split by domain or host: one lease at a time
    # checks who holds a unit, so that no unit gets more holders than it allows.
    WORK_UNIT_LEASE = 7302519006
    # Creating or upgrading the heartbeat table.
    HEARTBEAT_SCHEMA = 7302519007
    # One process at a time vacuums the host-budget tables.
    HOST_VACUUM = 7302519008
