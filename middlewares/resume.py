"""Drops stored start requests before they reach the scheduler.

A resumed crawl of a list of millions must skip what is stored at a cost close to
nothing: start requests are looked up in the catalog in batches (one query each) and
never enter the scheduler, the downloader or the middlewares.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from scrapy import Request

from middlewares.archive import ArchiveMiddleware

BATCH = 256


class ResumeSpiderMiddleware:
    def __init__(self, crawler):
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler)

    async def process_start(self, start: AsyncIterator[Any]) -> AsyncIterator[Any]:
        archive = self.crawler.get_downloader_middleware(ArchiveMiddleware)
        if archive is None:
            async for item in start:
                yield item
            return
        batch: list[Request] = []
        async for item in start:
            if isinstance(item, Request):
                batch.append(item)
                if len(batch) < BATCH:
                    continue
            for request in archive.filter_start(batch):
                yield request
            batch = []
            if not isinstance(item, Request):
                yield item
        for request in archive.filter_start(batch):
            yield request
