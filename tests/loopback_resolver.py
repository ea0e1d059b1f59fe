"""A Scrapy DNS resolver that answers 127.0.0.1 for the host names a test lists.

Tests have no DNS, yet registered domains are about names (``shop.example.co.uk``,
``other.co.uk``). Scrapy loads its resolver from the ``TWISTED_DNS_RESOLVER``
setting, so a crawl run with

    -s TWISTED_DNS_RESOLVER=tests.loopback_resolver.LoopbackResolver
    -s LOOPBACK_HOSTS=www.example.co.uk,other.co.uk

reaches a server on 127.0.0.1 under those names (the port is in the URLs): the
spider, the middlewares and the downloader run as in any crawl; only the name lookup
is local. An entry that starts with a dot (``.bench.test``) stands for every name that
ends with it (a benchmark's 100,000 hosts). Names not listed are looked up as usual.
"""

from __future__ import annotations

from scrapy.resolver import CachingThreadedResolver
from twisted.internet import defer


class LoopbackResolver(CachingThreadedResolver):
    def __init__(self, reactor, cache_size: int, timeout: float, hosts: list[str]):
        super().__init__(reactor, cache_size, timeout)
        self.hosts = {host.lower() for host in hosts}
        self.suffixes = tuple(host for host in self.hosts if host.startswith("."))

    @classmethod
    def from_crawler(cls, crawler, reactor):
        settings = crawler.settings
        cache_size = settings.getint("DNSCACHE_SIZE") if settings.getbool("DNSCACHE_ENABLED") else 0
        return cls(
            reactor,
            cache_size,
            settings.getfloat("DNS_TIMEOUT"),
            settings.getlist("LOOPBACK_HOSTS"),
        )

    def getHostByName(self, name: str, timeout=()):  # noqa: N802 - Twisted's name
        name_lower = name.lower()
        if name_lower in self.hosts or name_lower.endswith(self.suffixes):
            return defer.succeed("127.0.0.1")
        return super().getHostByName(name, timeout)
