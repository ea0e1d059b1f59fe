"""Scrapy's RetryMiddleware, with each retry written to the action log."""

from __future__ import annotations

from scrapy import Request
from scrapy.downloadermiddlewares.retry import RetryMiddleware

from crawler import signals as crawler_signals


class LoggedRetryMiddleware(RetryMiddleware):
    def _retry(self, request: Request, reason) -> Request | None:
        new_request = super()._retry(request, reason)
        if new_request is not None:
            meta = request.meta
            text = reason if isinstance(reason, str) else f"{type(reason).__name__}: {reason}"
            head = text.split(" ", 1)[0]
            self.crawler.signals.send_catch_log(
                crawler_signals.action,
                url=meta.get("catalog_url", request.url),
                key=meta.get("catalog_key"),
                outcome="retry",
                depth=meta.get("depth", 0),
                attempt=meta.get("retry_times", 0) + 1,
                status=int(head) if head.isdigit() else None,
                error=text,
            )
        return new_request
