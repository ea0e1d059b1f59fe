"""Checks a job's settings: when ``scrapy job`` sets them, and when a crawl reads them.

A job's settings are text (``KEY=VALUE``) that each crawl process reads with Scrapy's
typed getters, so a value is checked the same way: the type of the setting's default
(Scrapy's or the project's) decides the getter. A name with no default is a spider's
own or a typo: kept, with a warning. Settings that say where a crawl reads and writes
belong to each process's command line, never to a job.
"""

from __future__ import annotations

from collections.abc import Callable

from scrapy.settings import BaseSettings

from crawler.hub.jobs import JobError

# A job naming these would send its processes to another hub, job or data directory
# than the ones they were started with (a proxied crawl reading its job from one hub
# and leasing from another, empty one, goes direct without a word).
PLACE_SETTINGS = frozenset({"DATA_DIR", "HUB_URL", "HUB_JOB", "JOB", "JOB_VERSION", "CATALOG_SEEN"})
# Read with getfloat although Scrapy's default is an int.
FLOAT_SETTINGS = frozenset({"DOWNLOAD_DELAY", "DOWNLOAD_TIMEOUT", "DNS_TIMEOUT"})
# Below these a crawl stalls (no download slot) or its downloader fails.
MINIMUM = {
    "CONCURRENT_REQUESTS": 1,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
    "DOWNLOAD_DELAY": 0,
    "DOWNLOAD_TIMEOUT": 0,
}

Getter = Callable[[BaseSettings, str], object]


class JobSettingError(JobError):
    """A job setting no crawl can use; the message names the setting and the value."""


def _kind(name: str, default: object) -> tuple[Getter, str] | None:
    if isinstance(default, bool):
        return BaseSettings.getbool, "true or false (True, False, 1 or 0)"
    if isinstance(default, int) and name not in FLOAT_SETTINGS:
        return BaseSettings.getint, "an integer"
    if isinstance(default, (int, float)):
        return BaseSettings.getfloat, "a number"
    if isinstance(default, dict):
        return BaseSettings.getdict, "a JSON object"
    return None  # text, lists (any text is one), no default: anything goes


def check_setting(name: str, value: str, defaults: BaseSettings) -> str | None:
    """Raise JobSettingError when ``value`` cannot be setting ``name``; return a warning
    when ``name`` is neither Scrapy's nor the project's (``defaults`` has both)."""
    if name in PLACE_SETTINGS:
        raise JobSettingError(
            f"{name} cannot be a job setting: it decides where a crawl reads and writes; "
            f"give it on each crawl's command line (-s {name}=...)"
        )
    if name not in defaults:
        return (
            f"warning: {name} is not a setting of Scrapy or this project: stored for a "
            "spider that reads it (check the spelling)"
        )
    kind = _kind(name, defaults.get(name))
    if kind is None:
        return None
    getter, what = kind
    try:
        got = getter(BaseSettings({name: value}), name)
    except (TypeError, ValueError):
        raise JobSettingError(f"{name}={value!r} is not {what}") from None
    low = MINIMUM.get(name)
    if low is not None and got < low:
        raise JobSettingError(f"{name}={value!r}: give {what} of at least {low}")
    return None


def check_settings(settings: dict[str, str], defaults: BaseSettings) -> list[str]:
    """Check every one of ``settings`` (the first bad one raises); the warnings."""
    warnings = [check_setting(name, value, defaults) for name, value in sorted(settings.items())]
    return [w for w in warnings if w]
