"""Follows a running job's settings in the hub (``scrapy job set``) and applies the live
ones to this crawl without a restart.

On when the crawl runs a job (``JOB``, see ``addons/job.py``). Every
``JOB_REFRESH_SECONDS`` it asks the hub, in a thread, whether the job changed; the
settings of :data:`LIVE_SETTINGS` that changed are applied at once, the others are
logged as taking effect at the next start. Settings given on the command line still win.
A value no crawl can use is skipped, said once, and the job's other changes applied.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.settings import SETTINGS_PRIORITIES, Settings
from twisted.internet.task import LoopingCall
from twisted.internet.threads import deferToThread

from crawler.hub import Hub, HubError
from crawler.hub.db import hub_url
from crawler.hub.jobchecks import JobSettingError, check_setting
from crawler.hub.jobs import Job, JobStore
from crawler.signals import live_settings_changed

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

DOWNLOADER_SETTINGS = ("CONCURRENT_REQUESTS", "CONCURRENT_REQUESTS_PER_DOMAIN", "DOWNLOAD_DELAY")
PROXY_SETTINGS = (
    "PROXY_ROTATE_EVERY",
    "PROXY_REST_SECONDS",
    "PROXY_BAN_REST_SECONDS",
    "PROXY_BAN_STATUSES",
    "PROXY_BAN_BODY_MARKERS",
    "PROXY_MAX_BAN_RETRIES",
)
LIVE_SETTINGS = DOWNLOADER_SETTINGS + PROXY_SETTINGS


class JobSettingsExtension:
    def __init__(self, crawler: Crawler) -> None:
        settings = crawler.settings
        self.name = settings.get("JOB")
        if not self.name:
            # No message: Scrapy would log a warning for every crawl without a job.
            raise NotConfigured
        self.crawler = crawler
        self.interval = settings.getfloat("JOB_REFRESH_SECONDS", 60.0)
        self.version = settings.getint("JOB_VERSION")
        self.url = hub_url(settings, required=True)
        self.current = {key: settings.get(key) for key in LIVE_SETTINGS}
        self.pinned = {
            key
            for key in LIVE_SETTINGS
            if (settings.getpriority(key) or 0) >= SETTINGS_PRIORITIES["cmdline"]
        }
        # The job's values this crawl has taken, skipped or reported, so that each is
        # said once (by the job addon at the start, or here).
        self.seen: dict[str, str] = dict(settings.getdict("JOB_SETTINGS_READ"))
        self._missing = object()
        self._hub: Hub | None = None
        self._loop: LoopingCall | None = None
        self._asking = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> JobSettingsExtension:
        ext = cls(crawler)
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        return ext

    def spider_opened(self) -> None:
        self._loop = LoopingCall(self.refresh)
        self._loop.start(self.interval, now=False)

    def spider_closed(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        if self._hub is not None:
            self._hub.close()

    # --- asking the hub -----------------------------------------------------------------
    def refresh(self) -> None:
        if self._asking:
            return
        self._asking = True
        d = deferToThread(self._newer)
        d.addCallbacks(self._apply, self._failed)
        d.addBoth(self._done)

    def _newer(self) -> Job | None:
        if self._hub is None:
            self._hub = Hub.open(self.url)
        return JobStore(self._hub).newer(self.name, self.version)

    def _failed(self, failure: Any) -> None:
        if failure.check(HubError):
            logger.debug("Could not read job %s from the hub: %s", self.name, failure.value)
            return
        logger.error("Could not read job %s from the hub: %s", self.name, failure.value)

    def _done(self, _: Any) -> None:
        self._asking = False

    # --- applying -----------------------------------------------------------------------
    def _apply(self, job: Job | None) -> None:
        if job is None:
            return
        self.version = job.version
        changed = {
            k: v
            for k, v in job.settings.items()
            if self.current.get(k, self._missing) != v and self.seen.get(k) != v
        }
        live = {}
        for key in sorted(changed):
            if key in self.pinned:
                logger.info("Job %s changed %s; the command line's value stays", self.name, key)
            elif not self._usable(key, changed[key], job.version):
                pass
            elif key not in LIVE_SETTINGS:
                logger.warning(
                    "Job %s changed %s to %r: it takes effect when a crawl process starts",
                    self.name,
                    key,
                    changed[key],
                )
            else:
                live[key] = changed[key]
                continue
            # Said once: later versions that keep this value say nothing of it.
            self.seen[key] = changed[key]
        if not live:
            return
        try:
            self._apply_live(live)
        except (TypeError, ValueError) as exc:
            # The values passed check_setting: a downloader or middleware refused them.
            self.seen.update(live)
            logger.error("Job %s version %d: not applied: %s", self.name, job.version, exc)
            return
        for key in sorted(live):
            logger.warning(
                "Job %s version %d: %s %r -> %r (applied live)",
                self.name,
                job.version,
                key,
                self.current.get(key),
                live[key],
            )
            self.current[key] = live[key]
        self.crawler.stats.inc_value("job/settings_applied", len(live))

    def _usable(self, key: str, value: str, version: int) -> bool:
        try:
            check_setting(key, value, self.crawler.settings)
        except JobSettingError as exc:
            logger.error(
                "Job %s version %d: %s: skipped, the crawl keeps %r",
                self.name,
                version,
                exc,
                self.current.get(key, self.crawler.settings.get(key)),
            )
            self.crawler.stats.inc_value("job/settings_skipped")
            return False
        return True

    def _apply_live(self, live: dict[str, str]) -> None:
        values = Settings({**self.crawler.settings.copy_to_dict(), **self.current, **live})
        self.crawler.signals.send_catch_log(
            live_settings_changed, settings=values, changed=set(live)
        )
