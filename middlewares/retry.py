"""Scrapy's RetryMiddleware, with each retry written to the action log."""

from __future__ import annotations

from scrapy import Request
from scrapy.downloadermiddlewares.retry import RetryMiddleware

from crawler.signals import send_action


class LoggedRetryMiddleware(RetryMiddleware):
    def _retry(self, request: Request, reason) -> Request | None:
        new_request = super()._retry(request, reason)
        if new_request is not None:
            text = reason if isinstance(reason, str) else f"{type(reason).__name__}: {reason}"
            head = text.split(" ", 1)[0]
            send_action(
                self.crawler,
                request,
                "retry",
                status=int(head) if head.isdigit() else None,
                error=text,
            )
        return new_request
