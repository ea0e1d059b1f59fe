"""HTTP downloads over a connection pool whose idle connections are bounded.

Twisted's ``HTTPConnectionPool`` (which Scrapy's HTTP/1.1 handler uses) keeps up to
``CONCURRENT_REQUESTS_PER_DOMAIN`` idle connections *per host* for 240 seconds, keeps a
connection the server closed until those 240 seconds are up, and keeps a list for every
host it ever reached. A crawl over many hosts so holds every connection of its last
four minutes: at 400 pages a second about 100,000 of them, 3-4 KB each, and a key for
each host of the run. :class:`BoundedConnectionPool` keeps at most
``HTTP_IDLE_CONNECTIONS_MAX`` idle connections over all hosts, the least recently used
closed first, and forgets a host with none.

Scrapy has no setting for the pool; :class:`PooledHTTPDownloadHandler` replaces the one
its handler made (``HTTP11DownloadHandler._pool``), and ``tests/test_scrapy_internals.py``
fails when a Scrapy or Twisted release changes what this relies on.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from scrapy.core.downloader.handlers.http11 import HTTP11DownloadHandler
from twisted.web.client import HTTPConnectionPool


class BoundedConnectionPool(HTTPConnectionPool):
    """Twisted's pool, with at most *idle_max* idle connections over all hosts."""

    def __init__(self, reactor: Any, idle_max: int, persistent: bool = True) -> None:
        super().__init__(reactor, persistent=persistent)
        self.idle_max = idle_max
        # Every idle connection (its key as value), least recently put back first.
        self._idle: OrderedDict[Any, Any] = OrderedDict()

    def getConnection(self, key, endpoint):  # noqa: N802 - Twisted's name
        before = list(self._connections.get(key, ()))
        got = super().getConnection(key, endpoint)
        self._forget(key, before)
        return got

    def _putConnection(self, key, connection) -> None:  # noqa: N802
        before = list(self._connections.get(key, ()))
        super()._putConnection(key, connection)
        self._forget(key, before)
        if connection in self._connections.get(key, ()):
            self._idle[connection] = key
        while len(self._idle) > self.idle_max:
            oldest, its_key = self._idle.popitem(last=False)
            self._timeouts.pop(oldest).cancel()
            self._connections[its_key].remove(oldest)
            self._forget(its_key, ())
            oldest.transport.loseConnection()

    def _removeConnection(self, key, connection) -> None:  # noqa: N802
        super()._removeConnection(key, connection)
        self._idle.pop(connection, None)
        self._forget(key, ())

    def _forget(self, key, before: list) -> None:
        """Drop from the idle ones those of *before* the pool no longer holds for *key*,
        and *key* itself once it holds none."""
        held = self._connections.get(key)
        for connection in before:
            if not held or connection not in held:
                self._idle.pop(connection, None)
        if held is not None and not held:
            del self._connections[key]

    def closeCachedConnections(self):  # noqa: N802
        self._idle.clear()
        return super().closeCachedConnections()


class PooledHTTPDownloadHandler(HTTP11DownloadHandler):
    """Scrapy's HTTP/1.1 download handler over a :class:`BoundedConnectionPool`."""

    def __init__(self, crawler) -> None:
        super().__init__(crawler)
        from twisted.internet import reactor

        pool = BoundedConnectionPool(reactor, crawler.settings.getint("HTTP_IDLE_CONNECTIONS_MAX"))
        pool.maxPersistentPerHost = self._pool.maxPersistentPerHost
        pool._factory = self._pool._factory
        self._pool = pool
