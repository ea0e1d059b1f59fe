"""The start path of a crawl of a long list: stored requests dropped, the rest fed lazily.

A resumed crawl of a list of millions must skip what is stored at a cost close to
nothing: start requests are looked up in the catalog in batches (one query each, in a
thread while the reactor keeps fetching) and never enter the scheduler, the downloader
or the middlewares. A spider that reads its list through ``crawler.spiderkit.start``
(the ``site`` spider does) skips them before building them, which costs less again;
its requests come here checked already and pass as they are.

Scrapy reads a spider's start requests as fast as it can and keeps them all in the
scheduler, so a list of millions of URLs would be held in memory whole. Here the next
one is handed over only when the downloader has room or the scheduler ran dry, so
that memory stays flat however long the list.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from scrapy import Request, signals

from extensions.storage import StorageExtension

BATCH = 256


class ResumeSpiderMiddleware:
    def __init__(self, crawler):
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler)

    async def process_start(self, start: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for item in self._unstored(start):
            # Resumed when the engine asks for the next one, i.e. once this one is
            # scheduled: while it cannot send it, wait for the scheduler to run dry.
            yield item
            if self.crawler.engine.needs_backout():
                await self.crawler.signals.wait_for(signals.scheduler_empty)

    async def _unstored(self, start: AsyncIterator[Any]) -> AsyncIterator[Any]:
        archive = StorageExtension.of(self.crawler)
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
            for request in await archive.stored.filter_start_async(batch):
                yield request
            batch = []
            if not isinstance(item, Request):
                yield item
        for request in await archive.stored.filter_start_async(batch):
            yield request
