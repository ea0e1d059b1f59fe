"""Who fetches a URL: the one place that maps a URL to its partition unit.

A crawl split over many processes keeps a host to its limits (``DOWNLOAD_DELAY``,
``CONCURRENT_REQUESTS_PER_DOMAIN``, AutoThrottle) only when one process at a time
fetches that host: each process applies the limits on its own. So the work is split by
a unit of URLs that a process takes whole:

- ``domain`` (the default): the registered domain (``bbc.co.uk`` for
  ``news.bbc.co.uk``, from the Public Suffix List snapshot bundled with tldextract, no
  network); every host of a site is fetched by one process, as a site's owner sees it.
- ``host``: the host name; sites of many hosts (``*.github.io``, ``*.wikipedia.org``)
  spread over more processes, each host still fetched by one.
- ``url``: the request key; URLs spread evenly whatever their host, and every process
  may ask every host (each applies the limits on its own: a host of the list gets up
  to one share of them per process).

Shard mode: a URL belongs to shard ``stable_hash(unit) % N`` (``url``:
``int(key, 16) % N``, the split of earlier versions). Queue mode: each work item is
loaded with its unit, a batch holds one unit's URLs, and the hub leases a unit's
batches to one holder at a time (``crawler/hub/workqueue.py``).

The unit of a URL depends on the URL alone, never on the number of processes, and a
stored URL is skipped by its key: a crawl resumed with another number of shards, or
another mode, skips what is stored.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from urllib.parse import urlsplit

from crawler.domains import registered_domain

MODES = ("domain", "host", "url")
DEFAULT_MODE = "domain"


class PartitionError(ValueError):
    """A partition mode that is not one of MODES."""


def check_mode(mode: str | None, where: str = "CRAWL_PARTITION") -> str:
    """``mode`` lowercased if it is one of MODES, else a PartitionError naming
    ``where`` it came from; None or empty gives the default."""
    if not mode:
        return DEFAULT_MODE
    value = str(mode).strip().lower()
    if value not in MODES:
        raise PartitionError(f"{where}: {mode!r} is not a partition mode; give one of "
                             f"{', '.join(MODES)}")  # fmt: skip
    return value


def host_of(url: str) -> str:
    """The host name of ``url``, lowercased, without port ("" when it has none)."""
    return (urlsplit(url).hostname or "").rstrip(".")


def partition_unit(url: str, mode: str, key: str | None = None) -> str:
    """The unit ``url`` belongs to under ``mode``: its registered domain, its host, or
    (``url``) its request key, which ``key`` gives when the caller has it."""
    if mode == "domain":
        host = host_of(url)
        return registered_domain(host) if host else ""
    if mode == "host":
        return host_of(url)
    if key is None:
        from crawler.storage.keys import request_key

        key = request_key(url)
    return key


@lru_cache(maxsize=65536)
def stable_hash(unit: str) -> int:
    """A hash of ``unit`` that every process and every run agrees on (Python's
    ``hash`` of a string changes per process)."""
    return int.from_bytes(hashlib.blake2b(unit.encode("utf-8"), digest_size=8).digest(), "big")


def shard_of(url: str, key: str, mode: str, count: int) -> int:
    """The shard (0 to ``count``-1) that ``url`` of request key ``key`` belongs to."""
    if mode == "url":
        return int(key, 16) % count
    return stable_hash(partition_unit(url, mode)) % count


def queue_unit(url: str, mode: str) -> str | None:
    """The unit a work queue stores for ``url``: None under ``url``, where batches
    take any URLs and no unit is held by one holder only."""
    return None if mode == "url" else partition_unit(url, mode)
