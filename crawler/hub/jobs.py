"""Jobs in the hub: a named crawl (spider, settings, work queue) that every process of
it reads its settings from.

A job is created once (``scrapy job create``), its settings changed in one place
(``scrapy job set``), and each crawl process started with ``-s JOB=NAME`` (or the
``HUB_JOB`` environment variable) reads them when it starts (``addons/job.py``) and
again while it runs (``extensions/job_settings.py``). Every change bumps the job's
``version``, so a running process asks "anything newer than version N?" and gets an
answer of one row.

Settings are stored as the strings given on the command line (``KEY=VALUE``): Scrapy's
typed getters read them as they read ``-s`` values.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from crawler.hub.db import Hub
from crawler.hub.errors import HubError
from crawler.hub.locks import AdvisoryLock

JOB_SCHEMA_VERSION = 1

_JOB_MIGRATIONS: dict[int, list[str]] = {
    1: [
        """CREATE TABLE IF NOT EXISTS hub_jobs (
            id {id},
            name TEXT NOT NULL UNIQUE,
            spider TEXT NOT NULL,
            queue TEXT NOT NULL DEFAULT '',
            settings TEXT NOT NULL DEFAULT '{{}}',
            version INTEGER NOT NULL DEFAULT 1,
            created {real} NOT NULL,
            updated {real} NOT NULL
        )""",
    ],
}


class JobError(HubError):
    """A job operation failed: no such job, a malformed setting, a name taken."""


@dataclass(frozen=True)
class Job:
    name: str
    spider: str
    queue: str
    settings: dict[str, str] = field(default_factory=dict)
    version: int = 1
    created: float = 0.0
    updated: float = 0.0


def parse_assignments(pairs: Iterable[str], where: str = "") -> dict[str, str]:
    """``KEY=VALUE`` strings as a dict; an error names the malformed one."""
    settings: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip() or key.strip() != key.strip().upper():
            raise JobError(
                f"{where}{pair!r} is not a setting: give KEY=VALUE, KEY in capitals "
                "(e.g. CONCURRENT_REQUESTS=8)"
            )
        settings[key.strip()] = value
    return settings


class JobStore:
    """The jobs of one hub."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        hub.migrate("hub_job_schema", _JOB_MIGRATIONS, AdvisoryLock.JOB_SCHEMA)

    def create(self, name: str, spider: str, settings: Mapping[str, str], queue: str = "") -> Job:
        if not name or len(name) > 200:
            raise JobError(f"job name {name!r}: give 1 to 200 characters")
        with self.hub.transaction() as tx:
            taken = tx.execute("SELECT 1 FROM hub_jobs WHERE name = ?", (name,)).fetchone()
            if taken:
                raise JobError(
                    f"a job {name!r} exists in the hub {self.hub.label}: change its "
                    "settings with `scrapy job set`, or pick another name"
                )
            tx.execute(
                "INSERT INTO hub_jobs (name, spider, queue, settings, created, updated) "
                "VALUES (?, ?, ?, ?, NOW(), NOW())",
                (name, spider, queue, json.dumps(dict(settings), sort_keys=True)),
            )
        return self.get(name)

    def set(self, name: str, settings: Mapping[str, str]) -> Job:
        """Change (add) settings of a job; every process of it follows."""
        with self.hub.transaction() as tx:
            row = tx.execute(
                "SELECT settings FROM hub_jobs WHERE name = ?" + tx.dialect.for_update,
                (name,),
            ).fetchone()
            if row is None:
                raise self._missing(name)
            merged = {**json.loads(row[0]), **settings}
            tx.execute(
                "UPDATE hub_jobs SET settings = ?, version = version + 1, updated = NOW() "
                "WHERE name = ?",
                (json.dumps(merged, sort_keys=True), name),
            )
        return self.get(name)

    def get(self, name: str) -> Job:
        job = self.newer(name, 0)
        if job is None:
            raise self._missing(name)
        return job

    def newer(self, name: str, version: int) -> Job | None:
        """The job if its version is above *version*, else None (one indexed row)."""
        rows = self.hub.query(
            "SELECT name, spider, queue, settings, version, created, updated FROM hub_jobs "
            "WHERE name = ? AND version > ?",
            (name, version),
        )
        return _job(rows[0]) if rows else None

    def jobs(self) -> list[Job]:
        rows = self.hub.query(
            "SELECT name, spider, queue, settings, version, created, updated FROM hub_jobs "
            "ORDER BY name"
        )
        return [_job(row) for row in rows]

    def _missing(self, name: str) -> JobError:
        return JobError(
            f"no job {name!r} in the hub {self.hub.label}: create it with "
            "`scrapy job create NAME --spider SPIDER` (`scrapy job list` shows the jobs)"
        )


def _job(row: tuple[Any, ...]) -> Job:
    name, spider, queue, settings, version, created, updated = row
    return Job(name, spider, queue, json.loads(settings), int(version), created, updated)
