"""The ``site`` spider: fetch a list of URLs, optionally following links.

    scrapy crawl site -a urls=urls.txt [-a depth=N] [-a revalidate=1] [-a render=1]

``-a render=1`` renders every page in a browser (middlewares/render.py).

Storage needs nothing from this spider: the project's middlewares store every
response and skip what is stored, for any spider of the project.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterator
from urllib.parse import urlsplit

import scrapy
from scrapy.exceptions import UsageError
from scrapy.http import HtmlResponse, TextResponse
from twisted.internet.threads import deferToThread

from crawler import signals as crawler_signals
from crawler.domains import registered_domain
from crawler.keys import request_key
from crawler.parsers import page_summary

logger = logging.getLogger(__name__)


def check_url(text: str) -> str | None:
    """Why ``text`` is not an absolute http(s) URL, or None when it is one."""
    if any(c.isspace() for c in text):
        return "contains white space"
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        return f"not a URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return "not an absolute http(s) URL"
    if not parts.hostname:
        return "no host name"
    return None


class UrlList:
    """The lines of a URL list, streamed: ``(line number, url, problem)`` per entry.

    Blank lines and ``#`` comments are skipped. Opening happens at construction, so a
    missing or unreadable file is an error before the crawl starts.
    """

    def __init__(self, path: str):
        self.path = path
        if path == "-":
            self._file = sys.stdin.buffer
            self.name = "<stdin>"
        else:
            self.name = path
            try:
                self._file = open(path, "rb")
            except OSError as exc:
                raise UsageError(f"cannot read the URL list {path}: {exc.strerror}") from None

    def __iter__(self) -> Iterator[tuple[int, str, str | None]]:
        with self._file as f:
            for number, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8").strip()
                except UnicodeDecodeError:
                    yield number, raw.decode("utf-8", "replace").strip(), "not UTF-8 text"
                    continue
                if not line or line.startswith("#"):
                    continue
                yield number, line, check_url(line)

    def count(self) -> int | None:
        """Entries in the list (None for standard input), for the progress line.

        Counted in 1 MiB blocks with C-level byte counts, so that a list of millions
        costs the crawl's thread next to nothing; lines holding only white space are
        counted as entries.
        """
        if self.path == "-":
            return None
        entries = 0
        last = b"\n"
        with open(self.path, "rb") as f:
            while block := f.read(1 << 20):
                # From position 1, "^" matches only after a newline: a line split
                # between two blocks is counted once.
                entries += len(_ENTRY_START.findall(last + block, 1))
                last = block[-1:]
        return entries


def parse_shard(value: str | None) -> tuple[int, int] | None:
    """``"I/N"`` as ``(I, N)`` with 0 <= I < N; None when not given."""
    if not value:
        return None
    try:
        index, count = (int(part) for part in value.split("/"))
    except ValueError:
        raise UsageError(f"-a shard takes I/N (e.g. 0/40), not {value!r}") from None
    if not 0 <= index < count:
        raise UsageError(f"-a shard={value}: I must be 0 to N-1")
    return index, count


def in_shard(key: str, shard: tuple[int, int] | None) -> bool:
    """Whether a request key falls in the shard (stable: ``int(key, 16) % N == I``)."""
    return shard is None or int(key, 16) % shard[1] == shard[0]


_ENTRY_START = re.compile(rb"(?m)^[^#\r\n]")


def _flag(value) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


class SiteSpider(scrapy.Spider):
    name = "site"
    # Breadth-first, so that a page is first met at its smallest depth.
    custom_settings = {
        "DEPTH_PRIORITY": 1,
        "SCHEDULER_DISK_QUEUE": "scrapy.squeues.PickleFifoDiskQueue",
        "SCHEDULER_MEMORY_QUEUE": "scrapy.squeues.FifoMemoryQueue",
    }

    def __init__(
        self,
        urls: str | None = None,
        depth: str = "0",
        revalidate: str = "0",
        shard: str | None = None,
        render: str = "0",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.render = _flag(render)  # read by middlewares/render.py and addons/render.py
        # -a shard=I/N: only the listed URLs whose key falls in shard I of N (followed
        # links are not sharded).
        self.shard = parse_shard(shard)
        if not urls:
            raise UsageError(
                "give the URL list: -a urls=PATH (one URL per line; - reads standard input)"
            )
        try:
            self.depth = int(depth)
        except ValueError:
            raise UsageError(f"-a depth takes a whole number, not {depth!r}") from None
        if self.depth < 0:
            raise UsageError(f"-a depth takes a number of 0 or more, not {self.depth}")
        self.revalidate = _flag(revalidate)
        self.url_list = UrlList(urls)
        self.domains: set[str] = set()
        # Smallest depth each followed URL was met at (depth crawls only): concurrent
        # downloads can meet a page deeper first, and its links must still be followed
        # when it is met again higher up, or the pages reached would depend on timing.
        self.depths: dict[str, int] = {}

    async def start(self):
        if self.url_list.path != "-":
            deferToThread(self.url_list.count).addCallback(
                lambda n: self.crawler.stats.set_value("progress/list_total", n)
            )
        for number, url, problem in self.url_list:
            if problem:
                self._bad_line(number, url, problem)
                continue
            request = scrapy.Request(
                url, callback=self.parse, meta={"catalog_replay": self.depth > 0}
            )
            if self.shard is not None:
                # The key decides the shard; computed once, handed to the storage.
                key = request_key(request.url)
                if not in_shard(key, self.shard):
                    continue
                request.meta.update(catalog_key=key, catalog_url=request.url)
            self.domains.add(registered_domain(urlsplit(url).hostname))
            if self.depth:
                self.depths[url] = 0
            yield request

    def _bad_line(self, number: int, text: str, problem: str) -> None:
        message = f"{self.url_list.name}:{number}: {problem}: {text[:200]!r}"
        logger.warning("Skipped line %s", message)
        self.crawler.stats.inc_value("site/bad_lines")
        self.crawler.signals.send_catch_log(
            crawler_signals.action, url=text, key=None, outcome="error", error=message
        )

    def parse(self, response):
        if isinstance(response, HtmlResponse):
            yield page_summary(response)
        yield from self.follow_links(response)

    def follow_links(self, response) -> Iterator[scrapy.Request]:
        depth = response.meta.get("depth", 0)
        if depth >= self.depth or not isinstance(response, TextResponse):
            return
        replay = depth + 1 < self.depth
        for href in response.css("a::attr(href)").getall():
            url = response.urljoin(href.strip()).split("#", 1)[0]
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                continue
            if registered_domain(parts.hostname) not in self.domains:
                continue
            met = self.depths.get(url)
            if met is not None and met <= depth + 1:
                continue
            self.depths[url] = depth + 1
            yield scrapy.Request(
                url,
                callback=self.parse,
                meta={"catalog_replay": replay},
                # Met again, higher up: the dupefilter would drop it.
                dont_filter=met is not None,
            )
