"""The action log as the crawl's process writes it: :class:`ActionRecorder`.

A part of the storage extension (``extensions/storage/extension.py``), which builds it
and hands it to the other parts. Each final outcome of a URL is one line, counted
(``actions/<outcome>``); a URL met again after its final line is counted as a
duplicate (``catalog/duplicates``) and not logged a second time. The ``ok`` and
``unchanged`` lines of stored answers are the writer process's, written once their
rows are committed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from scrapy import Request

from crawler import signals as crawler_signals
from crawler.storage.actionlog import NOT_FINAL, Outcome, error_kind
from crawler.storage.runcounts import RunCounts
from crawler.storage.session import StorageSession
from extensions.storage.requests import catalog_key


class ActionRecorder:
    """The crawl process's one writer of the action log: each outcome a line, counted;
    a URL met again counted as a duplicate instead."""

    def __init__(self, session: StorageSession, counts: RunCounts, fail: Callable[[str], None]):
        self.session = session
        self.counts = counts
        self._fail = fail
        self._log_failed = False
        # The run's last error line: (time, URL, what it says), for the live views.
        self.last_error: tuple[float, str, str] | None = None

    def on_signal(self, signal=None, sender=None, **kwargs) -> None:
        """The project's ``action`` signal (crawler/signals.py): a line to write."""
        self.record_action(**kwargs)

    def record_action(
        self, url: str, key: str | None, outcome: str, listed: bool = True, **fields
    ) -> None:
        """One line of the action log, counted (``actions/<outcome>``, an error also by
        its cause, ``actions/error/<cause>``; a final one of a ``listed`` URL is that
        URL done)."""
        if key is not None and outcome not in NOT_FINAL:
            self.counts.finished(key)
        self.counts.outcome(outcome, listed)
        if outcome == Outcome.ERROR:
            kind = error_kind(fields.get("error"), fields.get("status"))
            self.counts.inc(f"actions/error/{kind}")
            said = fields.get("error") or f"HTTP {fields.get('status')}"
            self.last_error = (time.time(), url, str(said))
        log = self.session.log
        if log is not None:
            self.append(log.write, url, key, outcome, **fields)

    def record(self, request: Request, outcome: Outcome, **fields) -> None:
        """The final (or retried) outcome of one attempt of ``request``."""
        crawler_signals.mark_final(request, outcome)
        self.record_action(outcome=outcome, **self.fields(request, **fields))

    def cache_hits(self, hits: list[tuple[str, str]]) -> None:
        """``(url, key)`` of listed requests skipped as stored: logged in one write,
        counted; those met again are duplicates."""
        if not hits:
            return
        counts = self.counts
        listed = len(hits)
        new = counts.first_sights([key for _, key in hits])
        hits = [hit for hit, first in zip(hits, new, strict=True) if first]
        counts.inc("progress/list_done", listed)
        if len(hits) < listed:
            counts.inc("catalog/duplicates", listed - len(hits))
        if not hits:
            return
        self.append(self.session.log.write_cache_hits, hits)
        for name in ("catalog/cache_hits", "actions/cache_hit"):
            counts.inc(name, len(hits))

    def cache_hit(self, request: Request) -> None:
        """A stored request skipped or replayed: logged and counted (once a run)."""
        if self.counts.seen(catalog_key(request)):
            self.duplicate(request)
            return
        self.counts.inc("catalog/cache_hits")
        self.record(request, Outcome.CACHE_HIT)

    def seen(self, key: str) -> bool:
        """Whether ``key`` has its final line in this run's log."""
        return self.counts.seen(key)

    def duplicate(self, request: Request) -> None:
        """``request`` is for a key this run has logged already: counted, not logged."""
        crawler_signals.mark_final(request, Outcome.CACHE_HIT)
        self.counts.inc("catalog/duplicates")
        if crawler_signals.listed(request):
            self.counts.inc("progress/list_done")

    def request_dropped(self, request: Request, spider=None) -> None:
        # Dropped by the duplicate filter: a URL met again (a duplicate list line).
        if "catalog_key" in request.meta:
            self.duplicate(request)

    def item_error(self, url: str, key: str, message: str) -> None:
        """An item of a stored page that could not be stored."""
        self.record_action(url, key, Outcome.ITEM_ERROR, error=message)

    def append(self, write, *args, **kwargs) -> None:
        """The one way to the action log: after a failure (a full disk would fail every
        write), one message and no more writes."""
        if self._log_failed:
            return
        try:
            write(*args, **kwargs)
        except OSError as exc:
            self._log_failed = True
            self._fail(
                f"writing the action log {self.session.datadir.action_log_path} failed: "
                f"{exc.strerror or exc}; rows committed so far are intact, the next run "
                "repairs the log and resumes"
            )

    @staticmethod
    def fields(request: Request, **fields) -> dict:
        """The line's fields of an attempt of ``request``, besides ``fields``."""
        meta = request.meta
        if "download_latency" in meta and "elapsed_ms" not in fields:
            fields["elapsed_ms"] = meta["download_latency"] * 1000
        if meta.get("proxy_label"):
            fields["proxy"] = meta["proxy_label"]
        return {**crawler_signals.attempt_fields(request), **fields}
