"""The hub: shared crawl state in a database (SQLite, or PostgreSQL for many nodes).

- ``db``: ``HUB_URL``, connections, dialects, transactions, schema versions.
- ``redact``: proxy URLs checked (the redaction itself: ``crawler/redact.py``).
- ``identity``: who holds a lease (host, pid, Slurm job/task).
- ``locks``: every PostgreSQL advisory lock key, in one registry.
- ``proxies``: the proxy pool table: managing it, usage; picks the backend's lease store.
- ``lease_store``: the lease operations' interface and the rest formula;
  ``lease_sqlite`` and ``lease_postgres`` implement it, side by side.
- ``leases``: one process's leases (LeasePool): rotation, bans, heartbeat, waiting.
- ``workqueue``: URL lists that tasks lease in batches (queue mode).
- ``hostbudget``: per-host request interval, concurrency and back-off shared by every
  process (host slots), and robots.txt fetched once per cluster.
- ``runner``: the thread hub calls run in, and the clock, for the crawl's clients.

No Scrapy, Twisted or spider code in here: tools, tests and benchmarks use the hub
directly (``crawler/admin.py`` holds what the hub's commands run).
"""

from crawler.hub.db import Hub
from crawler.hub.errors import (
    HubError,
    HubUnavailableError,
    InvalidHubURLError,
    InvalidProxyURLError,
)
from crawler.hub.identity import Holder, task_identity
from crawler.hub.lease_store import END_REASONS, Lease, LeaseStore, RestPolicy, UsageCounts
from crawler.hub.leases import (
    Attempt,
    Finished,
    LeaseConfig,
    LeaseEvents,
    LeasePool,
    LeaseView,
    PoolClosedError,
)
from crawler.hub.locks import AdvisoryLock
from crawler.hub.proxies import SCHEMA_VERSION, PoolOutlook, ProxyPool, ProxyRow, UsageRow
from crawler.hub.redact import normalize_proxy_url, redact_text, redact_url
from crawler.hub.workqueue import QueueProgress, WorkBatch, WorkQueue, WorkQueueError

__all__ = [
    "END_REASONS",
    "SCHEMA_VERSION",
    "AdvisoryLock",
    "Attempt",
    "Finished",
    "Holder",
    "Hub",
    "HubError",
    "HubUnavailableError",
    "InvalidHubURLError",
    "InvalidProxyURLError",
    "Lease",
    "LeaseConfig",
    "LeaseEvents",
    "LeaseStore",
    "LeasePool",
    "LeaseView",
    "PoolClosedError",
    "PoolOutlook",
    "ProxyPool",
    "ProxyRow",
    "QueueProgress",
    "RestPolicy",
    "UsageCounts",
    "UsageRow",
    "WorkBatch",
    "WorkQueue",
    "WorkQueueError",
    "normalize_proxy_url",
    "redact_text",
    "redact_url",
    "task_identity",
]
