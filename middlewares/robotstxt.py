"""Scrapy's RobotsTxtMiddleware, with every waiter getting the parsed robots.txt.

Requests that arrive while a site's robots.txt is being fetched all await one
Deferred. Awaited through ``asFuture`` (the asyncio reactor), its first waiter's
callback returns None, so every later waiter got None, meaning "no robots.txt", and
their requests went out unchecked. Once the Deferred has fired the parser is in
``_parsers``: read it from there.
"""

from __future__ import annotations

from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware as ScrapyRobotsTxtMiddleware
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet.defer import Deferred


class RobotsTxtMiddleware(ScrapyRobotsTxtMiddleware):
    async def robot_parser(self, request):
        parser = await super().robot_parser(request)
        if parser is None:
            parser = self._parsers.get(urlparse_cached(request).netloc)
            if isinstance(parser, Deferred):
                return None
        return parser
