"""Scrapy's RetryMiddleware, with each retry written to the action log, and back-offs
retried apart from failures.

A back-off (:meth:`crawler.politeness.HostPolicy.backoff`: a 429 or 503 with a usable
``Retry-After``) is the host asking to be asked later, not a failed attempt: nothing goes
to the host until it ends (the downloader holds its requests; with host budgets, every
process waits for it) and the request is then retried without spending ``RETRY_TIMES``,
up to ``RETRY_BACKOFF_TIMES`` times (per request: ``meta["max_backoff_times"]``), so that
a host that backs off several times loses none of its URLs. Past that, such answers are
retried as any 429 or 503 is.
"""

from __future__ import annotations

from scrapy import Request
from scrapy.downloadermiddlewares.retry import RetryMiddleware
from scrapy.exceptions import UsageError
from scrapy.http import Response
from scrapy.settings import BaseSettings

from crawler.politeness import HostPolicy, HostPolicyError
from crawler.signals import live_settings_changed, send_action

# Request meta key: back-off retries this request went through (beside retry_times).
META_BACKOFFS = "backoff_times"


class LoggedRetryMiddleware(RetryMiddleware):
    def __init__(self, settings: BaseSettings):
        super().__init__(settings)
        try:
            self.policy = HostPolicy.from_settings(settings)
        except HostPolicyError as exc:
            raise UsageError(str(exc)) from None

    @classmethod
    def from_crawler(cls, crawler):
        mw = super().from_crawler(crawler)
        crawler.signals.connect(mw.settings_changed, signal=live_settings_changed)
        return mw

    def settings_changed(self, settings: BaseSettings, changed: set[str]) -> None:
        self.policy = self.policy.updated(settings)

    def process_response(self, request: Request, response: Response) -> Request | Response:
        seconds = self.policy.backoff(response.status, response.headers.get(b"Retry-After"))
        if seconds is not None and not request.meta.get("dont_retry", False):
            # Without host budgets, this process alone keeps to it.
            back_off = getattr(self.crawler.engine.downloader, "back_off", None)
            if back_off is not None:
                back_off(request, seconds, f"HTTP {response.status}, Retry-After: {seconds:g} s")
            retry = self._back_off(request, response.status, seconds)
            if retry is not None:
                return retry
        return super().process_response(request, response)

    def _back_off(self, request: Request, status: int, seconds: float) -> Request | None:
        done = request.meta.get(META_BACKOFFS, 0)
        if done >= request.meta.get("max_backoff_times", self.policy.backoff_times):
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
