"""A crawl's log at INFO: its start, its progress lines, one line per problem URL and its
summary.

Scrapy logs at INFO what a user reads once (its version banner, the components it
enabled, the overridden settings, a stats dump of 80 lines) and each download failure
with its whole traceback. Filters on Scrapy's loggers demote the first to DEBUG, where
``-L DEBUG`` still shows them, and cut the second to one line, none when the URL was
already named (Scrapy's "Gave up retrying", the over-DOWNLOAD_MAXSIZE warning).
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from collections.abc import Callable

# Logger name -> message prefixes (of the unformatted message) demoted to DEBUG.
DEMOTED: dict[str, tuple[str, ...]] = {
    "scrapy.utils.log": ("Scrapy %", "Versions", "Using reactor", "Using asyncio"),
    "scrapy.addons": ("Enabled addons",),
    "scrapy.middleware": ("Enabled ",),
    "scrapy.crawler": ("Overridden settings",),
    "scrapy.statscollectors": ("Dumping Scrapy stats",),
    # Our progress lines say the same, with the list's progress and an ETA.
    "scrapy.extensions.logstats": ("",),
    "scrapy.core.engine": ("Spider opened", "Closing spider"),
}
# Components that are off unless configured: their "Disabled ..." is no news.
OFF_BY_DEFAULT = ("HUB_URL is not set", "PROXY_ENABLED is False")
# Loggers whose warnings and errors name a request that failed for good.
NAMING = (
    "scrapy.downloadermiddlewares.retry",
    "scrapy.core.downloader.handlers._base_streaming",
    "scrapy.core.downloader.handlers.http11",
    "scrapy.core.downloader.handlers.http2",
)
SCRAPER = "scrapy.core.scraper"
# Log a failed robots.txt download: Scrapy's middleware, and ours that shares robots.txt
# through the hub (it fetches the file itself).
ROBOTS = ("scrapy.downloadermiddlewares.robotstxt", "middlewares.robotstxt")
_REQUEST = re.compile(r"<[A-Z]+ [^\s>]+>")
_ORIGIN = re.compile(r"<[A-Z]+ ([a-z]+://[^/\s>]+)")


def _demote(record: logging.LogRecord) -> None:
    record.levelno, record.levelname = logging.DEBUG, "DEBUG"


class DemoteFilter(logging.Filter):
    """Demote a logger's records whose message starts with one of ``prefixes``."""

    def __init__(self, prefixes: tuple[str, ...], also: Callable[[logging.LogRecord], bool]):
        super().__init__()
        self.prefixes = prefixes
        self.also = also

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith(self.prefixes) or self.also(record):
            _demote(record)
        return True


def _off_by_default(record: logging.LogRecord) -> bool:
    return str(record.msg).startswith("Disabled ") and any(
        reason in record.getMessage() for reason in OFF_BY_DEFAULT
    )


class ProblemLines(logging.Filter):
    """One line per failed download: Scrapy's "Error downloading" without its
    traceback, demoted to DEBUG when a warning or error named the request already."""

    def __init__(self, remember: int = 10_000):
        super().__init__()
        self.named: OrderedDict[str, None] = OrderedDict()
        self.remember = remember

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name in (SCRAPER, *ROBOTS):
            self._download_error(record)
        elif record.levelno >= logging.WARNING:
            for request in _REQUEST.findall(record.getMessage()):
                self.named[request] = None
                if len(self.named) > self.remember:
                    self.named.popitem(last=False)
        return True

    def _download_error(self, record: logging.LogRecord) -> None:
        if not str(record.msg).startswith("Error downloading") or not record.exc_info:
            return
        message = record.getMessage()
        exc = record.exc_info[1]
        if record.name == SCRAPER:
            message = f"{message}: {type(exc).__name__}: {exc}".rstrip(": ")
            named = _REQUEST.findall(message)
        else:
            named = [f"<GET {origin}/robots.txt>" for origin in _ORIGIN.findall(message)]
        record.msg, record.args = message, None
        record.exc_info = record.exc_text = None
        if any(request in self.named for request in named):
            _demote(record)


def quiet_crawl_log(quiet: bool = True) -> None:
    """Install the filters (once per process: commands run once); with *quiet* False
    (``LOG_QUIET``), only the one line per failed download."""
    for name, prefixes in DEMOTED.items() if quiet else ():
        logger = logging.getLogger(name)
        if not any(isinstance(f, DemoteFilter) for f in logger.filters):
            also = _off_by_default if name == "scrapy.middleware" else (lambda record: False)
            logger.addFilter(DemoteFilter(prefixes, also))
    problems = ProblemLines()
    for name in (*NAMING, SCRAPER, *ROBOTS):
        logger = logging.getLogger(name)
        if not any(isinstance(f, ProblemLines) for f in logger.filters):
            logger.addFilter(problems)
