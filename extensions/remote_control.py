"""Scrapy's remote control, its module imported only when REMOTE_CONTROL_ENABLED is on.

Scrapy's ``scrapy.extensions.remote_control`` imports aiohttp when it is imported, and
Scrapy imports every extension named in ``EXTENSIONS_BASE`` to merge the lists, enabled
or not: about a tenth of a second of every crawl process's start, for an HTTP control
port the project keeps off (``REMOTE_CONTROL_ENABLED``). ``crawler/settings.py`` lists
this extension in its place.
"""

from __future__ import annotations

from scrapy.exceptions import NotConfigured


class RemoteControl:
    @classmethod
    def from_crawler(cls, crawler):
        if not crawler.settings.getbool("REMOTE_CONTROL_ENABLED"):
            raise NotConfigured  # with a message, Scrapy would warn of it in every crawl
        from scrapy.extensions.remote_control import RemoteControl as ScrapyRemoteControl

        return ScrapyRemoteControl.from_crawler(crawler)
