"""Scrapy's RetryMiddleware, with each retry written to the action log, and back-offs
retried apart from failures.

A 429 or 503 with ``Retry-After`` is the host asking to be asked later, not a failed
attempt: every process waits for it (``middlewares/host_budget.py``) and the request is
then retried without spending ``RETRY_TIMES``, up to ``RETRY_BACKOFF_TIMES`` times
(per request: ``meta["max_backoff_times"]``), so that a host that backs off several
times loses none of its URLs. Past that, such answers are retried as any 429 or 503 is.
"""

from __future__ import annotations

from scrapy import Request
from scrapy.downloadermiddlewares.retry import RetryMiddleware
from scrapy.http import Response
from scrapy.settings import BaseSettings

from crawler.signals import send_action
from middlewares.host_budget import BACKOFF_STATUSES, retry_after_seconds

# Request meta key: back-off retries this request went through (beside retry_times).
META_BACKOFFS = "backoff_times"


class LoggedRetryMiddleware(RetryMiddleware):
    def __init__(self, settings: BaseSettings):
        super().__init__(settings)
        self.max_backoff_times = settings.getint("RETRY_BACKOFF_TIMES")

    def process_response(self, request: Request, response: Response) -> Request | Response:
        if response.status in BACKOFF_STATUSES and not request.meta.get("dont_retry", False):
            seconds = retry_after_seconds(response.headers.get(b"Retry-After"))
            if seconds is not None:
                retry = self._back_off(request, response.status, seconds)
                if retry is not None:
                    return retry
        return super().process_response(request, response)

    def _back_off(self, request: Request, status: int, seconds: float) -> Request | None:
        done = request.meta.get(META_BACKOFFS, 0)
        if done >= request.meta.get("max_backoff_times", self.max_backoff_times):
            self.crawler.stats.inc_value("retry/backoff_max_reached")
            return None
        retry = request.copy()
        retry.meta[META_BACKOFFS] = done + 1
        retry.dont_filter = True
        retry.priority = request.priority + request.meta.get(
            "priority_adjust", self.priority_adjust
        )
        self.crawler.stats.inc_value("retry/backoff_count")
        send_action(
            self.crawler,
            request,
            "retry",
            status=status,
            error=f"{status} with Retry-After: {seconds:g} s (back-off {done + 1})",
        )
        return retry

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
