"""Checks a job's settings: when ``scrapy job`` sets them, and when a crawl reads them.

A job's settings are text (``KEY=VALUE``) that each crawl process reads as it reads
``-s``: a value is checked as crawler/settingspecs.py declares its setting (or, for
one declared nowhere, by the type of its default). The defaults (Scrapy's and the
project's) are handed in: the hub imports no Scrapy. A name with no default is a
spider's own or a typo: kept, with a warning naming the closest known setting.
Settings that say where a crawl reads and writes belong to each process's command
line, never to a job.
"""

from __future__ import annotations

from collections.abc import Mapping

from crawler import settingspecs
from crawler.hub.jobs import JobError

# A job naming these would send its processes to another hub, job or data directory
# than the ones they were started with (a proxied crawl reading its job from one hub
# and leasing from another, empty one, goes direct without a word).
PLACE_SETTINGS = frozenset({"DATA_DIR", "HUB_URL", "HUB_JOB", "JOB", "JOB_VERSION", "CATALOG_SEEN"})


class JobSettingError(JobError):
    """A job setting no crawl can use; the message names the setting and the value."""


def check_setting(name: str, value: str, defaults: Mapping[str, object]) -> str | None:
    """Raise JobSettingError when ``value`` cannot be setting ``name``; return a warning
    when ``name`` is neither Scrapy's nor the project's (``defaults`` has both: a
    mapping, or Scrapy settings)."""
    if name in PLACE_SETTINGS:
        raise JobSettingError(
            f"{name} cannot be a job setting: it decides where a crawl reads and writes; "
            f"give it on each crawl's command line (-s {name}=...)"
        )
    try:
        settingspecs.check_value(name, value, defaults)
    except settingspecs.SettingValueError as exc:
        raise JobSettingError(str(exc)) from None
    unknown = settingspecs.unknown_name(name, defaults, " (stored for a spider that reads it)")
    return f"warning: {unknown}" if unknown else None


def check_settings(settings: dict[str, str], defaults: Mapping[str, object]) -> list[str]:
    """Check every one of ``settings`` (the first bad one raises) and the ones read
    together (the others' values from ``defaults``); the warnings."""
    warnings = [check_setting(name, value, defaults) for name, value in sorted(settings.items())]

    def value(name: str) -> object:
        given = settings[name] if name in settings else defaults.get(name)
        return None if given is None else settingspecs.check_value(name, given, defaults)

    try:
        settingspecs.check_combinations(value)
    except settingspecs.SettingValueError as exc:
        raise JobSettingError(str(exc)) from None
    return [w for w in warnings if w]
