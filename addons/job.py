"""Reads a hub job's settings into the crawl before it starts.

Listed in ``ADDONS`` (crawler/settings.py); does nothing unless ``JOB`` (setting) or
``HUB_JOB`` (environment) names a job. The job's settings then take precedence over the
project's and the spider's, and the command line's over them; the log names the source
of every setting the job holds. A value no crawl can use (``crawler/hub/jobchecks.py``),
stored by hand or by an older version, is skipped with a warning naming it.
``extensions/job_settings.py`` follows later changes.
"""

from __future__ import annotations

import logging
import os

from scrapy.exceptions import UsageError
from scrapy.settings import SETTINGS_PRIORITIES

from crawler.hub import Hub
from crawler.hub.db import hub_url
from crawler.hub.jobchecks import JobSettingError, check_setting
from crawler.hub.jobs import JobStore

logger = logging.getLogger(__name__)

# Above the project's settings and a spider's custom_settings, below the command line.
JOB_PRIORITY = (SETTINGS_PRIORITIES["spider"] + SETTINGS_PRIORITIES["cmdline"]) // 2


class JobAddon:
    def __init__(self, crawler=None):
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler) -> JobAddon:
        return cls(crawler)

    def update_settings(self, settings) -> None:
        name = settings.get("JOB") or os.environ.get("HUB_JOB")
        if not name:
            return
        url = hub_url(settings, required=True)
        with Hub.open(url, settings.getfloat("HUB_CONNECT_TIMEOUT", 10.0)) as hub:
            job = JobStore(hub).get(name)
            label = hub.label
        spider = getattr(getattr(self.crawler, "spidercls", None), "name", None)
        if spider and job.spider and spider != job.spider:
            raise UsageError(f"job {name!r} runs the spider {job.spider!r}, not {spider!r}")
        for key, value in sorted(job.settings.items()):
            if (settings.getpriority(key) or 0) >= SETTINGS_PRIORITIES["cmdline"]:
                logger.info(
                    "Setting %s=%r from the command line (job %s has %r)",
                    key,
                    settings.get(key),
                    name,
                    value,
                )
                continue
            try:
                check_setting(key, value, settings)
            except JobSettingError as exc:
                logger.warning(
                    "Job %s: %s: skipped, the crawl keeps %r", name, exc, settings.get(key)
                )
                continue
            settings.set(key, value, priority=JOB_PRIORITY)
            logger.info("Setting %s=%r from job %s in the hub %s", key, value, name, label)
        # What was said of each of the job's values here, the running crawl does not
        # say again (extensions/job_settings.py).
        settings.set("JOB_SETTINGS_READ", dict(job.settings), priority="cmdline")
        settings.set("JOB", name, priority="cmdline")
        settings.set("JOB_VERSION", job.version, priority="cmdline")
