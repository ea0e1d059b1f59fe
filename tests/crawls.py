"""In-process crawls of the project's spiders on the test's reactor.

A crawl here is the one ``scrapy crawl`` runs, settings and components included, without
an interpreter to start; tests that are about the process itself (exit status, signals,
kills, the command line) start ``scrapy crawl`` instead (``tests.conftest.run_crawl``).
"""

from __future__ import annotations

from pathlib import Path

import pytest_twisted
import scrapy
from scrapy.crawler import Crawler, CrawlerRunner
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_from_coro

from commands.crawl import exit_status
from spiders.site import SiteSpider
from tests.conftest import project_settings, write_urls


class WatchesScheduler:
    """Mixed into a spider: notes in ``most_scheduled`` the most requests the scheduler
    held at once."""

    @classmethod
    def from_crawler(cls, crawler, *args, **kwargs):
        spider = super().from_crawler(crawler, *args, **kwargs)
        spider.most_scheduled = 0
        crawler.signals.connect(spider.scheduled, signal=scrapy.signals.request_scheduled)
        return spider

    def scheduled(self, request, spider):
        held = len(self.crawler.engine.scheduler)
        self.most_scheduled = max(self.most_scheduled, held)


class OnePage(scrapy.Spider):
    """Holds no file open, so that a crawl refused at start leaves nothing open behind."""

    name = "one_page"

    def __init__(self, url: str, **kwargs):
        super().__init__(**kwargs)
        self.start_urls = [url]

    def parse(self, response):
        pass


async def crawl(
    spider_cls, data_dir: Path, settings: dict | None = None, *, status: int = 0, **args
) -> Crawler:
    """Crawl with ``spider_cls`` (spider arguments ``args``) into ``data_dir``; the
    crawl must end as ``scrapy crawl`` exits ``status``.

    ``settings`` are set as ``-s`` sets them (command-line priority, recorded as the
    run's settings), and so is ``DATA_DIR``, as ``run_crawl`` gives it."""
    values = Settings(project_settings(data_dir))
    values.setdict({"DATA_DIR": str(data_dir), **(settings or {})}, priority="cmdline")
    # Not get_crawler, whose settings are frozen before the spider is made: a spider's
    # from_crawler may still set them, as under ``scrapy crawl``.
    crawler = CrawlerRunner(values).create_crawler(spider_cls)
    await crawler.crawl_async(**args)
    stats = crawler.stats
    ended = exit_status(stats.get_value("finish_reason"), stats.get_value("archive/error"))
    assert ended == status, f"the crawl would exit {ended}: {stats.get_stats()}"
    return crawler


async def crawl_site(
    urls: list[str] | str | Path, data_dir: Path, settings: dict | None = None, **args
) -> Crawler:
    """The ``site`` spider over ``urls`` (a list, written beside ``data_dir``, or a path)."""
    if isinstance(urls, list):
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        urls = write_urls(data_dir.parent / f"{data_dir.name}-urls.txt", urls)
    return await crawl(SiteSpider, data_dir, settings, urls=str(urls), **args)


def crawled(coro) -> Crawler:
    """The crawler of ``coro`` (a crawl above), run to its end from a synchronous
    fixture: a module-scoped fixture cannot await, and one crawl serves its tests."""
    return pytest_twisted.blockon(deferred_from_coro(coro))
